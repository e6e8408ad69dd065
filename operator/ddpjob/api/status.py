"""The DDPJob status model: the one source of its shape.

These frozen dataclasses are what the operator writes; ``ddpjob.api.openapi.status_schema``
generates the CRD's ``status`` schema from them (and docs/api.md from that), so the shape is
written once. ``JobStatus.from_dict`` reads what the API server holds; ``JobStatus.to_dict``
writes the body of a merge patch (unset fields as null, so a cleared field is removed). Two
statuses compare equal exactly when the API object would not change, which is how the operator
knows it can skip a write.

How a status moves lives here too, below the shape (pure; ``controller.decide`` calls it): time
stamps, bounded text (next to the limits it enforces), setting a condition, moving to a phase, a
finished job's outcome. Conditions follow the Kubernetes convention: ``lastTransitionTime`` moves
only when a condition's ``status`` changes, never when its reason or message is refreshed.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Iterable, Optional, Sequence

from ddpjob import contract
from ddpjob.api import model
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
#: Held: no pods, by spec.suspend (Suspended) or by Kueue (Queued); nothing counts down.
HELD_PHASES = frozenset({SUSPENDED, QUEUED})
#: An attempt is in progress: the gang exists or is being made (its clocks run).
ACTIVE_PHASES = tuple(p for p in PHASES if p not in TERMINAL_PHASES | HELD_PHASES)

# Condition types, in the order they are listed.
CREATED = "Created"
CONDITION_TYPES = (CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)
CONDITION_STATUSES = ("True", "False", "Unknown")

# Bounds: a status must stay far below etcd's 1.5 MiB object limit whatever the gang's size (up
# to 9999 nodes) and whatever the pods say (a termination message may be 4 KiB; a pod's status
# reason, message and node name are anyone's who may write pod status). The worst case, every
# field at its bound in the costliest characters, is built and measured in
# tests/unit/test_status.py; docs/operator.md ("How big a status gets") gives the sum.
NODE_MESSAGE_LIMIT = 256
FAILED_NODE_MESSAGE_LIMIT = 2048
STATUS_MESSAGE_LIMIT = 1024
#: A reason (CamelCase) copied from a pod or a Kueue condition.
REASON_LIMIT = 64
#: A pod phase as the pod's status says it (the API knows five, all short).
PHASE_LIMIT = 32
#: A Kubernetes node name (a DNS subdomain).
NODE_NAME_LIMIT = 253
#: The most entries ``status.nodes`` lists: past that, the not-healthy ones are listed first and
#: ``unlistedNodes`` counts the rest; ``observedRanks``/``succeededRanks`` keep the per-rank
#: facts the operator decides from, for every node.
NODES_LISTED = 64
#: Failures ``status.failureHistory`` keeps (the newest first), and the text each one keeps.
FAILURE_HISTORY_LIMIT = 10
#: status.failureHistory[].error: the most characters kept (api/repeated_error.ERROR_LIMIT).
FAILURE_ERROR_LIMIT = 160
FAILURE_MESSAGE_LIMIT = 512
#: The most disruption times ``status.recentDisruptions`` holds (spec.MAX_DISRUPTIONS: the
#: window never needs more than failurePolicy.maxDisruptions of them).
RECENT_DISRUPTIONS_LIMIT = 100

#: Whose fault a failure was (``FailureRecord.kind``): the job's own (its code, its
#: configuration, a stall: spends failurePolicy.maxRestarts) or the cluster's (a preemption, an
#: eviction, a lost node, an unhealthy device: spends failurePolicy.maxDisruptions).
APPLICATION = "Application"
DISRUPTION = "Disruption"
FAILURE_KINDS = (APPLICATION, DISRUPTION)

#: Nodes ``status.excludedNodes`` keeps (api/node_exclusion.py), and the words each one keeps.
EXCLUDED_NODES_LIMIT = 16
EXCLUSION_MESSAGE_LIMIT = 256

#: Where the job's wall time goes (``status.goodput.segment``; api/goodput.py).
QUEUED_TIME = "Queued"
STARTING_TIME = "Starting"
TRAINING_TIME = "Training"
RESTARTING_TIME = "Restarting"
SUSPENDED_TIME = "Suspended"
FINISHED_TIME = "Finished"
GOODPUT_SEGMENTS = (QUEUED_TIME, STARTING_TIME, TRAINING_TIME, RESTARTING_TIME, SUSPENDED_TIME, FINISHED_TIME)
GOODPUT_SUMMARY_LIMIT = 256


def status_field(description: str, *, default: Any = None, **schema: Any) -> Any:
    """A status field with its schema facts (description; enum; format) in ``metadata``.

    Status fields are never required and carry no schema default: only the operator writes them.
    """
    return field(default=default, metadata={"description": description, "status": True, **schema})


@dataclass(frozen=True)
class NodeState(model.Record):
    """One node's pod as last observed (``status.nodes[]``)."""

    nodeRank: int = status_field("Node rank.", default=0)
    pod: str = status_field("Pod name.", default="")
    phase: str = status_field("Pod phase.", default="")
    ready: bool = status_field("Whether the pod runs with all containers started.", default=False)
    exitCode: Optional[int] = status_field("Exit code of the trainer container, once terminated.")
    reason: str = status_field("Container terminated or waiting reason.", default="", blank_is_unset=True)
    message: str = status_field("Container message.", default="", blank_is_unset=True)
    nodeName: str = status_field("The Kubernetes node the pod runs on.", default="", blank_is_unset=True)


