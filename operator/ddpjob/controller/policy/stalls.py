"""Policy: progress and stalls. No progress for longer than failurePolicy allows is a retryable
failure of the whole gang, with the stacks of the suspect's pods read before anything is restarted.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Sequence

from ddpjob.api import names, spec, progress as progress_reports
from ddpjob.api.failure_policy import NodeFailure
from ddpjob.api.status import JobStatus
from ddpjob.controller import stall_stacks
from ddpjob.controller.observation import PodView
from ddpjob.controller.plan import Event, Plan, StacksRequest, owned_pods
from ddpjob.controller.policy.failure import on_failure


STALLED = "Stalled"  # no progress reported for longer than failurePolicy allows


def on_stall(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
             stalled: progress_reports.Stall) -> Plan:
    """No progress for longer than failurePolicy allows: a retryable failure of the whole gang
    (a rank blocked in a collective holds every GPU of the job while its pods look healthy)."""
    node = min(stalled.suspect_node, status.nnodes - 1)
    where = next((p.node_name for p in owned_pods(job, pods)
                  if p.node_rank == node and p.attempt == status.restartAttempt), "")
    failure = NodeFailure(node_rank=node, exit_code=None, reason=STALLED, at=now,
                          pod=names.node_pod_name(job.name, node), message=stalled.message, node=where,
                          rank=stalled.suspect_rank)
    plan = on_failure(job, status, pods, now, [failure], restart_reason=STALLED)
    return replace(plan, events=(Event("Warning", STALLED, stalled.message),) + plan.events,
                   stacks=StacksRequest(_stack_pods(job, status, pods, node), stalled.suspect_rank))


def _stack_pods(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], suspect_node: int) -> tuple[PodView, ...]:
    """The stalled attempt's pods that can show their stacks (running, an IP, a token), the
    suspect node's first, then the lowest node ranks: at most stall_stacks.MAX_PODS."""
    able = {p.node_rank: p for p in sorted(owned_pods(job, pods), key=lambda p: p.node_rank, reverse=True)
            if p.attempt == status.restartAttempt and p.running and not p.deleting and p.pod_ip
            and p.restart_nonce}
    order = sorted(able, key=lambda rank: (rank != suspect_node, rank))
    return tuple(able[rank] for rank in order[:stall_stacks.MAX_PODS])
