"""`ddpjob wait JOB`: wait until a DDPJob finishes, and exit with its result.

For scripts and CI: `ddpjob submit train.py --nnodes 2 && ddpjob wait train` fails when the
training fails. --for running returns once every node runs; --for delete once the job is gone.
The final line (on stderr) says how it ended; -o json|yaml prints the job as it ended.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, TextIO

from ddpjob.cli.common import add_cluster_arguments
from ddpjob.client import job_table, job_wait


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "wait", help="wait until a job finishes (or runs, or is gone); its result is the exit code",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  ddpjob wait train -n team-a\n  ddpjob wait train --for running --timeout 10m\n"
        f"Exit {job_wait.EXIT_OK} when the job Succeeded (--for running: runs; --for delete: is gone), "
        f"{job_wait.EXIT_JOB_FAILED} when it Failed,\n{job_wait.EXIT_INVALID} for bad flags, "
        f"{job_wait.EXIT_UNREADABLE} when it is not there or cannot be read, {job_wait.EXIT_TIMEOUT} "
        f"when --timeout passed first, {job_wait.EXIT_INTERRUPTED} on Ctrl-C.\nSee docs/status-and-logs.md.")
    add_cluster_arguments(parser)
    parser.add_argument("--for", dest="condition", choices=job_wait.CONDITIONS, default="finished",
                        help="finished (default: Succeeded or Failed), running, or delete")
    parser.add_argument("--timeout", default="0", metavar="DURATION",
                        help="give up after this long: 90s, 10m, 1h30m (default 0: no limit)")
    parser.add_argument("-o", "--output", choices=("json", "yaml"), help="print the job as the wait found it")
    parser.set_defaults(handler=run_wait)
    return parser


def run_wait(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    from ddpjob.client import cluster

    try:
        timeout = job_wait.parse_duration(args.timeout)
    except ValueError as error:
        print(f"ddpjob wait: error: --timeout: {error}", file=err)
        return job_wait.EXIT_INVALID
    try:
        conn = cluster.connect(args.kubeconfig, args.context)
        outcome = job_wait.wait(lambda: cluster.get_job(conn, args.namespace, args.job), args.condition, timeout)
    except cluster.ClusterError as error:
        print(f"ddpjob wait: error: {cluster.hint(error, args.namespace, 'ddpjobs')}", file=err)
        return job_wait.EXIT_UNREADABLE
    except KeyboardInterrupt:
        return job_wait.EXIT_INTERRUPTED
    return report(outcome, args, out, err)


def report(outcome: job_wait.Outcome, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The wait's last line, and the job with -o; returns the exit code."""
    from ddpjob.client.terminal_text import one_line

    words = f"DDPJob {args.namespace}/{args.job}: {outcome.words}"
    if outcome.code == job_wait.EXIT_JOB_FAILED and outcome.job is not None:
        message = (outcome.job.get("status") or {}).get("message") or ""
        if message:
            words += f": {one_line(str(message), 300)}"
        words += f" (ddpjob status {args.job} -n {args.namespace})"
    print(f"ddpjob wait: {one_line(words, 600)}", file=err)
    if getattr(args, "output", None) and outcome.job is not None:
        out.write(job_table.as_document([outcome.job], args.output, single=True))
    return outcome.code
