"""The decision: given a DDPJob, its status and what the operator observed, what happens next.

Pure: plain data in (the job, its status, an ``Observation``: the pods, the ranks created and
refused, the progress reports, the Kueue hold), a ``Plan`` out; no clock, no API, no kopf.
Every path a job can take (and every pain point of the peers it is meant to fix) is a table row
in tests/unit/test_decide.py.

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
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.api import checkpoint_advice
from ddpjob.api import failure_policy
from ddpjob.api import goodput
from ddpjob.api import names
from ddpjob.api import node_exclusion
from ddpjob.api import spec
from ddpjob.api import progress as progress_reports
from ddpjob.api.failure_policy import NodeFailure
from ddpjob.api.status import (
    CREATED, FAILED, FAILED_NODE_MESSAGE_LIMIT, HELD_PHASES, NODE_MESSAGE_LIMIT, NODE_NAME_LIMIT, PENDING,
    PHASE_LIMIT, QUEUED, REASON_LIMIT, RESTARTING, RUNNING, SUCCEEDED, SUSPENDED, TERMINAL_PHASES,
    DISRUPTION, FailedNode, FailureRecord, JobStatus, NodeState, disruptions_within, format_time, listed,
    parse_time, recorded_nodes, shorten, terminal_reason, truncate, with_disruption, with_failure, with_nodes,
    with_phase, without_nodes,
)
from ddpjob.controller.builders import owner_uid
from ddpjob.controller.kueue import Hold
from ddpjob.restart_orders import EntryState
from ddpjob.controller import stall_stacks

# Failure reasons after which the job's pods are always released, whatever cleanPodPolicy says:
# the job never got going, and what it holds (GPUs) is what other jobs are waiting for.
RELEASE_REASONS = frozenset({"StartupTimeout", "DeadlineExceeded", "PodCreationRefused"})
POD_SUCCEEDED = "Succeeded"
POD_FAILED = "Failed"
POD_RUNNING = "Running"
MISSING = "Deleted"  # the phase and reason recorded for a pod deleted from under the job
STALLED = "Stalled"  # no progress reported for longer than failurePolicy allows
SERVICE_CONFLICT = "ServiceConflict"  # a Service with the job's name that is not the job's
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
    disruption_message: str = ""  # ... and its message ("Eviction API: evicting", ...)
    unhealthy_devices: str = ""  # devices allocatedResourcesStatus reports Unhealthy, named
    pod_ip: str = ""  # status.podIP: where the pod serves its progress reports
    nproc_per_node: int = 0  # the trainer container's NPROC_PER_NODE: the ranks it hosts (0: unknown)
    container_ready: bool = False  # the trainer container's readiness (the entry point's /ready)
    # The credential of in-place restart orders, from the pod's spec ("" : the pod cannot be
    # restarted in place: Recreate, a command of its own, a pod made before in-place existed).
    restart_token: str = field(default="", repr=False)
    # The kubelet's restarts in place (a command of your own under InPlace): whether the pod as
    # stored has our restart rule (an API server without the feature drops it), the container's
    # restartCount, the count this operator accounted for (LABEL_CONTAINER_RESTARTS), and the
    # exit that ended the container's last run (lastState.terminated).
    kubelet_restarts: bool = False
    restarts: int = 0
    restarts_seen: int = 0
    last_exit_code: Optional[int] = None
    last_finished_at: Optional[dt.datetime] = None
    last_reason: str = ""
    last_message: str = ""
    attempt_at_start: Optional[int] = None  # names.ANNOTATION_ATTEMPT_AT_START, where set

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
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or ()
    trainer = next((c for c in containers if c.get("name") == names.CONTAINER_NAME), containers[0] if containers else {})
    state = trainer.get("state") or {}
    terminated = state.get("terminated") or {}
    waiting = state.get("waiting") or {}
    last = (trainer.get("lastState") or {}).get("terminated") or {}
    unschedulable = disruption = disruption_message = ""
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            unschedulable = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            disruption = str(cond.get("reason") or "DisruptionTarget")
            disruption_message = str(cond.get("message") or "")
    return PodView(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node_rank=rank,
        attempt=attempt,
        owner_uid=owner_uid(meta),
        phase=_phase(status, state, pod.get("spec") or {}),
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
        disruption=shorten(disruption, REASON_LIMIT),
        disruption_message=shorten(disruption_message, _DETAIL_LIMIT),
        unhealthy_devices=_unhealthy_devices(containers),
        pod_ip=str(status.get("podIP") or ""),
        nproc_per_node=_nproc_per_node(pod.get("spec") or {}),
        container_ready=trainer.get("ready") is True,
        restart_token=_restart_token(pod.get("spec") or {}),
        kubelet_restarts=_has_restart_rule(pod.get("spec") or {}),
        restarts=_count(trainer.get("restartCount")),
        restarts_seen=_count(labels.get(names.LABEL_CONTAINER_RESTARTS)),
        last_exit_code=_exit_code(last.get("exitCode")),
        last_finished_at=parse_time(last.get("finishedAt")),
        last_reason=shorten(str(last.get("reason") or ""), REASON_LIMIT),
        last_message=truncate(str(last.get("message") or ""), FAILED_NODE_MESSAGE_LIMIT),
        attempt_at_start=_attempt_at_start(meta.get("annotations") or {}),
    )


def _attempt_at_start(annotations: Mapping[str, Any]) -> Optional[int]:
    value = annotations.get(names.ANNOTATION_ATTEMPT_AT_START) if isinstance(annotations, Mapping) else None
    return _count(value) if value is not None else None


# Pod status and labels are anyone's who may write them: counts are bounded integers.
_COUNT_LIMIT = 1_000_000


def _count(value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return 0
    return number if 0 <= number <= _COUNT_LIMIT else 0


def _exit_code(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and -(2 ** 31) <= value < 2 ** 31 else None


def _phase(status: Mapping[str, Any], state: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> str:
    """The pod's phase, or the one its kubelet is about to report: a v1.36 kubelet shows the
    exit of a container with a restartPolicy of its own (our restart rule) with the pod still
    Running and the phase in a later update (seen on kind). An exit that no rule restarts
    (success, a permanent code) ends the pod already: a pass in between must neither take it
    for a running pod (a failed job's cleanup deleted it, and its log) nor for a restart."""
    phase = str(status.get("phase") or "Pending")
    code = _exit_code((state.get("terminated") or {}).get("exitCode")) if isinstance(state, Mapping) else None
    if phase != POD_RUNNING or code is None or "running" in state or "waiting" in state:
        return phase
    container = _trainer_spec(pod_spec)
    if container is None or not _has_restart_rule(pod_spec) or _restarts_after(container, code):
        return phase
    return POD_SUCCEEDED if code == 0 else POD_FAILED


# The API allows at most 255 values in a rule (and 20 rules): more is not ours to read.
_RULE_VALUES_LIMIT = 255
_RULES_LIMIT = 20


def _restarts_after(container: Mapping[str, Any], code: int) -> bool:
    """Whether the kubelet starts ``container`` again after it exited with ``code``: the first
    rule whose exit codes match decides (KEP-5307); without one, the container's own
    restartPolicy."""
    rules = container.get("restartPolicyRules")
    for rule in (rules[:_RULES_LIMIT] if isinstance(rules, list) else ()):
        match = rule.get("exitCodes") if isinstance(rule, Mapping) else None
        if not isinstance(match, Mapping) or not isinstance(match.get("values"), list):
            continue
        listed = code in match["values"][:_RULE_VALUES_LIMIT]
        if listed == (match.get("operator") == "In"):
            return rule.get("action") == "Restart"
    policy = container.get("restartPolicy")
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def _trainer_spec(pod_spec: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    for c in pod_spec.get("containers") or ():
        if isinstance(c, Mapping) and c.get("name") == names.CONTAINER_NAME:
            return c
    return None


def _has_restart_rule(pod_spec: Mapping[str, Any]) -> bool:
    """The trainer container, as stored, carries a container restart rule (builders.py)."""
    c = _trainer_spec(pod_spec)
    rules = c.get("restartPolicyRules") if c is not None else None
    return bool(c is not None and c.get("restartPolicy") and isinstance(rules, list) and rules)


def _unhealthy_devices(containers: Sequence[Mapping[str, Any]]) -> str:
    """The devices the kubelet reports Unhealthy in the containers' allocatedResourcesStatus
    (KEP-4680), as "nvidia.com/gpu GPU-1, ..." (bounded: the list is anyone's who may write pod
    status)."""
    found: list[str] = []
    for container in containers:
        for resource in container.get("allocatedResourcesStatus") or ():
            for device in (resource.get("resources") or ()) if isinstance(resource, Mapping) else ():
                if isinstance(device, Mapping) and device.get("health") == "Unhealthy":
                    found.append(f"{resource.get('name', '?')} {device.get('resourceID', '?')}")
    return shorten(listed(found, _LISTED_PODS), _DETAIL_LIMIT)


def _trainer_env(pod_spec: Mapping[str, Any], name: str) -> str:
    for container in pod_spec.get("containers") or ():
        if container.get("name") == names.CONTAINER_NAME:
            for var in container.get("env") or ():
                if var.get("name") == name:
                    return str(var.get("value") or "")
    return ""


def _restart_token(pod_spec: Mapping[str, Any]) -> str:
    """The pod's restart credential, when the operator made it to be restarted in place."""
    if _trainer_env(pod_spec, contract.DDPJOB_RESTART_MODE) != contract.RESTART_MODE_IN_PLACE:
        return ""
    return _trainer_env(pod_spec, contract.DDPJOB_RESTART_TOKEN)[:256]


def _nproc_per_node(pod_spec: Mapping[str, Any]) -> int:
    """The NPROC_PER_NODE the operator gave the pod's trainer container: the attempt's shape,
    which a spec edited since may no longer say (0 if absent)."""
    for container in pod_spec.get("containers") or ():
        if container.get("name") != names.CONTAINER_NAME:
            continue
        for var in container.get("env") or ():
            if var.get("name") == contract.NPROC_PER_NODE:
                value = str(var.get("value") or "")
                return int(value) if value.isascii() and value.isdigit() and len(value) <= 3 else 0
    return 0


@dataclass(frozen=True)
class ServiceView:
    """The Service with the job's name, as the operator's Service index (or a creation that
    found it there) shows it: whose it is."""

    name: str
    uid: str = ""
    owner_uid: Optional[str] = None  # the DDPJob its controller owner reference names
    owner: str = ""  # its controller owner reference as "<kind> <name> (uid <uid>)", for messages


def view_service(service: Mapping[str, Any]) -> ServiceView:
    """A Service object (as the API returns it) -> ServiceView."""
    meta = service.get("metadata") or {}
    controller = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    owner = (shorten(f"{controller.get('kind', '?')} {controller.get('name', '?')} (uid {controller.get('uid', '?')})",
                     _DETAIL_LIMIT) if controller else "")
    return ServiceView(name=str(meta.get("name", "")), uid=str(meta.get("uid", "")),
                       owner_uid=owner_uid(meta), owner=owner)


@dataclass(frozen=True)
class Observation:
    """What the operator saw of a job in one pass, beside its status: ``decide``'s input.

    ``pods``: every pod labelled with the job's name (the watch's view). ``generation``: the
    job's metadata.generation. ``created_ranks``: ranks of the current attempt this operator
    process created but may not have observed yet (so it does not POST them again while the
    watch catches up). ``creation_errors``: why the API server refused to create ranks of the
    current attempt (a ResourceQuota, say), to name in the status. ``progress``: what the ranks
    of the current attempt reported (controller.progress), for status.progress and hang
    detection (failurePolicy.progressTimeoutSeconds). ``hold``: Kueue has not admitted the gang,
    or evicted it (``kueue.Hold``: reason, message): the job holds no pods, as if suspended, in
    phase Queued. ``service``: the Service with the job's name, if one is known to exist (ours
    or not); ``service_watched``: whether the operator watches Services, so that None means
    there is none (a deleted Service of ours is then recreated at once); unwatched, it is
    created with each gang.
    """

    pods: Sequence[PodView] = ()
    generation: Optional[int] = None
    created_ranks: frozenset[int] = frozenset()
    creation_errors: Mapping[int, str] = field(default_factory=dict)
    progress: Optional[progress_reports.GangProgress] = None
    hold: Optional[Hold] = None
    service: Optional[ServiceView] = None
    service_watched: bool = False
    # What the entry points of pods of the current attempt said of themselves (GET /attempt),
    # by pod uid: asked of pods whose readiness dropped (ddpjob/restart_orders.py).
    entry_states: Mapping[str, EntryState] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------
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


# The trainer's termination message after SIGTERM: "...; checkpoint /ckpt/step-40.pt saved".
_CHECKPOINT_SAVED = re.compile(r"\bcheckpoint\b[^;\n]*\bsaved\b")


def _exit_meaning(code: int, message: str) -> str:
    """What an exit code is known to mean: the code says SIGTERM; only the container's own
    termination message can say a checkpoint was saved."""
    meaning = contract.describe_exit_code(code)
    if code == contract.ExitCode.PREEMPTED and _CHECKPOINT_SAVED.search(message or ""):
        meaning = "preempted: SIGTERM, checkpoint saved (retryable)"
    return meaning


def _describe(failure: NodeFailure) -> str:
    """The culprit and what happened to it: "node 1 (pod train-node-1 on worker-2) exited with
    code 137 (...), OOM-killed", "... was deleted; disrupted: DeletionByTaintManager"."""
    if failure.exit_code is not None:
        what = f"exited with code {failure.exit_code} ({_exit_meaning(failure.exit_code, failure.message)})"
        if failure.reason == "OOMKilled":
            what += ", OOM-killed"
    elif failure.disruption and failure.disruption == failure.reason:
        what = "was stopped by the cluster"
    else:
        what = f"was {failure.reason.lower() or 'lost'}"
    if failure.disruption:
        what += f" (disruption: {failure.disruption})"
    where = f"pod {failure.pod}" + (f" on {failure.node}" if failure.node else "")
    rank = f"rank {failure.rank} on " if failure.rank is not None else ""
    return f"{rank}node {failure.node_rank} ({where}) {what}"


def _failure_record(failure: NodeFailure, status: JobStatus, now: dt.datetime) -> FailureRecord:
    """The history entry of the failure that decided the outcome: the description, then the
    evidence's last line (a traceback's says what went wrong; a disruption's message says who)."""
    evidence = next((line.strip() for line in reversed((failure.message or "").splitlines()) if line.strip()), "")
    message = _describe(failure) + (f": {shorten(evidence, _DETAIL_LIMIT)}" if evidence else "")
    return FailureRecord(time=format_time(failure.at or now), attempt=status.restartAttempt,
                         nodeRank=failure.node_rank, rank=failure.rank, pod=failure.pod,
                         nodeName=failure.node, kind=failure.kind,
                         reason=failure.disruption or failure.reason, exitCode=failure.exit_code,
                         message=message)


def _failed_node(failure: NodeFailure) -> FailedNode:
    return FailedNode(nodeRank=failure.node_rank, pod=failure.pod, exitCode=failure.exit_code,
                      reason=shorten(failure.reason, REASON_LIMIT), message=truncate(failure.message, FAILED_NODE_MESSAGE_LIMIT))


def _restart_so_far(job: spec.DDPJob, status: JobStatus) -> str:
    """Which budget the restart under way spends, and how much of it is spent."""
    policy = job.spec.failurePolicy
    if status.failureHistory and status.failureHistory[0].kind == DISRUPTION:
        return f"disruption {len(status.recentDisruptions)} of {policy.maxDisruptions}"
    return f"restart {status.restarts} of {policy.maxRestarts}"


def soonest(*delays: Optional[float]) -> Optional[float]:
    """The first of the clocks that are set (seconds, never below 0), or None."""
    present = [max(0.0, d) for d in delays if d is not None]
    return min(present) if present else None


def _names(pods: Iterable[PodView]) -> str:
    return listed(sorted(p.name for p in pods), _LISTED_PODS)


# ---------------------------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------------------------
def decide(job: spec.DDPJob, status: JobStatus, seen: Observation, now: dt.datetime, *,
           force_delete_after: float = 60.0) -> Plan:
    """The next step for ``job``, given its status and what this pass saw (``seen``).
    ``force_delete_after``: seconds past its deletionTimestamp before a pod still Terminating is
    force-deleted (the operator's setting)."""
    pods, hold, generation = seen.pods, seen.hold, seen.generation
    before = status
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
        plan = _create_gang(job, status, pods, now, _service_conflict(job, seen.service))
    else:
        plan = _watch_gang(job, status, pods, now, seen.created_ranks, seen.creation_errors, seen.progress,
                           _service_conflict(job, seen.service), seen.service_watched and seen.service is None,
                           seen.entry_states)

    if plan.status.phase != RUNNING and plan.status.progress is not None and plan.status.progress.eta:
        # An estimate of time left means nothing while the gang is not training.
        plan = replace(plan, status=replace(plan.status, progress=replace(
            plan.status.progress, eta="", etaSeconds=None)))
    if plan.status.phase not in TERMINAL_PHASES | HELD_PHASES:  # the deadline counts down
        plan = replace(plan, requeue_after=soonest(plan.requeue_after, _deadline_left(job, plan.status, now)))
    plan = replace(plan, force_delete=force, requeue_after=soonest(plan.requeue_after, force_due))
    return _with_goodput(before, plan, now)


def _with_goodput(before: JobStatus, plan: Plan, now: dt.datetime) -> Plan:
    """The plan's status with its goodput brought up to date (api/goodput.py); a job that
    succeeds says where its time went, in its message and its Succeeded Event."""
    status = goodput.account(before, plan.status, now)
    events = plan.events
    status, advice_events = _checkpoint_advice(before, status)
    events += advice_events
    if status.phase == SUCCEEDED and not before.terminal and status.goodput is not None:
        said = status.goodput.summary
        status = with_phase(status, SUCCEEDED, status.reason, f"{status.message}; {said}", now)
        events = tuple(replace(e, message=f"{e.message}; {said}") if e.reason == SUCCEEDED else e for e in events)
    return replace(plan, status=status, events=events)


def _checkpoint_advice(before: JobStatus, status: JobStatus) -> tuple[JobStatus, tuple[Event, ...]]:
    """The Young/Daly checkpoint interval in the goodput, and an Event at a restart where the
    interval in use is far from it (api/checkpoint_advice.py)."""
    advice = checkpoint_advice.advise(status.goodput, status.progress)
    if status.goodput is None or advice is None:
        return status, ()
    if status.goodput.suggestedCheckpointIntervalSeconds != advice.interval:
        status = replace(status, goodput=replace(status.goodput, suggestedCheckpointIntervalSeconds=advice.interval))
    restarted = before.goodput is None or status.goodput.restarts > before.goodput.restarts
    if restarted and advice.worth_saying:
        return status, (Event("Normal", "CheckpointInterval", advice.message),)
    return status, ()


def decide_invalid(status: JobStatus, message: str, seen: Observation, now: dt.datetime, *,
                   uid: Optional[str] = None) -> Plan:
    """A spec that does not parse: Failed/InvalidSpec naming the fields; nothing is created,
    and pods of the job (``uid``) that still run (a spec broken mid-run) are released."""
    generation = seen.generation
    release = _deletable(p for p in seen.pods if uid is not None and p.owner_uid == uid and not p.finished)
    if status.terminal:
        reason, text = terminal_reason(status)
        return Plan(status=replace(status, reason=reason, message=text), delete=release)
    failed = with_phase(status, FAILED, "InvalidSpec", message, now)
    failed = replace(failed, completionTime=format_time(now), readyNodes=0,
                     observedGeneration=generation if generation is not None else status.observedGeneration)
    return _with_goodput(status, Plan(status=failed, delete=release,
                                      events=(Event("Warning", "InvalidSpec", failed.message),)), now)


def refuse_creation(job: spec.DDPJob, status: JobStatus, message: str, now: dt.datetime) -> Plan:
    """The API server refused to create a pod for a reason a retry cannot fix (an admission
    policy such as Pod Security, or an invalid template): fail with its message. ``status`` is
    the one just written for the creation; what did get created is released by the next pass,
    which sees those pods (the creations' watch events wake it)."""
    return _with_goodput(status, _fail(job, status, (), now, "PodCreationRefused", message), now)


def _adopt_newer_attempt(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView],
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


def is_ours(job: spec.DDPJob, pod: PodView) -> bool:
    """Whether the pod's controller owner reference is this job (by uid). ``job.uid`` is None
    only for a job that was never stored (the unit tests' jobs made without one)."""
    return pod.owner_uid == job.uid if job.uid is not None else True


def _ours(job: spec.DDPJob, pods: Iterable[PodView]) -> list[PodView]:
    return [p for p in pods if is_ours(job, p)]


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
            due = soonest(due, left)
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
    ours = [p for p in pods if is_ours(job, p)]
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
    if status.phase not in HELD_PHASES:
        # The next gang gets a new attempt number if this one had pods, so any straggler of the
        # old one is told apart; the deadline clock restarts on resume (startTime cleared).
        attempt = status.restartAttempt + 1 if status.is_true(CREATED) else status.restartAttempt
        status = replace(without_nodes(status), restartAttempt=attempt, startTime=None)
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
def _create_gang(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
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
        message = f"waiting for {len(pods)} old pod(s) to terminate before creating attempt {attempt}: {_names(pods)}"
        foreign = [p for p in pods if not is_ours(job, p) and not p.deleting]
        if foreign:
            message += (f" ({_names(foreign)}: not this job's pod(s), with the name of one of its own; "
                        "the operator does not delete them)")
        if phase == RESTARTING and status.failedNode is not None:
            message = f"{_restart_so_far(job, status)}: {message}"
        waiting = with_phase(replace(status, readyNodes=0), phase, reason, message, now)
        return Plan(status=waiting, delete=_deletable(_ours(job, pods)), events=tuple(events))

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


def _service_conflict(job: spec.DDPJob, service: Optional[ServiceView]) -> Optional[str]:
    """Why the Service with the job's name is in the way, naming it and its owner; None when
    there is none or it is the job's own (its controller owner reference is the job, by uid)."""
    if service is None or job.uid is None or service.owner_uid == job.uid:
        return None
    whose = f"its controller is {service.owner}" if service.owner else "it has no controller owner reference"
    return (f"Service {service.name} is not this job's ({whose}); no pod is created while it exists "
            f"(node 0's address would not resolve): delete or rename it. The operator never adopts, "
            f"changes or deletes it")


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
    # Pod status is anyone's who may write it: every field is bounded (api/status.py).
    return NodeState(nodeRank=p.node_rank, pod=p.name, phase=shorten(p.phase, PHASE_LIMIT), ready=p.ready,
                     exitCode=p.exit_code, reason=shorten(reason, REASON_LIMIT), message=message,
                     nodeName=shorten(p.node_name, NODE_NAME_LIMIT))


def _entry_failure(p: PodView, entry: Optional[EntryState], attempt: int,
                   now: dt.datetime) -> Optional[NodeFailure]:
    """A pod whose entry point says its workers failed (and it waits for an order): the node's
    failure, with the exit code and message it would have ended with."""
    if entry is None or entry.state != contract.ENTRY_FAILED or entry.attempt != attempt:
        return None
    code = entry.exit_code
    reason = "Error" if code else "Failed"
    return NodeFailure(node_rank=p.node_rank, exit_code=code, reason=reason, at=now, pod=p.name,
                       message=entry.message, node=p.node_name)


# How long a failure that only follows another's (a peer lost: 13; 12; 143) waits for that other
# failure to show, when every failure seen so far is an entry point's (a pod's readiness drops
# within a second of its workers' end, but not at the same second as its peers').
CONSEQUENCE_GRACE_SECONDS = 5.0


def _consequence_wait(failures: Sequence[NodeFailure], entry_states: Sequence[EntryState]) -> Optional[float]:
    """Seconds to wait for the root cause before acting on ``failures``, or None to act now:
    only while each failure is an entry point's, each a consequence code, all fresh."""
    if len(entry_states) != len(failures) or not all(
            f.exit_code in contract.CONSEQUENCE_EXIT_CODES for f in failures):
        return None
    ages = [e.seconds_since_failure for e in entry_states]
    if any(age is None for age in ages):
        return None
    left = CONSEQUENCE_GRACE_SECONDS - max(ages)  # type: ignore[type-var]
    return left if left > 0 else None


def _failure_of(job: spec.DDPJob, p: PodView) -> Optional[NodeFailure]:
    # Whose fault: the cluster's when the pod says so (api/failure_policy.py, two budgets).
    disruption = failure_policy.disruption_of(condition_reason=p.disruption, pod_reason=p.pod_reason,
                                              unhealthy_devices=p.unhealthy_devices)
    detail = p.disruption_message or (f"unhealthy: {p.unhealthy_devices}" if p.unhealthy_devices else "")
    if p.phase == POD_FAILED:
        code = p.exit_code
        reason = p.terminated_reason or p.disruption or p.pod_reason or "Failed"
        message = p.terminated_message or p.pod_message or detail
        return NodeFailure(node_rank=p.node_rank, exit_code=code, reason=reason,
                           at=p.finished_at or p.deletion_at, pod=p.name, message=message,
                           disruption=disruption, node=p.node_name)
    if p.deleting and p.phase != POD_SUCCEEDED:
        # Deleted from under the job (a user, a drain, taint-based eviction of a lost node):
        # the rank is gone, and its peers will hang until the gang restarts.
        reason = p.disruption or p.pod_reason or MISSING
        return NodeFailure(node_rank=p.node_rank, exit_code=None, reason=reason, at=p.deletion_at,
                           pod=p.name, message=p.pod_message or detail, disruption=disruption,
                           node=p.node_name)
    return None


def _kubelet_restart_of(p: PodView) -> Optional[NodeFailure]:
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


# After a kubelet restart in place, how long the gang's other pods have to exit (and be
# restarted by their kubelets) before they are recreated: nothing in them takes an order, and a
# process that hangs in a collective with its lost peer would hold the rendezvous.
KUBELET_PEER_EXIT_GRACE_SECONDS = 30.0


def _kubelet_carried(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView],
                     now: dt.datetime) -> tuple[list[PodView], list[PodView], Optional[float]]:
    """In an attempt that the kubelet restarts in place: (the pods of the attempt before whose
    container has restarted since, as pods of this attempt; the others of that attempt still
    given time to exit; seconds until that time is up)."""
    if not (spec.kubelet_restarts_in_place(job.spec) and _started_in_place(status)):
        return [], [], None
    created = status.condition(CREATED)
    since = parse_time(created.lastTransitionTime) if created and created.status == "True" else None
    left = KUBELET_PEER_EXIT_GRACE_SECONDS - (now - since).total_seconds() if since else 0.0
    avoided = {n.nodeName for n in status.excludedNodes}
    carried: list[PodView] = []
    held: list[PodView] = []
    for p in _ours(job, pods):
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


def _watch_gang(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                created_ranks: frozenset[int], creation_errors: Mapping[int, str],
                progress: Optional[progress_reports.GangProgress] = None,
                service_conflict: Optional[str] = None, service_missing: bool = False,
                entry_states: Mapping[str, EntryState] = {}) -> Plan:
    carried, held, held_for = _kubelet_carried(job, status, pods, now)
    plan = _watch_attempt(job, status, pods, now, created_ranks, creation_errors, progress, service_conflict,
                          service_missing, entry_states, carried, held)
    if plan.status.restartAttempt != status.restartAttempt:  # restarted again: nothing to carry
        return plan
    adopt = tuple(p for p in carried if p not in plan.delete)
    return replace(plan, adopt=adopt, arm=_to_arm(job, status, pods, adopt),
                   requeue_after=soonest(plan.requeue_after, held_for))


def _to_arm(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView],
            adopt: tuple[PodView, ...]) -> tuple[PodView, ...]:
    """The attempt's pods the kubelet may restart, running the attempt's own run (no restart
    unaccounted for), whose annotation does not yet name the next attempt: a container the
    kubelet starts after their next exit then sees that attempt. (One that fails before this
    pass still sees the current one: docs/operator.md.)"""
    if not spec.kubelet_restarts_in_place(job.spec):
        return ()
    adopted = {p.uid: p for p in adopt}
    nxt = status.restartAttempt + 1
    return tuple(p for p in (adopted.get(p.uid, p) for p in _ours(job, pods))
                 if p.attempt == status.restartAttempt and p.kubelet_restarts and p.running and not p.deleting
                 and p.restarts == p.restarts_seen and p.attempt_at_start is not None and p.attempt_at_start != nxt)


def _watch_attempt(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                   created_ranks: frozenset[int], creation_errors: Mapping[int, str],
                   progress: Optional[progress_reports.GangProgress], service_conflict: Optional[str],
                   service_missing: bool, entry_states: Mapping[str, EntryState],
                   carried: list[PodView], held: list[PodView]) -> Plan:
    # The attempt keeps the shape it was created with (status.nnodes, status.podSpecHash): a
    # spec changed under it (an older CRD, a bypassed validation) is for the next attempt.
    nnodes, attempt = status.nnodes, status.restartAttempt
    reshaped = bool(status.podSpecHash) and status.podSpecHash != spec.pod_spec_hash(job.spec)
    current: dict[int, PodView] = {}
    strays: list[PodView] = []
    # Pods the kubelet restarted come first, as pods of this attempt; those still given time
    # to exit are neither current nor strays.
    set_aside = {p.uid for p in carried} | {p.uid for p in held}
    for p in carried + [p for p in _ours(job, pods) if p.uid not in set_aside]:
        if p.attempt == attempt and p.node_rank < nnodes and p.node_rank not in current:
            current[p.node_rank] = p
        else:
            strays.append(p)

    # What earlier passes recorded of this attempt: every rank observed and every rank that
    # succeeded (status.nodes itself lists at most NODES_LISTED of them).
    listed_before, observed_before, succeeded_before = recorded_nodes(status)
    nodes: list[NodeState] = []
    failures: list[NodeFailure] = []
    waiting_for_cause: list[EntryState] = []  # entry points that failed, as they said
    succeeded = started = 0
    missing: list[int] = []
    for rank in range(nnodes):
        pod = current.get(rank)
        if pod is not None:
            nodes.append(_node_state(pod))
            failure = _failure_of(job, pod) or _kubelet_restart_of(pod)
            if failure is None:
                failure = _entry_failure(pod, entry_states.get(pod.uid), attempt, now)
                if failure is not None:
                    waiting_for_cause.append(entry_states[pod.uid])
            if failure is not None:
                failures.append(failure)
            elif pod.phase == POD_SUCCEEDED:
                succeeded += 1
                started += 1
            elif pod.phase == POD_RUNNING:
                started += 1
        elif rank in succeeded_before:
            # A finished pod someone cleaned up: still a success.
            nodes.append(listed_before.get(rank) or NodeState(
                nodeRank=rank, pod=names.node_pod_name(job.name, rank), phase=POD_SUCCEEDED))
            succeeded += 1
            started += 1
        elif rank in observed_before:
            # Observed once in this attempt, gone now without our deleting it.
            previous = listed_before.get(rank) or NodeState(nodeRank=rank, pod=names.node_pod_name(job.name, rank))
            gone = replace(previous, phase=MISSING, ready=False, reason=MISSING, message="the pod was deleted")
            nodes.append(gone)
            # A disruption seen before the pod went (a pod GC'd off a deleted node) still counts.
            disruption = previous.reason if previous.reason in failure_policy.KNOWN_DISRUPTIONS else ""
            failures.append(NodeFailure(node_rank=rank, exit_code=None, reason=MISSING, pod=gone.pod,
                                        message="the pod was deleted", disruption=disruption,
                                        node=previous.nodeName))
        else:
            missing.append(rank)

    observed = with_nodes(status, nodes)
    ready = observed.readyNodes
    stray_deletes = _deletable(strays)

    if failures:
        wait = _consequence_wait(failures, waiting_for_cause)
        if wait is not None:
            return Plan(status=observed, delete=stray_deletes, requeue_after=wait)
        # An entry point that saw its workers' reports vouches that the attempt trained, where
        # the operator's poll (every few seconds) may have missed a short attempt.
        reported = any(e.reported and e.attempt == attempt for e in entry_states.values())
        restarted_by_kubelet = tuple(p for p in current.values() if _kubelet_restart_of(p) is not None)
        return _on_failure(job, observed, pods, now, failures, reported=reported,
                           restarted_by_kubelet=restarted_by_kubelet)
    if succeeded == nnodes:
        done = with_phase(observed, SUCCEEDED, "AllNodesSucceeded", f"all {nnodes} node(s) succeeded", now)
        done = replace(done, completionTime=format_time(now), failedNode=None)
        plan = _finished(job, done, pods, now)
        return replace(plan, delete=plan.delete + stray_deletes,
                       events=(Event("Normal", "Succeeded", f"All {nnodes} node(s) succeeded"),))
    note = "; the spec has changed since this attempt started: the change applies to the next attempt" \
        if reshaped else ""
    # Our Service deleted under the job: recreated now (the watch shows its absence). The pods
    # that run keep their addresses; a restarted or late pod needs the Service to be found.
    service_events = (Event("Warning", "ServiceMissing",
                            f"Service {names.service_name(job.name)} does not exist: creating it"),) \
        if service_missing else ()
    if started == nnodes:
        running_now = ready
        message = f"{running_now}/{nnodes} node(s) running" + (f", {succeeded} succeeded" if succeeded else "") + note
        if service_conflict:  # a gang already running found its peers; a restart would be held
            message += f"; {service_conflict}"
        events = () if status.phase == RUNNING else (Event("Normal", "Running", f"All {nnodes} node(s) running (attempt {attempt})"),)
        running = replace(with_phase(observed, RUNNING, "AllNodesRunning", message, now), failedNode=None)
        since = status.condition(RUNNING) if status.phase == RUNNING else None
        running_since = (parse_time(since.lastTransitionTime) if since else None) or now
        stalled, stall_due = progress_reports.stall(job, progress, running_since, now)
        overdue, overdue_due = _in_place_start_overdue(job, status, progress, now)
        if stalled is not None or overdue is not None:
            return _stalled(job, observed, pods, now, stalled or overdue)
        stall_due = soonest(stall_due, overdue_due)
        if progress is not None:
            running = replace(running, progress=progress_reports.to_status(
                progress, running=True, previous=status.progress))
        return Plan(status=running, delete=stray_deletes, events=events + service_events,
                    ensure_service=service_missing, requeue_after=stall_due)

    # Some nodes have not started: the startup clock runs from the attempt's creation.
    waiting = [p for p in current.values() if p.phase not in (POD_RUNNING, POD_SUCCEEDED)]
    described = _describe_not_started(job, waiting, missing, creation_errors, service_conflict or "")
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

    # A rank whose old pod still holds the name (terminating after an in-place restart kept
    # its peers) is created once that pod is gone: a creation now would find "already exists".
    taken = {p.name for p in pods}
    recreate = () if service_conflict else tuple(
        r for r in missing if r not in created_ranks and names.node_pod_name(job.name, r) not in taken)
    if recreate and reshaped:
        # A pod of this attempt would be built from another spec than its peers (another
        # WORLD_SIZE, image, ...): start the next attempt in the new shape instead.
        return _reshape(job, observed, pods, now)
    phase = RESTARTING if status.phase == RESTARTING else PENDING
    reason = SERVICE_CONFLICT if service_conflict and missing else "NodesPending"
    prefix = f"{_restart_so_far(job, status)}: " if phase == RESTARTING else ""
    # Said before the pods' reasons, which a long gang's message may cut short.
    avoided = node_exclusion.unschedulable_note(status) if any(p.unschedulable for p in waiting) else ""
    message = f"{prefix}{started}/{nnodes} node(s) started{avoided}; waiting for {described}{note}"
    pending = with_phase(observed, phase, reason, message, now)
    events = service_events
    if reason == SERVICE_CONFLICT and status.reason != SERVICE_CONFLICT:
        events += (Event("Warning", SERVICE_CONFLICT, shorten(service_conflict or "", _DETAIL_LIMIT * 2)),)
    return Plan(status=pending, create_ranks=recreate, attempt=attempt, ensure_service=bool(recreate) or service_missing,
                delete=stray_deletes, events=events, requeue_after=left)


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
                          creation_errors: Mapping[int, str], held_by: str = "") -> str:
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
    if unseen and held_by:
        clauses.append(f"{unseen} pod(s) not created: {held_by}")
    elif unseen:
        clauses.append(f"{unseen} pod(s) not observed yet")
    return "; ".join(clauses)