@dataclass(frozen=True)
class FailedNode(model.Record):
    """The node whose failure decided the outcome (``status.failedNode``)."""

    nodeRank: int = status_field("Node rank of the failed pod.", default=0)
    pod: str = status_field("Pod name.", default="")
    exitCode: Optional[int] = status_field("Exit code of the trainer container.")
    reason: str = status_field(
        "Container terminated reason (Error, OOMKilled, Evicted, Deleted, ...).", default="",
        blank_is_unset=True)
    message: str = status_field(
        "The container's termination message (its last lines, bounded; see docs/security.md).",
        default="", blank_is_unset=True)


@dataclass(frozen=True)
class FailureRecord(model.Record):
    """One failure that restarted the gang or ended the job (``status.failureHistory[]``): the
    culprit, where it ran, and why."""

    time: str = status_field("When the failure was seen (the operator's clock).", default="",
                             format="date-time", blank_is_unset=True)
    attempt: int = status_field("The attempt that failed.", default=0)
    nodeRank: int = status_field("Node rank of the culprit pod.", default=0)
    rank: Optional[int] = status_field(
        "Global rank of the culprit process, where known (the stalled rank of a stall).")
    pod: str = status_field("The culprit pod.", default="", blank_is_unset=True)
    nodeName: str = status_field("The Kubernetes node it ran on, if it was scheduled.", default="",
                                 blank_is_unset=True)
    kind: str = status_field(
        "Application (the job's code or configuration, a stall: spends failurePolicy.maxRestarts) "
        "or Disruption (preemption, eviction, a lost node, an unhealthy device: spends "
        "failurePolicy.maxDisruptions).", default=APPLICATION, enum=FAILURE_KINDS)
    reason: str = status_field(
        "CamelCase reason: Error, OOMKilled, Stalled, Deleted, or the disruption's "
        "(EvictionByEvictionAPI, PreemptionByScheduler, DeletionByTaintManager, NodeLost, "
        "UnhealthyDevice, ...).", default="", blank_is_unset=True)
    exitCode: Optional[int] = status_field("Exit code of the trainer container, if it exited.")
    message: str = status_field(
        f"What happened, in words (the exit code's meaning, the signal, the stalled rank's last "
        f"step, the disruption's message), at most {FAILURE_MESSAGE_LIMIT} characters.",
        default="", blank_is_unset=True)
    restartMode: str = status_field(
        "How the gang restarted after this failure: InPlace (the pods that were left kept running "
        "and started the next attempt's processes; the others were recreated) or Recreate (every "
        "pod deleted and created again). Empty: the failure ended the job.",
        default="", blank_is_unset=True, enum=contract.RESTART_MODES)
    error: str = status_field(
        "The Python exception the culprit's termination message names, where the failure was "
        "an exit of the code's own before the attempt trained (what failurePolicy."
        "repeatedErrorAttempts compares; api/repeated_error.py).", default="", blank_is_unset=True)


