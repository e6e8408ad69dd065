"""The DDPJob status model: the one source of its shape.

These frozen dataclasses are what the operator writes; ``ddpjob.api.schema.status_schema``
generates the CRD's ``status`` schema from them (and docs/api.md from that), so the shape is
written once. ``JobStatus.from_dict`` reads what the API server holds; ``JobStatus.to_dict``
writes the body of a merge patch (unset fields as null, so a cleared field is removed). Two
statuses compare equal exactly when the API object would not change, which is how the operator
knows it can skip a write. How a status moves from one phase to the next is the controller's
business (``ddpjob.controller.status``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ddpjob.api import names

PENDING = "Pending"
RUNNING = "Running"
RESTARTING = "Restarting"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
#: Waiting for Kueue to admit the whole gang (or stopped by a Kueue eviction): no pods.
QUEUED = "Queued"
PHASES = (PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED, QUEUED)
TERMINAL_PHASES = frozenset({SUCCEEDED, FAILED})

# Condition types, in the order they are listed.
CREATED = "Created"
CONDITION_TYPES = (CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)
CONDITION_STATUSES = ("True", "False", "Unknown")

# Bounds on text copied from pods: a status must stay far below etcd's 1.5 MiB object limit even
# for a 9999-node job, and a termination message may be 4 KiB.
NODE_MESSAGE_LIMIT = 256
FAILED_NODE_MESSAGE_LIMIT = 2048
STATUS_MESSAGE_LIMIT = 1024


def status_field(description: str, *, default: Any = None, **schema: Any) -> Any:
    """A status field with its schema facts (description; enum; format) in ``metadata``.

    Status fields are never required and carry no schema default: only the operator writes them.
    """
    return field(default=default, metadata={"description": description, "status": True, **schema})


@dataclass(frozen=True)
class NodeState:
    """One node's pod as last observed (``status.nodes[]``)."""

    nodeRank: int = status_field("Node rank.", default=0)
    pod: str = status_field("Pod name.", default="")
    phase: str = status_field("Pod phase.", default="")
    ready: bool = status_field("Whether the pod runs with all containers started.", default=False)
    exitCode: Optional[int] = status_field("Exit code of the trainer container, once terminated.")
    reason: str = status_field("Container terminated or waiting reason.", default="")
    message: str = status_field("Container message.", default="")
    nodeName: str = status_field("The Kubernetes node the pod runs on.", default="")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodeRank": self.nodeRank, "pod": self.pod, "phase": self.phase,
                               "ready": self.ready}
        if self.exitCode is not None:
            out["exitCode"] = self.exitCode
        for key in ("reason", "message", "nodeName"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeState":
        return cls(nodeRank=int(data.get("nodeRank", 0)), pod=str(data.get("pod", "")),
                   phase=str(data.get("phase", "")), ready=bool(data.get("ready", False)),
                   exitCode=data.get("exitCode"), reason=str(data.get("reason", "")),
                   message=str(data.get("message", "")), nodeName=str(data.get("nodeName", "")))


@dataclass(frozen=True)
class FailedNode:
    """The node whose failure decided the outcome (``status.failedNode``)."""

    nodeRank: int = status_field("Node rank of the failed pod.", default=0)
    pod: str = status_field("Pod name.", default="")
    exitCode: Optional[int] = status_field("Exit code of the trainer container.")
    reason: str = status_field(
        "Container terminated reason (Error, OOMKilled, Evicted, Deleted, ...).", default="")
    message: str = status_field(
        "The container's termination message (its last lines, bounded; see docs/security.md).",
        default="")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodeRank": self.nodeRank, "pod": self.pod}
        if self.exitCode is not None:
            out["exitCode"] = self.exitCode
        if self.reason:
            out["reason"] = self.reason
        if self.message:
            out["message"] = self.message
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FailedNode":
        return cls(nodeRank=int(data.get("nodeRank", 0)), pod=str(data.get("pod", "")),
                   exitCode=data.get("exitCode"), reason=str(data.get("reason", "")),
                   message=str(data.get("message", "")))


@dataclass(frozen=True)
class Progress:
    """Training progress as the ranks last reported it (``status.progress``)."""

    summary: str = status_field("<step>/<totalSteps> (<percent>%), for kubectl get.", default="")
    eta: str = status_field("Estimated time left while Running (e.g. 1h05m), for kubectl get.",
                            default="")
    step: int = status_field("The highest step any rank reported.", default=0)
    totalSteps: Optional[int] = status_field("Steps of the whole run, if reported.")
    epoch: Optional[int] = status_field("Current epoch (from 1), if reported.")
    epochs: Optional[int] = status_field("Epochs of the run, if reported.")
    loss: Optional[float] = status_field("The last loss reported.")
    throughput: Optional[float] = status_field("Samples per second, as last reported.")
    etaSeconds: Optional[int] = status_field("Seconds left at the current pace, while Running.")
    lastReportTime: Optional[str] = status_field(
        "When a rank last reported progress (the operator's clock).", format="date-time")
    ranksReporting: int = status_field("Ranks that have reported in this attempt.", default=0)
    attempt: int = status_field("The attempt the reports come from.", default=0)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in ("summary", "eta", "step", "totalSteps", "epoch", "epochs", "loss", "throughput",
                    "etaSeconds", "lastReportTime", "ranksReporting", "attempt"):
            value = getattr(self, key)
            if value is not None and value != "":
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Progress":
        def opt(key: str, kind: type) -> Any:
            value = data.get(key)
            return None if value is None else kind(value)

        return cls(summary=str(data.get("summary", "")), eta=str(data.get("eta", "")),
                   step=int(data.get("step", 0)), totalSteps=opt("totalSteps", int),
                   epoch=opt("epoch", int), epochs=opt("epochs", int), loss=opt("loss", float),
                   throughput=opt("throughput", float), etaSeconds=opt("etaSeconds", int),
                   lastReportTime=data.get("lastReportTime") or None,
                   ranksReporting=int(data.get("ranksReporting", 0)), attempt=int(data.get("attempt", 0)))


@dataclass(frozen=True)
class Condition:
    type: str = status_field("One of " + ", ".join(CONDITION_TYPES) + ".", default="")
    status: str = status_field("True, False or Unknown.", default="Unknown",
                               enum=CONDITION_STATUSES)
    reason: str = status_field("CamelCase machine reason.", default="")
    message: str = status_field("One human sentence.", default="")
    lastTransitionTime: str = status_field("When the status last changed.", default="",
                                           format="date-time")

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "status": self.status, "reason": self.reason,
                "message": self.message, "lastTransitionTime": self.lastTransitionTime}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Condition":
        return cls(type=str(data.get("type", "")), status=str(data.get("status", "Unknown")),
                   reason=str(data.get("reason", "")), message=str(data.get("message", "")),
                   lastTransitionTime=str(data.get("lastTransitionTime", "")))


