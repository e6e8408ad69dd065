"""`ddpjob run -f FILE`: run a DDPJob on this machine, no cluster (docs/local-run.md).

The file is read and validated exactly as `ddpjob validate` reads it (``ddpjob.api.loader``): a
file `validate` refuses is refused here with the same lines and exit 2, before anything runs.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from ddpjob.api.loader import ManifestError, load_one_ddpjob
from ddpjob.local.plan import LocalRunError
from ddpjob.local.runner import EXIT_BAD_INPUT, run_job
from ddpjob.local.progress_view import ProgressView
from ddpjob.local.supervisor import Console


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "run", help="run a DDPJob on this machine, no cluster",
        description="Run a DDPJob on this machine: one local process per node, with the same "
        "environment as the pods, output prefixed by node rank. Ctrl-C stops every node. "
        "Exit code: 0 when every node succeeds, else the failing node's. See docs/local-run.md.")
    parser.add_argument("-f", "--filename", required=True, metavar="FILE",
                        help="the DDPJob manifest (YAML; may also hold ConfigMaps that its volumes use)")
    parser.add_argument("--workdir", default=".", metavar="DIR",
                        help="working directory of the node processes (default: the current directory)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print each node's command and environment, run nothing")
    parser.add_argument("--plot", metavar="FILE.html",
                        help="at the end, write node 0's loss and images/s against the step as an HTML page "
                        "(the sparklines are printed in any case)")
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    view = ProgressView(terminal=sys.stdout.isatty(), plot_path=args.plot)
    console = Console(view=view)
    try:
        manifest = load_one_ddpjob(args.filename)
        if not os.path.isdir(args.workdir):
            raise LocalRunError(f"--workdir {args.workdir}: not a directory")
        if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
            raise LocalRunError(f"--plot {args.plot}: its folder does not exist")
        view.title = f"DDPJob {manifest.job.name} (ddpjob run)"
        code = run_job(manifest.job, workdir=os.path.abspath(args.workdir),
                       configmaps=manifest.configmaps, dry_run=args.dry_run, console=console)
        if not args.dry_run:
            view.finish(console.note)
        return code
    except ManifestError as error:
        for line in str(error).splitlines():
            console.note(f"error: {line}")
        return EXIT_BAD_INPUT
    except LocalRunError as error:
        console.note(f"error: {error}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C before any node started (afterwards a handler takes it)
        return 128 + signal.SIGINT
