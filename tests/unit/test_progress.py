"""Progress reports and hang detection: the pure rules (api.progress), the decision (Stalled),
the operator's polling and its per-job status-write rate limit, and the pod side (ddptrainer.report)."""
from __future__ import annotations

import dataclasses

import json
import os
import socket
import sys
import urllib.request

import pytest

from ddpjob import contract
from ddpjob.api import progress
from ddpjob.api import spec
from ddpjob.api.status import RUNNING, JobStatus, Progress, format_time, with_phase
from ddpjob.controller.progress import Target
from ddpjob.controller.reconcile import JobMemory, reconcile
from ddpjob.controller.settings import OperatorSettings
from ddptrainer import report
from tests.support.decisions import decide
from tests.support.jobs import make_job, pod_view
from tests.support.operator_fakes import NOW, FakeKube, FakePods, at, body, parse, pods, running_status

pytestmark = pytest.mark.unit

def answer(*ranks: tuple[int, int, float], total: int = 100, observed: float = 0) -> dict:
    """A pod's /progress answer parsed at ``observed``: (rank, step, age_seconds) each."""
    body = {"ranks": {str(r): {"step": s, "total_steps": total, "loss": 0.5, "throughput": 80.0,
                               "epoch": 1, "epochs": 2, "age_seconds": age} for r, s, age in ranks}}
    return progress.parse_answer(body, at(observed))


def policy_job(**policy) -> spec.DDPJob:
    return make_job(2, failurePolicy=spec.FailurePolicy(**policy))


# --- what the reports mean ------------------------------------------------------------------------
def test_an_answer_is_dated_by_the_pods_own_clock_and_malformed_reports_are_left_out():
    parsed = progress.parse_answer({"ranks": {"0": {"step": 7, "age_seconds": 3}, "x": {"step": 1, "age_seconds": 0},
                                              "1": {"step": "seven", "age_seconds": 0}, "2": {"step": 1}}}, NOW)
    assert list(parsed) == [0] and parsed[0].at == at(-3) and parsed[0].step == 7
    assert progress.parse_answer("not json object", NOW) == {}


def test_merge_keeps_each_ranks_newest_report_and_a_new_attempt_starts_over():
    first = progress.merge(None, 0, [answer((0, 5, 0), (1, 5, 0), observed=0)])
    later = progress.merge(first, 0, [answer((0, 9, 0), observed=10), {}])  # node 1 did not answer
    assert {r: rep.step for r, rep in later.ranks.items()} == {0: 9, 1: 5}
    assert later.last_report_at == at(10) and later.first == (5, at(0))
    assert progress.merge(later, 1, []).ranks == {}


def test_status_shows_step_of_total_and_an_eta_from_the_pace_only_while_running():
    seen = progress.merge(None, 0, [answer((0, 10, 0), observed=0)])
    seen = progress.merge(seen, 0, [answer((0, 20, 0), observed=10)])  # 1 s a step, 80 to go
    shown = progress.to_status(seen, running=True)
    assert (shown.summary, shown.eta, shown.etaSeconds, shown.step, shown.totalSteps) == ("20/100 (20%)", "1m20s", 80, 20, 100)
    assert (shown.epoch, shown.loss, shown.throughput, shown.lastReportTime) == (1, 0.5, 80.0, format_time(at(10)))
    assert progress.to_status(seen, running=False).eta == ""


def test_no_bound_no_stall_whatever_the_silence():
    silent = progress.merge(None, 0, [answer((0, 5, 10_000))])
    assert progress.stall(make_job(2), silent, at(-20_000), NOW) == (None, None)
    assert progress.stall(make_job(2), None, at(-20_000), NOW) == (None, None)


