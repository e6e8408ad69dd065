"""The operator's shell: reconcile passes against a fake API, and the kopf handlers called the
way kopf calls them (they are plain functions)."""
from __future__ import annotations

import asyncio
import datetime as dt
import threading

import kopf
import pytest

from ddpjob.api import names
from ddpjob.controller import handlers, workqueue
from ddpjob.api import spec
from tests.support.jobs import UID, pod_view
from ddpjob.controller.kube import ApiError, CreateOutcome, DeleteOutcome
from ddpjob.controller.reconcile import JobMemory, reconcile
from ddpjob.controller.settings import OperatorSettings, load_settings
from ddpjob.api.status import JobStatus

pytestmark = pytest.mark.unit

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
SETTINGS = OperatorSettings(coalesce_seconds=0.001)


def body(nnodes: int = 2, generation: int = 1, status: dict | None = None, **spec_fields) -> dict:
    obj = {"apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob",
           "metadata": {"name": "train", "namespace": "ns", "uid": UID, "generation": generation},
           "spec": {"nnodes": nnodes, "image": "img", **spec_fields}}
    if status is not None:
        obj["status"] = status
    return obj


def parse(obj: dict) -> spec.DDPJob:
    """A stand-in for schema.parse_ddpjob: these tests are about the shell, not validation."""
    fields = dict(obj["spec"])
    if fields.get("bad"):
        raise ValueError("spec.nnodes: must be an integer >= 1, got string \"two\"")
    if "failurePolicy" in fields:
        fields["failurePolicy"] = spec.FailurePolicy(**fields["failurePolicy"])
    meta = obj["metadata"]
    return spec.DDPJob(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid"), spec=spec.DDPJobSpec(**fields))


view = pod_view


class FakeKube:
    """Records requests in order; fails those it is told to."""

    def __init__(self):
        self.log: list[tuple] = []
        self.status: dict | None = None
        self.create_error: ApiError | None = None
        self.status_error: ApiError | None = None
        self.delete_gone = False
        self.lock = threading.Lock()

    def patch_status(self, namespace, name, status):
        self.log.append(("patch_status", status["phase"], status["reason"]))
        if self.status_error:
            raise self.status_error
        self.status = status
        return status

    def create_service(self, service):
        self.log.append(("create_service", service["metadata"]["name"]))

    def create_pods(self, pods):
        self.log.append(("create_pods", tuple(p["metadata"]["name"] for p in pods)))
        if self.create_error:
            return [CreateOutcome(p["metadata"]["name"], False, self.create_error) for p in pods]
        return [CreateOutcome(p["metadata"]["name"], True) for p in pods]

    def delete_pods(self, namespace, pods, *, force=False):
        pods = list(pods)
        self.log.append(("force_delete" if force else "delete", tuple(n for n, _ in pods)))
        return [DeleteOutcome(n, u, self.delete_gone or force) for n, u in pods]

    def delete_job(self, namespace, name, uid):
        self.log.append(("delete_job", name, uid))

    def close(self):
        pass

    def kinds(self) -> list[str]:
        return [entry[0] for entry in self.log]


def run_pass(obj, pods, memory, kube, events=None, now=NOW):
    events = [] if events is None else events
    return reconcile(obj, pods, memory, kube=kube, settings=SETTINGS, post_event=events.append, now=now, parse=parse)


# --- reconcile passes ---------------------------------------------------------------------------
def test_first_pass_writes_the_intent_then_creates_service_and_pods():
    kube, memory, events = FakeKube(), JobMemory(), []
    requeue = run_pass(body(), [], memory, kube, events)
    assert kube.log == [("patch_status", "Pending", "PodsCreated"), ("create_service", "train"),
                        ("create_pods", ("train-node-0", "train-node-1"))]
    assert [e.reason for e in events] == ["Created"] and requeue == 600
    assert memory.created == {0: {0, 1}} and memory.status.phase == "Pending"


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
    assert kube.status["reason"] != "ReconcileError" and memory.consecutive_errors == 0


def test_pods_refused_by_a_quota_are_retried_often_and_named_in_the_status():
    kube, memory, events = FakeKube(), JobMemory(), []
    quota = 'pods "train-node-1" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=1, limited: pods=1'
    kube.create_error = ApiError(403, "Forbidden", quota, "create pod train-node-1")
    delays = [run_pass(body(), [], memory, kube, events, now=NOW + dt.timedelta(seconds=i)) for i in range(10)]
    assert delays[:3] == [1.0, 2.0, 4.0] and max(delays) == SETTINGS.creation_retry_max_seconds
    assert kube.kinds().count("create_pods") == 10  # asked again every pass
    assert memory.refused == {0: {0: quota, 1: quota}}
    # Between the retries the status says which pods wait for what.
    plan_status = [entry for entry in kube.log if entry[0] == "patch_status"]
    assert ("patch_status", "Pending", "NodesPending") in plan_status
    kube.create_error = None
    run_pass(body(), [], memory, kube, events, now=NOW + dt.timedelta(seconds=11))
    assert memory.refused == {0: {}} and memory.created == {0: {0, 1}}


def test_an_unreachable_api_server_does_not_crash_the_pass():
    kube, memory, events = FakeKube(), JobMemory(), []
    kube.status_error = ApiError(0, "MaxRetryError", "connection refused", "patch status of train")
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
    assert kube.log[-1] == ("create_pods", ("train-node-0", "train-node-1")) and memory.created == {1: {0, 1}}


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
    from ddpjob.api import schema
    kube, memory = FakeKube(), JobMemory()
    reconcile(body(), [], memory, kube=kube, settings=SETTINGS, post_event=lambda e: None, now=NOW)
    assert kube.kinds()[-1] == "create_pods"
    reconcile(body(nnodes="two", generation=2), [], JobMemory(), kube=kube, settings=SETTINGS,
              post_event=lambda e: None, now=NOW)
    assert kube.status["reason"] == "InvalidSpec" and "spec.nnodes" in kube.status["message"]
    assert schema.parse_ddpjob is not None


# --- kopf wiring --------------------------------------------------------------------------------
def test_no_handler_makes_kopf_add_a_finalizer():
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == [] and registry._spawning.get_all_handlers() == []
    # (kopf adds finalizers only for changing/deletion handlers and daemons/timers: none here)
    assert {h.id for h in registry._indexing.get_all_handlers()} == {"ddpjob_pods", "ddpjob_workloads"}
    assert {h.id for h in registry._watching.get_all_handlers()} == {"pod_event", "ddpjob_event", "workload_event"}


def test_kopf_state_lives_under_the_project_group_and_only_our_pods_are_watched():
    settings = kopf.OperatorSettings()
    handlers.configure_kopf(settings)
    assert settings.persistence.progress_storage.prefix == "ddpjob.dev"
    assert settings.persistence.diffbase_storage.prefix == "ddpjob.dev"
    assert settings.persistence.diffbase_storage.key == "last-handled-configuration"
    from kopf._cogs.structs.references import Resource
    assert list(settings.watching.label_selectors.collect(Resource("", "v1", "pods"))) == [names.LABEL_JOB_NAME]


def pod_body(rank="1", attempt="0", phase="Running"):
    return {"metadata": {"name": f"train-node-{rank}", "namespace": "ns", "uid": f"u{rank}",
                         "labels": {names.LABEL_JOB_NAME: "train", names.LABEL_NODE_RANK: rank,
                                    names.LABEL_RESTART_ATTEMPT: attempt},
                         "ownerReferences": [{"kind": "DDPJob", "uid": UID, "controller": True}]},
            "status": {"phase": phase}}


def test_the_pod_index_is_keyed_by_namespace_and_job():
    result = asyncio.run(handlers.ddpjob_pods(body=pod_body()))
    ((key, value),) = result.items()
    assert key == ("ns", "train") and value.node_rank == 1 and value.phase == "Running"
    assert asyncio.run(handlers.ddpjob_pods(body=pod_body(rank="x"))) == {}


def test_settings_come_from_the_environment():
    s = load_settings({"DDPJOB_OPERATOR_CREATE_WORKERS": "64", "DDPJOB_OPERATOR_COALESCE_SECONDS": "0.2"})
    assert (s.create_workers, s.coalesce_seconds) == (64, 0.2)
    with pytest.raises(ValueError, match="DDPJOB_OPERATOR_CREATE_WORKERS"):
        load_settings({"DDPJOB_OPERATOR_CREATE_WORKERS": "many"})


async def _eventually(predicate, timeout=2.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_workers_react_to_pod_events_and_stop_with_the_job():
    async def scenario():
        runtime, kube, index = workqueue.Runtime(), FakeKube(), {}
        runtime.start(SETTINGS, lambda settings: kube)
        handlers.RUNTIME, saved = runtime, handlers.RUNTIME
        try:
            # kopf calls: the DDPJob is listed -> a worker starts and creates the gang.
            await handlers.ddpjob_event(event={"type": None, "object": body()}, ddpjob_pods=index)
            await _eventually(lambda: "create_pods" in kube.kinds())
            # the pods run: the pod watch updates the index and wakes the worker.
            index[("ns", "train")] = [view(0), view(1)]
            await handlers.pod_event(body=pod_body())
            await _eventually(lambda: (kube.status or {}).get("phase") == "Running")
            # our own status write comes back as an event: no pass, no request.
            writes = kube.kinds().count("patch_status")
            await handlers.ddpjob_event(event={"type": "MODIFIED", "object": body(status=kube.status)}, ddpjob_pods=index)
            await asyncio.sleep(0.05)
            assert kube.kinds().count("patch_status") == writes
            # suspend (a spec change: new generation) wakes it.
            await handlers.ddpjob_event(event={"type": "MODIFIED", "object": body(generation=2, suspend=True)}, ddpjob_pods=index)
            await _eventually(lambda: (kube.status or {}).get("phase") == "Suspended")
            # deleted: the worker goes.
            worker = runtime.workers[("ns", "train")]
            await handlers.ddpjob_event(event={"type": "DELETED", "object": body()}, ddpjob_pods=index)
            await _eventually(lambda: worker.task.done())
            assert runtime.workers == {}
        finally:
            handlers.RUNTIME = saved
            await runtime.stop()

    asyncio.run(scenario())


def test_a_recreated_job_of_the_same_name_gets_a_fresh_worker():
    async def scenario():
        runtime, kube = workqueue.Runtime(), FakeKube()
        runtime.start(SETTINGS, lambda settings: kube)
        try:
            runtime.observe(None, body(), {})
            first = runtime.workers[("ns", "train")]
            again = body()
            again["metadata"]["uid"] = "another-uid"
            runtime.observe("ADDED", again, {})
            await _eventually(lambda: first.task.done())
            assert runtime.workers[("ns", "train")].uid == "another-uid"
        finally:
            await runtime.stop()

    asyncio.run(scenario())


def test_a_clock_wakes_the_worker_without_any_event():
    async def scenario():
        runtime, kube = workqueue.Runtime(), FakeKube()
        runtime.start(SETTINGS, lambda settings: kube)
        try:
            index = {}
            runtime.observe(None, body(startupTimeoutSeconds=1), index)
            await _eventually(lambda: "create_pods" in kube.kinds())
            index[("ns", "train")] = [view(0, "Pending"), view(1, "Pending")]  # no event: only the clock
            await _eventually(lambda: (kube.status or {}).get("reason") == "StartupTimeout", timeout=5)
        finally:
            await runtime.stop()

    asyncio.run(scenario())


def test_reconcile_writes_no_status_kopf_would_not_accept():
    kube, memory = FakeKube(), JobMemory()
    run_pass(body(), [], memory, kube)
    assert JobStatus.from_dict(kube.status).to_dict() == kube.status


# --- the request layer (kube.py) with a fake ApiClient ------------------------------------------
class FakeResponse:
    def __init__(self, status, body):
        self.status, self.reason, self._body = status, "", body

    def read(self):
        import json
        return json.dumps(self._body).encode()


class FakeApiClient:
    """Answers like the API server: POST 201 or 409 AlreadyExists, DELETE 200 or 404."""

    def __init__(self, existing=(), missing=()):
        self.requests, self.existing, self.missing = [], set(existing), set(missing)
        self.lock = threading.Lock()

    def param_serialize(self, method, resource_path, query_params=None, header_params=None, body=None, auth_settings=None):
        return method, resource_path, header_params, body, query_params

    def call_api(self, method, url, headers, body, query, _request_timeout=None):
        with self.lock:
            self.requests.append((method, url, headers["Content-Type"], body, query))
        name = (body or {}).get("metadata", {}).get("name") or url.rsplit("/", 1)[-1]
        if method == "POST" and name in self.existing:
            return FakeResponse(409, {"reason": "AlreadyExists", "message": f"{name} already exists"})
        if method == "POST" and name == "refused":
            return FakeResponse(403, {"reason": "Forbidden", "message": 'violates PodSecurity "restricted:latest"'})
        if method == "DELETE" and name in self.missing:
            return FakeResponse(404, {"reason": "NotFound", "message": "not found"})
        return FakeResponse(201 if method == "POST" else 200, {"status": {"phase": "Running"}})

    def close(self):
        pass


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


# --- the ddpjob-operator command -------------------------------------------------------------------
@pytest.mark.parametrize("argv,env,expected", [
    ([], {}, dict(clusterwide=True, namespaces=[])),
    ([], {"DDPJOB_OPERATOR_NAMESPACES": "a, b"}, dict(clusterwide=False, namespaces=["a", "b"])),
    (["-n", "x"], {"DDPJOB_OPERATOR_NAMESPACES": "a"}, dict(clusterwide=False, namespaces=["x"])),
    (["-A"], {"DDPJOB_OPERATOR_NAMESPACES": "a"}, dict(clusterwide=True, namespaces=[])),
])
def test_ddpjob_operator_runs_kopf_standalone_with_its_scope(monkeypatch, argv, env, expected):
    calls = []
    monkeypatch.setattr(kopf, "run", lambda **kw: calls.append(kw))
    monkeypatch.setattr(kopf, "configure", lambda **kw: None)
    for key in ("DDPJOB_OPERATOR_NAMESPACES", "DDPJOB_OPERATOR_LIVENESS_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert handlers.main(argv) == 0
    assert calls == [dict(standalone=True, liveness_endpoint="http://0.0.0.0:8080/healthz", **expected)]


def test_a_gang_being_created_does_not_hold_up_the_status_of_running_jobs():
    """Passes that create a gang (a job without pods yet) may take seconds of POSTs on a busy
    API server; they run on a pool of their own, so a running job's status write never queues
    behind them (benchmarks/README.md, many jobs)."""
    release = threading.Event()

    class SlowCreates(FakeKube):
        def __init__(self):
            super().__init__()
            self.written: list[tuple[str, str]] = []

        def patch_status(self, namespace, name, status):
            self.written.append((name, status["phase"]))
            return super().patch_status(namespace, name, status)

        def create_pods(self, pods):
            release.wait(5)
            return super().create_pods(pods)

    def job(name: str) -> dict:
        obj = body()
        obj["metadata"].update(name=name, uid=f"uid-{name}")
        return obj

    async def scenario():
        runtime, kube = workqueue.Runtime(), SlowCreates()
        runtime.start(OperatorSettings(coalesce_seconds=0.001, reconcile_workers=1), lambda settings: kube)
        try:
            runtime.observe(None, job("new"), {})  # its creation blocks the one gang thread
            await _eventually(lambda: ("new", "Pending") in kube.written)
            # a job that has pods: its pass (a status write) runs on the other pool meanwhile
            pods = [view(r, owner_uid="uid-train", name=f"train-node-{r}") for r in (0, 1)]
            runtime.observe(None, job("train"), {("ns", "train"): pods})
            await _eventually(lambda: any(name == "train" for name, _ in kube.written))
            assert not release.is_set() and "create_pods" not in kube.kinds()  # "new" still blocked
        finally:
            release.set()
            await runtime.stop()

    asyncio.run(scenario())
