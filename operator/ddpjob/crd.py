"""The DDPJob CustomResourceDefinition, built from the API model (never edited by hand).

``python -m ddpjob.crd > manifests/crd.yaml`` writes the committed manifest (a unit test fails
when the two differ), and ``python -m ddpjob.crd --markdown > docs/api.md`` the field reference.
The ``spec`` schema comes from ``ddpjob.schema``; the ``status`` schema is the one the
operator writes (docs/DESIGN-NOTES.md), declared here so the API server keeps it.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

import yaml

from ddpjob import contract, schema, spec

CRD_NAME = f"{contract.PLURAL}.{contract.API_GROUP}"
SINGULAR = "ddpjob"
SHORT_NAMES = ["ddpj", "ddp"]
PHASES = ["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
CONDITION_TYPES = ["Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]


def _string(description: str, **extra: Any) -> dict:
    return {"description": description, "type": "string", **extra}


def _integer(description: str) -> dict:
    return {"description": description, "type": "integer"}


def _time(description: str) -> dict:
    return _string(description, format="date-time")


def status_schema() -> dict:
    """The status the operator writes, and nothing else (unknown status fields are pruned)."""
    failed_node = {
        "description": "The node whose failure decided the outcome.",
        "type": "object",
        "properties": {
            "nodeRank": _integer("Node rank of the failed pod."),
            "pod": _string("Pod name."),
            "exitCode": _integer("Exit code of the trainer container."),
            "reason": _string("Container terminated reason (Error, OOMKilled, Evicted, Deleted, ...)."),
            "message": _string("The container's termination message."),
        },
    }
    node = {
        "type": "object",
        "properties": {
            "nodeRank": _integer("Node rank."),
            "pod": _string("Pod name."),
            "phase": _string("Pod phase."),
            "ready": {"description": "Whether the pod runs with all containers started.", "type": "boolean"},
            "exitCode": _integer("Exit code of the trainer container, once terminated."),
            "reason": _string("Container terminated or waiting reason."),
            "message": _string("Container message."),
            "nodeName": _string("The Kubernetes node the pod runs on."),
        },
    }
    condition = {
        "type": "object",
        "properties": {
            "type": _string("One of " + ", ".join(CONDITION_TYPES) + "."),
            "status": _string("True, False or Unknown.", enum=["True", "False", "Unknown"]),
            "reason": _string("CamelCase machine reason."),
            "message": _string("One human sentence."),
            "lastTransitionTime": _time("When the status last changed."),
        },
    }
    return {
        "description": "What the operator observed; written only by the operator.",
        "type": "object",
        "properties": {
            "phase": _string("Where the job is.", enum=PHASES),
            "reason": _string("CamelCase machine reason for the phase, e.g. PodFailedPermanent, "
                              "StartupTimeout, RestartBudgetExhausted, DeadlineExceeded, "
                              "ReconcileError, AllNodesSucceeded."),
            "message": _string("One human sentence about the phase."),
            "ready": _string("<readyNodes>/<nnodes>, for kubectl get."),
            "readyNodes": _integer("Pods Running with all containers started."),
            "nnodes": _integer("Nodes (pods) of the job."),
            "restarts": _integer("Gang restarts done so far."),
            "restartAttempt": _integer(f"Attempt of the current pods (label {contract.LABEL_RESTART_ATTEMPT})."),
            "startTime": _time("When the job started."),
            "completionTime": _time("When the job Succeeded or Failed."),
            "observedGeneration": _integer("The metadata.generation the status describes."),
            "failedNode": failed_node,
            "nodes": {"description": "One entry per node.", "type": "array", "items": node},
            "conditions": {"description": "Conditions of types " + ", ".join(CONDITION_TYPES) + ".",
                           "type": "array", "items": condition},
        },
    }


def printer_columns() -> list[dict]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.ready", "description": "ready nodes / nodes"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def object_schema() -> dict:
    """The openAPIV3Schema of a DDPJob: spec, status, and the object-level CEL rules."""
    return {
        "description": "DDPJob runs a PyTorch DistributedDataParallel job on nnodes pods.",
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # Declared so that the object rules' fieldPath (.metadata.name) names a known field;
            # only name/generateName may be declared here.
            "metadata": {"type": "object", "properties": {"name": {"type": "string"},
                                                         "generateName": {"type": "string"}}},
            "spec": schema.spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [schema.rule_schema(r) for r in spec.OBJECT_RULES],
    }


def build_crd() -> dict:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of DDPJob."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": contract.API_GROUP,
            "names": {"kind": contract.KIND, "listKind": f"{contract.KIND}List",
                      "plural": contract.PLURAL, "singular": SINGULAR, "shortNames": list(SHORT_NAMES)},
            "scope": "Namespaced",
            "versions": [{
                "name": contract.API_VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": printer_columns(),
                "schema": {"openAPIV3Schema": object_schema()},
            }],
        },
    }


class _NoAliasDumper(yaml.SafeDumper):
    # A schema fragment used twice (e.g. a quantity) must be written twice, not as &id001.
    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, width=100, allow_unicode=True)


HEADER = "# Generated by `python -m ddpjob.crd` from operator/ddpjob/spec.py. Do not edit.\n"


def crd_yaml() -> str:
    """The text of manifests/crd.yaml."""
    return HEADER + to_yaml(build_crd())


# ---------------------------------------------------------------------------------------------
# docs/api.md: the field reference, rendered from the same schema the CRD carries
# ---------------------------------------------------------------------------------------------
EXAMPLE = {
    "apiVersion": schema.API_VERSION,
    "kind": contract.KIND,
    "metadata": {"name": "mnist"},
    "spec": {"nnodes": 2, "nprocPerNode": 1, "image": "ghcr.io/ddpjob/trainer:0.1.0",
             "args": ["--epochs", "3"]},
}


def api_markdown() -> str:
    """The text of docs/api.md."""
    root = object_schema()
    out = [
        "# DDPJob API reference",
        "",
        "<!-- Generated by `python -m ddpjob.crd --markdown` from operator/ddpjob/spec.py. "
        "Do not edit; a unit test checks it. -->",
        "",
        f"`apiVersion: {schema.API_VERSION}`, `kind: {contract.KIND}` (plural `{contract.PLURAL}`, "
        f"short names {', '.join(f'`{n}`' for n in SHORT_NAMES)}), namespaced. The CRD "
        "(manifests/crd.yaml), `ddpjob validate` and the operator all take these fields, "
        "bounds, defaults and rules from one model, `operator/ddpjob/spec.py`.",
        "",
        "```yaml",
        to_yaml(EXAMPLE).rstrip(),
        "```",
        "",
        "`ddpjob validate -f FILE` reports every problem as `<field path>: <what is allowed>`, "
        "with the same field paths the API server uses (`spec.env[2].name`, "
        "`spec.resources.limits.cpu`).",
        "",
        "## metadata",
        "",
    ]
    out += [f"- {r['message']} (`{r['rule']}`)" for r in root["x-kubernetes-validations"]]
    out.append("")
    for path, node in _object_nodes("spec", root["properties"]["spec"]):
        out += [f"## {path}", "", node.get("description", ""), ""]
        out += _field_table(node)
        if node.get("x-kubernetes-validations"):
            out += ["", "Rules:", ""]
            for rule in node["x-kubernetes-validations"]:
                out += [f"- `{path}{rule.get('fieldPath', '')}`: {rule['message']}",
                        f"  (CEL: `{rule['rule']}`)"]
        out.append("")
    out += ["## status", "", root["properties"]["status"]["description"], "",
            "| Field | Type | Description |", "| --- | --- | --- |"]
    for path, node in _leaves("", root["properties"]["status"]):
        out.append(f"| `{path}` | {_type_words(node)} | {_cell(node.get('description', ''))} |")
    out += ["", "## kubectl get columns", "", "| Column | From | Shown |", "| --- | --- | --- |"]
    for col in printer_columns():
        shown = "with `-o wide`" if col.get("priority") else "always"
        out.append(f"| {col['name']} | `{col['jsonPath']}` | {shown} |")
    return "\n".join(out) + "\n"


def _object_nodes(path: str, node: dict):
    """(path, schema) of every object in the spec with declared fields, top-down."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        if child.get("type") == "object" and "properties" in child \
                and not child.get("x-kubernetes-preserve-unknown-fields"):
            yield from _object_nodes(f"{path}.{name}", child)


