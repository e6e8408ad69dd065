"""benchmarks/peer_systems.py: what each system's user applies, how their statuses read, and the
figures computed from watch events (pure; the cluster run is tests/cluster/test_peers_smoke.py)."""
from __future__ import annotations

import pytest

from benchmarks import peer_systems as ps

pytestmark = pytest.mark.unit

SLEEP = ["sleep", "1"]


@pytest.mark.parametrize("key", sorted(ps.SYSTEMS))
def test_manifests_ask_for_nnodes_pods_and_pending_selects_no_node(key):
    system = ps.SYSTEMS[key]
    docs = system.manifests("j", "ns", 3, SLEEP, pending=True)
    job = docs[-1]
    assert job["metadata"] == {"name": "j", "namespace": "ns"}
    assert ps.collection_path(job) == system.api_path.format(ns="ns")
    text = repr(job)
    assert repr(ps.NO_NODE)[1:-1] in text and "'sleep', '1'" in text


def test_pytorchjob_has_workers_only_and_retries_by_exit_code():
    job = ps.pytorchjob_manifests("j", "ns", 4, SLEEP, restarts=7)[0]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert list(replicas) == ["Worker"]  # a Master would give workers an nslookup init container
    assert replicas["Worker"]["replicas"] == 4 and replicas["Worker"]["restartPolicy"] == "ExitCode"
    assert replicas["Worker"]["template"]["spec"]["containers"][0]["name"] == "pytorch"
    assert job["spec"]["runPolicy"] == {"backoffLimit": 7}


def test_indexed_job_is_a_headless_service_and_an_indexed_job_with_rank_from_the_index():
    service, job = ps.indexed_job_manifests("j", "ns", 4, SLEEP)
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": "j"}
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "j" and pod["restartPolicy"] == "Never"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert "job-completion-index" in env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert env["MASTER_ADDR"]["value"] == "j-0.j" and env["WORLD_SIZE"]["value"] == "4"
    assert ps.collection_path(service) == "/api/v1/namespaces/ns/services"


@pytest.mark.parametrize("key, status, expected", [
    ("ddpjob", {"phase": "Running", "nodes": [{"phase": "Running"}, {"phase": "Pending"}]}, ("Running", 1, 0)),
    ("ddpjob", {"phase": "Succeeded", "nodes": [{"phase": "Succeeded"}] * 2}, ("Succeeded", 2, 2)),
    ("pytorchjob", {"conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}],
                    "replicaStatuses": {"Worker": {"active": 2}}}, ("Running", 2, 0)),
    ("pytorchjob", {"conditions": [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}],
                    "replicaStatuses": {"Worker": {"succeeded": 2}}}, ("Succeeded", 2, 2)),
    ("indexedjob", {"active": 2, "ready": 1}, ("Running", 1, 0)),
    ("indexedjob", {"active": 2}, ("Pending", 0, 0)),
    ("indexedjob", {"succeeded": 2, "conditions": [{"type": "Complete", "status": "True"}]}, ("Succeeded", 2, 2)),
])
def test_job_state(key, status, expected):
    assert ps.SYSTEMS[key].job_state({"status": status}) == expected


def _pod(t, uid, phase, job="j", rank=0, event="MODIFIED", exit_code=None):
    return ps.PodSeen(t=t, event=event, name=uid, uid=uid, job=job, rank=rank, phase=phase, deleting=False,
                      exit_code=exit_code)


def _job(t, phase, running, succeeded, name="j"):
    return ps.JobSeen(t=t, event="MODIFIED", name=name, phase=phase, running=running, succeeded=succeeded)


def test_status_lags_match_the_kth_pod_with_the_first_status_counting_k():
    pods = [_pod(1.0, "a", "Running"), _pod(1.5, "b", "Running", rank=1),
            _pod(3.0, "a", "Succeeded"), _pod(3.2, "b", "Succeeded", rank=1)]
    jobs = [_job(0.5, "Pending", 0, 0), _job(1.1, "Running", 1, 0), _job(1.9, "Running", 2, 0),
            _job(3.5, "Succeeded", 2, 2)]
    assert ps.status_lags(pods, jobs) == pytest.approx([0.1, 0.4, 0.5, 0.3])


def test_milestones_and_gang_replaced():
    pods = [_pod(1.0, "a", "Pending", event="ADDED"), _pod(1.2, "b", "Pending", rank=1, event="ADDED"),
            _pod(2.0, "a", "Running"), _pod(2.5, "b", "Running", rank=1),
            _pod(4.0, "a", "Succeeded"), _pod(4.1, "b", "Succeeded", rank=1)]
    jobs = [_job(0.9, "Pending", 0, 0), _job(4.3, "Succeeded", 2, 2)]
    t = ps.milestones(pods, jobs, "j", 2)
    assert (t["job_added"], t["all_created"], t["all_running"], t["last_exit"], t["job_finished"]) == \
        (0.9, 1.2, 2.5, 4.1, 4.3)
    # a container with restart rules of its own exits while its pod still shows Running
    exited = pods[:4] + [_pod(3.9, "a", "Running", exit_code=0), _pod(4.0, "b", "Running", rank=1, exit_code=0)]
    assert ps.milestones(exited, jobs, "j", 2)["last_exit"] == 4.0
    live = {"b": _pod(5, "b", "Running", rank=1), "c": _pod(5, "c", "Running", rank=0)}
    assert ps.gang_replaced(live, "j", 2, victim_rank=0, victim_uid="a")
    assert not ps.gang_replaced({"a": _pod(5, "a", "Running"), **{"b": live["b"]}}, "j", 2, 0, "a")
    assert not ps.gang_replaced({"b": live["b"]}, "j", 2, 0, "a")


def test_pod_seen_reads_the_containers_exit_code():
    system = ps.SYSTEMS["ddpjob"]
    pod = {"metadata": {"name": "j-node-0", "uid": "a", "labels": {system.job_label: "j", system.rank_label: "0"}},
           "status": {"phase": "Running", "containerStatuses": [{"state": {"terminated": {"exitCode": 0}}}]}}
    seen = ps.pod_seen(system, 1.0, "MODIFIED", pod)
    assert (seen.job, seen.rank, seen.phase, seen.exit_code) == ("j", 0, "Running", 0)
    pod["status"] = {"phase": "Pending"}
    assert ps.pod_seen(system, 1.0, "ADDED", pod).exit_code is None
