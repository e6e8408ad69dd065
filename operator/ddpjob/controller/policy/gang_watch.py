"""Policy: watching the attempt that runs. Each rank's pod is read into the status (nodes), its
failure (if any) goes to the failure policy, and otherwise the attempt is Succeeded, Running (with
progress and stall detection) or still starting (the startup clock, ranks to create).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

from ddpjob.api import failure_policy, names, node_exclusion, spec, progress as progress_reports
from ddpjob.api.failure_policy import NodeFailure
from ddpjob.api.status import (
    CREATED, NODE_MESSAGE_LIMIT, NODE_NAME_LIMIT, PENDING, PHASE_LIMIT, REASON_LIMIT, RESTARTING,
    RUNNING, SUCCEEDED, JobStatus, NodeState, format_time, listed, parse_time, recorded_nodes, shorten,
    truncate, with_nodes, with_phase
)
from ddpjob.controller.observation import (
    DETAIL_LIMIT, LISTED_PODS, MISSING, POD_RUNNING, POD_SUCCEEDED, PodView
)
from ddpjob.controller.plan import Event, Plan, deletable, owned_pods, soonest
from ddpjob.controller.policy.creation import SERVICE_CONFLICT, reshape
from ddpjob.controller.policy.failure import (
    consequence_wait, entry_failure, failure_of, on_failure, restart_so_far
)
from ddpjob.controller.policy import image_pull
from ddpjob.controller.policy.finish import fail_job, finished_plan
from ddpjob.controller.policy.kubelet_restarts import kubelet_carried, kubelet_restart_of, to_arm
from ddpjob.controller.policy.restart_mode import in_place_start_overdue
from ddpjob.controller.policy.stalls import on_stall
from ddpjob.restart_orders import EntryState


def watch_gang(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                created_ranks: frozenset[int], creation_errors: Mapping[int, str],
                progress: Optional[progress_reports.GangProgress] = None,
                service_conflict: Optional[str] = None, service_missing: bool = False,
                entry_states: Mapping[str, EntryState] = {}) -> Plan:
    carried, held, held_for = kubelet_carried(job, status, pods, now)
    plan = _watch_attempt(job, status, pods, now, created_ranks, creation_errors, progress, service_conflict,
                          service_missing, entry_states, carried, held)
    if plan.status.restartAttempt != status.restartAttempt:  # restarted again: nothing to carry
        return plan
    adopt = tuple(p for p in carried if p not in plan.delete)
    return replace(plan, adopt=adopt, arm=to_arm(job, status, pods, adopt),
                   requeue_after=soonest(plan.requeue_after, held_for))


@dataclass
class _Ranks:
    """What one pass read of the attempt's ranks, rank by rank."""

    current: dict[int, PodView]  # the attempt's pod of each rank that has one
    strays: list[PodView]  # the job's pods that are not (another attempt, a duplicate rank)
    nodes: list[NodeState] = field(default_factory=list)
    failures: list[NodeFailure] = field(default_factory=list)
    waiting_for_cause: list[EntryState] = field(default_factory=list)  # entry points that failed, as they said
    succeeded: int = 0
    started: int = 0
    missing: list[int] = field(default_factory=list)  # ranks with no pod, never observed or succeeded


