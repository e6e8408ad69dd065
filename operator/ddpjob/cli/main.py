"""The `ddpjob` command: run a PyTorch DDP script on many Kubernetes nodes, or on this machine.

  ddpjob submit train.py --nnodes 2 -- ARGS   run a local script or folder on the cluster
  ddpjob status JOB                           one screen about a job: phase, progress, failures, pods
  ddpjob logs JOB [-f]                        every node's log, merged, each line marked with its node
  ddpjob list [-A] [-o wide|name|json|yaml]   the jobs of a namespace, one line each (-w: watch)
  ddpjob wait JOB                             until the job ends; its result is the exit code
  ddpjob delete JOB...                        delete jobs (their pods, Service and code go too)
  ddpjob run -f job.yaml                      run a DDPJob here, one process per node, no cluster
  ddpjob validate -f job.yaml                 check a manifest as the API server would
  ddpjob render -f job.yaml                   show the Service and Pods the operator would create
  ddpjob completion bash|zsh                  a shell completion script

Also installed as `kubectl-ddpjob`, so `kubectl ddpjob submit ...` (status, logs, ...) works as a kubectl plugin.
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from ddpjob import __version__
    from ddpjob.api.names import GROUP_VERSION

    parser = argparse.ArgumentParser(prog="ddpjob", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ddpjob {__version__} (API {GROUP_VERSION})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from ddpjob.cli import completion, delete, list_jobs, logs, render, run, status, submit, validate, wait

    submit.add_parser(sub)
    status.add_parser(sub)
    logs.add_parser(sub)
    list_jobs.add_parser(sub)
    wait.add_parser(sub)
    delete.add_parser(sub)
    run.add_parser(sub)
    validate.add_parser(sub)
    render.add_parser(sub)
    completion.add_parser(sub)
    parser.set_defaults(root_parser=parser)  # what `ddpjob completion` reads the commands from
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `ddpjob submit train.py -- --lr 0.1`: what follows `--` is the script's, never ours.
    passthrough: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if passthrough is not None:
        if not hasattr(args, "script_args"):
            parser.error(f"`ddpjob {args.command}` takes no arguments after --")
        args.script_args = tuple(passthrough)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