def _listed(pod_names: Sequence[str]) -> str:
    """Pod names for a clause: ``4 pod(s) a, b and 2 more`` once some are left out."""
    count = f"{len(pod_names)} pod(s) " if len(pod_names) > _LISTED_PODS else ""
    return count + listed(pod_names, _LISTED_PODS)


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
    where = next((p.node_name for p in _ours(job, pods)
                  if p.node_rank == node and p.attempt == status.restartAttempt), "")
    failure = NodeFailure(node_rank=node, exit_code=None, reason=STALLED, at=now,
                          pod=names.node_pod_name(job.name, node), message=stalled.message, node=where,
                          rank=stalled.suspect_rank)
    plan = _on_failure(job, status, pods, now, [failure], restart_reason=STALLED)
    return replace(plan, events=(Event("Warning", STALLED, stalled.message),) + plan.events,
                   stacks=StacksRequest(_stack_pods(job, status, pods, node), stalled.suspect_rank))


def _stack_pods(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], suspect_node: int) -> tuple[PodView, ...]:
    """The stalled attempt's pods that can show their stacks (running, an IP, a token), the
    suspect node's first, then the lowest node ranks: at most stall_stacks.MAX_PODS."""
    able = {p.node_rank: p for p in sorted(_ours(job, pods), key=lambda p: p.node_rank, reverse=True)
            if p.attempt == status.restartAttempt and p.running and not p.deleting and p.pod_ip
            and p.restart_token}
    order = sorted(able, key=lambda rank: (rank != suspect_node, rank))
    return tuple(able[rank] for rank in order[:stall_stacks.MAX_PODS])


