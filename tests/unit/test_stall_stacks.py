"""Stacks, operator side: which pods a stall asks (decide), the bounded client against hostile
pods, the Event's summary, and the pass (the stacks are read before the restart, never holding
it up)."""
from __future__ import annotations

import json
import time

import pytest

from ddpjob import contract
from ddpjob.api.spec import FailurePolicy
from ddpjob import restart_orders
from ddpjob.controller import stall_stacks
from ddpjob.controller.reconcile import JobMemory, reconcile
from ddpjob.controller.settings import OperatorSettings
from ddpjob.controller.stall_stacks import PodStacks, main_frames, summarize
from tests.support.decisions import decide
from tests.support.jobs import make_job, pod_view
from tests.support.operator_fakes import NOW, FakeKube, at, body, parse, running_status
from tests.support.fake_pods import fake_pod

pytestmark = pytest.mark.unit


def dump(*functions: str, thread: str = "Current thread 0x00007f01 (most recent call first):") -> str:
    frames = [f'  File "/app/train.py", line {10 + i} in {name}' for i, name in enumerate(functions)]
    return "\n".join([thread, *frames])


MAIN = dump("stuck_in_collective", "train_step", "main", "<module>")
THREAD = dump("wait", "run", "_bootstrap_inner", "_bootstrap", thread="Thread 0x00007f02 (most recent call first):")


def gang(nnodes=2, token="token-", **fields):
    fields = {"container_ready": True, **fields}
    return [pod_view(r, "Running", 0, pod_ip=f"10.0.0.{r + 1}", restart_nonce=f"{token}{r}" if token else "",
                     node_name=f"worker-{r}", **fields) for r in range(nnodes)]


def stalled_plan(pods, nnodes=2):
    job = make_job(nnodes, failurePolicy=FailurePolicy(firstProgressTimeoutSeconds=60))
    status = running_status(since=-100)
    return decide(job, status.__class__(**{**status.__dict__, "nnodes": nnodes}), pods, NOW)


# ----------------------------------------------------------------- decide
def test_a_stall_asks_the_suspect_s_pod_first_and_a_few_others():
    pods = gang(6)
    plan = stalled_plan(pods, 6)
    assert plan.status.reason == "Stalled"
    asked = plan.stacks.pods
    suspect = plan.status.failedNode.nodeRank
    assert asked[0].node_rank == suspect and len(asked) == stall_stacks.MAX_PODS
    assert len({p.uid for p in asked}) == len(asked)


def test_pods_that_cannot_answer_are_not_asked_but_the_stall_still_says_so():
    plan = stalled_plan(gang(token=""))
    assert plan.stacks is not None and plan.stacks.pods == ()


def test_no_stall_no_stacks():
    job = make_job(2, failurePolicy=FailurePolicy(firstProgressTimeoutSeconds=600))
    assert decide(job, running_status(since=-100), gang(), NOW).stacks is None


# ----------------------------------------------------------------- the summary
def test_the_summary_shows_the_main_thread_s_innermost_frames_suspect_first():
    answers = [PodStacks("train-node-0", {"0": THREAD + "\n" + dump("allreduce", "main", "<module>")}),
               PodStacks("train-node-1", {"1": THREAD + "\n" + MAIN})]
    message = summarize(answers, suspect_rank=1)
    assert message.index("rank 1 (suspect) on train-node-1: stuck_in_collective (train.py:10)") \
        < message.index("rank 0 on train-node-0: allreduce")
    assert "_bootstrap" not in message  # another thread's frames are not the program's


def test_frames_in_traceback_s_format_are_read_too():
    text = 'Traceback (most recent call last):\n  File "/a/b.py", line 3, in stuck\n'
    assert main_frames(text) == [("stuck", "b.py", "3")]


def test_the_summary_is_bounded_and_keeps_the_suspect():
    many = {str(r): dump(*(f"f{r}_{i}" * 20 for i in range(60))) for r in range(64)}
    message = summarize([PodStacks("p", many)], suspect_rank=63)
    assert len(message) <= stall_stacks.EVENT_LIMIT
    assert message.startswith("Stacks") and "rank 63 (suspect)" in message


def test_nothing_read_says_why():
    message = summarize([PodStacks("train-node-1", None, "no answer within 3s")], suspect_rank=1)
    assert "could not be read" in message and "train-node-1: no answer within 3s" in message
    partly = summarize([PodStacks("a", {"0": MAIN}), PodStacks("b", None, "HTTP 401")], None)
    assert "stuck_in_collective" in partly and "not read: b: HTTP 401" in partly


def test_the_log_has_every_answer_bounded():
    text = stall_stacks.log_text([PodStacks("a", {"0": "x" * 40000, "1": "y" * 40000}), PodStacks("b", None, "e")])
    assert len(text) <= stall_stacks.LOG_LIMIT + 20


# ----------------------------------------------------------------- the client, against hostile pods
GOOD = json.dumps({"ranks": {"1": MAIN}}).encode()


def test_the_stacks_are_read_with_the_pod_s_token():
    with fake_pod(200, GOOD) as (port, _):
        stacks, error = restart_orders.fetch_stacks("127.0.0.1", port, "tok", 2.0)
    assert error == "" and "stuck_in_collective" in stacks["1"]


