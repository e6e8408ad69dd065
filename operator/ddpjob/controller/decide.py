"""The decision: given a DDPJob, its status and the pods observed, what happens next.

Pure: plain data in, a ``Plan`` out; no clock, no API, no kopf. Every path a job can take (and
every pain point of the peers it is meant to fix) is a table row in tests/unit/test_decide.py.

Throughout: only pods whose controller owner reference is this job (by uid) are ever deleted or
counted as the job's; and an attempt keeps the shape it was created with (status.nnodes,
status.podSpecHash): a spec changed under it applies to the next attempt.

Rules, in the order they apply:

1. A pod Terminating long past its deadline is force-deleted (its node is gone:
   kubeflow/trainer#2072).
2. A finished job (Succeeded/Failed) stays finished. Its pods are cleaned up per
   cleanPodPolicy, and ttlSecondsAfterFinished deletes the DDPJob itself.
3. ``suspend: true`` deletes every pod and holds the job Suspended; resuming recreates the gang
   with fresh deadline clocks (as Kubernetes Jobs do). A job that Kueue has not admitted, or
   has evicted (``hold``, from controller/kueue.py), is held the same way in phase Queued.
4. activeDeadlineSeconds, counted from status.startTime, fails the job (DeadlineExceeded).
5. A new gang is created only once no pod of the job exists at all: never two gangs at once.
6. Watching the gang: any failed, evicted or deleted pod fails the attempt. A permanent exit
   code fails the job; anything else restarts the whole gang (never one pod in place:
   kubeflow/pytorch-operator#364) until failurePolicy.maxRestarts is spent. All pods Succeeded
   is success; all started is Running; pods not all started within startupTimeoutSeconds of
   the attempt's creation fail the job and free what it holds (kubernetes-sigs/kueue#2796).
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.api import failure_policy
from ddpjob.api import names
from ddpjob.api import spec
from ddpjob.api.status import (
    CREATED, FAILED, FAILED_NODE_MESSAGE_LIMIT, NODE_MESSAGE_LIMIT, PENDING, QUEUED, RESTARTING,
    RUNNING, SUCCEEDED, SUSPENDED, FailedNode, JobStatus, NodeState,
)
from ddpjob.api import progress as progress_reports
from ddpjob.controller.status import format_time, parse_time, shorten, terminal_reason, truncate, with_phase

# Failure reasons after which the job's pods are always released, whatever cleanPodPolicy says:
# the job never got going, and what it holds (GPUs) is what other jobs are waiting for.
RELEASE_REASONS = frozenset({"StartupTimeout", "DeadlineExceeded", "PodCreationRefused"})
POD_SUCCEEDED = "Succeeded"
POD_FAILED = "Failed"
POD_RUNNING = "Running"
MISSING = "Deleted"  # the phase and reason recorded for a pod deleted from under the job
STALLED = "Stalled"  # no progress reported for longer than failurePolicy allows
_LISTED_PODS = 5  # pods named in a message before "and N more"
_DETAIL_LIMIT = 300  # characters of one reason (a scheduler verdict, an API error) in a message


# ---------------------------------------------------------------------------------------------
# What the operator sees of a pod
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PodView:
    """The few facts about a pod that the decision needs (kept in the operator's pod index)."""

    name: str
    uid: str
    node_rank: int
    attempt: int
    owner_uid: Optional[str] = None
    phase: str = "Pending"
    created_at: Optional[dt.datetime] = None
    deletion_at: Optional[dt.datetime] = None  # metadata.deletionTimestamp: request + grace
    node_name: str = ""
    running: bool = False  # the trainer container is running
    exit_code: Optional[int] = None
    finished_at: Optional[dt.datetime] = None
    terminated_reason: str = ""  # Error, OOMKilled, Completed, ...
    terminated_message: str = ""  # the termination message (or the log tail)
    pod_reason: str = ""  # status.reason: Evicted, Preempting, ...
    pod_message: str = ""
    waiting_reason: str = ""  # ImagePullBackOff, CreateContainerConfigError, ...
    waiting_message: str = ""
    unschedulable: str = ""  # the scheduler's word when PodScheduled is False
    disruption: str = ""  # the DisruptionTarget condition's reason (eviction, preemption)
    pod_ip: str = ""  # status.podIP: where the pod serves its progress reports

    @property
    def deleting(self) -> bool:
        return self.deletion_at is not None

    @property
    def finished(self) -> bool:
        return self.phase in (POD_SUCCEEDED, POD_FAILED)

    @property
    def ready(self) -> bool:
        return self.phase == POD_RUNNING and self.running and not self.deleting


def view_pod(pod: Mapping[str, Any]) -> Optional[PodView]:
    """A pod object (as the API returns it) -> PodView; None if it lacks our rank labels."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        rank = int(labels[names.LABEL_NODE_RANK])
        attempt = int(labels[names.LABEL_RESTART_ATTEMPT])
    except (KeyError, TypeError, ValueError):
        return None
    owner = next((o.get("uid") for o in meta.get("ownerReferences") or ()
                  if o.get("kind") == names.KIND and o.get("controller")), None)
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or ()
    trainer = next((c for c in containers if c.get("name") == names.CONTAINER_NAME), containers[0] if containers else {})
    state = trainer.get("state") or {}
    terminated = state.get("terminated") or {}
    waiting = state.get("waiting") or {}
    unschedulable = disruption = ""
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            unschedulable = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            disruption = cond.get("reason") or "DisruptionTarget"
    return PodView(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node_rank=rank,
        attempt=attempt,
        owner_uid=owner,
        phase=str(status.get("phase") or "Pending"),
        created_at=parse_time(meta.get("creationTimestamp")),
        deletion_at=parse_time(meta.get("deletionTimestamp")),
        node_name=str((pod.get("spec") or {}).get("nodeName") or ""),
        running="running" in state,
        exit_code=terminated.get("exitCode"),
        finished_at=parse_time(terminated.get("finishedAt")),
        terminated_reason=str(terminated.get("reason") or ""),
        terminated_message=truncate(str(terminated.get("message") or ""), FAILED_NODE_MESSAGE_LIMIT),
        pod_reason=str(status.get("reason") or ""),
        pod_message=str(status.get("message") or ""),
        waiting_reason=str(waiting.get("reason") or ""),
        waiting_message=str(waiting.get("message") or ""),
        unschedulable=unschedulable,
        disruption=disruption,
        pod_ip=str(status.get("podIP") or ""),
    )


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


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
    requeue_after: Optional[float] = None  # seconds until a clock (deadline, timeout, TTL) runs out


# The trainer's termination message after SIGTERM: "...; checkpoint /ckpt/step-40.pt saved".
_CHECKPOINT_SAVED = re.compile(r"\bcheckpoint\b[^;\n]*\bsaved\b")


def _exit_meaning(code: int, message: str) -> str:
    """What an exit code is known to mean: the code says SIGTERM; only the container's own
    termination message can say a checkpoint was saved."""
    meaning = contract.describe_exit_code(code)
    if code == contract.ExitCode.PREEMPTED and _CHECKPOINT_SAVED.search(message or ""):
        meaning = "preempted: SIGTERM, checkpoint saved (retryable)"
    return meaning


@dataclass(frozen=True)
class _Failure:
    rank: int
    pod: str
    exit_code: Optional[int]
    reason: str
    message: str
    at: Optional[dt.datetime]

    def as_node_failure(self) -> failure_policy.NodeFailure:
        return failure_policy.NodeFailure(self.rank, self.exit_code, self.reason, self.at)

    def describe(self) -> str:
        what = (f"exited with code {self.exit_code} ({_exit_meaning(self.exit_code, self.message)})"
                if self.exit_code is not None else f"was {self.reason.lower() or 'lost'}")
        return f"node {self.rank} (pod {self.pod}) {what}"

    def failed_node(self) -> FailedNode:
        return FailedNode(nodeRank=self.rank, pod=self.pod, exitCode=self.exit_code,
                          reason=self.reason, message=truncate(self.message, FAILED_NODE_MESSAGE_LIMIT))


def _earliest(*delays: Optional[float]) -> Optional[float]:
    present = [max(0.0, d) for d in delays if d is not None]
    return min(present) if present else None


def _names(pods: Iterable[PodView]) -> str:
    names = sorted(p.name for p in pods)
    shown = ", ".join(names[:_LISTED_PODS])
    return shown + (f" and {len(names) - _LISTED_PODS} more" if len(names) > _LISTED_PODS else "")


# ---------------------------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------------------------
def decide(
    job: spec.DDPJob,
    status: JobStatus,
    pods: Sequence[PodView],
    now: dt.datetime,
    *,
    generation: Optional[int] = None,
    created_ranks: frozenset[int] = frozenset(),
    creation_errors: Optional[Mapping[int, str]] = None,
    force_delete_after: float = 60.0,
    progress: Optional[progress_reports.GangProgress] = None,
    hold: Optional[Any] = None,
) -> Plan:
    """The next step for ``job``.

    ``pods``: every pod labelled with the job's name. ``created_ranks``: ranks of the current
    attempt this operator process created but may not have observed yet (so it does not POST
    them again while the watch catches up). ``creation_errors``: why the API server refused
    to create ranks of the current attempt (a ResourceQuota, say), to name in the status.
    ``progress``: what the ranks of the current attempt reported (controller.progress), for
    status.progress and hang detection (failurePolicy.progressTimeoutSeconds).
    ``hold``: Kueue has not admitted the gang, or evicted it (``kueue.Hold``: reason, message):
    the job holds no pods, as if suspended, in phase Queued.
    """
    status = replace(status, observedGeneration=generation if generation is not None else status.observedGeneration)
    status = _adopt_newer_attempt(job, status, pods, now)
    if not status.nnodes or not (status.terminal or status.is_true(CREATED)):
        # The shape of the attempt in progress (or of the finished one) is what was recorded
        # when its pods were created; the spec's shape is the next attempt's.
        status = replace(status, nnodes=job.spec.nnodes)

    # Only pods whose controller owner reference is this job are ever deleted or counted; other
    # pods that carry the job's label (a user's, or a deleted namesake's) are left alone.
    force, force_due = _stuck_terminating(_ours(job, pods), now, force_delete_after)
    deadline_left = _deadline_left(job, status, now)
    if status.terminal:
        plan = _finished(job, status, pods, now)
    elif job.spec.suspend:
        plan = _suspend(job, status, pods, now)
    elif hold is not None:
        plan = _suspend(job, status, pods, now, phase=QUEUED, reason=hold.reason, why=hold.message)
    elif deadline_left is not None and deadline_left <= 0:
        plan = _fail(job, status, pods, now, "DeadlineExceeded",
                     f"activeDeadlineSeconds ({job.spec.activeDeadlineSeconds}s) exceeded")
    elif not status.is_true(CREATED):
        plan = _create_gang(job, status, pods, now)
    else:
        plan = _watch_gang(job, status, pods, now, created_ranks, creation_errors or {}, progress)

    if plan.status.phase != RUNNING and plan.status.progress is not None and plan.status.progress.eta:
        # An estimate of time left means nothing while the gang is not training.
        plan = replace(plan, status=replace(plan.status, progress=replace(
            plan.status.progress, eta="", etaSeconds=None)))
    if plan.status.phase not in (SUCCEEDED, FAILED, SUSPENDED, QUEUED):
        plan = replace(plan, requeue_after=_earliest(plan.requeue_after, _deadline_left(job, plan.status, now)))
    return replace(plan, force_delete=force, requeue_after=_earliest(plan.requeue_after, force_due))


def decide_invalid(status: JobStatus, message: str, pods: Sequence[PodView], now: dt.datetime, *,
                   uid: Optional[str] = None, generation: Optional[int] = None) -> Plan:
    """A spec that does not parse: Failed/InvalidSpec naming the fields; nothing is created,
    and pods of the job that still run (a spec broken mid-run) are released."""
    release = _deletable(p for p in pods if uid is not None and p.owner_uid == uid and not p.finished)
    if status.terminal:
        reason, text = terminal_reason(status)
        return Plan(status=replace(status, reason=reason, message=text), delete=release)
    failed = with_phase(status, FAILED, "InvalidSpec", message, now)
    failed = replace(failed, completionTime=format_time(now), readyNodes=0,
                     observedGeneration=generation if generation is not None else status.observedGeneration)
    return Plan(status=failed, delete=release, events=(Event("Warning", "InvalidSpec", failed.message),))


def refuse_creation(job: spec.DDPJob, status: JobStatus, message: str, now: dt.datetime) -> Plan:
    """The API server refused to create a pod for a reason a retry cannot fix (an admission
    policy such as Pod Security, or an invalid template): fail with its message."""
    return _fail(job, status, (), now, "PodCreationRefused", message)


def _adopt_newer_attempt(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView],
                         now: dt.datetime) -> JobStatus:
    """Pods of a later attempt than the status records exist when a status write was lost after
    the pods were created: adopt them rather than delete a running gang."""
    ours = [p.attempt for p in pods if _is_ours(job, p)]
    if status.terminal or job.spec.suspend or not ours or max(ours) <= status.restartAttempt:
        return status
    adopted = replace(status, restartAttempt=max(ours), nodes=(), podSpecHash="")  # shape unknown
    return with_phase(adopted, status.phase or PENDING, status.reason or "PodsCreated", status.message,
                      now, created=True, created_reason="PodsCreated",
                      created_message=f"adopted the pods of attempt {max(ours)}")


def _is_ours(job: spec.DDPJob, pod: PodView) -> bool:
    """Whether the pod's controller owner reference is this job (by uid). ``job.uid`` is None
    only for a job that was never stored (the unit tests' jobs made without one)."""
    return pod.owner_uid == job.uid if job.uid is not None else True


def _ours(job: spec.DDPJob, pods: Iterable[PodView]) -> list[PodView]:
    return [p for p in pods if _is_ours(job, p)]


def _stuck_terminating(pods: Sequence[PodView], now: dt.datetime,
                       after: float) -> tuple[tuple[PodView, ...], Optional[float]]:
    stuck, due = [], None
    for p in pods:
        if p.deletion_at is None:
            continue
        left = (p.deletion_at - now).total_seconds() + after
        if left <= 0:
            stuck.append(p)
        else:
            due = _earliest(due, left)
    return tuple(stuck), due


def _deadline_left(job: spec.DDPJob, status: JobStatus, now: dt.datetime) -> Optional[float]:
    start = parse_time(status.startTime)
    if job.spec.activeDeadlineSeconds is None or start is None:
        return None
    return job.spec.activeDeadlineSeconds - (now - start).total_seconds()


def _deletable(pods: Iterable[PodView]) -> tuple[PodView, ...]:
    return tuple(sorted((p for p in pods if not p.deleting), key=lambda p: (p.attempt, p.node_rank)))


# --- 2. finished ------------------------------------------------------------------------------
def _cleanup(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView]) -> tuple[PodView, ...]:
    reason, _ = terminal_reason(status)
    ours = [p for p in pods if _is_ours(job, p)]
    if job.spec.cleanPodPolicy == "All":
        return _deletable(ours)
    if job.spec.cleanPodPolicy == "Running" or reason in RELEASE_REASONS:
        return _deletable(p for p in ours if not p.finished)
    return ()


def _finished(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime) -> Plan:
    reason, message = terminal_reason(status)
    status = replace(status, reason=reason, message=message)  # undo a passing ReconcileError
    requeue, delete_job = None, False
    finished_at = parse_time(status.completionTime)
    if job.spec.ttlSecondsAfterFinished is not None and finished_at is not None:
        left = job.spec.ttlSecondsAfterFinished - (now - finished_at).total_seconds()
        delete_job, requeue = left <= 0, (None if left <= 0 else left)
    return Plan(status=status, delete=_cleanup(job, status, pods), delete_job=delete_job,
                requeue_after=requeue)


def _fail(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
          reason: str, message: str, failed_node: Optional[FailedNode] = None) -> Plan:
    failed = with_phase(status, FAILED, reason, message, now)
    failed = replace(failed, completionTime=format_time(now), failedNode=failed_node or status.failedNode,
                     readyNodes=0)
    plan = _finished(job, failed, pods, now)
    return replace(plan, events=(Event("Warning", reason, failed.message),))


# --- 3. suspend -------------------------------------------------------------------------------
def _suspend(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime, *,
             phase: str = SUSPENDED, reason: str = "Suspended", why: str = "spec.suspend is true") -> Plan:
    """Suspended by spec.suspend, or Queued by Kueue (not admitted yet, or evicted): no pods."""
    events: tuple[Event, ...] = ()
    if status.phase not in (SUSPENDED, QUEUED):
        # The next gang gets a new attempt number if this one had pods, so any straggler of the
        # old one is told apart; the deadline clock restarts on resume (startTime cleared).
        attempt = status.restartAttempt + 1 if status.is_true(CREATED) else status.restartAttempt
        status = replace(status, restartAttempt=attempt, startTime=None, readyNodes=0, nodes=())
        events = ((Event("Normal", "Suspended", "Job suspended: deleting its pods"),) if phase == SUSPENDED
                  else (Event("Normal", reason, why + (": deleting its pods" if pods else "")),))
    elif status.phase != phase or status.reason != reason:
        events = (Event("Normal", reason, why),)
    pods = _ours(job, pods)
    message = why + (f": waiting for {len(pods)} pod(s) to terminate" if pods else "")
    status = with_phase(status, phase, reason, message, now, created=False,
                        created_reason=reason, created_message=why)
    return Plan(status=status, delete=_deletable(pods), events=events)


# --- 5. create a gang -------------------------------------------------------------------------
def _create_gang(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime) -> Plan:
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
    pods = [p for p in pods if _is_ours(job, p) or p.name in child_names]
    if pods:
        reason = status.reason if phase == RESTARTING else (
            "Resuming" if status.phase in (SUSPENDED, QUEUED) else "Waiting")
        message = f"waiting for {len(pods)} old pod(s) to terminate before creating attempt {attempt}: {_names(pods)}"
        foreign = [p for p in pods if not _is_ours(job, p) and not p.deleting]
        if foreign:
            message += (f" ({_names(foreign)}: not this job's pod(s), with the name of one of its own; "
                        "the operator does not delete them)")
        if phase == RESTARTING and status.failedNode is not None:
            message = f"restart {status.restarts} of {job.spec.failurePolicy.maxRestarts}: {message}"
        waiting = with_phase(replace(status, readyNodes=0), phase, reason, message, now)
        return Plan(status=waiting, delete=_deletable(_ours(job, pods)), events=tuple(events))

    message = f"created {nnodes} pod(s) (attempt {attempt}); waiting for every node to run"
    created = replace(status, startTime=status.startTime or format_time(now), readyNodes=0, nodes=(),
                      nnodes=nnodes, podSpecHash=spec.pod_spec_hash(job.spec))
    created = with_phase(created, phase, "PodsCreated", message, now, created=True,
                         created_reason="PodsCreated", created_message=f"attempt {attempt}: {nnodes} pod(s)")
    events.append(Event("Normal", "Created", f"Creating {nnodes} pod(s) and the Service (attempt {attempt})"))
    return Plan(status=created, create_ranks=tuple(range(nnodes)), attempt=attempt, ensure_service=True,
                events=tuple(events), requeue_after=float(job.spec.startupTimeoutSeconds))


# --- 6. watch the gang ------------------------------------------------------------------------
def _node_state(p: PodView) -> NodeState:
    reason = (p.terminated_reason or p.disruption or p.pod_reason or p.waiting_reason
              or ("Unschedulable" if p.unschedulable else ""))
    # Container output keeps its last lines; the kubelet's and the scheduler's words their first.
    message = (truncate(p.terminated_message, NODE_MESSAGE_LIMIT) if p.terminated_message else
               shorten(p.pod_message or p.waiting_message or p.unschedulable.partition(": ")[2],
                       NODE_MESSAGE_LIMIT))
    if p.deleting and not p.finished:
        reason = reason or "Terminating"
    return NodeState(nodeRank=p.node_rank, pod=p.name, phase=p.phase, ready=p.ready,
                     exitCode=p.exit_code, reason=reason, message=message, nodeName=p.node_name)


def _failure_of(job: spec.DDPJob, p: PodView) -> Optional[_Failure]:
    if p.phase == POD_FAILED:
        code = p.exit_code
        reason = p.terminated_reason or p.disruption or p.pod_reason or "Failed"
        message = p.terminated_message or p.pod_message
        return _Failure(p.node_rank, p.name, code, reason, message, p.finished_at or p.deletion_at)
    if p.deleting and p.phase != POD_SUCCEEDED:
        # Deleted from under the job (a user, a drain, taint-based eviction of a lost node):
        # the rank is gone, and its peers will hang until the gang restarts.
        reason = p.disruption or p.pod_reason or MISSING
        return _Failure(p.node_rank, p.name, None, reason, p.pod_message, p.deletion_at)
    return None


def _watch_gang(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                created_ranks: frozenset[int], creation_errors: Mapping[int, str],
                progress: Optional[progress_reports.GangProgress] = None) -> Plan:
    # The attempt keeps the shape it was created with (status.nnodes, status.podSpecHash): a
    # spec changed under it (an older CRD, a bypassed validation) is for the next attempt.
    nnodes, attempt = status.nnodes, status.restartAttempt
    reshaped = bool(status.podSpecHash) and status.podSpecHash != spec.pod_spec_hash(job.spec)
    current: dict[int, PodView] = {}
    strays: list[PodView] = []
    for p in _ours(job, pods):
        if p.attempt == attempt and p.node_rank < nnodes and p.node_rank not in current:
            current[p.node_rank] = p
        else:
            strays.append(p)

    recorded = {n.nodeRank: n for n in status.nodes}
    nodes: list[NodeState] = []
    failures: list[_Failure] = []
    succeeded = started = 0
    missing: list[int] = []
    for rank in range(nnodes):
        pod = current.get(rank)
        if pod is not None:
            nodes.append(_node_state(pod))
            failure = _failure_of(job, pod)
            if failure is not None:
                failures.append(failure)
            elif pod.phase == POD_SUCCEEDED:
                succeeded += 1
                started += 1
            elif pod.phase == POD_RUNNING:
                started += 1
        elif rank in recorded and recorded[rank].phase == POD_SUCCEEDED:
            nodes.append(recorded[rank])  # a finished pod someone cleaned up: still a success
            succeeded += 1
            started += 1
        elif rank in recorded:
            # Observed once in this attempt, gone now without our deleting it.
            gone = replace(recorded[rank], phase=MISSING, ready=False, reason=MISSING,
                           message="the pod was deleted")
            nodes.append(gone)
            failures.append(_Failure(rank, gone.pod, None, MISSING, "the pod was deleted", None))
        else:
            missing.append(rank)

    ready = sum(1 for n in nodes if n.ready)
    observed = replace(status, nodes=tuple(nodes), readyNodes=ready)
    stray_deletes = _deletable(strays)

    if failures:
        return _on_failure(job, observed, pods, now, failures)
    if succeeded == nnodes:
        done = with_phase(observed, SUCCEEDED, "AllNodesSucceeded", f"all {nnodes} node(s) succeeded", now)
        done = replace(done, completionTime=format_time(now), failedNode=None)
        plan = _finished(job, done, pods, now)
        return replace(plan, delete=plan.delete + stray_deletes,
                       events=(Event("Normal", "Succeeded", f"All {nnodes} node(s) succeeded"),))
    note = "; the spec has changed since this attempt started: the change applies to the next attempt" \
        if reshaped else ""
    if started == nnodes:
        running_now = ready
        message = f"{running_now}/{nnodes} node(s) running" + (f", {succeeded} succeeded" if succeeded else "") + note
        events = () if status.phase == RUNNING else (Event("Normal", "Running", f"All {nnodes} node(s) running (attempt {attempt})"),)
        running = replace(with_phase(observed, RUNNING, "AllNodesRunning", message, now), failedNode=None)
        since = status.condition(RUNNING) if status.phase == RUNNING else None
        running_since = (parse_time(since.lastTransitionTime) if since else None) or now
        stalled, stall_due = progress_reports.stall(job, progress, running_since, now)
        if stalled is not None:
            return _stalled(job, observed, pods, now, stalled)
        if progress is not None:
            running = replace(running, progress=progress_reports.to_status(
                progress, running=True, format_time=format_time, previous=status.progress))
        return Plan(status=running, delete=stray_deletes, events=events, requeue_after=stall_due)

    # Some nodes have not started: the startup clock runs from the attempt's creation.
    waiting = [p for p in current.values() if p.phase not in (POD_RUNNING, POD_SUCCEEDED)]
    described = _describe_not_started(job, waiting, missing, creation_errors)
    not_started = len(waiting) + len(missing)
    created_cond = status.condition(CREATED)
    started_at = parse_time(created_cond.lastTransitionTime) if created_cond else None
    left = None
    if started_at is not None:
        left = job.spec.startupTimeoutSeconds - (now - started_at).total_seconds()
        if left <= 0:
            message = (f"{not_started} of {nnodes} node(s) not running after startupTimeoutSeconds "
                       f"({job.spec.startupTimeoutSeconds}s): {described}")
            return _fail(job, observed, pods, now, "StartupTimeout", message)

    recreate = tuple(r for r in missing if r not in created_ranks)
    if recreate and reshaped:
        # A pod of this attempt would be built from another spec than its peers (another
        # WORLD_SIZE, image, ...): start the next attempt in the new shape instead.
        return _reshape(job, observed, pods, now)
    phase = RESTARTING if status.phase == RESTARTING else PENDING
    reason = "NodesPending"
    prefix = (f"restart {status.restarts} of {job.spec.failurePolicy.maxRestarts}: "
              if phase == RESTARTING else "")
    message = f"{prefix}{started}/{nnodes} node(s) started; waiting for {described}{note}"
    pending = with_phase(observed, phase, reason, message, now)
    return Plan(status=pending, create_ranks=recreate, attempt=attempt, ensure_service=bool(recreate),
                delete=stray_deletes, requeue_after=left)


def _reshape(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime) -> Plan:
    """The spec changed while the attempt still lacks pods: delete the attempt's pods and start
    the next attempt from the new spec. Not a failure: the restart budget is not spent."""
    message = (f"the spec changed while attempt {status.restartAttempt} was starting; "
               f"recreating the gang from the new spec (attempt {status.restartAttempt + 1})")
    restarting = replace(status, restartAttempt=status.restartAttempt + 1, readyNodes=0)
    restarting = with_phase(restarting, RESTARTING, "SpecChanged", message, now, created=False,
                            created_reason="SpecChanged", created_message=message)
    return Plan(status=restarting, delete=_deletable(_ours(job, pods)),
                events=(Event("Warning", "SpecChanged", message),))


def _describe_not_started(job: spec.DDPJob, waiting: Sequence[PodView], missing: Sequence[int],
                          creation_errors: Mapping[int, str]) -> str:
    """The pods not running yet, grouped by why: a 64-node gang the scheduler cannot place is
    one clause ("64 pod(s) ... Pending (Unschedulable: ...)"), not 64 copies of its verdict."""
    groups: dict[str, list[str]] = {}
    for p in sorted(waiting, key=lambda p: p.node_rank):
        groups.setdefault(_why_waiting(p), []).append(p.name)
    refused = [r for r in missing if r in creation_errors]
    for rank in refused:
        why = f"not created ({shorten(creation_errors[rank], _DETAIL_LIMIT)})"
        groups.setdefault(why, []).append(names.node_pod_name(job.name, rank))
    unseen = len(missing) - len(refused)
    clauses = [f"{_listed(pods)} {why}" for why, pods in groups.items()]
    if unseen:
        clauses.append(f"{unseen} pod(s) not observed yet")
    return "; ".join(clauses)


def _listed(pod_names: Sequence[str]) -> str:
    shown = ", ".join(pod_names[:_LISTED_PODS])
    more = len(pod_names) - _LISTED_PODS
    return (f"{len(pod_names)} pod(s) {shown} and {more} more" if more > 0 else shown)


def _why_waiting(p: PodView) -> str:
    if p.unschedulable:
        return f"Pending ({shorten(p.unschedulable, _DETAIL_LIMIT)})"
    if p.waiting_reason:
        detail = f": {p.waiting_message}" if p.waiting_message else ""
        return f"{p.phase} ({shorten(p.waiting_reason + detail, _DETAIL_LIMIT)})"
    return p.phase


def _stalled(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
             stalled: progress_reports.Stall) -> Plan:
    """No progress for longer than failurePolicy allows: a retryable failure of the whole gang
    (a rank blocked in a collective holds every GPU of the job while its pods look healthy)."""
    node = min(stalled.suspect_node, status.nnodes - 1)
    failure = _Failure(node, names.node_pod_name(job.name, node), None, STALLED, stalled.message, now)
    plan = _on_failure(job, status, pods, now, [failure], restart_reason=STALLED)
    return replace(plan, events=(Event("Warning", STALLED, stalled.message),) + plan.events)


def _on_failure(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                failures: list[_Failure], restart_reason: Optional[str] = None) -> Plan:
    by_rank = {f.rank: f for f in failures}
    ruling = failure_policy.verdict((f.as_node_failure() for f in failures),
                                    restarts_done=status.restarts, policy=job.spec.failurePolicy)
    first, budget = by_rank[ruling.cause.node_rank], ruling.budget
    if ruling.reason == failure_policy.PERMANENT:
        return _fail(job, status, pods, now, ruling.reason,
                     f"{first.describe()}: a restart cannot fix this", first.failed_node())
    if ruling.reason == failure_policy.BUDGET_SPENT:
        return _fail(job, status, pods, now, ruling.reason,
                     f"{first.describe()} and the restart budget ({budget}) is spent", first.failed_node())

    restarts = ruling.restarts_after
    message = f"{first.describe()}; restart {restarts} of {budget}: deleting the gang"
    restarting = replace(status, restarts=restarts, restartAttempt=status.restartAttempt + 1,
                         failedNode=first.failed_node(), readyNodes=0)
    restarting = with_phase(restarting, RESTARTING, restart_reason or ruling.reason, message, now, created=False,
                            created_reason="Restarting", created_message=message)
    event = Event("Warning", "Restarting",
                  f"{first.describe()}" + (f" [{first.reason}]" if first.reason else "")
                  + f"; restarting all {status.nnodes} node(s) (restart {restarts} of {budget})")
    # Every pod of the attempt goes, including the healthy ranks: they would hang in a
    # collective with the dead one until a watchdog fires (kubeflow/trainer#2269).
    return Plan(status=restarting, delete=_deletable(_ours(job, pods)), events=(event,))
