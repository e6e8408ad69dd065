"""End-to-end: the in-place gang restart (issue 22). A retryable failure restarts the training
processes inside the pods that are left (same pods, same UIDs), the others are recreated, and
the next attempt resumes from the checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddpjob import contract
from ddpjob.api import names
from tests.testbed.operator_runner import OPERATOR_NAMESPACE

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    ONE_THREAD_ENV, TINY_TRAINING_ARGS, PodRecorder, checkpoint_steps, ddpjob_manifest, e2e,
    hanging_job, hostpath_volume, kill_training_worker, prepare_shared_dir, trainer_events,
)

pytestmark = pytest.mark.cluster
TRAINING_TIMEOUT = 240


def checkpointed_job(e2e, name: str, shared_host_dir: str, **fields) -> dict:
    """200 steps, a checkpoint every 20 on a volume both pods share."""
    prepare_shared_dir(e2e, shared_host_dir)
    return ddpjob_manifest(
        name, e2e.image, env=ONE_THREAD_ENV,
        args=[*TINY_TRAINING_ARGS, "--fake-size=3200", "--batch-size=16", "--epochs=2",
              "--log-every=20", "--checkpoint-dir=/checkpoints", "--checkpoint-every=20"],
        volumeMounts=[{"name": "checkpoints", "mountPath": "/checkpoints"}],
        template={"spec": {"volumes": [hostpath_volume("checkpoints", shared_host_dir)],
                           "terminationGracePeriodSeconds": 5}},
        **fields)


def uids(e2e, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in e2e.pods(name)}


def start_and_checkpoint(e2e, name: str, manifest: dict, shared_host_dir: str) -> dict[str, str]:
    e2e.create(manifest)
    e2e.wait_for_phase(name, "Running", TRAINING_TIMEOUT)
    e2e.cluster.wait_for(
        lambda: checkpoint_steps(e2e, shared_host_dir, f"{name}-node-0", "/checkpoints"),
        TRAINING_TIMEOUT, "the first checkpoint", interval=0.1)
    return uids(e2e, name)


@pytest.mark.kubelet
def test_a_killed_rank_restarts_the_gang_in_place_and_resumes(e2e, shared_host_dir):
    """Restart orders without the pod's token are refused first and change nothing (the one
    restart below is the kill's). Then SIGKILL of node 1's worker: the same two pods run
    attempt 1, which resumes from the checkpoint at the exact step; one restart, recorded as
    InPlace."""
    name = "in-place"
    with PodRecorder(e2e, name) as pods:
        before = start_and_checkpoint(e2e, name, checkpointed_job(e2e, name, shared_host_dir,
                                                                  failurePolicy={"maxRestarts": 2}),
                                      shared_host_dir)
        assert_forged_restart_orders_are_refused(e2e, name)
        assert e2e.status(name).get("restarts", 0) == 0 and uids(e2e, name) == before
        e2e.cluster.wait_for(lambda: kill_training_worker(e2e, name, node_rank=1), 30,
                             "node 1's training process to kill", interval=0.1)
        status = e2e.wait_until_finished(name, TRAINING_TIMEOUT)
        seen = pods.describe()

    assert status["phase"] == "Succeeded", (status, seen)
    assert (status["restarts"], status["restartAttempt"]) == (1, 1), status
    record = status["failureHistory"][0]
    assert (record["restartMode"], record["nodeRank"], record["exitCode"]) == ("InPlace", 1, 137), record
    assert uids(e2e, name) == before, seen  # the same pods: nothing was recreated
    assert len(pods.pods) == 2, seen
    assert {p["metadata"]["labels"][names.LABEL_RESTART_ATTEMPT] for p in e2e.pods(name)} == {"1"}
    restarted = e2e.wait_for_event(name, "Restarting")
    assert len(restarted) == 1 and "in place" in restarted[0]["message"], restarted

    # One container ran both attempts: its log has two starts; the second resumed from a
    # checkpoint of the first and no step was trained twice.
    log = e2e.wait_for_logs(f"{name}-node-0", "ddptrain: done")
    first, second = trainer_events(log, "start")
    resumed_at = int(second["step"])
    assert int(first["step"]) == 0 and resumed_at > 0 and resumed_at % 20 == 0, log
    assert f"resumed from /checkpoints/step-{resumed_at:08d}.pt at step={resumed_at}" in log
    done, = trainer_events(log, "done")
    assert int(done["step"]) == int(done["total_steps"]) == 200, done


def test_a_deleted_pod_is_recreated_while_the_other_restarts_in_place(e2e, shared_host_dir):
    name = "in-place-deleted"
    before = start_and_checkpoint(e2e, name, checkpointed_job(e2e, name, shared_host_dir),
                                  shared_host_dir)
    e2e.cluster.kubectl("delete", "pod", "-n", e2e.namespace, f"{name}-node-1", "--wait=false")
    status = e2e.wait_until_finished(name, TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert status["restartAttempt"] == 1, status
    assert status["failureHistory"][0]["restartMode"] == "InPlace", status
    after = uids(e2e, name)
    assert after[f"{name}-node-0"] == before[f"{name}-node-0"], (before, after)
    assert after[f"{name}-node-1"] != before[f"{name}-node-1"], (before, after)


# An order without the pod's token, as another tenant's pod would send it, or with what a reader
# of the pod's spec finds there (the token's digest, its nonce): refused, and the training goes
# on. Run inside node 0's pod (it can reach node 1, as any pod can).
FORGED_ORDER = r"""
import json, sys, urllib.request, urllib.error
ip, port, digest, nonce = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
out = {}
for name, headers in (("none", {}), ("wrong", {"Authorization": "Bearer not-the-token"}),
                      ("digest", {"Authorization": f"Bearer {digest}"}),
                      ("nonce", {"Authorization": f"Bearer {nonce}"})):
    request = urllib.request.Request(f"http://{ip}:{port}/restart", data=b'{"attempt": 7}',
                                     headers={"Content-Type": "application/json", **headers})
    try:
        out[name] = urllib.request.urlopen(request, timeout=5).status
    except urllib.error.HTTPError as error:
        out[name] = error.code
