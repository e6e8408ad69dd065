"""Telling "the checkpoint volume is full" from other write failures, and saying so plainly.

torch.save reports a full disk in its own words: the zip writer's failed write surfaces as
``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598`` (or
"file write failed"), with no ENOSPC in sight; only a flush or fsync gives a real
``OSError(ENOSPC)``. So a failed write is judged by its error *and* by the filesystem: an
ENOSPC/EDQUOT anywhere in the exception chain, or torch's writer error while the volume has
less room than the checkpoint needs. Everything else stays an ordinary, retryable failure.
"""
from __future__ import annotations

import errno
import os
from typing import Any, Optional

import torch

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_TORCH_WRITER_ERRORS = ("inline_container", "unexpected pos", "file write failed")
MIB = 1 << 20


def free_bytes(folder: str) -> Optional[tuple[int, int]]:
    """(bytes available to this user, filesystem size) of the volume holding ``folder``."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def state_bytes(value: Any) -> int:
    """The tensor bytes in a checkpoint state: about the size of the file torch.save writes."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(state_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(state_bytes(v) for v in value)
    return 0


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def is_disk_full(error: BaseException, needed: int, free_before: Optional[int],
                 free_after: Optional[int]) -> bool:
    """Whether a failed write failed for want of space (see the module docstring)."""
    for e in _chain(error):
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
    text = " ".join(str(e) for e in _chain(error))
    if "No space left" in text or "Disk quota exceeded" in text:
        return True
    if not any(marker in text for marker in _TORCH_WRITER_ERRORS):
        return False
    # torch's writer failed: a full volume if it could not have held the file.
    if free_before is not None and free_before < needed:
        return True
    return free_after is not None and free_after < MIB


def message(path: str, needed: int, before: Optional[tuple[int, int]],
            after: Optional[tuple[int, int]], keep: Optional[int] = None) -> str:
    """What happened, where, how much was needed and free, and what to do."""
    folder = os.path.dirname(path) or "."
    parts = [f"no space left on the volume of {folder} writing {path}: the checkpoint needs "
             f"about {_mib(needed)}"]
    if before is not None:
        parts.append(f", {_mib(before[0])} of {_mib(before[1])} were free before the write")
    if after is not None:
        parts.append(f" ({_mib(after[0])} when it failed)")
    advice = "; free space there or give --checkpoint-dir a larger volume"
    if keep:
        advice += (f" (a save needs room for {keep + 1} checkpoints: --keep-checkpoints {keep} "
                   "are kept and the new one is written before the oldest is deleted)")
    return "".join(parts) + advice


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"
