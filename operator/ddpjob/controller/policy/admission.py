"""Policy: admission. ``suspend: true`` and a Kueue hold (not admitted, or evicted) both leave the
job without pods, Suspended or Queued; the next gang gets a new attempt number.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Sequence

from ddpjob.api import spec
from ddpjob.api.status import CREATED, HELD_PHASES, SUSPENDED, JobStatus, with_phase, without_nodes
from ddpjob.controller.observation import PodView
from ddpjob.controller.plan import Event, Plan, deletable, owned_pods


def hold_gang(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime, *,
             phase: str = SUSPENDED, reason: str = "Suspended", why: str = "spec.suspend is true") -> Plan:
    """Suspended by spec.suspend, or Queued by Kueue (not admitted yet, or evicted): no pods."""
    events: tuple[Event, ...] = ()
    if status.phase not in HELD_PHASES:
        # The next gang gets a new attempt number if this one had pods, so any straggler of the
        # old one is told apart; the deadline clock restarts on resume (startTime cleared).
        attempt = status.restartAttempt + 1 if status.is_true(CREATED) else status.restartAttempt
        status = replace(without_nodes(status), restartAttempt=attempt, startTime=None)
        events = ((Event("Normal", "Suspended", "Job suspended: deleting its pods"),) if phase == SUSPENDED
                  else (Event("Normal", reason, why + (": deleting its pods" if pods else "")),))
    elif status.phase != phase or status.reason != reason:
        events = (Event("Normal", reason, why),)
    pods = owned_pods(job, pods)
    message = why + (f": waiting for {len(pods)} pod(s) to terminate" if pods else "")
    status = with_phase(status, phase, reason, message, now, created=False,
                        created_reason=reason, created_message=why)
    return Plan(status=status, delete=deletable(pods), events=events)
