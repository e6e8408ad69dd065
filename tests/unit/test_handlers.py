"""The kopf handlers (controller/handlers.py), called the way kopf calls them (they are plain
functions): the registry, kopf's settings, the pod index, the events that drive the workers,
and the ddpjob-operator command."""
from __future__ import annotations

import asyncio
import time

import kopf
import pytest

from ddpjob.api import names
from ddpjob.controller import handlers, workqueue
from ddpjob.controller.decide import ServiceView
from ddpjob.controller.podwatch import PodIndex, PodWatch
from tests.support.jobs import UID, pod_view
from tests.support.operator_fakes import SETTINGS, FakeKube, body, eventually

pytestmark = pytest.mark.unit

view = pod_view


# --- kopf wiring --------------------------------------------------------------------------------
def test_no_handler_makes_kopf_add_a_finalizer():
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == [] and registry._spawning.get_all_handlers() == []
    # (kopf adds finalizers only for changing/deletion handlers and daemons/timers: none here)
    assert {h.id for h in registry._indexing.get_all_handlers()} == {"ddpjob_workloads", "ddpjob_services"}
    assert {h.id for h in registry._watching.get_all_handlers()} == {"ddpjob_event", "workload_event",
                                                                      "service_event"}
    # kopf does not watch pods at all: the operator's own pod watch does (podwatch.py says why)
    handlers_ = [*registry._indexing.get_all_handlers(), *registry._watching.get_all_handlers()]
    assert not any(h.selector.plural == "pods" for h in handlers_)


def test_kopf_state_lives_under_the_project_group_and_only_our_pods_are_watched():
    settings = kopf.OperatorSettings()
    handlers.configure_kopf(settings)
    assert settings.persistence.progress_storage.prefix == "ddpjob.dev"
    assert settings.persistence.diffbase_storage.prefix == "ddpjob.dev"
    assert settings.persistence.diffbase_storage.key == "last-handled-configuration"
    from kopf._cogs.structs.references import Resource
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


def test_the_service_index_says_whose_each_service_is():
    service = {"metadata": {"name": "train", "namespace": "ns", "uid": "s1", "labels": {names.LABEL_JOB_NAME: "train"},
                            "ownerReferences": [{"kind": "DDPJob", "name": "train", "uid": UID, "controller": True}]}}
    ((key, value),) = asyncio.run(handlers.ddpjob_services(body=service)).items()
    assert key == ("ns", "train") and (value.name, value.owner_uid) == ("train", UID)


def test_a_deleted_service_wakes_the_job_and_is_recreated():
    async def scenario():
        runtime, kube, services = workqueue.Runtime(), FakeKube(), {}
        runtime.start(SETTINGS, lambda settings: kube)
        pods = pod_watch(runtime)
        try:
            await handlers.ddpjob_event(event={"type": None, "object": body()}, ddpjob_services=services)
            await eventually(lambda: "create_pods" in kube.kinds())
            services[("ns", "train")] = [ServiceView("train", "s1", owner_uid=UID)]
            pods.deliver(pod_body("0"), pod_body("1"))
            await eventually(lambda: (kube.status or {}).get("phase") == "Running")
            kube.log.clear()
            del services[("ns", "train")]  # the Service watch: DELETED
            await handlers.service_event(body={"metadata": {"name": "train", "namespace": "ns",
                                                            "labels": {names.LABEL_JOB_NAME: "train"}}})
            await eventually(lambda: "create_service" in kube.kinds())
            assert "create_pods" not in kube.kinds() and "delete" not in kube.kinds()
        finally:
            pods.restore()
            await runtime.stop()

    asyncio.run(scenario())


def test_workers_react_to_pod_events_and_stop_with_the_job():
    async def scenario():
        runtime, kube = workqueue.Runtime(), FakeKube()
        runtime.start(SETTINGS, lambda settings: kube)
        pods = pod_watch(runtime)
        try:
            # kopf calls: the DDPJob is listed -> a worker starts and creates the gang.
            await handlers.ddpjob_event(event={"type": None, "object": body()})
            await eventually(lambda: "create_pods" in kube.kinds())
            # the pods run: the pod watch updates the index and wakes the worker.
            pods.deliver(pod_body("0"), pod_body("1"))
            await eventually(lambda: (kube.status or {}).get("phase") == "Running")
            # our own status write comes back as an event: no pass, no request.
            writes = kube.kinds().count("patch_status")
            await handlers.ddpjob_event(event={"type": "MODIFIED", "object": body(status=kube.status)})
            await asyncio.sleep(0.05)
            assert kube.kinds().count("patch_status") == writes
            # suspend (a spec change: new generation) wakes it.
            await handlers.ddpjob_event(event={"type": "MODIFIED", "object": body(generation=2, suspend=True)})
            await eventually(lambda: (kube.status or {}).get("phase") == "Suspended")
            # deleted: the worker goes.
            worker = runtime.workers[("ns", "train")]
            await handlers.ddpjob_event(event={"type": "DELETED", "object": body()})
            await eventually(lambda: worker.task.done())
            assert runtime.workers == {}
        finally:
            pods.restore()
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
    watch = PodWatch(None, [], PodIndex(), runtime.pod_changed)

    def event(pod, kind="MODIFIED"):
        for e in woken.values():
            e.clear()
        watch._apply(None, watch._changes([pod], deleted=kind == "DELETED"), listed=False)
        return {key[1] for key, e in woken.items() if e.is_set()}

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
    assert [v.name for v in watch.index[("ns", "other")]] == ["train-node-1"] and ("ns", "train") not in watch.index
    assert event(pod, "DELETED") == {"other"}
    assert runtime.pod_views == {} and dict(watch.index) == {}  # nothing kept of a pod that is gone
    assert event(pod, "ADDED") == {"other"}


class pod_watch:
    """The handlers' pod index and a started watch whose list is empty, with a way to deliver
    pod events as the watch thread would (onto the event loop)."""

    def __init__(self, runtime):
        self.saved = handlers.RUNTIME, handlers.PODS, handlers.POD_WATCH
        handlers.RUNTIME, handlers.PODS = runtime, PodIndex()

        class Empty:
            def list_pods(self, namespace, selector):
                return [], "1"

            def watch_pods(self, namespace, selector, version, *, server_timeout, stopped):
                while not stopped():
                    time.sleep(0.005)
                return iter(())

        self.watch = handlers.POD_WATCH = PodWatch(Empty(), [], handlers.PODS, runtime.pod_changed)
        self.watch.start()

    def deliver(self, *pods):
        self.watch._apply(None, self.watch._changes(list(pods)), listed=False)

    def restore(self):
        self.watch.stop()
        handlers.RUNTIME, handlers.PODS, handlers.POD_WATCH = self.saved
