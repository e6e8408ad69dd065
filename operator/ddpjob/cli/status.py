"""`ddpjob status JOB`: one screen about one DDPJob on the cluster.

Where it is and why (phase, reason, message), how far it got (progress, ETA), what it cost
(restarts and disruptions against their budgets, goodput), what went wrong (the last failures:
which rank, pod and node, the exit code, how the gang restarted; the failing rank's last lines),
the nodes it avoids, and its pods now. Read with your kubeconfig from the API server.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, TextIO

from ddpjob.cli.common import add_cluster_arguments, read_job

EXIT_OK = 0
EXIT_FAILED = 1  # not there, not yours to read, or no cluster to ask


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "status", help="one screen about a job on the cluster: phase, progress, restarts, failures, pods",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  ddpjob status train -n team-a\n  ddpjob status train -o json | jq .status.progress\n"
        "Exit 0 when the job was read, 1 when it is not there or cannot be read, 2 for bad flags.\n"
        "See docs/status-and-logs.md.")
    add_cluster_arguments(parser)
    parser.add_argument("-o", "--output", choices=("json", "yaml"),
                        help="the DDPJob as the API server holds it, spec and status (default: the screen)")
    parser.set_defaults(handler=run_status)
    return parser


def run_status(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    from ddpjob.client.cluster import ClusterError
    from ddpjob.client.job_view import render_status

    try:
        _, job = read_job(args)
    except ClusterError as error:
        print(f"ddpjob status: error: {error}", file=err)
        return EXIT_FAILED
    if getattr(args, "output", None):
        from ddpjob.client.job_table import as_document

        out.write(as_document([job], args.output, single=True))
    else:
        out.write(render_status(job))
    return EXIT_OK
