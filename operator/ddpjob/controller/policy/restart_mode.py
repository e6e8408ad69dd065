"""Policy: restart in place. Which pods of a failed attempt can start the next one inside themselves
(their entry points take orders), when an in-place attempt has failed before training (the next
one gets new pods), and the startup bound of an attempt whose pods were running from the order on.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Optional, Sequence

from ddpjob import contract
from ddpjob.api import spec, progress as progress_reports
from ddpjob.api.status import CREATED, RESTARTING, JobStatus, parse_time, with_phase, without_nodes
from ddpjob.controller.observation import POD_RUNNING, PodView
from ddpjob.controller.plan import Event, Plan, deletable, owned_pods


def started_in_place(status: JobStatus) -> bool:
    """The current attempt was started inside the pods of the one before (failureHistory[0] is
    the failure that ended that one)."""
    last = status.failureHistory[0] if status.failureHistory else None
    return (last is not None and last.restartMode == contract.RESTART_MODE_IN_PLACE
            and last.attempt == status.restartAttempt - 1)


def failed_before_training_in_place(status: JobStatus, reported: bool = False) -> bool:
    """The attempt restarted in place failed before any of its ranks reported progress, where an
    earlier attempt did report (the program reports, so its silence is news). Whatever held it
    (a process SIGTERM did not end, a wedged device, a full /dev/shm) may still be in those pods:
    the next attempt gets new ones. ``reported``: an entry point of the attempt saw a report of
    its workers that the operator's last poll (status.progress) had not yet seen."""
    return (started_in_place(status) and status.progress is not None and not reported
            and status.progress.attempt < status.restartAttempt)


def in_place_start_overdue(job: spec.DDPJob, status: JobStatus,
                            progress: Optional[progress_reports.GangProgress],
                            now: dt.datetime) -> tuple[Optional[progress_reports.Stall], Optional[float]]:
    """(a stall, if an attempt restarted in place has not reached its first progress report
    within startupTimeoutSeconds of the order; else seconds until it would be late, if that
    bound applies). The bound applies to programs that report progress (an earlier attempt
    did) and counts from no earlier than this operator's first sight of the attempt, as hang
    detection does (an operator outage is no evidence of a hang). The pods of an in-place
    attempt are running from the order on, so the startup clock alone would never fire."""
    if not started_in_place(status) or status.progress is None or progress is None:
        return None, None
    if progress.attempt == status.restartAttempt and progress.ranks:
        return None, None
    created = status.condition(CREATED)
    ordered_at = parse_time(created.lastTransitionTime) if created and created.status == "True" else None
    if ordered_at is None:
        return None, None
    since = max(ordered_at, progress.watched_since or ordered_at)
    left = job.spec.startupTimeoutSeconds - (now - since).total_seconds()
    if left > 0:
        return None, left
    world = status.nnodes * job.spec.nprocPerNode
    message = (f"attempt {status.restartAttempt} was restarted in place, and no rank reported progress "
               f"within startupTimeoutSeconds ({job.spec.startupTimeoutSeconds}s) of the order")
    return progress_reports.Stall(message, tuple(range(world)), 0), None


def restartable_in_place(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView],
                          reported: bool = False) -> tuple[PodView, ...]:
    """The pods of the failed attempt that can start the next one in place: running, with an
    entry point that takes orders, in the attempt's shape (a spec changed since is for new
    pods), and not on a node the next attempt avoids. None at all: the gang is recreated; so
    too after an in-place attempt that failed before its first progress report."""
    if (spec.effective_restart_mode(job.spec) != contract.RESTART_MODE_IN_PLACE
            or (status.podSpecHash and status.podSpecHash != spec.pod_spec_hash(job.spec))
            or failed_before_training_in_place(status, reported)):
        return ()
    avoided = {n.nodeName for n in status.excludedNodes}
    keep: dict[int, PodView] = {}
    for p in owned_pods(job, pods):
        if (p.attempt == status.restartAttempt and p.phase == POD_RUNNING and p.running and not p.deleting
                and p.restart_nonce and p.pod_ip and p.node_name not in avoided
                and p.node_rank < status.nnodes and p.node_rank not in keep):
            keep[p.node_rank] = p
    return tuple(keep[r] for r in sorted(keep))


def restart_inside_pods(job: spec.DDPJob, restarting: JobStatus, pods: Sequence[PodView], now: dt.datetime,
              keep: tuple[PodView, ...], event: Event, excluded: tuple[Event, ...]) -> Plan:
    """The next attempt starts inside the pods that are left (their entry points stop the
    workers, which save a checkpoint, and start them again); the others are recreated for it.
    The attempt counts as created now: its pods exist, and the startup clock runs."""
    attempt = restarting.restartAttempt
    recreated = [p for p in owned_pods(job, pods) if p not in keep]
    how = f"{len(keep)} pod(s) in place" + (f", {len(recreated)} recreated" if recreated else "")
    message = restarting.message.replace(": deleting the gang", f": restarting {how}")
    status = with_phase(without_nodes(restarting), RESTARTING, restarting.reason, message, now, created=True,
                        created_reason="RestartedInPlace", created_message=f"attempt {attempt}: {how}")
    event = replace(event, message=event.message.replace(
        f"restarting all {restarting.nnodes} node(s)", f"restarting all {restarting.nnodes} node(s), {how}"))
    return Plan(status=status, restart_in_place=keep, attempt=attempt, delete=deletable(recreated),
                events=(event,) + excluded, requeue_after=float(job.spec.startupTimeoutSeconds))
