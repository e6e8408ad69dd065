"""The status object: round trip, the ready column, stable conditions."""
from __future__ import annotations

import datetime as dt

import pytest

from ddpjob.api.status import CONDITION_TYPES, FailedNode, JobStatus, NodeState
from ddpjob.controller.status import (
    format_time, parse_time, set_condition, shorten, terminal_reason, truncate, with_phase,
)

pytestmark = pytest.mark.unit

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
T1 = T0 + dt.timedelta(minutes=5)

# Exactly the fields docs/DESIGN-NOTES.md declares (the CRD declares them too).
DESIGN_FIELDS = {"phase", "reason", "message", "ready", "readyNodes", "nnodes", "restarts", "restartAttempt",
                 "podSpecHash", "startTime", "completionTime", "observedGeneration", "failedNode", "progress",
                 "nodes", "conditions"}


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
