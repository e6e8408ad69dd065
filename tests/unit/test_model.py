"""The model kit's codec (api/model.py) on the status: exactly what the hand-written
``to_dict``/``from_dict`` pairs of api/status.py wrote and read before the codec replaced them.

The expected dicts below were produced by those hand-written methods (commit 3f055cc); a change
here is a change of what the operator writes to the API server.
"""
from __future__ import annotations

import pytest

from ddpjob.api import model
from ddpjob.api.status import Condition, FailedNode, JobStatus, NodeState, Progress
from ddpjob.api.validation import parse_ddpjob
from tests.support.manifests import good_manifest_table

pytestmark = pytest.mark.unit

T0, T1, T2 = "2025-01-01T12:00:00Z", "2025-01-01T12:04:00Z", "2025-01-01T12:05:00Z"

FULL = JobStatus(
    phase="Failed", reason="PodFailedPermanent", message="node 1 exited with code 2", readyNodes=1,
    nnodes=2, restarts=1, restartAttempt=1, podSpecHash="abc", startTime=T0, completionTime=T2,
    observedGeneration=3, failedNode=FailedNode(1, "j-node-1", 2, "Error", "bad flag"),
    progress=Progress(summary="5/10 (50%)", eta="", step=5, totalSteps=10, loss=0.5, lastReportTime=T1,
                      ranksReporting=2, attempt=1),
    nodes=(NodeState(0, "j-node-0", "Running", True), NodeState(1, "j-node-1", "Failed", False, 2, "Error", "", "n1")),
    conditions=(Condition("Created", "True", "PodsCreated", "created", T0), Condition()))

FULL_WRITTEN = {
    "phase": "Failed", "reason": "PodFailedPermanent", "message": "node 1 exited with code 2",
    "ready": "1/2", "readyNodes": 1, "nnodes": 2, "restarts": 1,
    # Added with the disruption budget (issue 23): always written, 0 and [] included.
    "disruptions": 0, "recentDisruptions": [], "restartAttempt": 1,
    "podSpecHash": "abc", "startTime": T0, "completionTime": T2, "observedGeneration": 3,
    "failedNode": {"nodeRank": 1, "pod": "j-node-1", "exitCode": 2, "reason": "Error", "message": "bad flag"},
    "failureHistory": [],
    # eta "" is left out; step, ranksReporting and attempt are written even when 0.
    "progress": {"summary": "5/10 (50%)", "step": 5, "totalSteps": 10, "loss": 0.5, "lastReportTime": T1,
                 "ranksReporting": 2, "attempt": 1},
    # Added with bad-node avoidance and goodput (issue 23): [] and null when unset.
    "excludedNodes": [], "goodput": None,
    # pod and phase are always written; exitCode when set (0 too); reason, message, nodeName when not blank.
    "nodes": [{"nodeRank": 0, "pod": "j-node-0", "phase": "Running", "ready": True},
              {"nodeRank": 1, "pod": "j-node-1", "phase": "Failed", "ready": False, "exitCode": 2,
               "reason": "Error", "nodeName": "n1"}],
    # The rank sets are unset here (null: removed); the count is always written.
    "unlistedNodes": 0, "observedRanks": None, "succeededRanks": None,
    # A condition writes every field, blank or not.
    "conditions": [{"type": "Created", "status": "True", "reason": "PodsCreated", "message": "created",
                    "lastTransitionTime": T0},
                   {"type": "", "status": "Unknown", "reason": "", "message": "", "lastTransitionTime": ""}],
}

# A merge patch: every unset top-level field is null, so the API server removes it.
EMPTY_WRITTEN = {
    "phase": None, "reason": None, "message": None, "ready": "0/0", "readyNodes": 0, "nnodes": 0,
    "restarts": 0, "disruptions": 0, "recentDisruptions": [], "restartAttempt": 0, "podSpecHash": None,
    "startTime": None, "completionTime": None, "observedGeneration": None, "failedNode": None,
    "failureHistory": [], "progress": None, "excludedNodes": [], "goodput": None, "nodes": [],
    "unlistedNodes": 0, "observedRanks": None, "succeededRanks": None, "conditions": [],
}


def test_a_full_status_is_written_as_before_in_the_same_key_order():
    written = FULL.to_dict()
    assert written == FULL_WRITTEN
    assert list(written) == list(FULL_WRITTEN)  # "ready" right after "message"
    assert list(written["nodes"][1]) == list(FULL_WRITTEN["nodes"][1])
    assert model.to_plain(FULL) == written  # the methods are the codec, nothing else


def test_an_empty_status_is_a_merge_patch_of_nulls():
    assert JobStatus().to_dict() == EMPTY_WRITTEN


def test_nested_objects_leave_unset_fields_out_instead_of_null():
    written = JobStatus(progress=Progress(), failedNode=FailedNode(exitCode=0)).to_dict()
    assert written["failedNode"] == {"nodeRank": 0, "pod": "", "exitCode": 0}
    assert written["progress"] == {"step": 0, "ranksReporting": 0, "attempt": 0}
    assert FailedNode(1, "p").to_dict() == {"nodeRank": 1, "pod": "p"}


def test_what_is_written_reads_back_equal():
    assert JobStatus.from_dict(FULL.to_dict()) == FULL
    assert JobStatus.from_dict(JobStatus().to_dict()) == JobStatus()


@pytest.mark.parametrize("held", [None, {}, {"phase": None, "nodes": None, "conditions": None}])
def test_nothing_or_nulls_read_as_a_new_job(held):
    assert JobStatus.from_dict(held) == JobStatus()


def test_reading_is_lenient_as_before():
    held = {"phase": None, "readyNodes": None, "nnodes": "2", "restarts": "", "startTime": "",
            "failedNode": {}, "progress": {}, "nodes": None}
    assert JobStatus.from_dict(held) == JobStatus(nnodes=2)
    held = {"nodes": [{"nodeRank": "1", "exitCode": 0}], "conditions": [{"type": "Running"}],
            "failedNode": {"pod": "p"}, "progress": {"step": "4", "loss": 1, "lastReportTime": ""},
            "observedGeneration": 0}
    assert JobStatus.from_dict(held) == JobStatus(
        observedGeneration=0, failedNode=FailedNode(pod="p"), progress=Progress(step=4, loss=1.0),
        nodes=(NodeState(nodeRank=1, exitCode=0),), conditions=(Condition(type="Running"),))
    assert isinstance(JobStatus.from_dict(held).progress.loss, float)


@pytest.mark.parametrize("name,manifest", good_manifest_table(), ids=[n for n, _ in good_manifest_table()])
def test_the_same_codec_reads_and_writes_the_spec(name, manifest):
    job = parse_ddpjob(manifest)
    assert model.from_plain(type(job.spec), model.to_plain(job.spec)) == job.spec


def test_a_merge_patch_removes_what_the_new_value_leaves_out_at_every_depth():
    held = {"phase": "Running", "progress": {"eta": "1s", "step": 28}, "nodes": [{"a": 1}], "old": 1}
    assert model.merge_patch({"phase": "Succeeded", "progress": {"step": 29}, "nodes": []}, held, None) == \
        {"phase": "Succeeded", "progress": {"step": 29, "eta": None}, "nodes": [], "old": None}
    # A key either held version had is removed; one the new value sets is never nulled.
    assert model.merge_patch({"a": 1}, {"b": 1}, {"c": {"d": 1}}) == {"a": 1, "b": None, "c": None}
    assert model.merge_patch({"p": {"x": 1}}, {"p": {"y": 1}}, {"p": {"z": 1}}) == {"p": {"x": 1, "y": None, "z": None}}
