"""Checkpoint-interval advice (api/checkpoint_advice.py, issue 23): Daly's optimum, what the
ranks report of their checkpoints (bounded: it comes from the pods), and the Event at a
restart where the interval in use is far off."""
from __future__ import annotations

import math

import pytest

from ddpjob import contract
from ddpjob.api import progress
from ddpjob.api.checkpoint_advice import OFF_BY, advise, daly_interval
from ddpjob.api.status import Goodput, Progress
from ddpjob.restart_orders import EntryState
from tests.support.decisions import decide
from tests.support.jobs import make_job, pod_view
from tests.support.operator_fakes import NOW, at, running_status

pytestmark = pytest.mark.unit


def test_dalys_optimum_refines_youngs_and_is_the_mtbf_for_a_cost_beyond_half_of_it():
    cost, mtbf = 10.0, 3600.0
    young = math.sqrt(2 * cost * mtbf)
    x = math.sqrt(cost / (2 * mtbf))
    assert daly_interval(cost, mtbf) == pytest.approx(young * (1 + x / 3 + x * x / 9) - cost)
    assert daly_interval(cost, mtbf) == pytest.approx(261.7, abs=0.1)
    assert daly_interval(100.0, 40.0) == 40.0
    with pytest.raises(ValueError):
        daly_interval(0.0, 10.0)


def test_no_advice_before_a_restart_or_a_reported_cost():
    reported = Progress(checkpointSeconds=2.0, checkpointIntervalSeconds=60.0)
    assert advise(Goodput(trainingSeconds=1000.0), reported) is None  # no restart: no rate
    assert advise(Goodput(trainingSeconds=1000.0, restarts=1), Progress()) is None  # no cost
    assert advise(None, reported) is None


def test_the_advice_counts_running_time_per_restart_and_speaks_only_when_far_off():
    figures = Goodput(trainingSeconds=3000.0, startingSeconds=300.0, restartingSeconds=300.0,
                      queuedSeconds=9000.0, restarts=2)  # queued time is no exposure to failures
    advice = advise(figures, Progress(checkpointSeconds=2.0, checkpointIntervalSeconds=20.0))
    assert advice.mtbf == 1800.0
    assert advice.interval == pytest.approx(round(daly_interval(2.0, 1800.0), 1))
    assert advice.worth_saying and "2 restart(s)" in advice.message  # 20 s against ~84 s
    near = advise(figures, Progress(checkpointSeconds=2.0, checkpointIntervalSeconds=advice.interval * OFF_BY * 0.99))
    assert not near.worth_saying


@pytest.mark.parametrize("value, kept", [
    (2.5, 2.5), (0, 0.0), (-1, None), (1e300, None), (float("nan"), None), ("5", None), (True, None),
    (10 ** 400, None)])
def test_a_reported_checkpoint_figure_is_bounded(value, kept):
    answer = {"ranks": {"0": {"step": 3, "age_seconds": 1, "checkpoint_seconds": value,
                              "checkpoint_interval_seconds": value}}}
    report = progress.parse_answer(answer, NOW)[0]
    assert report.checkpoint_seconds == kept and report.checkpoint_interval_seconds == kept


def test_the_status_shows_the_slowest_ranks_cost_and_keeps_it_until_the_next_attempt_reports_one():
    answer = {"ranks": {"0": {"step": 40, "age_seconds": 0, "checkpoint_seconds": 0.5, "checkpoint_interval_seconds": 30},
                        "1": {"step": 40, "age_seconds": 0, "checkpoint_seconds": 1.5, "checkpoint_interval_seconds": 31}}}
    gang = progress.merge(None, 0, [progress.parse_answer(answer, NOW)])
    shown = progress.to_status(gang, running=True)
    assert (shown.checkpointSeconds, shown.checkpointIntervalSeconds) == (1.5, 31.0)
    later = progress.merge(None, 1, [progress.parse_answer({"ranks": {"0": {"step": 41, "age_seconds": 0}}}, NOW)])
    kept = progress.to_status(later, running=True, previous=shown)
    assert (kept.step, kept.checkpointSeconds, kept.checkpointIntervalSeconds) == (41, 1.5, 31.0)


def _gang(attempt=0):
    return [pod_view(r, "Running", attempt, pod_ip=f"10.0.0.{r + 1}", restart_nonce=f"token-{r}",
                     node_name=f"worker-{r}", container_ready=True) for r in range(2)]


def test_a_restart_with_a_far_off_interval_says_so_once_and_the_goodput_carries_the_suggestion():
    job, pods = make_job(2), _gang()
    answer = {"ranks": {"0": {"step": 40, "total_steps": 1000, "age_seconds": 0, "checkpoint_seconds": 2.0,
                              "checkpoint_interval_seconds": 5.0}}}
    trained = decide(job, running_status(), pods, NOW,
                     progress=progress.merge(None, 0, [progress.parse_answer(answer, NOW)]))
    assert not any(e.reason == "CheckpointInterval" for e in trained.events)  # no restart yet
    failed = EntryState(0, contract.ENTRY_FAILED, 137, "killed", reported=True)
    restarted = decide(job, trained.status, pods, at(600), entry_states={pods[1].uid: failed})
    advice = [e for e in restarted.events if e.reason == "CheckpointInterval"]
    assert len(advice) == 1 and advice[0].type == "Normal", restarted.events
    suggested = restarted.status.goodput.suggestedCheckpointIntervalSeconds
    assert suggested is not None and suggested > 5.0 * OFF_BY
    assert "every 5s" in advice[0].message and "1 restart(s)" in advice[0].message
    again = decide(job, restarted.status, _gang(1), at(601))
    assert not any(e.reason == "CheckpointInterval" for e in again.events)  # once per restart
