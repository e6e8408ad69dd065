"""Pods anyone may create, labelled like a job's (issue 35, finding 4): the pod watch holds raw
pods one list page or one watch event at a time, keeps only their views, and never takes a
foreign pod for the job's. The fake API server makes each page as it is asked for, so the test
itself never holds more than one page either."""
from __future__ import annotations

import asyncio
import json
import threading
import time
import tracemalloc

import pytest

from ddpjob.api import names
from ddpjob.controller import kube as kube_module
from ddpjob.controller.decide import is_ours
from ddpjob.controller.kube import Kube
from ddpjob.controller.podwatch import PodIndex, PodWatch
from tests.support.decisions import decide
from tests.support.jobs import UID, make_job
from tests.support.operator_fakes import NOW, SETTINGS, running_status

pytestmark = pytest.mark.unit

MiB = 1024 * 1024
FOREIGN = 3000  # pods someone else made, with the job's labels and no DDPJob behind them
ANNOTATIONS = "x" * (256 * 1024 - 64)  # about the most a pod's annotations may hold (256 KiB)
OWN_AT = {0: 0, 1: 1700}  # node rank -> where in the list the job's own pod comes
VERSION = "4242"


def labels(rank: int) -> dict:
    return {names.LABEL_JOB_NAME: "train", names.LABEL_NODE_RANK: str(rank), names.LABEL_RESTART_ATTEMPT: "0"}


def own_pod(rank: int) -> dict:
    owner = {"apiVersion": f"{names.API_GROUP}/{names.API_VERSION}", "kind": names.KIND, "name": "train",
             "uid": UID, "controller": True, "blockOwnerDeletion": True}
    return {"metadata": {"name": f"train-node-{rank}", "namespace": "ns", "uid": f"uid-own-{rank}",
                         "labels": labels(rank), "ownerReferences": [owner]},
            "spec": {"nodeName": f"node-{rank}"},
            "status": {"phase": "Running", "podIP": f"10.0.0.{rank + 1}",
                       "containerStatuses": [{"name": names.CONTAINER_NAME, "ready": True,
                                              "state": {"running": {}}}]}}


def foreign_pod(i: int) -> dict:
    # The job's label and rank labels, 256 KiB of annotations, no owner: what a user who may
    # create pods in the namespace can make as many of as the quota allows.
    return {"metadata": {"name": f"train-decoy-{i}", "namespace": "ns", "uid": f"uid-decoy-{i}",
                         "labels": labels(i % 2), "annotations": {"decoy": ANNOTATIONS}},
            "status": {"phase": "Running"}}


class PagedApi:
    """A fake ApiClient that answers a paged pod list (``limit``, ``continue``) with pods made as
    each page is asked for, and a pod watch with ``events`` (made when their turn comes) followed
    by silence."""

    def __init__(self, total: int, events=()):
        self.total, self.events = total, events
        self.pages: list[int] = []  # pods per page asked for
        self.own = {at: rank for rank, at in OWN_AT.items()}

    def param_serialize(self, method, resource_path, query_params=None, header_params=None, body=None,
                        auth_settings=None):
        return method, resource_path, header_params, body, query_params

    def call_api(self, method, url, headers, body, query, _request_timeout=None):
        query = dict(query)
        if query.get("watch") == "true":
            return WatchResponse(self.events)
        start, limit = int(query.get("continue") or 0), int(query["limit"])
        end = min(start + limit, self.total)
        self.pages.append(end - start)
        items = [own_pod(self.own[i]) if i in self.own else foreign_pod(i) for i in range(start, end)]
        meta = {"resourceVersion": VERSION, "continue": str(end) if end < self.total else ""}
        return PageResponse(json.dumps({"kind": "PodList", "metadata": meta, "items": items}).encode())

    def close(self):
        pass


class PageResponse:
    def __init__(self, raw: bytes):
        self.status, self.reason, self.raw = 200, "OK", raw

    def read(self):
        return self.raw


class WatchResponse:
    def __init__(self, events):
        self.status, self.reason, self.events = 200, "OK", events
        self.response = self

    def stream(self, amt=None, decode_content=None):
        for make in self.events:
            yield make()  # made now, and not held here once handed on
        while True:  # a quiet watch: nothing, then a look at whether to stop
            time.sleep(0.005)
            yield b""

    def close(self):
        pass


