"""The decision: given a DDPJob, its status and what the operator observed, what happens next.

Pure: plain data in (the job, its status, an ``Observation``: the pods, the ranks created and
refused, the progress reports, the Kueue hold), a ``Plan`` out; no clock, no API, no kopf.
Every path a job can take (and every pain point of the peers it is meant to fix) is a table row
in tests/unit/test_decide.py.

Throughout: only pods whose controller owner reference is this job (by uid) are ever deleted or
counted as the job's; and an attempt keeps the shape it was created with (status.nnodes,
status.podSpecHash): a spec changed under it applies to the next attempt.

Rules, in the order they apply (one module each in controller/policy/, see its __init__):

1. A pod Terminating long past its deadline is force-deleted (its node is gone:
   kubeflow/trainer#2072).
2. A finished job (Succeeded/Failed) stays finished. Its pods are cleaned up per
   cleanPodPolicy, and ttlSecondsAfterFinished deletes the DDPJob itself.
3. ``suspend: true`` deletes every pod and holds the job Suspended; resuming recreates the gang
   with fresh deadline clocks (as Kubernetes Jobs do). A job that Kueue has not admitted, or
   has evicted (``hold``, from controller/kueue.py), is held the same way in phase Queued.
4. activeDeadlineSeconds, counted from status.startTime, fails the job (DeadlineExceeded).
5. A new gang is created only once no pod of the job exists at all: never two gangs at once.
   Its Service is the job's own: a Service with the job's name that the job does not control
   (another user's, a deleted namesake's) is never adopted, changed or deleted; while it exists
   no pod is created (none could rendezvous), the job is Pending, reason ServiceConflict, and
   fails with StartupTimeout once startupTimeoutSeconds have passed. The job's own Service,
   deleted while the job runs, is recreated at once (with a watch on Services).
6. Watching the gang: any failed, evicted or deleted pod fails the attempt. A permanent exit
   code fails the job; anything else restarts the whole gang (never one pod in place:
   kubeflow/pytorch-operator#364) until failurePolicy.maxRestarts is spent. All pods Succeeded
   is success; all started is Running; pods not all started within startupTimeoutSeconds of
   the attempt's creation fail the job and free what it holds (kubernetes-sigs/kueue#2796).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Optional

from ddpjob.api import spec
from ddpjob.api.status import (
    CREATED, FAILED, HELD_PHASES, QUEUED, RUNNING, TERMINAL_PHASES, JobStatus, format_time,
    terminal_reason, with_phase
)
from ddpjob.controller.observation import Observation
from ddpjob.controller.plan import Event, Plan, deletable, owned_pods, soonest
from ddpjob.controller.policy.accounting import with_goodput
from ddpjob.controller.policy.admission import hold_gang
from ddpjob.controller.policy.creation import adopt_newer_attempt, create_gang, service_conflict_of
from ddpjob.controller.policy.finish import fail_job, finished_plan, seconds_to_deadline, stuck_terminating
from ddpjob.controller.policy.gang_watch import watch_gang

# The decision's inputs and outputs, where callers of ``decide`` have always found them.
from ddpjob.controller.observation import PodView, ServiceView, view_pod, view_service  # noqa: E402,F401
from ddpjob.controller.plan import StacksRequest, is_ours  # noqa: E402,F401
from ddpjob.controller.policy.kubelet_restarts import KUBELET_PEER_EXIT_GRACE_SECONDS  # noqa: E402,F401

__all__ = ["decide", "decide_invalid", "refuse_creation", "Observation", "Plan", "Event", "PodView",
           "ServiceView", "StacksRequest", "view_pod", "view_service", "is_ours", "soonest",
           "KUBELET_PEER_EXIT_GRACE_SECONDS"]


def decide(job: spec.DDPJob, status: JobStatus, seen: Observation, now: dt.datetime, *,
           force_delete_after: float = 60.0) -> Plan:
    """The next step for ``job``, given its status and what this pass saw (``seen``).
    ``force_delete_after``: seconds past its deletionTimestamp before a pod still Terminating is
    force-deleted (the operator's setting)."""
    pods, hold, generation = seen.pods, seen.hold, seen.generation
    before = status
    status = replace(status, observedGeneration=generation if generation is not None else status.observedGeneration)
    status = adopt_newer_attempt(job, status, pods, now)
    if not status.nnodes or not (status.terminal or status.is_true(CREATED)):
        # The shape of the attempt in progress (or of the finished one) is what was recorded
        # when its pods were created; the spec's shape is the next attempt's.
        status = replace(status, nnodes=job.spec.nnodes)

    # Only pods whose controller owner reference is this job are ever deleted or counted; other
    # pods that carry the job's label (a user's, or a deleted namesake's) are left alone.
    force, force_due = stuck_terminating(owned_pods(job, pods), now, force_delete_after)
    deadline_left = seconds_to_deadline(job, status, now)
    if status.terminal:
        plan = finished_plan(job, status, pods, now)
    elif job.spec.suspend:
        plan = hold_gang(job, status, pods, now)
    elif hold is not None:
        plan = hold_gang(job, status, pods, now, phase=QUEUED, reason=hold.reason, why=hold.message)
    elif deadline_left is not None and deadline_left <= 0:
        plan = fail_job(job, status, pods, now, "DeadlineExceeded",
                     f"activeDeadlineSeconds ({job.spec.activeDeadlineSeconds}s) exceeded")
    elif not status.is_true(CREATED):
        plan = create_gang(job, status, pods, now, service_conflict_of(job, seen.service))
    else:
        plan = watch_gang(job, status, pods, now, seen.created_ranks, seen.creation_errors, seen.progress,
                           service_conflict_of(job, seen.service), seen.service_watched and seen.service is None,
                           seen.entry_states)

    if plan.status.phase != RUNNING and plan.status.progress is not None and plan.status.progress.eta:
        # An estimate of time left means nothing while the gang is not training.
        plan = replace(plan, status=replace(plan.status, progress=replace(
            plan.status.progress, eta="", etaSeconds=None)))
    if plan.status.phase not in TERMINAL_PHASES | HELD_PHASES:  # the deadline counts down
        plan = replace(plan, requeue_after=soonest(plan.requeue_after, seconds_to_deadline(job, plan.status, now)))
    plan = replace(plan, force_delete=force, requeue_after=soonest(plan.requeue_after, force_due))
    return with_goodput(before, plan, now)


def decide_invalid(status: JobStatus, message: str, seen: Observation, now: dt.datetime, *,
                   uid: Optional[str] = None) -> Plan:
    """A spec that does not parse: Failed/InvalidSpec naming the fields; nothing is created,
    and pods of the job (``uid``) that still run (a spec broken mid-run) are released."""
    generation = seen.generation
    release = deletable(p for p in seen.pods if uid is not None and p.owner_uid == uid and not p.finished)
    if status.terminal:
        reason, text = terminal_reason(status)
        return Plan(status=replace(status, reason=reason, message=text), delete=release)
    failed = with_phase(status, FAILED, "InvalidSpec", message, now)
    failed = replace(failed, completionTime=format_time(now), readyNodes=0,
                     observedGeneration=generation if generation is not None else status.observedGeneration)
    return with_goodput(status, Plan(status=failed, delete=release,
                                      events=(Event("Warning", "InvalidSpec", failed.message),)), now)


def refuse_creation(job: spec.DDPJob, status: JobStatus, message: str, now: dt.datetime) -> Plan:
    """The API server refused to create a pod for a reason a retry cannot fix (an admission
    policy such as Pod Security, or an invalid template): fail with its message. ``status`` is
    the one just written for the creation; what did get created is released by the next pass,
    which sees those pods (the creations' watch events wake it)."""
    return with_goodput(status, fail_job(job, status, (), now, "PodCreationRefused", message), now)
