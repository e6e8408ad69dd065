"""The operator's half of the in-place gang restart (issue 22): what it decides from a pod entry
point's state, what it orders and relabels, and how it reads what a pod says (a hostile pod
included)."""
from __future__ import annotations

import json
import socket
import time

import pytest

from ddpjob import contract
from ddpjob.api import names
from ddpjob.api.spec import FailurePolicy
from ddpjob.api.status import CREATED, JobStatus
from ddpjob import restart_orders
from ddpjob.controller import builders, decide as decision
from ddpjob.controller.reconcile import JobMemory
from ddpjob.restart_orders import EntryState, parse_entry_state
from tests.support.decisions import decide
from tests.support.fake_pods import fake_pod
from tests.support.jobs import make_job, pod_view
from tests.support.operator_fakes import NOW, FakeKube, at, body, run_pass, running_status

pytestmark = pytest.mark.unit

FAILED_137 = EntryState(0, contract.ENTRY_FAILED, 137, "worker rank 2 exited 137 (killed by signal 9)")


def gang(attempt: int = 0, **fields):
    fields = {"container_ready": True, **fields}
    return [pod_view(r, "Running", attempt, pod_ip=f"10.0.0.{r + 1}", restart_nonce=f"nonce-{r}",
                     node_name=f"worker-{r}", **fields) for r in range(2)]


def _token(rank: int) -> str:
    """What the operator sends node ``rank`` of ``gang()``: the token its key makes of the nonce."""
    from ddpjob.controller import restart_key

    return restart_key.KEY.token("ns", f"train-node-{rank}", f"nonce-{rank}")


def test_a_failed_entry_point_restarts_the_gang_in_place():
    pods = gang()
    plan = decide(make_job(2), running_status(), pods, NOW, entry_states={pods[1].uid: FAILED_137})
    assert plan.restart_in_place == tuple(pods) and plan.attempt == 1
    assert plan.delete == () and plan.create_ranks == ()
    status = plan.status
    assert (status.phase, status.restartAttempt, status.restarts) == ("Restarting", 1, 1)
    assert status.is_true(CREATED)  # the attempt's pods exist: its startup clock runs
    record = status.failureHistory[0]
    assert (record.restartMode, record.exitCode, record.nodeRank, record.attempt) == ("InPlace", 137, 1, 0)
    assert "2 pod(s) in place" in status.message
    assert any(e.reason == "Restarting" and "in place" in e.message for e in plan.events)


def test_a_peer_lost_waits_briefly_for_the_root_cause():
    pods = gang()
    lost = EntryState(0, contract.ENTRY_FAILED, 13, "peer lost", seconds_since_failure=1.0)
    plan = decide(make_job(2), running_status(), pods, NOW, entry_states={pods[0].uid: lost})
    assert plan.restart_in_place == () and plan.status.phase == "Running"
    assert plan.requeue_after is not None and 3.9 < plan.requeue_after <= 4.0
    # The root cause shows: it is the culprit.
    killed = EntryState(0, contract.ENTRY_FAILED, 137, "killed", seconds_since_failure=1.5)
    plan = decide(make_job(2), running_status(), pods, NOW,
                  entry_states={pods[0].uid: lost, pods[1].uid: killed})
    assert plan.restart_in_place == tuple(pods) and plan.status.failureHistory[0].nodeRank == 1
    # None shows within the grace: the consequence is all there is.
    late = EntryState(0, contract.ENTRY_FAILED, 13, "peer lost", seconds_since_failure=6.0)
    plan = decide(make_job(2), running_status(), pods, NOW, entry_states={pods[0].uid: late})
    assert plan.restart_in_place == tuple(pods) and plan.status.failureHistory[0].exitCode == 13