def test_silence_after_the_first_report_is_a_stall_that_names_the_ranks_behind():
    job = policy_job(progressTimeoutSeconds=60)
    quiet = progress.merge(None, 0, [answer((0, 41, 30), (1, 40, 45))])
    assert progress.stall(job, quiet, at(-500), NOW) == (None, 30)  # 30 s left
    stalled, _ = progress.stall(job, quiet, at(-500), at(31))
    assert stalled is not None and stalled.suspect_node == 1 and stalled.silent_ranks == (0, 1)
    assert "no rank reported progress for 61s (failurePolicy.progressTimeoutSeconds 60)" in stalled.message
    assert "rank 0 step 41 (61s ago), rank 1 step 40 (76s ago)" in stalled.message
    assert stalled.message.endswith("behind the others: rank(s) 1")


def test_before_the_first_report_the_startup_bound_applies():
    job = policy_job(firstProgressTimeoutSeconds=120, progressTimeoutSeconds=60)
    assert progress.stall(job, None, at(-100), NOW) == (None, 20)
    stalled, _ = progress.stall(job, None, at(-121), NOW)
    assert stalled is not None and "within 120s of every node running" in stalled.message
    assert "silent: rank(s) 0, 1" in stalled.message


# --- the decision -------------------------------------------------------------------------------
def test_running_job_shows_progress_and_looks_again_when_the_bound_would_run_out():
    seen = progress.merge(None, 0, [answer((0, 42, 5), (1, 42, 5))])
    plan = decide(policy_job(progressTimeoutSeconds=60), running_status(), pods(), NOW, progress=seen)
    assert plan.status.phase == RUNNING and plan.status.progress.summary == "42/100 (42%)"
    assert plan.requeue_after == 55 and not plan.delete


def test_a_stalled_gang_restarts_whole_with_reason_stalled_and_counts_a_restart():
    seen = progress.merge(None, 0, [answer((0, 42, 70), (1, 40, 90))])
    plan = decide(policy_job(progressTimeoutSeconds=60, maxRestarts=3), running_status(), pods(), NOW, progress=seen)
    assert (plan.status.phase, plan.status.reason, plan.status.restarts, plan.status.restartAttempt) == \
        ("Restarting", "Stalled", 1, 1)
    assert [e.reason for e in plan.events] == ["Stalled", "Restarting"]
    assert "behind the others: rank(s) 1" in plan.events[0].message
    assert plan.status.failedNode.nodeRank == 1 and plan.status.failedNode.reason == "Stalled"
    assert sorted(p.name for p in plan.delete) == ["train-node-0", "train-node-1"]
    assert plan.status.progress is None or plan.status.progress.eta == ""


def test_a_stall_names_the_stalled_rank_its_last_step_and_node_in_the_history():
    seen = progress.merge(None, 0, [answer((0, 42, 70), (1, 40, 90))])
    on_nodes = [dataclasses.replace(p, node_name=f"worker-{p.node_rank}") for p in pods()]
    plan = decide(policy_job(progressTimeoutSeconds=60), running_status(), on_nodes, NOW, progress=seen)
    [record] = plan.status.failureHistory
    assert (record.kind, record.reason, record.rank, record.nodeRank, record.nodeName) == (
        "Application", "Stalled", 1, 1, "worker-1")
    assert record.message.startswith("rank 1 on node 1 (pod train-node-1 on worker-1) was stalled")
    assert "rank 1 last reported step 40" in plan.events[0].message


def test_a_stall_with_the_budget_spent_fails_the_job():
    seen = progress.merge(None, 0, [answer((0, 42, 70))])
    status = running_status()
    status = type(status)(**{**status.__dict__, "restarts": 2})
    plan = decide(policy_job(progressTimeoutSeconds=60, maxRestarts=2), status, pods(), NOW, progress=seen)
    assert (plan.status.phase, plan.status.reason) == ("Failed", "RestartBudgetExhausted")
    assert "was stalled and the restart budget (2) is spent" in plan.status.message


