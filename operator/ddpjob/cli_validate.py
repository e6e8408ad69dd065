"""`ddpjob validate -f FILE`: the operator's and the CRD's validation, before `kubectl apply`.

Exit 0 when every DDPJob in the files is valid; exit 2 with one line per problem,
``<file>: DDPJob/<name>: <field path>: <what is allowed>``. A file may hold other objects next
to its DDPJobs (a ConfigMap with the training script, say): they are skipped with a note on
stderr, but a file without any DDPJob is an error. Every failure is one line, never a traceback.

``read_documents`` and ``load_ddpjobs`` are shared with ``ddpjob render`` and ``ddpjob run``.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, Optional, TextIO

import yaml

from ddpjob import contract, schema, spec

EXIT_VALID = 0
EXIT_INVALID = 2
STDIN = "-"


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
            return f"{kind if isinstance(kind, str) else contract.KIND}/{name}"
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
            return (stdin or sys.stdin).read()
        with open(filename, encoding="utf-8") as f:
            return f.read()
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
    return (obj.get("kind") in (contract.KIND, None)
            or (isinstance(api_version, str) and api_version.startswith(contract.API_GROUP + "/")))


def problems_by_document(documents: list[Document]) -> tuple[list[Document], list[tuple[Document, list[str]]]]:
    """(documents skipped as other kinds, [(each DDPJob document, its problem lines)])."""
    skipped, checked = [], []
    for doc in documents:
        if not is_meant_as_ddpjob(doc.obj):
            skipped.append(doc)
        elif not isinstance(doc.obj, dict):
            checked.append((doc, [f"not a Kubernetes object (a mapping with apiVersion and kind), "
                                  f"got {schema.describe_value(doc.obj)}"]))
        else:
            checked.append((doc, [str(p) for p in schema.validate_ddpjob(doc.obj)]))
    return skipped, checked


def load_ddpjobs(filename: str, *, default_namespace: str = "default",
                 stdin: Optional[TextIO] = None) -> list[spec.DDPJob]:
    """Every DDPJob of a file, validated; ``ManifestError`` (one line per problem) otherwise."""
    name = display_name(filename)
    try:
        documents = read_documents(filename, stdin)
    except ManifestError as exc:
        raise ManifestError(f"{name}: {exc}") from None
    skipped, checked = problems_by_document(documents)
    lines = [f"{name}: {doc.label()}: {p}" for doc, problems in checked for p in problems]
    if not checked:
        lines.append(_no_ddpjob_line(name, skipped))
    if lines:
        raise ManifestError("\n".join(lines))
    return [schema.parse_ddpjob(doc.obj, default_namespace=default_namespace) for doc, _ in checked]


def _no_ddpjob_line(name: str, skipped: list[Document]) -> str:
    found = ", ".join(doc.label() for doc in skipped)
    return f"{name}: no {contract.KIND} in the file (found: {found})"


def validate_file(filename: str, out: TextIO, err: TextIO, stdin: Optional[TextIO] = None) -> int:
    """Validate one file, print the results; the exit status."""
    name = display_name(filename)
    try:
        documents = read_documents(filename, stdin)
    except ManifestError as exc:
        print(f"{name}: {exc}", file=err)
        return EXIT_INVALID
    skipped, checked = problems_by_document(documents)
    for doc in skipped:
        print(f"{name}: note: skipping {doc.label()} (not a {contract.KIND})", file=err)
    if not checked:
        print(_no_ddpjob_line(name, skipped), file=err)
        return EXIT_INVALID
    status = EXIT_VALID
    for doc, problems in checked:
        for problem in problems:
            print(f"{name}: {doc.label()}: {problem}", file=err)
        if problems:
            status = EXIT_INVALID
        else:
            print(f"{name}: {doc.label()} is valid", file=out)
    return status


def run_validate(args: argparse.Namespace) -> int:
    status = EXIT_VALID
    for filename in args.filename:
        status = max(status, validate_file(filename, sys.stdout, sys.stderr))
    return status


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``validate`` on the ``ddpjob`` command's subparsers."""
    parser = subparsers.add_parser(
        "validate", help="check DDPJob manifests as the API server and the operator would",
        description=__doc__.split("\n\n")[0] + " Exit 0 when valid, 2 otherwise.")
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                        help="manifest file, '-' for standard input (repeatable)")
    parser.set_defaults(handler=run_validate)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m ddpjob.cli_validate -f FILE``: the subcommand on its own."""
    parser = argparse.ArgumentParser(prog="ddpjob")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["validate", *(sys.argv[1:] if argv is None else argv)])
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
