"""What the operator sees of a job in one pass: its pods (``PodView``, read from pod objects by
``view_pod``), the Service with its name (``ServiceView``) and the rest of an ``Observation``.

Pod status, labels and annotations are anyone's who may write them: every field read here is
bounded (a count, a length, a list's size) before a decision sees it.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.api import names, progress as progress_reports
from ddpjob.api.status import FAILED_NODE_MESSAGE_LIMIT, REASON_LIMIT, listed, parse_time, shorten, truncate
from ddpjob.controller.builders import owner_uid
from ddpjob.controller.kueue import Hold
from ddpjob import restart_orders
from ddpjob.restart_orders import EntryState


POD_SUCCEEDED = "Succeeded"


POD_FAILED = "Failed"


POD_RUNNING = "Running"


MISSING = "Deleted"  # the phase and reason recorded for a pod deleted from under the job


LISTED_PODS = 5  # pods named in a message before "and N more"


DETAIL_LIMIT = 300  # characters of one reason (a scheduler verdict, an API error) in a message


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
    started_at: Optional[dt.datetime] = None  # the terminated container's startedAt
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
    # The public nonce of the pod's restart token, from its spec (the operator's key makes the
    # token of it: restart_orders.RestartKey); "": the pod cannot be restarted in place
    # (Recreate, a command of your own, a pod made before in-place restarts or before tokens
    # were kept out of pod specs).
    restart_nonce: str = ""
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


# A pod's status text is bounded here, before any escape: a 1 MiB message is not scanned whole.
POD_TEXT_READ_LIMIT = 64 * 1024


def _text(value: Any) -> str:
    """A string the pod's writers chose (kubelet, scheduler, the program's termination
    message), read bounded and with its control characters as escapes (contract.pod_text)."""
    text = str(value or "")
    if len(text) > POD_TEXT_READ_LIMIT:
        text = text[-POD_TEXT_READ_LIMIT:]
    return contract.pod_text(text)


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
        started_at=parse_time(terminated.get("startedAt")),
        terminated_reason=_text(terminated.get("reason")),
        terminated_message=truncate(_text(terminated.get("message")), FAILED_NODE_MESSAGE_LIMIT),
        pod_reason=_text(status.get("reason")),
        pod_message=_text(status.get("message")),
        waiting_reason=_text(waiting.get("reason")),
        waiting_message=_text(waiting.get("message")),
        unschedulable=_text(unschedulable),
        disruption=shorten(_text(disruption), REASON_LIMIT),
        disruption_message=shorten(_text(disruption_message), DETAIL_LIMIT),
        unhealthy_devices=_unhealthy_devices(containers),
        pod_ip=str(status.get("podIP") or ""),
        nproc_per_node=_nproc_per_node(pod.get("spec") or {}),
        container_ready=trainer.get("ready") is True,
        restart_nonce=_restart_nonce(pod.get("spec") or {}),
        kubelet_restarts=_has_restart_rule(pod.get("spec") or {}),
        restarts=_count(trainer.get("restartCount")),
        restarts_seen=_count(labels.get(names.LABEL_CONTAINER_RESTARTS)),
        last_exit_code=_exit_code(last.get("exitCode")),
        last_finished_at=parse_time(last.get("finishedAt")),
        last_reason=shorten(_text(last.get("reason")), REASON_LIMIT),
        last_message=truncate(_text(last.get("message")), FAILED_NODE_MESSAGE_LIMIT),
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
    return shorten(listed(found, LISTED_PODS), DETAIL_LIMIT)


def _trainer_env(pod_spec: Mapping[str, Any], name: str) -> str:
    for container in pod_spec.get("containers") or ():
        if container.get("name") == names.CONTAINER_NAME:
            for var in container.get("env") or ():
                if var.get("name") == name:
                    return str(var.get("value") or "")
    return ""


def _restart_nonce(pod_spec: Mapping[str, Any]) -> str:
    """The nonce of the pod's restart token, when the operator made it to be restarted in place
    (a nonce too long to be ours is none)."""
    if _trainer_env(pod_spec, contract.DDPJOB_RESTART_MODE) != contract.RESTART_MODE_IN_PLACE:
        return ""
    nonce = _trainer_env(pod_spec, contract.DDPJOB_RESTART_NONCE)
    return nonce if len(nonce) <= restart_orders.NONCE_LIMIT else ""


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
                     DETAIL_LIMIT) if controller else "")
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
