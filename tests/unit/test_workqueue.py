"""The workers (controller/workqueue.py): one per job, woken by events and by their clock, and
the pools that keep a slow gang creation from holding up other jobs' passes."""
from __future__ import annotations

import asyncio
import threading

import pytest

from ddpjob.controller import workqueue
from ddpjob.controller.settings import OperatorSettings
from tests.support.jobs import pod_view
from tests.support.operator_fakes import SETTINGS, FakeKube, body, eventually

pytestmark = pytest.mark.unit

view = pod_view


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
            await eventually(lambda: first.task.done())
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
            await eventually(lambda: "create_pods" in kube.kinds())
            index[("ns", "train")] = [view(0, "Pending"), view(1, "Pending")]  # no event: only the clock
            await eventually(lambda: (kube.status or {}).get("reason") == "StartupTimeout", timeout=5)
        finally:
            await runtime.stop()

    asyncio.run(scenario())


def test_a_gang_being_created_does_not_hold_up_the_status_of_running_jobs():
    """Passes that create a gang (a job without pods yet) may take seconds of POSTs on a busy
    API server; they run on a pool of their own, so a running job's status write never queues
    behind them (benchmarks/README.md, many jobs)."""
    release = threading.Event()

    class SlowCreates(FakeKube):
        def __init__(self):
            super().__init__()
            self.written: list[tuple[str, str]] = []

        def patch_status(self, namespace, name, status, *, resource_version=None):
            self.written.append((name, status["phase"]))
            return super().patch_status(namespace, name, status, resource_version=resource_version)

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
            await eventually(lambda: ("new", "Pending") in kube.written)
            # a job that has pods: its pass (a status write) runs on the other pool meanwhile
            pods = [view(r, owner_uid="uid-train", name=f"train-node-{r}") for r in (0, 1)]
            runtime.observe(None, job("train"), {("ns", "train"): pods})
            await eventually(lambda: any(name == "train" for name, _ in kube.written))
            assert not release.is_set() and "create_pods" not in kube.kinds()  # "new" still blocked
        finally:
            release.set()
            await runtime.stop()

    asyncio.run(scenario())


def test_a_pass_that_waited_for_a_thread_sees_the_pods_as_they_are_when_it_starts():
    """With every thread busy (status writes to a slow API server), a woken job's pass waits;
    it takes the pods when a thread is free, so the changes that came meanwhile are in that one
    pass and its one write, not in a second pass queued after it (benchmarks/README.md, many jobs)."""
    release, writing = threading.Event(), threading.Event()

    class SlowWrites(FakeKube):
        def __init__(self):
            super().__init__()
            self.written: list[tuple[str, str, tuple]] = []

        def patch_status(self, namespace, name, status, *, resource_version=None):
            if name == "slow" and status["phase"] == "Running":
                writing.set()
                release.wait(5)
            self.written.append((name, status["phase"], tuple(n["phase"] for n in status.get("nodes") or ())))
            return super().patch_status(namespace, name, status, resource_version=resource_version)

    def job(name: str) -> dict:
        obj = body()
        obj["metadata"].update(name=name, uid=f"uid-{name}")
        return obj

    def pods(name: str, *phases: str) -> list:
        return [view(r, phase, owner_uid=f"uid-{name}", name=f"{name}-node-{r}") for r, phase in enumerate(phases)]

    async def scenario():
        runtime, kube = workqueue.Runtime(), SlowWrites()
        runtime.start(OperatorSettings(coalesce_seconds=0.001, reconcile_workers=1), lambda settings: kube)
        index: dict = {}
        try:
            for name in ("slow", "train"):  # both gangs created
                runtime.observe(None, job(name), index)
                await eventually(lambda: any(e[0] == "create_pods" and e[1][0].startswith(name) for e in kube.log))
            index[("ns", "slow")] = pods("slow", "Running", "Running")
            runtime.wake(("ns", "slow"))  # its write holds the one thread
            await eventually(writing.is_set)
            index[("ns", "train")] = pods("train", "Running", "Pending")
            runtime.wake(("ns", "train"))  # waits for the thread
            await asyncio.sleep(0.05)
            index[("ns", "train")] = pods("train", "Running", "Running")  # the other pod ran meanwhile
            runtime.wake(("ns", "train"))
            release.set()
            await eventually(lambda: ("slow", "Running", ("Running", "Running")) in kube.written)
            await eventually(lambda: any(w[0] == "train" and w[1] == "Running" for w in kube.written))
            await asyncio.sleep(0.1)
            after_creation = [w[1:] for w in kube.written if w[0] == "train"][1:]
            assert after_creation == [("Running", ("Running", "Running"))]  # one pass, one write
        finally:
            release.set()
            await runtime.stop()

    asyncio.run(scenario())


def test_a_worker_whose_status_write_was_refused_as_stale_is_woken_by_the_newer_job():
    """Another writer moved the job on; this worker's write, decided on the older view, is
    refused (409 Conflict). The next version the watch brings wakes the worker, even one whose
    only change is the status (which otherwise wakes nobody), long before its error backoff."""
    async def scenario():
        runtime, kube = workqueue.Runtime(), FakeKube()
        runtime.start(OperatorSettings(coalesce_seconds=0.001, error_backoff_seconds=30), lambda s: kube)
        try:
            first = body()
            first["metadata"]["resourceVersion"] = str(kube.resource_version)
            runtime.observe(None, first, {})
            await eventually(lambda: "create_pods" in kube.kinds())
            worker = runtime.workers[("ns", "train")]
            kube.resource_version += 10  # someone else writes: the worker's view is old now
            relabelled = body()
            relabelled["metadata"].update(resourceVersion=first["metadata"]["resourceVersion"],
                                          labels={"team": "a"})  # wakes the worker, still at the old version
            runtime.observe("MODIFIED", relabelled, {})
            await eventually(lambda: worker.memory.stale_version is not None)
            refused = len(kube.preconditions)
            newer = body(status=kube.status)
            newer["metadata"].update(resourceVersion=str(kube.resource_version), labels={"team": "a"})
            runtime.observe("MODIFIED", newer, {})  # a status-only change of the job
            await eventually(lambda: len(kube.preconditions) > refused and worker.memory.stale_version is None)
            assert kube.preconditions[-1] == newer["metadata"]["resourceVersion"]
        finally:
            await runtime.stop()

    asyncio.run(scenario())