print(json.dumps(out))
"""


def assert_forged_restart_orders_are_refused(e2e, name: str) -> None:
    """Forged orders to node 1 (a job that has trained to its first checkpoint), sent from
    node 0's pod: each is refused with 401."""
    pod = e2e.pod(f"{name}-node-1")
    target = pod["status"]["podIP"]
    # What every reader of the namespace sees of the pod: never the token (issue 35).
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert contract.DDPJOB_RESTART_TOKEN not in env, env
    digest, nonce = env[contract.DDPJOB_RESTART_TOKEN_SHA256], env[contract.DDPJOB_RESTART_NONCE]
    assert len(digest) == 64 and nonce, env
    # The key that makes tokens of nonces lives in the operator's namespace, in a Secret.
    assert e2e.cluster.kubectl("get", "secret", "ddpjob-restart-key", "-n", OPERATOR_NAMESPACE,
                               check=False).returncode == 0
    argv = ["python", "-c", FORGED_ORDER, target, str(contract.DEFAULT_PROGRESS_PORT), digest, nonce]
    if e2e.local:
        result = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=30)
    else:
        result = e2e.cluster.kubectl("exec", "-n", e2e.namespace, f"{name}-node-0", "-c",
                                     names.CONTAINER_NAME, "--", *argv, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"none": 401, "wrong": 401, "digest": 401,
                                                                  "nonce": 401}


def test_a_second_failure_before_the_in_place_attempt_trains_recreates_the_gang(e2e, shared_host_dir):
    """Attempt 0 stalls (rank 1 blocked in a collective): restarted in place. Attempt 1 fails
    before any progress report (rank 0 exits 1 before its rendezvous): a second failure during
    the in-place restart, so attempt 2 gets new pods, and resumes from the checkpoint."""
    name = "in-place-twice"
    e2e.create(hanging_job(e2e, shared_host_dir, name,
                           env=[{"name": "HANG", "value": "step"}, {"name": "FAIL_ON_ATTEMPT", "value": "1"}],
                           failurePolicy={"maxRestarts": 2, "progressTimeoutSeconds": 15}))
    e2e.wait_for_phase(name, "Running", TRAINING_TIMEOUT)
    before = uids(e2e, name)
    status = e2e.wait_until_finished(name, TRAINING_TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert (status["restarts"], status["restartAttempt"]) == (2, 2), status
    second, first = status["failureHistory"][:2]
    assert (first["attempt"], first["reason"], first["restartMode"]) == (0, "Stalled", "InPlace"), first
    assert (second["attempt"], second["nodeRank"], second["exitCode"], second["restartMode"]) == \
        (1, 0, 1, "Recreate"), second
    after = uids(e2e, name)
    assert set(after) == set(before) and not set(after.values()) & set(before.values()), (before, after)
    restarting = e2e.wait_for_event(name, "Restarting")
    assert any("was restarted in place and failed before its first progress report" in e["message"]
               for e in restarting), restarting
    log = e2e.wait_for_logs(f"{name}-node-0", "finished at step 10")
    assert "rank 0 attempt 2 resumes at step 4" in log, log
