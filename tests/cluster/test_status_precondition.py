"""The operator's status write is conditional (docs/security.md, "Two operator replicas"): the
real API server refuses a merge patch of the status subresource whose resourceVersion is not the
job's (409 Conflict), so a write decided on an older view never lands over a newer one."""
from __future__ import annotations

import pytest

from ddpjob.api import names
from ddpjob.controller.kube import ApiError, Kube
from ddpjob.controller.settings import OperatorSettings
from tests.testbed.operator_runner import apply_manifests

pytestmark = pytest.mark.cluster


def test_the_api_server_refuses_a_status_write_decided_on_an_older_version(cluster, kubectl, namespace):
    from kubernetes import client

    apply_manifests(kubectl, include_workloads=False)
    jobs = client.CustomObjectsApi(cluster.api_client)
    created = jobs.create_namespaced_custom_object(
        names.API_GROUP, names.API_VERSION, namespace, names.PLURAL,
        {"apiVersion": f"{names.API_GROUP}/{names.API_VERSION}", "kind": "DDPJob",
         "metadata": {"name": "conditional"}, "spec": {"nnodes": 1, "image": "busybox"}})
    seen = created["metadata"]["resourceVersion"]
    kube = Kube(cluster.api_client, OperatorSettings())
    try:
        # B's write, on the version both replicas saw: it lands and moves the job on
        written = kube.patch_status(namespace, "conditional", {"phase": "Running", "reason": "GangRunning"},
                                    resource_version=seen)
        assert written["status"]["phase"] == "Running"
        newer = written["metadata"]["resourceVersion"]
        assert int(newer) > int(seen)
        # A's write, decided on that same older version, sent late: refused, and nothing of it lands
        with pytest.raises(ApiError) as refused:
            kube.patch_status(namespace, "conditional", {"phase": "Restarting", "reason": "RetryableFailure"},
                              resource_version=seen)
        assert refused.value.conflict, refused.value
        stored = jobs.get_namespaced_custom_object(names.API_GROUP, names.API_VERSION, namespace,
                                                   names.PLURAL, "conditional")
        assert stored["status"]["phase"] == "Running" and stored["metadata"]["resourceVersion"] == newer
        # on the newest version, the next write lands
        again = kube.patch_status(namespace, "conditional", {"phase": "Succeeded", "reason": "Completed"},
                                  resource_version=newer)
        assert again["status"]["phase"] == "Succeeded"
    finally:
        kube.close()
