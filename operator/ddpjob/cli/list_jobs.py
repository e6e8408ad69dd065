"""`ddpjob list`: the DDPJobs of a namespace (-A: of all), one line each, as kubectl lists them.

  NAME    PHASE       READY   RESTARTS   PROGRESS          AGE
  train   Running     2/2     1          120/500 (24%)     12m

-o wide adds the reason, the attempt, the ETA and the message; -o name prints
`ddpjob.ddpjob.dev/NAME` lines (kubectl reads them back: `kubectl delete $(ddpjob list -o name)`);
-o json|yaml the objects, as a List. -w prints the table, then a line for each job that changes,
until Ctrl-C. Read with your kubeconfig from the API server.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from typing import Any, Callable, Optional, TextIO

from ddpjob.cli.common import add_connection_arguments
from ddpjob.client import job_table

EXIT_OK = 0
EXIT_FAILED = 1  # the jobs cannot be read
WATCH_POLL_SECONDS = 2.0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "list", help="the DDPJobs of a namespace (-A: all), one line each (-o wide|name|json|yaml, -w)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  ddpjob list -n team-a\n  ddpjob list -A -o wide\n  ddpjob list -w\n"
        "Exit 0 when the jobs were read (or -w ended with Ctrl-C), 1 when they cannot be read,\n"
        "2 for bad flags. See docs/status-and-logs.md.")
    add_connection_arguments(parser)
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="the jobs of every namespace")
    parser.add_argument("-o", "--output", choices=job_table.OUTPUTS, help="wide, name, json or yaml (default: the table)")
    parser.add_argument("-w", "--watch", action="store_true", help="after the table, a line for each job that changes")
    parser.set_defaults(handler=run_list)
    return parser


def render(jobs: list[dict], output: Optional[str], all_namespaces: bool, now: dt.datetime) -> str:
    """What ``ddpjob list`` prints for ``jobs`` (sorted by namespace and name)."""
    jobs = sorted(jobs, key=lambda j: ((j.get("metadata") or {}).get("namespace", ""),
                                       (j.get("metadata") or {}).get("name", "")))
    if output in ("json", "yaml"):
        return job_table.as_document(jobs, output)
    if output == "name":
        return "".join(job_table.name_of(j) + "\n" for j in jobs)
    wide = output == "wide"
    rows = [job_table.row(j, now, wide=wide, namespace=all_namespaces) for j in jobs]
    return job_table.table(rows, job_table.header(wide=wide, namespace=all_namespaces))


def run_list(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None,
             sleep: Optional[Callable[[float], None]] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    sleep = sleep or time.sleep
    from ddpjob.client import cluster

    namespace = None if args.all_namespaces else args.namespace
    try:
        conn = cluster.connect(args.kubeconfig, args.context)
        jobs = cluster.list_jobs(conn, namespace)
        now = dt.datetime.now(dt.timezone.utc)
        if not jobs and not args.output and not args.watch:
            where = "any namespace" if namespace is None else f"namespace {namespace}"
            print(f"No DDPJobs in {where}.", file=err)  # kubectl's words, on stderr
            return EXIT_OK
        out.write(render(jobs, args.output, args.all_namespaces, now))
        out.flush()
        if args.watch:
            _watch(conn, namespace, jobs, args, out, sleep)
    except cluster.ClusterError as error:
        print(f"ddpjob list: error: {cluster.hint(error, namespace or 'any', 'ddpjobs')}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:  # Ctrl-C ends -w, the way it is meant to end
        return EXIT_OK
    return EXIT_OK


def _watch(conn: Any, namespace: Optional[str], jobs: list[dict], args: argparse.Namespace, out: TextIO,
           sleep: Callable[[float], None]) -> None:
    """A line for each job whose row (less its AGE) changed, or that came or went, every poll."""
    from ddpjob.client import cluster

    def by_key(listed: list[dict]) -> dict[tuple[str, str], dict]:
        return {((j.get("metadata") or {}).get("namespace", ""), (j.get("metadata") or {}).get("name", "")): j
                for j in listed}

    def key_row(job: dict, now: dt.datetime) -> tuple[str, ...]:
        cells = job_table.row(job, now, wide=args.output == "wide", namespace=args.all_namespaces)
        return cells[:-1] if args.output != "wide" else cells  # AGE alone changing is no news

    seen = {k: key_row(j, dt.datetime.now(dt.timezone.utc)) for k, j in by_key(jobs).items()}
    while True:
        sleep(WATCH_POLL_SECONDS)
        now = dt.datetime.now(dt.timezone.utc)
        current = by_key(cluster.list_jobs(conn, namespace))
        changed = [j for k, j in current.items() if seen.get(k) != key_row(j, now)]
        gone = [k for k in seen if k not in current]
        for job in changed:
            out.write(_line(job, args, now))
        for ns, name in gone:
            out.write(_line({"metadata": {"namespace": ns, "name": name}, "status": {"phase": "Deleted"}}, args, now))
        out.flush()
        seen = {k: key_row(j, now) for k, j in current.items()}


def _line(job: dict, args: argparse.Namespace, now: dt.datetime) -> str:
    if args.output in ("json", "yaml"):
        return job_table.as_document([job], args.output, single=True)
    if args.output == "name":
        return job_table.name_of(job) + "\n"
    # The row alone, padded as the header was: kubectl -w prints no header again.
    cells = job_table.row(job, now, wide=args.output == "wide", namespace=args.all_namespaces)
    return "   ".join(cells).rstrip() + "\n"
