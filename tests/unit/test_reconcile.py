"""A reconcile pass (controller/reconcile.py) against a fake API: what it asks the API server
for, in which order, and how it reads the answers and the errors."""
from __future__ import annotations

import datetime as dt

import pytest

from ddpjob.controller.kube import ApiError
from ddpjob.controller.reconcile import Creations, JobMemory, reconcile
from ddpjob.api.status import JobStatus
from tests.support.jobs import UID, pod_view
from tests.support.operator_fakes import NOW, SETTINGS, FakeKube, apply_merge_patch, body, parse, run_pass

pytestmark = pytest.mark.unit

view = pod_view


# --- reconcile passes ---------------------------------------------------------------------------
def test_first_pass_writes_the_intent_then_creates_service_and_pods():
    kube, memory, events = FakeKube(), JobMemory(), []
    requeue = run_pass(body(), [], memory, kube, events)
    assert kube.log == [("patch_status", "Pending", "PodsCreated"), ("create_service", "train"),
                        ("create_pods", ("train-node-0", "train-node-1"))]
    assert [e.reason for e in events] == ["Created"] and requeue == 600
    assert memory.creations == Creations(0, {0, 1}) and memory.status.phase == "Pending"


def test_no_duplicate_creates_while_the_watch_catches_up():
    kube, memory = FakeKube(), JobMemory()
    run_pass(body(), [], memory, kube)
    run_pass(body(), [], memory, kube)
    assert kube.kinds().count("create_pods") == 1


def test_status_follows_the_pods_and_nothing_is_written_when_nothing_changed():
    kube, memory, events = FakeKube(), JobMemory(), []
    run_pass(body(), [], memory, kube, events)
    run_pass(body(), [view(0), view(1)], memory, kube, events)
    assert kube.status["phase"] == "Running" and kube.status["ready"] == "2/2"
    assert events[-1].reason == "Running"
    kube.log.clear()
    run_pass(body(), [view(0), view(1)], memory, kube, events)
    assert kube.log == []  # not one request when there is nothing to do


def test_operator_restart_mid_job_creates_no_duplicates():
    kube, memory = FakeKube(), JobMemory()
    run_pass(body(), [], memory, kube)
    run_pass(body(), [view(0), view(1)], memory, kube)
    restarted = body(status=kube.status)  # what the API holds; a fresh process has no memory
    fresh_kube = FakeKube()
    run_pass(restarted, [view(0), view(1)], JobMemory(), fresh_kube, now=NOW + dt.timedelta(seconds=30))
    assert fresh_kube.log == []


def test_permanent_refusal_of_a_pod_fails_the_job_with_the_admission_message():
    kube, memory, events = FakeKube(), JobMemory(), []
    kube.create_error = ApiError(403, "Forbidden", 'pods "train-node-0" is forbidden: violates PodSecurity '
                                 '"restricted:latest": allowPrivilegeEscalation != false', "create pod train-node-0")
    requeue = run_pass(body(), [], memory, kube, events)
    assert kube.status["phase"] == "Failed" and kube.status["reason"] == "PodCreationRefused"
    assert "violates PodSecurity" in kube.status["message"]
    assert [e.reason for e in events] == ["Created", "PodCreationRefused"] and requeue is None


def test_a_transient_error_reaches_the_status_and_an_event_then_backs_off():
    kube, memory, events = FakeKube(), JobMemory(), []
    kube.create_error = ApiError(500, "InternalError", "etcdserver: request timed out", "create pod train-node-0")
    first = run_pass(body(), [], memory, kube, events)
    assert (kube.status["phase"], kube.status["reason"]) == ("Pending", "ReconcileError")
    assert "etcdserver: request timed out" in kube.status["message"] and "create pod train-node-0" in kube.status["message"]
    assert [e.reason for e in events] == ["Created", "ReconcileError"] and events[-1].type == "Warning"
    second = run_pass(body(), [], memory, kube, events)
    assert (first, second) == (1.0, 2.0)
    assert [e.reason for e in events].count("ReconcileError") == 1  # the same error is not re-announced
    kube.create_error = None
    run_pass(body(), [], memory, kube, events)
    assert kube.status["reason"] != "ReconcileError" and memory.errors.consecutive == 0


