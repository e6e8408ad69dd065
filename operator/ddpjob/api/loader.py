"""The one manifest loader: every command reads DDPJob files through it.

``ddpjob validate``, ``ddpjob render`` and ``ddpjob run`` get the same answer for the same file:
a bad file is one ``ManifestError`` with one line per problem (never a traceback), naming the
file, the document and the field. What it refuses, whoever asks:

* a missing, unreadable or oversized file (over ``MAX_MANIFEST_BYTES``, refused before reading);
* text that is not UTF-8 (with the byte offset);
* YAML that does not parse (line and column), or that repeats a key (the API server would keep
  the last value silently; a reader of the file would believe the first);
* a file without any DDPJob; every DDPJob problem ``ddpjob.api.validation`` finds.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, TextIO

import yaml

from ddpjob.api import names
from ddpjob.api import spec
from ddpjob.api import validation

STDIN = "-"
#: The API server refuses a request body over 3 MiB, so no object in a larger file could be
#: applied anyway; refusing it at once keeps a mistaken `-f big.bin` from parsing for minutes.
MAX_MANIFEST_BYTES = 3 * 1024 * 1024


class ManifestError(Exception):
    """A file that cannot be read as manifests, or holds no valid DDPJob: one line per problem."""


@dataclass(frozen=True)
class Document:
    """One YAML document of a file: its position (1-based) and its parsed content."""

    index: int
    line: int
    obj: Any

    def label(self) -> str:
        metadata = self.obj.get("metadata") if isinstance(self.obj, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        kind = self.obj.get("kind") if isinstance(self.obj, dict) else None
        if isinstance(name, str) and name:
            return f"{kind if isinstance(kind, str) else names.KIND}/{name}"
        return f"document {self.index} (line {self.line})"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a repeated key instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep)


def display_name(filename: str) -> str:
    return "<stdin>" if filename == STDIN else filename


def read_documents(filename: str, stdin: Optional[TextIO] = None) -> list[Document]:
    """The non-empty YAML documents of a file (``-``: standard input).

    Raises ``ManifestError`` (message without the file name) for a missing or unreadable file,
    text that is not UTF-8, YAML that does not parse (with line and column), or no document.
    """
    text = _read_text(filename, stdin)
    loader = _StrictLoader(text)
    documents = []
    try:
        while loader.check_node():
            node = loader.get_node()
            obj = loader.construct_document(node)
            if obj is not None:
                documents.append(Document(len(documents) + 1, node.start_mark.line + 1, obj))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ManifestError(f"{where}invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    if not documents:
        raise ManifestError("empty: no YAML document in the file")
    return _expand_lists(documents)


def _read_text(filename: str, stdin: Optional[TextIO]) -> str:
    try:
        if filename == STDIN:
            text = (stdin or sys.stdin).read(MAX_MANIFEST_BYTES + 1)
            if len(text.encode("utf-8", errors="surrogateescape")) > MAX_MANIFEST_BYTES:
                raise ManifestError(_too_large("standard input"))
            return text
        size = os.stat(filename).st_size
        if size > MAX_MANIFEST_BYTES and os.path.isfile(filename):
            raise ManifestError(_too_large(f"{size} bytes"))
        with open(filename, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
        if len(data) > MAX_MANIFEST_BYTES:  # a pipe or a file that grew
            raise ManifestError(_too_large("more than that"))
        return data.decode("utf-8")
    except FileNotFoundError:
        raise ManifestError("no such file") from None
    except IsADirectoryError:
        raise ManifestError("is a directory, not a file") from None
    except PermissionError:
        raise ManifestError("permission denied") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ManifestError(exc.strerror or str(exc)) from None


def _too_large(what: str) -> str:
    return (f"too large ({what}): a manifest file may hold at most {MAX_MANIFEST_BYTES} bytes "
            "(3 MiB, the API server's request limit)")


def _expand_lists(documents: list[Document]) -> list[Document]:
    # `kubectl get -o yaml` writes `kind: List` with the objects under items.
    out = []
    for doc in documents:
        if isinstance(doc.obj, dict) and doc.obj.get("kind") == "List" and isinstance(doc.obj.get("items"), list):
            out += [Document(doc.index, doc.line, item) for item in doc.obj["items"]]
        else:
            out.append(doc)
    return out


def is_meant_as_ddpjob(obj: Any) -> bool:
    """A document to validate as a DDPJob: kind DDPJob, our API group, or no kind at all."""
    if not isinstance(obj, dict):
        return True  # validation says what is wrong with it
    api_version = obj.get("apiVersion")
    return (obj.get("kind") in (names.KIND, None)
            or (isinstance(api_version, str) and api_version.startswith(names.API_GROUP + "/")))


def problems_by_document(documents: list[Document], stored: Optional[Mapping[tuple, Any]] = None,
                         ) -> tuple[list[Document], list[tuple[Document, list[str]]]]:
    """(documents skipped as other kinds, [(each DDPJob document, its problem lines)]).

    ``stored``: DDPJobs as the API server holds them, by (namespace, name) (see
    ``stored_by_name``); a document naming one of them is checked as an update of it."""
    skipped, checked = _check_documents(documents, stored)
    return skipped, [(doc, problems) for doc, problems, _ in checked]


def _check_documents(documents: list[Document], stored: Optional[Mapping[tuple, Any]] = None,
                     ) -> tuple[list[Document], list[tuple[Document, list[str], dict]]]:
    """``problems_by_document``, with each DDPJob document's defaulted manifest (what
    ``validation.job_from_manifest`` builds the job from when there is no problem)."""
    skipped, checked = [], []
    for doc in documents:
        if not is_meant_as_ddpjob(doc.obj):
            skipped.append(doc)
        elif not isinstance(doc.obj, dict):
            checked.append((doc, [f"not a Kubernetes object (a mapping with apiVersion and kind), "
                                  f"got {validation.describe_value(doc.obj)}"], {}))
        else:
            old = _stored_for(doc.obj, stored or {})
            manifest, problems = validation.defaulted_manifest(doc.obj, old)
            checked.append((doc, [str(p) for p in problems], manifest))
    return skipped, checked


def _meta(obj: Any) -> dict:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def _stored_for(obj: Any, stored: Mapping[tuple, Any]) -> Any:
    """The stored DDPJob of the same name (and namespace, when the manifest names one)."""
    name, namespace = _meta(obj).get("name"), _meta(obj).get("namespace")
    same = [old for (ns, n), old in stored.items() if n == name and namespace in (None, ns)]
    return same[0] if len(same) == 1 else None


def stored_by_name(documents: list[Document]) -> dict[tuple, Any]:
    """The DDPJobs of a file such as ``kubectl get ddpjob NAME -o yaml`` writes (a kind List is
    expanded by ``read_documents``), by (namespace, name)."""
    return {(_meta(doc.obj).get("namespace"), _meta(doc.obj).get("name")): doc.obj for doc in documents
            if isinstance(doc.obj, dict) and doc.obj.get("kind") == names.KIND}


def load_ddpjobs(filename: str, *, default_namespace: str = "default",
                 stdin: Optional[TextIO] = None,
                 documents: Optional[list[Document]] = None) -> list[spec.DDPJob]:
    """Every DDPJob of a file, validated; ``ManifestError`` (one line per problem) otherwise.
    ``documents``: the file's documents when the caller has read them already."""
    name = display_name(filename)
    if documents is None:
        try:
            documents = read_documents(filename, stdin)
        except ManifestError as exc:
            raise ManifestError(f"{name}: {exc}") from None
    skipped, checked = _check_documents(documents)
    lines = [f"{name}: {doc.label()}: {p}" for doc, problems, _ in checked for p in problems]
    if not checked:
        lines.append(no_ddpjob_line(name, skipped))
    if lines:
        raise ManifestError("\n".join(lines))
    # Each document was validated once, above: build the jobs from what that check defaulted.
    return [validation.job_from_manifest(manifest, default_namespace=default_namespace)
            for _, _, manifest in checked]


