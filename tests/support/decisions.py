"""``decide`` and ``decide_invalid`` as the decision tables write a row: the job, its status, the
pods and the clock, with the rest of what the operator saw (generation, created ranks, creation
errors, progress, the Kueue hold) as keywords; they pack it into the ``Observation`` the
operator's functions take, and change nothing else."""
from __future__ import annotations

import datetime as dt
from typing import Any, Optional, Sequence

from ddpjob.api import spec
from ddpjob.api.status import JobStatus
from ddpjob.controller import decide as decision
from ddpjob.controller.decide import Observation, PodView, Plan


def decide(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime, *,
           force_delete_after: float = 60.0, **seen: Any) -> Plan:
    return decision.decide(job, status, Observation(tuple(pods), **seen), now,
                           force_delete_after=force_delete_after)


def decide_invalid(status: JobStatus, message: str, pods: Sequence[PodView], now: dt.datetime, *,
                   uid: Optional[str] = None, generation: Optional[int] = None) -> Plan:
    return decision.decide_invalid(status, message, Observation(tuple(pods), generation), now, uid=uid)
