"""Checkpoints: written by global rank 0 only, atomically, then every rank moves on together.

Layout: ``<checkpoint_dir>/step-00001200.pt``. A file is written as a hidden temp file in the
same folder, flushed, fsync'ed and renamed over its final name, so a reader (or a restart after
SIGKILL mid-write) only ever sees complete files; "the newest checkpoint" is simply the highest
step. Every rank collects its RNG state to rank 0; then rank 0 tells every rank whether the
write worked (a broadcast that is also the barrier), so a failed write fails every rank at once
instead of leaving them in a barrier until the collective timeout.

Periodic saves do not stall training: rank 0 copies the state to host memory and a background
thread writes it (one write in flight; a failure is reported at the next save). The final save
and the one on SIGTERM are blocking: the file is on disk before the process exits.

On resume rank 0 picks the file and every rank loads that same file (on a shared volume a
late directory listing on another node could otherwise pick an older one).
"""
from __future__ import annotations

import os
import pickle
import random
import re
import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from .distributed import DistContext, first_line
from . import disk_full
from .errors import CheckpointError, ConfigError, DiskFullError

#: 2: progress within the epoch in samples (``samples_in_epoch``); 1 stored batches
#: (``batch_in_epoch``), still read: see samples_in_epoch().
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
_NAME = re.compile(r"^step-(\d{8,})\.pt$")
_TEMP = re.compile(r"^\.step-\d{8,}\.pt\.tmp-\d+$")


def checkpoint_path(folder: str, step: int) -> str:
    return os.path.join(folder, f"step-{step:08d}.pt")


def list_checkpoints(folder: str) -> list[tuple[int, str]]:
    """(step, path) of the complete checkpoints in ``folder``, oldest first."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _NAME.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(folder, name)))
    return sorted(found)


def latest_checkpoint(folder: str) -> Optional[str]:
    found = list_checkpoints(folder)
    return found[-1][1] if found else None


def write_atomic(state: dict, path: str, keep: Optional[int] = None) -> None:
    """Temp file, fsync, rename. A full volume raises DiskFullError (the others propagate)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    before = disk_full.free_bytes(folder)
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        after = disk_full.free_bytes(folder)  # measured with the partial temp file still there
        needed = disk_full.state_bytes(state)
        if disk_full.is_disk_full(e, needed, before and before[0], after and after[0]):
            raise DiskFullError(disk_full.message(path, needed, before, after, keep)) from e
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    try:  # make the rename itself durable
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def prune(folder: str, keep: int) -> None:
    for _step, path in list_checkpoints(folder)[:-keep]:
        try:
            os.unlink(path)
        except OSError:
            pass


def read(path: str) -> dict:
    # weights_only: a checkpoint on a shared volume must not be able to run code.
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "format" not in state:
        raise CheckpointError(f"{path} is not a ddptrain checkpoint")
    if state["format"] not in READABLE_FORMATS:
        raise CheckpointError(f"{path} is a ddptrain checkpoint of format {state['format']!r}, "
                              f"written by another version; this one reads formats "
                              f"{', '.join(map(str, READABLE_FORMATS))}")
    return state


def samples_in_epoch(state: dict, batch_size: int) -> int:
    """Samples of the saved epoch the whole gang had consumed.

    A format-1 checkpoint stored batches per rank instead; every rank had done that many
    batches of ``batch_size`` from the same epoch order, so the gang had consumed
    batches x batch size x world size samples of it (exact, padding aside). The earliest
    files did not record their batch size: ``batch_size`` (this run's) stands in for it.
    """
    if "samples_in_epoch" in state:
        return int(state["samples_in_epoch"])
    saved_batch = int(state.get("batch_size", batch_size))
    return int(state["batch_in_epoch"]) * saved_batch * int(state["world_size"])


def capture_rng(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def _as_tuple(value: Any) -> Any:
    # torch.save keeps tuples, but be lenient with lists (random.setstate insists on tuples)
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def _all_gather_objects(ctx: DistContext, obj: Any) -> list[Any]:
    if not ctx.distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj, group=ctx.control_group)
    return out


