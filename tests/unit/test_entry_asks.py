"""The in-place state asks off the reconcile passes (issue 35, finding 3): a tenant whose pods
answer ``GET /attempt`` slowly and flap their readiness holds only its own namespace's share of
the asking pool, never a reconcile thread, and never delays another namespace's restart."""
from __future__ import annotations

import copy
import threading

import pytest

from ddpjob import contract, restart_orders
from ddpjob.controller import entry_asks
from ddpjob.controller.entry_asks import EntryStateReader
from ddpjob.controller.reconcile import JobMemory, reconcile
from tests.support.jobs import pod_view
from tests.support.operator_fakes import NOW, SETTINGS, FakeKube, at, body, parse, running_status

pytestmark = pytest.mark.unit

FAILED_137 = restart_orders.EntryState(0, contract.ENTRY_FAILED, 137, "worker rank 2 exited 137")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SlowPods:
    """``fetch_entry_state`` as pods answer it: those of ``slow_ips`` hang until released (a
    hostile entry point, SIGSTOPped or trickling), the others answer at once."""

    def __init__(self, slow_ips: set[str]) -> None:
        self.slow_ips, self.release, self.asked = slow_ips, threading.Event(), []
        self._lock = threading.Lock()

    def __call__(self, ip, port, deadline):
        with self._lock:
            self.asked.append(ip)
        if ip in self.slow_ips:
            self.release.wait(30)
            return None
        return FAILED_137


@pytest.fixture
def slow_pods(monkeypatch):
    pods = SlowPods({f"10.9.{j}.{r}" for j in range(8) for r in range(4)})
    monkeypatch.setattr(restart_orders, "fetch_entry_state", pods)
    yield pods
    pods.release.set()


def test_one_namespace_holds_its_share_of_the_threads_and_no_more(slow_pods):
    reader = EntryStateReader(slots=4, per_namespace=2)
    hostile = [reader.ask("hostile", f"10.9.0.{r}", 29400, 2.0) for r in range(4)]
    victim = reader.ask("victim", "10.0.0.1", 29400, 2.0)
    assert victim.done.wait(10) and victim.state == FAILED_137
    assert reader.in_flight("hostile") == 2  # the other two wait in the namespace's own queue
    assert not any(a.done.is_set() for a in hostile)
    slow_pods.release.set()
    assert all(a.done.wait(10) for a in hostile) and reader.in_flight("hostile") == 0


def test_an_answer_after_the_pass_wakes_the_job(slow_pods):
    woken = threading.Event()
    ask = EntryStateReader().ask("hostile", "10.9.0.0", 29400, 2.0, on_done=woken.set)
    assert not woken.is_set()
    slow_pods.release.set()
    assert woken.wait(10) and ask.done.is_set()


def test_a_namespace_whose_asks_ran_slow_is_not_waited_for(slow_pods):
    clock = Clock()
    reader = EntryStateReader(clock=clock)
    first = reader.ask("hostile", "10.9.0.0", 29400, 2.0)
    assert reader.pass_wait("hostile") == entry_asks.PASS_WAIT_SECONDS
    reader.wait("hostile", [first])  # the one wait that finds it slow
    assert not first.done.is_set()
    assert reader.pass_wait("hostile") == 0.0 and reader.pass_wait("victim") == entry_asks.PASS_WAIT_SECONDS
    clock.now += entry_asks.SLOW_FOR_SECONDS + 1
    assert reader.pass_wait("hostile") == entry_asks.PASS_WAIT_SECONDS  # forgiven in time


def _job(namespace: str, uid: str, nnodes: int = 4) -> dict:
    obj = body(nnodes)
    obj["metadata"].update(namespace=namespace, uid=uid, name=f"train-{uid}")
    return obj


def _lost_gang(job: int, uid: str, ready: bool = False):
    """A gang of four whose readiness dropped (or not), on the hostile IPs 10.9.<job>.<rank>."""
    return [pod_view(r, "Running", 0, pod_ip=f"10.9.{job}.{r}", restart_nonce=f"nonce-{r}",
                     node_name=f"worker-{r}", container_ready=ready, uid=f"{uid}-pod-{r}", owner_uid=uid,
                     job=f"train-{uid}")
            for r in range(4)]


def _run(obj, pods, memory, kube, reader, now=NOW):
    return reconcile(copy.deepcopy(obj), pods, memory, kube=kube, settings=SETTINGS, post_event=lambda e: None,
                     now=now, parse=parse, entry_reader=reader)


def test_slow_flapping_pods_of_one_tenant_never_delay_another_namespaces_restart(slow_pods, monkeypatch):
    waits = []
    real_wait = entry_asks.wait
    monkeypatch.setattr(entry_asks, "wait", lambda asks, timeout: (waits.append(timeout), real_wait(asks, timeout)))
    monkeypatch.setattr(restart_orders, "order_restart", lambda *a: True)
    clock = Clock()
    reader = EntryStateReader(clock=clock)
    hostile = []
    for j in range(8):  # 8 jobs x 4 pods: twice the namespace's share of asks
        uid = f"hostile-{j}"
        memory = JobMemory()
        memory.status = running_status()
        memory.in_place.seen_ready = {f"{uid}-pod-{r}" for r in range(4)}
        hostile.append((_job("hostile", uid), uid, memory, FakeKube()))
    requeues = [_run(obj, _lost_gang(j, uid), memory, kube, reader) for j, (obj, uid, memory, kube) in enumerate(hostile)]
    assert all(r is not None and r <= entry_asks.RECHECK_SECONDS for r in requeues)  # back for the answer
    assert waits.count(entry_asks.PASS_WAIT_SECONDS) == 1 and waits.count(0.0) == 7  # one pass waited, once
    assert reader.in_flight("hostile") == entry_asks.ASKS_PER_NAMESPACE

    # They flap: ready, lost, ready, lost, pass after pass. Nobody is asked again within REASK_SECONDS.
    asked_before = len(slow_pods.asked)
    for flap in range(6):
        for j, (obj, uid, memory, kube) in enumerate(hostile):
            _run(obj, _lost_gang(j, uid, ready=flap % 2 == 0), memory, kube, reader, now=at(flap))
    assert len(slow_pods.asked) == asked_before
    assert set(waits[8:]) <= {0.0}  # the hostile namespace's passes never wait again

    # The victim, elsewhere: its failed pod answers, and its pass restarts the gang at once.
    victim, memory, kube = _job("victim", "victim", nnodes=2), JobMemory(), FakeKube()
    memory.status = running_status()
    pods = [pod_view(r, "Running", 0, pod_ip=f"10.0.0.{r + 1}", restart_nonce=f"nonce-{r}",
                     node_name=f"worker-{r}", container_ready=r == 0, uid=f"victim-pod-{r}", owner_uid="victim",
                     job="train-victim")
            for r in range(2)]
    memory.in_place.seen_ready = {p.uid for p in pods}
    _run(victim, pods, memory, kube, reader)
    assert kube.status["restartAttempt"] == 1
    assert kube.status["failureHistory"][0]["restartMode"] == "InPlace"
    for _, _, memory, _ in hostile:  # the hostile jobs' memories hold one ask per pod, no more
        assert len(memory.in_place.asks) == 4
