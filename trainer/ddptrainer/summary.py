"""The one-paragraph summary a pod leaves behind: the Kubernetes termination message.

Kubernetes shows the content of ``terminationMessagePath`` (default /dev/termination-log) in
``kubectl describe pod`` and copies it into the container status, where the operator reads it
for ``status.failedNode.message``. The kubelet keeps at most 4 KiB, so we truncate there.

Standard library only: the pod entry point uses it before torch is imported.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from ddpjob import contract

MAX_TERMINATION_MESSAGE_BYTES = 4096

#: Set by ddptrain-pod for its workers: each leaves its ending there (``leave_ending``), and
#: the pod entry point composes the pod's termination message from them.
ENV_SUMMARY_DIR = "DDPTRAINER_SUMMARY_DIR"
#: ...and its own pid: its children are the workers (a process a worker starts is not one).
ENV_ENTRY_PID = "DDPTRAINER_ENTRY_PID"


def resolve_termination_log(flag_value: Optional[str],
                            environ: Optional[Mapping[str, str]] = None) -> tuple[str, bool]:
    """The path to write, and whether it was asked for explicitly (flag or environment).

    The default path is written only if it already exists: in a pod the kubelet creates it,
    on a workstation run as root we must not litter /dev with a new file.
    """
    env = os.environ if environ is None else environ
    if flag_value:
        return flag_value, True
    if env.get(contract.DDPJOB_TERMINATION_LOG):
        return env[contract.DDPJOB_TERMINATION_LOG], True
    return contract.DEFAULT_TERMINATION_LOG, False


def truncate_utf8(text: str, limit: int = MAX_TERMINATION_MESSAGE_BYTES) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    marker = " ...[truncated]"
    return data[: limit - len(marker)].decode("utf-8", errors="ignore") + marker


def write_termination_message(text: str, path: str, explicit: bool) -> bool:
    """Write ``text`` (truncated to 4 KiB) to ``path``; False when the place is not usable.

    Never raises: the summary must not turn a clean exit into a crash.
    """
    try:
        if explicit:
            folder = os.path.dirname(os.path.abspath(path))
            if not (os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)):
                return False
        elif not (os.path.exists(path) and os.access(path, os.W_OK)):
            return False
        # Plain open+write, not temp+rename: the kubelet bind-mounts this one file, and a
        # rename onto a mount point fails.
        with open(path, "w", encoding="utf-8") as f:
            f.write(truncate_utf8(text.rstrip("\n")) + "\n")
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class WorkerEnding:
    """Why one process of the pod ended, in its own words: the one channel from a worker to the
    pod entry point (besides its exit status). One file in the folder ``ENV_SUMMARY_DIR`` names:
    the exit code on the first line, the message after it."""

    code: int
    message: str
    rank: Optional[int]
    """The global rank of a trainer process; None for an init guard's verdict (written before
    the process had a rank it could trust: mp.spawn children inherit the pod's RANK)."""

    @property
    def is_guard_verdict(self) -> bool:
        """The init guard refused a world or timed out a rendezvous and ended the process: its
        code is the node's, whatever the processes above it report (an mp.spawn parent says
        only "a child failed", 1)."""
        return self.rank is None


_RANK_PREFIX = "rank-"
_GUARD_PREFIX = "guard-"
_SUFFIX = ".txt"


def leave_ending(code: int, message: str, rank: Optional[int],
                 environ: Optional[Mapping[str, str]] = None) -> bool:
    """Under ddptrain-pod: leave this process's ending for the pod entry point (False: not
    under it, or the folder is not writable). ``rank`` None: an init guard's verdict."""
    env = os.environ if environ is None else environ
    folder = env.get(ENV_SUMMARY_DIR)
    if not folder:
        return False
    name = f"{_GUARD_PREFIX}{os.getpid()}" if rank is None else f"{_RANK_PREFIX}{int(rank)}"
    return write_termination_message(f"{int(code)}\n{message}",
                                     os.path.join(folder, name + _SUFFIX), True)


def ending_left(rank: int, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether trainer rank ``rank`` has left its ending (under ddptrain-pod)."""
    folder = (os.environ if environ is None else environ).get(ENV_SUMMARY_DIR)
    return bool(folder) and os.path.exists(os.path.join(folder, f"{_RANK_PREFIX}{int(rank)}{_SUFFIX}"))


def read_endings(folder: Optional[str]) -> list[WorkerEnding]:
    """The endings the pod's processes left in ``folder``, trainer ranks by rank, then the
    guard's verdicts; files that are not an ending are skipped. Each is read only up to the
    termination message's size (what was written was cut there)."""
    found: list[WorkerEnding] = []
    try:
        names = sorted(os.listdir(folder)) if folder else []
    except OSError:
        return found
    for name in names:
        if not name.endswith(_SUFFIX):
            continue
        key = name[:-len(_SUFFIX)]
        try:
            if key.startswith(_RANK_PREFIX):
                rank: Optional[int] = int(key[len(_RANK_PREFIX):])
            elif key.startswith(_GUARD_PREFIX):
                rank = None
            else:
                continue
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                head, _, message = f.read(MAX_TERMINATION_MESSAGE_BYTES + 1).partition("\n")
            found.append(WorkerEnding(int(head), message.strip(), rank))
        except (OSError, ValueError):
            continue
    found.sort(key=lambda e: (e.rank is None, e.rank or 0))
    return found
