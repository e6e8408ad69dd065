"""The CRD's OpenAPI v3 schemas, generated from the models in ``spec.py`` and ``status.py``.

* ``spec_schema()``: the structural schema of ``spec`` that ``crd.py`` puts in the CRD
  (descriptions, defaults, bounds, enums, patterns, CEL rules), from ``spec.DDPJobSpec``.
* ``status_schema()``: the schema of ``status``, from ``status.JobStatus``.

``validation.py`` walks these same schemas to check a manifest, so the CRD and ``ddpjob
validate`` cannot disagree about a type, a bound or a default.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from collections.abc import Mapping as AbcMapping
from typing import Any, Mapping

import yaml

from ddpjob.api import model
from ddpjob.api import spec
from ddpjob.api import status as status_model

_SCALAR_TYPES = {int: "integer", str: "string", bool: "boolean", float: "number"}


def spec_schema() -> dict:
    """The OpenAPI v3 schema of ``spec`` (the CRD's ``.spec``), generated from ``DDPJobSpec``."""
    return copy.deepcopy(cached_spec_schema())


@functools.lru_cache(maxsize=1)
def cached_spec_schema() -> dict:
    """``spec_schema()``, shared: for readers only (validation deep-copies what it defaults)."""
    schema = dataclass_schema(spec.DDPJobSpec)
    return {"description": "The desired job: what to run, on how many nodes, and how to recover.",
            **schema}


def status_schema() -> dict:
    """The OpenAPI v3 schema of ``status``, generated from ``ddpjob.api.status.JobStatus``: the
    status the operator writes, and nothing else (unknown status fields are pruned)."""
    return copy.deepcopy(cached_status_schema())


@functools.lru_cache(maxsize=1)
def cached_status_schema() -> dict:
    """``status_schema()``, shared: for readers only."""
    schema = dataclass_schema(status_model.JobStatus)
    properties = schema["properties"]
    for name, after, body in status_model.JobStatus.COMPUTED:
        keys = list(properties)
        at = keys.index(after) + 1
        properties = {**{k: properties[k] for k in keys[:at]}, name: copy.deepcopy(body),
                      **{k: properties[k] for k in keys[at:]}}
    schema["properties"] = properties
    return {"description": status_model.JobStatus.__doc__.strip(), **schema}


def rule_schema(rule: model.Rule) -> dict:
    """One ``x-kubernetes-validations`` entry."""
    entry = {"rule": rule.cel, "message": rule.message}
    if rule.field_path:
        entry["fieldPath"] = rule.field_path
    return entry


def all_rules() -> list[model.Rule]:
    """Every cross-field rule: those of each dataclass under ``DDPJobSpec``, then the object's."""
    return ([r for cls in model.dataclasses_under(spec.DDPJobSpec) for r in getattr(cls, "RULES", ())]
            + list(spec.ENV_VAR_RULES) + list(spec.OBJECT_RULES))


def dataclass_schema(cls: type) -> dict:
    """The schema of one model dataclass: its fields in order, then its ``RULES``."""
    hints = typing.get_type_hints(cls)
    properties = {f.name: _field_schema(f, hints[f.name]) for f in dataclasses.fields(cls)}
    schema: dict[str, Any] = {"type": "object"}
    required = [f.name for f in dataclasses.fields(cls) if f.metadata.get("required")]
    if required:
        schema["required"] = required
    schema["properties"] = properties
    rules = getattr(cls, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule_schema(r) for r in rules]
    return schema


def _field_schema(f: dataclasses.Field, hint: Any) -> dict:
    meta = f.metadata
    unknown = set(meta) - model.FIELD_KEYS
    if unknown:  # a misspelt constraint would otherwise vanish from the CRD without a word
        raise TypeError(f"field {f.name}: unknown spec_field keys {sorted(unknown)}")
    inner = model.unwrap_optional(hint)
    if dataclasses.is_dataclass(inner):
        body = dataclass_schema(inner)
    elif typing.get_origin(inner) is tuple:
        item_type = typing.get_args(inner)[0]
        if "openapi" in meta:
            item = copy.deepcopy(meta["openapi"])
        elif dataclasses.is_dataclass(item_type):
            item = dataclass_schema(item_type)
        else:
            item = _value_schema(item_type, meta)
        body = {"type": "array", "items": item}
        body.update({api: meta[key] for key, api in model.LIST_KEYWORDS.items() if key in meta})
        if meta.get("unique_items"):
            body["x-kubernetes-list-type"] = "set"
        if meta.get("list_map_keys"):  # entries keyed by these fields: the API server refuses duplicates
            body["x-kubernetes-list-type"] = "map"
            body["x-kubernetes-list-map-keys"] = list(meta["list_map_keys"])
    else:
        body = copy.deepcopy(meta["openapi"]) if "openapi" in meta else _value_schema(inner, meta)
    # Status fields carry no default: only the operator writes them.
    default = None if meta.get("status") else _default_of(f)
    # The description goes first so that the generated YAML reads top-down.
    return {"description": meta["description"], **body,
            **({"default": default} if default is not None else {})}


def _value_schema(tp: Any, meta: Mapping[str, Any]) -> dict:
    if typing.get_origin(tp) in (AbcMapping, dict):
        value_type = typing.get_args(tp)[1]
        if value_type is str:
            return {"type": "object", "additionalProperties": {"type": "string"}}
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if tp not in _SCALAR_TYPES:
        raise TypeError(f"spec.py uses a type the schema generator does not know: {tp!r}")
    schema: dict[str, Any] = {"type": _SCALAR_TYPES[tp]}
    if "enum" in meta:
        schema["enum"] = list(meta["enum"])
    if "format" in meta:
        schema["format"] = meta["format"]
    schema.update({api: meta[key] for key, api in model.VALUE_KEYWORDS.items() if key in meta})
    return schema


def _default_of(f: dataclasses.Field) -> Any:
    """The JSON default of a field; ``{}`` for a nested object, so its own defaults apply."""
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return {} if dataclasses.is_dataclass(value) else model.to_plain(value)
    if f.default is dataclasses.MISSING or f.default is None:
        return None
    return model.to_plain(f.default)


class _NoAliasDumper(yaml.SafeDumper):
    # A schema fragment used twice (e.g. a quantity) must be written twice, not as &id001.
    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(obj: Any) -> str:
    """Generated YAML: no aliases, keys in the order they were built."""
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, width=100, allow_unicode=True)
