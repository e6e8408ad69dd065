"""The Python stacks of a pod's workers, for the operator to read before it restarts a stall.

A gang that stopped reporting progress (failurePolicy.progressTimeoutSeconds) is restarted;
where its ranks were stuck is the one thing a restart erases. So, in the pod entry point's
workers, ``register_from_environment`` (called by the worker_site sitecustomize) registers
``faulthandler`` on SIGUSR1, writing to a file of the process's own in the entry point's private
folder (``DDPJOB_STACKS_DIR``, set by the entry point only: a command of the user's own never
sees it). ``GET /stacks`` on the progress port (``answer_stacks``, with the pod's restart token)
signals the live workers, waits up to ``WAIT_SECONDS`` for their dumps and answers them, bounded
(docs/contract.md, "Stacks").

faulthandler dumps from C, in the signal handler, so a worker blocked in a collective (the GIL
released, in gloo or NCCL) answers too. A program that installs its own SIGUSR1 handler later
replaces faulthandler's: theirs wins, and it is what receives the operator's signal.

Standard library only: it runs in every worker before torch is imported.
"""
from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import threading
import time
from typing import Any, Callable, Mapping, Optional

from ddpjob import contract

#: How long a request waits for the workers' dumps.
WAIT_SECONDS = 1.0
_POLL_SECONDS = 0.02
_FILE = re.compile(r"stack-(\d{1,9})-rank-(\d{1,7})\.txt")
_registered: Any = None  # the open file faulthandler writes to: it must outlive the call


def stack_file_name(pid: int, rank: int) -> str:
    return f"stack-{pid}-rank-{rank}.txt"


def register_from_environment(environ: Mapping[str, str] = os.environ) -> bool:
    """In a worker of the pod entry point: dump every thread's stack to this process's file on
    SIGUSR1. Whether it did (not asked, no SIGUSR1, or the folder is not writable: no)."""
    global _registered
    directory = environ.get(contract.DDPJOB_STACKS_DIR)
    if not directory or not hasattr(signal, "SIGUSR1"):
        return False
    rank_text = environ.get(contract.RANK, "0")
    rank = int(rank_text) if rank_text.isascii() and rank_text.isdigit() and len(rank_text) <= 7 else 0
    try:
        # Appended (O_APPEND), so the entry point may truncate it between two dumps.
        file = open(os.path.join(directory, stack_file_name(os.getpid(), rank)), "ab", buffering=0)
        faulthandler.register(signal.SIGUSR1, file=file, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return False
    _registered = file
    return True


def _holds(pid: int, path: str) -> bool:
    """Whether process ``pid`` still has ``path`` open: it is the worker that registered it, not
    a process that exec'd something else (our file is close-on-exec) or a reused pid, whose
    SIGUSR1 would be its default action, death."""
    fd_dir = f"/proc/{pid}/fd"
    if not os.path.isdir("/proc/self/fd"):  # no /proc: trust that the pid is alive
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
    try:
        for fd in os.listdir(fd_dir):
            try:
                if os.readlink(os.path.join(fd_dir, fd)) == path:
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


class StackCollector:
    """The entry point's side: the current attempt's folder (None between attempts) and the
    collection, one at a time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.directory: Optional[str] = None
        self._clock = clock
        self._lock = threading.Lock()

    def collect(self, wait_seconds: float = WAIT_SECONDS) -> Optional[dict[str, str]]:
        """{rank key: dump} of the live workers, bounded; None when no worker runs (or another
        collection holds the workers)."""
        directory = self.directory
        if not directory or not self._lock.acquire(timeout=wait_seconds):
            return None
        try:
            return self._collect(directory, wait_seconds)
        finally:
            self._lock.release()

    def _collect(self, directory: str, wait_seconds: float) -> Optional[dict[str, str]]:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return None
        workers: list[tuple[int, int, str]] = []
        for name in names:
            match = _FILE.fullmatch(name)
            path = os.path.realpath(os.path.join(directory, name))
            if match and _holds(int(match.group(1)), path):
                workers.append((int(match.group(2)), int(match.group(1)), path))
        signalled = []
        for rank, pid, path in workers[:contract.MAX_STACK_RANKS]:
            try:
                os.truncate(path, 0)
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                continue
            signalled.append((rank, pid, path))
        if not signalled:
            return None
        dumps = self._wait_for_dumps([path for _, _, path in signalled], wait_seconds)
        ranks = [rank for rank, _, _ in signalled]
        answer: dict[str, str] = {}
        budget = contract.MAX_STACKS_ANSWER_BYTES - 64  # the JSON around the dumps
        for (rank, pid, path), text in sorted(zip(signalled, dumps)):
            key = str(rank) if ranks.count(rank) == 1 else f"{rank}/pid{pid}"
            dump = contract.bound_stack(text or "(no dump within the wait)")
            cost = len(json.dumps({key: dump}))
            if cost > budget:
                dump = dump[:max(0, budget - len(key) - 32)]
                cost = len(json.dumps({key: dump}))
                if cost > budget or not dump:
                    break
            answer[key] = dump
            budget -= cost
        return answer

    def _wait_for_dumps(self, paths: list[str], wait_seconds: float) -> list[str]:
        """The files' text once each has been written and stopped growing, or at the deadline."""
        deadline = self._clock() + wait_seconds
        last: list[int] = [-1] * len(paths)
        while True:
            sizes = []
            for path in paths:
                try:
                    sizes.append(os.path.getsize(path))
                except OSError:
                    sizes.append(0)
            if all(s > 0 and s == before for s, before in zip(sizes, last)) or self._clock() >= deadline:
                break
            last = sizes
            time.sleep(_POLL_SECONDS)
        texts = []
        for path in paths:
            try:
                with open(path, "rb") as file:
                    texts.append(file.read(contract.MAX_STACK_CHARS * 4).decode("utf-8", "replace"))
            except OSError:
                texts.append("")
        return texts


Answer = tuple[int, dict[str, Any]]


def answer_stacks(authorized: Callable[[Optional[str]], bool], headers: Mapping[str, str],
                  collector: StackCollector) -> Answer:
    """GET /stacks: the token first (stacks show the code's paths: the operator's only)."""
    if not authorized(headers.get("Authorization")):
        return 401, {"error": "the stacks need this pod's token"}
    stacks = collector.collect()
    if stacks is None:
        return 503, {"error": "no worker runs"}
    return 200, {"ranks": stacks}

