"""The spec model -> OpenAPI (api/openapi.py); a manifest -> a defaulted, frozen DDPJob (api/validation.py)."""
from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Mapping

import pytest

from ddpjob import contract
from ddpjob.api import model
from ddpjob.api import openapi
from ddpjob.api import spec
from ddpjob.api import validation
from tests.support.manifests import DELETE, good_manifest_table, minimal_manifest, with_changes

pytestmark = pytest.mark.unit


def _dataclass_fields_match_schema(cls: type, node: dict, path: str) -> None:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(node["properties"]) == names, path
    for f in dataclasses.fields(cls):
        prop = node["properties"][f.name]
        assert prop["description"] == f.metadata["description"]
        inner = model.unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(inner):
            assert prop["default"] == {}, f"{path}.{f.name}: nested objects default to {{}}"
            _dataclass_fields_match_schema(inner, prop, f"{path}.{f.name}")


def test_schema_has_every_field_of_the_model_in_order():
    _dataclass_fields_match_schema(spec.DDPJobSpec, openapi.spec_schema(), "spec")


def test_schema_facts_come_from_field_metadata():
    s = openapi.spec_schema()
    props = s["properties"]
    assert s["required"] == ["nnodes", "image"]
    assert props["nnodes"] == {"description": "Number of nodes: one pod each.", "type": "integer",
                               "minimum": 1, "maximum": spec.MAX_NNODES}
    assert props["device"]["enum"] == ["cpu", "gpu"] and props["device"]["default"] == "cpu"
    assert props["masterPort"]["default"] == contract.DEFAULT_MASTER_PORT
    assert props["command"]["minItems"] == 1 and "default" not in props["command"]
    assert props["args"] == {"description": props["args"]["description"], "type": "array",
                             "items": {"type": "string"}, "default": []}
    codes = props["failurePolicy"]["properties"]["permanentExitCodes"]
    assert codes["x-kubernetes-list-type"] == "set"
    assert codes["items"] == {"type": "integer", "minimum": 1, "maximum": 255}
    assert codes["default"] == list(contract.DEFAULT_PERMANENT_EXIT_CODES)
    # Kubernetes types are copied through: item schema for lists, whole schema for maps.
    assert props["env"]["items"] == spec.ENV_VAR_SCHEMA
    assert props["resources"]["properties"] == spec.RESOURCES_SCHEMA["properties"]
    assert props["template"]["properties"]["spec"]["properties"]["tolerations"]["items"][
        "x-kubernetes-preserve-unknown-fields"] is True
    assert props["template"]["properties"]["metadata"]["properties"]["labels"][
        "additionalProperties"] == {"type": "string"}


def test_rules_are_in_the_schema_where_declared():
    s = openapi.spec_schema()
    assert s["x-kubernetes-validations"] == [openapi.rule_schema(r) for r in spec.DDPJobSpec.RULES]
    labels_rules = s["properties"]["template"]["properties"]["metadata"]["x-kubernetes-validations"]
    assert labels_rules == [openapi.rule_schema(r) for r in spec.PodMetadata.RULES]
    cels = [r.cel for r in openapi.all_rules()]
    assert len(cels) == len(set(cels)), "each rule's CEL must be unique (validation looks rules up by it)"


def test_spec_schema_returns_a_fresh_copy():
    openapi.spec_schema()["properties"].clear()
    assert "nnodes" in openapi.spec_schema()["properties"]


def test_defaults_of_the_schema_are_the_defaults_of_the_dataclasses():
    job = validation.parse_ddpjob(minimal_manifest())
    assert job.spec == spec.DDPJobSpec(nnodes=2, image="ddpjob-trainer:latest")
    assert job.name == "mnist" and job.namespace == "default" and job.uid is None and job.labels == {}


def test_defaults_apply_inside_partly_given_nested_objects():
    job = validation.parse_ddpjob(with_changes({
        "spec.failurePolicy": {"maxRestarts": 7},
        "spec.template": {"spec": {"nodeSelector": {"pool": "a"}}},
    }))
    assert job.spec.failurePolicy == spec.FailurePolicy(maxRestarts=7)
    assert job.spec.failurePolicy.permanentExitCodes == contract.DEFAULT_PERMANENT_EXIT_CODES
    assert job.spec.template.spec.terminationGracePeriodSeconds == 30
    assert job.spec.template.spec.nodeSelector == {"pool": "a"}
    assert job.spec.template.metadata == spec.PodMetadata()