def _watch_attempt(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                   created_ranks: frozenset[int], creation_errors: Mapping[int, str],
                   progress: Optional[progress_reports.GangProgress], service_conflict: Optional[str],
                   service_missing: bool, entry_states: Mapping[str, EntryState],
                   carried: list[PodView], held: list[PodView]) -> Plan:
    # The attempt keeps the shape it was created with (status.nnodes, status.podSpecHash): a
    # spec changed under it (an older CRD, a bypassed validation) is for the next attempt.
    nnodes, attempt = status.nnodes, status.restartAttempt
    ranks = _read_ranks(job, status, _sort_pods(job, status, pods, carried, held), entry_states, now)
    observed = with_nodes(status, ranks.nodes)
    stray_deletes = deletable(ranks.strays)

    if ranks.failures:
        wait = consequence_wait(ranks.failures, ranks.waiting_for_cause)
        if wait is not None:
            return Plan(status=observed, delete=stray_deletes, requeue_after=wait)
        # An entry point that saw its workers' reports vouches that the attempt trained, where
        # the operator's poll (every few seconds) may have missed a short attempt.
        reported = any(e.reported and e.attempt == attempt for e in entry_states.values())
        restarted_by_kubelet = tuple(p for p in ranks.current.values() if kubelet_restart_of(p) is not None)
        return on_failure(job, observed, pods, now, ranks.failures, reported=reported,
                          restarted_by_kubelet=restarted_by_kubelet)
    if ranks.succeeded == nnodes:
        done = with_phase(observed, SUCCEEDED, "AllNodesSucceeded", f"all {nnodes} node(s) succeeded", now)
        done = replace(done, completionTime=format_time(now), failedNode=None)
        plan = finished_plan(job, done, pods, now)
        return replace(plan, delete=plan.delete + stray_deletes,
                       events=(Event("Normal", "Succeeded", f"All {nnodes} node(s) succeeded"),))
    # Our Service deleted under the job: recreated now (the watch shows its absence). The pods
    # that run keep their addresses; a restarted or late pod needs the Service to be found.
    service_events = (Event("Warning", "ServiceMissing",
                            f"Service {names.service_name(job.name)} does not exist: creating it"),) \
        if service_missing else ()
    if ranks.started == nnodes:
        return _running(job, status, observed, pods, now, ranks, progress, service_conflict, service_missing,
                        service_events, stray_deletes)
    return _starting(job, status, observed, pods, now, ranks, created_ranks, creation_errors, service_conflict,
                     service_missing, service_events, stray_deletes)


def _reshaped(job: spec.DDPJob, status: JobStatus) -> bool:
    return bool(status.podSpecHash) and status.podSpecHash != spec.pod_spec_hash(job.spec)


def _spec_changed_note(job: spec.DDPJob, status: JobStatus) -> str:
    return ("; the spec has changed since this attempt started: the change applies to the next attempt"
            if _reshaped(job, status) else "")


def _sort_pods(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], carried: list[PodView],
               held: list[PodView]) -> _Ranks:
    """The attempt's pod of each rank, and the job's other pods (strays). Pods the kubelet
    restarted come first, as pods of this attempt; those still given time to exit are neither."""
    current: dict[int, PodView] = {}
    strays: list[PodView] = []
    set_aside = {p.uid for p in carried} | {p.uid for p in held}
    for p in carried + [p for p in owned_pods(job, pods) if p.uid not in set_aside]:
        if p.attempt == status.restartAttempt and p.node_rank < status.nnodes and p.node_rank not in current:
            current[p.node_rank] = p
        else:
            strays.append(p)
    return _Ranks(current=current, strays=strays)


def _read_ranks(job: spec.DDPJob, status: JobStatus, ranks: _Ranks, entry_states: Mapping[str, EntryState],
                now: dt.datetime) -> _Ranks:
    """Each rank's node state and failure, if any; counts of the succeeded and started."""
    # What earlier passes recorded of this attempt: every rank observed and every rank that
    # succeeded (status.nodes itself lists at most NODES_LISTED of them).
    listed_before, observed_before, succeeded_before = recorded_nodes(status)
    for rank in range(status.nnodes):
        pod = ranks.current.get(rank)
        if pod is not None:
            _read_pod(job, pod, ranks, entry_states, status.restartAttempt, now)
        elif rank in succeeded_before:
            # A finished pod someone cleaned up: still a success.
            ranks.nodes.append(listed_before.get(rank) or NodeState(
                nodeRank=rank, pod=names.node_pod_name(job.name, rank), phase=POD_SUCCEEDED))
            ranks.succeeded += 1
            ranks.started += 1
        elif rank in observed_before:
            # Observed once in this attempt, gone now without our deleting it.
            previous = listed_before.get(rank) or NodeState(nodeRank=rank, pod=names.node_pod_name(job.name, rank))
            gone = replace(previous, phase=MISSING, ready=False, reason=MISSING, message="the pod was deleted")
            ranks.nodes.append(gone)
            # A disruption seen before the pod went (a pod GC'd off a deleted node) still counts.
            disruption = previous.reason if previous.reason in failure_policy.KNOWN_DISRUPTIONS else ""
            ranks.failures.append(NodeFailure(node_rank=rank, exit_code=None, reason=MISSING, pod=gone.pod,
                                              message="the pod was deleted", disruption=disruption,
                                              node=previous.nodeName))
        else:
            ranks.missing.append(rank)
    return ranks


