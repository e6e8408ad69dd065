"""`ddpjob render -f FILE`: print, as YAML, exactly the Service and Pods the operator would create.

The operator builds its children with the same functions (ddpjob.controller.builders), so what this prints
is what `kubectl apply -f FILE` leads to, attempt 0. Owner references are left out: they need
the uid the API server gives the DDPJob when it is created.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, TextIO

import yaml

from ddpjob.controller import builders
from ddpjob.api import spec
from ddpjob.cli.common import add_filename_argument
from ddpjob.api.loader import ManifestError, load_ddpjobs

EXIT_OK = 0
EXIT_INVALID = 2


def render_objects(job: spec.DDPJob, attempt: int = 0) -> list[dict[str, Any]]:
    """The children of one DDPJob: its Service, then its pods in rank order."""
    return [builders.build_service(job), *builders.build_pods(job, attempt)]


def render_yaml(jobs: list[spec.DDPJob], attempt: int = 0) -> str:
    objects = [obj for job in jobs for obj in render_objects(job, attempt)]
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, explicit_start=True)


def run_render(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    jobs: list[spec.DDPJob] = []
    try:
        for filename in args.filename:
            jobs += load_ddpjobs(filename, default_namespace=args.namespace)
    except ManifestError as exc:
        print(exc, file=err)
        return EXIT_INVALID
    out.write(render_yaml(jobs, args.attempt))
    return EXIT_OK


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``render`` on the ``ddpjob`` command's subparsers."""
    parser = subparsers.add_parser(
        "render", help="print the Service and Pods the operator would create for a DDPJob",
        description=__doc__.split("\n\n")[0] + " Exit 0, or 2 with one line per problem if invalid.")
    add_filename_argument(parser)
    parser.add_argument("-n", "--namespace", default="default",
                        help="namespace for a DDPJob whose manifest names none (default: %(default)s)")
    parser.add_argument("--attempt", type=int, default=0, metavar="N",
                        help="render the pods of restart attempt N (default: %(default)s)")
    parser.set_defaults(handler=run_render)
    return parser
