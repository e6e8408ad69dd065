"""The operator's own pod watch (controller/podwatch.py): the index the job workers read, filled
from a list before any job is reconciled, followed through a watch that resumes, lists again
when its version expired (what the list lacks is gone), backs off from a failing API server,
and keeps to the operator's namespaces; and ``Kube.watch_pods``'s reading of the stream."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from ddpjob.api import names
from ddpjob.controller import kube as kube_module
from ddpjob.controller import podwatch
from ddpjob.controller.kube import ApiError, Kube
from ddpjob.controller.podwatch import PodIndex, PodWatch
from tests.support.operator_fakes import SETTINGS

pytestmark = pytest.mark.unit


def pod(name="train-node-1", rank="1", job="train", ns="ns", uid=None, phase="Running", version="1"):
    labels = {names.LABEL_JOB_NAME: job, names.LABEL_RESTART_ATTEMPT: "0"}
    if rank is not None:
        labels[names.LABEL_NODE_RANK] = rank
    return {"metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}", "labels": labels,
                         "resourceVersion": version},
            "status": {"phase": phase}}


class FakeSource:
    """Scripted lists and watches: each list_pods call takes the next list (or raises it, when
    it is an exception); each watch_pods call yields the next script's events, then ends. With
    the scripts used up, a watch waits until the PodWatch stops."""

    def __init__(self, lists, watches=()):
        self.lists, self.watches = list(lists), list(watches)
        self.calls: list[tuple] = []
        self.lock = threading.Lock()

    def list_pods(self, namespace, selector):
        with self.lock:
            self.calls.append(("list", namespace, selector))
            answer = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch_pods(self, namespace, selector, resource_version, *, server_timeout, stopped):
        with self.lock:
            self.calls.append(("watch", namespace, resource_version))
            script = self.watches.pop(0) if self.watches else None
        if script is None:
            while not stopped():
                time.sleep(0.005)
            return
        if isinstance(script, Exception):
            raise script
        yield from script


class Recorder:
    def __init__(self, index: PodIndex):
        self.index, self.changes, self.seen_in_index = index, [], []

    def __call__(self, key, uid, view):
        self.changes.append((key, uid, None if view is None else view.phase))
        # what a pass woken now would read: the index already holds the change
        self.seen_in_index.append(sorted(v.phase for v in self.index.get(key, [])))


async def until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def run_watch(source, namespaces=(), check=None, backoff=(0.01,)):
    async def scenario():
        index = PodIndex()
        changes = Recorder(index)
        watch = PodWatch(source, list(namespaces), index, changes, backoff=backoff)
        watch.start()
        try:
            await asyncio.wait_for(watch.wait_ready(), 5)
            if check is not None:
                await check(index, changes)
        finally:
            watch.stop()
        return index, changes

    return asyncio.run(scenario())


def test_the_first_list_is_in_the_index_before_the_watch_is_ready():
    source = FakeSource([([pod("a", "0"), pod("b", "1"), pod("c", rank=None)], "10")])

    async def check(index, changes):
        # ready: the list is in (checked before anything else can have happened)
        assert set(index) == {("ns", "train")}
        assert sorted(v.name for v in index[("ns", "train")]) == ["a", "b"]  # c has no rank: not one of the job's
        assert source.calls[0] == ("list", None, names.LABEL_JOB_NAME)  # the API server filters by the job label
        await until(lambda: len(source.calls) > 1)
        assert source.calls[1] == ("watch", None, "10")  # the watch starts where the list was taken

    run_watch(source, check=check)


def test_each_watch_event_updates_the_index_before_the_job_is_woken():
    events = [
        {"type": "ADDED", "object": pod("a", "0", phase="Pending", version="11")},
        {"type": "MODIFIED", "object": pod("a", "0", phase="Running", version="12")},
        {"type": "MODIFIED", "object": pod("a", "0", job="other", version="13")},  # relabelled
        {"type": "MODIFIED", "object": pod("b", "1", version="14")},
        {"type": "MODIFIED", "object": pod("b", rank=None, version="15")},  # lost its rank label
        {"type": "DELETED", "object": pod("a", "0", job="other", version="16")},
    ]
    source = FakeSource([([pod("b", "1")], "10")], [events])

    async def check(index, changes):
        await until(lambda: len(changes.changes) >= 7)
        assert [(key[1], phase) for key, _, phase in changes.changes] == [
            ("train", "Running"),  # the list
            ("train", "Pending"), ("train", "Running"), ("other", "Running"), ("train", "Running"),
            ("train", None), ("other", None)]
        assert changes.seen_in_index == [["Running"], ["Pending", "Running"], ["Running", "Running"],
                                         ["Running"], ["Running"], [], []]
        assert dict(index) == {}

    run_watch(source, check=check)


def test_an_expired_watch_lists_again_and_the_pods_the_list_lacks_are_gone():
    source = FakeSource(
        [([pod("a", "0"), pod("b", "1")], "10"), ([pod("a", "0", version="30")], "30")],
        [[{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}]])

    async def check(index, changes):
        await until(lambda: ("watch", None, "30") in source.calls)
        assert [v.name for v in index[("ns", "train")]] == ["a"]
        assert (("ns", "train"), "uid-ns-b", None) in changes.changes

    run_watch(source, check=check)


def test_a_watch_request_refused_as_too_old_lists_again():
    gone = ApiError(410, "Expired", "too old resource version: 10 (40)", "watch pods")
    source = FakeSource([([pod("a", "0")], "10"), ([], "40")], [gone])

    async def check(index, changes):
        await until(lambda: ("watch", None, "40") in source.calls)
        assert dict(index) == {}  # the second list lacks the pod: gone
        assert changes.changes[-1] == (("ns", "train"), "uid-ns-a", None)

    run_watch(source, check=check)


def test_the_watch_resumes_from_the_last_version_it_saw_bookmarks_included():
    source = FakeSource([([], "10")], [
        [{"type": "ADDED", "object": pod("a", "0", version="11")},
         {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "25"}}}],
    ])

    async def check(index, changes):
        await until(lambda: ("watch", None, "25") in source.calls)
        assert [c[0] for c in source.calls].count("list") == 1  # resumed, not listed again

    run_watch(source, check=check)


def test_a_failing_api_server_is_tried_again_until_it_answers():
    denied = ApiError(403, "Forbidden", 'pods is forbidden: cannot list resource "pods"', "list pods")
    source = FakeSource([denied, ApiError(0, "ConnectionRefusedError", "refused"), ([pod("a", "0")], "10")])
    index, _ = run_watch(source)
    assert [c[0] for c in source.calls][:3] == ["list", "list", "list"]
    assert [v.name for v in index[("ns", "train")]] == ["a"]


def test_exact_namespaces_are_watched_each_and_patterns_cluster_wide_then_filtered():
    source = FakeSource([([pod("a", "0", ns="team-a")], "10")])
    run_watch(source, namespaces=["team-a", "team-b"])
    assert {c[1] for c in source.calls if c[0] == "list"} == {"team-a", "team-b"}

    source = FakeSource([([pod("a", "0", ns="team-a"), pod("b", "0", ns="team-a-dev"), pod("c", "0", ns="x")], "10")])
    index, _ = run_watch(source, namespaces=["team-*, !*-dev"])
    assert {c[1] for c in source.calls if c[0] == "list"} == {None}
    assert set(index) == {("team-a", "train")}


@pytest.mark.parametrize("pattern", ["team-*", "!*-dev", "team-*, !*-dev", "team-*, !*-dev, *-dev-keep", "a,b", "*"])
@pytest.mark.parametrize("namespace", ["team-a", "team-a-dev", "team-a-dev-keep", "other-dev-keep", "a", "b", "c"])
def test_namespace_patterns_match_as_kopf_matches_them(pattern, namespace):
    from kopf._cogs.structs.references import match_namespace

    assert podwatch.namespace_matches(namespace, pattern) == match_namespace(namespace, pattern)


# --- Kube.watch_pods: the stream as the API server sends it ----------------------------------------
class StreamResponse:
    def __init__(self, status, chunks, body=b""):
        self.status, self.reason, self.body = status, "", body
        self.response = self
        self.chunks, self.closed = chunks, False

    def read(self):
        return self.body

    def stream(self, amt=None, decode_content=None):
        yield from self.chunks

    def close(self):
        self.closed = True


class StreamClient:
    def __init__(self, response):
        self.response, self.requests = response, []

    def param_serialize(self, method, resource_path, query_params=None, header_params=None, body=None,
                        auth_settings=None):
        return method, resource_path, header_params, body, query_params

    def call_api(self, method, url, headers, body, query, _request_timeout=None):
        self.requests.append((method, url, dict(query), _request_timeout))
        return self.response

    def close(self):
        pass


def watch(response, namespace="ns"):
    client = StreamClient(response)
    events = list(Kube(client, SETTINGS).watch_pods(namespace, names.LABEL_JOB_NAME, "7", server_timeout=60,
                                                    stopped=lambda: False))
    return events, client


def test_watch_pods_decodes_events_split_anywhere_across_chunks():
    lines = [json.dumps({"type": "ADDED", "object": pod(f"p{i}", str(i))}).encode() + b"\n" for i in range(3)]
    stream = b"".join(lines)
    chunks = [stream[:5], stream[5:len(lines[0]) + 3], stream[len(lines[0]) + 3:]]
    response = StreamResponse(200, chunks)
    events, client = watch(response)
    assert [e["object"]["metadata"]["name"] for e in events] == ["p0", "p1", "p2"]
    ((method, url, query, timeout),) = client.requests
    assert (method, url) == ("GET", "/api/v1/namespaces/ns/pods")
    assert query == {"labelSelector": names.LABEL_JOB_NAME, "watch": "true", "allowWatchBookmarks": "true",
                     "resourceVersion": "7", "timeoutSeconds": "60"}
    assert timeout[1] > 60  # a quiet watch is not cut before the API server ends it
    assert response.closed


def test_watch_pods_refuses_an_endless_event_and_reports_a_refused_watch(monkeypatch):
    monkeypatch.setattr(kube_module, "MAX_WATCH_EVENT_BYTES", 1000)
    response = StreamResponse(200, [b"{" + b"x" * 600, b"x" * 600])
    with pytest.raises(ApiError, match="EventTooLarge"):
        watch(response)
    assert response.closed

    refused = StreamResponse(403, [], body=json.dumps({"reason": "Forbidden", "message": "pods is forbidden"}).encode())
    with pytest.raises(ApiError) as error:
        watch(refused, namespace=None)
    assert error.value.status == 403 and "forbidden" in error.value.message and refused.closed
