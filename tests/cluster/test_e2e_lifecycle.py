"""End-to-end: the operator's own restarts, deletion, suspend/resume and the job clocks."""
from __future__ import annotations

import datetime as dt

import pytest

from ddpjob.api import names

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    PodRecorder, ddpjob_manifest, e2e, gate_command, hostpath_volume, open_gate, parse_time,
    prepare_shared_dir, python_command, seconds_between,
)

pytestmark = pytest.mark.cluster
SLEEP_FOREVER = python_command("import time; time.sleep(600)")


@pytest.mark.kubelet
def test_operator_killed_mid_job_creates_no_duplicates(e2e, operator, shared_host_dir):
    """SIGKILL the operator while it creates the gang, and again while the gang
    runs (its pods finish while it is down); each restarted operator adopts what exists. Every
    pod uid ever created is recorded: exactly one per rank, one attempt, and the job Succeeds."""
    name = "operator-restarts"
    nnodes = 3
    prepare_shared_dir(e2e, shared_host_dir)
    manifest = ddpjob_manifest(
        name, e2e.image, nnodes=nnodes, command=gate_command("/gate"),
        volumeMounts=[{"name": "gate", "mountPath": "/gate"}],
        template={"spec": {"volumes": [hostpath_volume("gate", shared_host_dir)],
                           "terminationGracePeriodSeconds": 5}})
    with PodRecorder(e2e, name) as pods:
        e2e.create(manifest)
        e2e.cluster.wait_for(lambda: pods.snapshot(), 60, "the first pod of the gang")
        operator.kill()  # while the gang is being created
        operator.start()
        e2e.wait_for_phase(name, "Running", 120)

        operator.kill()  # while the gang runs
        open_gate(e2e, shared_host_dir, f"{name}-node-0", "/gate")
        e2e.cluster.wait_for(
            lambda: [p["status"]["phase"] for p in e2e.pods(name)] == ["Succeeded"] * nnodes,
            60, "every pod Succeeded while the operator is down")
        operator.start()
        status = e2e.wait_for_phase(name, ("Succeeded", "Failed"), 60)
        seen = pods.describe()

    assert status["phase"] == "Succeeded", (status, seen)
    assert (status["restarts"], status["restartAttempt"]) == (0, 0), status
    assert pods.attempts() == {0}, seen
    assert pods.pods_per_rank(0) == {rank: 1 for rank in range(nnodes)}, seen


@pytest.mark.kubelet
def test_deleting_a_job_removes_its_pods_and_service(e2e, kubectl):
    """the owner references do it, through the real garbage collector (the operator
    puts no finalizer on DDPJobs)."""
    name = "to-delete"
    e2e.create(ddpjob_manifest(name, e2e.image, command=SLEEP_FOREVER))
    e2e.wait_for_phase(name, "Running", 120)
    job = e2e.job(name)
    assert not job["metadata"].get("finalizers"), job["metadata"]
    service = e2e.service(name)
    assert service is not None and service["spec"]["clusterIP"] == "None"
    for child in [service, *e2e.pods(name)]:
        owner, = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == (
            names.KIND, job["metadata"]["uid"], True), child["metadata"]

    kubectl("delete", "ddpjob", name, "-n", e2e.namespace, "--wait=false")
    e2e.cluster.wait_for(lambda: e2e.job(name) is None, 30, "the DDPJob gone")
    # The garbage collector notices a CRD installed moments ago only at its next discovery
    # resync (every 30 s): the first deletion of a fresh cluster can take that long.
    e2e.cluster.wait_for(lambda: not e2e.pods(name) and e2e.service(name) is None, 90,
                         "its pods and Service garbage-collected")


@pytest.mark.kubelet
def test_suspend_deletes_the_pods_and_resume_finishes_the_job(e2e):
    """suspend: true deletes the gang (phase Suspended, no restart counted);
    suspend: false creates the next attempt, which runs to success."""
    name = "suspended"
    # Attempt 0 would run forever; the resumed attempt finishes at once.
    command = python_command("""
        import os, time
        attempt = os.environ["DDPJOB_RESTART_ATTEMPT"]
        if attempt == "0":
            time.sleep(600)
        print("finished in attempt", attempt)
    """)
    with PodRecorder(e2e, name) as pods:
        e2e.create(ddpjob_manifest(name, e2e.image, command=command))
        e2e.wait_for_phase(name, "Running", 120)
        e2e.patch_spec(name, {"suspend": True})
        suspended = e2e.wait_for_phase(name, "Suspended", 30)
        e2e.cluster.wait_for(lambda: not e2e.pods(name), 60, "the suspended job's pods deleted")
        assert suspended["restarts"] == 0 and not suspended.get("startTime"), suspended

        e2e.patch_spec(name, {"suspend": False})
        status = e2e.wait_for_phase(name, ("Succeeded", "Failed"), 120)
        seen = pods.describe()

    assert status["phase"] == "Succeeded", (status, seen)
    assert (status["restarts"], status["restartAttempt"]) == (0, 1), status
    assert pods.attempts() == {0, 1}, seen
    for rank in range(2):
        assert "finished in attempt 1" in e2e.wait_for_logs(f"{name}-node-{rank}", "finished")
    e2e.wait_for_event(name, "Suspended")
    e2e.wait_for_event(name, "Resumed")


def test_active_deadline_fails_the_job_and_releases_its_pods(e2e):
    """activeDeadlineSeconds, counted from the start: DeadlineExceeded, and every
    pod that still ran is deleted."""
    name = "deadline"
    e2e.create(ddpjob_manifest(name, e2e.image, command=SLEEP_FOREVER, activeDeadlineSeconds=5))
    e2e.wait_for_phase(name, "Running", 60)
    status = e2e.wait_for_phase(name, ("Succeeded", "Failed"), 60)
    assert status["phase"] == "Failed", status
    assert status["reason"] == "DeadlineExceeded", status
    # Counted from status.startTime (second precision, as Kubernetes writes times).
    assert seconds_between(status["startTime"], status["completionTime"]) >= 5, status
    e2e.cluster.wait_for(lambda: not e2e.pods(name), 60, "the job's pods deleted")


def test_ttl_after_finished_deletes_the_job(e2e):
    """ttlSecondsAfterFinished deletes the DDPJob that long after it finished;
    its children follow by garbage collection."""
    name = "short-lived"
    ttl = 3
    e2e.create(ddpjob_manifest(name, e2e.image, command=python_command("print('quick')"),
                               ttlSecondsAfterFinished=ttl))
    status = e2e.wait_for_phase(name, ("Succeeded", "Failed"), 60)
    assert status["phase"] == "Succeeded", status
    completed = parse_time(status["completionTime"])
    e2e.cluster.wait_for(lambda: e2e.job(name) is None, 30, "the DDPJob deleted by its TTL")
    gone_after = (dt.datetime.now(dt.timezone.utc) - completed).total_seconds()
    assert gone_after >= ttl - 0.5, gone_after  # not before its time
    e2e.cluster.wait_for(lambda: not e2e.pods(name) and e2e.service(name) is None, 90,
                         "its pods and Service garbage-collected")