def test_recreate_mode_deletes_the_gang_as_before():
    pods = gang()
    job = make_job(2, failurePolicy=FailurePolicy(restartMode="Recreate"))
    plan = decide(job, running_status(), pods, NOW, entry_states={pods[1].uid: FAILED_137})
    assert plan.restart_in_place == () and {p.name for p in plan.delete} == {p.name for p in pods}
    assert plan.status.failureHistory[0].restartMode == "Recreate"


def test_a_command_of_ones_own_is_always_recreated():
    job = make_job(2, command=("python", "train.py"))
    pods = gang()
    failed = [pods[0], pod_view(1, "Failed", 0, exit_code=1, restart_nonce="")]
    plan = decide(job, running_status(), failed, NOW)
    assert plan.restart_in_place == () and len(plan.delete) == 2


def test_a_deleted_pod_is_recreated_while_the_other_restarts_in_place():
    pods = gang()
    gone = pod_view(1, "Running", 0, pod_ip="10.0.0.2", restart_nonce="t", deletion_at=at(-1))
    plan = decide(make_job(2), running_status(), [pods[0], gone], NOW)
    assert plan.restart_in_place == (pods[0],)
    assert plan.delete == ()  # already going
    assert "1 pod(s) in place, 1 recreated" in plan.status.message
    # The old pod still terminating holds its name: rank 1 waits for it.
    waiting = decide(make_job(2), plan.status, [gang(attempt=1)[0], gone], at(1))
    assert waiting.create_ranks == ()
    # It is gone: rank 1 is created for attempt 1.
    after = decide(make_job(2), plan.status, [gang(attempt=1)[0]], at(1))
    assert after.create_ranks == (1,) and after.attempt == 1


def test_a_permanent_code_fails_the_job_without_restarting():
    pods = gang()
    permanent = EntryState(0, contract.ENTRY_FAILED, 2, "bad configuration")
    plan = decide(make_job(2), running_status(), pods, NOW, entry_states={pods[0].uid: permanent})
    assert plan.status.phase == "Failed" and plan.restart_in_place == ()
    assert plan.status.failureHistory[0].restartMode == ""


def test_the_state_of_another_attempt_or_a_running_one_is_no_failure():
    pods = gang(attempt=1)
    for state in (EntryState(0, contract.ENTRY_FAILED, 137, "old"), EntryState(1, contract.ENTRY_STOPPING),
                  EntryState(1, contract.ENTRY_RUNNING)):
        plan = decide(make_job(2), running_status(attempt=1), pods, NOW, entry_states={pods[0].uid: state})
        assert plan.status.phase == "Running" and plan.restart_in_place == ()


def test_the_budget_still_counts_in_place_restarts():
    pods = gang()
    job = make_job(2, failurePolicy=FailurePolicy(maxRestarts=1))
    spent = running_status().__class__(**{**running_status().__dict__, "restarts": 1})
    plan = decide(job, spent, pods, NOW, entry_states={pods[1].uid: FAILED_137})
    assert plan.status.phase == "Failed" and plan.status.reason == "RestartBudgetExhausted"


def test_a_pod_on_an_excluded_node_is_recreated_not_kept():
    from ddpjob.api.status import ExcludedNode
    pods = gang()
    status = running_status().__class__(**{**running_status().__dict__,
                                          "excludedNodes": (ExcludedNode(nodeName="worker-1"),)})
    plan = decide(make_job(2), status, pods, NOW, entry_states={pods[0].uid: FAILED_137})
    assert plan.restart_in_place == (pods[0],) and [p.name for p in plan.delete] == [pods[1].name]


