"""Policy: creating a gang. Never two gangs at once (the old pods, and any namesake, gone first);
the Service must be the job's own; a newer attempt's pods found after a lost status write are
adopted; a spec changed while an attempt still lacks pods starts the next one in the new shape.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Optional, Sequence

from ddpjob.api import names, spec
from ddpjob.api.status import (
    HELD_PHASES, PENDING, QUEUED, RESTARTING, SUSPENDED, JobStatus, format_time, with_phase,
    without_nodes
)
from ddpjob.controller.observation import PodView, ServiceView
from ddpjob.controller.plan import Event, Plan, deletable, is_ours, named_pods, owned_pods
from ddpjob.controller.policy.failure import restart_so_far


SERVICE_CONFLICT = "ServiceConflict"  # a Service with the job's name that is not the job's


def adopt_newer_attempt(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView],
                         now: dt.datetime) -> JobStatus:
    """Pods of a later attempt than the status records exist when a status write was lost after
    the pods were created: adopt them rather than delete a running gang."""
    ours = [p.attempt for p in pods if is_ours(job, p)]
    if status.terminal or job.spec.suspend or not ours or max(ours) <= status.restartAttempt:
        return status
    adopted = replace(without_nodes(status), restartAttempt=max(ours), podSpecHash="")  # shape unknown
    return with_phase(adopted, status.phase or PENDING, status.reason or "PodsCreated", status.message,
                      now, created=True, created_reason="PodsCreated",
                      created_message=f"adopted the pods of attempt {max(ours)}")


def create_gang(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                 service_conflict: Optional[str] = None) -> Plan:
    nnodes, attempt = job.spec.nnodes, status.restartAttempt
    events: list[Event] = []
    if status.phase == SUSPENDED:
        events.append(Event("Normal", "Resumed", "Job resumed: recreating its pods"))
    elif status.phase == QUEUED:
        events.append(Event("Normal", "Admitted", "Admitted by Kueue: creating its pods"))
    phase = RESTARTING if status.phase == RESTARTING else PENDING
    # Never two gangs at once: our old pods must be gone first, and so must any other pod with
    # the name of one of the new ones (a deleted namesake job's, going by garbage collection),
    # or its creation would find "already exists". Only our own are deleted.
    child_names = {names.node_pod_name(job.name, rank) for rank in range(nnodes)}
    pods = [p for p in pods if is_ours(job, p) or p.name in child_names]
    if pods:
        reason = status.reason if phase == RESTARTING else (
            "Resuming" if status.phase in HELD_PHASES else "Waiting")
        message = f"waiting for {len(pods)} old pod(s) to terminate before creating attempt {attempt}: {named_pods(pods)}"
        foreign = [p for p in pods if not is_ours(job, p) and not p.deleting]
        if foreign:
            message += (f" ({named_pods(foreign)}: not this job's pod(s), with the name of one of its own; "
                        "the operator does not delete them)")
        if phase == RESTARTING and status.failedNode is not None:
            message = f"{restart_so_far(job, status)}: {message}"
        waiting = with_phase(replace(status, readyNodes=0), phase, reason, message, now)
        return Plan(status=waiting, delete=deletable(owned_pods(job, pods)), events=tuple(events))

    if service_conflict:
        # The attempt starts (its startup clock runs: the job fails with StartupTimeout if the
        # Service is still in the way then) but no pod is created: none could rendezvous.
        held = replace(without_nodes(status), startTime=status.startTime or format_time(now), nnodes=nnodes,
                       podSpecHash=spec.pod_spec_hash(job.spec))
        held = with_phase(held, phase, SERVICE_CONFLICT, service_conflict, now, created=True,
                          created_reason=SERVICE_CONFLICT,
                          created_message=f"attempt {attempt}: no pod created while the Service is not this job's")
        events.append(Event("Warning", SERVICE_CONFLICT, held.message))
        return Plan(status=held, attempt=attempt, events=tuple(events),
                    requeue_after=float(job.spec.startupTimeoutSeconds))

    message = f"created {nnodes} pod(s) (attempt {attempt}); waiting for every node to run"
    created = replace(without_nodes(status), startTime=status.startTime or format_time(now), nnodes=nnodes, podSpecHash=spec.pod_spec_hash(job.spec))
    created = with_phase(created, phase, "PodsCreated", message, now, created=True,
                         created_reason="PodsCreated", created_message=f"attempt {attempt}: {nnodes} pod(s)")
    events.append(Event("Normal", "Created", f"Creating {nnodes} pod(s) and the Service (attempt {attempt})"))
    return Plan(status=created, create_ranks=tuple(range(nnodes)), attempt=attempt, ensure_service=True,
                events=tuple(events), requeue_after=float(job.spec.startupTimeoutSeconds))


def service_conflict_of(job: spec.DDPJob, service: Optional[ServiceView]) -> Optional[str]:
    """Why the Service with the job's name is in the way, naming it and its owner; None when
    there is none or it is the job's own (its controller owner reference is the job, by uid)."""
    if service is None or job.uid is None or service.owner_uid == job.uid:
        return None
    whose = f"its controller is {service.owner}" if service.owner else "it has no controller owner reference"
    return (f"Service {service.name} is not this job's ({whose}); no pod is created while it exists "
            f"(node 0's address would not resolve): delete or rename it. The operator never adopts, "
            f"changes or deletes it")


def reshape(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime) -> Plan:
    """The spec changed while the attempt still lacks pods: delete the attempt's pods and start
    the next attempt from the new spec. Not a failure: the restart budget is not spent."""
    message = (f"the spec changed while attempt {status.restartAttempt} was starting; "
               f"recreating the gang from the new spec (attempt {status.restartAttempt + 1})")
    restarting = replace(status, restartAttempt=status.restartAttempt + 1, readyNodes=0)
    restarting = with_phase(restarting, RESTARTING, "SpecChanged", message, now, created=False,
                            created_reason="SpecChanged", created_message=message)
    return Plan(status=restarting, delete=deletable(owned_pods(job, pods)),
                events=(Event("Warning", "SpecChanged", message),))
