"""End-to-end: what users can rely on when they edit a running job, label their own pods like a
job's, or run into a ResourceQuota (issue 11, operator items 1, 2 and 5)."""
from __future__ import annotations

import json
import time

import pytest

from ddpjob import contract
from ddpjob.api import names, validation
from ddpjob.controller import builders

from .e2e_support import PodRecorder, ddpjob_manifest, e2e, python_command  # noqa: F401 - e2e is a fixture

pytestmark = pytest.mark.cluster
SLEEP_FOREVER = python_command("import time; time.sleep(600)")
FAST_EXIT = {"spec": {"terminationGracePeriodSeconds": 1}}


def _env(pod: dict) -> dict[str, str]:
    [container] = pod["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", ())}


def _refusal(call) -> dict:
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as caught:
        call()
    return json.loads(caught.value.body)


def test_a_running_gang_keeps_its_shape_and_a_suspended_job_takes_the_new_one(e2e):
    """Growing nnodes while the job runs is refused (the API server names spec.nnodes) and
    creates no pod; a field that steers only the operator can change; suspending and reshaping
    in one edit is allowed, and the resumed gang has the new shape everywhere."""
    name = "reshape"
    e2e.create(ddpjob_manifest(name, e2e.image, command=SLEEP_FOREVER, template=FAST_EXIT))
    e2e.wait_for_phase(name, "Running", 120)

    refused = _refusal(lambda: e2e.patch_spec(name, {"nnodes": 3}))
    assert refused["code"] == 422, refused
    assert [c["field"] for c in refused["details"]["causes"]] == ["spec.nnodes"], refused
    assert "cannot change while the job runs" in refused["message"]
    _refusal(lambda: e2e.patch_spec(name, {"env": [{"name": "SEED", "value": "2"}]}))
    e2e.patch_spec(name, {"failurePolicy": {"maxRestarts": 7}})  # steers the operator only
    pods = e2e.pods(name)
    assert sorted(p["metadata"]["name"] for p in pods) == [f"{name}-node-0", f"{name}-node-1"]
    assert {_env(p)[contract.WORLD_SIZE] for p in pods} == {"2"}
    assert e2e.status(name)["phase"] == "Running" and e2e.status(name)["nnodes"] == 2

    e2e.patch_spec(name, {"suspend": True, "nnodes": 3})
    e2e.wait_for_phase(name, "Suspended", 30)
    e2e.cluster.wait_for(lambda: not e2e.pods(name), 60, "the suspended job's pods deleted")
    e2e.patch_spec(name, {"suspend": False})
    status = e2e.wait_for_status(name, lambda s: s.get("phase") == "Running" and s.get("restartAttempt") == 1,
                                 120, "the resumed gang running")
    assert (status["nnodes"], status["ready"], status["restarts"]) == (3, "3/3", 0), status
    pods = e2e.pods(name)
    assert len(pods) == 3 and {_env(p)[contract.WORLD_SIZE] for p in pods} == {"3"}


def test_a_pod_the_job_does_not_own_is_never_deleted(e2e):
    """A user's pod that carries the job's labels (even its rank and attempt labels) but no
    owner reference to the job survives the job's whole life: creation, success, cleanup."""
    name = "not-mine"
    manifest = ddpjob_manifest(name, e2e.image, command=python_command("print('done')"),
                               cleanPodPolicy="All", template=FAST_EXIT)
    job = validation.parse_ddpjob({**manifest, "metadata": {"name": name, "namespace": e2e.namespace}})
    lookalike = builders.build_pods(job, 0, [1])[0]
    lookalike["metadata"]["name"] = "my-own-pod"
    lookalike["metadata"].pop("ownerReferences", None)
    lookalike["spec"]["containers"][0]["command"] = SLEEP_FOREVER
    lookalike["spec"].pop("hostname", None)
    lookalike["spec"].pop("subdomain", None)
    e2e.core.create_namespaced_pod(e2e.namespace, lookalike)

    with PodRecorder(e2e, name) as recorder:
        e2e.create(manifest)
        status = e2e.wait_for_phase(name, ("Succeeded", "Failed"), 120)
        seen = recorder.describe()
    assert status["phase"] == "Succeeded", (status, seen)
    e2e.cluster.wait_for(lambda: [p["metadata"]["name"] for p in e2e.pods(name)] == ["my-own-pod"], 30,
                         "the job's own pods cleaned up (cleanPodPolicy All)")
    mine = e2e.pod("my-own-pod")
    assert mine is not None and not mine["metadata"].get("deletionTimestamp"), mine["metadata"]


def _quota(e2e, pods: int) -> None:
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"},
            "spec": {"hard": {"pods": str(pods)}}}
    if e2e.core.list_namespaced_resource_quota(e2e.namespace).items:
        e2e.core.replace_namespaced_resource_quota("pods", e2e.namespace, {
            **body, "metadata": {"name": "pods", "resourceVersion":
                                 e2e.core.read_namespaced_resource_quota("pods", e2e.namespace).metadata.resource_version}})
    else:
        e2e.core.create_namespaced_resource_quota(e2e.namespace, body)
    e2e.cluster.wait_for(  # the quota controller fills in status.hard before admission uses it
        lambda: (e2e.core.read_namespaced_resource_quota("pods", e2e.namespace).status.hard or {}).get("pods")
        == str(pods), 30, "the ResourceQuota observed")


def test_a_gang_refused_by_a_quota_starts_promptly_once_the_quota_is_raised(e2e):
    name = "quota-lifted"
    _quota(e2e, 1)
    e2e.create(ddpjob_manifest(name, e2e.image, command=SLEEP_FOREVER, template=FAST_EXIT))
    waiting = e2e.wait_for_status(name, lambda s: "exceeded quota" in s.get("message", ""), 60,
                                  "the quota named in the status")
    assert waiting["phase"] == "Pending", waiting
    # Refused for half a minute: a plain error backoff (1, 2, 4 ... 60 s) would next look 30 s
    # after the quota is raised; retries of refused pods stay a few seconds apart.
    time.sleep(33)
    _quota(e2e, 10)
    status = e2e.wait_for_phase(name, "Running", 15)
    assert status["ready"] == "2/2" and status["restarts"] == 0, status


def test_a_gang_the_quota_never_admits_times_out_naming_the_quota(e2e):
    name = "quota-kept"
    _quota(e2e, 1)
    e2e.create(ddpjob_manifest(name, e2e.image, command=SLEEP_FOREVER, template=FAST_EXIT,
                               startupTimeoutSeconds=8))
    status = e2e.wait_for_phase(name, ("Failed", "Succeeded"), 60)
    assert (status["phase"], status["reason"]) == ("Failed", "StartupTimeout"), status
    assert "not created" in status["message"] and "exceeded quota" in status["message"], status["message"]
    e2e.cluster.wait_for(lambda: not e2e.unfinished_pods(name), 60, "the admitted pod released")
