"""End-to-end: real training jobs from `kubectl apply` to Succeeded."""
from __future__ import annotations

import pytest

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    EXAMPLES, ONE_THREAD_ENV, TINY_TRAINING_ARGS, ddpjob_manifest, e2e, table_rows, terminated_state,
    trainer_events,
)

pytestmark = pytest.mark.cluster
TRAINING_TIMEOUT = 240  # seconds; a run takes 20-40 s on 2 cores


@pytest.mark.kubelet
def test_example_trains_to_success_with_falling_loss(e2e, kubectl):
    """examples/ddpjob.yaml, unchanged, with kubectl."""
    kubectl("apply", "-n", e2e.namespace, "-f", str(EXAMPLES / "ddpjob.yaml"))
    status = e2e.wait_until_finished("ddpjob-example", TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert (status["reason"], status["restarts"], status["nnodes"]) == ("AllNodesSucceeded", 0, 2)
    assert status.get("completionTime") and status.get("startTime")
    if not e2e.local:  # a real scheduler with two workers: one pod on each
        placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in e2e.pods("ddpjob-example")}
        assert len(set(placed.values())) == 2, placed

    log = e2e.wait_for_logs("ddpjob-example-node-0", "ddptrain: done")
    start, = trainer_events(log, "start")
    assert (start["world_size"], start["backend"], start["device"]) == ("2", "gloo", "cpu")
    losses = [float(p["loss"]) for p in trainer_events(log, "progress")]
    assert len(losses) >= 2, log
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    done, = trainer_events(log, "done")
    assert done["step"] == done["total_steps"] == start["total_steps"]

    table = kubectl("get", "ddpjobs", "-n", e2e.namespace).stdout
    columns, [row] = table_rows(table)
    assert columns == ["NAME", "PHASE", "READY", "RESTARTS", "DISRUPTIONS", "PROGRESS", "ETA", "QUEUE", "AGE"], table
    # PROGRESS and ETA may be empty (ETA always is once the job is over).
    assert (row["NAME"], row["PHASE"], row["RESTARTS"], row["ETA"]) == ("ddpjob-example", "Succeeded", "0", ""), table
    assert row["READY"].endswith("/2"), table
    wide = kubectl("get", "ddpjobs", "-n", e2e.namespace, "-o", "wide").stdout.splitlines()
    assert "REASON" in wide[0].split() and "AllNodesSucceeded" in wide[1].split(), wide


@pytest.mark.kubelet
def test_three_nodes_two_processes_each_train_six_ranks(e2e):
    """3 nodes x 2 processes per node = 6 ranks, under torchrun in each pod."""
    name = "six-ranks"
    # 96 samples / 6 ranks / batch 8 = 2 steps per epoch; 2 epochs.
    e2e.create(ddpjob_manifest(
        name, e2e.image, nnodes=3, nprocPerNode=2, env=ONE_THREAD_ENV,
        args=[*TINY_TRAINING_ARGS, "--fake-size=96", "--batch-size=8", "--epochs=2",
              "--log-every=1", "--checkpoint-dir=/tmp/ckpt", "--checkpoint-every=0"]))
    status = e2e.wait_until_finished(name, TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0
    assert [(n["nodeRank"], n["phase"]) for n in status["nodes"]] == [
        (0, "Succeeded"), (1, "Succeeded"), (2, "Succeeded")]

    log = e2e.wait_for_logs(f"{name}-node-0", "ddptrain: done")
    start, = trainer_events(log, "start")
    assert start["world_size"] == "6" and start["global_batch_size"] == "48", start
    done, = trainer_events(log, "done")
    assert (done["step"], done["total_steps"], done["world_size"]) == ("4", "4", "6"), done
    # Every pod's two workers finished: each pod's termination message is its workers' summary.
    for rank in range(3):
        state = terminated_state(e2e.pod(f"{name}-node-{rank}"))
        assert state["exitCode"] == 0, state
        assert f"node {rank}: exit 0" in state["message"], state
        assert "completed: step=4/4" in state["message"] and "world_size=6" in state["message"]


def test_plain_env_script_runs_unmodified(e2e, kubectl):
    """a user's plain env:// script (one process per pod, no torchrun), shipped in a
    ConfigMap by examples/ddpjob-plain-env.yaml, applied unchanged."""
    kubectl("apply", "-n", e2e.namespace, "-f", str(EXAMPLES / "ddpjob-plain-env.yaml"))
    status = e2e.wait_until_finished("plain-env-ddp", TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0
    for rank in range(2):
        log = e2e.wait_for_logs(f"plain-env-ddp-node-{rank}", f"rank {rank}/2 ok")
        assert "parameters agree, all-reduce sum 3" in log, log