def no_ddpjob_line(name: str, skipped: list[Document]) -> str:
    found = ", ".join(doc.label() for doc in skipped)
    return f"{name}: no {names.KIND} in the file (found: {found})"




@dataclass(frozen=True)
class RunManifest:
    """What ``ddpjob run`` needs from a file: its one DDPJob and the ConfigMaps beside it."""

    job: spec.DDPJob
    configmaps: dict[str, dict]


def load_one_ddpjob(filename: str, *, default_namespace: str = "default",
                    stdin: Optional[TextIO] = None) -> RunManifest:
    """The file's one DDPJob (validated like every other command's) and its ConfigMaps by name."""
    name = display_name(filename)
    try:
        documents = read_documents(filename, stdin)
    except ManifestError as exc:
        raise ManifestError(f"{name}: {exc}") from None
    jobs = load_ddpjobs(filename, default_namespace=default_namespace,
                        documents=documents)
    if len(jobs) != 1:
        raise ManifestError(f"{name}: expected exactly one {names.KIND}, found {len(jobs)} "
                            f"({', '.join(j.name for j in jobs)})")
    configmaps = {d.obj["metadata"]["name"]: d.obj for d in documents
                  if isinstance(d.obj, dict) and d.obj.get("kind") == "ConfigMap"
                  and isinstance(d.obj.get("metadata"), dict) and d.obj["metadata"].get("name")}
    return RunManifest(jobs[0], configmaps)