def test_a_gang_that_trained_to_its_last_step_is_exiting_not_stalled():
    """Found on the test bed under load: both ranks reported step 10 of 10, node 0 exited 0, and
    node 1's torchrun took more than the 15 s bound to leave its exit barrier (node 0's store was
    gone); the silence was declared a stall, the budget was spent, the finished job Failed."""
    job = policy_job(progressTimeoutSeconds=15, maxRestarts=2)
    done = progress.merge(None, 0, [answer((0, 100, 40), (1, 100, 40))])
    assert progress.stall(job, done, at(-500), NOW) == (None, None)
    one_short = progress.merge(None, 0, [answer((0, 100, 40), (1, 99, 40))])
    assert progress.stall(job, one_short, at(-500), NOW)[0] is not None  # still a stall
    half_reported = progress.merge(None, 0, [answer((0, 100, 40))])  # rank 1 never reported its end
    assert progress.stall(job, half_reported, at(-500), NOW)[0] is not None
    plan = decide(job, running_status(), pods(), NOW, progress=done)
    assert plan.status.phase == RUNNING and not plan.delete and plan.status.restarts == 0


def test_once_a_node_succeeded_the_others_are_exiting_not_stalled():
    job = policy_job(progressTimeoutSeconds=15, maxRestarts=2)
    silent = progress.merge(None, 0, [answer((0, 42, 40), (1, 42, 40))])  # short of their last step
    exiting = [pod_view(0, "Succeeded", exit_code=0), pod_view(1, "Running", pod_ip="10.0.0.2")]
    plan = decide(job, running_status(), exiting, NOW, progress=silent)
    assert plan.status.phase == RUNNING and not plan.delete and plan.status.restarts == 0
    assert "1 succeeded" in plan.status.message
    assert decide(job, running_status(), pods(), NOW, progress=silent).status.reason == "Stalled"


def test_a_job_that_never_reports_runs_as_before():
    plan = decide(make_job(2), running_status(), pods(), NOW, progress=None)
    assert plan.status.phase == RUNNING and plan.status.progress is None and plan.requeue_after is None


# --- the operator's shell: polling and the status-write rate limit -------------------------------
def test_the_operator_polls_at_its_interval_and_writes_progress_at_most_once_per_interval():
    settings = OperatorSettings(progress_poll_seconds=10, progress_status_interval_seconds=30)
    kube, memory, fake = FakeKube(), JobMemory(), FakePods()
    obj = body(status=running_status().to_dict())

    def pass_at(seconds: float):
        fake.now = at(seconds)
        return reconcile(obj, pods(), memory, kube=kube, settings=settings, post_event=lambda e: None,
                         now=at(seconds), parse=parse, poll=fake)

    assert pass_at(0) == 10  # next poll
    assert fake.calls == [(("10.0.0.1", "10.0.0.2"), contract.DEFAULT_PROGRESS_PORT)]
    assert kube.kinds() == ["patch_status"] and kube.status["progress"]["summary"] == "10/100 (10%)"
    fake.step = 20
    assert pass_at(5) == 5 and len(fake.calls) == 1  # not due: no poll, nothing written
    requeue = pass_at(12)
    assert len(fake.calls) == 2 and kube.kinds() == ["patch_status"]  # polled; the write waits
    assert requeue == 10  # the next poll; the write may go 30 s after the last one
    pass_at(30)
    assert kube.kinds() == ["patch_status", "patch_status"] and kube.status["progress"]["step"] == 20


def test_a_phase_change_is_written_at_once_whatever_the_progress_rate_limit():
    settings = OperatorSettings(progress_poll_seconds=1, progress_status_interval_seconds=300)
    kube, memory, fake = FakeKube(), JobMemory(), FakePods()
    obj = body(status=running_status().to_dict(), failurePolicy={"progressTimeoutSeconds": 60})
    fake.now = NOW
    reconcile(obj, pods(), memory, kube=kube, settings=settings, post_event=lambda e: None, now=NOW,
              parse=parse, poll=fake)
    fake.now = NOW  # the pods keep answering with the same old report
    reconcile(obj, pods(), memory, kube=kube, settings=settings, post_event=lambda e: None, now=at(61),
              parse=parse, poll=fake)
    assert [e[1] for e in kube.log if e[0] == "patch_status"] == ["Running", "Restarting"]
    assert ("delete", ("train-node-0", "train-node-1")) in kube.log
    assert kube.status["reason"] == "Stalled"