def _host_copy(value: Any) -> Any:
    """A snapshot the training loop cannot change under the writer: tensors copied to host."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _host_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(v) for v in value)
    return value


class BackgroundWriter:
    """Rank 0's checkpoint writer thread: at most one write in flight, in order."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[CheckpointError] = None

    def submit(self, state: dict, path: str, folder: str, keep: int) -> None:
        self._join()

        def write() -> None:
            try:
                write_atomic(state, path, keep)
                prune(folder, keep)
            except CheckpointError as e:  # reported by the next wait()
                self._error = e
            except Exception as e:
                self._error = CheckpointError(f"writing {path} failed: {first_line(e)}")

        # Not a daemon: an interpreter that exits lets the write finish first.
        self._thread = threading.Thread(target=write, name="ddptrain-checkpoint")
        self._thread.start()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wait(self) -> Optional[CheckpointError]:
        """Wait for the write in flight; the error of the writes since the last wait, if any."""
        self._join()
        error, self._error = self._error, None
        return error


def save(ctx: DistContext, folder: str, keep: int, state: dict,
         writer: Optional[BackgroundWriter] = None, blocking: bool = True) -> str:
    """Collective: every rank calls it with the same step. Returns the path (being) written.

    ``blocking=False`` (with a writer) returns once rank 0 holds a host copy; the file appears
    when the writer thread is done.
    """
    rngs = _all_gather_objects(ctx, capture_rng(ctx.device))
    path = checkpoint_path(folder, state["step"])
    error = None
    if ctx.is_main:
        full = {**state, "format": FORMAT_VERSION, "rng": rngs, "world_size": ctx.world_size}
        writer = writer or BackgroundWriter()
        error = writer.wait()  # the previous write: its failure is reported now
        if error is None:
            writer.submit(_host_copy(full), path, folder, keep)
            if blocking:
                error = writer.wait()
    _raise_on_every_rank(ctx, error)
    return path


def _raise_on_every_rank(ctx: DistContext, error: Optional[CheckpointError]) -> None:
    """Collective: rank 0's outcome of a write (the broadcast is also the barrier)."""
    if ctx.distributed:
        box = [error]
        dist.broadcast_object_list(box, src=0, group=ctx.control_group)
        error = box[0]
    if error is not None:
        raise error


def flush(ctx: DistContext, writer: BackgroundWriter) -> None:
    """Collective: wait for rank 0's write in flight; if it failed, every rank raises."""
    _raise_on_every_rank(ctx, writer.wait() if ctx.is_main else None)


def prepare_folder(ctx: DistContext, folder: str) -> tuple[Optional[str], Optional[str]]:
    """Collective: rank 0 creates ``folder``, checks it can write there and picks the newest
    checkpoint; every rank gets (problem or None, newest path or None).

    Checked at start, so a read-only volume fails in seconds rather than at the first save;
    picked by rank 0 alone, so every rank loads the same file even when a shared volume shows
    another node a late directory listing.
    """
    problem, newest = None, None
    if ctx.is_main:
        try:
            os.makedirs(folder, exist_ok=True)
            if not os.access(folder, os.W_OK | os.X_OK):
                problem = f"{folder} is not writable by uid {os.getuid()}"
            newest = latest_checkpoint(folder)
            _remove_stale_temp_files(folder)
        except OSError as e:
            problem = f"{folder} cannot be created: {e.strerror or e}"
    if ctx.distributed:
        box = [(problem, newest)]
        dist.broadcast_object_list(box, src=0, group=ctx.control_group)
        problem, newest = box[0]
    return problem, newest


def _remove_stale_temp_files(folder: str) -> None:
    """Temp files of writers that died mid-write (a crash, SIGKILL): nobody will finish them."""
    for name in os.listdir(folder):
        if _TEMP.match(name):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


