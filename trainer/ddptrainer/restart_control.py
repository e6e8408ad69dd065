"""The pod entry point's side of an in-place gang restart: its state, and the HTTP answers.

In ``InPlace`` mode (docs/contract.md, "In-place restart") the entry point outlives a failed
attempt of its workers: it says ``failed`` on ``GET /ready`` (503, which flips the pod's Ready
condition and wakes the operator) and ``GET /attempt``, and waits for the operator's
``POST /restart {"attempt": M}``; a healthy pod of the same gang gets the same order while its
workers still run, and stops them first. ``EntryControl`` is that state, shared by the HTTP
threads (orders) and the main thread (attempts); the ``answer_*`` functions are the HTTP
protocol, pure enough to test without a socket.

Standard library only: it runs before torch is imported, and in no other process. Also here:
the InPlace settings, and how an order stops the workers (a SIGTERM, a grace, then SIGKILL).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Optional

from ddpjob import contract
from ddpjob.contract import EntryState

from .stacks import StackCollector
from .text import env_int

#: How long one request may take to send its headers and body (a slow client cannot hold a
#: server thread longer than that).
REQUEST_TIMEOUT_SECONDS = 5.0

_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")

Answer = tuple[int, dict[str, Any]]
Log = Callable[[str], None]


@dataclass(frozen=True)
class RestartSettings:
    """In-place restart (docs/contract.md, "In-place restart"): on only in InPlace mode with a
    progress port and a token."""

    token_sha256: str  # what the digest of an order's token must be
    first_attempt: int = 0
    wait_seconds: int = contract.DEFAULT_RESTART_WAIT_SECONDS
    grace_seconds: int = contract.DEFAULT_RESTART_GRACE_SECONDS
    permanent_codes: tuple[int, ...] = contract.DEFAULT_PERMANENT_EXIT_CODES
    warm_start_after_seconds: int = contract.DEFAULT_WARM_START_AFTER_SECONDS


def read_restart_settings(environ: Mapping[str, str], log: Log) -> Optional[RestartSettings]:
    """The InPlace settings, or None: restarts are the operator's (the pod exits on a failure).
    A value that is not a non-negative integer raises text.BadInteger."""
    if environ.get(contract.DDPJOB_RESTART_MODE) != contract.RESTART_MODE_IN_PLACE:
        return None
    token = environ.get(contract.DDPJOB_RESTART_TOKEN) or ""
    # The operator's pods carry only the token's digest (their environment is readable by the
    # namespace's readers); `ddpjob run`'s local nodes the token itself.
    digest = (environ.get(contract.DDPJOB_RESTART_TOKEN_SHA256) or "").strip().lower()
    if digest and not _HEX_DIGEST.fullmatch(digest):
        log(f"{contract.DDPJOB_RESTART_TOKEN_SHA256} is not 64 hex digits: a failure ends the pod")
        return None
    port = env_int(environ, contract.DDPJOB_PROGRESS_PORT, 0, invalid=0) or 0
    if not (token or digest) or port <= 0:
        log(f"{contract.DDPJOB_RESTART_MODE}=InPlace needs {contract.DDPJOB_RESTART_TOKEN_SHA256} (or "
            f"{contract.DDPJOB_RESTART_TOKEN}) and {contract.DDPJOB_PROGRESS_PORT} > 0: a failure ends the pod")
        return None

    def get(name: str, default: int) -> int:
        value = env_int(environ, name, minimum=0)
        return default if value is None else value

    return RestartSettings(
        token_sha256=digest or contract.restart_token_digest(token), first_attempt=get(contract.DDPJOB_RESTART_ATTEMPT, 0),
        wait_seconds=get(contract.DDPJOB_RESTART_WAIT_SECONDS, contract.DEFAULT_RESTART_WAIT_SECONDS),
        grace_seconds=get(contract.DDPJOB_RESTART_GRACE_SECONDS,
                          contract.DEFAULT_RESTART_GRACE_SECONDS),
        permanent_codes=contract.parse_permanent_exit_codes(
            environ.get(contract.DDPJOB_PERMANENT_EXIT_CODES)),
        warm_start_after_seconds=get(contract.DDPJOB_WARM_START_AFTER_SECONDS,
                                     contract.DEFAULT_WARM_START_AFTER_SECONDS))


class EntryControl:
    """One pod entry point's attempt and state (``running`` / ``failed`` / ``stopping``; every
    change through ``contract.ENTRY_TRANSITIONS``, the one table of them).

    The main thread reports (``begin``, ``fail``, ``workers_active``) and waits
    (``wait_for_order``); HTTP threads order (``order``). An order accepted while workers run
    calls ``stop_workers`` (from the request thread; it must only start the stop, e.g. send a
    signal), after counting it in ``claim_self_signal``, so that the SIGTERM handler can tell
    the signal the entry point sent itself from the kubelet's."""

    def __init__(self, attempt: int, token: str = "", *, token_sha256: str = "",
                 stop_workers: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic):
        # Only the digest is kept: an order is taken when its token hashes to it.
        self._digest = (token_sha256 or (contract.restart_token_digest(token) if token else "")).encode("ascii")
        #: Set by the owner once it can stop its workers (it needs this object to do so).
        self.stop_workers = stop_workers
        self._clock = clock
        self._lock = threading.Condition()
        self._attempt = attempt
        self._state = contract.ENTRY_RUNNING
        self._exit_code: Optional[int] = None
        self._message = ""
        self._failed_at: Optional[float] = None
        self._reported = False  # the failed attempt's workers had written a progress report
        self._ordered: Optional[int] = None  # the attempt being started
        self._active = False  # the workers of the attempt run (or start)
        self._ending = False  # the pod is ending (kubelet SIGTERM): no more restarts
        self._self_signals = 0
        self._begun = False  # the current attempt was started by an order
        #: GET /stacks: the current attempt's workers (the entry point sets its folder).
        self.stacks = StackCollector(clock)

    # ---------------------------------------------------------------- read by everyone
    def snapshot(self) -> EntryState:
        with self._lock:
            since = None if self._failed_at is None else round(self._clock() - self._failed_at, 3)
            return EntryState(attempt=self._attempt, state=self._state, exit_code=self._exit_code,
                              message=self._message[:contract.MAX_ENTRY_MESSAGE_CHARS],
                              seconds_since_failure=since, reported=self._reported)

    def authorized(self, authorization: Optional[str]) -> bool:
        """Whether an ``Authorization`` header carries this pod's token (constant time)."""
        if not self._digest or not authorization:
            return False
        scheme, _, credential = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        # http.server decodes headers as latin-1; hash bytes, never a str with non-ASCII.
        given = hashlib.sha256(credential.strip().encode("latin-1", errors="replace")).hexdigest()
        return hmac.compare_digest(given.encode("ascii"), self._digest)

    @property
    def active(self) -> bool:
        """Whether an attempt runs (or starts): a SIGTERM sent for an order may interrupt it."""
        with self._lock:
            return self._active

    @property
    def attempt(self) -> int:
        """The attempt this pod's workers run in (or last ran in); an accepted order's attempt
        only once ``begin`` starts it."""
        with self._lock:
            return self._attempt

    @property
    def ordered(self) -> Optional[int]:
        """The attempt an accepted order asks for, until ``begin`` starts it."""
        with self._lock:
            return self._ordered

    # ---------------------------------------------------------------- the operator's order
    def order(self, attempt: int) -> Answer:
        """Accept or refuse an order to restart as ``attempt`` (already authenticated)."""
        signal_workers = False
        with self._lock:
            if self._ending:
                return 409, self._refusal("the pod is ending")
            if self._ordered is not None:
                if attempt < self._ordered:
                    return 409, self._refusal(f"attempt {self._ordered} is already starting")
                self._ordered = attempt  # a retry (202 again) or a newer one (starts that)
                return 202, {"attempt": attempt, "state": contract.ENTRY_STOPPING}
            if attempt == self._attempt and self._state == contract.ENTRY_RUNNING and self._begun:
                # a retry that came after the restart it asked for: done already
                return 202, {"attempt": attempt, "state": self._state}
            if attempt <= self._attempt:
                return 409, self._refusal(f"attempt {attempt} is not after attempt {self._attempt}")
            self._ordered = attempt
            if self._state == contract.ENTRY_RUNNING and self._active:
                signal_workers = True
                self._self_signals += 1
            self._move(contract.ENTRY_ORDER)
            self._lock.notify_all()
        if signal_workers:
            self.stop_workers()
        return 202, {"attempt": attempt, "state": contract.ENTRY_STOPPING}

    def _move(self, event: str) -> None:
        """The state after ``event``, as ``contract.ENTRY_TRANSITIONS`` says (the lock held)."""
        self._state = contract.ENTRY_TRANSITIONS.get((self._state, event), self._state)

    def _refusal(self, why: str) -> dict[str, Any]:
        return {"attempt": self._attempt, "state": self._state, "error": why}

    # ---------------------------------------------------------------- the main thread's
    def begin(self, attempt: int) -> None:
        """Attempt ``attempt`` starts (its workers are not up yet)."""
        with self._lock:
            self._move(contract.ENTRY_BEGIN)
            self._attempt, self._ordered = attempt, None
            self._begun = True
            self._exit_code, self._message, self._failed_at = None, "", None
            self._reported = False

    def workers_active(self, active: bool) -> None:
        with self._lock:
            self._active = active

    def fail(self, exit_code: int, message: str, *, reported: bool = False) -> None:
        """The attempt's workers failed (retryably): wait for an order, say so on /ready.
        ``reported``: whether they had written a progress report (``progress_reported``)."""
        with self._lock:
            self._reported = reported
            self._active = False
            self._move(contract.ENTRY_FAIL)  # failed; stopping stays: the order stands
            self._exit_code, self._message = exit_code, message[:contract.MAX_ENTRY_MESSAGE_CHARS]
            self._failed_at = self._clock()

    def end(self) -> None:
        """The pod is ending (the kubelet's SIGTERM): refuse orders from now on."""
        with self._lock:
            self._ending = True
            self._lock.notify_all()

    def claim_self_signal(self) -> bool:
        """Whether a SIGTERM just received is one an order sent (each is claimed once)."""
        with self._lock:
            if self._self_signals:
                self._self_signals -= 1
                return True
            return False

    def wait_for_order(self, timeout_seconds: float) -> Optional[int]:
        """The attempt ordered within ``timeout_seconds``, else None. Waits in short slices, so
        a signal handler that raises (the kubelet's SIGTERM) is never held up."""
        deadline = self._clock() + timeout_seconds
        with self._lock:
            while self._ordered is None and not self._ending:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return None
                self._lock.wait(min(0.2, remaining))
            return None if self._ending else self._ordered


