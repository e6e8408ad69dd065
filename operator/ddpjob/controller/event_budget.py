"""How many Events one job may post: a token bucket per (job, reason), as client-go's
EventCorrelator has per object, so that a job that fails on purpose a thousand times does not
write thousands of Events into the cluster's etcd (every tenant shares it).

Kubernetes' own controllers post through client-go's recorder, which drops an object's Events
past a burst of 25 and refills one per five minutes; kopf posts every Event it is given. Here
each reason of a job has ``BURST`` Events at once and one more every ``REFILL_SECONDS``; an
Event past that is counted, and the next one of that reason that is posted begins with how
many were left out. The job's status keeps the failure history and the counts, so nothing is lost
but repetition: a restart's Event is the same sentence with another number.

A reason is the operator's (plan.Event's reasons are constants of the policies), so the
number of buckets per job is bounded by the code, not by what a pod writes. The budget lives
in the job's memory: an operator restart refills it, which costs at most one burst per reason.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from ddpjob.controller.plan import Event

#: Events of one reason a job may post at once, and the seconds that earn one more.
BURST = 10
REFILL_SECONDS = 60.0


@dataclass
class _Bucket:
    tokens: float
    at: dt.datetime
    dropped: int = 0


@dataclass
class EventBudget:
    """The Event buckets of one job (``JobMemory.events``)."""

    burst: int = BURST
    refill_seconds: float = REFILL_SECONDS
    buckets: dict[str, _Bucket] = field(default_factory=dict)
    dropped_total: int = 0

    def admit(self, event: Event, now: dt.datetime) -> Optional[Event]:
        """``event`` as it is to be posted (with the count of those left out before it), or
        None when its reason's budget is spent for now."""
        bucket = self.buckets.get(event.reason)
        if bucket is None:
            bucket = self.buckets[event.reason] = _Bucket(float(self.burst), now)
        elapsed = max(0.0, (now - bucket.at).total_seconds())
        bucket.tokens = min(float(self.burst), bucket.tokens + elapsed / self.refill_seconds)
        bucket.at = now
        if bucket.tokens < 1.0:
            bucket.dropped += 1
            self.dropped_total += 1
            return None
        bucket.tokens -= 1.0
        if bucket.dropped:
            # First, where kopf's cut at 1,024 characters cannot take it off.
            event = replace(event, message=f"[{bucket.dropped} earlier {event.reason} Event(s) not "
                                           f"posted: at most {self.burst} at once, then one per "
                                           f"{self.refill_seconds:g} s] {event.message}")
            bucket.dropped = 0
        return event

    def gate(self, post: Callable[[Event], None], now: dt.datetime) -> Callable[[Event], None]:
        """``post`` for one pass: each Event through ``admit`` first."""
        def post_within_budget(event: Event) -> None:
            admitted = self.admit(event, now)
            if admitted is not None:
                post(admitted)
        return post_within_budget
