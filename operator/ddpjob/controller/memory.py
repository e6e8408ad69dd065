"""What a job's worker remembers between reconcile passes (``JobMemory``) and its parts.

Losing it (an operator restart) costs nothing but a few idempotent requests: the status and the
pods hold the truth. reconcile.py reads and updates it; nothing here decides or acts.
"""
from __future__ import annotations

import datetime as dt
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ddpjob.api import progress as progress_reports
from ddpjob.api import spec
from ddpjob.api.status import JobStatus
from ddpjob.controller import entry_asks, kueue, progress
from ddpjob.controller.event_budget import EventBudget
from ddpjob.controller.observation import ServiceView


@dataclass
class Creations:
    """The pods of one attempt this process asked the API server for."""

    attempt: int = 0
    created: set[int] = field(default_factory=set)  # ranks created (the watch may not show them yet)
    refused: dict[int, str] = field(default_factory=dict)  # rank -> why the API server refused it

    def of(self, attempt: int) -> "Creations":
        """This attempt's creations (none yet if the record is another attempt's)."""
        return self if attempt == self.attempt else Creations(attempt)


@dataclass
class ProgressPolling:
    """The current attempt's progress reports and the polls of its pods that bring them.

    A poll the pass wants, (attempt, the pods to ask), is left in ``due`` for the worker to run off the
    reconcile threads; the answers come back through ``answers`` (appended by the worker, taken
    by the next pass: a deque, whose append and popleft are thread-safe)."""

    reports: Optional[progress_reports.GangProgress] = None
    next_poll: Optional[dt.datetime] = None  # when to ask the pods again
    due: Optional[tuple[int, tuple[progress.Target, ...]]] = None
    answers: deque = field(default_factory=deque)
    written_at: Optional[dt.datetime] = None  # the last status write that changed status.progress


@dataclass
class ErrorBackoff:
    """Consecutive failed passes (the retry delay doubles with each) and the last error announced."""

    consecutive: int = 0
    last_message: str = ""


@dataclass
class JobMemory:
    """What a job's worker remembers between passes. Losing it (an operator restart) costs
    nothing but a few idempotent requests: the status and the pods hold the truth."""

    status: Optional[JobStatus] = None  # the status last written; authoritative once set
    # The job's resourceVersion that write left (None: not known), the precondition of the next
    # status write when the watch has not shown a newer one yet (act.write_status).
    written_version: Optional[str] = None
    # A status write refused as stale (409 Conflict) at this version: passes wait until the
    # watch brings a newer job, never acting on the view known to be old.
    stale_version: Optional[str] = None
    stale_since: Optional[dt.datetime] = None  # when it was refused (the wait is bounded)
    parsed: Optional[tuple[Any, spec.DDPJob]] = None  # ((generation, uid, labels), job)
    gone_uids: set[str] = field(default_factory=set)  # deleted, whatever a stale watch says
    creations: Creations = field(default_factory=Creations)
    polling: ProgressPolling = field(default_factory=ProgressPolling)
    workload: kueue.WorkloadBook = field(default_factory=kueue.WorkloadBook)
    errors: ErrorBackoff = field(default_factory=ErrorBackoff)
    # A Service not the job's that a creation found with the job's name, and when: what the
    # pass knows of it when the Service watch does not show it (it lacks the job label). It is
    # looked at again (a creation, a GET) every creation_retry_max_seconds.
    service_found: Optional[tuple[ServiceView, dt.datetime]] = None
    in_place: "InPlaceMemory" = field(default_factory=lambda: InPlaceMemory())
    events: EventBudget = field(default_factory=EventBudget)  # how many Events it may still post


@dataclass
class InPlaceMemory:
    """In-place restarts: the pods seen ready (a pod whose readiness drops after that is asked
    what happened), and the pods ordered into a new attempt whose relabelling the watch may not
    show yet (uid -> attempt)."""

    seen_ready: set[str] = field(default_factory=set)
    ordered: dict[str, int] = field(default_factory=dict)
    # Kubelet restarts: the attempt-at-start annotation written to each pod (uid -> value), so
    # that passes before the watch shows it do not write it again.
    armed: dict[str, int] = field(default_factory=dict)
    # The last GET /attempt of each pod (uid -> ask), open or answered (entry_asks), and when the
    # pass wants the job back for an open one (seconds; None: it does not).
    asks: dict[str, entry_asks.Ask] = field(default_factory=dict)
    recheck_after: Optional[float] = None
    # Wakes the job's worker (any thread): an ask answered after its pass went on.
    wake: Optional[Callable[[], None]] = None