# --- the pod spec ----------------------------------------------------------------------------------
def env_of(pod):
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_pods_carry_the_tokens_digest_and_nonce_the_mode_and_a_readiness_probe():
    """Never the token: a pod's spec is readable by every reader of its namespace (issue 35)."""
    key = restart_orders.RestartKey(b"k" * 32)
    nonce, digest = key.credential("ns", "train-node-1")
    pod = builders.build_pod(make_job(2), 1, 0, restart_credential=(nonce, digest))
    env = env_of(pod)
    assert env[contract.DDPJOB_RESTART_MODE] == "InPlace" and contract.DDPJOB_RESTART_TOKEN not in env
    assert env[contract.DDPJOB_RESTART_NONCE] == nonce and env[contract.DDPJOB_RESTART_TOKEN_SHA256] == digest
    token = key.token("ns", "train-node-1", nonce)
    assert contract.restart_token_digest(token) == digest and token not in json.dumps(pod)
    assert env[contract.DDPJOB_PERMANENT_EXIT_CODES] == ",".join(map(str, contract.DEFAULT_PERMANENT_EXIT_CODES))
    probe = pod["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"] == {"path": "/ready", "port": builders.PROGRESS_PORT_NAME}
    view = decision.view_pod({**pod, "metadata": {**pod["metadata"], "uid": "u"}})
    assert view.restart_nonce == nonce


def test_recreate_pods_have_no_token_and_no_probe():
    pod = builders.build_pod(make_job(2, failurePolicy=FailurePolicy(restartMode="Recreate")), 0, 0,
                             restart_credential=("nonce", "0" * 64))
    assert {contract.DDPJOB_RESTART_TOKEN, contract.DDPJOB_RESTART_TOKEN_SHA256,
            contract.DDPJOB_RESTART_NONCE}.isdisjoint(env_of(pod))
    assert "readinessProbe" not in pod["spec"]["containers"][0]
    assert decision.view_pod({**pod, "metadata": {**pod["metadata"], "uid": "u"}}).restart_nonce == ""


def test_every_created_pod_gets_its_own_token_which_only_the_key_makes():
    key = restart_orders.RestartKey(b"k" * 32)
    pods = builders.build_pods(make_job(3), 0, restart_key=key)
    envs = [env_of(p) for p in pods]
    assert len({e[contract.DDPJOB_RESTART_NONCE] for e in envs}) == 3
    tokens = {key.token("ns", p["metadata"]["name"], e[contract.DDPJOB_RESTART_NONCE]) for p, e in zip(pods, envs)}
    assert len(tokens) == 3 and all(len(t) >= 32 for t in tokens)
    assert [contract.restart_token_digest(key.token("ns", p["metadata"]["name"], e[contract.DDPJOB_RESTART_NONCE]))
            for p, e in zip(pods, envs)] == [e[contract.DDPJOB_RESTART_TOKEN_SHA256] for e in envs]
    # Another key, another pod's name or namespace, or a nonce too long to be ours: another token, or none.
    nonce = envs[0][contract.DDPJOB_RESTART_NONCE]
    other = restart_orders.RestartKey(b"x" * 32).token("ns", "train-node-0", nonce)
    assert len({other, key.token("ns", "train-node-1", nonce), key.token("other", "train-node-0", nonce),
                key.token("ns", "train-node-0", nonce)}) == 4
    assert key.token("ns", "train-node-0", "") == "" and key.token("ns", "train-node-0", "n" * 65) == ""
    with pytest.raises(ValueError):
        restart_orders.RestartKey(b"short")
    assert "k" * 8 not in repr(key)


# --- what a pod says ---------------------------------------------------------------------------
@pytest.mark.parametrize("raw", [
    b"", b"null", b"[]", b"{", b'{"attempt": "1", "state": "failed"}', b'{"attempt": true, "state": "failed"}',
    b'{"attempt": -1, "state": "failed"}', b'{"attempt": 1, "state": "dancing"}',
    b'{"attempt": 1, "state": "failed", "exitCode": 300}', b'{"attempt": 1, "state": "failed", "exitCode": 1.5}',
    b'{"attempt": 99999999999999999999999, "state": "failed"}', b'{"attempt": 1, "state": "failed"}',
    b'{"attempt": NaN, "state": "failed"}', b"\xff\xfe", b'{"attempt": 1, "state": "running"' + b" " * 5000 + b"}",
])
def test_a_malformed_state_is_no_state(raw):
    assert parse_entry_state(raw) is None


