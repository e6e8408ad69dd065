"""The generated CRD: committed files in step with the model, a structural schema, sane CEL."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddpjob.api import crd, docs
from ddpjob.api import openapi
from ddpjob.api import spec
from ddpjob.api import validation
from ddpjob.api.status import PHASES, Condition, FailedNode, JobStatus, NodeState
from tests.support.manifests import bad_manifest_table, good_manifest_table, update_table

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "regenerate with: make generate"


# ---------------------------------------------------------------------------------------------
# Drift: the committed files are exactly what the model generates
# ---------------------------------------------------------------------------------------------
def test_committed_crd_is_generated_from_the_model():
    assert (ROOT / "manifests" / "crd.yaml").read_text() == crd.crd_yaml(), REGENERATE


def test_committed_api_doc_is_generated_from_the_model():
    assert (ROOT / "docs" / "api.md").read_text() == docs.api_markdown(), REGENERATE


def test_make_generate_writes_every_generated_file_and_check_reports_stale_ones(tmp_path):
    run = [sys.executable, "-m", "ddpjob.api.generate", "--root", str(tmp_path)]
    (tmp_path / "manifests").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "api.md").write_text("edited by hand\n")
    stale = subprocess.run(run + ["--check"], capture_output=True, text=True)
    assert stale.returncode == 1 and "docs/api.md is stale" in stale.stderr
    assert "manifests/crd.yaml is stale" in stale.stderr
    subprocess.run(run, capture_output=True, text=True, check=True)
    assert (tmp_path / "manifests" / "crd.yaml").read_text() == crd.crd_yaml()
    assert (tmp_path / "docs" / "api.md").read_text() == docs.api_markdown()
    assert subprocess.run(run + ["--check"], capture_output=True, text=True).returncode == 0


def test_the_status_schema_is_generated_from_the_status_model():
    """One source for the status: every field to_dict writes is declared, and nothing else."""
    full = JobStatus(phase="Running", reason="R", message="m", startTime="t", completionTime="t",
                     observedGeneration=1, failedNode=FailedNode(0, "p", 1, "Error", "m"),
                     nodes=(NodeState(0, "p", "Running", True, 0, "r", "m", "n"),),
                     conditions=(Condition("Running", "True", "R", "m", "t"),))
    written = full.to_dict()
    props = openapi.status_schema()["properties"]
    assert list(written) == list(props)
    assert list(written["failedNode"]) == list(props["failedNode"]["properties"])
    assert list(written["nodes"][0]) == list(props["nodes"]["items"]["properties"])
    assert list(written["conditions"][0]) == list(props["conditions"]["items"]["properties"])
    assert props["phase"]["enum"] == list(PHASES)


def test_crd_yaml_has_no_aliases_and_loads_back():
    text = crd.crd_yaml()
    assert "&id" not in text and "*id" not in text
    assert yaml.safe_load(text) == crd.build_crd()


# ---------------------------------------------------------------------------------------------
# Names, versions, status and columns
# ---------------------------------------------------------------------------------------------
def test_names_and_version():
    c = crd.build_crd()
    assert c["apiVersion"] == "apiextensions.k8s.io/v1" and c["kind"] == "CustomResourceDefinition"
    assert c["metadata"]["name"] == "ddpjobs.ddpjob.dev"
    assert c["spec"]["group"] == "ddpjob.dev" and c["spec"]["scope"] == "Namespaced"
    assert c["spec"]["names"] == {"kind": "DDPJob", "listKind": "DDPJobList", "plural": "ddpjobs",
                                  "singular": "ddpjob", "shortNames": ["ddpj", "ddp"]}
    [version] = c["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns_read_status_fields_not_conditions():
    [version] = crd.build_crd()["spec"]["versions"]
    columns = [(c["name"], c["jsonPath"], c.get("priority", 0)) for c in version["additionalPrinterColumns"]]
    assert columns == [("Phase", ".status.phase", 0), ("Ready", ".status.ready", 0),
                       ("Restarts", ".status.restarts", 0), ("Disruptions", ".status.disruptions", 0),
                       ("Progress", ".status.progress.summary", 0),
                       ("ETA", ".status.progress.eta", 0), ("Epoch", ".status.progress.epoch", 1),
                       ("Loss", ".status.progress.loss", 1), ("Throughput", ".status.progress.throughput", 1),
                       ("Goodput", ".status.goodput.percent", 1), ("Reason", ".status.reason", 1),
                       ("Last-Restart", ".status.failureHistory[0].restartMode", 1),
                       ("Restart-Time", ".status.goodput.lastRestartSeconds", 1),
                       ("Queue", ".metadata.labels.kueue\\.x-k8s\\.io/queue-name", 0),
                       ("Age", ".metadata.creationTimestamp", 0)]


def test_status_schema_is_the_one_in_the_design_notes():
    status = openapi.status_schema()
    props = status["properties"]
    assert list(props) == ["phase", "reason", "message", "ready", "readyNodes", "nnodes", "restarts",
                           "disruptions", "recentDisruptions",
                           "restartAttempt", "podSpecHash", "startTime", "completionTime", "observedGeneration",
                           "failedNode", "failureHistory", "progress", "excludedNodes", "goodput", "nodes", "unlistedNodes",
                           "observedRanks",
                           "succeededRanks", "conditions"]
    assert list(props["progress"]["properties"]) == [
        "summary", "eta", "step", "totalSteps", "epoch", "epochs", "loss", "throughput", "etaSeconds",
        "lastReportTime", "ranksReporting", "attempt", "checkpointSeconds", "checkpointIntervalSeconds"]
    assert props["progress"]["properties"]["loss"]["type"] == "number"
    assert props["phase"]["enum"] == ["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "Queued"]
    assert list(props["failedNode"]["properties"]) == ["nodeRank", "pod", "exitCode", "reason", "message"]
    assert list(props["nodes"]["items"]["properties"]) == ["nodeRank", "pod", "phase", "ready", "exitCode",
                                                           "reason", "message", "nodeName"]
    assert list(props["failureHistory"]["items"]["properties"]) == [
        "time", "attempt", "nodeRank", "rank", "pod", "nodeName", "kind", "reason", "exitCode", "message",
        "restartMode", "error"]
    assert props["failureHistory"]["items"]["properties"]["restartMode"]["enum"] == ["InPlace", "Recreate"]
    assert props["failureHistory"]["items"]["properties"]["kind"]["enum"] == ["Application", "Disruption"]
    assert props["recentDisruptions"]["items"]["format"] == "date-time"
    condition = props["conditions"]["items"]["properties"]
    assert list(condition) == ["type", "status", "reason", "message", "lastTransitionTime"]
    assert condition["status"]["enum"] == ["True", "False", "Unknown"]
    for name in ("startTime", "completionTime"):
        assert props[name]["format"] == "date-time"
    assert "x-kubernetes-preserve-unknown-fields" not in status


# ---------------------------------------------------------------------------------------------
# Structural schema (what the API server demands of an apiextensions.k8s.io/v1 CRD)
# ---------------------------------------------------------------------------------------------
ALLOWED = {"description", "type", "format", "title", "default", "enum", "maximum", "minimum",
           "exclusiveMaximum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems",
           "minItems", "maxProperties", "minProperties", "required", "items", "properties",
           "additionalProperties", "nullable", "anyOf", "example"}
SCALARS = {"string", "integer", "number", "boolean"}


def _nodes(node: dict, path: str = ""):
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from _nodes(node["items"], f"{path}[]")


def _root() -> dict:
    return crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_schema_is_structural():
    problems = []
    for path, node in _nodes(_root()):
        for key in node:
            if key not in ALLOWED and not key.startswith("x-kubernetes-"):
                problems.append(f"{path}: keyword {key} is not allowed")
        if node.get("x-kubernetes-int-or-string"):
            if "type" in node or node.get("anyOf", [{"type": "integer"}, {"type": "string"}]) != [
                    {"type": "integer"}, {"type": "string"}]:
                problems.append(f"{path}: int-or-string takes no type and only anyOf integer|string")
        elif "type" not in node:
            if not node.get("x-kubernetes-preserve-unknown-fields"):
                problems.append(f"{path}: no type")
        elif "anyOf" in node:
            problems.append(f"{path}: anyOf outside int-or-string")
        if node.get("x-kubernetes-preserve-unknown-fields") is False:
            problems.append(f"{path}: preserve-unknown-fields: false is not allowed")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties and additionalProperties together")
        if node.get("additionalProperties") is False:
            problems.append(f"{path}: additionalProperties: false is not allowed")
        if node.get("type") == "array" and not isinstance(node.get("items"), dict):
            problems.append(f"{path}: an array needs one items schema")
        if node.get("x-kubernetes-list-type") == "set" and node["items"].get("type") not in SCALARS:
            problems.append(f"{path}: list-type set needs scalar items")
        for name in node.get("required", ()):
            if name not in node.get("properties", {}):
                problems.append(f"{path}: required {name} is not a property")
            elif "default" in node["properties"][name]:
                problems.append(f"{path}.{name}: required and defaulted")
    assert problems == []


def test_root_allows_only_what_the_api_server_allows():
    root = _root()
    assert set(root) <= {"description", "type", "required", "properties", "x-kubernetes-validations"}
    metadata = root["properties"]["metadata"]
    assert set(metadata["properties"]) <= {"name", "generateName"}
    assert all("default" not in n for _, n in _nodes(metadata))


def test_defaults_satisfy_the_schema():
    checked = 0
    for path, node in _nodes(_root()):
        if "default" in node:
            walker = validation._SchemaWalker()
            walker.walk(node, node["default"], path)
            assert walker.problems == [], path
            checked += 1
    assert checked >= 20


def test_enum_values_have_the_declared_type():
    for path, node in _nodes(_root()):
        for value in node.get("enum", ()):
            assert validation._has_type(value, node["type"]), path


# ---------------------------------------------------------------------------------------------
# CEL rules: what can be checked without an API server
# ---------------------------------------------------------------------------------------------
def _rule_sites():
    """(schema node, rule) for every x-kubernetes-validations entry, root included."""
    return [(node, rule) for _, node in _nodes(_root()) for rule in node.get("x-kubernetes-validations", ())]


def _resolve(node: dict, dotted: str) -> dict | None:
    for name in [p for p in dotted.split(".") if p]:
        node = node.get("properties", {}).get(name)
        if node is None:
            return None
    return node


def test_every_rule_is_in_the_crd_once():
    cels = [rule["rule"] for _, rule in _rule_sites()]
    assert sorted(cels) == sorted(r.cel for r in openapi.all_rules())


def test_rule_field_paths_name_declared_fields():
    # The API server refuses a fieldPath that does not walk the schema's properties.
    for node, rule in _rule_sites():
        if "fieldPath" in rule:
            assert _resolve(node, rule["fieldPath"]) is not None, rule


def test_rules_only_read_declared_fields():
    for node, rule in _rule_sites():
        # Field selections only: a segment followed by "(" is a method (matches, all, ...).
        for dotted in re.findall(r"self((?:\.[A-Za-z_]\w*)+)(?![\w(])", rule["rule"]):
            assert _resolve(node, dotted) is not None, (dotted, rule["rule"])


def test_lists_a_rule_iterates_are_bounded():
    # The API server estimates a rule's cost; an unbounded list counts as millions of items.
    for node, rule in _rule_sites():
        for dotted in re.findall(r"self((?:\.[A-Za-z_]\w*)+)\.(?:all|exists|exists_one|map|filter)\(",
                                 rule["rule"]):
            target = _resolve(node, dotted)
            if target["type"] == "array":
                assert "maxItems" in target, (dotted, rule["rule"])


def test_rule_messages_are_single_lines():
    for _, rule in _rule_sites():
        assert "\n" not in rule["message"] and len(rule["message"]) <= 2048


def _defaulted_sites(manifest: dict):
    """(rule, the defaulted object it applies to) for one manifest with valid fields."""
    out, _ = validation.defaulted_manifest(manifest)
    sites = []

    def visit(node, value):
        for rule in node.get("x-kubernetes-validations", ()):
            sites.append((rule, value))
        for name, child in node.get("properties", {}).items():
            if child.get("type") == "object" and isinstance(value, dict) and name in value:
                visit(child, value[name])

    root = _root()
    for rule in root["x-kubernetes-validations"]:
        if "oldSelf" not in rule["rule"]:  # transition rules: test_transition_rules_...
            sites.append((rule, out))
    visit(root["properties"]["spec"], out["spec"])
    for entry in out["spec"]["env"]:  # rules on list items
        for rule in root["properties"]["spec"]["properties"]["env"]["items"]["x-kubernetes-validations"]:
            sites.append((rule, entry))
    return sites


def _cel_cases():
    rule_messages = {r.message for r in openapi.all_rules()}
    cases = [(case.id, case.manifest) for case in bad_manifest_table()] + good_manifest_table()
    # Only manifests whose fields are valid reach the rules (in the API server as here).
    return [(name, m) for name, m in cases
            if all(p.message in rule_messages for p in validation.validate_ddpjob(m))
            and isinstance(m.get("metadata"), dict) and m.get("kind") == "DDPJob"]


def test_cel_rules_compile_and_agree_with_the_python_predicates():
    celpy = pytest.importorskip("celpy", reason="cel-python is not installed")
    env = celpy.Environment()
    programs = {rule.cel: env.program(env.compile(rule.cel)) for rule in openapi.all_rules()}
    predicates = {rule.cel: rule.check for rule in openapi.all_rules()}
    cases = _cel_cases()
    assert len(cases) >= 20
    evaluated = 0
    for name, manifest in cases:
        for rule, value in _defaulted_sites(manifest):
            cel_says = bool(programs[rule["rule"]].evaluate({"self": celpy.json_to_cel(value)}))
            assert cel_says == predicates[rule["rule"]](value), (name, rule["rule"])
            evaluated += 1
    assert evaluated > 100


def test_transition_rules_compile_and_agree_with_the_python_predicates():
    celpy = pytest.importorskip("celpy", reason="cel-python is not installed")
    env = celpy.Environment()
    transition = [r for r in openapi.all_rules() if r.transition]
    assert transition and all("oldSelf" in r.cel for r in transition)
    assert {r.field_path for r in transition} == {f".spec.{name}" for name in (
        f.name for f in dataclasses.fields(spec.DDPJobSpec)) if name not in spec.MUTABLE_WHILE_ACTIVE}
    evaluated = 0
    for case in update_table():
        new, _ = validation.defaulted_manifest(case.new)
        old, _ = validation.defaulted_manifest({k: v for k, v in case.old.items() if k != "status"})
        if "status" in case.old:
            old["status"] = case.old["status"]
        for rule in transition:
            program = env.program(env.compile(rule.cel))
            cel_says = bool(program.evaluate({"self": celpy.json_to_cel(new), "oldSelf": celpy.json_to_cel(old)}))
            assert cel_says == rule.check(new, old), (case.id, rule.cel)
            assert cel_says == (rule.field_path != f".{case.path}"), (case.id, rule.cel)
            evaluated += 1
    assert evaluated > 100


def test_rules_hold_on_the_defaults_as_written():
    # The API server checks each default against the rules of its own schema node *before*
    # nested defaults fill it in (a default of {} has no keys), and refuses the CRD otherwise:
    # "no such key: volumes evaluating rule". Rules on a defaulted object must guard with has().
    celpy = pytest.importorskip("celpy", reason="cel-python is not installed")
    env = celpy.Environment()
    checked = 0
    for path, node in _nodes(_root()):
        for rule in node.get("x-kubernetes-validations", ()) if "default" in node else ():
            program = env.program(env.compile(rule["rule"]))
            result = program.evaluate({"self": celpy.json_to_cel(node["default"])})
            assert result is True or result == celpy.celtypes.BoolType(True), (path, rule["rule"], result)
            checked += 1
    assert checked >= 3


def test_each_rule_is_shown_to_fire_by_some_bad_case():
    fired = {p.message for case in bad_manifest_table() for p in validation.validate_ddpjob(case.manifest)}
    assert {r.message for r in openapi.all_rules() if not r.transition} <= fired


def test_object_rules_are_at_the_root():
    assert _root()["x-kubernetes-validations"] == [openapi.rule_schema(r) for r in spec.OBJECT_RULES]
