"""The worst status the operator can write, every field at its bound (api/status.py): built
once here for the unit proof (tests/unit/test_status.py) and for the API server's own verdict
(tests/cluster/test_status_size.py)."""
from __future__ import annotations

import dataclasses
import json
import typing

from ddpjob.api import status as status_model
from ddpjob import contract
from ddpjob.api.model import unwrap_optional
from ddpjob.api.spec import MAX_NNODES
from ddpjob.api.status import (
    EXCLUDED_NODES_LIMIT, FAILURE_HISTORY_LIMIT, NODES_LISTED, RECENT_DISRUPTIONS_LIMIT, Condition, ExcludedNode,
    FailedNode, FailureRecord, Goodput, JobStatus, NodeState, Progress, rank_ranges,
)

# The most characters any writer puts in each text field of the status. Every text field of the
# model is here: a field added without a bound fails test_every_text_field_has_a_bound.
_POD = 63  # <job>-node-<rank>: a DNS label (spec.py keeps job names short enough)
TEXT_BOUNDS = {
    (JobStatus, "phase"): max(map(len, status_model.PHASES)),
    (JobStatus, "reason"): status_model.REASON_LIMIT,
    (JobStatus, "message"): status_model.STATUS_MESSAGE_LIMIT,
    (JobStatus, "podSpecHash"): 16,
    (JobStatus, "startTime"): len("2025-01-01T12:00:00Z"),
    (JobStatus, "completionTime"): len("2025-01-01T12:00:00Z"),
    (FailedNode, "pod"): _POD,
    (FailedNode, "reason"): status_model.REASON_LIMIT,
    (FailedNode, "message"): status_model.FAILED_NODE_MESSAGE_LIMIT,
    (FailureRecord, "time"): len("2025-01-01T12:00:00Z"),
    (FailureRecord, "pod"): _POD,
    (FailureRecord, "nodeName"): status_model.NODE_NAME_LIMIT,
    (FailureRecord, "kind"): max(map(len, status_model.FAILURE_KINDS)),
    (FailureRecord, "restartMode"): max(map(len, contract.RESTART_MODES)),
    (FailureRecord, "reason"): status_model.REASON_LIMIT,
    (FailureRecord, "message"): status_model.FAILURE_MESSAGE_LIMIT,
    (FailureRecord, "error"): status_model.FAILURE_ERROR_LIMIT,
    (NodeState, "pod"): _POD,
    (NodeState, "phase"): status_model.PHASE_LIMIT,
    (NodeState, "reason"): status_model.REASON_LIMIT,
    (NodeState, "message"): status_model.NODE_MESSAGE_LIMIT,
    (NodeState, "nodeName"): status_model.NODE_NAME_LIMIT,
    (Progress, "summary"): len(f"{-2**63}/{-2**63} ({-2**63}%)"),
    (Progress, "eta"): len(f"{2**63}h59m"),
    (Progress, "lastReportTime"): len("2025-01-01T12:00:00Z"),
    (ExcludedNode, "nodeName"): status_model.NODE_NAME_LIMIT,
    (ExcludedNode, "reason"): status_model.REASON_LIMIT,
    (ExcludedNode, "since"): len("2025-01-01T12:00:00Z"),
    (ExcludedNode, "message"): status_model.EXCLUSION_MESSAGE_LIMIT,
    # The percentage of a ratio in [0, 1]; the summary's numbers are a few durations and counts.
    (Goodput, "percent"): len("100%"),
    (Goodput, "summary"): status_model.GOODPUT_SUMMARY_LIMIT,
    (Goodput, "segment"): max(map(len, status_model.GOODPUT_SEGMENTS)),
    (Goodput, "segmentStart"): len("2025-01-01T12:00:00.000Z"),
    (Goodput, "accountedUntil"): len("2025-01-01T12:00:00.000Z"),
    (Condition, "type"): max(map(len, status_model.CONDITION_TYPES)),
    (Condition, "status"): len("Unknown"),
    (Condition, "reason"): status_model.REASON_LIMIT,
    (Condition, "message"): status_model.STATUS_MESSAGE_LIMIT,
    (Condition, "lastTransitionTime"): len("2025-01-01T12:00:00Z"),
}
# The rank sets are computed, not copied: their worst is every other rank of the biggest gang.
COMPUTED_TEXT = {(JobStatus, "observedRanks"), (JobStatus, "succeededRanks")}
WORST_RANKS = rank_ranges(range(0, MAX_NNODES, 2))
# "\x01" is the costliest character in JSON: 6 bytes (\u0001) from any encoder, the API
# server's (Go: at most 6 bytes a character, <, > and & included) and Python's alike.
WORST_CHAR = "\x01"
ETCD_OBJECT_LIMIT = int(1.5 * 1024 * 1024)
STATUS_BUDGET = 512 * 1024  # the whole status, leaving the spec and metadata a megabyte


