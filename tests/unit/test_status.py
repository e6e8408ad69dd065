"""The status object: round trip, the ready column, stable conditions."""
from __future__ import annotations

import datetime as dt

import pytest

from ddpjob.api.status import (
    CONDITION_TYPES, FailedNode, JobStatus, NodeState, format_time, parse_time, set_condition, shorten,
    terminal_reason, truncate, with_phase,
)

pytestmark = pytest.mark.unit

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
T1 = T0 + dt.timedelta(minutes=5)

# Exactly the fields docs/DESIGN-NOTES.md declares (the CRD declares them too).
DESIGN_FIELDS = {"phase", "reason", "message", "ready", "readyNodes", "nnodes", "restarts", "disruptions",
                 "recentDisruptions", "failureHistory", "restartAttempt",
                 "podSpecHash", "startTime", "completionTime", "observedGeneration", "failedNode", "progress",
                 "excludedNodes", "goodput", "nodes", "unlistedNodes", "observedRanks", "succeededRanks", "conditions"}


def test_ready_is_ready_nodes_over_nodes():
    assert JobStatus(readyNodes=3, nnodes=4).ready == "3/4"
    assert JobStatus(readyNodes=3, nnodes=4).to_dict()["ready"] == "3/4"


def test_to_dict_writes_exactly_the_declared_fields():
    status = with_phase(JobStatus(nnodes=2, failedNode=FailedNode(1, "p", 1, "Error", "m"),
                                  nodes=(NodeState(0, "p0", "Running", True, nodeName="n"),)), "Running", "R", "m", T0)
    out = status.to_dict()
    assert set(out) == DESIGN_FIELDS
    assert set(out["failedNode"]) <= {"nodeRank", "pod", "exitCode", "reason", "message"}
    assert set(out["nodes"][0]) <= {"nodeRank", "pod", "phase", "ready", "exitCode", "reason", "message", "nodeName"}
    assert set(out["conditions"][0]) == {"type", "status", "reason", "message", "lastTransitionTime"}


def test_round_trip_is_exact_so_unchanged_status_is_not_rewritten():
    status = with_phase(JobStatus(nnodes=2, restarts=1, restartAttempt=1, startTime=format_time(T0),
                                  observedGeneration=4, failedNode=FailedNode(1, "p", None, "Evicted"),
                                  nodes=(NodeState(0, "p0", "Running", True, exitCode=None),
                                         NodeState(1, "p1", "Failed", False, 1, "Error", "boom", "n1"))),
                        "Restarting", "RetryableFailure", "node 1 failed", T0, created=False)
    assert JobStatus.from_dict(status.to_dict()) == status


def test_unset_fields_are_null_so_a_merge_patch_removes_them():
    out = JobStatus(nnodes=1).to_dict()
    assert out["completionTime"] is None and out["failedNode"] is None and out["phase"] is None


def test_empty_status_reads_as_a_new_job():
    assert JobStatus.from_dict(None) == JobStatus() and JobStatus.from_dict({}).phase == ""


def test_every_condition_type_is_listed_in_order():
    status = with_phase(JobStatus(), "Pending", "PodsCreated", "created", T0, created=True)
    assert [c.type for c in status.conditions] == list(CONDITION_TYPES)
    assert status.is_true("Created") and not status.is_true("Running")
    assert status.condition("Running").reason == "Pending"  # not yet: the phase says why


def test_last_transition_time_moves_only_when_the_status_flips():
    conds = set_condition((), "Running", True, "AllNodesRunning", "2/2", T0)
    conds = set_condition(conds, "Running", True, "AllNodesRunning", "1/2 running, 1 succeeded", T1)
    assert conds[0].lastTransitionTime == format_time(T0) and conds[0].message == "1/2 running, 1 succeeded"
    conds = set_condition(conds, "Running", False, "RetryableFailure", "node 1 failed", T1)
    assert conds[0].lastTransitionTime == format_time(T1) and conds[0].status == "False"


