"""Policy: goodput and checkpoint advice, brought up to date on every pass's status (api/goodput.py,
api/checkpoint_advice.py); a job that succeeds says where its time went.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace

from ddpjob.api import checkpoint_advice, goodput
from ddpjob.api.status import SUCCEEDED, JobStatus, with_phase
from ddpjob.controller.plan import Event, Plan


def with_goodput(before: JobStatus, plan: Plan, now: dt.datetime) -> Plan:
    """The plan's status with its goodput brought up to date (api/goodput.py); a job that
    succeeds says where its time went, in its message and its Succeeded Event."""
    status = goodput.account(before, plan.status, now)
    events = plan.events
    status, advice_events = _checkpoint_advice(before, status)
    events += advice_events
    if status.phase == SUCCEEDED and not before.terminal and status.goodput is not None:
        said = status.goodput.summary
        status = with_phase(status, SUCCEEDED, status.reason, f"{status.message}; {said}", now)
        events = tuple(replace(e, message=f"{e.message}; {said}") if e.reason == SUCCEEDED else e for e in events)
    return replace(plan, status=status, events=events)


def _checkpoint_advice(before: JobStatus, status: JobStatus) -> tuple[JobStatus, tuple[Event, ...]]:
    """The Young/Daly checkpoint interval in the goodput, and an Event at a restart where the
    interval in use is far from it (api/checkpoint_advice.py)."""
    advice = checkpoint_advice.advise(status.goodput, status.progress)
    if status.goodput is None or advice is None:
        return status, ()
    if status.goodput.suggestedCheckpointIntervalSeconds != advice.interval:
        status = replace(status, goodput=replace(status.goodput, suggestedCheckpointIntervalSeconds=advice.interval))
    restarted = before.goodput is None or status.goodput.restarts > before.goodput.restarts
    if restarted and advice.worth_saying:
        return status, (Event("Normal", "CheckpointInterval", advice.message),)
    return status, ()