@dataclass(frozen=True)
class ExcludedNode(model.Record):
    """A Kubernetes node the job's next pods avoid (``status.excludedNodes[]``): it was implicated
    in failurePolicy.excludeNodeAfterFailures of the job's failures (api/node_exclusion.py)."""

    nodeName: str = status_field("The Kubernetes node (its kubernetes.io/hostname).", default="")
    failures: int = status_field("Failures of the job that implicated it (in failureHistory).", default=0)
    reason: str = status_field("The reason of the last of them (Error, OOMKilled, NodeLost, ...).",
                               default="", blank_is_unset=True)
    since: str = status_field("When it was excluded (the operator's clock).", default="",
                              format="date-time", blank_is_unset=True)
    message: str = status_field(
        f"The failures, in words, at most {EXCLUSION_MESSAGE_LIMIT} characters.", default="",
        blank_is_unset=True)


@dataclass(frozen=True)
class Goodput(model.Record):
    """Where the job's wall time went (``status.goodput``; docs/operator.md, "Goodput"). Every
    number counts from the operator's first sight of the job and moves at the passes that see
    a change: a new phase, a progress report, the end."""

    percent: str = status_field("trainingSeconds / wallSeconds as a percentage, for kubectl get -o wide.",
                                default="", blank_is_unset=True)
    ratio: float = status_field("trainingSeconds / wallSeconds (0 to 1).", default=0.0)
    summary: str = status_field(
        "In words: \"training 93% of 2h10m; 3 restarts cost 6m, 410 steps re-done\".", default="",
        blank_is_unset=True)
    wallSeconds: float = status_field("Seconds accounted so far: the sum of the five below.", default=0.0)
    trainingSeconds: float = status_field(
        "Seconds an attempt trained: from its first progress report to its end.", default=0.0)
    queuedSeconds: float = status_field("Seconds waiting for Kueue (phase Queued).", default=0.0)
    startingSeconds: float = status_field(
        "Seconds from the job's (or a resumed job's) gang being made to its first progress report: "
        "scheduling, image pulls, rendezvous, the program's start.", default=0.0)
    restartingSeconds: float = status_field(
        "Seconds lost to restarts: from each failure seen to the next attempt's first progress report.",
        default=0.0)
    suspendedSeconds: float = status_field("Seconds held by spec.suspend.", default=0.0)
    restarts: int = status_field("Gang restarts after failures (restarts + disruptions) accounted.", default=0)
    lastRestartSeconds: Optional[float] = status_field(
        "The last restart that reached a first progress report: its seconds.")
    stepsRedone: int = status_field(
        "Steps trained again after restarts: per resumed attempt, the highest step reported before "
        "less the step its first report resumed at (the steps since the last checkpoint).", default=0)
    highestStep: Optional[int] = status_field("The highest step any attempt reported (unset: none yet).")
    firstStep: Optional[int] = status_field(
        "The step of the job's first progress report, while every report since was at it: no "
        "step was trained and the goodput claims no percentage. Unset once a report was at "
        "another step (or before the first).")
    suggestedCheckpointIntervalSeconds: Optional[float] = status_field(
        "The checkpoint interval that would lose the least time at the failure rate seen so far "
        "(Young/Daly, from progress.checkpointSeconds and the job's running seconds per restart; "
        "api/checkpoint_advice.py). Unset until a restart and a reported checkpoint cost.")
    segment: str = status_field("Where the time goes now.", default="", enum=GOODPUT_SEGMENTS,
                                blank_is_unset=True)
    segmentStart: str = status_field("When the current segment began.", default="", format="date-time",
                                     blank_is_unset=True)
    accountedUntil: str = status_field("The time the numbers count up to.", default="", format="date-time",
                                       blank_is_unset=True)


@dataclass(frozen=True)
class Progress(model.Record):
    """Training progress as the ranks last reported it (``status.progress``)."""

    summary: str = status_field("<step>/<totalSteps> (<percent>%), for kubectl get.", default="",
                                blank_is_unset=True)
    eta: str = status_field("Estimated time left while Running (e.g. 1h05m), for kubectl get.",
                            default="", blank_is_unset=True)
    step: int = status_field("The highest step any rank reported.", default=0)
    totalSteps: Optional[int] = status_field("Steps of the whole run, if reported.")
    epoch: Optional[int] = status_field("Current epoch (from 1), if reported.")
    epochs: Optional[int] = status_field("Epochs of the run, if reported.")
    loss: Optional[float] = status_field("The last loss reported.")
    throughput: Optional[float] = status_field("Samples per second, as last reported.")
    etaSeconds: Optional[int] = status_field("Seconds left at the current pace, while Running.")
    lastReportTime: Optional[str] = status_field(
        "When a rank last reported progress (the operator's clock).", format="date-time",
        blank_is_unset=True)
    ranksReporting: int = status_field("Ranks that have reported in this attempt.", default=0)
    attempt: int = status_field("The attempt the reports come from.", default=0)
    checkpointSeconds: Optional[float] = status_field(
        "Seconds the last periodic checkpoint held training up, as the slowest rank reported it "
        "(programs that report it: ddptrain does).")
    checkpointIntervalSeconds: Optional[float] = status_field(
        "Seconds between the last two periodic checkpoints, as reported.")