def _field_table(node: dict) -> list[str]:
    rows = ["| Field | Type | Allowed | Default | Description |", "| --- | --- | --- | --- | --- |"]
    required = set(node.get("required", ()))
    for name, child in node["properties"].items():
        if name in required:
            default = "**required**"
        elif "default" in child:
            default = f"`{_cell(json.dumps(child['default']))}`"
        else:
            default = "unset"
        rows.append(f"| `{name}` | {_type_words(child)} | {_cell(_allowed(child))} | {default} | "
                    f"{_cell(child.get('description', ''))} |")
    return rows


def _leaves(path: str, node: dict):
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        if child.get("type") == "object" and "properties" in child:
            yield child_path, child
            yield from _leaves(child_path, child)
        elif child.get("type") == "array" and "properties" in child.get("items", {}):
            yield child_path, child
            yield from _leaves(child_path + "[]", child["items"])
        else:
            yield child_path, child


def _type_words(node: dict) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "integer or string"
    kind = node.get("type", "any")
    if kind == "array":
        return "list of " + _type_words(node.get("items", {}))
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return "map of string to " + _type_words(node["additionalProperties"])
    return {"object": "object", "string": "string", "integer": "integer", "boolean": "boolean"}.get(kind, kind)


def _allowed(node: dict) -> str:
    facts = []
    if "enum" in node:
        facts.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    if "minimum" in node and "maximum" in node:
        facts.append(f"{node['minimum']} to {node['maximum']}")
    elif "minimum" in node:
        facts.append(f">= {node['minimum']}")
    elif "maximum" in node:
        facts.append(f"<= {node['maximum']}")
    if "minLength" in node and "maxLength" in node:
        facts.append(f"{node['minLength']} to {node['maxLength']} characters")
    elif "maxLength" in node:
        facts.append(f"at most {node['maxLength']} characters")
    elif "minLength" in node:
        facts.append(f"at least {node['minLength']} character(s)")
    if "pattern" in node:
        facts.append(f"matches `{node['pattern']}`")
    if "minItems" in node:
        facts.append(f"at least {node['minItems']} item(s)")
    if "maxItems" in node:
        facts.append(f"at most {node['maxItems']} items")
    if node.get("x-kubernetes-list-type") == "set":
        facts.append("no duplicates")
    values = node.get("additionalProperties")
    if isinstance(values, dict) and (inner := _allowed(values)):
        facts.append("each value: " + inner)
    items = node.get("items", {})
    if items and (inner := _allowed(items)):
        facts.append("each item: " + inner)
    if items.get("required"):
        facts.append("each item needs " + ", ".join(f"`{r}`" for r in items["required"]))
    return "; ".join(facts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpjob.crd", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the API reference (docs/api.md)")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(api_markdown())
    else:
        sys.stdout.write(crd_yaml())
    return 0


if __name__ == "__main__":
    sys.exit(main())
