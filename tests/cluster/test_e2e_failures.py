"""End-to-end: failures and what the operator makes of them."""
from __future__ import annotations

import pytest

from ddpjob import contract
from ddpjob.api import names

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    ONE_THREAD_ENV, TINY_TRAINING_ARGS, PodRecorder, checkpoint_steps, ddpjob_manifest, e2e,
    hostpath_volume, kill_training_worker, prepare_shared_dir, python_command, seconds_between,
    trainer_events,
)

pytestmark = pytest.mark.cluster
TRAINING_TIMEOUT = 240


@pytest.mark.kubelet
def test_killed_rank_restarts_the_gang_which_resumes_from_the_checkpoint(e2e, shared_host_dir):
    """SIGKILL node 1's training process after the first checkpoint: one gang
    restart, the new gang resumes from the checkpoint on the shared volume, and the step count
    continues to the configured total."""
    name = "resume"
    total_steps = 200  # 3200 samples / 2 ranks / batch 16 = 100 steps per epoch, 2 epochs
    prepare_shared_dir(e2e, shared_host_dir)
    manifest = ddpjob_manifest(
        name, e2e.image, env=ONE_THREAD_ENV,
        args=[*TINY_TRAINING_ARGS, "--fake-size=3200", "--batch-size=16", "--epochs=2",
              "--log-every=20", "--checkpoint-dir=/checkpoints", "--checkpoint-every=20"],
        volumeMounts=[{"name": "checkpoints", "mountPath": "/checkpoints"}],
        template={"spec": {"volumes": [hostpath_volume("checkpoints", shared_host_dir)],
                           "terminationGracePeriodSeconds": 5}},
        failurePolicy={"maxRestarts": 2, "restartMode": "Recreate"})  # in place: test_e2e_inplace.py
    with PodRecorder(e2e, name) as pods:
        e2e.create(manifest)
        e2e.wait_for_phase(name, "Running", TRAINING_TIMEOUT)
        e2e.cluster.wait_for(
            lambda: checkpoint_steps(e2e, shared_host_dir, f"{name}-node-0", "/checkpoints"),
            TRAINING_TIMEOUT, "the first checkpoint", interval=0.1)
        killed = e2e.cluster.wait_for(lambda: kill_training_worker(e2e, name, node_rank=1), 30,
                                      "node 1's training process to kill", interval=0.1)
        saved = checkpoint_steps(e2e, shared_host_dir, f"{name}-node-0", "/checkpoints")
        status = e2e.wait_until_finished(name, TRAINING_TIMEOUT)
        seen = pods.describe()

    assert status["phase"] == "Succeeded", (status, seen)
    assert (status["restarts"], status["restartAttempt"]) == (1, 1), status
    assert status["failureHistory"][0]["restartMode"] == "Recreate", status
    assert {p["metadata"]["labels"][names.LABEL_RESTART_ATTEMPT]
            for p in e2e.pods(name)} == {"1"}, seen
    assert pods.attempts() == {0, 1}, seen
    assert pods.pods_per_rank(0) == pods.pods_per_rank(1) == {0: 1, 1: 1}, seen
    restarted = e2e.wait_for_event(name, "Restarting")
    assert len(restarted) == 1 and restarted[0]["type"] == "Warning", restarted

    # The new gang's rank 0 resumed from a checkpoint of the first, and stopped at the total.
    log = e2e.wait_for_logs(f"{name}-node-0", "ddptrain: done")
    start, = trainer_events(log, "start")
    resumed_at = int(start["step"])
    assert resumed_at > 0 and resumed_at % 20 == 0, (killed, saved, log)
    assert f"resumed from /checkpoints/step-{resumed_at:08d}.pt at step={resumed_at}" in log
    steps = [int(p["step"]) for p in trainer_events(log, "progress")]
    assert steps and steps[0] == resumed_at + 20, steps  # no step trained twice in attempt 1
    done, = trainer_events(log, "done")
    assert int(done["step"]) == int(done["total_steps"]) == total_steps, done


@pytest.mark.kubelet
def test_bad_configuration_fails_at_once_and_names_the_node(e2e):
    """the trainer's bad-configuration exit code (2) is permanent: Failed, no
    restart, status.failedNode names the node, its exit code and message; nothing left running."""
    name = "bad-flag"
    with PodRecorder(e2e, name) as pods:
        e2e.create(ddpjob_manifest(name, e2e.image, env=ONE_THREAD_ENV,
                                   args=[*TINY_TRAINING_ARGS, "--lr=-1"],
                                   failurePolicy={"maxRestarts": 3}))
        status = e2e.wait_until_finished(name, TRAINING_TIMEOUT)
        e2e.cluster.wait_for(lambda: not e2e.unfinished_pods(name), 30, "no pod left running")
        seen = pods.describe()

    assert status["phase"] == "Failed", status
    assert (status["reason"], status["restarts"]) == ("PodFailedPermanent", 0), status
    failed = status["failedNode"]
    assert failed["exitCode"] == int(contract.ExitCode.BAD_CONFIG), failed
    assert failed["pod"] == f"{name}-node-{failed['nodeRank']}", failed
    assert "--lr" in failed["message"], failed  # the trainer's one-line reason
    assert f"node {failed['nodeRank']}" in status["message"] and "code 2" in status["message"]
    assert pods.attempts() == {0} and pods.pods_per_rank(0) == {0: 1, 1: 1}, seen  # no restart


