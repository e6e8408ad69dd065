"""Goodput (api/goodput.py): where a job's wall time went, from a synthetic timeline; how the
operator writes it (no write of its own, the boundaries at once) and what it says at the end."""
from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from ddpjob.api import goodput
from ddpjob.api.goodput import Moment, account, advance
from ddpjob.api.status import JobStatus, Progress, format_time, with_phase
from ddpjob.controller import metrics
from ddpjob.controller.reconcile import JobMemory, reconcile
from ddpjob.controller.settings import OperatorSettings
from tests.support.operator_fakes import FakeKube, FakePods, at, body, parse, pods, running_status

pytestmark = pytest.mark.unit

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def t(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def timeline(*moments: tuple[float, Moment]):
    """The accounting after each (seconds, moment) in turn."""
    figures = None
    for seconds, moment in moments:
        figures = advance(figures, moment, t(seconds))
    return figures


QUEUED = Moment(held="Queued")
PENDING = Moment()
RUNNING_SILENT = Moment(running=True)  # no report yet, and the job has never reported
FAILED_OVER = Moment(restarting=True, ever_reported=True, restarts=1)


def test_a_synthetic_timeline_with_one_restart():
    """Queued 60 s; the gang starts (Pending 40 s, then 10 s Running before its first report);
    trains 300 s to step 300; fails; restarts 30 s and resumes at step 250; trains 300 s more."""
    done = timeline(
        (0, QUEUED),
        (60, PENDING),
        (100, RUNNING_SILENT),  # counted as training until a report says otherwise ...
        (110, Moment(running=True, step=0, ever_reported=True)),  # ... which it does: 10 s of start
        (400, Moment(running=True, step=300, ever_reported=True)),
        (410, FAILED_OVER),
        (420, Moment(ever_reported=True, restarts=1)),  # the new gang Pending: still the restart
        (430, Moment(running=True, ever_reported=True, restarts=1)),  # running, not reported yet
        (440, Moment(running=True, step=250, ever_reported=True, restarts=1)),  # resumed at 250
        (600, Moment(running=True, step=500, ever_reported=True, restarts=1)),
        (740, Moment(finished=True, step=600, ever_reported=True, restarts=1)),
    )
    assert (done.queuedSeconds, done.startingSeconds, done.trainingSeconds, done.restartingSeconds) == (60, 50, 600, 30)
    assert (done.wallSeconds, done.restarts, done.lastRestartSeconds, done.stepsRedone) == (740, 1, 30, 50)
    assert (done.ratio, done.percent, done.segment) == (0.8108, "81%", "Finished")
    assert done.summary == "training 81% of 12m20s; 1 restart cost 30s, 50 steps re-done; queued 1m00s, starting 50s"
    # Finished is final: a later look changes nothing.
    assert advance(done, Moment(finished=True), t(9999)) == done


def test_the_example_of_the_issue():
    """Three restarts of 2 minutes each in a 2h10m run, 410 steps re-done."""
    moments, now, step = [(0, Moment(running=True, step=0, ever_reported=True))], 0, 0
    for restart in range(1, 4):
        now += 2400
        step += 1000
        moments += [(now - 1, Moment(running=True, step=step, ever_reported=True, restarts=restart - 1)),
                    (now, Moment(restarting=True, ever_reported=True, restarts=restart)),
                    (now + 120, Moment(running=True, step=step - (137 if restart < 3 else 136), ever_reported=True,
                                       restarts=restart))]
        now += 120
    moments.append((7800, Moment(finished=True, ever_reported=True, restarts=3)))
    done = timeline(*moments)
    assert done.summary == "training 95% of 2h10m; 3 restarts cost 6m00s, 410 steps re-done"


def test_a_program_that_never_reports_trains_while_it_runs_and_suspension_is_its_own():
    done = timeline((0, PENDING), (20, RUNNING_SILENT), (80, Moment(held="Suspended")), (200, PENDING),
                    (210, RUNNING_SILENT), (300, Moment(finished=True)))
    assert (done.startingSeconds, done.trainingSeconds, done.suspendedSeconds, done.wallSeconds) == (30, 150, 120, 300)
    # Nothing reported: the Running time is counted, but no percentage is claimed (issue 36).
    assert done.summary == "training unknown (no progress reported) of 5m00s; starting 30s, suspended 2m00s"
    assert done.percent == "unknown"


def test_a_gang_that_fails_in_its_first_step_every_time_claims_no_training():
    """Each attempt reports once after init, at step 0, and fails before step 1 (issue 36: this
    read "training 99%, 0 steps re-done")."""
    at_init = Moment(running=True, step=0, ever_reported=True)
    done = timeline((0, PENDING), (20, RUNNING_SILENT), (30, at_init), (90, FAILED_OVER),
                    (120, replace(at_init, restarts=1)), (180, Moment(restarting=True, ever_reported=True, restarts=2)),
                    (210, replace(at_init, restarts=2)), (300, Moment(finished=True, ever_reported=True, restarts=2)))
    assert done.percent == "unknown"
    assert done.summary == ("training unknown (no step trained: every report at step 0) of 5m00s; "
                            "2 restarts cost 1m00s; starting 30s")
    # The first report past it: from then on the percentage is claimed.
    going = timeline((0, PENDING), (30, at_init), (40, replace(at_init, step=5)))
    assert going.percent == "25%" and going.firstStep is None and going.highestStep == 5
    # A poll that saw attempt 0 only at step 10, then attempt 1 resumed at 6: trained (the CI case)
    seen = timeline((0, PENDING), (30, replace(at_init, step=10)), (60, FAILED_OVER),
                    (70, Moment(running=True, step=6, ever_reported=True, restarts=1)))
    assert seen.percent != "unknown" and seen.firstStep is None


def test_a_goodput_counted_before_first_step_existed_keeps_its_percentage():
    old = replace(timeline((0, PENDING), (30, Moment(running=True, step=3, ever_reported=True))), firstStep=None)
    later = advance(old, Moment(running=True, step=3, ever_reported=True), t(60))
    assert later.firstStep is None and later.percent == "50%"


def test_the_percentage_agrees_with_the_ratio_as_shown():
    """0.469996 was shown as ratio 0.47 beside "46%" (kind): both come from the rounded ratio."""
    going = timeline((0, PENDING), (30, Moment(running=True, step=3, ever_reported=True)),
                     (40, Moment(running=True, step=5, ever_reported=True)))  # past the first step: trained
    edge = goodput._figures(replace(going, trainingSeconds=46.9996, startingSeconds=53.0004))
    assert edge.ratio == 0.47 and edge.percent == "47%"
    below = goodput._figures(replace(going, trainingSeconds=46.9949, startingSeconds=53.0051))
    assert below.ratio == 0.4699 and below.percent == "46%"


def test_the_clock_never_runs_backwards():
    done = timeline((0, PENDING), (10, RUNNING_SILENT), (5, Moment(finished=True)))  # another replica's clock
    assert done.wallSeconds == 10 and min(done.trainingSeconds, done.startingSeconds) >= 0


# --- the operator's statuses --------------------------------------------------------------------
def reported(status: JobStatus, step: int, seconds: float) -> JobStatus:
    return replace(status, progress=Progress(summary=str(step), step=step, lastReportTime=format_time(t(seconds)),
                                             ranksReporting=2, attempt=status.restartAttempt))


def test_an_idle_pass_leaves_it_as_it_was_and_a_change_moves_it():
    running = with_phase(JobStatus(nnodes=2), "Running", "AllNodesRunning", "", t(0), created=True)
    first = account(JobStatus(), reported(running, 10, 0), t(0))
    assert first.goodput.segment == "Training"
    idle = account(first, first, t(50))
    assert idle == first  # nothing changed: the status is not rewritten
    moved = account(first, reported(first, 20, 50), t(50))
    assert moved.goodput.trainingSeconds == 50 and moved.goodput.highestStep == 20
    assert goodput.only_refreshed(first.goodput, moved.goodput)  # may wait like any progress write
    failed = account(moved, replace(with_phase(moved, "Restarting", "RetryableFailure", "", t(60)), restarts=1), t(60))
    assert failed.goodput.segment == "Restarting" and not goodput.only_refreshed(moved.goodput, failed.goodput)


def test_a_job_that_finished_before_goodput_was_counted_gets_none():
    done = with_phase(JobStatus(nnodes=2), "Succeeded", "AllNodesSucceeded", "", t(0))
    assert account(done, done, t(10)).goodput is None


def test_a_progress_refresh_waits_with_progress_but_the_attempts_first_report_is_written_at_once():
    """The progress write limit (progress_status_interval_seconds) holds back a refresh of the
    figures; the report that ends a restart is a new segment, and its time is the boundary."""
    settings = OperatorSettings(progress_poll_seconds=1, progress_status_interval_seconds=300)
    restarted = running_status(since=-5, attempt=1)
    # Attempt 0 reported up to step 40; the restart began 20 s ago; attempt 1 runs, silent so far.
    earlier = replace(restarted, restarts=1, progress=Progress(summary="40/100 (40%)", step=40, totalSteps=100,
                                                               lastReportTime=format_time(at(-25)), attempt=0))
    counting = advance(advance(None, Moment(running=True, step=40, ever_reported=True), at(-100)),
                       Moment(restarting=True, ever_reported=True, restarts=1), at(-20))
    kube, memory, fake = FakeKube(), JobMemory(), FakePods()
    memory.polling.written_at = at(-25)  # attempt 0's last progress write: inside the interval
    obj = body(status=replace(earlier, goodput=counting).to_dict())
    silent = lambda targets, port, timeout: [{} for _ in targets]  # noqa: E731 - the pods say nothing yet
    reconcile(obj, pods(1), memory, kube=kube, settings=settings, post_event=lambda e: None, now=at(-1),
              parse=parse, poll=silent)
    assert kube.kinds() == ["patch_status"] and kube.status["goodput"]["segment"] == "Restarting"
    fake.now, fake.step = at(0), 30  # resumed from the checkpoint at step 30
    reconcile(obj, pods(1), memory, kube=kube, settings=settings, post_event=lambda e: None, now=at(0),
              parse=parse, poll=fake)
    assert kube.kinds() == ["patch_status"] * 2, kube.log
    written = kube.status["goodput"]
    assert (written["segment"], written["restartingSeconds"], written["lastRestartSeconds"]) == ("Training", 20, 20)
    assert (written["stepsRedone"], written["highestStep"], written["trainingSeconds"]) == (10, 40, 80)
    fake.now, fake.step = at(5), 35
    reconcile(obj, pods(1), memory, kube=kube, settings=settings, post_event=lambda e: None, now=at(5),
              parse=parse, poll=fake)
    assert kube.kinds() == ["patch_status"] * 2  # the next report (and its refresh) waits


def test_the_restart_histogram_observes_a_restart_that_reached_its_first_report():
    before = metrics.REGISTRY.get_sample_value("ddpjob_gang_restart_duration_seconds_count") or 0
    restarting = timeline((0, Moment(running=True, step=5, ever_reported=True)), (10, FAILED_OVER))
    back = advance(restarting, Moment(running=True, step=3, ever_reported=True, restarts=1), t(35))
    metrics.observe_goodput(restarting, back)
    metrics.observe_goodput(back, back)  # the same status again: not a second restart
    assert metrics.REGISTRY.get_sample_value("ddpjob_gang_restart_duration_seconds_count") == before + 1
    assert back.lastRestartSeconds == 25


def test_the_goodput_gauge_reads_each_jobs_ratio():
    ratio = timeline((0, PENDING), (10, RUNNING_SILENT), (40, Moment(finished=True)))
    metrics.goodput_from(lambda: [("ns", "a", ratio), ("ns", "b", None)])
    assert metrics.REGISTRY.get_sample_value("ddpjob_job_goodput_ratio", {"namespace": "ns", "name": "a"}) == 0.75
    assert metrics.REGISTRY.get_sample_value("ddpjob_job_goodput_ratio", {"namespace": "ns", "name": "b"}) is None
    metrics.goodput_from(lambda: ())