def _on_failure(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                failures: list[NodeFailure], restart_reason: Optional[str] = None,
                reported: bool = False, restarted_by_kubelet: tuple[PodView, ...] = ()) -> Plan:
    """``reported``: an entry point of the failed attempt says its workers reported progress.
    ``restarted_by_kubelet``: the attempt's pods whose container the kubelet restarts in place."""
    policy = job.spec.failurePolicy
    window = disruptions_within(status, now, policy.disruptionWindowSeconds)
    ruling = failure_policy.verdict(failures, restarts_done=status.restarts, policy=policy,
                                    recent_disruptions=len(window))
    first = ruling.cause
    keep = _restartable_in_place(job, status, pods, reported) if ruling.restart else ()
    by_kubelet = (ruling.restart and bool(restarted_by_kubelet) and spec.kubelet_restarts_in_place(job.spec)
                  and not _in_place_failed_before_training(status, reported))
    fallback = (ruling.restart and _in_place_failed_before_training(status, reported)
                and spec.effective_restart_mode(job.spec) == contract.RESTART_MODE_IN_PLACE)
    mode = "" if not ruling.restart else (
        contract.RESTART_MODE_IN_PLACE if keep or by_kubelet else contract.RESTART_MODE_RECREATE)
    # The culprit goes into the history whatever comes next (restart or failure).
    recorded = with_failure(replace(status, recentDisruptions=window),
                            replace(_failure_record(first, status, now), restartMode=mode))
    # A node implicated often enough is avoided from the next attempt on (api/node_exclusion.py).
    status = node_exclusion.with_exclusions(recorded, policy, now)
    excluded = tuple(Event("Warning", "NodeExcluded", f"The next pods avoid node {n.nodeName}: {n.message}")
                     for n in node_exclusion.newly_excluded(recorded, status))
    if ruling.reason == failure_policy.PERMANENT:
        return _fail(job, recorded, pods, now, ruling.reason,
                     f"{_describe(first)}: a restart cannot fix this", _failed_node(first))
    if ruling.reason in (failure_policy.BUDGET_SPENT, failure_policy.DISRUPTION_BUDGET_SPENT):
        return _fail(job, recorded, pods, now, ruling.reason,
                     f"{_describe(first)} and the {ruling.budget_words(policy)} is spent", _failed_node(first))

    spent = (with_disruption(status, now, policy.disruptionWindowSeconds) if ruling.kind == DISRUPTION
             else replace(status, restarts=ruling.restarts_after))
    if ruling.kind == DISRUPTION and restart_reason is None:
        restart_reason = failure_policy.DISRUPTED
    message = f"{_describe(first)}; {ruling.spending(policy)}: deleting the gang"
    restarting = replace(spent, restartAttempt=status.restartAttempt + 1,
                         failedNode=_failed_node(first), readyNodes=0)
    restarting = with_phase(restarting, RESTARTING, restart_reason or ruling.reason, message, now, created=False,
                            created_reason="Restarting", created_message=message)
    event = Event("Warning", "Restarting",
                  f"{_describe(first)}" + (f" [{first.reason}]" if first.reason else "")
                  + f"; restarting all {status.nnodes} node(s) ({ruling.spending(policy)})")
    if keep:
        return _in_place(job, restarting, pods, now, keep, event, excluded)
    if by_kubelet:
        return _in_place_by_kubelet(job, restarting, pods, now, restarted_by_kubelet, event, excluded)
    if fallback:
        event = replace(event, message=event.message + (
            f"; recreating the pods: attempt {status.restartAttempt} was restarted in place and "
            "failed before its first progress report"))
    # Every pod of the attempt goes, including the healthy ranks: they would hang in a
    # collective with the dead one until a watchdog fires (kubeflow/trainer#2269).
    return Plan(status=restarting, delete=_deletable(_ours(job, pods)), events=(event,) + excluded)