def test_spent_restart_budget_fails_with_that_reason(e2e):
    """a retryable failure on every attempt: one restart (maxRestarts 1), then
    Failed with reason RestartBudgetExhausted. Recreate, so that each attempt has pods of its
    own to count (test_e2e_kubelet_restart.py spends the budget in place)."""
    name = "always-fails"
    with PodRecorder(e2e, name) as pods:
        e2e.create(ddpjob_manifest(
            name, e2e.image,
            command=python_command("import sys; print('failing on purpose'); sys.exit(1)"),
            failurePolicy={"maxRestarts": 1, "restartMode": "Recreate"}))
        status = e2e.wait_until_finished(name, 120)
        seen = pods.describe()

    assert status["phase"] == "Failed", status
    assert (status["reason"], status["restarts"]) == ("RestartBudgetExhausted", 1), status
    assert "restart budget (1) is spent" in status["message"], status
    assert status["failedNode"]["exitCode"] == 1, status
    assert "failing on purpose" in status["failedNode"]["message"], status  # the log tail
    assert pods.attempts() == {0, 1}, seen
    assert pods.pods_per_rank(0) == pods.pods_per_rank(1) == {0: 1, 1: 1}, seen


def test_gpus_no_node_has_time_out_and_release_the_pods(e2e, nodes):
    """nprocPerNode GPUs per pod, more than any node has: the pods stay Pending,
    the startup timeout fails the job (StartupTimeout) and no pod is left holding anything."""
    name = "too-many-gpus"
    gpu_node = None
    if e2e.local:  # a node with one GPU: there is GPU capacity, only not enough of it
        gpu_node = nodes.add(f"gpu-{e2e.namespace[-6:]}", gpus=1)
    try:
        e2e.create(ddpjob_manifest(name, e2e.image, device="gpu", nprocPerNode=2,
                                   command=python_command("print('never runs')"),
                                   launcher="none", startupTimeoutSeconds=10))
        pending = e2e.wait_for_status(
            name, lambda s: "Insufficient nvidia.com/gpu" in s.get("message", ""), 30,
            "the scheduler's verdict in the status")
        assert pending["phase"] == "Pending", pending
        assert all(p["status"]["phase"] == "Pending" for p in e2e.pods(name))
        status = e2e.wait_until_finished(name, 60)
        assert status["phase"] == "Failed", status
        assert status["reason"] == "StartupTimeout", status
        assert "startupTimeoutSeconds (10s)" in status["message"], status
        assert seconds_between(status["startTime"], status["completionTime"]) >= 10, status
        e2e.cluster.wait_for(lambda: not e2e.pods(name), 30, "every pod of the job deleted")
    finally:
        if gpu_node:
            nodes.remove(gpu_node)


@pytest.mark.kubelet
def test_an_image_no_registry_serves_says_which_and_what_to_do(e2e):
    """An image the nodes cannot pull (issue 36 item 1; a real cluster with the default image):
    the status says in one line which image and what to do, one Warning Event says it once, and
    the startup clock ends the job with the same advice. On kind the kubelet really fails the
    pull (no resolver answers .invalid); the test bed's node agent does as the kubelet does."""
    name = "unpullable"
    image = "registry.invalid/ddpjob/trainer:0.1.0"
    e2e.create(ddpjob_manifest(name, image, command=python_command("print('never runs')"),
                               launcher="none", startupTimeoutSeconds=45))
    pending = e2e.wait_for_status(name, lambda s: s.get("reason") == "ImageNotPulled", 40,
                                  "the status names the image that cannot be pulled")
    assert pending["phase"] == "Pending", pending
    message = pending["message"]
    assert f"image '{image}' cannot be pulled" in message and "\n" not in message, message
    assert "DDPJOB_IMAGE" in message and "make push" in message and "imagePullSecrets" in message, message
    [warning] = [e for e in e2e.wait_for_event(name, "ImageNotPulled", 30) if e["reason"] == "ImageNotPulled"]
    assert warning["type"] == "Warning" and image in warning["message"], warning
    status = e2e.wait_until_finished(name, 90)
    assert (status["phase"], status["reason"]) == ("Failed", "StartupTimeout"), status
    assert "cannot be pulled" in status["message"], status
    assert len([e for e in e2e.events(name) if e["reason"] == "ImageNotPulled"]) == 1


@pytest.mark.kubelet
def test_a_bug_that_fails_every_attempt_the_same_way_fails_the_job_after_one_restart(e2e):
    """Issue 36, item 4: every rank raises the same exception within a second of its start, on
    every attempt. The first failure restarts the gang (it could have been bad luck); the second,
    the same error, fails the job with reason RepeatedError, the error named once, maxRestarts 3
    not spent. The error comes from the log tail the kubelet (FallbackToLogsOnError) makes the
    termination message of a command of one's own."""
    name = "same-bug"
    code = """
        import os
        def main():
            print("node", os.environ["NODE_RANK"], "starts", flush=True)
            return 1 / 0
        main()
    """
    e2e.create(ddpjob_manifest(name, e2e.image, command=python_command(code), launcher="none",
                               failurePolicy={"maxRestarts": 3, "restartMode": "Recreate"}))
    status = e2e.wait_until_finished(name, TRAINING_TIMEOUT)
    assert (status["phase"], status["reason"], status["restarts"]) == ("Failed", "RepeatedError", 1), status
    assert ("the same error on attempts 0 and 1, each before it trained: ZeroDivisionError: division by zero"
            in status["message"]), status["message"]
    assert status["message"].count("ZeroDivisionError") == 1
    assert [r["error"] for r in status["failureHistory"]] == ["ZeroDivisionError: division by zero"] * 2, status
    [event] = e2e.wait_for_event(name, "RepeatedError")
    assert "a restart cannot fix this" in event["message"], event
