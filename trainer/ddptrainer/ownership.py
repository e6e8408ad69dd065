"""Whose a checkpoint is: the job that wrote it, recorded next to it and inside it.

Two jobs pointed at one folder (a shared volume path, ``ddpjob run``'s default ``checkpoints/``)
would otherwise resume each other's files and prune them. Every checkpoint ``step-N.pt`` gets an
owner record ``step-N.pt.owner`` (a small JSON object, cheap to read without loading a
multi-GB checkpoint), written before the checkpoint is renamed into place, so a visible
checkpoint of this version always has one; the checkpoint's own dict holds a copy, which
travels with the bytes when the file is copied elsewhere.

A job is its namespace, name and uid (docs/contract.md: DDPJOB_NAMESPACE, DDPJOB_NAME,
DDPJOB_UID): a job deleted and created again under the same name has another uid and is another
job. Under ``ddpjob run`` the uid is one fresh id per run, the same for every gang restart.

An owner record is read from a volume that someone else may write: it is read with a size
bound, only if it is a regular file (not a FIFO that would block, not a symlink), and anything
malformed is an "unknown" owner, never a traceback.

Standard library only.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from ddpjob import contract

from .errors import ConfigError

SUFFIX = ".owner"
MAX_RECORD_BYTES = 4096
MAX_FIELD_CHARS = 253  # a Kubernetes name's limit; a uid is 36


@dataclass(frozen=True)
class Owner:
    """The job a checkpoint belongs to. All empty: a plain ``ddptrain`` run outside any job."""

    namespace: str = ""
    name: str = ""
    uid: str = ""

    def owns(self, recorded: "Owner") -> bool:
        """Whether a checkpoint recorded as ``recorded``'s is this job's.

        A record without uid (written under an operator that did not set DDPJOB_UID yet)
        matches any uid of the same namespace/name: the job that wrote it may be this one,
        upgraded mid-run.
        """
        return ((self.namespace, self.name) == (recorded.namespace, recorded.name)
                and (not recorded.uid or self.uid == recorded.uid))

    def describe(self) -> str:
        if not self.name:
            return "a ddptrain run outside any DDPJob (no DDPJOB_NAME)"
        return f"job {self.namespace or 'default'}/{self.name}" + (
            f" (uid {self.uid})" if self.uid else "")

    def as_dict(self) -> dict[str, str]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}

    def tag(self) -> str:
        """A short fixed-width token of this identity, for temp-file names."""
        key = "\0".join((self.namespace, self.name, self.uid)).encode()
        return hashlib.sha256(key).hexdigest()[:12]


@dataclass(frozen=True)
class Unknown:
    """A record that exists but cannot be read as an owner: treated as another job's."""

    reason: str

    def describe(self) -> str:
        return f"an unknown job ({self.reason})"


Recorded = Union[Owner, Unknown, None]  # None: no record (written before checkpoints had one)


def from_environment(environ: Mapping[str, str]) -> Owner:
    """This process's job, from the pod contract's variables (ConfigError if absurd)."""
    values = {}
    for field, variable in (("namespace", contract.DDPJOB_NAMESPACE),
                            ("name", contract.DDPJOB_NAME), ("uid", contract.DDPJOB_UID)):
        value = environ.get(variable, "")
        if len(value) > MAX_FIELD_CHARS:
            raise ConfigError(f"--checkpoint-dir: {variable} is {len(value)} characters long; "
                              f"a job identity is at most {MAX_FIELD_CHARS}")
        values[field] = value
    return Owner(**values)


def from_value(value: Any, what: str) -> Union[Owner, Unknown]:
    """An owner from a decoded record (JSON, or the checkpoint's own ``owner`` entry), which
    ``what`` names in the reason of an Unknown."""
    if not isinstance(value, dict):
        return Unknown(f"{what} holds a {type(value).__name__}, not an object")
    fields = {}
    for field in ("namespace", "name", "uid"):
        text = value.get(field, "")
        if not isinstance(text, str) or len(text) > MAX_FIELD_CHARS:
            return Unknown(f"{what} has a {field} that is not a string of at most "
                           f"{MAX_FIELD_CHARS} characters")
        fields[field] = text
    return Owner(**fields)


def record_path(checkpoint_path: str) -> str:
    return checkpoint_path + SUFFIX


def read_record(checkpoint_path: str) -> Recorded:
    """The owner recorded for ``checkpoint_path``: None when there is no record."""
    path = record_path(checkpoint_path)
    try:
        # O_NONBLOCK: a FIFO planted there must not hang the start; O_NOFOLLOW: nor a link
        # to something large or somewhere else.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        return Unknown(f"{os.path.basename(path)} cannot be opened: {e.strerror or e}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return Unknown(f"{os.path.basename(path)} is not a regular file")
        data = os.read(fd, MAX_RECORD_BYTES + 1)
    except OSError as e:
        return Unknown(f"{os.path.basename(path)} cannot be read: {e.strerror or e}")
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        return Unknown(f"{os.path.basename(path)} is over {MAX_RECORD_BYTES} bytes")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return Unknown(f"{os.path.basename(path)} is not JSON")
    return from_value(value, os.path.basename(path))


def write_record(checkpoint_path: str, owner: Owner) -> None:
    """Atomically: a temp file (named with the owner's tag), fsync, rename. OSError propagates."""
    path = record_path(checkpoint_path)
    tmp = temp_path(path, owner)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(owner.as_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def temp_path(final_path: str, owner: Owner) -> str:
    """The hidden temp name a writer of ``owner`` uses for ``final_path``.

    The owner's tag in the name lets a job remove its own dead writers' temp files at start
    without touching those another job is writing right now.
    """
    folder, base = os.path.split(final_path)
    return os.path.join(folder, f".{base}.tmp-{owner.tag()}-{os.getpid()}")


def recorded_in_state(state: Mapping[str, Any]) -> Recorded:
    """The owner a loaded checkpoint names in its own dict (None: it names none)."""
    return from_value(state["owner"], "its owner entry") if "owner" in state else None