def _started_in_place(status: JobStatus) -> bool:
    """The current attempt was started inside the pods of the one before (failureHistory[0] is
    the failure that ended that one)."""
    last = status.failureHistory[0] if status.failureHistory else None
    return (last is not None and last.restartMode == contract.RESTART_MODE_IN_PLACE
            and last.attempt == status.restartAttempt - 1)


def _in_place_failed_before_training(status: JobStatus, reported: bool = False) -> bool:
    """The attempt restarted in place failed before any of its ranks reported progress, where an
    earlier attempt did report (the program reports, so its silence is news). Whatever held it
    (a process SIGTERM did not end, a wedged device, a full /dev/shm) may still be in those pods:
    the next attempt gets new ones. ``reported``: an entry point of the attempt saw a report of
    its workers that the operator's last poll (status.progress) had not yet seen."""
    return (_started_in_place(status) and status.progress is not None and not reported
            and status.progress.attempt < status.restartAttempt)


def _in_place_start_overdue(job: spec.DDPJob, status: JobStatus,
                            progress: Optional[progress_reports.GangProgress],
                            now: dt.datetime) -> tuple[Optional[progress_reports.Stall], Optional[float]]:
    """(a stall, if an attempt restarted in place has not reached its first progress report
    within startupTimeoutSeconds of the order; else seconds until it would be late, if that
    bound applies). The bound applies to programs that report progress (an earlier attempt
    did) and counts from no earlier than this operator's first sight of the attempt, as hang
    detection does (an operator outage is no evidence of a hang). The pods of an in-place
    attempt are running from the order on, so the startup clock alone would never fire."""
    if not _started_in_place(status) or status.progress is None or progress is None:
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


