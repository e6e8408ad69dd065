"""``ddpjob validate``: a manifest checked the way the API server checks it, then parsed.

``validate_ddpjob(obj)`` / ``parse_ddpjob(obj)``: a manifest checked against the schema
``openapi.py`` generates (the API server's rules, walked here in Python), defaulted the way the
API server defaults, then checked against each rule's Python predicate, then turned into
``spec.DDPJob`` by the model kit's codec.

Because validation walks the generated schema instead of re-reading the dataclasses, the CRD
and ``ddpjob validate`` cannot disagree about a type, a bound or a default. Problems are named
by field path in the API server's style: ``spec.env[2].name`` for list items, and dots for
map keys as well as fields (``spec.resources.limits.cpu``), as kube-openapi writes them.
"""
from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ddpjob.api import model
from ddpjob.api import names
from ddpjob.api import openapi
from ddpjob.api import spec

API_VERSION = names.GROUP_VERSION
TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")


# ---------------------------------------------------------------------------------------------
# Problems
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """One reason a manifest is not a valid DDPJob: the field path and what is allowed there."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class InvalidDDPJob(ValueError):
    """Raised by ``parse_ddpjob`` with every problem found (not just the first)."""

    def __init__(self, problems: list[Problem]):
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


def describe_value(value: Any) -> str:
    """How a message names the value it got, with its JSON type: ``string "2"``, ``integer 0``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"string {json.dumps(shown)}"
    if isinstance(value, AbcMapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


# ---------------------------------------------------------------------------------------------
# Validation: a walk over the generated schema, defaulting as it goes
# ---------------------------------------------------------------------------------------------
_TYPE_WORDS = {"integer": "an integer", "string": "a string", "boolean": "a boolean (true or false)",
               "object": "a mapping", "array": "a list", "number": "a number"}


def _has_type(value: Any, json_type: str) -> bool:
    if json_type == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if json_type == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if json_type == "string":
        return isinstance(value, str)
    if json_type == "boolean":
        return isinstance(value, bool)
    if json_type == "object":
        return isinstance(value, AbcMapping)
    if json_type == "array":
        return isinstance(value, (list, tuple))
    raise ValueError(f"unknown OpenAPI type {json_type!r}")


class _SchemaWalker:
    """Checks a value against a structural schema and returns it defaulted (a new plain copy)."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        # (path of the object, its rules' CEL, the defaulted object): run after the walk.
        self.rule_sites: list[tuple[str, list[str], dict]] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def walk(self, schema: Mapping[str, Any], value: Any, path: str) -> Any:
        if schema.get("x-kubernetes-int-or-string"):
            if not (_has_type(value, "integer") or _has_type(value, "string")):
                self.problem(path, f"must be an integer or a string, got {describe_value(value)}"
                             + _quote_hint(value))
                return value
        elif "type" in schema and not _has_type(value, schema["type"]):
            self.problem(path, f"must be {_TYPE_WORDS[schema['type']]}, got {describe_value(value)}"
                         + (_quote_hint(value) if schema["type"] == "string" else ""))
            return value
        if isinstance(value, AbcMapping):
            return self._walk_object(schema, value, path)
        if isinstance(value, (list, tuple)):
            return self._walk_array(schema, value, path)
        self._check_scalar(schema, value, path)
        return value

    def _walk_object(self, schema: Mapping[str, Any], value: Mapping, path: str) -> dict:
        properties = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                self.problem(path, f"keys must be strings, got {describe_value(key)} (quote it)")
                continue
            child = f"{path}.{key}" if path else key
            if key in properties:
                # The API server prunes a null field (then defaults it): null means "not set".
                if item is not None:
                    out[key] = self.walk(properties[key], item, child)
            elif isinstance(additional, AbcMapping):
                out[key] = self.walk(additional, item, child)
            elif preserve:
                out[key] = copy.deepcopy(item)
            else:
                self.problem(child, "unknown field")
        for key, prop in properties.items():
            if key in out:
                continue
            child = f"{path}.{key}" if path else key
            if "default" in prop:
                out[key] = self.walk(prop, copy.deepcopy(prop["default"]), child)
            elif key in schema.get("required", ()):
                self.problem(child, "required")
        if "x-kubernetes-validations" in schema:
            self.rule_sites.append((path, [r["rule"] for r in schema["x-kubernetes-validations"]], out))
        return out

    def _walk_array(self, schema: Mapping[str, Any], value: list | tuple, path: str) -> list:
        items = schema.get("items", {})
        out = [self.walk(items, item, f"{path}[{i}]") for i, item in enumerate(value)]
        if "minItems" in schema and len(value) < schema["minItems"]:
            self.problem(path, f"must have at least {_count(schema['minItems'], 'item')}, got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            self.problem(path, f"must have at most {_count(schema['maxItems'], 'item')}, got {len(value)}")
        if schema.get("x-kubernetes-list-type") == "set":
            seen: list[Any] = []
            for i, item in enumerate(value):
                if item in seen:
                    self.problem(f"{path}[{i}]", f"duplicate value {json.dumps(item)}: "
                                 "each value may appear once")
                seen.append(item)
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema.get("x-kubernetes-list-map-keys", ())
            first: dict[tuple, int] = {}
            for i, item in enumerate(value):
                if not isinstance(item, AbcMapping) or not all(isinstance(item.get(k), str) for k in keys):
                    continue  # a missing or mistyped key is reported where it is
                key = tuple(item[k] for k in keys)
                if key in first:
                    shown = ", ".join(f"{k} {json.dumps(v)}" for k, v in zip(keys, key))
                    self.problem(f"{path}[{i}]", f"duplicate entry: {shown} is also {path.rsplit('.', 1)[-1]}"
                                 f"[{first[key]}]; each may appear once")
                else:
                    first[key] = i
        return out

    def _check_scalar(self, schema: Mapping[str, Any], value: Any, path: str) -> None:
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(str(v) for v in schema["enum"])
            self.problem(path, f"must be one of {allowed}, got {value!r}")
            return
        if isinstance(value, str):
            if "minLength" in schema and len(value) < schema["minLength"]:
                self.problem(path, f"must be at least {_count(schema['minLength'], 'character')} long, "
                             f"got {len(value)}")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                self.problem(path, f"must be at most {_count(schema['maxLength'], 'character')} long, "
                             f"got {len(value)}")
            if "pattern" in schema and re.search(schema["pattern"], value) is None:
                self.problem(path, f"must match the pattern {schema['pattern']}, got {value!r}")
        elif not isinstance(value, bool) and isinstance(value, (int, float)):
            if "minimum" in schema and value < schema["minimum"]:
                self.problem(path, f"must be >= {schema['minimum']}, got {value}")
            if "maximum" in schema and value > schema["maximum"]:
                self.problem(path, f"must be <= {schema['maximum']}, got {value}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _quote_hint(value: Any) -> str:
    # YAML reads 1.0, 8 and yes as numbers/booleans; a string field needs them quoted.
    if isinstance(value, (bool, int, float)):
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        return f' (quote it in YAML: "{shown}")'
    return ""


def _rules_by_cel() -> dict[str, model.Rule]:
    return {rule.cel: rule for rule in openapi.all_rules()}


def _run_rules(sites: list[tuple[str, list[str], dict]], rules: Mapping[str, model.Rule],
               old: Optional[Mapping[str, Any]] = None) -> list[Problem]:
    """The problems the rules at ``sites`` find. Transition rules run only with ``old`` (the
    stored object an update replaces). A rule whose input is malformed (a field error already
    reported) is skipped rather than guessed at."""
    problems = []
    for path, cels, value in sites:
        for cel in cels:
            rule = rules[cel]
            if rule.transition and old is None:
                continue
            try:
                valid = rule.check(value, old) if rule.transition else rule.check(value)
            except (KeyError, TypeError, AttributeError, ValueError, IndexError):
                continue
            if not valid:
                problems.append(Problem(_join_path(path, rule.field_path), rule.message))
    return problems


def _join_path(base: str, relative: Optional[str]) -> str:
    relative = (relative or "").lstrip(".")
    if base and relative:
        return f"{base}.{relative}"
    return base or relative


# ---------------------------------------------------------------------------------------------
# The whole object
# ---------------------------------------------------------------------------------------------
def defaulted_manifest(obj: Any, old: Any = None) -> tuple[dict, list[Problem]]:
    """Check ``obj`` and return (a defaulted plain copy of it, every problem found).

    ``old``: the stored object, when ``obj`` is meant to replace it (an update): the transition
    rules (what may not change while the job runs) are checked against it too.

    ``metadata`` is ObjectMeta: its field names, the types of ``name``, ``namespace``, ``labels``
    and ``annotations``, and the syntax of label and annotation keys and label values are
    checked as the API server checks them. ``status`` is the operator's: the API server drops
    it on create without checking its values, but strict field validation (``kubectl apply``'s
    default) refuses an unknown field in it, so only that is reported.
    """
    if not isinstance(obj, AbcMapping):
        return {}, [Problem("", f"a DDPJob must be a mapping (apiVersion, kind, metadata, spec), "
                                f"got {describe_value(obj)}")]
    kind = obj.get("kind")
    if kind != names.KIND:
        found = "kind is missing" if kind is None else f"got kind {kind!r}"
        return {}, [Problem("kind", f"must be {names.KIND} ({found})")]
    problems: list[Problem] = []
    if obj.get("apiVersion") != API_VERSION:
        problems.append(Problem("apiVersion", f"must be {API_VERSION}, got {describe_value(obj.get('apiVersion'))}"))
    for key in obj:
        if key not in TOP_LEVEL_FIELDS:
            problems.append(Problem(str(key), "unknown field"))
    metadata = _check_metadata(obj.get("metadata"), problems)
    if obj.get("status") is not None:
        problems += _status_problems(obj["status"])

    walker = _SchemaWalker()
    spec_value = obj.get("spec")
    if spec_value is None:
        problems.append(Problem("spec", "required"))
        spec_out: dict = {}
    else:
        spec_out = walker.walk(openapi.cached_spec_schema(), spec_value, "spec")
    problems += walker.problems
    out = {"apiVersion": obj.get("apiVersion"), "kind": kind, "metadata": metadata, "spec": spec_out}
    # Every rule runs, next to the field errors, so one run reports every problem; a rule whose
    # own input is malformed is skipped (its field error says why).
    rules = _rules_by_cel()
    problems += _run_rules(walker.rule_sites, rules)
    problems += _run_rules([("", [r.cel for r in spec.OBJECT_RULES], out)], rules, _stored_object(old))
    return out, problems


def _stored_object(old: Any) -> Optional[dict]:
    """The stored object an update replaces, defaulted as the API server holds it (with its
    status); None when there is none or it is not a DDPJob mapping."""
    if not isinstance(old, AbcMapping) or not isinstance(old.get("spec"), AbcMapping):
        return None
    walker = _SchemaWalker()
    stored = {"metadata": dict(old.get("metadata") or {}),
              "spec": walker.walk(openapi.cached_spec_schema(), old["spec"], "spec"),
              "status": dict(old.get("status") or {})}
    return stored


def _check_metadata(metadata: Any, problems: list[Problem]) -> dict:
    if metadata is None:
        problems.append(Problem("metadata.name", "required"))
        return {}
    if not isinstance(metadata, AbcMapping):
        problems.append(Problem("metadata", f"must be a mapping, got {describe_value(metadata)}"))
        return {}
    out = copy.deepcopy(dict(metadata))
    name = metadata.get("name")
    if name is None:
        hint = " (generateName is not supported: the name decides the pods' names)" \
            if "generateName" in metadata else ""
        problems.append(Problem("metadata.name", "required" + hint))
    elif not isinstance(name, str):
        problems.append(Problem("metadata.name", f"must be a string, got {describe_value(name)}"))
    namespace = metadata.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        problems.append(Problem("metadata.namespace", f"must be a string, got {describe_value(namespace)}"))
    for key in metadata:
        if key not in OBJECT_META_FIELDS:
            problems.append(Problem(f"metadata.{key}", "unknown field"))
    for kind in ("labels", "annotations"):
        if metadata.get(kind) is None:
            continue
        walker = _SchemaWalker()
        out[kind] = walker.walk({"type": "object", "additionalProperties": {"type": "string"}},
                                metadata[kind], f"metadata.{kind}")
        problems += walker.problems
        if not walker.problems:
            problems += [Problem(f"metadata.{kind}", p) for p in
                         (_label_problems(out[kind]) if kind == "labels" else _annotation_problems(out[kind]))]
    return out


# ObjectMeta's fields (k8s.io/apimachinery/pkg/apis/meta/v1): the API server's strict field
# validation refuses any other key under metadata.
OBJECT_META_FIELDS = (
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields",
)
# The API server's label and annotation syntax (k8s.io/apimachinery/pkg/util/validation).
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_MAX_ANNOTATIONS_BYTES = 256 * 1024


def qualified_name_problem(key: str) -> Optional[str]:
    """Why ``key`` is not a valid label/annotation key (``[prefix/]name``), or None."""
    parts = key.split("/")
    if len(parts) > 2:
        return "at most one '/' (an optional DNS subdomain prefix, then a name)"
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix or len(prefix) > 253 or not _DNS_1123_SUBDOMAIN.fullmatch(prefix):
            return ("the prefix before '/' must be a lowercase DNS subdomain (at most 253 "
                    "characters)")
    if not name or len(name) > 63 or not _QUALIFIED_NAME_PART.fullmatch(name):
        return ("the name must be 1 to 63 characters: letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit")
    return None


def _label_problems(labels: Mapping[str, str]) -> list[str]:
    problems = []
    for key, value in labels.items():
        why = qualified_name_problem(key)
        if why:
            problems.append(f"invalid label key {json.dumps(key)}: {why}")
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            problems.append(f"invalid value {json.dumps(value)} of label {json.dumps(key)}: at most 63 "
                            "characters, letters, digits, '-', '_' or '.', starting and ending "
                            "with a letter or digit (or empty)")
    return problems


def _annotation_problems(annotations: Mapping[str, str]) -> list[str]:
    problems = []
    for key in annotations:
        why = qualified_name_problem(key.lower())
        if why:
            problems.append(f"invalid annotation key {json.dumps(key)}: {why}")
    size = sum(len(k) + len(v) for k, v in annotations.items())
    if size > _MAX_ANNOTATIONS_BYTES:
        problems.append(f"annotations total {size} bytes; at most {_MAX_ANNOTATIONS_BYTES}")
    return problems


def _status_problems(status: Any) -> list[Problem]:
    """Unknown fields under ``status`` (the only status problem the API server refuses)."""
    walker = _SchemaWalker()
    walker.walk(openapi.cached_status_schema(), status, "status")
    return [p for p in walker.problems if p.message == "unknown field"]


def validate_ddpjob(obj: Any, old: Any = None) -> list[Problem]:
    """Every problem with a DDPJob manifest (an empty list when it is valid); with ``old`` (the
    stored object), every problem with it as an update of that object."""
    return defaulted_manifest(obj, old)[1]


def parse_ddpjob(obj: Any, *, default_namespace: str = "default") -> spec.DDPJob:
    """A manifest (or the operator's custom object) -> a validated, defaulted ``spec.DDPJob``.

    Raises ``InvalidDDPJob`` listing every problem. ``default_namespace`` is used when the
    manifest names none (a file given to ``ddpjob validate``/``render``/``run``).
    """
    manifest, problems = defaulted_manifest(obj)
    if problems:
        raise InvalidDDPJob(problems)
    return job_from_manifest(manifest, default_namespace=default_namespace)


def job_from_manifest(manifest: Mapping[str, Any], *, default_namespace: str = "default") -> spec.DDPJob:
    """The ``spec.DDPJob`` of a manifest ``defaulted_manifest`` found no problem with."""
    metadata = manifest["metadata"]
    return spec.DDPJob(
        name=metadata["name"],
        namespace=metadata.get("namespace") or default_namespace,
        uid=metadata.get("uid"),
        spec=model.from_plain(spec.DDPJobSpec, manifest["spec"]),
        labels=dict(metadata.get("labels") or {}),
    )


def to_manifest(job: spec.DDPJob) -> dict:
    """A ``spec.DDPJob`` back to a manifest dict (every default spelled out)."""
    metadata: dict[str, Any] = {"name": job.name, "namespace": job.namespace}
    if job.labels:
        metadata["labels"] = dict(job.labels)
    if job.uid:
        metadata["uid"] = job.uid
    return {"apiVersion": API_VERSION, "kind": names.KIND, "metadata": metadata,
            "spec": model.to_plain(job.spec)}
