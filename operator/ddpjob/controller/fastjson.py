"""Decoding the API server's JSON: orjson where it is installed (the operator extra depends on
it), the standard library otherwise.

Every watch event of every pod and DDPJob is a JSON document of a few kilobytes that kopf
decodes with ``json.loads``; with 100 jobs that was a quarter of the operator's busy CPU
(benchmarks/README.md, many jobs), and orjson builds the same objects several times faster.
What orjson refuses and the standard library accepts (NaN, a lone surrogate, a number past a
double's range) is decoded by the standard library. One thing differs: orjson reads an integer
past 64 bits as a float. The API server writes none of these (its JSON comes from Go's int64,
float64 and UTF-8 strings).
"""
from __future__ import annotations

import json
import logging
import types
from typing import Any, Union

logger = logging.getLogger(__name__)

try:
    import orjson
except ImportError:  # a source checkout without the operator extra: the standard library
    orjson = None


def loads(data: Union[str, bytes, bytearray]) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # the standard library decides, and raises its own error if it refuses too
    return json.loads(data)


# kopf's watch streams decode each line with the ``json`` module its client module imported;
# this stands in for that module there, the same in every other respect.
_KOPF_JSON = types.ModuleType("json", "the standard json module with ddpjob's faster loads")
_KOPF_JSON.__dict__.update({k: v for k, v in vars(json).items() if not k.startswith("__")})
_KOPF_JSON.loads = loads


def speed_up(module: Any) -> bool:
    """Makes ``module`` (kopf's API client module, whose watch streams decode each line with the
    ``json`` module it imported) decode with ``loads``. False, and a warning, where it has no
    such ``json`` any more: it then decodes as it always did, only slower."""
    current = getattr(module, "json", None)
    if current is _KOPF_JSON:
        return True
    if current is not json:
        logger.warning("kopf's watch streams are decoded with the standard json module: this kopf "
                       "version has no kopf._cogs.clients.api.json to replace")
        return False
    module.json = _KOPF_JSON
    return True