def _restartable_in_place(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView],
                          reported: bool = False) -> tuple[PodView, ...]:
    """The pods of the failed attempt that can start the next one in place: running, with an
    entry point that takes orders, in the attempt's shape (a spec changed since is for new
    pods), and not on a node the next attempt avoids. None at all: the gang is recreated; so
    too after an in-place attempt that failed before its first progress report."""
    if (spec.effective_restart_mode(job.spec) != contract.RESTART_MODE_IN_PLACE
            or (status.podSpecHash and status.podSpecHash != spec.pod_spec_hash(job.spec))
            or _in_place_failed_before_training(status, reported)):
        return ()
    avoided = {n.nodeName for n in status.excludedNodes}
    keep: dict[int, PodView] = {}
    for p in _ours(job, pods):
        if (p.attempt == status.restartAttempt and p.phase == POD_RUNNING and p.running and not p.deleting
                and p.restart_token and p.pod_ip and p.node_name not in avoided
                and p.node_rank < status.nnodes and p.node_rank not in keep):
            keep[p.node_rank] = p
    return tuple(keep[r] for r in sorted(keep))


def _in_place(job: spec.DDPJob, restarting: JobStatus, pods: Sequence[PodView], now: dt.datetime,
              keep: tuple[PodView, ...], event: Event, excluded: tuple[Event, ...]) -> Plan:
    """The next attempt starts inside the pods that are left (their entry points stop the
    workers, which save a checkpoint, and start them again); the others are recreated for it.
    The attempt counts as created now: its pods exist, and the startup clock runs."""
    attempt = restarting.restartAttempt
    recreated = [p for p in _ours(job, pods) if p not in keep]
    how = f"{len(keep)} pod(s) in place" + (f", {len(recreated)} recreated" if recreated else "")
    message = restarting.message.replace(": deleting the gang", f": restarting {how}")
    status = with_phase(without_nodes(restarting), RESTARTING, restarting.reason, message, now, created=True,
                        created_reason="RestartedInPlace", created_message=f"attempt {attempt}: {how}")
    event = replace(event, message=event.message.replace(
        f"restarting all {restarting.nnodes} node(s)", f"restarting all {restarting.nnodes} node(s), {how}"))
    return Plan(status=status, restart_in_place=keep, attempt=attempt, delete=_deletable(recreated),
                events=(event,) + excluded, requeue_after=float(job.spec.startupTimeoutSeconds))