def test_a_state_is_read_and_its_message_bounded():
    raw = json.dumps({"attempt": 3, "state": "failed", "exitCode": 137, "message": "x" * 2000}).encode()
    state = parse_entry_state(raw)
    assert (state.attempt, state.state, state.exit_code) == (3, "failed", 137)
    assert len(state.message) == contract.MAX_ENTRY_MESSAGE_CHARS


def test_the_state_and_the_order_over_http():
    answer = json.dumps({"attempt": 0, "state": "failed", "exitCode": 137, "message": "m"}).encode()
    with fake_pod(200, answer) as (port, _):
        assert restart_orders.fetch_entry_state("127.0.0.1", port, 2.0) == EntryState(0, "failed", 137, "m")
    with fake_pod(202, b"{}") as (port, pod):
        assert restart_orders.order_restart("127.0.0.1", port, "tok", 4, 2.0)
        assert pod.seen == [("/restart", "Bearer tok", b'{"attempt": 4}')]
    with fake_pod(401, b"{}") as (port, _):
        assert not restart_orders.order_restart("127.0.0.1", port, "tok", 4, 2.0)


def test_a_pod_that_trickles_redirects_or_floods_gives_no_state():
    answer = json.dumps({"attempt": 0, "state": "failed", "exitCode": 1}).encode()
    with fake_pod(200, answer + b" " * 400, delay=0.3) as (port, _):
        started = time.monotonic()
        assert restart_orders.fetch_entry_state("127.0.0.1", port, 0.5) is None
        assert time.monotonic() - started < 1.5  # one deadline for the whole request
    with fake_pod(302, answer) as (port, _):
        assert restart_orders.fetch_entry_state("127.0.0.1", port, 2.0) is None
    with fake_pod(200, b"{" + b" " * 10000 + b"}") as (port, _):
        assert restart_orders.fetch_entry_state("127.0.0.1", port, 2.0) is None
    assert restart_orders.fetch_entry_state("localhost", 1, 1.0) is None  # never a name
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    assert restart_orders.fetch_entry_state("127.0.0.1", free, 1.0) is None


# --- the pass ---------------------------------------------------------------------------------
def test_the_pass_orders_relabels_and_recreates_a_pod_that_does_not_take_the_order(monkeypatch):
    orders = []

    def order(ip, port, token, attempt, deadline):
        orders.append((ip, token, attempt))
        return ip == "10.0.0.1"  # rank 1's pod does not answer

    monkeypatch.setattr(restart_orders, "fetch_entry_state", lambda ip, port, deadline: FAILED_137)
    monkeypatch.setattr(restart_orders, "order_restart", order)
    kube, memory = FakeKube(), JobMemory()
    memory.status = running_status()
    pods = gang()
    memory.in_place.seen_ready = {p.uid for p in pods}
    lost = [pods[0], pod_view(1, "Running", 0, pod_ip="10.0.0.2", restart_nonce="nonce-1",
                              container_ready=False, node_name="worker-1")]
    run_pass(body(), lost, memory, kube)
    assert sorted(orders) == [("10.0.0.1", _token(0), 1), ("10.0.0.2", _token(1), 1)]
    assert ("relabel", "train-node-0", ((names.LABEL_RESTART_ATTEMPT, "1"),)) in kube.log
    assert ("delete", ("train-node-1",)) in kube.log
    assert kube.status["restartAttempt"] == 1 and kube.status["failureHistory"][0]["restartMode"] == "InPlace"
    # The watch still shows the old label: the pod counts as attempt 1 anyway (no stray delete).
    kube.log.clear()
    run_pass(body(), [pods[0]], memory, kube, now=at(1))
    assert not any(entry[0] == "delete" and "train-node-0" in entry[1] for entry in kube.log)
    assert ("create_pods", ("train-node-1",)) in kube.log