@dataclass(frozen=True)
class Condition(model.Record):
    type: str = status_field("One of " + ", ".join(CONDITION_TYPES) + ".", default="")
    status: str = status_field("True, False or Unknown.", default="Unknown",
                               enum=CONDITION_STATUSES)
    reason: str = status_field("CamelCase machine reason.", default="")
    message: str = status_field("One human sentence.", default="")
    lastTransitionTime: str = status_field("When the status last changed.", default="",
                                           format="date-time")


@dataclass(frozen=True)
class JobStatus(model.Record):
    """What the operator observed; written only by the operator."""

    # Written as a merge patch: an unset field is null, so that the API server removes it.
    phase: str = status_field("Where the job is.", default="", enum=PHASES, blank_is_unset=True,
                              patch_null=True)
    reason: str = status_field(
        "CamelCase machine reason for the phase, e.g. PodFailedPermanent, StartupTimeout, "
        "Stalled, RestartBudgetExhausted, DeadlineExceeded, ReconcileError, AllNodesSucceeded.", default="",
        blank_is_unset=True, patch_null=True)
    message: str = status_field("One human sentence about the phase.", default="", blank_is_unset=True,
                                patch_null=True)
    readyNodes: int = status_field("Pods Running with all containers started.", default=0)
    nnodes: int = status_field("Nodes (pods) of the job.", default=0)
    restarts: int = status_field(
        "Gang restarts after failures of the job's own so far (failurePolicy.maxRestarts).", default=0)
    disruptions: int = status_field(
        "Gang restarts after disruptions so far (preemption, eviction, a lost node, an unhealthy "
        "device: failurePolicy.maxDisruptions); not counted in restarts.", default=0)
    recentDisruptions: tuple[str, ...] = status_field(
        "When each disruption restart still inside failurePolicy.disruptionWindowSeconds "
        f"happened, oldest first (at most {RECENT_DISRUPTIONS_LIMIT}).", default=(),
        format="date-time", max_items=RECENT_DISRUPTIONS_LIMIT)
    restartAttempt: int = status_field(
        f"Attempt of the current pods (label {names.LABEL_RESTART_ATTEMPT}).", default=0)
    podSpecHash: str = status_field(
        "Fingerprint of the spec the current attempt's pods were built from (every spec field "
        "but suspend, activeDeadlineSeconds, ttlSecondsAfterFinished, cleanPodPolicy and "
        "failurePolicy); a spec changed since applies to the next attempt.", default="",
        blank_is_unset=True, patch_null=True)
    startTime: Optional[str] = status_field("When the job started.", format="date-time",
                                            blank_is_unset=True, patch_null=True)
    completionTime: Optional[str] = status_field("When the job Succeeded or Failed.", format="date-time",
                                                 blank_is_unset=True, patch_null=True)
    observedGeneration: Optional[int] = status_field(
        "The metadata.generation the status describes.", patch_null=True)
    failedNode: Optional[FailedNode] = status_field(
        "The node whose failure decided the outcome.", patch_null=True)
    failureHistory: tuple[FailureRecord, ...] = status_field(
        f"The last {FAILURE_HISTORY_LIMIT} failures that restarted the gang or ended the job, the "
        "newest first: the culprit rank, pod and node, and why.", default=(),
        max_items=FAILURE_HISTORY_LIMIT)
    progress: Optional[Progress] = status_field(
        "Training progress, when the program reports it (docs/contract.md, Progress).", patch_null=True)
    excludedNodes: tuple[ExcludedNode, ...] = status_field(
        "Kubernetes nodes the next attempts' pods avoid (a required node affinity), each implicated in "
        f"failurePolicy.excludeNodeAfterFailures of the job's failures; at most {EXCLUDED_NODES_LIMIT}, "
        "the newest kept.", default=(), max_items=EXCLUDED_NODES_LIMIT)
    goodput: Optional[Goodput] = status_field(
        "Where the job's wall time went: training, queued, starting, restarting (docs/operator.md, "
        "Goodput).", patch_null=True)
    nodes: tuple[NodeState, ...] = status_field(
        f"The nodes' pods as last observed, in rank order: every node of a gang of up to {NODES_LISTED}; "
        f"of a bigger one, {NODES_LISTED} entries, the not-healthy nodes first (failed, deleted, "
        "waiting, not ready), then the lowest ranks; unlistedNodes counts the others.", default=())
    unlistedNodes: int = status_field(
        f"Nodes of the attempt not listed in nodes (it lists at most {NODES_LISTED}).", default=0)
    observedRanks: str = status_field(
        "Ranks of the current attempt whose pod the operator has observed, as ranges (0-3,5): one "
        "that is gone without the operator deleting it fails the attempt.", default="",
        blank_is_unset=True, patch_null=True)
    succeededRanks: str = status_field(
        "Ranks of the current attempt whose pod succeeded, as ranges (0-3,5): a finished pod "
        "cleaned up since still counts as succeeded.", default="", blank_is_unset=True, patch_null=True)
    conditions: tuple[Condition, ...] = status_field(
        "Conditions of types " + ", ".join(CONDITION_TYPES) + ".", default=())

    #: Fields computed from others (properties below), written for the printer columns:
    #: (name, the field it follows, its schema).
    COMPUTED: ClassVar[tuple[tuple[str, str, dict], ...]] = (
        ("ready", "message", {"description": "<readyNodes>/<nnodes>, for kubectl get.", "type": "string"}),)

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