def unloadable_reason(error: BaseException, path: str) -> Optional[str]:
    """Why a file that torch.load refused can never load, or None when retrying might help.

    An error of the volume (EIO, a stale NFS handle, EACCES) may pass: retry. An error of the
    bytes themselves is final: a ddptrain checkpoint is renamed into place only once complete,
    so a damaged one was damaged after the fact (a bad disk, a copy cut short) and reading it
    again gives the same answer. torch's zip reader reports a truncated file as an OSError
    too (EINVAL, seeking past the end), so an OSError counts as the volume's only if reading
    the plain bytes fails as well.
    """
    if isinstance(error, MemoryError):
        return None
    if isinstance(error, OSError):
        try:
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
        except OSError:
            return None
        return f"truncated or damaged ({first_line(error)})"
    if isinstance(error, EOFError):
        return "empty or cut short (EOFError)"
    if isinstance(error, pickle.UnpicklingError):
        return "not a torch checkpoint file (unpickling failed)"
    text = str(error)
    if "zip archive" in text or "central directory" in text or "PytorchStreamReader" in text:
        return "truncated or damaged (its zip archive cannot be read)"
    first = text.strip().splitlines()[0][:200] if text.strip() else ""
    return f"cannot be loaded ({type(error).__name__}: {first})"


@dataclass
class Resumable:
    """What rank 0 found to resume from: every rank gets path and notes, rank 0 the state."""

    path: Optional[str]
    notes: list[str]
    state: Optional[dict] = None


def find_resumable(ctx: DistContext, folder: str) -> Resumable:
    """Collective: the newest checkpoint in ``folder`` that loads, damaged newer ones set aside.

    Rank 0 reads the candidates newest first. A file that can never load is renamed to
    ``<name>.corrupt`` (kept for inspection, never picked again: not a ``step-N.pt`` name) and
    named in a warning, and the next older one is tried. When none loads, nothing is renamed
    and every rank raises ConfigError (exit 2: a restart would read the same bytes); a read
    that failed for another reason is a retryable CheckpointError.
    """
    found, error = Resumable(None, []), None
    if ctx.is_main:
        damaged: list[tuple[str, str]] = []
        for _step, path in reversed(list_checkpoints(folder)):
            try:
                found.state, found.path = read(path), path
                break
            except Exception as e:  # classified below: damaged for good, or maybe not
                reason = unloadable_reason(e, path)
                if reason is None:
                    error = CheckpointError(f"reading {path} failed: {first_line(e)}")
                    break
                damaged.append((path, reason))
        if error is None and damaged and found.path is None:
            names = "; ".join(f"{p} ({why})" for p, why in damaged)
            error = ConfigError(
                f"--checkpoint-dir: no checkpoint in {folder} can be loaded: {names}. Move the "
                "damaged files away (or delete them) to start from scratch, or put an intact "
                "checkpoint there")
        elif error is None:
            for path, reason in damaged:
                found.notes.append(_set_aside(path, reason, found.path))
    if ctx.distributed:
        box = [(found.path, found.notes, error)]
        dist.broadcast_object_list(box, src=0, group=ctx.control_group)
        found.path, found.notes, error = box[0]
    if error is not None:
        raise error
    return found


def _set_aside(path: str, reason: str, instead: Optional[str]) -> str:
    aside = f"{path}.corrupt"
    try:
        os.replace(path, aside)
        kept = f"renamed to {os.path.basename(aside)}"
    except OSError as e:
        kept = f"could not be renamed ({e.strerror or e})"
    return (f"warning: checkpoint {path} is {reason}; {kept}; resuming from {instead} "
            "instead")


def load(ctx: DistContext, path: str, state: Optional[dict] = None) -> dict:
    """Collective: every rank reads ``path`` (unless it passes the ``state`` it already read);
    if any rank cannot, every rank raises."""
    error = None
    try:
        state = read(path) if state is None else state
    except Exception as e:
        error = f"rank {ctx.rank}: reading {path} failed: {e}"
    errors = [e for e in _all_gather_objects(ctx, error) if e]
    if errors:
        raise CheckpointError("; ".join(errors))
    assert state is not None
    return state
