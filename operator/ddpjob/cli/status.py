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
EXIT_BAD_FLAGS = 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "status", help="one screen about a job on the cluster: phase, progress, restarts, failures, pods",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  ddpjob status train -n team-a\n  ddpjob status train -o json | jq .status.progress\n"
        "  ddpjob status train --plot            # loss and images/s so far, as sparklines\n"
        "  ddpjob status train --plot run.html   # ... as a page\n"
        "Exit 0 when the job was read, 1 when it is not there or cannot be read, 2 for bad flags.\n"
        "See docs/status-and-logs.md.")
    add_cluster_arguments(parser)
    parser.add_argument("-o", "--output", choices=("json", "yaml"),
                        help="the DDPJob as the API server holds it, spec and status (default: the screen)")
    parser.add_argument("--plot", nargs="?", const=SPARKLINES, metavar="FILE.html",
                        help="node 0's loss and images/s so far, from its log: as sparklines, or as an "
                        "HTML page written to FILE.html")
    parser.set_defaults(handler=run_status)
    return parser


#: --plot without a file: the sparklines on the terminal.
SPARKLINES = "-"
#: The most of node 0's log read for --plot (its newest lines are what the kubelet keeps).
PLOT_LOG_BYTES = 8 * 1024 * 1024


def _plot(conn: Any, args: argparse.Namespace, job: dict, out: TextIO, err: TextIO) -> int:
    """Node 0's progress lines, read from its log (bounded), drawn (api/progress_plot.py)."""
    from ddpjob.api import names, progress_plot
    from ddpjob.client import cluster

    name = job["metadata"]["name"]
    pod = names.node_pod_name(name, 0)
    try:
        stream = cluster.pod_log(conn, args.namespace, pod, names.CONTAINER_NAME, limit_bytes=PLOT_LOG_BYTES)
        try:
            chunks, size = [], 0
            while size < PLOT_LOG_BYTES:
                chunk = stream.read1(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            stream.close()
    except cluster.ClusterError as error:
        print(f"ddpjob status: --plot: the log of {pod} cannot be read: {error}", file=err)
        return EXIT_FAILED
    points = progress_plot.points_of(b"".join(chunks).decode("utf-8", "replace").splitlines())
    if not points:
        print(f"ddpjob status: --plot: {pod}'s log has no progress lines (ddptrain prints them; "
              "docs/trainer.md, Progress)", file=err)
        return EXIT_FAILED
    if args.plot == SPARKLINES:
        for line in progress_plot.summary(points) or [progress_plot.bar(points[-1].step, points[-1].total)]:
            out.write(f"  {line}\n")
        return EXIT_OK
    try:
        with open(args.plot, "w", encoding="utf-8") as f:
            f.write(progress_plot.page(points, f"DDPJob {args.namespace}/{name}"))
    except OSError as error:
        print(f"ddpjob status: --plot {args.plot}: not written: {error.strerror or error}", file=err)
        return EXIT_FAILED
    print(f"ddpjob status: loss and images/s against the step: {args.plot}", file=err)
    return EXIT_OK


def run_status(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    from ddpjob.client.cluster import ClusterError
    from ddpjob.client.job_view import render_status

    if getattr(args, "output", None) and getattr(args, "plot", None):
        print("ddpjob status: error: --plot and -o: choose one (-o prints the object alone)", file=err)
        return EXIT_BAD_FLAGS
    try:
        conn, job = read_job(args)
    except ClusterError as error:
        print(f"ddpjob status: error: {error}", file=err)
        return EXIT_FAILED
    if getattr(args, "output", None):
        from ddpjob.client.job_table import as_document

        out.write(as_document([job], args.output, single=True))
    else:
        out.write(render_status(job))
    if getattr(args, "plot", None):
        return _plot(conn, args, job, out, err)
    return EXIT_OK
