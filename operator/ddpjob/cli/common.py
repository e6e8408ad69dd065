"""What the subcommands share on the command line."""
from __future__ import annotations

import argparse


def add_filename_argument(parser: argparse.ArgumentParser) -> None:
    """``-f FILE`` (repeatable; ``-`` for standard input), as kubectl spells it."""
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                        help="manifest file, '-' for standard input (repeatable)")
