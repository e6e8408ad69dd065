"""The one-paragraph summary a pod leaves behind: the Kubernetes termination message.

Kubernetes shows the content of ``terminationMessagePath`` (default /dev/termination-log) in
``kubectl describe pod`` and copies it into the container status, where the operator reads it
for ``status.failedNode.message``. The kubelet keeps at most 4 KiB, so we truncate there.

Standard library only: the pod entry point uses it before torch is imported.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from ddpjob import contract

MAX_TERMINATION_MESSAGE_BYTES = 4096

#: Set by ddptrain-pod for its workers: each writes ``rank-<RANK>.txt`` there, and the pod
#: entry point composes the pod's termination message from them.
ENV_SUMMARY_DIR = "DDPTRAINER_SUMMARY_DIR"


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


def write_rank_summary(text: str, rank: int, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Under ddptrain-pod: leave this worker's summary for the pod entry point."""
    env = os.environ if environ is None else environ
    folder = env.get(ENV_SUMMARY_DIR)
    if not folder:
        return False
    return write_termination_message(text, os.path.join(folder, f"rank-{rank}.txt"), True)


def read_rank_summaries(folder: str) -> dict[int, str]:
    """Global rank -> summary text, for the workers that left one."""
    found: dict[int, str] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    for name in names:
        if name.startswith("rank-") and name.endswith(".txt"):
            try:
                rank = int(name[len("rank-"):-len(".txt")])
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    found[rank] = f.read().strip()
            except (ValueError, OSError):
                continue
    return found