def test_without_a_poll_function_the_pass_only_asks_and_merges_answers_on_a_later_pass():
    """The operator's own path: a pass never waits on the pods' network. It leaves the poll it
    wants in the memory (the worker runs it off the reconcile threads) and takes the answers
    that have come back, the current gang's only, on a later pass."""
    settings = OperatorSettings(progress_poll_seconds=10, progress_status_interval_seconds=0)
    kube, memory = FakeKube(), JobMemory()
    obj = body(status=running_status().to_dict())
    reconcile(obj, pods(), memory, kube=kube, settings=settings, post_event=lambda e: None, now=NOW, parse=parse)
    assert memory.polling.due == (0, (Target("10.0.0.1", range(0, 1), attempt=0), Target("10.0.0.2", range(1, 2), attempt=0)))
    assert not (kube.status.get("progress") or {}).get("ranksReporting"), kube.status  # nobody asked yet
    memory.polling.due = None  # the worker took it
    memory.polling.answers.append((1, [answer((0, 99, 0.1))]))  # a newer gang's: not this one's
    memory.polling.answers.append((0, [answer((0, 30, 0.1)), answer((1, 31, 0.1))]))
    reconcile(obj, pods(), memory, kube=kube, settings=settings, post_event=lambda e: None, now=at(1), parse=parse)
    assert kube.status["progress"]["step"] == 31 and kube.status["progress"]["ranksReporting"] == 2
    assert not memory.polling.answers and memory.polling.due is None  # not due again for 10 s


def test_a_progress_poll_that_hangs_never_holds_up_other_jobs_passes(monkeypatch):
    """Pods that cannot answer (gone, or a NetworkPolicy dropping the port) make a poll wait
    out its timeout: that wait runs beside the passes, so with fewer reconcile threads than
    polling jobs the other jobs' passes still run at once."""
    import asyncio
    import threading

    from ddpjob.controller import progress as pod_progress
    from ddpjob.controller import workqueue

    released = threading.Event()
    polls = []

    async def hanging_fetch(ip, port, deadline, limit):  # a pod that never answers
        polls.append(ip)
        while not released.is_set():
            await asyncio.sleep(0.01)
        return None

    monkeypatch.setattr(pod_progress, "fetch", hanging_fetch)
    settings = OperatorSettings(reconcile_workers=1, coalesce_seconds=0)

    async def scenario():
        runtime, kube = workqueue.Runtime(), FakeKube()
        runtime.start(settings, lambda s: kube)
        try:
            index = {("ns", "train"): pods()}
            runtime.observe(None, body(status=running_status().to_dict()), index)
            deadline = asyncio.get_running_loop().time() + 5
            while not polls:
                assert asyncio.get_running_loop().time() < deadline, "no poll started"
                await asyncio.sleep(0.01)
            # The poll hangs; the job's (and any job's) next pass still runs on the one thread.
            worker = runtime.workers[("ns", "train")]
            before = len(kube.log)
            index[("ns", "train")] = [pod_view(0, "Succeeded", 0, pod_ip="10.0.0.1"),
                                      pod_view(1, "Succeeded", 0, pod_ip="10.0.0.2")]
            worker.wakeup.set()
            while (kube.status or {}).get("phase") != "Succeeded":
                assert asyncio.get_running_loop().time() < deadline, f"pass held up: {kube.log[before:]}"
                await asyncio.sleep(0.01)
            assert worker.poll_task is not None and not worker.poll_task.done()  # still hanging
        finally:
            released.set()
            await runtime.stop()

    asyncio.run(scenario())


def test_after_an_operator_restart_a_recorded_report_keeps_the_first_report_bound_off():
    """The status says the attempt reported: after a restart the job is not taken for one that
    never did (test_progress_port.py has the stall clock after an outage)."""
    recorded = Progress(summary="5/100 (5%)", step=5, totalSteps=100, lastReportTime=format_time(at(-70)))
    status = running_status(since=-1000)
    status = type(status)(**{**status.__dict__, "progress": recorded})
    kube = FakeKube()
    obj = body(status=status.to_dict(), failurePolicy={"firstProgressTimeoutSeconds": 60})
    reconcile(obj, pods(), JobMemory(), kube=kube, settings=OperatorSettings(), post_event=lambda e: None,
              now=NOW, parse=parse, poll=lambda targets, port, timeout: [{}, {}])  # nobody answers
    reconcile(obj, pods(), JobMemory(), kube=kube, settings=OperatorSettings(), post_event=lambda e: None,
              now=at(100), parse=parse, poll=lambda targets, port, timeout: [{}, {}])
    assert (kube.status or obj["status"])["phase"] == "Running"


