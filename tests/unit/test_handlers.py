"""The kopf handlers (controller/handlers.py), called the way kopf calls them (they are plain
functions): the registry, kopf's settings, the pod index, the events that drive the workers,
and the ddpjob-operator command."""
from __future__ import annotations

import asyncio

import kopf
import pytest

from ddpjob.api import names
from ddpjob.controller import handlers, workqueue
from ddpjob.controller.decide import ServiceView
from tests.support.jobs import UID, pod_view
from tests.support.operator_fakes import SETTINGS, FakeKube, body, eventually

pytestmark = pytest.mark.unit

view = pod_view


# --- kopf wiring --------------------------------------------------------------------------------
def test_no_handler_makes_kopf_add_a_finalizer():
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == [] and registry._spawning.get_all_handlers() == []
    # (kopf adds finalizers only for changing/deletion handlers and daemons/timers: none here)
    assert {h.id for h in registry._indexing.get_all_handlers()} == {"ddpjob_pods", "ddpjob_workloads",
                                                                      "ddpjob_services"}
    assert {h.id for h in registry._watching.get_all_handlers()} == {"pod_deleted", "ddpjob_event", "workload_event",
                                                                      "service_event"}


def test_kopf_state_lives_under_the_project_group_and_only_our_pods_are_watched():
    settings = kopf.OperatorSettings()
    handlers.configure_kopf(settings)
    assert settings.persistence.progress_storage.prefix == "ddpjob.dev"
    assert settings.persistence.diffbase_storage.prefix == "ddpjob.dev"
    assert settings.persistence.diffbase_storage.key == "last-handled-configuration"
    from kopf._cogs.structs.references import Resource
    assert list(settings.watching.label_selectors.collect(Resource("", "v1", "pods"))) == [names.LABEL_JOB_NAME]
    assert list(settings.watching.label_selectors.collect(Resource("", "v1", "services"))) == [names.LABEL_JOB_NAME]


def test_kopf_builds_no_diff_base_while_no_handler_reads_one():
    # kopf deep-copies every watched object for its diff base on every event; only change
    # handlers and daemons read it. Without them the storage builds none; with one, kopf's own.
    settings = kopf.OperatorSettings()
    handlers.configure_kopf(settings)
    pod = kopf.Body(pod_body())
    assert isinstance(settings.persistence.diffbase_storage, handlers.UnreadDiffBaseStorage)
    assert settings.persistence.diffbase_storage.build(body=pod) == {}

    registry = kopf.OperatorRegistry()

    @kopf.on.update("v1", "pods", registry=registry)
    def changed(**_):
        pass

    handlers.configure_kopf(settings, registry)
    storage = settings.persistence.diffbase_storage
    assert type(storage) is kopf.AnnotationsDiffBaseStorage and storage.prefix == "ddpjob.dev"
    assert storage.build(body=pod)["metadata"]["labels"][names.LABEL_JOB_NAME] == "train"


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


def test_the_service_index_says_whose_each_service_is():
    service = {"metadata": {"name": "train", "namespace": "ns", "uid": "s1", "labels": {names.LABEL_JOB_NAME: "train"},
                            "ownerReferences": [{"kind": "DDPJob", "name": "train", "uid": UID, "controller": True}]}}
    ((key, value),) = asyncio.run(handlers.ddpjob_services(body=service)).items()
    assert key == ("ns", "train") and (value.name, value.owner_uid) == ("train", UID)


def test_a_deleted_service_wakes_the_job_and_is_recreated():
    async def scenario():
        runtime, kube, pods, services = workqueue.Runtime(), FakeKube(), {}, {}
        runtime.start(SETTINGS, lambda settings: kube)
        handlers.RUNTIME, saved = runtime, handlers.RUNTIME
        try:
            await handlers.ddpjob_event(event={"type": None, "object": body()}, ddpjob_pods=pods,
                                        ddpjob_services=services)
            await eventually(lambda: "create_pods" in kube.kinds())
            pods[("ns", "train")] = [view(0), view(1)]
            services[("ns", "train")] = [ServiceView("train", "s1", owner_uid=UID)]
            await handlers.ddpjob_pods(body=pod_body())
            await eventually(lambda: (kube.status or {}).get("phase") == "Running")
            kube.log.clear()
            del services[("ns", "train")]  # the Service watch: DELETED
            await handlers.service_event(body={"metadata": {"name": "train", "namespace": "ns",
                                                            "labels": {names.LABEL_JOB_NAME: "train"}}})
            await eventually(lambda: "create_service" in kube.kinds())
            assert "create_pods" not in kube.kinds() and "delete" not in kube.kinds()
        finally:
            handlers.RUNTIME = saved
            await runtime.stop()

    asyncio.run(scenario())