@dataclass(frozen=True)
class JobStatus:
    """What the operator observed; written only by the operator."""

    phase: str = status_field("Where the job is.", default="", enum=PHASES)
    reason: str = status_field(
        "CamelCase machine reason for the phase, e.g. PodFailedPermanent, StartupTimeout, "
        "Stalled, RestartBudgetExhausted, DeadlineExceeded, ReconcileError, AllNodesSucceeded.", default="")
    message: str = status_field("One human sentence about the phase.", default="")
    readyNodes: int = status_field("Pods Running with all containers started.", default=0)
    nnodes: int = status_field("Nodes (pods) of the job.", default=0)
    restarts: int = status_field("Gang restarts done so far.", default=0)
    restartAttempt: int = status_field(
        f"Attempt of the current pods (label {names.LABEL_RESTART_ATTEMPT}).", default=0)
    podSpecHash: str = status_field(
        "Fingerprint of the spec the current attempt's pods were built from (every spec field "
        "but suspend, activeDeadlineSeconds, ttlSecondsAfterFinished, cleanPodPolicy and "
        "failurePolicy); a spec changed since applies to the next attempt.", default="")
    startTime: Optional[str] = status_field("When the job started.", format="date-time")
    completionTime: Optional[str] = status_field("When the job Succeeded or Failed.", format="date-time")
    observedGeneration: Optional[int] = status_field("The metadata.generation the status describes.")
    failedNode: Optional[FailedNode] = status_field("The node whose failure decided the outcome.")
    progress: Optional[Progress] = status_field(
        "Training progress, when the program reports it (docs/contract.md, Progress).")
    nodes: tuple[NodeState, ...] = status_field("One entry per node.", default=())
    conditions: tuple[Condition, ...] = status_field(
        "Conditions of types " + ", ".join(CONDITION_TYPES) + ".", default=())

    #: Fields computed from others (properties below), written for the printer columns:
    #: (name, the field it follows, its schema).
    __computed__ = (("ready", "message", {"description": "<readyNodes>/<nnodes>, for kubectl get.",
                                          "type": "string"}),)

    @property
    def ready(self) -> str:
        """The printer column: ``<readyNodes>/<nnodes>``."""
        return f"{self.readyNodes}/{self.nnodes}"

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    def condition(self, type_: str) -> Optional[Condition]:
        return next((c for c in self.conditions if c.type == type_), None)

    def is_true(self, type_: str) -> bool:
        cond = self.condition(type_)
        return cond is not None and cond.status == "True"

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase or None,
            "reason": self.reason or None,
            "message": self.message or None,
            "ready": self.ready,
            "readyNodes": self.readyNodes,
            "nnodes": self.nnodes,
            "restarts": self.restarts,
            "restartAttempt": self.restartAttempt,
            "podSpecHash": self.podSpecHash or None,
            "startTime": self.startTime,
            "completionTime": self.completionTime,
            "observedGeneration": self.observedGeneration,
            "failedNode": self.failedNode.to_dict() if self.failedNode else None,
            "progress": self.progress.to_dict() if self.progress else None,
            "nodes": [n.to_dict() for n in self.nodes],
            "conditions": [c.to_dict() for c in self.conditions],
        }

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> "JobStatus":
        data = data or {}
        failed = data.get("failedNode")
        progress = data.get("progress")
        return cls(
            phase=str(data.get("phase") or ""),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            readyNodes=int(data.get("readyNodes") or 0),
            nnodes=int(data.get("nnodes") or 0),
            restarts=int(data.get("restarts") or 0),
            restartAttempt=int(data.get("restartAttempt") or 0),
            podSpecHash=str(data.get("podSpecHash") or ""),
            startTime=data.get("startTime") or None,
            completionTime=data.get("completionTime") or None,
            observedGeneration=data.get("observedGeneration"),
            failedNode=FailedNode.from_dict(failed) if failed else None,
            progress=Progress.from_dict(progress) if progress else None,
            nodes=tuple(NodeState.from_dict(n) for n in data.get("nodes") or ()),
            conditions=tuple(Condition.from_dict(c) for c in data.get("conditions") or ()),
        )