# -------------------------------------------------------------------------- HTTP answers
def answer_get(control: EntryControl, path: str) -> Optional[Answer]:
    """GET /attempt and /ready; None for a path of someone else's (``/progress``, a 404)."""
    if path == contract.ATTEMPT_PATH:
        return 200, control.snapshot().to_json()
    if path == contract.READY_PATH:
        state = control.snapshot()
        return (200 if state.state == contract.ENTRY_RUNNING else 503), state.to_json()
    return None


def parse_order(body: bytes) -> Optional[int]:
    """The attempt of a ``{"attempt": M}`` body, or None when it is not one."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=lambda name: None)
    except (ValueError, RecursionError):
        return None
    attempt = data.get("attempt") if isinstance(data, dict) else None
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        return None
    return attempt if 0 <= attempt <= contract.MAX_ATTEMPT else None


def answer_restart(control: EntryControl, headers: Mapping[str, str],
                   read_body: Callable[[int], bytes]) -> Answer:
    """POST /restart: authenticate, then read a bounded body, then order.

    ``read_body(n)`` reads exactly n bytes (it may raise OSError on a timeout; the server
    then drops the connection). The token is checked before the body is read."""
    if not control.authorized(headers.get("Authorization")):
        return 401, {"error": "a restart order needs this pod's token"}
    length_text = headers.get("Content-Length")
    if length_text is None:
        return 411, {"error": "Content-Length required"}
    length_text = length_text.strip()
    if not (length_text.isascii() and length_text.isdigit()) or len(length_text) > 6:
        return 400, {"error": "bad Content-Length"}
    length = int(length_text)
    if length > contract.MAX_RESTART_BODY_BYTES:
        return 413, {"error": f"a restart order is at most {contract.MAX_RESTART_BODY_BYTES} bytes"}
    body = read_body(length)
    if len(body) != length:
        return 400, {"error": "body shorter than its Content-Length"}
    attempt = parse_order(body)
    if attempt is None:
        return 400, {"error": 'the body must be {"attempt": <non-negative integer>}'}
    return control.order(attempt)


# -------------------------------------------------------------------------- stopping workers
def progress_reported(directory: Optional[str]) -> bool:
    """Whether a worker of the attempt wrote a progress report (the folder is emptied before
    each attempt, ``clear_progress``): one ``rank-*.json`` is enough, none is read."""
    if not directory:
        return False
    try:
        with os.scandir(directory) as entries:
            return any(e.name.startswith("rank-") and e.name.endswith(".json") for e in entries)
    except OSError:
        return False


def clear_progress(directory: Optional[str]) -> None:
    """The previous attempt's reports would read as this attempt's (a hang, a wrong step)."""
    if directory:
        contract.clear_progress_reports(directory)


def stopper(control: EntryControl, grace_seconds: float, log: Log,
            spare: Callable[[], Collection[int]] = tuple) -> Callable[[], None]:
    """What an order does to running workers: the SIGTERM the kubelet would send (torchrun
    forwards it, the trainer saves), to ourselves; what is left after the grace is killed."""

    def stop() -> None:
        attempt = control.snapshot().attempt
        os.kill(os.getpid(), signal.SIGTERM)

        def grace_over() -> None:
            if control.active and control.snapshot().attempt == attempt:
                log(f"the workers did not stop within {grace_seconds}s: killing them")
                kill_descendants(spare())

        timer = threading.Timer(grace_seconds, grace_over)
        timer.daemon = True
        timer.start()

    return stop


def kill_descendants(spare: Collection[int] = ()) -> None:
    """SIGKILL every process below this one but ``spare`` (the warm process: its workers below
    it go), as torchrun starts its workers in sessions of their own, so a process group does
    not reach them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as file:
                ppid = int(file.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    below, queue = [], [os.getpid()]
    while queue:
        for child in children.get(queue.pop(), []):
            below.append(child)
            queue.append(child)
    for pid in below:
        if pid in spare:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