def _read_pod(job: spec.DDPJob, pod: PodView, ranks: _Ranks, entry_states: Mapping[str, EntryState], attempt: int,
              now: dt.datetime) -> None:
    ranks.nodes.append(_node_state(pod))
    failure = failure_of(job, pod) or kubelet_restart_of(pod)
    if failure is None:
        failure = entry_failure(pod, entry_states.get(pod.uid), attempt, now)
        if failure is not None:
            ranks.waiting_for_cause.append(entry_states[pod.uid])
    if failure is not None:
        ranks.failures.append(failure)
    elif pod.phase == POD_SUCCEEDED:
        ranks.succeeded += 1
        ranks.started += 1
    elif pod.phase == POD_RUNNING:
        ranks.started += 1


def _running(job: spec.DDPJob, status: JobStatus, observed: JobStatus, pods: Sequence[PodView], now: dt.datetime,
             ranks: _Ranks, progress: Optional[progress_reports.GangProgress], service_conflict: Optional[str],
             service_missing: bool, service_events: tuple[Event, ...], stray_deletes: tuple[PodView, ...]) -> Plan:
    """Every rank started: Running, with progress and stall detection."""
    nnodes, attempt = status.nnodes, status.restartAttempt
    message = (f"{observed.readyNodes}/{nnodes} node(s) running"
               + (f", {ranks.succeeded} succeeded" if ranks.succeeded else "") + _spec_changed_note(job, status))
    if service_conflict:  # a gang already running found its peers; a restart would be held
        message += f"; {service_conflict}"
    events = () if status.phase == RUNNING else (Event("Normal", "Running", f"All {nnodes} node(s) running (attempt {attempt})"),)
    running = replace(with_phase(observed, RUNNING, "AllNodesRunning", message, now), failedNode=None)
    since = status.condition(RUNNING) if status.phase == RUNNING else None
    running_since = (parse_time(since.lastTransitionTime) if since else None) or now
    if ranks.succeeded:  # the training is over (a node exited 0): what runs is exiting, not stalled
        stalled, stall_due, overdue, overdue_due = None, None, None, None
    else:
        stalled, stall_due = progress_reports.stall(job, progress, running_since, now)
        overdue, overdue_due = in_place_start_overdue(job, status, progress, now)
    if stalled is not None or overdue is not None:
        return on_stall(job, observed, pods, now, stalled or overdue)
    stall_due = soonest(stall_due, overdue_due)
    if progress is not None:
        running = replace(running, progress=progress_reports.to_status(
            progress, running=True, previous=status.progress))
    return Plan(status=running, delete=stray_deletes, events=events + service_events,
                ensure_service=service_missing, requeue_after=stall_due)


def _starting(job: spec.DDPJob, status: JobStatus, observed: JobStatus, pods: Sequence[PodView], now: dt.datetime,
              ranks: _Ranks, created_ranks: frozenset[int], creation_errors: Mapping[int, str],
              service_conflict: Optional[str], service_missing: bool, service_events: tuple[Event, ...],
              stray_deletes: tuple[PodView, ...]) -> Plan:
    """Some ranks have not started: the startup clock runs from the attempt's creation; ranks
    without a pod are created."""
    nnodes, attempt, missing = status.nnodes, status.restartAttempt, ranks.missing
    waiting = [p for p in ranks.current.values() if p.phase not in (POD_RUNNING, POD_SUCCEEDED)]
    # An image the nodes cannot pull is said first, with what to do (the kubelet's backoff
    # would otherwise read as one more pending reason among the scheduler's).
    unpulled = image_pull.describe(job, image_pull.not_pulled(waiting))
    described = _describe_not_started(job, waiting, missing, creation_errors, service_conflict or "")
    if unpulled:
        described = f"{unpulled}; {described}"
    created_cond = status.condition(CREATED)
    started_at = parse_time(created_cond.lastTransitionTime) if created_cond else None
    left = None
    if started_at is not None:
        left = job.spec.startupTimeoutSeconds - (now - started_at).total_seconds()
        if left <= 0:
            message = (f"{len(waiting) + len(missing)} of {nnodes} node(s) not running after startupTimeoutSeconds "
                       f"({job.spec.startupTimeoutSeconds}s): {described}")
            return fail_job(job, observed, pods, now, "StartupTimeout", message)

    # A rank whose old pod still holds the name (terminating after an in-place restart kept
    # its peers) is created once that pod is gone: a creation now would find "already exists".
    taken = {p.name for p in pods}
    recreate = () if service_conflict else tuple(
        r for r in missing if r not in created_ranks and names.node_pod_name(job.name, r) not in taken)
    if recreate and _reshaped(job, status):
        # A pod of this attempt would be built from another spec than its peers (another
        # WORLD_SIZE, image, ...): start the next attempt in the new shape instead.
        return reshape(job, observed, pods, now)
    phase = RESTARTING if status.phase == RESTARTING else PENDING
    reason = (SERVICE_CONFLICT if service_conflict and missing
              else image_pull.IMAGE_NOT_PULLED if unpulled else "NodesPending")
    prefix = f"{restart_so_far(job, status)}: " if phase == RESTARTING else ""
    # Said before the pods' reasons, which a long gang's message may cut short.
    avoided = node_exclusion.unschedulable_note(status) if any(p.unschedulable for p in waiting) else ""
    message = (f"{prefix}{ranks.started}/{nnodes} node(s) started{avoided}; waiting for {described}"
               f"{_spec_changed_note(job, status)}")
    pending = with_phase(observed, phase, reason, message, now)
    events = service_events
    if reason == SERVICE_CONFLICT and status.reason != SERVICE_CONFLICT:
        events += (Event("Warning", SERVICE_CONFLICT, shorten(service_conflict or "", DETAIL_LIMIT * 2)),)
    if reason == image_pull.IMAGE_NOT_PULLED and unpulled:
        events += image_pull.event(status, unpulled)
    return Plan(status=pending, create_ranks=recreate, attempt=attempt, ensure_service=bool(recreate) or service_missing,
                delete=stray_deletes, events=events, requeue_after=left)