def test_parsed_job_is_frozen_with_tuples_for_lists():
    job = validation.parse_ddpjob(dict(good_manifest_table())["every-field"])
    assert isinstance(job.spec.args, tuple) and isinstance(job.spec.env, tuple)
    assert isinstance(job.spec.command, tuple) and isinstance(job.spec.template.spec.volumes, tuple)
    assert job.spec.failurePolicy.permanentExitCodes == (2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.spec.nnodes = 3  # type: ignore[misc]


def test_metadata_from_the_manifest():
    job = validation.parse_ddpjob(dict(good_manifest_table())["every-field"])
    assert (job.name, job.namespace, job.labels) == ("mnist", "ml", {"team": "vision"})
    op = validation.parse_ddpjob(dict(good_manifest_table())["operator-view"])
    assert (op.name, op.namespace, op.uid) == ("j", "ns", "u-1")
    assert validation.parse_ddpjob(minimal_manifest(), default_namespace="team-a").namespace == "team-a"


def test_null_means_unset_as_in_the_api_server():
    job = validation.parse_ddpjob(dict(good_manifest_table())["nulls-mean-unset"])
    assert job.spec.command is None and job.spec.template == spec.PodTemplate()


@pytest.mark.parametrize("name,manifest", good_manifest_table(), ids=[n for n, _ in good_manifest_table()])
def test_round_trip(name, manifest):
    job = validation.parse_ddpjob(manifest)
    again = validation.to_manifest(job)
    assert validation.parse_ddpjob(again) == job
    assert validation.to_manifest(validation.parse_ddpjob(again)) == again


def test_to_manifest_spells_out_every_default():
    out = validation.to_manifest(validation.parse_ddpjob(minimal_manifest()))
    assert out["apiVersion"] == "ddpjob.dev/v1alpha1" and out["kind"] == "DDPJob"
    assert out["metadata"] == {"name": "mnist", "namespace": "default"}
    assert out["spec"]["failurePolicy"] == {"maxRestarts": 3, "maxDisruptions": 10, "disruptionWindowSeconds": 3600,
                                            "excludeNodeAfterFailures": 2,
                                            "restartMode": "InPlace",
                                            "permanentExitCodes": [2, 3, 4, 126, 127],
                                            "repeatedErrorAttempts": 2}
    assert "command" not in out["spec"] and out["spec"]["args"] == []


def test_the_input_is_not_modified():
    manifest = dict(good_manifest_table())["every-field"]
    before = copy.deepcopy(manifest)
    job = validation.parse_ddpjob(manifest)
    assert manifest == before
    job.spec.env[0]["name"] = "CHANGED"  # plain dicts inside: they must not alias the input
    assert manifest == before


class _Body(Mapping):
    """Like kopf.Body: a read-only Mapping, not a dict."""

    def __init__(self, data):
        self._data = data

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


def test_accepts_any_mapping_like_the_operators_body():
    manifest = with_changes({"metadata.namespace": "ns", "metadata.uid": "abc",
                             "status": {"phase": "Running"}})
    job = validation.parse_ddpjob(_Body(manifest))
    assert (job.namespace, job.uid) == ("ns", "abc")


def test_every_problem_is_reported_at_once():
    with pytest.raises(validation.InvalidDDPJob) as caught:
        validation.parse_ddpjob(with_changes({"spec.nnodes": 0, "spec.device": "tpu", "spec.bogus": 1,
                                          "spec.image": DELETE}))
    paths = [p.path for p in caught.value.problems]
    assert paths == ["spec.nnodes", "spec.device", "spec.bogus", "spec.image"]
    assert "spec.nnodes: must be >= 1, got 0" in str(caught.value)


def test_rules_run_next_to_field_errors():
    # One run names every problem: a type error elsewhere does not hide a rule's verdict.
    problems = validation.validate_ddpjob(with_changes({"spec.nnodes": "x",
                                                    "spec.env": [{"name": "RANK", "value": "0"}]}))
    assert [p.path for p in problems] == ["spec.nnodes", "spec.env[0].name"]
    problems = validation.validate_ddpjob(with_changes({"spec.env": [{"name": "RANK", "value": "0"}],
                                                    "metadata.name": "Bad", "spec.nnodes": 0}))
    assert [p.path for p in problems] == ["spec.nnodes", "spec.env[0].name", "metadata.name"]


def test_problem_text():
    assert str(validation.Problem("spec.nnodes", "required")) == "spec.nnodes: required"
    assert str(validation.Problem("", "not a mapping")) == "not a mapping"


@pytest.mark.parametrize("value,words", [
    (None, "null"), (True, "boolean true"), (3, "integer 3"), (1.5, "number 1.5"),
    ("2", 'string "2"'), ({}, "a mapping"), ([], "a list"), ("x" * 100, 'string "' + "x" * 57 + '..."'),
])
def test_describe_value(value, words):
    assert validation.describe_value(value) == words


def test_generated_yaml_writes_a_shared_fragment_out_each_time():
    import yaml

    out = openapi.to_yaml(openapi.spec_schema())
    assert "&id" not in out, "a fragment used twice is written out twice, not as a YAML alias"
    assert yaml.safe_load(out) == openapi.spec_schema()


def test_reserved_volume_name_is_the_one_the_builders_use():
    from ddpjob.controller import builders

    assert builders.SHM_VOLUME == spec.SHM_VOLUME_NAME, "use names.SHM_VOLUME_NAME in builders"


def test_a_misspelt_constraint_is_an_error_not_a_silent_gap():
    @dataclasses.dataclass(frozen=True)
    class Broken:
        size: int = model.spec_field("A size.", default=1, maximun=3)

    with pytest.raises(TypeError, match="maximun"):
        openapi.dataclass_schema(Broken)