def records() -> list[type]:
    """The status model's records: every field of these has a bound above."""
    return [JobStatus, FailedNode, FailureRecord, NodeState, Progress, ExcludedNode, Goodput, Condition]


def worst(cls):
    """An instance of ``cls`` with every field at its bound: text of WORST_CHAR, the longest
    numbers, NODES_LISTED nodes, one condition of each type."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        kind = unwrap_optional(hints[f.name])
        if (cls, f.name) in COMPUTED_TEXT:
            values[f.name] = WORST_RANKS
        elif kind is str:
            values[f.name] = WORST_CHAR * TEXT_BOUNDS[cls, f.name]
        elif kind is bool:
            values[f.name] = False
        elif kind is int:
            values[f.name] = -2**63
        elif kind is float:
            values[f.name] = -1.7976931348623157e+308
        elif dataclasses.is_dataclass(kind):
            values[f.name] = worst(kind)
        elif f.name == "nodes":
            values[f.name] = tuple(worst(NodeState) for _ in range(NODES_LISTED))
        elif f.name == "conditions":
            values[f.name] = tuple(worst(Condition) for _ in status_model.CONDITION_TYPES)
        elif f.name == "failureHistory":
            values[f.name] = tuple(worst(FailureRecord) for _ in range(FAILURE_HISTORY_LIMIT))
        elif f.name == "excludedNodes":
            values[f.name] = tuple(worst(ExcludedNode) for _ in range(EXCLUDED_NODES_LIMIT))
        elif f.name == "recentDisruptions":
            values[f.name] = tuple(WORST_CHAR * len("2025-01-01T12:00:00Z") for _ in range(RECENT_DISRUPTIONS_LIMIT))
        else:
            raise AssertionError(f"{cls.__name__}.{f.name}: no worst case known for {kind}")
    return cls(**values)


def json_bytes(status: JobStatus) -> int:
    """The status as JSON, in bytes: the larger of Python's two encodings (at most 6 bytes a
    character of WORST_CHAR either way, as the API server's)."""
    written = {"status": status.to_dict()}
    return max(len(json.dumps(written, ensure_ascii=True).encode()),
               len(json.dumps(written, ensure_ascii=False).encode()))


def worst_valid(cls=JobStatus):
    """``worst`` as the API server admits it: the fields the schema holds to an enum or a
    date-time format take their longest valid value (a little smaller than WORST_CHAR's)."""
    status = worst(cls)
    stamp = "2025-01-01T12:00:00Z"
    conditions = tuple(dataclasses.replace(c, type=t, status="Unknown", lastTransitionTime=stamp)
                       for c, t in zip(status.conditions, status_model.CONDITION_TYPES))
    progress = dataclasses.replace(status.progress, lastReportTime=stamp)
    history = tuple(dataclasses.replace(r, time=stamp, kind=max(status_model.FAILURE_KINDS, key=len),
                                        restartMode=max(contract.RESTART_MODES, key=len))
                    for r in status.failureHistory)
    excluded = tuple(dataclasses.replace(n, since=stamp) for n in status.excludedNodes)
    precise = "2025-01-01T12:00:00.000Z"
    goodput = dataclasses.replace(status.goodput, segment=max(status_model.GOODPUT_SEGMENTS, key=len),
                                  segmentStart=precise, accountedUntil=precise)
    return dataclasses.replace(status, phase=max(status_model.PHASES, key=len), startTime=stamp,
                               completionTime=stamp, conditions=conditions, progress=progress,
                               failureHistory=history, excludedNodes=excluded, goodput=goodput,
                               recentDisruptions=(stamp,) * len(status.recentDisruptions))