# --- the pod side -------------------------------------------------------------------------------
def test_report_progress_writes_one_file_per_rank_throttled_and_nothing_outside_a_job(tmp_path):
    env = {contract.DDPJOB_PROGRESS_DIR: str(tmp_path / "p"), contract.RANK: "3"}
    assert report.report_progress(5, 10, loss=float("nan"), environ=env)
    assert not report.report_progress(6, 10, environ=env)  # within a second of the last
    assert report.report_progress(7, 10, epoch=1, environ=env, force=True)
    with open(tmp_path / "p" / "rank-3.json") as f:
        assert {k: v for k, v in json.load(f).items() if k != "time"} == {"step": 7, "total_steps": 10, "epoch": 1}
    assert not report.report_progress(1, environ={})
    reports = contract.read_progress_reports(str(tmp_path / "p"))
    assert list(reports) == ["3"] and reports["3"]["step"] == 7 and reports["3"]["age_seconds"] >= 0


def test_a_restarted_program_serves_only_the_reports_of_its_own_attempt(tmp_path, monkeypatch):
    """A container the kubelet restarts in its pod finds the last run's files in /dev/shm: its
    progress server must not pass them off as the new attempt's (a goodput of 0 steps re-done)."""
    directory = str(tmp_path)
    env = {contract.DDPJOB_PROGRESS_DIR: directory, contract.RANK: "0", contract.DDPJOB_RESTART_ATTEMPT: "0"}
    assert report.report_progress(10, 15, environ=env, force=True)
    with open(tmp_path / "rank-1.json", "w") as f:  # a program that wrote its own, without an attempt
        json.dump({"step": 3}, f)
    monkeypatch.setenv(contract.DDPJOB_RESTART_ATTEMPT, "1")
    assert set(report.progress_answer(directory)["ranks"]) == {"1"}  # attempt 0's step 10 left out
    assert report.report_progress(6, 15, environ={**env, contract.DDPJOB_RESTART_ATTEMPT: "1"}, force=True)
    assert {r: v["step"] for r, v in report.progress_answer(directory)["ranks"].items()} == {"0": 6, "1": 3}
    monkeypatch.delenv(contract.DDPJOB_RESTART_ATTEMPT)  # outside a DDPJob: every report
    assert set(report.progress_answer(directory)["ranks"]) == {"0", "1"}


def test_the_reporting_rank_is_the_argument_then_the_started_group_then_rank(tmp_path, monkeypatch):
    """mp.spawn's children inherit the pod's RANK: a started process group must win over it."""
    import types

    env = {contract.DDPJOB_PROGRESS_DIR: str(tmp_path), contract.RANK: "4"}
    group = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False,
                                  get_rank=lambda: 5)
    monkeypatch.setitem(sys.modules, "torch.distributed", group)
    assert report.report_progress(1, environ=env, force=True)  # no group yet: $RANK
    group.is_initialized = lambda: True
    assert report.report_progress(2, environ=env, force=True)  # the group's rank
    assert report.report_progress(3, environ=env, force=True, rank=7)  # said outright
    assert {name: r["step"] for name, r in contract.read_progress_reports(str(tmp_path)).items()} == \
        {"4": 1, "5": 2, "7": 3}


