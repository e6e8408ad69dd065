"""End-to-end: whose fault a failure was, and the culprit named (issue 23).

Only what a real cluster does: an Eviction through the API (the API server sets the pod's
DisruptionTarget condition, then deletes it, as `kubectl drain` does), and a rank's own exit.
"""
from __future__ import annotations

import pytest

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    PodRecorder, ddpjob_manifest, e2e, python_command, table_rows,
)

pytestmark = pytest.mark.cluster

# Attempt 0 runs until stopped; a later attempt finishes at once: one restart, then Succeeded.
_FIRST_ATTEMPT_WAITS = """
    import os, sys, time
    attempt, rank = int(os.environ["DDPJOB_RESTART_ATTEMPT"]), int(os.environ["NODE_RANK"])
    print(f"node {rank} attempt {attempt}", flush=True)
    if attempt == 0:
        time.sleep(600)
"""


def _evict(e2e, pod_name: str) -> None:
    from kubernetes import client

    e2e.core.create_namespaced_pod_eviction(pod_name, e2e.namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod_name, namespace=e2e.namespace)))


def test_an_evicted_pod_restarts_the_gang_without_spending_max_restarts(e2e):
    """maxRestarts 0: an application failure would fail the job at once. Node 1 evicted
    through the Eviction API (a drain): the gang restarts, status.restarts stays 0,
    status.disruptions is 1, the history names the pod and the eviction, and the job
    succeeds on the next attempt."""
    name = "evicted"
    with PodRecorder(e2e, name) as pods:
        e2e.create(ddpjob_manifest(name, e2e.image, command=python_command(_FIRST_ATTEMPT_WAITS),
                                   launcher="none", failurePolicy={"maxRestarts": 0}))
        e2e.wait_for_phase(name, "Running", 120)
        node_of_rank_1 = e2e.pod(f"{name}-node-1")["spec"]["nodeName"]
        _evict(e2e, f"{name}-node-1")
        status = e2e.wait_until_finished(name, 120)
        seen = pods.describe()

    assert status["phase"] == "Succeeded", (status, seen)
    assert (status["restarts"], status["disruptions"], status["restartAttempt"]) == (0, 1, 1), status
    assert len(status["recentDisruptions"]) == 1, status
    record = status["failureHistory"][0]
    assert (record["kind"], record["reason"], record["nodeRank"], record["pod"], record["attempt"]) == (
        "Disruption", "EvictionByEvictionAPI", 1, f"{name}-node-1", 0), record
    assert record["nodeName"] == node_of_rank_1, record
    assert pods.attempts() == {0, 1}, seen
    [restarting] = e2e.wait_for_event(name, "Restarting")
    assert "disruption 1 of 10" in restarting["message"] and "maxRestarts not spent" in restarting["message"]
    columns, rows = table_rows(e2e.cluster.kubectl("get", "ddpjobs", "-n", e2e.namespace).stdout)
    row = next(r for r in rows if r["NAME"] == name)
    assert (row["RESTARTS"], row["DISRUPTIONS"]) == ("0", "1"), (columns, row)


@pytest.mark.kubelet
def test_a_failing_ranks_event_names_the_rank_its_node_and_what_its_exit_code_means(e2e):
    """Node 1 exits 1 on attempt 0: the one Restarting Event and the head of the history name
    node 1, its pod, the Kubernetes node it ran on and the exit code's meaning, as an
    Application failure that spent a restart."""
    name = "culprit"
    code = """
        import os, sys, time
        attempt, rank = int(os.environ["DDPJOB_RESTART_ATTEMPT"]), int(os.environ["NODE_RANK"])
        if attempt == 0 and rank == 1:
            time.sleep(2)
            print("Traceback: ValueError: the batch was empty", flush=True)
            sys.exit(1)
        if attempt == 0:
            time.sleep(600)
    """
    with PodRecorder(e2e, name) as pods:
        e2e.create(ddpjob_manifest(name, e2e.image, command=python_command(code), launcher="none",
                                   failurePolicy={"maxRestarts": 1}))
        failing = e2e.cluster.wait_for(
            lambda: (lambda p: p if p and p.get("spec", {}).get("nodeName") else None)(e2e.pod(f"{name}-node-1")),
            60, "node 1 scheduled")
        node = failing["spec"]["nodeName"]
        status = e2e.wait_until_finished(name, 120)
        seen = pods.describe()

    assert status["phase"] == "Succeeded", (status, seen)
    assert (status["restarts"], status["disruptions"]) == (1, 0), status
    record = status["failureHistory"][0]
    assert (record["kind"], record["nodeRank"], record["pod"], record["nodeName"], record["exitCode"]) == (
        "Application", 1, f"{name}-node-1", node, 1), record
    assert "the batch was empty" in record["message"], record  # the evidence's last line
    [event] = e2e.wait_for_event(name, "Restarting")
    for words in (f"node 1 (pod {name}-node-1 on {node})", "exited with code 1",
                  "unexpected error (retryable)", "restart 1 of 1"):
        assert words in event["message"], (words, event["message"])