def test_pods_refused_by_a_quota_are_retried_often_and_named_in_the_status():
    kube, memory, events = FakeKube(), JobMemory(), []
    quota = 'pods "train-node-1" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=1, limited: pods=1'
    kube.create_error = ApiError(403, "Forbidden", quota, "create pod train-node-1")
    delays = [run_pass(body(), [], memory, kube, events, now=NOW + dt.timedelta(seconds=i)) for i in range(10)]
    assert delays[:3] == [1.0, 2.0, 4.0] and max(delays) == SETTINGS.creation_retry_max_seconds
    assert kube.kinds().count("create_pods") == 10  # asked again every pass
    assert memory.creations == Creations(0, set(), {0: quota, 1: quota})
    # Between the retries the status says which pods wait for what.
    plan_status = [entry for entry in kube.log if entry[0] == "patch_status"]
    assert ("patch_status", "Pending", "NodesPending") in plan_status
    kube.create_error = None
    run_pass(body(), [], memory, kube, events, now=NOW + dt.timedelta(seconds=11))
    assert memory.creations == Creations(0, {0, 1}, {})


def test_an_unreachable_api_server_does_not_crash_the_pass():
    kube, memory, events = FakeKube(), JobMemory(), []
    kube.status_error = ApiError(0, "MaxRetryError", "connection refused", "patch status of DDPJob train")
    assert run_pass(body(), [], memory, kube, events) == 1.0
    assert "create_pods" not in kube.kinds()  # no intent written, no pods
    assert events[-1].reason == "ReconcileError"


def test_a_bug_is_reported_like_an_api_error():
    kube, memory, events = FakeKube(), JobMemory(), []
    kube.create_pods = lambda pods: (_ for _ in ()).throw(KeyError("oops"))
    assert run_pass(body(), [], memory, kube, events) == 1.0
    assert kube.status["reason"] == "ReconcileError" and "KeyError" in kube.status["message"]


def test_invalid_spec_fails_and_creates_nothing():
    kube, memory, events = FakeKube(), JobMemory(), []
    run_pass(body(bad=True), [], memory, kube, events)
    assert kube.kinds() == ["patch_status"] and kube.status["reason"] == "InvalidSpec"
    assert "spec.nnodes" in kube.status["message"] and events[0].type == "Warning"


def test_ttl_deletes_the_ddpjob():
    kube, memory = FakeKube(), JobMemory()
    run_pass(body(ttlSecondsAfterFinished=10), [], memory, kube)
    done = [view(0, "Succeeded", exit_code=0), view(1, "Succeeded", exit_code=0)]
    assert run_pass(body(ttlSecondsAfterFinished=10), done, memory, kube) == 10
    run_pass(body(ttlSecondsAfterFinished=10), done, memory, kube, now=NOW + dt.timedelta(seconds=11))
    assert kube.log[-1] == ("delete_job", "train", UID)


def test_a_retryable_failure_deletes_the_gang_and_recreates_it_when_gone():
    kube, memory, events = FakeKube(), JobMemory(), []
    run_pass(body(), [], memory, kube, events)
    run_pass(body(), [view(0), view(1)], memory, kube, events)
    run_pass(body(), [view(0), view(1, "Failed", exit_code=1)], memory, kube, events)
    assert kube.log[-2:] == [("patch_status", "Restarting", "RetryableFailure"), ("delete", ("train-node-0", "train-node-1"))]
    assert "exited with code 1" in events[-1].message
    run_pass(body(), [], memory, kube, events)
    assert kube.log[-1] == ("create_pods", ("train-node-0", "train-node-1")) and memory.creations == Creations(1, {0, 1})


def test_pods_known_deleted_are_ignored_even_if_a_stale_watch_still_lists_them():
    kube, memory = FakeKube(), JobMemory()
    kube.delete_gone = True
    run_pass(body(), [], memory, kube)
    run_pass(body(), [view(0), view(1, "Failed", exit_code=1)], memory, kube)  # restart: both deleted, 404
    run_pass(body(), [view(0), view(1, "Failed", exit_code=1)], memory, kube)  # the watch never said DELETED
    assert kube.log[-1] == ("create_pods", ("train-node-0", "train-node-1"))


def test_stuck_terminating_pods_are_force_deleted_with_an_event():
    kube, memory, events = FakeKube(), JobMemory(), []
    run_pass(body(), [], memory, kube, events)
    run_pass(body(), [view(0), view(1, "Failed", exit_code=1)], memory, kube, events)
    stuck = [view(0, deletion_at=NOW - dt.timedelta(seconds=61))]
    run_pass(body(), stuck, memory, kube, events)
    assert ("force_delete", ("train-node-0",)) in kube.log and events[-1].reason == "ForceDeleted"