def test_workers_react_to_pod_events_and_stop_with_the_job():
    async def scenario():
        runtime, kube, index = workqueue.Runtime(), FakeKube(), {}
        runtime.start(SETTINGS, lambda settings: kube)
        handlers.RUNTIME, saved = runtime, handlers.RUNTIME
        try:
            # kopf calls: the DDPJob is listed -> a worker starts and creates the gang.
            await handlers.ddpjob_event(event={"type": None, "object": body()}, ddpjob_pods=index)
            await eventually(lambda: "create_pods" in kube.kinds())
            # the pods run: the pod watch updates the index and wakes the worker.
            index[("ns", "train")] = [view(0), view(1)]
            await handlers.ddpjob_pods(body=pod_body())
            await eventually(lambda: (kube.status or {}).get("phase") == "Running")
            # our own status write comes back as an event: no pass, no request.
            writes = kube.kinds().count("patch_status")
            await handlers.ddpjob_event(event={"type": "MODIFIED", "object": body(status=kube.status)}, ddpjob_pods=index)
            await asyncio.sleep(0.05)
            assert kube.kinds().count("patch_status") == writes
            # suspend (a spec change: new generation) wakes it.
            await handlers.ddpjob_event(event={"type": "MODIFIED", "object": body(generation=2, suspend=True)}, ddpjob_pods=index)
            await eventually(lambda: (kube.status or {}).get("phase") == "Suspended")
            # deleted: the worker goes.
            worker = runtime.workers[("ns", "train")]
            await handlers.ddpjob_event(event={"type": "DELETED", "object": body()}, ddpjob_pods=index)
            await eventually(lambda: worker.task.done())
            assert runtime.workers == {}
        finally:
            handlers.RUNTIME = saved
            await runtime.stop()

    asyncio.run(scenario())


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


def test_only_a_pod_event_that_changes_what_a_pass_sees_wakes_the_job():
    # Most pod events (a condition, a timestamp) change nothing a pass reads; each would cost a
    # pass. What a pass reads is the pod's view: a change there, or the pod gone, wakes the job.
    runtime = workqueue.Runtime()
    woken = {key: asyncio.Event() for key in (("ns", "train"), ("ns", "other"))}
    runtime.workers = {key: type("Worker", (), {"wakeup": event})() for key, event in woken.items()}
    handlers.RUNTIME, saved = runtime, handlers.RUNTIME

    async def deliver(pod, kind):  # as kopf does: the index handler, or on DELETED the event handler
        if kind == "DELETED":
            await handlers.pod_deleted(body=pod, event={"type": kind, "object": pod})
        else:
            await handlers.ddpjob_pods(body=pod)
        await asyncio.sleep(0)  # the index handler's wake is scheduled

    def event(pod, kind="MODIFIED"):
        for e in woken.values():
            e.clear()
        asyncio.run(deliver(pod, kind))
        return {key[1] for key, e in woken.items() if e.is_set()}

    try:
        pod = pod_body(phase="Pending")
        assert event(pod, "ADDED") == {"train"}
        pod["metadata"]["resourceVersion"] = "2"
        pod["status"]["conditions"] = [{"type": "Initialized", "status": "True"}]
        assert event(pod) == set()  # nothing the job's pass reads
        pod["status"]["phase"] = "Running"
        assert event(pod) == {"train"}
        assert event(pod) == set()
        pod["metadata"]["labels"][names.LABEL_JOB_NAME] = "other"  # relabelled: both jobs look again
        assert event(pod) == {"train", "other"}
        assert event(pod, "DELETED") == {"other"}
        assert runtime.pod_views == {}  # nothing kept of a pod that is gone
        assert event(pod, "ADDED") == {"other"}
    finally:
        handlers.RUNTIME = saved


def test_only_a_deleted_pod_reaches_the_pod_event_handler():
    # Every other pod event is the index handler's alone: kopf's machinery per handler call was
    # a tenth of the operator's CPU with 100 jobs (benchmarks/README.md, many jobs).
    registry = kopf.get_default_registry()
    [handler] = [h for h in registry._watching.get_all_handlers() if h.id == "pod_deleted"]
    assert handler.when(event={"type": "DELETED", "object": pod_body()})
    for kind in ("ADDED", "MODIFIED", None):
        assert not handler.when(event={"type": kind, "object": pod_body()})


def test_the_index_holds_the_pods_new_view_when_its_job_is_woken(monkeypatch):
    # kopf's own indexing step, not a stand-in: a job's pass reads the index, so the wake that
    # ddpjob_pods asks for must come after kopf stored what it returned.
    from kopf._cogs.structs.references import Resource
    from kopf._core.engines import indexing

    registry = kopf.get_default_registry()
    indexers = indexing.OperatorIndexers()
    indexers.ensure(registry._indexing.get_all_handlers())
    seen = []

    def pod_changed(key, uid, view):
        seen.append([v.phase for v in indexers.indices["ddpjob_pods"].get(key, [])])

    monkeypatch.setattr(handlers.RUNTIME, "pod_changed", pod_changed)
    resource = Resource("", "v1", "pods")

    async def deliver(phase):
        raw = pod_body(phase=phase)
        await indexing.index_resource(
            indexers=indexers, registry=registry, settings=kopf.OperatorSettings(), resource=resource,
            raw_event={"type": "MODIFIED", "object": raw}, memory=indexing.IndexingMemory(),
            logger=handlers.logger, memo=kopf.Memo(), body=kopf.Body(raw))
        await asyncio.sleep(0)

    asyncio.run(deliver("Pending"))
    asyncio.run(deliver("Running"))
    assert seen == [["Pending"], ["Running"]]