def _node_state(p: PodView) -> NodeState:
    reason = (p.terminated_reason or p.disruption or p.pod_reason or p.waiting_reason
              or ("Unschedulable" if p.unschedulable else ""))
    # Container output keeps its last lines; the kubelet's and the scheduler's words their first.
    message = (truncate(p.terminated_message, NODE_MESSAGE_LIMIT) if p.terminated_message else
               shorten(p.pod_message or p.waiting_message or p.unschedulable.partition(": ")[2],
                       NODE_MESSAGE_LIMIT))
    if p.deleting and not p.finished:
        reason = reason or "Terminating"
    # Pod status is anyone's who may write it: every field is bounded (api/status.py).
    return NodeState(nodeRank=p.node_rank, pod=p.name, phase=shorten(p.phase, PHASE_LIMIT), ready=p.ready,
                     exitCode=p.exit_code, reason=shorten(reason, REASON_LIMIT), message=message,
                     nodeName=shorten(p.node_name, NODE_NAME_LIMIT))


def _describe_not_started(job: spec.DDPJob, waiting: Sequence[PodView], missing: Sequence[int],
                          creation_errors: Mapping[int, str], held_by: str = "") -> str:
    """The pods not running yet, grouped by why: a 64-node gang the scheduler cannot place is
    one clause ("64 pod(s) ... Pending (Unschedulable: ...)"), not 64 copies of its verdict."""
    groups: dict[str, list[str]] = {}
    for p in sorted(waiting, key=lambda p: p.node_rank):
        groups.setdefault(_why_waiting(p), []).append(p.name)
    refused = [r for r in missing if r in creation_errors]
    for rank in refused:
        why = f"not created ({shorten(creation_errors[rank], DETAIL_LIMIT)})"
        groups.setdefault(why, []).append(names.node_pod_name(job.name, rank))
    unseen = len(missing) - len(refused)
    clauses = [f"{_listed(pods)} {why}" for why, pods in groups.items()]
    if unseen and held_by:
        clauses.append(f"{unseen} pod(s) not created: {held_by}")
    elif unseen:
        clauses.append(f"{unseen} pod(s) not observed yet")
    return "; ".join(clauses)


def _listed(pod_names: Sequence[str]) -> str:
    """Pod names for a clause: ``4 pod(s) a, b and 2 more`` once some are left out."""
    count = f"{len(pod_names)} pod(s) " if len(pod_names) > LISTED_PODS else ""
    return count + listed(pod_names, LISTED_PODS)


def _why_waiting(p: PodView) -> str:
    if p.unschedulable:
        return f"Pending ({shorten(p.unschedulable, DETAIL_LIMIT)})"
    if p.waiting_reason:
        detail = f": {p.waiting_message}" if p.waiting_message else ""
        return f"{p.phase} ({shorten(p.waiting_reason + detail, DETAIL_LIMIT)})"
    return p.phase
