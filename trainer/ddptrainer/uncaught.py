"""The error a worker dies of, left for the pod entry point: "ZeroDivisionError: division by
zero (train.py:12 in main)".

Why: a script of one's own that raises exits 1 with its traceback in the log, and torchrun
tells the entry point only "exitcode 1" (its error file needs the script's ``@record``). So the
pod's termination message, and with it the job's status, said "the worker left no summary", and
the operator could not tell a bug that fails every attempt the same way from bad luck
(failurePolicy.repeatedErrorAttempts, api/repeated_error.py). Installed by worker_site's
sitecustomize (and the warm start) in every process ddptrain-pod starts; it chains to the
excepthook before it, so the traceback is printed as it always was. Standard library only, and
it never fails the process.
"""
from __future__ import annotations

import os
import re
import sys
import traceback
from types import TracebackType
from typing import Mapping, Optional

from ddpjob import contract

from . import summary

#: An exception that only carries another process's (mp.spawn's): its words end with the
#: child's traceback, whose last lines name the error and where.
_CARRIERS = ("ProcessRaisedException",)
_WHERE = re.compile(r'File "([^"\n]+)", line (\d+), in (\S+)')
_LIMIT = 400


def describe(kind: type, value: BaseException, tb: Optional[TracebackType]) -> str:
    """One line: the exception's type and the first line of its message, then where it was
    raised (the innermost frame); for mp.spawn's carrier, the child's."""
    if kind.__name__ in _CARRIERS:
        text = str(value)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        said = lines[-1] if lines else kind.__name__
        places = _WHERE.findall(text)
        where = places[-1] if places else None
    else:
        said = next((line.strip() for line in traceback.format_exception_only(kind, value) if line.strip()),
                    kind.__name__)
        frames = traceback.extract_tb(tb) if tb is not None else []
        where = (frames[-1].filename, str(frames[-1].lineno), frames[-1].name) if frames else None
    if where is not None:
        said += f" ({os.path.basename(where[0])}:{where[1]} in {where[2]})"
    return said[:_LIMIT]


def _rank(env: Mapping[str, str]) -> int:
    for name in (contract.RANK, contract.LOCAL_RANK):
        try:
            return int(env[name])
        except (KeyError, ValueError):
            continue
    return 0  # a single process per node (a script that spawns its own): the node's first


def install(env: Optional[Mapping[str, str]] = None, *, worker: bool = False) -> None:
    """In a worker of ddptrain-pod (its summary folder set, and its child; ``worker``: known to
    be one, the warm start's): leave the uncaught exception's line as this rank's ending,
    unless the rank left one of its own (ddptrain does). A process a worker starts (a helper
    script, a tool) leaves none: its failure is not the rank's."""
    environ = os.environ if env is None else env
    if not environ.get(summary.ENV_SUMMARY_DIR):
        return
    if not worker and environ.get(summary.ENV_ENTRY_PID) != str(os.getppid()):
        return
    rank = _rank(environ)
    previous = sys.excepthook

    def leave_and_print(kind: type, value: BaseException, tb: Optional[TracebackType]) -> None:
        try:
            if not issubclass(kind, KeyboardInterrupt) and not summary.ending_left(rank, environ):
                summary.leave_ending(int(contract.ExitCode.FAILURE), describe(kind, value, tb), rank, environ)
        except Exception:  # noqa: BLE001 - the traceback below matters more than the summary
            pass
        previous(kind, value, tb)

    sys.excepthook = leave_and_print
