"""controller/fastjson.py: the watch streams' JSON decoded faster, and the same."""
from __future__ import annotations

import json
import math

import kopf
import pytest

from ddpjob.controller import fastjson

pytestmark = pytest.mark.unit

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "train-node-0", "labels": {"ddpjob.dev/job-name": "train"},
                    "managedFields": [{"manager": "ddpjob-operator", "fieldsV1": {"f:spec": {}}}]},
       "spec": {"containers": [{"name": "trainer", "env": [{"name": "RANK", "value": "0"}],
                                "resources": {"limits": {"cpu": "500m"}}}]},
       "status": {"phase": "Running", "containerStatuses": [{"restartCount": 2, "ready": True,
                                                             "state": {"running": {"startedAt": "2026-12-04T00:00:00Z"}}}],
                  "fraction": 0.25, "unicode": "ранг ✓", "none": None}}


def test_an_api_object_decodes_as_the_standard_library_decodes_it():
    text = json.dumps(POD)
    for data in (text, text.encode()):
        assert fastjson.loads(data) == json.loads(text)


def test_what_orjson_refuses_the_standard_library_decodes():
    assert math.isnan(fastjson.loads('{"a": NaN}')["a"])
    assert fastjson.loads('{"a": 1e400}')["a"] == math.inf
    assert fastjson.loads('{"a": "\\ud800"}')["a"] == "\ud800"
    with pytest.raises(ValueError):  # what neither accepts is still an error
        fastjson.loads(b"{not json")


def test_kopf_decodes_its_watch_streams_with_it(monkeypatch):
    from kopf._cogs.clients import api
    from ddpjob.controller import handlers

    monkeypatch.setattr(api, "json", json)
    handlers.configure_kopf(kopf.OperatorSettings())
    assert handlers._speed_up_kopf_json()  # idempotent
    assert api.json.loads is fastjson.loads
    assert api.json.dumps is json.dumps and api.json.JSONDecodeError is json.JSONDecodeError


def test_a_kopf_without_that_module_keeps_its_own_decoding(monkeypatch, caplog):
    from kopf._cogs.clients import api

    monkeypatch.setattr(api, "json", object())
    assert fastjson.speed_up(api) is False and fastjson.speed_up(None) is False
    assert "standard json module" in caplog.text
