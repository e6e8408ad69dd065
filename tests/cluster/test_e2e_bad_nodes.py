"""End-to-end: a node that keeps failing the job is avoided (issue 23, item 2).

Both targets: the test bed has three nodes, kind two workers beside its tainted control plane.
Excluding one node leaves at least one, so the one-node job always has somewhere to go.
"""
from __future__ import annotations

import json

import pytest

from .e2e_support import PodRecorder, ddpjob_manifest, e2e, python_command  # noqa: F401 - e2e is a fixture

pytestmark = pytest.mark.cluster

# Fails wherever it runs on the node the test calls bad; succeeds anywhere else.
_FAILS_ON_THE_BAD_NODE = """
    import os, sys
    node, bad = os.environ["MY_NODE"], os.environ["BAD_NODE"]
    print(f"attempt {os.environ['DDPJOB_RESTART_ATTEMPT']} on {node}", flush=True)
    sys.exit(1 if node == bad else 0)
"""


def _schedulable_nodes(e2e) -> list[str]:
    """Ready nodes a plain pod may land on (kind's control plane is tainted NoSchedule)."""
    listing = json.loads(e2e.core.list_node(_preload_content=False).data)["items"]
    names = []
    for node in listing:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", ()))
        blocked = any(t.get("effect") in ("NoSchedule", "NoExecute") for t in node["spec"].get("taints") or ())
        if ready and not blocked and not node["spec"].get("unschedulable"):
            names.append(node["metadata"]["name"])
    return sorted(names)


@pytest.mark.kubelet
def test_a_node_that_fails_the_job_twice_is_excluded_and_the_next_attempt_runs_elsewhere(e2e):
    """The job prefers the bad node (a preferred affinity of the user's, so the scheduler puts
    attempts 0 and 1 there) and fails there twice: the node is listed in status.excludedNodes,
    an Event says so, and attempt 2's pod carries the required NotIn affinity beside the user's
    preference, runs on another node and succeeds."""
    nodes = _schedulable_nodes(e2e)
    if len(nodes) < 2:
        pytest.skip(f"needs two schedulable nodes, the cluster has {nodes}")
    bad = nodes[0]
    name = "bad-node"
    preferred = [{"weight": 100, "preference": {"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [bad]}]}}]
    manifest = ddpjob_manifest(
        name, e2e.image, nnodes=1, command=python_command(_FAILS_ON_THE_BAD_NODE), launcher="none",
        env=[{"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
             {"name": "BAD_NODE", "value": bad}],
        template={"spec": {"terminationGracePeriodSeconds": 5,
                           "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}}},
        failurePolicy={"maxRestarts": 3})
    with PodRecorder(e2e, name) as pods:
        e2e.create(manifest)
        status = e2e.wait_until_finished(name, 180)
        seen = pods.describe()

    assert status["phase"] == "Succeeded", (status, seen)
    assert (status["restarts"], status["restartAttempt"]) == (2, 2), (status, seen)
    history = status["failureHistory"]
    assert [(r["attempt"], r["nodeName"], r["exitCode"]) for r in history] == [(1, bad, 1), (0, bad, 1)], history
    [excluded] = status["excludedNodes"]
    assert (excluded["nodeName"], excluded["failures"], excluded["reason"]) == (bad, 2, "Error"), excluded
    assert excluded["since"] and "attempt 0: exit code 1" in excluded["message"], excluded
    [event] = e2e.wait_for_event(name, "NodeExcluded")
    assert f"avoid node {bad}" in event["message"], event

    last = e2e.pod(f"{name}-node-0")
    assert last["metadata"]["labels"]["ddpjob.dev/restart-attempt"] == "2", last["metadata"]
    assert last["spec"]["nodeName"] != bad, (last["spec"]["nodeName"], seen)
    affinity = last["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"] == {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [bad]}]}]}, affinity
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == preferred  # the user's, kept
    assert f"attempt 2 on {last['spec']['nodeName']}" in e2e.wait_for_logs(f"{name}-node-0", "attempt 2")
