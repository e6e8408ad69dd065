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

Each checkpoint records its job (``ownership``: ``step-N.pt.owner`` beside it, a copy in it). A
job resumes only its own checkpoints and prunes only its own; a folder that holds only another
job's is refused at start (ConfigError, exit 2) unless ``adopt`` (``--adopt-checkpoints``) says
to resume from them on purpose. Checkpoints without a record predate ownership: resumed with a
warning (and recorded as this job's then), never pruned.
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

from .distributed import DistContext
from .text import first_line
from . import disk_full, ownership
from .errors import CheckpointError, ConfigError, DiskFullError, TrainerError
from .ownership import Owner, Recorded

#: 2: progress within the epoch in samples (``samples_in_epoch``); 1 stored batches
#: (``batch_in_epoch``), still read: see samples_in_epoch().
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
_NAME = re.compile(r"^step-(\d{8,})\.pt$")
_RECORD = re.compile(r"^step-(\d{8,})\.pt\.owner$")
#: A writer's temp file (checkpoint or owner record), tagged with its owner (ownership.temp_path).
_TEMP = re.compile(r"^\.step-\d{8,}\.pt(?:\.owner)?\.tmp-([0-9a-f]{12})-\d+$")
ANYONE = Owner()  # a plain run outside any job: what callers that name no owner write as


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


def write_atomic(state: dict, path: str, keep: Optional[int] = None,
                 owner: Optional[Owner] = None) -> None:
    """Temp file, fsync, rename. A full volume raises DiskFullError (the others propagate).

    With ``owner``, its record goes first: a checkpoint is never visible without its owner.
    """
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = ownership.temp_path(path, owner or ANYONE)
    before = disk_full.free_bytes(folder)
    if owner is not None:
        _refuse_to_overwrite_anothers(path, owner)
    try:
        if owner is not None:
            ownership.write_record(path, owner)
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        after = disk_full.free_bytes(folder)  # measured with the partial temp file still there
        needed = disk_full.state_bytes(state)
        if owner is not None and not os.path.exists(path):
            _unlink(ownership.record_path(path))  # the record of a checkpoint that never came
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


@dataclass
class Survey:
    """The checkpoints of a folder (oldest first), by whose they are."""

    own: list[tuple[int, str]]
    unrecorded: list[tuple[int, str]]  # no owner record: written before checkpoints had one
    foreign: list[tuple[int, str, Recorded]]  # another job's, or a record that cannot be read
    own_orphan_records: list[tuple[int, str]]  # own records whose checkpoint is gone


def survey(folder: str, owner: Owner) -> Survey:
    """Read every owner record in ``folder`` (small, bounded reads; never the checkpoints)."""
    found = Survey([], [], [], [])
    try:
        names = set(os.listdir(folder))
    except FileNotFoundError:
        return found
    for step, path in list_checkpoints(folder):
        recorded = ownership.read_record(path)
        if recorded is None:
            found.unrecorded.append((step, path))
        elif isinstance(recorded, Owner) and owner.owns(recorded):
            found.own.append((step, path))
        else:
            found.foreign.append((step, path, recorded))
    for name in names:
        m = _RECORD.match(name)
        if m and name[:-len(ownership.SUFFIX)] not in names:
            path = os.path.join(folder, name[:-len(ownership.SUFFIX)])
            recorded = ownership.read_record(path)
            if isinstance(recorded, Owner) and owner.owns(recorded):
                found.own_orphan_records.append((int(m.group(1)), path))
    return found


def _refuse_to_overwrite_anothers(path: str, owner: Owner) -> None:
    """Two jobs writing in one folder (both started on it at once, say) reach the same step
    names: the second must not replace the first's file. ConfigError: a restart would too."""
    if not os.path.exists(path):
        return
    recorded = ownership.read_record(path)
    if isinstance(recorded, Owner) and owner.owns(recorded):
        return
    whose = recorded.describe() if recorded is not None else (
        "a run from before checkpoints recorded their owner")
    raise ConfigError(
        f"--checkpoint-dir: {path} already exists and belongs to {whose}; this is "
        f"{owner.describe()}: another job writes checkpoints in {os.path.dirname(path)}, and "
        "its file is left alone. Give each job its own --checkpoint-dir")


def prune(folder: str, keep: int, owner: Owner = ANYONE) -> None:
    """Delete ``owner``'s checkpoints but the newest ``keep``; nobody else's, and none without
    an owner record (they may be another job's from before checkpoints recorded one)."""
    found = survey(folder, owner)
    for _step, path in found.own[:-keep]:
        _unlink(path)
        _unlink(ownership.record_path(path))  # after the checkpoint: never one without a record
    oldest_kept = found.own[-keep:][0][0] if found.own else None
    for step, path in found.own_orphan_records:  # a writer died between the two renames
        if oldest_kept is not None and step < oldest_kept:
            _unlink(ownership.record_path(path))


def _unlink(path: str) -> None:
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
        self._error: Optional[TrainerError] = None

    def submit(self, state: dict, path: str, folder: str, keep: int,
               owner: Owner = ANYONE) -> None:
        self._join()

        def write() -> None:
            try:
                write_atomic(state, path, keep, owner)
                prune(folder, keep, owner)
            except TrainerError as e:  # reported by the next wait(): a CheckpointError, or
                self._error = e  # the ConfigError of a file that is another job's
            except Exception as e:
                self._error = CheckpointError(f"writing {path} failed: {first_line(e)}")

        # Not a daemon: an interpreter that exits lets the write finish first.
        self._thread = threading.Thread(target=write, name="ddptrain-checkpoint")
        self._thread.start()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wait(self) -> Optional[TrainerError]:
        """Wait for the write in flight; the error of the writes since the last wait, if any."""
        self._join()
        error, self._error = self._error, None
        return error


def save(ctx: DistContext, folder: str, keep: int, state: dict,
         writer: Optional[BackgroundWriter] = None, blocking: bool = True,
         owner: Owner = ANYONE) -> str:
    """Collective: every rank calls it with the same step. Returns the path (being) written.
    The file is ``owner``'s: recorded beside it and in it; pruning deletes only its files.

    ``blocking=False`` (with a writer) returns once rank 0 holds a host copy; the file appears
    when the writer thread is done.
    """
    rngs = _all_gather_objects(ctx, capture_rng(ctx.device))
    path = checkpoint_path(folder, state["step"])
    error = None
    if ctx.is_main:
        full = {**state, "format": FORMAT_VERSION, "rng": rngs, "world_size": ctx.world_size,
                "owner": owner.as_dict()}
        writer = writer or BackgroundWriter()
        error = writer.wait()  # the previous write: its failure is reported now
        if error is None:
            writer.submit(_host_copy(full), path, folder, keep, owner)
            if blocking:
                error = writer.wait()
    _raise_on_every_rank(ctx, error)
    return path


def _raise_on_every_rank(ctx: DistContext, error: Optional[TrainerError]) -> None:
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


def prepare_folder(ctx: DistContext, folder: str, owner: Owner = ANYONE,
                   adopt: bool = False) -> tuple[Optional[str], Optional[str]]:
    """Collective: rank 0 creates ``folder``, checks it can write there and picks the newest
    checkpoint this job may resume (``resume_candidates``); every rank gets (problem or None,
    newest path or None). A folder that holds only another job's checkpoints is a problem.

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
            else:
                candidates, problem = resume_candidates(folder, survey(folder, owner), owner,
                                                        adopt)
                newest = candidates[-1][1] if candidates else None
                _remove_stale_temp_files(folder, owner)
        except OSError as e:
            problem = f"{folder} cannot be created: {e.strerror or e}"
    if ctx.distributed:
        box = [(problem, newest)]
        dist.broadcast_object_list(box, src=0, group=ctx.control_group)
        problem, newest = box[0]
    return problem, newest


def resume_candidates(folder: str, found: Survey, owner: Owner,
                      adopt: bool) -> tuple[list[tuple[int, str]], Optional[str]]:
    """The checkpoints this job may resume from (oldest first), or a problem that says why not.

    Its own, when it has any (a restart). Otherwise those without a record, unless another
    job's are there too: then the folder is that job's, and resuming it (or starting next to
    it) is refused unless ``adopt``, which makes every checkpoint there a candidate.
    """
    if found.own:
        return found.own, None
    if found.foreign and not adopt:
        return [], foreign_folder_problem(folder, found.foreign, owner)
    foreign = [(step, path) for step, path, _ in found.foreign]
    return sorted(found.unrecorded + foreign), None


def foreign_folder_problem(folder: str, foreign: list[tuple[int, str, Recorded]],
                           owner: Owner) -> str:
    _step, newest, recorded = foreign[-1]
    whose = recorded.describe() if recorded is not None else "another job"
    others = {r for _s, _p, r in foreign} - {recorded}
    also = f" (and {len(others)} other owner(s))" if others else ""
    return (f"{folder} holds checkpoints of {whose}{also} (newest "
            f"{os.path.basename(newest)}); this is {owner.describe()}. A job resumes only its "
            "own checkpoints and never deletes another's, so it will not start here. Give each "
            "job its own folder (--checkpoint-dir=/checkpoints/$(DDPJOB_NAME) in the job's "
            "args), or pass --adopt-checkpoints to resume from them on purpose (the same job "
            "created again, a copied folder)")


def _remove_stale_temp_files(folder: str, owner: Owner) -> None:
    """Temp files of this job's writers that died mid-write (a crash, SIGKILL): nobody will
    finish them. Another job's (another tag) may be being written right now: left alone, as
    are untagged ones, from versions before owner tags."""
    for name in os.listdir(folder):
        m = _TEMP.match(name)
        if m and m.group(1) == owner.tag():
            _unlink(os.path.join(folder, name))


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
    return f"cannot be loaded ({type(error).__name__}: {first_line(text, 200)})"


@dataclass
class Resumable:
    """What rank 0 found to resume from: every rank gets path and notes, rank 0 the state."""

    path: Optional[str]
    notes: list[str]
    state: Optional[dict] = None


def find_resumable(ctx: DistContext, folder: str, owner: Owner = ANYONE,
                   adopt: bool = False) -> Resumable:
    """Collective: the newest checkpoint in ``folder`` that loads and this job may resume
    (``resume_candidates``), damaged newer ones set aside.

    Rank 0 reads the candidates newest first. A file that can never load is renamed to
    ``<name>.corrupt`` (kept for inspection, never picked again: not a ``step-N.pt`` name) and
    named in a warning, and the next older one is tried. When none loads, nothing is renamed
    and every rank raises ConfigError (exit 2: a restart would read the same bytes); a read
    that failed for another reason is a retryable CheckpointError. A file without an owner
    record whose own dict names another job (copied without its record) is refused as that
    job's; one resumed that was not this job's (no record, or adopted) is recorded as its own.
    """
    found, error = Resumable(None, []), None
    if ctx.is_main:
        damaged: list[tuple[str, str]] = []
        listing = survey(folder, owner)
        candidates, problem = resume_candidates(folder, listing, owner, adopt)
        if problem:
            error = ConfigError(f"--checkpoint-dir: {problem}")
        for _step, path in reversed(candidates if error is None else []):
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
            if found.path is not None:
                error = _take_ownership(folder, found, listing, owner, adopt)
    if ctx.distributed:
        box = [(found.path, found.notes, error)]
        dist.broadcast_object_list(box, src=0, group=ctx.control_group)
        found.path, found.notes, error = box[0]
    if error is not None:
        raise error
    return found


def _take_ownership(folder: str, found: Resumable, listing: Survey, owner: Owner,
                    adopt: bool) -> Optional[ConfigError]:
    """Rank 0, once the file to resume is loaded: make sure it may be, say what is unusual,
    and record a file resumed that was not this job's as its own (then pruned as its own)."""
    assert found.path is not None and found.state is not None
    path, name = found.path, os.path.basename(found.path)
    if listing.foreign and listing.own:
        found.notes.append(
            f"warning: {folder} also holds {len(listing.foreign)} checkpoint(s) of other jobs "
            f"(newest {os.path.basename(listing.foreign[-1][1])}, "
            f"{_describe(listing.foreign[-1][2])}); this job resumes and prunes only its own")
    if any(p == path for _s, p in listing.own):
        return None
    inside = ownership.recorded_in_state(found.state)
    foreign = [(s, p, r) for s, p, r in listing.foreign if p == path]
    if foreign:
        note = f"resuming from {name} of {_describe(foreign[0][2])} (--adopt-checkpoints)"
    elif inside is None:
        note = (f"warning: checkpoint {path} records no owner (written before checkpoints "
                "recorded one); resuming from it as this job's")
    elif isinstance(inside, Owner) and owner.owns(inside):
        note = f"warning: checkpoint {path} had lost its owner record (it names this job inside)"
    elif not adopt:  # its record was lost (a file copied alone): its bytes still say whose
        problem = foreign_folder_problem(folder, [(0, path, inside)], owner)
        return ConfigError(f"--checkpoint-dir: {problem}")
    else:
        note = f"resuming from {name} of {inside.describe()} (--adopt-checkpoints)"
    try:
        ownership.write_record(path, owner)
        note += "; it is this job's from now on"
    except OSError as e:
        note += f"; its owner record could not be written ({e.strerror or e}), so it is never pruned"
    found.notes.append(note)
    return None


def _describe(recorded: Recorded) -> str:
    return recorded.describe() if recorded is not None else "no recorded owner"


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