def test_a_job_being_deleted_is_left_to_the_garbage_collector():
    obj = body()
    obj["metadata"]["deletionTimestamp"] = "2025-01-01T11:00:00Z"
    kube = FakeKube()
    assert run_pass(obj, [view(0)], JobMemory(), kube) is None and kube.log == []


def test_the_real_parser_is_used_by_default():
    from ddpjob.api import validation
    kube, memory = FakeKube(), JobMemory()
    reconcile(body(), [], memory, kube=kube, settings=SETTINGS, post_event=lambda e: None, now=NOW)
    assert kube.kinds()[-1] == "create_pods"
    reconcile(body(nnodes="two", generation=2), [], JobMemory(), kube=kube, settings=SETTINGS,
              post_event=lambda e: None, now=NOW)
    assert kube.status["reason"] == "InvalidSpec" and "spec.nnodes" in kube.status["message"]
    assert validation.parse_ddpjob is not None


def test_reconcile_writes_no_status_kopf_would_not_accept():
    kube, memory = FakeKube(), JobMemory()
    run_pass(body(), [], memory, kube)
    # What the server holds reads back as itself (its nulls are the removals of a merge patch).
    assert apply_merge_patch({}, JobStatus.from_dict(kube.status).to_dict()) == kube.status


# --- the job's Service (decide: ServiceConflict; docs/security.md) ------------------------------
from ddpjob.controller.decide import ServiceView, view_service  # noqa: E402
from tests.support.operator_fakes import foreign_service  # noqa: E402

OWN_SERVICE = ServiceView("train", "uid-svc", owner_uid=UID, owner=f"DDPJob train (uid {UID})")


def test_a_labelled_service_of_another_owner_is_seen_before_anything_is_created():
    kube, memory, events = FakeKube(), JobMemory(), []
    other = view_service(foreign_service(owner={"kind": "Deployment", "name": "web", "uid": "uid-web"}))
    run_pass(body(), [], memory, kube, events, services=[other])
    assert kube.log == [("patch_status", "Pending", "ServiceConflict")]  # no Service, no pod
    assert "Deployment web" in kube.status["message"]
    assert [(e.type, e.reason) for e in events] == [("Warning", "ServiceConflict")]


def test_an_unlabelled_service_of_another_owner_found_by_the_creation_holds_the_gang():
    kube, memory, events = FakeKube(), JobMemory(), []
    kube.existing_service = foreign_service()
    requeue = run_pass(body(), [], memory, kube, events, services=[])
    # The creation found it: no pod, and the pass decides again from what it found.
    assert kube.log == [("patch_status", "Pending", "PodsCreated"), ("create_service", "train"),
                        ("patch_status", "Pending", "ServiceConflict")]
    assert "it has no controller owner reference" in kube.status["message"]
    assert [e.reason for e in events] == ["Created", "ServiceConflict"]
    assert requeue == SETTINGS.creation_retry_max_seconds  # not watched: looked at again soon
    kube.log.clear()
    run_pass(body(status=kube.status), [], memory, kube, events, services=[], now=NOW + dt.timedelta(seconds=1))
    assert kube.log == []  # remembered for a while: no request per pass
    kube.existing_service = None  # its owner deleted it
    later = NOW + dt.timedelta(seconds=SETTINGS.creation_retry_max_seconds + 1)
    run_pass(body(status=kube.status), [], memory, kube, events, services=[], now=later)
    assert kube.log == [("patch_status", "Pending", "NodesPending"), ("create_service", "train"),
                        ("create_pods", ("train-node-0", "train-node-1"))]


def test_our_own_service_found_by_the_creation_is_used():
    kube, memory = FakeKube(), JobMemory()
    kube.existing_service = foreign_service(owner={"kind": "DDPJob", "name": "train", "uid": UID})
    run_pass(body(), [], memory, kube, services=[])
    assert kube.kinds() == ["patch_status", "create_service", "create_pods"]


def test_the_jobs_own_service_deleted_mid_run_is_recreated_without_touching_the_gang():
    kube, memory, events = FakeKube(), JobMemory(), []
    run_pass(body(), [], memory, kube, events, services=[])
    run_pass(body(), [view(0), view(1)], memory, kube, events, services=[OWN_SERVICE])
    kube.log.clear()
    run_pass(body(), [view(0), view(1)], memory, kube, events, services=[OWN_SERVICE])
    assert kube.log == []  # watched: no request per pass while it is there
    run_pass(body(), [view(0), view(1)], memory, kube, events, services=[])  # deleted
    assert kube.log == [("create_service", "train")] and events[-1].reason == "ServiceMissing"
