"""End-to-end: the job's Service is its own (issue 21, item 12; docs/security.md). A Service of
another owner that has the job's name is reported and never adopted, changed or deleted, and no
pod is created beside it; the job's own Service, deleted while the job runs, comes back within
seconds (the operator watches the jobs' Services)."""
from __future__ import annotations

import time

import pytest

from ddpjob.api import names

from .e2e_support import ddpjob_manifest, e2e, python_command  # noqa: F401 - e2e is a fixture

pytestmark = pytest.mark.cluster
SLEEP_FOREVER = python_command("import time; time.sleep(600)")
FAST_EXIT = {"spec": {"terminationGracePeriodSeconds": 1}}


def _foreign_service(e2e, name: str, *, labelled: bool) -> dict:
    """Another user's Service with the job's name: selects its own app, controlled by a
    ConfigMap of theirs (a real owner, so the garbage collector leaves it alone)."""
    owner = e2e.core.create_namespaced_config_map(e2e.namespace, {"metadata": {"name": f"{name}-owner"}})
    labels = {"app": "web", **({names.LABEL_JOB_NAME: name} if labelled else {})}
    e2e.core.create_namespaced_service(e2e.namespace, {
        "metadata": {"name": name, "labels": labels,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name,
                                          "uid": owner.metadata.uid, "controller": True}]},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080, "targetPort": 8080}]}})
    return e2e.service(name)


def _unchanged(service: dict) -> tuple:
    meta = service["metadata"]
    return (meta["uid"], meta["resourceVersion"], meta.get("labels"), meta.get("ownerReferences"),
            meta.get("annotations"), service["spec"]["selector"], service["spec"]["ports"])


@pytest.mark.parametrize("labelled", [False, True], ids=["unlabelled", "with-the-job-label"])
def test_a_service_of_another_owner_with_the_jobs_name_is_reported_and_left_alone(e2e, labelled):
    name = f"taken-{'l' if labelled else 'u'}"
    before = _foreign_service(e2e, name, labelled=labelled)
    e2e.create(ddpjob_manifest(name, e2e.image, command=SLEEP_FOREVER, template=FAST_EXIT,
                               startupTimeoutSeconds=20))
    held = e2e.wait_for_status(name, lambda s: s.get("reason") == "ServiceConflict", 30, "reason ServiceConflict")
    assert held["phase"] == "Pending", held
    assert f"Service {name} is not this job's" in held["message"], held
    assert f"ConfigMap {name}-owner" in held["message"], held  # names its owner
    [event] = e2e.wait_for_event(name, "ServiceConflict")
    assert event["type"] == "Warning" and f"ConfigMap {name}-owner" in event["message"], event
    assert e2e.pods(name) == []  # nothing that could never rendezvous

    failed = e2e.wait_for_phase(name, ("Failed", "Succeeded"), 60)
    assert failed["reason"] == "StartupTimeout" and f"Service {name} is not this job's" in failed["message"], failed
    assert e2e.pods(name) == []
    assert _unchanged(e2e.service(name)) == _unchanged(before)  # never adopted, changed or deleted
    e2e.delete_job(name)
    time.sleep(2)
    assert _unchanged(e2e.service(name)) == _unchanged(before)


def test_the_jobs_own_service_deleted_mid_run_is_recreated_within_seconds(e2e):
    name = "svc-back"
    job = e2e.create(ddpjob_manifest(name, e2e.image, command=SLEEP_FOREVER, template=FAST_EXIT))
    e2e.wait_for_phase(name, "Running", 120)
    pods = {p["metadata"]["uid"] for p in e2e.pods(name)}
    first = e2e.service(name)
    assert first["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]

    e2e.core.delete_namespaced_service(name, e2e.namespace)
    deleted = time.monotonic()
    again = e2e.cluster.wait_for(
        lambda: (lambda s: s if s and s["metadata"]["uid"] != first["metadata"]["uid"] else None)(e2e.service(name)),
        10, f"Service {name} recreated")
    took = time.monotonic() - deleted
    assert took < 10, took
    assert again["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert again["spec"]["selector"] == first["spec"]["selector"] and again["spec"]["clusterIP"] == "None"
    # The gang was left alone.
    status = e2e.status(name)
    assert status["phase"] == "Running" and status["restarts"] == 0, status
    assert {p["metadata"]["uid"] for p in e2e.pods(name)} == pods
    assert e2e.wait_for_event(name, "ServiceMissing")
    e2e.delete_job(name)