def watched(api: PagedApi, scenario):
    """Run the pod watch over ``Kube(api)`` until ``scenario(index)`` returns."""

    async def main():
        index = PodIndex()
        watch = PodWatch(Kube(api, SETTINGS), [], index, lambda key, uid, view: None)
        watch.start()
        try:
            await asyncio.wait_for(watch.wait_ready(), 60)
            return await scenario(index)
        finally:
            watch.stop()

    return asyncio.run(main())


def test_thousands_of_fat_foreign_pods_cost_the_pod_watch_one_page_and_their_views():
    api = PagedApi(FOREIGN + len(OWN_AT))

    async def listed(index):
        return tracemalloc.get_traced_memory()

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index_size, peak = watched(api, listed)
        index_size -= before
        peak -= before
    finally:
        tracemalloc.stop()

    raw_total = (FOREIGN + len(OWN_AT)) * len(ANNOTATIONS)  # 750 MiB: what holding every raw pod takes
    page = kube_module.LIST_PAGE * (len(ANNOTATIONS) + 1024)
    # At most one page raw (its JSON, its text and its objects: 3 x 2.5 MiB; the fake's making
    # of it about as much), and the views (~14 MiB in all); holding every raw pod took 2.4 GiB.
    assert peak < 4 * page + 16 * MiB < raw_total / 10, f"peak {peak / MiB:.0f} MiB"
    assert index_size < 16 * MiB, f"index {index_size / MiB:.1f} MiB"  # ~2 KiB a view
    assert max(api.pages) == kube_module.LIST_PAGE and len(api.pages) == 301


def test_the_jobs_own_pods_are_indexed_and_the_foreign_ones_are_never_its_own():
    api = PagedApi(FOREIGN + len(OWN_AT))

    async def listed(index):
        return index[("ns", "train")]

    views = watched(api, listed)
    job = make_job(2)
    assert len(views) == FOREIGN + len(OWN_AT)
    ours = sorted((v for v in views if is_ours(job, v)), key=lambda v: v.node_rank)
    assert [(v.name, v.node_rank, v.phase, v.ready, v.pod_ip) for v in ours] == [
        ("train-node-0", 0, "Running", True, "10.0.0.1"), ("train-node-1", 1, "Running", True, "10.0.0.2")]
    assert all(v.owner_uid is None for v in views if v.name.startswith("train-decoy-"))

    # What the job decides with the decoys in its index is what it decides without them.
    own = [v for v in views if v.name in ("train-node-0", "train-node-1")]
    with_decoys = decide(make_job(2), running_status(), views, NOW)
    assert with_decoys == decide(make_job(2), running_status(), own, NOW)
    assert with_decoys.status.phase == "Running"
    assert not (with_decoys.create_ranks or with_decoys.delete or with_decoys.force_delete)


def test_a_watch_event_is_not_held_once_it_is_in_the_index():
    arrived = threading.Event()
    decoy = foreign_pod(9999)
    decoy["metadata"]["annotations"] = {"decoy": "x" * 8 * MiB}  # past what the API server stores
    fat = {"type": "ADDED", "object": decoy}

    def event() -> bytes:
        arrived.wait(30)
        return json.dumps(fat).encode() + b"\n"

    api = PagedApi(2, events=[event])

    async def followed(index):
        await asyncio.sleep(0.05)
        before = tracemalloc.get_traced_memory()[0]
        arrived.set()
        deadline = time.monotonic() + 30
        while "uid-decoy-9999" not in {v.uid for v in index.get(("ns", "train"), [])}:
            assert time.monotonic() < deadline, "the event never reached the index"
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)  # the watch is waiting for the next event now
        return tracemalloc.get_traced_memory()[0] - before

    tracemalloc.start()
    try:
        held = watched(api, followed)
    finally:
        tracemalloc.stop()
    # Its view is kept (a couple of KiB); neither its JSON nor its decoding is (8 MiB each).
    assert held < 2 * MiB, f"held {held / MiB:.1f} MiB after the event"