@pytest.mark.parametrize("status, payload, why", [
    (401, b"{}", "HTTP 401"),
    (503, b'{"error": "no worker runs"}', "no worker runs"),
    (302, GOOD, "HTTP 302"),
    (200, b"not json", "a malformed answer"),
    (200, b'{"ranks": {"1": 5}}', "a malformed answer"),
    (200, b'{"ranks": {"1": "' + b"x" * (contract.MAX_STACKS_ANSWER_BYTES + 4096) + b'"}}', "no usable answer"),
    (200, b"[" * 6000 + b"]" * 6000, "a malformed answer"),
])
def test_a_hostile_pod_gives_no_stacks_and_a_reason(status, payload, why):
    with fake_pod(status, payload) as (port, _):
        stacks, error = restart_orders.fetch_stacks("127.0.0.1", port, "tok", 2.0)
    assert stacks is None and error.startswith(why)


def test_a_slow_pod_costs_one_deadline():
    with fake_pod(200, GOOD + b" " * 2000, delay=0.3) as (port, _):
        started = time.monotonic()
        stacks, error = restart_orders.fetch_stacks("127.0.0.1", port, "tok", 0.5)
        assert time.monotonic() - started < 1.5
    assert stacks is None and "no usable answer" in error


def test_never_a_name_never_without_a_token():
    assert restart_orders.fetch_stacks("localhost", 1, "tok", 1.0)[0] is None
    assert restart_orders.fetch_stacks("127.0.0.1", 1, "", 1.0)[0] is None


# ----------------------------------------------------------------- the pass
def stall_pass(pods, monkeypatch, fetch):
    calls = []

    def order(ip, port, token, attempt, deadline):
        calls.append(("order", ip))
        return True

    def fetched(ip, port, token, deadline):
        calls.append(("stacks", ip))
        return fetch(ip, port, token, deadline)

    monkeypatch.setattr(restart_orders, "order_restart", order)
    monkeypatch.setattr(restart_orders, "fetch_stacks", fetched)
    kube, memory, events = FakeKube(), JobMemory(), []
    obj = body(status=running_status(since=-1000).to_dict(), failurePolicy={"firstProgressTimeoutSeconds": 120})
    settings = OperatorSettings(progress_poll_seconds=10)
    reconcile(obj, pods, memory, kube=kube, settings=settings, post_event=events.append, now=at(0), parse=parse)
    reconcile(obj, pods, memory, kube=kube, settings=settings, post_event=events.append, now=at(121), parse=parse)
    return kube, events, calls


def test_the_pass_reads_the_stacks_before_it_restarts(monkeypatch, caplog):
    kube, events, calls = stall_pass(gang(), monkeypatch, lambda ip, *a: ({"0": MAIN} if ip == "10.0.0.1" else {"1": MAIN}, ""))
    assert kube.status["phase"] == "Restarting" and kube.status["reason"] == "Stalled"
    assert [c[0] for c in calls] == ["stacks", "stacks", "order", "order"]
    reasons = [e.reason for e in events]
    assert reasons[-1] == "StalledStacks" and "Stalled" in reasons and "Restarting" in reasons
    stacks_event = events[-1]
    assert stacks_event.type == "Warning" and "stuck_in_collective" in stacks_event.message
    assert len(stacks_event.message) <= stall_stacks.EVENT_LIMIT
    assert "stacks of the stalled gang" in caplog.text and "train.py" in caplog.text


def test_a_pod_that_does_not_answer_never_holds_up_the_restart(monkeypatch):
    kube, events, calls = stall_pass(gang(), monkeypatch, lambda *a: (None, "no answer within 3s"))
    assert kube.status["phase"] == "Restarting"
    assert [c[0] for c in calls].count("order") == 2
    assert "could not be read" in events[-1].message


def test_a_real_hostile_pod_never_holds_up_the_restart(monkeypatch):
    real = restart_orders.fetch_stacks
    with fake_pod(200, b"{" * 100 + b" " * 3000, delay=0.2) as (port, _):
        monkeypatch.setattr(contract, "DEFAULT_PROGRESS_PORT", port)
        pods = [pod_view(r, "Running", 0, pod_ip="127.0.0.1", restart_nonce=f"token-{r}", container_ready=True,
                         node_name=f"worker-{r}") for r in range(2)]
        started = time.monotonic()
        kube, events, calls = stall_pass(pods, monkeypatch, real)
        assert time.monotonic() - started < restart_orders.STACKS_DEADLINE_SECONDS + 3
    assert kube.status["phase"] == "Restarting"
    assert events[-1].reason == "StalledStacks" and "could not be read" in events[-1].message


def test_recreate_pods_the_event_says_why_there_are_no_stacks(monkeypatch):
    kube, events, calls = stall_pass(gang(token=""), monkeypatch, lambda *a: pytest.fail("asked"))
    assert kube.status["phase"] == "Restarting" and calls == []
    assert "no pod of the gang serves its stacks" in events[-1].message


def test_a_pods_frames_cannot_put_control_characters_into_the_event_or_the_log():
    """A function or file name is the pod's text: its answer's parser (contract.parse_stacks)
    drops the control characters, so the Event and the log hold none (issue 35)."""
    hostile = dump("evil\x1b[2J\u202e\x07", "main", "<module>")
    stacks = contract.parse_stacks(json.dumps({"ranks": {"0": hostile}}).encode())
    assert stacks is not None
    answers = [PodStacks("train-node-0", stacks), PodStacks("train-node-1", None, "no worker runs")]
    for text in (summarize(answers, suspect_rank=0), stall_stacks.log_text(answers)):
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text, text
        assert "evil[2J" in text