def test_leaving_a_phase_flips_its_condition_with_the_reason():
    running = with_phase(JobStatus(), "Running", "AllNodesRunning", "2/2", T0)
    restarting = with_phase(running, "Restarting", "RetryableFailure", "node 1 exited with code 1", T1)
    cond = restarting.condition("Running")
    assert (cond.status, cond.reason, cond.lastTransitionTime) == ("False", "RetryableFailure", format_time(T1))
    assert restarting.condition("Succeeded").lastTransitionTime == format_time(T0)  # never True: untouched


def test_terminal_reason_survives_a_later_reconcile_error():
    failed = with_phase(JobStatus(), "Failed", "StartupTimeout", "pods pending", T0)
    errored = JobStatus.from_dict({**failed.to_dict(), "reason": "ReconcileError", "message": "503"})
    assert terminal_reason(errored) == ("StartupTimeout", "pods pending")


def test_times_are_rfc3339_utc():
    assert format_time(T0) == "2025-01-01T12:00:00Z"
    assert parse_time("2025-01-01T12:00:00Z") == T0 and parse_time("") is None and parse_time("garbage") is None


def test_truncate_keeps_the_end():
    assert truncate("x" * 10 + "the cause", 12) == "...the cause"
    assert truncate(" short ", 12) == "short"


def test_shorten_keeps_the_beginning():
    assert shorten("2/64 node(s) started; " + "x" * 100, 30) == "2/64 node(s) started; xxxxx..."
    assert shorten(" short ", 12) == "short"


def test_a_status_message_is_cut_at_its_end():
    status = with_phase(JobStatus(), "Pending", "NodesPending", "0/64 node(s) started; " + "y" * 5000, T0)
    assert len(status.message) == 1024 and status.message.startswith("0/64 node(s) started; ")
    assert status.condition("Running").message == "" or status.condition("Running").message.startswith("0/64")


# --- how big a status gets (docs/operator.md, "How big a status gets") --------------------------
from ddpjob.api.spec import MAX_NNODES  # noqa: E402
from ddpjob.api.status import (  # noqa: E402
    FAILURE_HISTORY_LIMIT, FAILURE_MESSAGE_LIMIT, NODES_LISTED, RECENT_DISRUPTIONS_LIMIT, FailureRecord,
    disruptions_within, parse_rank_ranges, rank_ranges, with_disruption, with_failure, with_nodes,
)
from tests.support.status_bounds import (  # noqa: E402
    COMPUTED_TEXT, ETCD_OBJECT_LIMIT, STATUS_BUDGET, TEXT_BOUNDS, WORST_RANKS, json_bytes, records, worst,
)


def test_every_text_field_has_a_bound():
    import dataclasses
    import typing
    from ddpjob.api.model import unwrap_optional
    unbounded = [f"{cls.__name__}.{f.name}" for cls in records() for f in dataclasses.fields(cls)
                 if unwrap_optional(typing.get_type_hints(cls)[f.name]) is str
                 and (cls, f.name) not in TEXT_BOUNDS and (cls, f.name) not in COMPUTED_TEXT]
    assert not unbounded


def test_the_worst_status_of_the_biggest_gang_is_far_below_the_etcd_object_limit():
    status = worst(JobStatus)
    assert len(status.nodes) == NODES_LISTED and len(WORST_RANKS) > 20_000
    assert len(status.failureHistory) == FAILURE_HISTORY_LIMIT
    assert len(status.recentDisruptions) == RECENT_DISRUPTIONS_LIMIT
    size = json_bytes(status)
    assert size < STATUS_BUDGET < ETCD_OBJECT_LIMIT, size