# ---------------------------------------------------------------------------------------------
# Bounded text (the limits are at the top of this module)
# ---------------------------------------------------------------------------------------------
def truncate(text: str, limit: int) -> str:
    """Keep the end of long container output: a traceback's last lines say what went wrong.
    The cut falls at the start of a line where one is near."""
    text = text.strip()
    if len(text) <= limit:
        return text
    kept = text[-(limit - 3):]
    newline = kept.find("\n")
    if 0 <= newline < len(kept) // 4:
        kept = kept[newline + 1:]
    return "..." + kept


def shorten(text: str, limit: int) -> str:
    """Keep the beginning of a long sentence of ours (a status message, an API error): it says
    what the job is doing ("0/64 node(s) started; ..."); the details trail."""
    text = text.strip()
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def rank_ranges(ranks: Iterable[int]) -> str:
    """``0-3,5,7-9``: a set of ranks, compact (a 9999-node gang's worst, every other rank, is
    about 24 KiB; a contiguous set is one range)."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for rank in ordered + [None]:
        if start is not None and (rank is None or rank != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if rank is not None and start is None:
            start = rank
        prev = rank
    return ",".join(parts)


def parse_rank_ranges(text: str, below: int) -> frozenset[int]:
    """The ranks ``rank_ranges`` wrote, those under ``below`` (the gang's size); a part that does
    not read is skipped (the status is the operator's own, but is read leniently)."""
    ranks: set[int] = set()
    for part in (text or "").split(","):
        first, _, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if last else low
        except ValueError:
            continue
        ranks.update(range(max(low, 0), min(high, below - 1) + 1))
    return frozenset(ranks)


def listed(items: Sequence[str], shown: int) -> str:
    """``a, b, c and 7 more``: the first ``shown`` items of a list a message names."""
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {more} more" if more > 0 else "")


# ---------------------------------------------------------------------------------------------
# The nodes of an attempt (bounded: NODES_LISTED)
# ---------------------------------------------------------------------------------------------
def _health(node: NodeState) -> int:
    """0: failed or gone (any phase but these three); 1: waiting or not ready; 2: healthy."""
    if node.ready or node.phase == SUCCEEDED:
        return 2
    return 1 if node.phase in (PENDING, RUNNING) else 0


def with_nodes(status: JobStatus, nodes: Sequence[NodeState]) -> JobStatus:
    """``status`` with the attempt's ``nodes`` (one per rank observed, this pass or before):
    readyNodes and the rank sets count them all; ``status.nodes`` lists at most NODES_LISTED,
    the not-healthy first, in rank order."""
    shown = sorted(nodes, key=lambda n: (_health(n), n.nodeRank))[:NODES_LISTED]
    return replace(status, nodes=tuple(sorted(shown, key=lambda n: n.nodeRank)),
                   unlistedNodes=len(nodes) - len(shown), readyNodes=sum(1 for n in nodes if n.ready),
                   observedRanks=rank_ranges(n.nodeRank for n in nodes),
                   succeededRanks=rank_ranges(n.nodeRank for n in nodes if n.phase == SUCCEEDED))


def without_nodes(status: JobStatus) -> JobStatus:
    """``status`` with no node of an attempt recorded (a new attempt, a held job)."""
    return replace(status, nodes=(), unlistedNodes=0, readyNodes=0, observedRanks="", succeededRanks="")


def recorded_nodes(status: JobStatus) -> tuple[dict[int, NodeState], frozenset[int], frozenset[int]]:
    """What ``with_nodes`` recorded of the attempt: the listed entries by rank, the ranks
    observed and the ranks succeeded (of every node, listed or not; a status written before the
    rank sets existed lists every node, so its entries count too)."""
    listed_nodes = {n.nodeRank: n for n in status.nodes}
    observed = parse_rank_ranges(status.observedRanks, status.nnodes) | listed_nodes.keys()
    succeeded = parse_rank_ranges(status.succeededRanks, status.nnodes) | {
        r for r, n in listed_nodes.items() if n.phase == SUCCEEDED}
    return listed_nodes, frozenset(observed), frozenset(succeeded)


# ---------------------------------------------------------------------------------------------
# Failures (bounded: FAILURE_HISTORY_LIMIT, RECENT_DISRUPTIONS_LIMIT)
# ---------------------------------------------------------------------------------------------
def with_failure(status: JobStatus, record: FailureRecord) -> JobStatus:
    """``status`` with ``record`` at the head of the failure history (its text bounded; the
    oldest entries beyond FAILURE_HISTORY_LIMIT dropped)."""
    record = replace(record, pod=shorten(record.pod, NODE_NAME_LIMIT), reason=shorten(record.reason, REASON_LIMIT),
                     nodeName=shorten(record.nodeName, NODE_NAME_LIMIT),
                     message=shorten(record.message, FAILURE_MESSAGE_LIMIT),
                     error=shorten(record.error, FAILURE_ERROR_LIMIT))
    return replace(status, failureHistory=((record,) + status.failureHistory)[:FAILURE_HISTORY_LIMIT])


def disruptions_within(status: JobStatus, now: dt.datetime, window_seconds: float) -> tuple[str, ...]:
    """The recorded disruption times that fall inside the window ending ``now`` (oldest first;
    a time that does not read is dropped)."""
    kept = []
    for text in status.recentDisruptions:
        moment = parse_time(text)
        if moment is not None and (now - moment).total_seconds() < window_seconds:
            kept.append(format_time(moment))
    return tuple(kept)


def with_disruption(status: JobStatus, now: dt.datetime, window_seconds: float) -> JobStatus:
    """``status`` after one more disruption restart at ``now``: counted in ``disruptions`` and
    remembered in ``recentDisruptions`` (only those inside the window, at most
    RECENT_DISRUPTIONS_LIMIT, the newest kept)."""
    recent = (disruptions_within(status, now, window_seconds) + (format_time(now),))[-RECENT_DISRUPTIONS_LIMIT:]
    return replace(status, disruptions=status.disruptions + 1, recentDisruptions=recent)


# ---------------------------------------------------------------------------------------------
# Conditions and phases
# ---------------------------------------------------------------------------------------------
# The phases that have a condition of the same name.
_PHASE_CONDITIONS = tuple(t for t in CONDITION_TYPES if t in PHASES)


def set_condition(conditions: tuple[Condition, ...], type_: str, status: bool, reason: str,
                  message: str, now: dt.datetime) -> tuple[Condition, ...]:
    """``conditions`` with ``type_`` set; its lastTransitionTime moves only if status flips."""
    value = "True" if status else "False"
    reason, message = shorten(reason, REASON_LIMIT), shorten(message, STATUS_MESSAGE_LIMIT)
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
    reason, message = shorten(reason, REASON_LIMIT), shorten(message, STATUS_MESSAGE_LIMIT)
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