def test_a_pod_never_seen_ready_is_not_asked(monkeypatch):
    asked = []
    monkeypatch.setattr(restart_orders, "fetch_entry_state", lambda *a: asked.append(a))
    kube, memory = FakeKube(), JobMemory()
    memory.status = running_status()
    run_pass(body(), gang(container_ready=False), memory, kube)
    assert asked == []
    run_pass(body(), gang(), memory, kube, now=at(1))  # seen ready now
    run_pass(body(), gang(container_ready=False), memory, kube, now=at(2))
    assert len(asked) == 2


def test_a_stalled_gang_restarts_in_place():
    """A rank blocked in a collective: its pods look healthy, so all of them are kept (the entry
    points stop the workers, SIGKILL after the grace) and the restart counts as Stalled."""
    from ddpjob.api import progress
    body_ = {"ranks": {"0": {"step": 42, "total_steps": 100, "age_seconds": 70},
                       "1": {"step": 40, "total_steps": 100, "age_seconds": 90}}}
    seen = progress.merge(None, 0, [progress.parse_answer(body_, NOW)])
    job = make_job(2, failurePolicy=FailurePolicy(progressTimeoutSeconds=60))
    plan = decide(job, running_status(), gang(), NOW, progress=seen)
    assert plan.status.reason == "Stalled" and plan.restart_in_place == tuple(gang())
    assert plan.status.failureHistory[0].restartMode == "InPlace"


def test_a_second_failure_during_an_in_place_restart_restarts_again():
    """Attempt 1 was ordered in place; before it trains, node 0's entry point fails at attempt
    1: a second restart, to attempt 2, in place again, counting against the budget."""
    pods = gang()
    first = decide(make_job(2), running_status(), pods, NOW, entry_states={pods[1].uid: FAILED_137})
    restarted = gang(attempt=1)
    again = EntryState(1, contract.ENTRY_FAILED, 1, "Traceback: RuntimeError")
    second = decide(make_job(2), first.status, restarted, at(2), entry_states={restarted[0].uid: again})
    assert (second.status.restartAttempt, second.status.restarts) == (2, 2)
    assert second.restart_in_place == tuple(restarted) and second.attempt == 2
    assert [r.attempt for r in second.status.failureHistory[:2]] == [1, 0]


def _reported_then_restarted_in_place():
    """A job whose attempt 0 reported progress, then failed and was restarted in place: the
    status after the order, the pods of attempt 1, and the job."""
    from ddpjob.api import progress
    job = make_job(2)
    pods = gang()
    answer = {"ranks": {"0": {"step": 40, "total_steps": 100, "age_seconds": 1},
                        "1": {"step": 40, "total_steps": 100, "age_seconds": 1}}}
    reported = decide(job, running_status(), pods, NOW,
                      progress=progress.merge(None, 0, [progress.parse_answer(answer, NOW)]))
    assert reported.status.progress is not None and reported.status.progress.attempt == 0
    first = decide(job, reported.status, pods, at(1), entry_states={pods[1].uid: FAILED_137})
    assert first.restart_in_place == tuple(pods)
    return job, first.status, gang(attempt=1)


def test_an_in_place_attempt_that_fails_before_its_first_report_is_recreated():
    """The program reports progress (attempt 0 did), attempt 1 was restarted in place and fails
    before any report: whatever held it may still be in those pods, so attempt 2 gets new ones;
    the Event says why."""
    job, ordered, restarted = _reported_then_restarted_in_place()
    again = EntryState(1, contract.ENTRY_FAILED, 1, "Traceback: RuntimeError")
    second = decide(job, ordered, restarted, at(5), entry_states={restarted[0].uid: again})
    assert second.restart_in_place == () and second.status.restartAttempt == 2
    assert {p.name for p in second.delete} == {p.name for p in restarted}
    assert second.status.failureHistory[0].restartMode == "Recreate"
    restarting = next(e for e in second.events if e.reason == "Restarting")
    assert "attempt 1 was restarted in place and failed before its first progress report" in restarting.message