def test_the_pod_serves_its_ranks_reports_over_http(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "rank-0.json").write_text(json.dumps({"step": 4, "loss": 1.5}))
    os.utime(tmp_path / "rank-0.json", (0, 0))  # written long ago
    server = report.serve_progress(str(tmp_path), port, host="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{contract.PROGRESS_PATH}", timeout=5) as r:
            served = json.load(r)
        assert served["ranks"]["0"]["step"] == 4 and served["ranks"]["0"]["age_seconds"] > 1e9
        parsed = progress.parse_answer(served, NOW)
        assert parsed[0].loss == 1.5
        import asyncio

        from ddpjob.controller.progress import fetch
        assert json.loads(asyncio.run(fetch("127.0.0.1", port, 5, 4096)))["ranks"]["0"]["step"] == 4
    finally:
        server.shutdown()


def test_a_poll_asks_every_pod_and_answers_per_pod_in_order_parsed_on_the_pool_it_is_given(tmp_path, monkeypatch):
    """The operator's poll: one GET per pod (coroutines on the loop), one answer per pod in
    order, each parsed on a thread of the pool it is given; a pod that does not serve, or has
    no IP, answers nothing."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from ddpjob.controller import progress as pod_progress

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "rank-0.json").write_text(json.dumps({"step": 4}))
    server = report.serve_progress(str(tmp_path), port, host="127.0.0.1")
    seen_threads = set()
    real_read = pod_progress.read_answer

    def read_answer(body, target, observed):
        seen_threads.add(threading.current_thread().name)
        return real_read(body, target, observed)

    monkeypatch.setattr(pod_progress, "read_answer", read_answer)
    targets = [pod_progress.Target(ip, range(0, 1)) for ip in ("127.0.0.1", "", "127.0.0.2")]
    try:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-poll") as pool:
            answers = asyncio.run(pod_progress.poll_pods(pool, targets, port, 2))
    finally:
        server.shutdown()
    assert [sorted(a) for a in answers] == [[0], [], []]  # 127.0.0.2 does not serve
    assert answers[0][0].step == 4
    assert seen_threads and all(name.startswith("test-poll") for name in seen_threads)


def test_the_pass_that_sees_the_gang_start_running_asks_for_a_poll_at_once():
    kube, memory, fake = FakeKube(), JobMemory(), FakePods()
    fake.now = NOW
    pending = with_phase(JobStatus(nnodes=2), "Pending", "PodsCreated", "", at(-10), created=True)
    obj = body(status=pending.to_dict())
    requeue = reconcile(obj, pods(), memory, kube=kube, settings=OperatorSettings(), post_event=lambda e: None,
                        now=NOW, parse=parse, poll=fake)
    assert kube.status["phase"] == "Running" and requeue == 0 and fake.calls == []
    reconcile(obj, pods(), memory, kube=kube, settings=OperatorSettings(), post_event=lambda e: None,
              now=at(0.2), parse=parse, poll=fake)
    assert len(fake.calls) == 1 and kube.status["progress"]["step"] == 10


def test_after_a_restart_progress_and_eta_follow_the_resumed_position():
    """Issue 23's report (PROGRESS 7/50000 two minutes after a resume from step 40): the
    operator's side, pass by pass through a failure, the restart and the resumed gang. What the
    status shows is the new attempt's own reports (40, 41, ...), never below where it resumed,
    with the ETA from the new gang's pace."""
    settings = OperatorSettings(progress_poll_seconds=1, progress_status_interval_seconds=1)
    kube, memory, clock = FakeKube(), JobMemory(), {"step": 47}

    def poll(targets, port, timeout):
        return [{r: progress.RankReport(rank=r, step=clock["step"], at=clock["now"], total_steps=50000)
                 for r in t.ranks} for t in targets]

    def gang(attempt, phase="Running"):
        return [pod_view(r, phase, attempt, pod_ip=f"10.0.{attempt}.{r + 1}") for r in range(2)]

    def pass_at(seconds, seen_pods):
        clock["now"] = at(seconds)
        obj = body(status=kube.status or running_status(attempt=2).to_dict())
        reconcile(obj, seen_pods, memory, kube=kube, settings=settings, post_event=lambda e: None,
                  now=at(seconds), parse=parse, poll=poll)
        return kube.status

    pass_at(0, gang(2))
    assert pass_at(2, [gang(2)[0], pod_view(1, "Failed", 2, exit_code=1)])["phase"] == "Restarting"
    pass_at(4, [])
    clock["step"] = 40  # the new gang resumed from the checkpoint at step 40
    pass_at(6, gang(3, "Pending"))
    pass_at(8, gang(3))
    shown = []
    for i, seconds in enumerate(range(10, 130, 10)):
        clock["step"] = 40 + i
        shown.append(pass_at(seconds, gang(3))["progress"])
    assert [p["step"] for p in shown] == list(range(40, 52))
    assert all(p["attempt"] == 3 for p in shown)
    assert shown[-1]["summary"] == "51/50000 (0%)"
    assert shown[-1]["etaSeconds"] == (50000 - 51) * 10  # 10 s a step since the resumed gang's first report


