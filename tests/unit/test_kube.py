"""The request layer (controller/kube.py) with a fake ApiClient: the requests it sends and how it
reads the API server's answers."""
from __future__ import annotations

import pytest

from ddpjob.controller.kube import ApiError
from tests.support.operator_fakes import SETTINGS, FakeApiClient

pytestmark = pytest.mark.unit


def test_kube_creates_pods_concurrently_and_treats_already_exists_as_created():
    from ddpjob.controller.kube import Kube
    api = FakeApiClient(existing={"p1"})
    kube = Kube(api, SETTINGS)
    pods = [{"metadata": {"name": n, "namespace": "ns"}} for n in ("p0", "p1", "refused")]
    outcomes = kube.create_pods(pods)
    assert [(o.name, o.created) for o in outcomes] == [("p0", True), ("p1", True), ("refused", False)]
    assert outcomes[2].error.permanent and not outcomes[1].error
    assert {r[1] for r in api.requests} == {"/api/v1/namespaces/ns/pods"}
    assert all(("fieldManager", "ddpjob-operator") in r[4] for r in api.requests)
    kube.close()


def test_kube_reads_no_body_it_does_not_use_but_every_error(monkeypatch):
    # A created or deleted pod comes back whole (kilobytes of JSON per pod); nothing reads it.
    from ddpjob.controller import kube as kube_module

    parsed = []
    real = kube_module.fastjson.loads
    monkeypatch.setattr(kube_module.fastjson, "loads", lambda raw: parsed.append(raw) or real(raw))
    api = FakeApiClient(existing={"p1"})
    kube = kube_module.Kube(api, SETTINGS)
    outcomes = kube.create_pods([{"metadata": {"name": n, "namespace": "ns"}} for n in ("p0", "p1")])
    kube.delete_pods("ns", [("p0", "u0")])
    kube.relabel_pod("ns", "p0", "u0", {"a": "b"})
    assert len(api.requests) == 4 and len(parsed) == 1  # only p1's 409, read to say why
    assert [o.created for o in outcomes] == [True, True]
    assert kube.patch_status("ns", "train", {"phase": "Running"})["status"] == {"phase": "Running"}
    assert len(parsed) == 2  # what a status write returns is read
    kube.close()


def test_kube_deletes_with_a_uid_precondition_and_reads_404_as_gone():
    from ddpjob.controller.kube import Kube
    api = FakeApiClient(missing={"gone"})
    kube = Kube(api, SETTINGS)
    outcomes = kube.delete_pods("ns", [("alive", "u1"), ("gone", "u2")])
    assert [(o.name, o.gone, o.error) for o in outcomes] == [("alive", False, None), ("gone", True, None)]
    assert api.requests[0][3]["preconditions"] == {"uid": "u1"} and "gracePeriodSeconds" not in api.requests[0][3]
    kube.delete_pods("ns", [("stuck", "u3")], force=True)
    assert api.requests[-1][3]["gracePeriodSeconds"] == 0


def test_kube_patches_the_status_subresource_with_a_merge_patch():
    from ddpjob.controller.kube import Kube
    api = FakeApiClient()
    Kube(api, SETTINGS).patch_status("ns", "train", {"phase": "Running"})
    method, url, content_type, body, _ = api.requests[0]
    assert (method, url, content_type) == ("PATCH", "/apis/ddpjob.dev/v1alpha1/namespaces/ns/ddpjobs/train/status",
                                           "application/merge-patch+json")
    assert body == {"status": {"phase": "Running"}}


def test_kube_sends_the_status_writes_precondition_in_the_patch():
    """The resourceVersion goes in the merge patch's metadata: the API server then refuses the
    write (409 Conflict) when the job changed since (tests/cluster/test_status_precondition.py)."""
    from ddpjob.controller.kube import ApiError, Kube
    api = FakeApiClient()
    Kube(api, SETTINGS).patch_status("ns", "train", {"phase": "Running"}, resource_version="42")
    assert api.requests[0][3] == {"metadata": {"resourceVersion": "42"}, "status": {"phase": "Running"}}
    assert ApiError(409, "Conflict", "modified").conflict
    assert not ApiError(409, "AlreadyExists", "exists").conflict


@pytest.mark.parametrize("status,message,permanent", [
    (422, "spec.containers[0].image: Required value", True),
    (400, "bad request", True),
    (403, 'pods "x" is forbidden: violates PodSecurity "restricted:latest"', True),
    (403, 'pods "x" is forbidden: exceeded quota: gpu-quota', False),
    (403, 'pods is forbidden: User "system:serviceaccount:x" cannot create resource "pods"', False),
    (500, "etcdserver: leader changed", False),
])
def test_which_api_errors_a_retry_cannot_fix(status, message, permanent):
    assert ApiError(status, "", message).permanent is permanent


def test_kube_creates_the_service_and_reads_the_one_in_its_place_only_when_there_is_one():
    from ddpjob.controller.kube import Kube
    service = {"metadata": {"name": "train", "namespace": "ns"}}
    api = FakeApiClient()
    assert Kube(api, SETTINGS).create_service(service) is None
    assert [r[:2] for r in api.requests] == [("POST", "/api/v1/namespaces/ns/services")]
    api = FakeApiClient(existing={"train"})
    found = Kube(api, SETTINGS).create_service(service)
    assert [r[:2] for r in api.requests] == [("POST", "/api/v1/namespaces/ns/services"),
                                             ("GET", "/api/v1/namespaces/ns/services/train")]
    assert found == {"status": {"phase": "Running"}}  # what the API server holds, as it holds it