def test_an_in_place_attempt_that_reported_restarts_in_place_again():
    from ddpjob.api import progress
    job, ordered, restarted = _reported_then_restarted_in_place()
    answer = {"ranks": {"0": {"step": 41, "total_steps": 100, "age_seconds": 0}}}
    running = decide(job, ordered, restarted, at(5),
                     progress=progress.merge(None, 1, [progress.parse_answer(answer, at(5))]))
    assert running.status.progress.attempt == 1
    again = EntryState(1, contract.ENTRY_FAILED, 1, "Traceback: RuntimeError")
    second = decide(job, running.status, restarted, at(6), entry_states={restarted[0].uid: again})
    assert second.restart_in_place == tuple(restarted) and second.status.restartAttempt == 2


def test_an_in_place_attempt_whose_entry_point_saw_reports_restarts_in_place_again():
    """Attempt 1 trained for a few seconds, between two polls of /progress (the status still
    shows attempt 0's progress): the failed entry point says its workers had reported, so it is
    no attempt that failed before training, and attempt 2 runs in the same pods."""
    job, ordered, restarted = _reported_then_restarted_in_place()
    assert ordered.progress is not None and ordered.progress.attempt == 0
    trained = EntryState(1, contract.ENTRY_FAILED, 137, "killed", reported=True)
    second = decide(job, ordered, restarted, at(5), entry_states={restarted[1].uid: trained})
    assert second.restart_in_place == tuple(restarted) and second.status.restartAttempt == 2
    assert second.status.failureHistory[0].restartMode == "InPlace"
    # The vouching is for the attempt that failed only: a stale answer of attempt 0 is not.
    stale = EntryState(0, contract.ENTRY_FAILED, 137, "killed", reported=True)
    silent = EntryState(1, contract.ENTRY_FAILED, 137, "killed")
    third = decide(job, ordered, restarted, at(5),
                   entry_states={restarted[0].uid: stale, restarted[1].uid: silent})
    assert third.restart_in_place == () and third.status.failureHistory[0].restartMode == "Recreate"


def test_an_in_place_attempt_silent_past_the_startup_bound_is_recreated():
    """The pods of an in-place attempt run from the order on, so the startup clock cannot fire:
    the bound is the attempt's first progress report within startupTimeoutSeconds of the order
    (counted from this operator's first sight of the attempt), and past it the gang is recreated."""
    from ddpjob.api import progress
    job, ordered, restarted = _reported_then_restarted_in_place()
    bound = job.spec.startupTimeoutSeconds
    silent = progress.GangProgress(attempt=1, watched_since=at(1))
    early = decide(job, ordered, restarted, at(1 + bound / 2), progress=silent)
    assert early.status.phase == "Running" and early.restart_in_place == () and early.delete == ()
    assert early.requeue_after is not None and abs(early.requeue_after - bound / 2) < 1.01
    # An operator that first saw the attempt late counts from then.
    late_sight = progress.GangProgress(attempt=1, watched_since=at(1 + bound))
    assert decide(job, ordered, restarted, at(2 + bound), progress=late_sight).status.phase == "Running"
    overdue = decide(job, ordered, restarted, at(2 + bound), progress=silent)
    assert (overdue.status.phase, overdue.status.reason) == ("Restarting", "Stalled")
    assert overdue.restart_in_place == () and {p.name for p in overdue.delete} == {p.name for p in restarted}
    assert "restarted in place, and no rank reported progress within startupTimeoutSeconds" in \
        overdue.status.failureHistory[0].message
    assert overdue.status.failureHistory[0].restartMode == "Recreate"
    # A program that never reports (no attempt did) is not judged by this bound.
    pods = gang()
    first = decide(job, running_status(), pods, NOW, entry_states={pods[1].uid: FAILED_137})
    quiet = decide(job, first.status, gang(attempt=1), at(2 + bound),
                   progress=progress.GangProgress(attempt=1, watched_since=NOW))
    assert quiet.status.phase == "Running"
