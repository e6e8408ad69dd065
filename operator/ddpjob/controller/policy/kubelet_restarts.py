"""Policy: restarts the kubelet does in place (a command of your own under restartMode InPlace,
through the container's restart rule). A restart seen in a pod's status is the node's failure; the
restarted pods are carried into the next attempt and armed for the one after.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Optional, Sequence

from ddpjob.api import spec
from ddpjob.api.failure_policy import NodeFailure
from ddpjob.api.status import CREATED, RESTARTING, JobStatus, parse_time, with_phase, without_nodes
from ddpjob.controller.observation import POD_RUNNING, PodView
from ddpjob.controller.plan import Event, Plan, deletable, owned_pods
from ddpjob.controller.policy.restart_mode import started_in_place


def kubelet_restart_of(p: PodView) -> Optional[NodeFailure]:
    """A pod whose container exited and that the kubelet restarts, or restarted, in the pod (its
    restart rule; a command of your own under InPlace) since the operator last accounted for
    it: the node's failure, with the exit of the container's last run."""
    if not p.kubelet_restarts or p.phase != POD_RUNNING or p.deleting:
        return None
    # A container that ended for good is not restarting: a v1.36 kubelet reports the exit of a
    # container with its own restartPolicy (exit 0 included) with the pod still Running, and the
    # phase in a later update (seen on kind).
    if not p.running and p.exit_code is not None and p.exit_code != 0:  # exited; about to start again
        code, reason, message, at = p.exit_code, p.terminated_reason, p.terminated_message, p.finished_at
    elif p.restarts > p.restarts_seen or (not p.running and p.waiting_reason == "CrashLoopBackOff"
                                          and p.last_exit_code is not None):
        code, reason, message, at = p.last_exit_code, p.last_reason, p.last_message, p.last_finished_at
    else:
        return None
    return NodeFailure(node_rank=p.node_rank, exit_code=code, reason=reason or "Error", at=at, pod=p.name,
                       message=message, node=p.node_name)



def runs_ended_unseen(p: PodView) -> int:
    """How many runs of the pod's container ended since the operator last accounted for it: its
    restartCount past the count accounted for (LABEL_CONTAINER_RESTARTS), and the run that has
    just ended if the kubelet has not started the next one yet. Each is a restart the budget pays
    for, though one pass may see several (an operator that was down, a crash loop faster than its
    passes): 0 when ``kubelet_restart_of`` sees none."""
    if kubelet_restart_of(p) is None:
        return 0
    ended_now = not p.running and ((p.exit_code is not None and p.exit_code != 0)
                                   or (p.waiting_reason == "CrashLoopBackOff" and p.last_exit_code is not None))
    return max(1, p.restarts - p.restarts_seen + (1 if ended_now else 0))


def unseen_restarts(pods: Sequence[PodView]) -> tuple[int, Optional[PodView]]:
    """The most runs ended unseen in one pod of the attempt, and that pod: a gang restart is one
    restart however many of its pods the kubelet restarted with it (a peer lost exits too)."""
    counted = [(runs_ended_unseen(p), p) for p in pods]
    most = max(counted, key=lambda c: (c[0], -c[1].node_rank), default=(0, None))
    return most if most[0] else (0, None)


# After a kubelet restart in place, how long the gang's other pods have to exit (and be
# restarted by their kubelets) before they are recreated: nothing in them takes an order, and a
# process that hangs in a collective with its lost peer would hold the rendezvous.
KUBELET_PEER_EXIT_GRACE_SECONDS = 30.0


def kubelet_carried(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView],
                     now: dt.datetime) -> tuple[list[PodView], list[PodView], Optional[float]]:
    """In an attempt that the kubelet restarts in place: (the pods of the attempt before whose
    container has restarted since, as pods of this attempt; the others of that attempt still
    given time to exit; seconds until that time is up)."""
    if not (spec.kubelet_restarts_in_place(job.spec) and started_in_place(status)):
        return [], [], None
    created = status.condition(CREATED)
    since = parse_time(created.lastTransitionTime) if created and created.status == "True" else None
    left = KUBELET_PEER_EXIT_GRACE_SECONDS - (now - since).total_seconds() if since else 0.0
    avoided = {n.nodeName for n in status.excludedNodes}
    carried: list[PodView] = []
    held: list[PodView] = []
    for p in owned_pods(job, pods):
        if (p.attempt != status.restartAttempt - 1 or not p.kubelet_restarts or p.deleting
                or p.node_name in avoided):
            continue
        if p.restarts > p.restarts_seen:
            # Its container's latest run is this attempt's, whatever came of it since (it may
            # have succeeded, or failed again, before this pass).
            carried.append(replace(p, attempt=status.restartAttempt, restarts_seen=p.restarts))
        elif p.phase == POD_RUNNING and left > 0:
            held.append(p)
    return carried, held, (left if held else None)


def to_arm(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView],
            adopt: tuple[PodView, ...]) -> tuple[PodView, ...]:
    """The attempt's pods the kubelet may restart, running the attempt's own run (no restart
    unaccounted for), whose annotation does not yet name the next attempt: a container the
    kubelet starts after their next exit then sees that attempt. (One that fails before this
    pass still sees the current one: docs/operator.md.)"""
    if not spec.kubelet_restarts_in_place(job.spec):
        return ()
    adopted = {p.uid: p for p in adopt}
    nxt = status.restartAttempt + 1
    return tuple(p for p in (adopted.get(p.uid, p) for p in owned_pods(job, pods))
                 if p.attempt == status.restartAttempt and p.kubelet_restarts and p.running and not p.deleting
                 and p.restarts == p.restarts_seen and p.attempt_at_start is not None and p.attempt_at_start != nxt)


def restart_by_kubelet(job: spec.DDPJob, restarting: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                         restarted: tuple[PodView, ...], event: Event, excluded: tuple[Event, ...]) -> Plan:
    """The next attempt starts inside the pods the kubelet restarts (a command of your own,
    whose container carries the restart rule): they stay; the others that still run are given
    KUBELET_PEER_EXIT_GRACE_SECONDS to exit and be restarted too (``kubelet_carried``), then
    are recreated; pods that cannot restart (finished, deleted, on a node the next attempt
    avoids, without the rule) are recreated now. The attempt counts as created now."""
    attempt = restarting.restartAttempt
    avoided = {n.nodeName for n in restarting.excludedNodes}
    staying = [p for p in owned_pods(job, pods) if p.kubelet_restarts and p.phase == POD_RUNNING and not p.deleting
               and p.node_name not in avoided and p.attempt == attempt - 1]
    recreated = [p for p in owned_pods(job, pods) if p not in staying]
    how = f"{len(restarted)} pod(s) restarted in place by the kubelet" + (
        f", {len(staying) - len(restarted)} given {KUBELET_PEER_EXIT_GRACE_SECONDS:.0f}s to exit"
        if len(staying) > len(restarted) else "") + (f", {len(recreated)} recreated" if recreated else "")
    message = restarting.message.replace(": deleting the gang", f": {how}")
    status = with_phase(without_nodes(restarting), RESTARTING, restarting.reason, message, now, created=True,
                        created_reason="RestartedInPlace", created_message=f"attempt {attempt}: {how}")
    event = replace(event, message=event.message.replace(
        f"restarting all {restarting.nnodes} node(s)", f"restarting all {restarting.nnodes} node(s), {how}"))
    return Plan(status=status, attempt=attempt, delete=deletable(recreated), events=(event,) + excluded,
                requeue_after=KUBELET_PEER_EXIT_GRACE_SECONDS)
