"""End-to-end: a command of your own restarts in place through the kubelet's container restart
rules (issue 22; docs/operator.md, "Kubelet restarts in place"). Nothing in such a pod takes the
operator's order: the container's rule makes its kubelet start it again in the same pod, the
operator counts the failure once, carries the pods into the next attempt, and recreates a peer
that does not exit. The test bed's node agent runs the rules as the v1.36 kubelet does
(docs/testing.md); on kind the real kubelet does."""
from __future__ import annotations

import pytest

from ddpjob.api import names

import threading

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    PodRecorder, ddpjob_cli, ddpjob_manifest, e2e, python_command,
)

pytestmark = pytest.mark.cluster
TIMEOUT = 180

# Attempt 0 fails: node 1 with 1 (the cause), node 0 a little later with 13 (a peer lost), or,
# with HANG=1, node 0 never exits. Any later attempt succeeds. Each run is counted in the pod's
# /dev/shm (kept through a container restart, new in a new pod).
_FAILS_IN_ATTEMPT_0 = """
    import os, sys, time
    rank, attempt = int(os.environ["NODE_RANK"]), int(os.environ["DDPJOB_RESTART_ATTEMPT"])
    runs_file = "/dev/shm/runs"
    runs = int(open(runs_file).read()) if os.path.exists(runs_file) else 0
    open(runs_file, "w").write(str(runs + 1))
    print(f"run={runs} attempt={attempt}", flush=True)
    if attempt == 0:
        time.sleep(8 if rank == 1 else 11)
        if rank == 0 and os.environ.get("HANG") == "1":
            time.sleep(3600)
        sys.exit(int(os.environ.get("CODE", "1")) if rank == 1 else 13)
    time.sleep(3)
    print("done", flush=True)
"""


def kubelet_job(name: str, image: str, **env: str) -> dict:
    return ddpjob_manifest(name, image, command=python_command(_FAILS_IN_ATTEMPT_0), launcher="none",
                           env=[{"name": k, "value": v} for k, v in env.items()],
                           failurePolicy={"maxRestarts": 2})


def uids(e2e, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in e2e.pods(name)}


def restart_count(pod: dict) -> int:
    return pod["status"]["containerStatuses"][0]["restartCount"]


@pytest.mark.kubelet
def test_a_failed_command_restarts_in_its_pod_and_the_next_attempt_sees_its_number(e2e):
    name = "kubelet-restart"
    with PodRecorder(e2e, name) as recorder:
        e2e.create(kubelet_job(name, e2e.image))
        e2e.wait_for_phase(name, "Running", TIMEOUT)
        before = uids(e2e, name)
        # `ddpjob logs -f` of node 1, from before its failure: it follows the restarted
        # container's run too, and ends by itself once the job has succeeded. Kind only: the
        # test bed's API server serves no pod logs (test_e2e_status_logs.py).
        followed: dict = {}
        follower = threading.Thread(target=lambda: followed.update(result=ddpjob_cli(
            e2e.cluster, "logs", name, "-n", e2e.namespace, "-f", "--rank", "1", timeout=TIMEOUT)))
        if not e2e.local:
            follower.start()
        status = e2e.wait_until_finished(name, TIMEOUT)
        seen = recorder.describe()
        if not e2e.local:
            follower.join(TIMEOUT)

    assert status["phase"] == "Succeeded", (status, seen)
    assert (status["restarts"], status["restartAttempt"]) == (1, 1), status  # node 0's 13 not counted
    record = status["failureHistory"][0]
    assert (record["restartMode"], record["nodeRank"], record["exitCode"]) == ("InPlace", 1, 1), record
    assert uids(e2e, name) == before, seen  # the same pods, each restarted by its kubelet
    for pod in e2e.pods(name):
        assert restart_count(pod) == 1, pod["status"]
        labels = pod["metadata"]["labels"]
        assert (labels[names.LABEL_RESTART_ATTEMPT], labels[names.LABEL_CONTAINER_RESTARTS]) == ("1", "1"), labels
        pod_name = pod["metadata"]["name"]
        log = e2e.wait_for_logs(pod_name, "done")
        # The restarted container saw the new attempt (the annotation the kubelet reads at
        # start) and its pod's /dev/shm (run=1: the same pod as the first run).
        assert "run=1 attempt=1" in log, log
        # The first run: the test bed's log file holds every run of the pod. A kubelet serves
        # the last run only (kind: `--previous` finds no log once the pod has finished); there
        # run=1 and the restartCount say the first ran in the same pod, and `ddpjob logs -f`
        # (below) read node 1's first run while it ran.
        if e2e.local:
            assert "run=0 attempt=0" in log, log
    [restarting] = e2e.wait_for_event(name, "Restarting")
    assert "restarted in place by the kubelet" in restarting["message"], restarting
    if e2e.local:
        return
    result = followed["result"]
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "node-1 | run=0 attempt=0" in result.stdout and "node-1 | run=1 attempt=1" in result.stdout, result.stdout
    assert result.stdout.rstrip().endswith("node-1 | done"), result.stdout


