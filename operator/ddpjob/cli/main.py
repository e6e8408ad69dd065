"""The `ddpjob` command: validate, render and run DDPJobs (each subcommand lives in its own module)."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddpjob", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from ddpjob.cli import render, run, validate

    validate.add_parser(sub)
    render.add_parser(sub)
    run.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
