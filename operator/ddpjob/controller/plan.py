"""What a decision returns (``Plan``, its ``Event``s and ``StacksRequest``) and the small helpers
every policy builds one with: which pods are the job's own, which may be deleted, the soonest clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from ddpjob.api import spec
from ddpjob.api.status import JobStatus, listed
from ddpjob.controller.observation import LISTED_PODS, PodView


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class StacksRequest:
    """A stall: the pods whose workers' stacks the pass reads before it acts (the suspect's
    first; controller/stall_stacks.py), and the rank the stall blames, where one stands out."""

    pods: tuple[PodView, ...]
    suspect_rank: Optional[int] = None


@dataclass(frozen=True)
class Plan:
    """What to do, in this order: write ``status`` (intent first, so a crash after it is
    recovered by the next pass), post ``events``, force-delete and delete pods, ensure the
    Service, create ``create_ranks`` at ``attempt``, delete the DDPJob itself."""

    status: JobStatus
    create_ranks: tuple[int, ...] = ()
    attempt: int = 0
    ensure_service: bool = False
    delete: tuple[PodView, ...] = ()
    force_delete: tuple[PodView, ...] = ()
    delete_job: bool = False
    events: tuple[Event, ...] = ()
    # In-place restart: order these pods' entry points to run ``attempt`` (then relabel them);
    # a pod that does not take the order is deleted and recreated.
    restart_in_place: tuple[PodView, ...] = ()
    # Kubelet restarts in place: pods whose container the kubelet restarted, carried into
    # ``attempt`` (relabelled with the attempt and the restartCount now accounted for).
    adopt: tuple[PodView, ...] = ()
    # ... and pods whose next kubelet start is to see attempt + 1 (ANNOTATION_ATTEMPT_AT_START).
    arm: tuple[PodView, ...] = ()
    requeue_after: Optional[float] = None  # seconds until a clock (deadline, timeout, TTL) runs out
    # A stall: read these pods' stacks (an Event, the log) after the status write, before the
    # pods are ordered, deleted or recreated.
    stacks: Optional[StacksRequest] = None


def soonest(*delays: Optional[float]) -> Optional[float]:
    """The first of the clocks that are set (seconds, never below 0), or None."""
    present = [max(0.0, d) for d in delays if d is not None]
    return min(present) if present else None


def named_pods(pods: Iterable[PodView]) -> str:
    return listed(sorted(p.name for p in pods), LISTED_PODS)


def is_ours(job: spec.DDPJob, pod: PodView) -> bool:
    """Whether the pod's controller owner reference is this job (by uid). ``job.uid`` is None
    only for a job that was never stored (the unit tests' jobs made without one)."""
    return pod.owner_uid == job.uid if job.uid is not None else True


def owned_pods(job: spec.DDPJob, pods: Iterable[PodView]) -> list[PodView]:
    return [p for p in pods if is_ours(job, p)]


def deletable(pods: Iterable[PodView]) -> tuple[PodView, ...]:
    return tuple(sorted((p for p in pods if not p.deleting), key=lambda p: (p.attempt, p.node_rank)))
