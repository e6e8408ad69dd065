"""`ddpjob delete JOB...`: delete DDPJobs, and with them their pods, Service and shipped code.

The pods, the Service and the `ddpjob submit` ConfigMap are the job's children: the garbage
collector deletes them once the DDPJob is gone. --wait waits until the DDPJob is gone (its
pods are then on their way out); `kubectl delete ddpjob JOB` does the same.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, TextIO

from ddpjob.cli.common import add_connection_arguments
from ddpjob.client import job_table, job_wait

EXIT_OK = 0
EXIT_FAILED = 1  # a job was not there, or could not be deleted
EXIT_INVALID = 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "delete", help="delete DDPJobs (their pods, Service and shipped code go with them)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  ddpjob delete train -n team-a\n  ddpjob delete a b c --wait\n"
        "Exit 0 when every job was deleted, 1 when one was not there or could not be deleted\n"
        "(the others are deleted still), 2 for bad flags. See docs/status-and-logs.md.")
    parser.add_argument("jobs", nargs="+", metavar="JOB", help="the DDPJobs' names")
    add_connection_arguments(parser)
    parser.add_argument("--wait", action="store_true", help="return once each DDPJob is gone")
    parser.add_argument("--timeout", default="0", metavar="DURATION",
                        help="with --wait: give up after this long (90s, 10m; default 0: no limit)")
    parser.set_defaults(handler=run_delete)
    return parser


def run_delete(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    from ddpjob.client import cluster

    try:
        timeout = job_wait.parse_duration(args.timeout)
    except ValueError as error:
        print(f"ddpjob delete: error: --timeout: {error}", file=err)
        return EXIT_INVALID
    code = EXIT_OK
    try:
        conn = cluster.connect(args.kubeconfig, args.context)
        for name in dict.fromkeys(args.jobs):  # each once, in the order given
            if not cluster.delete_job(conn, args.namespace, name):
                print(f"ddpjob delete: error: no DDPJob {name} in namespace {args.namespace}", file=err)
                code = EXIT_FAILED
                continue
            if args.wait:
                outcome = job_wait.wait(lambda: cluster.get_job(conn, args.namespace, name), "delete", timeout)
                if outcome.code != job_wait.EXIT_OK:
                    print(f"ddpjob delete: error: DDPJob {args.namespace}/{name}: {outcome.words}", file=err)
                    code = EXIT_FAILED
                    continue
            print(f"{job_table.RESOURCE}/{name} deleted", file=out)  # kubectl's line
    except cluster.ClusterError as error:
        print(f"ddpjob delete: error: {cluster.hint(error, args.namespace, 'ddpjobs')}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_FAILED
    return code
