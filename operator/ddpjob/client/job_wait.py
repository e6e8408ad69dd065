"""Waiting for a DDPJob: ``ddpjob wait`` and ``ddpjob submit --follow`` ask the API server every
few seconds until the job is where the user asked, or a time limit passes.

Polling, not a watch: a GET every ``POLL_SECONDS`` per waiting command costs the API server
less than it notices, survives a dropped connection without a resume protocol, and keeps the
wait's clock the user's (``--timeout``). The clock and the sleep are parameters, for tests.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ddpjob.api.status import FAILED, RUNNING, SUCCEEDED, JobStatus

POLL_SECONDS = 2.0
#: What ``--for`` takes: the job finished (exit 0 only if it Succeeded), it runs, or it is gone.
CONDITIONS = ("finished", "running", "delete")

# The exit codes of ``ddpjob wait`` (and of ``submit --follow`` once the job is created).
EXIT_OK = 0  # the condition holds (finished: and the job Succeeded)
EXIT_JOB_FAILED = 1  # the job Failed (it can no longer reach the condition)
EXIT_INVALID = 2  # bad flags
EXIT_UNREADABLE = 3  # the job is not there (and it was not waited out of existence), or no cluster
EXIT_TIMEOUT = 124  # --timeout passed first, as timeout(1) says it
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell says it); the job goes on

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str) -> float:
    """kubectl's durations: 90, 90s, 10m, 1h30m; 0 means no limit. ValueError names the form."""
    text = text.strip()
    if text.isdigit():
        return float(text)
    found = _DURATION.match(text)
    if not text or not found or not any(found.groups()):
        raise ValueError(f"{text!r} is not a duration: write seconds (90) or 90s, 10m, 1h30m (0: no limit)")
    hours, minutes, seconds = (int(g or 0) for g in found.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


@dataclass(frozen=True)
class Outcome:
    code: int
    job: Optional[dict]  # as last read (None: gone, or never there)
    words: str  # one line: what the wait found


def judge(job: Optional[dict], condition: str) -> Optional[Outcome]:
    """Where the wait ends with ``job`` as it is now, or None to wait on."""
    if job is None:
        if condition == "delete":
            return Outcome(EXIT_OK, None, "deleted")
        return Outcome(EXIT_UNREADABLE, None, "not there (deleted, or never created)")
    status = JobStatus.from_dict(job.get("status") or {})
    if condition == "delete":
        return None
    if status.phase == FAILED:
        return Outcome(EXIT_JOB_FAILED, job, f"Failed ({status.reason or 'no reason given'})")
    if status.phase == SUCCEEDED:
        return Outcome(EXIT_OK, job, "Succeeded")
    if condition == "running" and status.phase == RUNNING:
        return Outcome(EXIT_OK, job, "Running")
    return None


def wait(read: Callable[[], Optional[dict]], condition: str, timeout: float, *,
         poll: float = POLL_SECONDS, clock: Optional[Callable[[], float]] = None,
         sleep: Optional[Callable[[float], None]] = None) -> Outcome:
    """Read the job (``read``: None when it is not there; a ClusterError goes to the caller)
    until ``judge`` ends the wait, or ``timeout`` seconds pass (0: no limit)."""
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    deadline = clock() + timeout if timeout > 0 else None
    while True:
        job = read()
        outcome = judge(job, condition)
        if outcome is not None:
            return outcome
        if deadline is not None and clock() >= deadline:
            phase = JobStatus.from_dict((job or {}).get("status") or {}).phase or "no phase yet"
            return Outcome(EXIT_TIMEOUT, job, f"still {phase} after {timeout:g} s")
        sleep(poll if deadline is None else max(0.0, min(poll, deadline - clock())))
