"""The progress port attacked as a hostile tenant would: pods whose answers trickle, redirect,
flood, lie about ranks or are odd JSON, look-alike pods, and an operator back from an outage.

The attacks go through the operator's real worker (``workqueue.Runtime``), its real poll (HTTP
over loopback sockets to servers that play the pods) and its real passes, with a fake API
server (``FakeKube``); docs/security.md ("Pod -> operator: the progress answer") lists the bounds they check.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import socketserver
import threading
import time
from typing import Callable, Iterator

import pytest

from ddpjob import contract
from ddpjob.api import progress
from ddpjob.api.status import Progress, format_time
from ddpjob.controller import progress as pod_progress
from ddpjob.controller import workqueue
from ddpjob.controller.decide import view_pod
from ddpjob.controller.reconcile import JobMemory, reconcile
from ddpjob.controller.settings import OperatorSettings
from tests.support.jobs import UID, make_job, pod_view
from tests.support.operator_fakes import NOW, FakeKube, at, body, parse, pods, running_status

pytestmark = pytest.mark.unit

DEADLINE = 1.0  # the settings' progress_request_timeout_seconds in these tests
SETTINGS = OperatorSettings(coalesce_seconds=0, progress_request_timeout_seconds=DEADLINE)


def good_answer(*ranks: int, step: int = 7) -> bytes:
    return json.dumps({"ranks": {str(r): {"step": step, "total_steps": 100, "age_seconds": 0.1}
                                 for r in ranks}}).encode()


def http_200(payload: bytes) -> bytes:
    return (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(payload)).encode() + b"\r\n\r\n" + payload)


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128  # a gang's GETs arrive at once


class PodServer:
    """Plays a pod's progress port on ``ip``:``port``: ``respond(request, send)`` writes the
    response (all at once, a byte at a time, ...); ``hits`` counts the requests."""

    def __init__(self, ip: str, port: int, respond: Callable[[bytes, Callable[[bytes], None]], None]):
        self.hits = 0
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server.hits += 1
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = self.request.recv(4096)
                    if not chunk:
                        return
                    request += chunk
                with contextlib.suppress(OSError):
                    respond(request, self.request.sendall)

        self.server = _Server((ip, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def answering(payload: bytes):
    return lambda request, send: send(http_200(payload))


def trickling(seconds: float):
    """One byte every half second, for ``seconds``: never silent long enough for a per-read
    timeout, never done."""
    def respond(request, send):
        ends = time.monotonic() + seconds
        for byte in http_200(good_answer(0) + b" " * 10_000):
            if time.monotonic() > ends:
                return
            send(bytes([byte]))
            time.sleep(0.5)
    return respond


@pytest.fixture
def port(monkeypatch) -> int:
    """A free port for every pod of the test (each pod has an IP of its own on loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    monkeypatch.setattr(contract, "DEFAULT_PROGRESS_PORT", free)
    return free


@pytest.fixture
def servers() -> Iterator[list]:
    started: list[PodServer] = []
    yield started
    for server in started:
        server.close()


def job_body(name: str, namespace: str, uid: str, nnodes: int, **spec_fields) -> dict:
    obj = body(nnodes=nnodes, status=running_status().to_dict(), **spec_fields)
    obj["metadata"].update(name=name, namespace=namespace, uid=uid)
    obj["status"]["nnodes"] = nnodes
    return obj


def job_pods(name: str, uid: str, ips: list[str]) -> list:
    return [pod_view(r, "Running", 0, job=name, owner_uid=uid, pod_ip=ip, uid=f"{name}-{r}")
            for r, ip in enumerate(ips)]


async def until(predicate, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.02)


def run_operator(jobs: list[tuple[dict, list]], scenario) -> None:
    """The operator's runtime with ``jobs`` (body, pods); ``scenario(runtime, kube, index)``."""
    async def main():
        runtime, kube = workqueue.Runtime(), FakeKube()
        statuses: dict = {}

        def patch_status(namespace, name, status, *, resource_version=None):  # one status per job
            statuses[(namespace, name)] = status
            return status
        kube.patch_status = patch_status
        runtime.start(SETTINGS, lambda s: kube)
        index = {workqueue.job_key(b): p for b, p in jobs}
        try:
            await scenario(runtime, statuses, index)
        finally:
            await runtime.stop()

    asyncio.run(main())


def progress_of(statuses: dict, key: tuple[str, str]) -> dict:
    return (statuses.get(key) or {}).get("progress") or {}


# --- 1. time: a trickling job holds nothing that other jobs need -----------------------------------
def test_a_trickling_job_in_one_namespace_never_delays_the_polls_of_a_job_in_another(port, servers):
    """24 pods answering a byte every half second (a per-read timeout never fires): each GET
    ends at its deadline, and a healthy job elsewhere is polled at once meanwhile."""
    trickler = PodServer("127.0.1.1", port, trickling(30))
    healthy = PodServer("127.0.2.1", port, answering(good_answer(0)))
    servers += [trickler, healthy]
    slow = (job_body("slow", "tenant-a", "uid-slow", 24), job_pods("slow", "uid-slow", ["127.0.1.1"] * 24))
    good = (job_body("good", "tenant-b", "uid-good", 1), job_pods("good", "uid-good", ["127.0.2.1"]))

    async def scenario(runtime, statuses, index):
        runtime.observe(None, slow[0], index)
        await until(lambda: trickler.hits >= 16, 5, "the trickling pods were never polled")
        started = time.monotonic()
        runtime.observe(None, good[0], index)
        await until(lambda: progress_of(statuses, ("tenant-b", "good")).get("step") == 7, 3,
                    "the healthy job was never polled while the other job's pods trickled")
        assert time.monotonic() - started < 2
        worker = runtime.workers[("tenant-a", "slow")]
        # Every GET of the slow job ends at the deadline (for the whole request, not per read):
        # its poll is over well before the trickle would be.
        await until(lambda: worker.poll_task is None, 2 * DEADLINE + 2, "the slow job's poll outlived its deadline")
        assert not progress_of(statuses, ("tenant-a", "slow")).get("ranksReporting")

    run_operator([slow, good], scenario)


def test_a_fetch_ends_at_its_deadline_for_the_whole_request_and_refuses_a_large_answer(port, servers):
    servers.append(PodServer("127.0.3.1", port, trickling(10)))
    servers.append(PodServer("127.0.3.2", port, answering(good_answer(0) + b" " * 5000)))
    servers.append(PodServer("127.0.3.3", port, answering(good_answer(0))))

    async def fetches():
        started = time.monotonic()
        trickled = await pod_progress.fetch("127.0.3.1", port, 0.8, 2048)
        took = time.monotonic() - started
        large = await pod_progress.fetch("127.0.3.2", port, 2, 2048)
        fine = await pod_progress.fetch("127.0.3.3", port, 2, 2048)
        return trickled, took, large, fine

    trickled, took, large, fine = asyncio.run(fetches())
    assert trickled is None and took < 1.5
    assert large is None
    assert json.loads(fine)["ranks"]["0"]["step"] == 7


def test_one_job_never_opens_more_than_its_share_of_connections(port, servers):
    """However many pods a job has, its poll keeps at most PER_JOB_CONNECTIONS open at once."""
    open_now, most = [0], [0]
    lock = threading.Lock()

    def slow_answer(request, send):
        with lock:
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
        time.sleep(0.2)
        with lock:
            open_now[0] -= 1
        send(http_200(good_answer(0)))

    servers.append(PodServer("127.0.4.1", port, slow_answer))
    targets = [pod_progress.Target("127.0.4.1", range(0, 1))] * 12
    answers = asyncio.run(pod_progress.poll_pods(None, targets, port, 5, per_job=4))
    assert most[0] == 4 and len(answers) == 12 and all(a and a[0].step == 7 for a in answers)


# --- 2. place: no redirect is followed ------------------------------------------------------------
def test_a_redirect_is_not_followed_and_nothing_but_the_pods_own_address_is_asked(port, servers):
    inside = PodServer("127.0.5.9", port, answering(good_answer(0, step=99)))
    location = f"http://127.0.5.9:{port}/progress".encode()
    pod = PodServer("127.0.5.1", port, lambda request, send: send(
        b"HTTP/1.0 302 Found\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n\r\n"))
    servers += [inside, pod]
    job = (job_body("train", "ns", UID, 1), job_pods("train", UID, ["127.0.5.1"]))

    async def scenario(runtime, statuses, index):
        runtime.observe(None, job[0], index)
        worker = runtime.workers[("ns", "train")]
        await until(lambda: pod.hits and worker.poll_task is None, 5, "the pod was never polled")
        assert inside.hits == 0  # the operator fetched nothing the pod pointed it at
        assert worker.memory.polling.answers and not any(worker.memory.polling.answers[-1][1])

    run_operator([job], scenario)


# --- 3. ranks and memory: a pod speaks only for the ranks it hosts --------------------------------
def test_a_pod_reporting_ranks_it_does_not_host_or_outside_the_world_is_heard_only_for_its_own(port, servers):
    liar = {"ranks": {"0": {"step": 50, "age_seconds": 0}, "1": {"step": 6, "age_seconds": 0},
                      "2": {"step": 50, "age_seconds": 0}, "7": {"step": 50, "age_seconds": 0}}}
    flood = {"ranks": {str(r): {"step": 50, "age_seconds": 0} for r in range(0, 30_000)}}
    servers.append(PodServer("127.0.6.1", port, answering(good_answer(0, step=5))))
    servers.append(PodServer("127.0.6.2", port, answering(json.dumps(liar).encode())))  # node 1 hosts rank 1
    servers.append(PodServer("127.0.6.3", port, answering(json.dumps(flood).encode())))  # 1.3 MB: no answer
    job = (job_body("train", "ns", UID, 3), job_pods("train", UID, ["127.0.6.1", "127.0.6.2", "127.0.6.3"]))

    async def scenario(runtime, statuses, index):
        runtime.observe(None, job[0], index)
        worker = runtime.workers[("ns", "train")]
        await until(lambda: progress_of(statuses, ("ns", "train")).get("ranksReporting"), 5, "no progress")
        reports = worker.memory.polling.reports.ranks
        assert {r: rep.step for r, rep in reports.items()} == {0: 5, 1: 6}  # each pod its own ranks
        shown = progress_of(statuses, ("ns", "train"))
        assert shown["ranksReporting"] == 2 and shown["step"] == 6

    run_operator([job], scenario)


def test_the_targets_give_each_owned_pod_the_ranks_of_its_node_from_the_pods_own_environment():
    from ddpjob.controller.reconcile import poll_targets

    job = make_job(3, nprocPerNode=4)
    status = running_status()
    status = type(status)(**{**status.__dict__, "nnodes": 3})
    pod = {"metadata": {"name": "train-node-2", "uid": "u2", "labels": {
               "ddpjob.dev/node-rank": "2", "ddpjob.dev/restart-attempt": "0"},
               "ownerReferences": [{"kind": "DDPJob", "controller": True, "uid": job.uid}]},
           "spec": {"containers": [{"name": "trainer", "env": [{"name": "NPROC_PER_NODE", "value": "2"}]}]},
           "status": {"phase": "Running", "podIP": "10.0.0.3",
                      "containerStatuses": [{"name": "trainer", "state": {"running": {}}}]}}
    mine = [pod_view(0, pod_ip="10.0.0.1", owner_uid=job.uid), view_pod(pod),
            pod_view(5, pod_ip="10.0.0.6", owner_uid=job.uid)]  # rank 5: outside the attempt
    targets = poll_targets(job, status, mine)
    # The attempt's pods were made with 2 processes each (the spec says 4 since): the pod's word.
    assert [(t.ip, t.ranks) for t in targets] == [("10.0.0.1", range(0, 4)), ("10.0.0.3", range(4, 6))]


# --- 4. odd answers cost only the pod that gave them ----------------------------------------------
ODD_ANSWERS = {
    "NaN step": b'{"ranks": {"%d": {"step": NaN, "age_seconds": 0}}}',
    "Infinity age": b'{"ranks": {"%d": {"step": 3, "age_seconds": Infinity}}}',
    "a list for a report": b'{"ranks": {"%d": [1, 2, 3]}}',
    "a list for the ranks": b'{"ranks": [[%d]]}',
    "deep nesting": b'{"ranks": {"%d": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}",
    "a step beyond int64": b'{"ranks": {"%d": {"step": 99999999999999999999999, "age_seconds": 0}}}',
    "a huge age": b'{"ranks": {"%d": {"step": 3, "age_seconds": 1e300}}}',
    "a float beyond double": b'{"ranks": {"%d": {"step": 3, "age_seconds": 0, "loss": 1e999, "epochs": 1e300}}}',
    "not JSON": b"\xff\xfe%d",
}


def test_odd_answers_cost_only_their_pod_and_nothing_unrepresentable_reaches_the_status(port, servers):
    kinds = list(ODD_ANSWERS)
    ips = [f"127.0.7.{i + 1}" for i in range(len(kinds) + 1)]
    for rank, (kind, ip) in enumerate(zip(kinds, ips)):
        servers.append(PodServer(ip, port, answering(ODD_ANSWERS[kind].replace(b"%d", str(rank).encode()))))
    healthy_rank = len(kinds)
    servers.append(PodServer(ips[-1], port, answering(good_answer(healthy_rank, step=40))))
    job = (job_body("train", "ns", UID, len(ips)), job_pods("train", UID, ips))

    async def scenario(runtime, statuses, index):
        runtime.observe(None, job[0], index)
        worker = runtime.workers[("ns", "train")]
        await until(lambda: progress_of(statuses, ("ns", "train")).get("ranksReporting"), 5,
                    "one odd answer cost the whole job's poll")
        ranks = worker.memory.polling.reports.ranks
        # The healthy pod counts; so do the odd pods whose odd part was a field of their own
        # (a huge age is "very old"; a loss beyond a double is no loss, its report still counts).
        assert set(ranks) == {healthy_rank, kinds.index("a huge age"), kinds.index("a float beyond double")}
        assert ranks[kinds.index("a float beyond double")].loss is None
        assert ranks[kinds.index("a float beyond double")].epochs is None
        shown = statuses[("ns", "train")]
        json.dumps(shown, allow_nan=False)  # every number is representable
        assert shown["progress"]["step"] == 40

    run_operator([job], scenario)


def test_numbers_are_kept_only_inside_the_status_schemas_range():
    parsed = progress.parse_answer({"ranks": {"0": {"step": 2 ** 63 - 1, "total_steps": 2 ** 63, "epoch": -1,
                                                    "epochs": 3.0, "loss": 10 ** 400, "age_seconds": 0},
                                              "1": {"step": True, "age_seconds": 0},
                                              " 2": {"step": 1, "age_seconds": 0},
                                              "٣": {"step": 1, "age_seconds": 0}}}, NOW)
    assert list(parsed) == [0]
    report = parsed[0]
    assert (report.step, report.total_steps, report.epoch, report.epochs, report.loss) == (2 ** 63 - 1, None, None, 3, None)
    assert pod_progress.decode(b'{"a": NaN, "b": -Infinity, "c": 1' + b"0" * 30 + b"}", 1) == \
        {"a": None, "b": None, "c": None}
    assert pod_progress.decode(b"[" * 19 + b"]" * 19, 1) is None  # refused before parsing


def test_an_eta_beyond_int64_is_left_out():
    seen = progress.merge(None, 0, [{0: progress.RankReport(0, 1, at(0), total_steps=2 ** 63 - 1)}])
    seen = progress.merge(seen, 0, [{0: progress.RankReport(0, 2, at(1000), total_steps=2 ** 63 - 1)}])
    shown = progress.to_status(seen, running=True)
    assert shown.etaSeconds is None and shown.totalSteps == 2 ** 63 - 1


# --- 5. ownership: only the job's own pods are asked -----------------------------------------------
def test_a_look_alike_pod_with_the_jobs_label_feeds_it_nothing(port, servers):
    """A pod carrying the job's labels but not controlled by the job (anyone who may create
    pods can make one) must not feed fake progress: hang detection would never fire."""
    look_alike = PodServer("127.0.8.9", port, answering(good_answer(0, step=77)))
    servers.append(look_alike)
    own = job_pods("train", UID, ["127.0.8.1"])  # the job's own pod: nothing serves there
    fake = pod_view(0, "Running", 0, owner_uid="someone-else", pod_ip="127.0.8.9", uid="fake", name="look-alike")
    job = (job_body("train", "ns", UID, 1), [fake] + own)

    async def scenario(runtime, statuses, index):
        runtime.observe(None, job[0], index)
        worker = runtime.workers[("ns", "train")]
        await until(lambda: worker.memory.polling.answers or worker.memory.polling.reports and
                    worker.memory.polling.reports.ranks, 5, "no poll")
        await asyncio.sleep(0.3)
        assert look_alike.hits == 0
        assert not progress_of(statuses, ("ns", "train")).get("ranksReporting")

    run_operator([job], scenario)


# --- 6. an operator back from an outage judges from fresh evidence --------------------------------
def restarted_status(last_report: float):
    recorded = Progress(summary="5/100 (5%)", step=5, totalSteps=100, lastReportTime=format_time(at(last_report)))
    status = running_status(since=-1000)
    return type(status)(**{**status.__dict__, "progress": recorded})


def operator_pass(obj, memory, kube, seconds, events=None):
    return reconcile(obj, pods(), memory, kube=kube, settings=OperatorSettings(progress_poll_seconds=10),
                     post_event=(events if events is not None else []).append, now=at(seconds), parse=parse)


def test_after_an_outage_longer_than_the_timeout_a_healthy_gang_is_not_judged_on_old_evidence():
    """The status' last report is 700 s old because the operator was away, not because the
    gang was silent: the first pass (which only asks for a poll) must not restart it, and the
    answers that come back keep it running."""
    kube, memory = FakeKube(), JobMemory()
    obj = body(status=restarted_status(-700).to_dict(), failurePolicy={"progressTimeoutSeconds": 60})
    operator_pass(obj, memory, kube, 0)
    assert (kube.status or obj["status"])["phase"] == "Running", kube.log
    assert memory.polling.due is not None  # the poll it asked for
    memory.polling.answers.append((0, [{0: progress.RankReport(0, 6, at(1))}, {1: progress.RankReport(1, 6, at(1))}]))
    operator_pass(obj, memory, kube, 2)
    assert kube.status["phase"] == "Running" and kube.status["progress"]["step"] == 6


def test_after_an_outage_a_gang_that_really_hung_is_stalled_one_timeout_after_the_operator_is_back():
    kube, memory = FakeKube(), JobMemory()
    obj = body(status=restarted_status(-700).to_dict(), failurePolicy={"progressTimeoutSeconds": 60})
    for seconds in (0, 10, 20, 30, 40, 50, 59):  # the pods answer nothing new
        operator_pass(obj, memory, kube, seconds)
        memory.polling.answers.append((0, [{}, {}]))
        assert (kube.status or obj["status"])["phase"] == "Running", seconds
    events = []
    operator_pass(obj, memory, kube, 61, events)
    assert kube.status["phase"] == "Restarting" and kube.status["reason"] == "Stalled"
    stalled = next(e.message for e in events if e.reason == "Stalled")
    assert "no rank reported progress for 761s" in stalled and "for the 61s this operator has watched" in stalled


def test_after_an_outage_the_first_report_bound_also_counts_from_the_operators_return():
    kube, memory = FakeKube(), JobMemory()
    obj = body(status=running_status(since=-1000).to_dict(), failurePolicy={"firstProgressTimeoutSeconds": 120})
    operator_pass(obj, memory, kube, 0)
    assert (kube.status or obj["status"])["phase"] == "Running"
    operator_pass(obj, memory, kube, 121)
    assert kube.status["phase"] == "Restarting" and kube.status["reason"] == "Stalled"


def test_a_bad_recorded_time_is_no_report():
    assert not progress.from_status(Progress(step=1, lastReportTime="yesterday"), 0, NOW).ranks


# -- an answer names its attempt (the in-place restart's window) --------------------------------
def test_an_answer_for_another_attempt_carries_no_report_of_the_one_polled():
    """Between the in-place order's status write and the entry point's start of the next
    attempt, the pod still serves the attempt before's reports while the operator polls it for
    the next: an answer naming another attempt (or naming one oddly) gives no report; one
    naming none (a server of the user's own) is read as before."""
    target = pod_progress.Target("10.0.0.1", range(0, 2), attempt=1)
    reports = {"0": {"step": 40, "age_seconds": 1}, "1": {"step": 40, "age_seconds": 1}}

    def read(**answer):
        return pod_progress.read_answer(json.dumps(answer).encode(), target, NOW)

    assert read(attempt=0, ranks=reports) == {}
    assert set(read(attempt=1, ranks=reports)) == {0, 1}
    assert set(read(ranks=reports)) == {0, 1}
    for odd in ("1", True, 1.0, None, [1], {"a": 1}, 2 ** 70):
        assert read(attempt=odd, ranks=reports) == {}, odd
    # Without an attempt polled (no job's attempt to compare with), the answer counts as it is.
    unbound = pod_progress.Target("10.0.0.1", range(0, 2))
    assert set(pod_progress.read_answer(json.dumps({"attempt": 5, "ranks": reports}).encode(),
                                        unbound, NOW)) == {0, 1}