def _in_place_by_kubelet(job: spec.DDPJob, restarting: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                         restarted: tuple[PodView, ...], event: Event, excluded: tuple[Event, ...]) -> Plan:
    """The next attempt starts inside the pods the kubelet restarts (a command of your own,
    whose container carries the restart rule): they stay; the others that still run are given
    KUBELET_PEER_EXIT_GRACE_SECONDS to exit and be restarted too (``_kubelet_carried``), then
    are recreated; pods that cannot restart (finished, deleted, on a node the next attempt
    avoids, without the rule) are recreated now. The attempt counts as created now."""
    attempt = restarting.restartAttempt
    avoided = {n.nodeName for n in restarting.excludedNodes}
    staying = [p for p in _ours(job, pods) if p.kubelet_restarts and p.phase == POD_RUNNING and not p.deleting
               and p.node_name not in avoided and p.attempt == attempt - 1]
    recreated = [p for p in _ours(job, pods) if p not in staying]
    how = f"{len(restarted)} pod(s) restarted in place by the kubelet" + (
        f", {len(staying) - len(restarted)} given {KUBELET_PEER_EXIT_GRACE_SECONDS:.0f}s to exit"
        if len(staying) > len(restarted) else "") + (f", {len(recreated)} recreated" if recreated else "")
    message = restarting.message.replace(": deleting the gang", f": {how}")
    status = with_phase(without_nodes(restarting), RESTARTING, restarting.reason, message, now, created=True,
                        created_reason="RestartedInPlace", created_message=f"attempt {attempt}: {how}")
    event = replace(event, message=event.message.replace(
        f"restarting all {restarting.nnodes} node(s)", f"restarting all {restarting.nnodes} node(s), {how}"))
    return Plan(status=status, attempt=attempt, delete=_deletable(recreated), events=(event,) + excluded,
                requeue_after=KUBELET_PEER_EXIT_GRACE_SECONDS)
