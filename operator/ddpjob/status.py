"""The DDPJob status: typed, pure, and exactly the fields docs/DESIGN-NOTES.md declares.

``JobStatus.from_dict`` reads what the API server holds; ``JobStatus.to_dict`` writes the body
of a merge patch (unset fields as null, so a cleared field is removed). Two statuses compare
equal exactly when the API object would not change, which is how the operator knows it can
skip a write.

Conditions follow the Kubernetes convention: ``lastTransitionTime`` moves only when a
condition's ``status`` changes, never when its reason or message is refreshed.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

PENDING = "Pending"
RUNNING = "Running"
RESTARTING = "Restarting"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
TERMINAL_PHASES = frozenset({SUCCEEDED, FAILED})

# Condition types, in the order they are listed.
CREATED = "Created"
CONDITION_TYPES = (CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)
# The phases that have a condition of the same name.
_PHASE_CONDITIONS = (RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)

# Bounds on text copied from pods: a status must stay far below etcd's 1.5 MiB object limit even
# for a 9999-node job, and a termination message may be 4 KiB.
NODE_MESSAGE_LIMIT = 256
FAILED_NODE_MESSAGE_LIMIT = 2048
STATUS_MESSAGE_LIMIT = 1024


# ---------------------------------------------------------------------------------------------
# Time
# ---------------------------------------------------------------------------------------------
def format_time(moment: dt.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes its own timestamps."""
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Optional[str]) -> Optional[dt.datetime]:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.timezone.utc)
    except ValueError:
        return None


def truncate(text: str, limit: int) -> str:
    """Keep the end of long text: a traceback's last lines say what went wrong."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-(limit - 3):]


# ---------------------------------------------------------------------------------------------
# Status objects
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeState:
    """One node's pod as last observed (``status.nodes[]``)."""

    nodeRank: int
    pod: str
    phase: str
    ready: bool = False
    exitCode: Optional[int] = None
    reason: str = ""
    message: str = ""
    nodeName: str = ""

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

    nodeRank: int
    pod: str
    exitCode: Optional[int] = None
    reason: str = ""
    message: str = ""

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
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""
    lastTransitionTime: str = ""

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
    phase: str = ""
    reason: str = ""
    message: str = ""
    readyNodes: int = 0
    nnodes: int = 0
    restarts: int = 0
    restartAttempt: int = 0
    startTime: Optional[str] = None
    completionTime: Optional[str] = None
    observedGeneration: Optional[int] = None
    failedNode: Optional[FailedNode] = None
    nodes: tuple[NodeState, ...] = ()
    conditions: tuple[Condition, ...] = field(default=())

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
            "startTime": self.startTime,
            "completionTime": self.completionTime,
            "observedGeneration": self.observedGeneration,
            "failedNode": self.failedNode.to_dict() if self.failedNode else None,
            "nodes": [n.to_dict() for n in self.nodes],
            "conditions": [c.to_dict() for c in self.conditions],
        }

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> "JobStatus":
        data = data or {}
        failed = data.get("failedNode")
        return cls(
            phase=str(data.get("phase") or ""),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            readyNodes=int(data.get("readyNodes") or 0),
            nnodes=int(data.get("nnodes") or 0),
            restarts=int(data.get("restarts") or 0),
            restartAttempt=int(data.get("restartAttempt") or 0),
            startTime=data.get("startTime") or None,
            completionTime=data.get("completionTime") or None,
            observedGeneration=data.get("observedGeneration"),
            failedNode=FailedNode.from_dict(failed) if failed else None,
            nodes=tuple(NodeState.from_dict(n) for n in data.get("nodes") or ()),
            conditions=tuple(Condition.from_dict(c) for c in data.get("conditions") or ()),
        )


# ---------------------------------------------------------------------------------------------
# Conditions
# ---------------------------------------------------------------------------------------------
def set_condition(conditions: tuple[Condition, ...], type_: str, status: bool, reason: str,
                  message: str, now: dt.datetime) -> tuple[Condition, ...]:
    """``conditions`` with ``type_`` set; its lastTransitionTime moves only if status flips."""
    value = "True" if status else "False"
    previous = next((c for c in conditions if c.type == type_), None)
    moved = previous is None or previous.status != value
    updated = Condition(type=type_, status=value, reason=reason, message=message,
                        lastTransitionTime=format_time(now) if moved else previous.lastTransitionTime)
    others = {c.type: c for c in conditions if c.type != type_}
    others[type_] = updated
    known = [others.pop(t) for t in CONDITION_TYPES if t in others]
    return tuple(known) + tuple(others.values())


def with_phase(status: JobStatus, phase: str, reason: str, message: str, now: dt.datetime,
               *, created: Optional[bool] = None, created_reason: str = "",
               created_message: str = "") -> JobStatus:
    """``status`` in ``phase``: the condition named after the phase True, with the phase's
    reason and message; the others False (with the phase as reason when first listed, and the
    reason and message that made them flip when they stop being True).

    ``created`` sets the Created condition: True once the current attempt's pods have been
    created (its lastTransitionTime is when the attempt started: the startup clock), False
    while the gang is being torn down or the job is suspended; None leaves it as it is.
    """
    message = truncate(message, STATUS_MESSAGE_LIMIT)
    conditions = status.conditions
    if created is not None:
        conditions = set_condition(conditions, CREATED, created, created_reason or reason,
                                   created_message or message, now)
    elif status.condition(CREATED) is None:
        conditions = set_condition(conditions, CREATED, False, phase, "", now)
    for type_ in _PHASE_CONDITIONS:
        previous = next((c for c in conditions if c.type == type_), None)
        if type_ == phase:
            conditions = set_condition(conditions, type_, True, reason, message, now)
        elif previous is None:  # not yet: the phase says why
            conditions = set_condition(conditions, type_, False, phase, "", now)
        elif previous.status == "True":  # no longer: why it flipped
            conditions = set_condition(conditions, type_, False, reason, message, now)
    return replace(status, phase=phase, reason=reason, message=message, conditions=conditions)


def terminal_reason(status: JobStatus) -> tuple[str, str]:
    """A finished job's reason and message, from its sticky Succeeded/Failed condition (the top
    level reason may have been overwritten by a later ReconcileError)."""
    cond = status.condition(status.phase)
    if cond is not None and cond.status == "True":
        return cond.reason, cond.message
    return status.reason, status.message
