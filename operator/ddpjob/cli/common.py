"""What the subcommands share on the command line."""
from __future__ import annotations

import argparse
from typing import Any


def add_filename_argument(parser: argparse.ArgumentParser) -> None:
    """``-f FILE`` (repeatable; ``-`` for standard input), as kubectl spells it."""
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                        help="manifest file, '-' for standard input (repeatable)")


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """JOB, -n, --kubeconfig and --context, as `ddpjob status` and `ddpjob logs` take them."""
    parser.add_argument("job", metavar="JOB", help="the DDPJob's name")
    add_connection_arguments(parser)


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """-n, --kubeconfig and --context: where the commands that talk to a cluster look."""
    parser.add_argument("-n", "--namespace", default="default", help="the namespace (default: %(default)s)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")


def read_job(args: argparse.Namespace) -> tuple[Any, dict]:
    """The connection and the DDPJob ``args`` names (add_cluster_arguments); ClusterError, its
    message one line that says what to do. The client is imported here: --help needs none."""
    from ddpjob.client import cluster
    from ddpjob.client.job_view import describe_missing

    conn = cluster.connect(args.kubeconfig, args.context)
    try:
        job = cluster.get_job(conn, args.namespace, args.job)
    except cluster.ClusterError as error:
        raise cluster.ClusterError(cluster.hint(error, args.namespace, "ddpjobs"), error.status,
                                   hinted=True) from None
    if job is None:
        raise cluster.ClusterError(describe_missing(args.namespace, args.job, args.context), 404)
    return conn, job