def test_with_nodes_lists_at_most_the_bound_whatever_the_gang():
    nodes = [NodeState(r, f"j-node-{r}", "Failed", False, 1, "Error", "m") for r in range(MAX_NNODES)]
    status = with_nodes(JobStatus(nnodes=MAX_NNODES), nodes)
    assert len(status.nodes) == NODES_LISTED and status.unlistedNodes == MAX_NNODES - NODES_LISTED
    assert status.observedRanks == f"0-{MAX_NNODES - 1}" and status.succeededRanks == ""


def test_with_nodes_lists_the_not_healthy_first_in_rank_order():
    healthy = [NodeState(r, f"j-node-{r}", "Running", True) for r in range(100)]
    waiting = [NodeState(r, f"j-node-{r}", "Pending", False) for r in range(100, 130)]
    broken = [NodeState(r, f"j-node-{r}", "Failed", False, 1) for r in range(200, 240)]
    status = with_nodes(JobStatus(nnodes=240), healthy + waiting + broken)
    listed = [n.nodeRank for n in status.nodes]
    # Every failed node first, then the waiting ones by rank while room is left; no healthy one.
    assert listed == sorted(listed)
    assert set(listed) == set(range(200, 240)) | set(range(100, 124))
    assert status.readyNodes == 100 and status.unlistedNodes == 170 - NODES_LISTED


def test_a_small_gang_lists_every_node_as_before():
    nodes = [NodeState(r, f"j-node-{r}", "Failed" if r == 3 else "Running", r != 3) for r in range(NODES_LISTED)]
    status = with_nodes(JobStatus(nnodes=NODES_LISTED), nodes)
    assert list(status.nodes) == nodes and status.unlistedNodes == 0


@pytest.mark.parametrize("ranks, text", [
    ((), ""), ((0,), "0"), ((0, 1, 2, 3, 5, 7, 8, 9), "0-3,5,7-9"), ((9998, 0), "0,9998"),
])
def test_rank_ranges_round_trip(ranks, text):
    assert rank_ranges(ranks) == text
    assert parse_rank_ranges(text, 9999) == frozenset(ranks)


def test_rank_ranges_are_read_leniently_and_within_the_gang():
    assert parse_rank_ranges("0-2,x,7-,9-3,5-999999999", 8) == {0, 1, 2, 5, 6, 7}


# --- failures: the history and the disruption window (bounded) ---------------------------------
def test_the_failure_history_keeps_the_newest_first_and_at_most_its_bound():
    status = JobStatus()
    for attempt in range(FAILURE_HISTORY_LIMIT + 5):
        status = with_failure(status, FailureRecord(attempt=attempt, message="x" * 5000, reason="R" * 500))
    assert [r.attempt for r in status.failureHistory] == list(range(FAILURE_HISTORY_LIMIT + 4, 4, -1))
    assert all(len(r.message) <= FAILURE_MESSAGE_LIMIT and len(r.reason) <= 64 for r in status.failureHistory)


def test_the_disruption_window_slides_and_stays_bounded():
    import datetime as dt
    t0 = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    status = JobStatus()
    for minute in range(0, 50, 10):  # disruptions at 0, 10, 20, 30, 40 minutes
        status = with_disruption(status, t0 + dt.timedelta(minutes=minute), window_seconds=1800)
    assert status.disruptions == 5  # the total never forgets
    # at minute 40 the window (30 min) holds those of minutes 20, 30 and 40
    assert status.recentDisruptions == tuple(format_time(t0 + dt.timedelta(minutes=m)) for m in (20, 30, 40))
    assert disruptions_within(status, t0 + dt.timedelta(minutes=65), 1800) == (format_time(t0 + dt.timedelta(minutes=40)),)
    for second in range(RECENT_DISRUPTIONS_LIMIT + 20):
        status = with_disruption(status, t0 + dt.timedelta(hours=2, seconds=second), window_seconds=86400)
    assert len(status.recentDisruptions) == RECENT_DISRUPTIONS_LIMIT
    # a time that does not read (the status is read leniently) is dropped, not a crash
    assert disruptions_within(JobStatus(recentDisruptions=("nonsense",)), t0, 60) == ()
