"""Policy: a finished job and its cleanup. A Succeeded or Failed job stays so; its pods go per
cleanPodPolicy (always, after a failure that held resources: RELEASE_REASONS); the TTL deletes the
DDPJob; activeDeadlineSeconds and a pod stuck Terminating are clocks this policy owns.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Optional, Sequence

from ddpjob.api import spec
from ddpjob.api.status import (
    FAILED, FailedNode, JobStatus, format_time, parse_time, terminal_reason, with_phase
)
from ddpjob.controller.observation import PodView
from ddpjob.controller.plan import Event, Plan, deletable, is_ours, soonest


# Failure reasons after which the job's pods are always released, whatever cleanPodPolicy says:
# the job never got going, and what it holds (GPUs) is what other jobs are waiting for.
RELEASE_REASONS = frozenset({"StartupTimeout", "DeadlineExceeded", "PodCreationRefused"})


def stuck_terminating(pods: Sequence[PodView], now: dt.datetime,
                       after: float) -> tuple[tuple[PodView, ...], Optional[float]]:
    stuck, due = [], None
    for p in pods:
        if p.deletion_at is None:
            continue
        left = (p.deletion_at - now).total_seconds() + after
        if left <= 0:
            stuck.append(p)
        else:
            due = soonest(due, left)
    return tuple(stuck), due


def seconds_to_deadline(job: spec.DDPJob, status: JobStatus, now: dt.datetime) -> Optional[float]:
    start = parse_time(status.startTime)
    if job.spec.activeDeadlineSeconds is None or start is None:
        return None
    return job.spec.activeDeadlineSeconds - (now - start).total_seconds()


def _cleanup(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView]) -> tuple[PodView, ...]:
    reason, _ = terminal_reason(status)
    ours = [p for p in pods if is_ours(job, p)]
    if job.spec.cleanPodPolicy == "All":
        return deletable(ours)
    if job.spec.cleanPodPolicy == "Running" or reason in RELEASE_REASONS:
        return deletable(p for p in ours if not p.finished)
    return ()


def finished_plan(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime) -> Plan:
    reason, message = terminal_reason(status)
    status = replace(status, reason=reason, message=message)  # undo a passing ReconcileError
    requeue, delete_job = None, False
    finished_at = parse_time(status.completionTime)
    if job.spec.ttlSecondsAfterFinished is not None and finished_at is not None:
        left = job.spec.ttlSecondsAfterFinished - (now - finished_at).total_seconds()
        delete_job, requeue = left <= 0, (None if left <= 0 else left)
    return Plan(status=status, delete=_cleanup(job, status, pods), delete_job=delete_job,
                requeue_after=requeue)


def fail_job(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
          reason: str, message: str, failed_node: Optional[FailedNode] = None) -> Plan:
    failed = with_phase(status, FAILED, reason, message, now)
    failed = replace(failed, completionTime=format_time(now), failedNode=failed_node or status.failedNode,
                     readyNodes=0)
    plan = finished_plan(job, failed, pods, now)
    return replace(plan, events=(Event("Warning", reason, failed.message),))