def test_a_job_that_succeeds_between_two_polls_shows_no_eta_on_the_server():
    """The kind tier's report (Succeeded with ETA 1s in kubectl get): the status is a merge
    patch, so the blank ETA of the finished job must be sent as a removal, not left out."""
    settings = OperatorSettings(progress_poll_seconds=1, progress_status_interval_seconds=1)
    kube, memory, clock = FakeKube(), JobMemory(), {"step": 28}

    def poll(targets, port, timeout):
        return [{r: progress.RankReport(rank=r, step=clock["step"], at=clock["now"], total_steps=32)
                 for r in t.ranks} for t in targets]

    def pass_at(seconds, phase):
        clock["now"] = at(seconds)
        seen_pods = [pod_view(r, phase, 0, exit_code=0 if phase == "Succeeded" else None,
                              pod_ip=f"10.0.0.{r + 1}") for r in range(2)]
        obj = body(status=kube.status or running_status(attempt=0).to_dict())
        reconcile(obj, seen_pods, memory, kube=kube, settings=settings, post_event=lambda e: None,
                  now=at(seconds), parse=parse, poll=poll)
        return kube.status

    pass_at(0, "Running")
    clock["step"] = 29
    running = pass_at(2, "Running")
    assert running["progress"]["eta"] and running["progress"]["etaSeconds"]
    done = pass_at(3, "Succeeded")
    assert done["phase"] == "Succeeded"
    assert "eta" not in done["progress"] and "etaSeconds" not in done["progress"], done["progress"]
    assert done["progress"]["summary"].startswith("29/32")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_client_that_hangs_up_before_its_answer_leaves_nothing_in_the_pods_log(tmp_path, monkeypatch, capsys):
    """The operator's poll that timed out, a port probe, a hostile tenant's pod: a client that
    resets the connection before it reads its answer. socketserver would print a whole
    traceback per such client (one landed in the README's main job under CI load); the pod's
    log stays clean and the server goes on serving."""
    import threading
    import time

    real_answer = report.progress_answer
    answering = threading.Event()

    def slow_answer(*args):
        answering.set()
        time.sleep(0.3)  # the client is gone by the time the answer is written
        return real_answer(*args)

    monkeypatch.setattr(report, "progress_answer", slow_answer)
    port = _free_port()
    server = report.serve_progress(str(tmp_path), port, host="127.0.0.1")
    try:
        for _ in range(3):
            answering.clear()
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            client.sendall(f"GET {contract.PROGRESS_PATH} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert answering.wait(5)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            client.close()  # with a zero linger: a reset, as a client killed mid-request
        time.sleep(0.6)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{contract.PROGRESS_PATH}", timeout=5) as r:
            assert "ranks" in json.load(r)
    finally:
        server.shutdown()
    assert capsys.readouterr().err == ""


def test_a_bug_in_a_handler_is_one_line_naming_the_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    def broken(*_):
        raise ValueError("no such attempt")

    monkeypatch.setattr(report, "progress_answer", broken)
    port = _free_port()
    server = report.serve_progress(str(tmp_path), port, host="127.0.0.1")
    try:
        with pytest.raises(OSError):  # the server closes the connection without an answer
            urllib.request.urlopen(f"http://127.0.0.1:{port}{contract.PROGRESS_PATH}", timeout=5)
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip() == "ddptrain: progress server: ValueError: no such attempt (from 127.0.0.1)"
