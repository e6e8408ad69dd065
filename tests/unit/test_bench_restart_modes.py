"""benchmarks/restart_modes.py: reading the next attempt's milestones from rank 0's log."""
from __future__ import annotations

import json

import pytest

from benchmarks.restart_modes import json_events, next_attempt_milestones


def _log(*events: dict) -> str:
    lines = ["ddptrain-pod: attempt 1 starts (run abc)", "not json {"]
    return "\n".join(lines + [json.dumps(e) for e in events])


def test_the_attempt_after_the_kill_is_read_and_its_phases_counted_back_from_its_start_line():
    log = _log(
        {"event": "start", "time": 90.0, "step": 0},             # attempt 0: before the kill
        {"event": "progress", "time": 91.0, "step": 1},
        {"event": "progress", "time": 100.5, "step": 44},        # attempt 0's last line, after it
        {"event": "start", "time": 110.0, "step": 40, "startup_import_s": 3.0, "startup_rendezvous_s": 1.0,
         "startup_data_s": 0.5, "startup_model_and_resume_s": 1.5},
        {"event": "note", "time": 110.1, "message": "resumed from step-40.pt"},
        {"event": "progress", "time": 110.4, "step": 41})
    got = next_attempt_milestones(json_events(log), killed_at=100.0)
    assert got == pytest.approx({"process_started": 104.0, "imported": 107.0, "rendezvous": 108.0,
                                 "loaded": 110.0, "first_step": 110.4, "resumed_step": 40})


def test_nothing_until_the_next_attempt_has_stepped():
    started = {"event": "start", "time": 110.0, "step": 40}
    assert next_attempt_milestones(json_events(_log(started)), killed_at=100.0) is None
    old = [{"event": "start", "time": 90.0}, {"event": "progress", "time": 99.0}]
    assert next_attempt_milestones(json_events(_log(*old)), killed_at=100.0) is None


def test_the_pytorchjob_peer_runs_the_same_training_under_torchrun_on_its_own_variables():
    from benchmarks.restart_modes import PYTORCHJOB_CONTAINER, pytorchjob_manifest, training_args

    manifest = pytorchjob_manifest("peer", "ns", "/shared/peer", restarts=4)
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    for rank, kind in enumerate(("Master", "Worker")):
        spec = replicas[kind]
        assert spec["replicas"] == 1 and spec["restartPolicy"] == "OnFailure"  # the kubelet restarts it
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == PYTORCHJOB_CONTAINER
        command = container["command"]
        assert command[0] == "torchrun" and "--node-rank=$(PET_NODE_RANK)" in command
        assert command[-len(training_args()):] == training_args()
        env = {e["name"]: e["value"] for e in container["env"]}
        # what the kill script matches in a DDPJob's pod, so that it finds this worker too
        assert (env["DDPJOB_NAME"], env["DDPJOB_NAMESPACE"], env["NODE_RANK"]) == ("peer", "ns", str(rank))
    assert manifest["spec"]["runPolicy"]["backoffLimit"] > 4