@pytest.mark.kubelet
def test_a_peer_that_does_not_exit_is_recreated_and_the_restarted_pod_stays(e2e):
    name = "kubelet-peer-hangs"
    with PodRecorder(e2e, name) as recorder:
        e2e.create(kubelet_job(name, e2e.image, HANG="1"))
        e2e.wait_for_phase(name, "Running", TIMEOUT)
        before = uids(e2e, name)
        status = e2e.wait_until_finished(name, TIMEOUT)
        seen = recorder.describe()

    assert status["phase"] == "Succeeded", (status, seen)
    assert (status["restarts"], status["restartAttempt"]) == (1, 1), status
    after = uids(e2e, name)
    assert after[f"{name}-node-1"] == before[f"{name}-node-1"], seen  # restarted in place
    assert after[f"{name}-node-0"] != before[f"{name}-node-0"], seen  # recreated after the grace
    new = e2e.pod(f"{name}-node-0")
    assert restart_count(new) == 0 and new["metadata"]["labels"][names.LABEL_RESTART_ATTEMPT] == "1"
    assert "run=0 attempt=1" in e2e.wait_for_logs(f"{name}-node-0", "done")


@pytest.mark.kubelet
def test_a_permanent_code_is_not_restarted_and_fails_the_job(e2e):
    name = "kubelet-permanent"
    e2e.create(kubelet_job(name, e2e.image, CODE="2"))
    status = e2e.wait_until_finished(name, TIMEOUT)
    assert (status["phase"], status["reason"], status["restarts"]) == ("Failed", "PodFailedPermanent", 0), status
    failed = e2e.pod(f"{name}-node-1")
    assert failed is None or restart_count(failed) == 0, failed["status"]


def test_a_command_that_always_fails_spends_the_budget_in_place(e2e):
    name = "kubelet-budget"
    with PodRecorder(e2e, name) as recorder:
        e2e.create(ddpjob_manifest(
            name, e2e.image, command=python_command("import sys; print('failing on purpose'); sys.exit(1)"),
            failurePolicy={"maxRestarts": 1}))
        status = e2e.wait_until_finished(name, TIMEOUT)
        seen = recorder.describe()
    assert (status["phase"], status["reason"], status["restarts"]) == ("Failed", "RestartBudgetExhausted", 1), status
    # The restart was the kubelet's, in the pod: a pass saw it (an InPlace entry in the history),
    # or, on a loaded machine, the pass that saw the second failure counted it with that one.
    in_place = [r for r in status["failureHistory"] if r.get("restartMode") == "InPlace"]
    assert in_place or "the kubelet restarted" in status["message"], status
    assert status["failedNode"]["exitCode"] == 1 and "failing on purpose" in status["failedNode"]["message"], status
    assert len(recorder.pods) == 2, seen  # no pod was recreated
