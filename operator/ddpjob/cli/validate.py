"""`ddpjob validate -f FILE`: the operator's and the CRD's validation, before `kubectl apply`.

Exit 0 when every DDPJob in the files is valid; exit 2 with one line per problem,
``<file>: DDPJob/<name>: <field path>: <what is allowed>``. A file may hold other objects next
to its DDPJobs (a ConfigMap with the training script, say): they are skipped with a note on
stderr, but a file without any DDPJob is an error. Every failure is one line, never a traceback.

Files are read by ``ddpjob.api.loader``, as for ``ddpjob render`` and ``ddpjob run``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Mapping, Optional, TextIO

from ddpjob.api import names
from ddpjob.cli.common import add_filename_argument
from ddpjob.api.loader import (ManifestError, display_name, no_ddpjob_line, problems_by_document,
                               read_documents, stored_by_name)

EXIT_VALID = 0
EXIT_INVALID = 2


def validate_file(filename: str, out: TextIO, err: TextIO, stdin: Optional[TextIO] = None,
                  stored: Optional[Mapping[tuple, Any]] = None) -> int:
    """Validate one file, print the results; the exit status. ``stored``: the DDPJobs as the
    cluster holds them (``--against``): a DDPJob of the same name is checked as an edit of it."""
    name = display_name(filename)
    try:
        documents = read_documents(filename, stdin)
    except ManifestError as exc:
        print(f"{name}: {exc}", file=err)
        return EXIT_INVALID
    skipped, checked = problems_by_document(documents, stored)
    for doc in skipped:
        print(f"{name}: note: skipping {doc.label()} (not a {names.KIND})", file=err)
    if not checked:
        print(no_ddpjob_line(name, skipped), file=err)
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
    stored: dict[tuple, Any] = {}
    for filename in args.against or ():
        try:
            stored.update(stored_by_name(read_documents(filename)))
        except ManifestError as exc:
            print(f"{display_name(filename)}: {exc}", file=sys.stderr)
            return EXIT_INVALID
    status = EXIT_VALID
    for filename in args.filename:
        status = max(status, validate_file(filename, sys.stdout, sys.stderr, stored=stored))
    return status


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``validate`` on the ``ddpjob`` command's subparsers."""
    parser = subparsers.add_parser(
        "validate", help="check DDPJob manifests as the API server and the operator would",
        description=__doc__.split("\n\n")[0] + " Exit 0 when valid, 2 otherwise.")
    add_filename_argument(parser)
    parser.add_argument(
        "--against", action="append", metavar="FILE",
        help="the DDPJob as stored (kubectl get ddpjob NAME -o yaml): check the manifest as an "
        "edit of it, as the API server checks an update (what may not change while it runs)")
    parser.set_defaults(handler=run_validate)
    return parser
