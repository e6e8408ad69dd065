"""A deterministic error fails the job after one restart, named once (issue 36, item 4):
api/repeated_error.py, the operator's failure policy (controller/policy/failure.py), `ddpjob
run`'s (local/runner.py), and the trainer's summary of an uncaught exception (uncaught.py)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddpjob.api import repeated_error
from ddpjob.api.spec import FailurePolicy
from ddpjob.api.repeated_error import error_of, repeated, same
from ddpjob.api.status import JobStatus, Progress, format_time, with_phase
from ddpjob.local.runner import RunAccounting, early_error, restart_or_fail
from ddpjob.local.supervisor import GangOutcome
from ddptrainer import init_guard, summary, uncaught
from tests.support.decisions import decide
from tests.support.jobs import make_job, pod_view

pytestmark = pytest.mark.unit

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
ROOT = Path(__file__).resolve().parents[2]
ZERO = ("ddptrain-pod: node 1: exit 1: worker rank 3 exited 1 (error (retryable)): "
        "ZeroDivisionError: division by zero (train.py:12 in main) [1 other worker(s) failed too]")


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


# --- what the error is --------------------------------------------------------------------------
@pytest.mark.parametrize("message, error", [
    (ZERO, "ZeroDivisionError: division by zero (train.py:12 in main)"),
    ("Traceback (most recent call last):\n  File \"t.py\", line 3\ntorch.OutOfMemoryError: CUDA out of memory.",
     "torch.OutOfMemoryError: CUDA out of memory."),
    # a plain torchrun's log tail: the worker's error, not the wrapper's summary after it
    ("ValueError: bad shape 3x4\n...\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
     "train.py FAILED\nRoot Cause (first observed failure):\n  exitcode  : 1", "ValueError: bad shape 3x4"),
    ("mymodule.ConfigError", "mymodule.ConfigError"),
    ("the worker left no summary (see the pod log)", ""),
    ("UserWarning: this is a warning: not an error", ""),
    ("NCCL Error 2: unhandled system error", ""),
    ("", ""),
])
def test_the_error_is_the_last_exception_a_message_names_of_its_own(message, error):
    assert error_of(message) == error


def test_the_error_is_bounded_and_printable_whatever_a_pod_writes():
    hostile = "RuntimeError: " + "\x1b[31m" + "A" * 70000
    error = error_of(hostile)
    assert len(error) <= repeated_error.ERROR_LIMIT and "\x1b" not in error and error.startswith("RuntimeError: ")


def test_digits_aside_two_errors_are_the_same():
    assert same("OSError: port 29500 in use on 10.0.0.3", "OSError: port 41234 in use on 10.0.0.7")
    assert not same("OSError: port in use", "ValueError: port in use") and not same("", "")


@pytest.mark.parametrize("code, counts", [(1, True), (7, True), (0, False), (None, False), (137, False),
                                          (143, False), (12, False), (13, False)])
def test_only_an_exit_of_the_codes_own_counts(code, counts):
    assert repeated_error.counts(code) is counts


def test_repeated_counts_attempts_in_a_row():
    e = "KeyError: 'lr'"
    assert not repeated(e, [], 2) and repeated(e, [e], 2) and repeated(e, [], 1)
    assert not repeated(e, ["", e], 2)  # the attempt before did not count: the streak starts anew
    assert repeated(e, [e, e, "x"], 3) and not repeated(e, [e, "x", e], 3)
    assert not repeated(e, [e, e], 0) and not repeated("", ["", ""], 2)


def test_before_training():
    early = repeated_error.failed_before_training
    assert early(reported=False, ever_reported=True, seconds_since_start=10_000)  # the program reports
    assert not early(reported=True, ever_reported=True, seconds_since_start=1)
    assert early(reported=False, ever_reported=False, seconds_since_start=20)
    assert not early(reported=False, ever_reported=False, seconds_since_start=3600)  # a long run's crash
    assert not early(reported=False, ever_reported=False, seconds_since_start=None)


# --- the operator ------------------------------------------------------------------------------
def crashed(rank: int, attempt: int, message: str = ZERO, code: int = 1, ran: float = 8):
    return pod_view(rank, "Failed", attempt, exit_code=code, terminated_reason="Error", terminated_message=message,
                    finished_at=ago(2), started_at=ago(2 + ran), created_at=ago(30))


def running(rank: int, attempt: int):
    return pod_view(rank, "Running", attempt, created_at=ago(30))


def status_at(attempt: int, history=(), **fields) -> JobStatus:
    base = JobStatus(restartAttempt=attempt, restarts=attempt, nnodes=2, startTime=format_time(ago(600)),
                     failureHistory=tuple(history), **fields)
    return with_phase(base, "Running", "PodsCreated", "", ago(30), created=True)


def test_the_same_error_before_training_twice_fails_the_job_naming_it_once():
    job = make_job(failurePolicy=FailurePolicy(restartMode="Recreate"))
    first = decide(job, status_at(0), [crashed(0, 0), running(1, 0)], NOW)
    assert first.status.phase == "Restarting"  # once: it may have been bad luck
    assert first.status.failureHistory[0].error == "ZeroDivisionError: division by zero (train.py:12 in main)"
    # the next attempt, the same error from another rank (digits differ: a rank, a port)
    second = decide(job, status_at(1, first.status.failureHistory),
                    [running(0, 1), crashed(1, 1, ZERO.replace("rank 3", "rank 5"))], NOW)
    s = second.status
    assert (s.phase, s.reason, s.restarts) == ("Failed", "RepeatedError", 1)
    assert ("the same error on attempts 0 and 1, each before it trained: ZeroDivisionError: division by zero "
            "(train.py:12 in main); a restart cannot fix this (failurePolicy.repeatedErrorAttempts: 2)") in s.message
    assert [e.reason for e in second.events] == ["RepeatedError"] and s.message.count("ZeroDivisionError") == 1
    assert s.failureHistory[0].restartMode == ""  # it ended the job


def test_bad_luck_that_does_not_repeat_word_for_word_restarts_as_before():
    job = make_job(failurePolicy=FailurePolicy(restartMode="Recreate"))
    first = decide(job, status_at(0), [crashed(0, 0), running(1, 0)], NOW)
    other = "ddptrain-pod: node 0: exit 1: worker rank 0 exited 1: ConnectionResetError: reset by peer"
    second = decide(job, status_at(1, first.status.failureHistory), [crashed(0, 1, other), running(1, 1)], NOW)
    assert second.status.phase == "Restarting" and second.status.restarts == 2


@pytest.mark.parametrize("why", ["trained", "late", "signal", "off", "no-error"])
def test_what_does_not_count(why):
    fields, limit, code, ran, message = {}, 2, 1, 8, ZERO
    if why == "trained":  # the attempt reported progress: it trained, whatever came after
        fields = {"progress": Progress(step=40, attempt=1, lastReportTime=format_time(ago(5)))}
    elif why == "late":  # reports nothing, and ran an hour before it failed
        ran = 3600
    elif why == "signal":
        code = 137
    elif why == "off":
        limit = 0
    else:
        message = "the worker left no summary (see the pod log)"
    job = make_job(failurePolicy=FailurePolicy(restartMode="Recreate", repeatedErrorAttempts=limit))
    before = status_at(1, [dataclasses.replace(decide(job, status_at(0), [crashed(0, 0, message, code, ran), running(1, 0)],
                                                      NOW).status.failureHistory[0])], **fields)
    plan = decide(job, before, [crashed(0, 1, message, code, ran), running(1, 1)], NOW)
    assert plan.status.phase == "Restarting", plan.status.message


def test_one_attempt_is_enough_where_the_policy_says_so():
    job = make_job(failurePolicy=FailurePolicy(repeatedErrorAttempts=1))
    s = decide(job, status_at(0), [crashed(0, 0), running(1, 0)], NOW).status
    assert (s.phase, s.reason) == ("Failed", "RepeatedError")
    assert "attempt 0 failed before it trained: ZeroDivisionError" in s.message


def test_a_permanent_code_stays_permanent():
    s = decide(make_job(failurePolicy=FailurePolicy(repeatedErrorAttempts=1)), status_at(0),
               [crashed(0, 0, code=2), running(1, 0)], NOW).status
    assert s.reason == "PodFailedPermanent"


# --- ddpjob run -------------------------------------------------------------------------------
def test_ddpjob_run_judges_the_same_way():
    spec = make_job().spec
    failed = GangOutcome("failed", node_rank=0, exit_code=1)
    accounting = RunAccounting()
    error = early_error(failed, ZERO, accounting, seconds=5)
    assert error.startswith("ZeroDivisionError")
    first = restart_or_fail(failed, restarts_done=0, spec=spec, job_name="j", error=error, errors_before=[])
    assert first.restart
    second = restart_or_fail(failed, restarts_done=1, spec=spec, job_name="j", error=error, errors_before=[error])
    assert not second.restart and second.exit_code == 1
    assert "the same error on attempts 0 and 1, each before it trained: ZeroDivisionError" in second.message
    accounting.attempt_reported = True  # it trained: a restart, as before
    assert early_error(failed, ZERO, accounting, seconds=5) == ""


# --- the trainer: an uncaught exception's line, left for ddptrain-pod ------------------------------
SCRIPT = textwrap.dedent('''
    def main():
        1 / 0
    main()
''')


def run_worker(tmp_path: Path, script: str = SCRIPT, parent: str = "", rank: str = "3") -> subprocess.CompletedProcess:
    folder = tmp_path / "endings"
    folder.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([init_guard.site_dir(), str(ROOT / "trainer"), str(ROOT / "operator")]),
               RANK=rank, **{summary.ENV_SUMMARY_DIR: str(folder), summary.ENV_ENTRY_PID: parent or str(os.getpid())})
    path = tmp_path / "train.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=60)


def test_a_workers_uncaught_exception_is_its_ending_and_its_traceback_is_printed_as_ever(tmp_path):
    result = run_worker(tmp_path)
    assert result.returncode == 1 and "Traceback (most recent call last)" in result.stderr
    [ending] = summary.read_endings(str(tmp_path / "endings"))
    assert (ending.code, ending.rank, ending.message) == (1, 3, "ZeroDivisionError: division by zero (train.py:3 in main)")


def test_a_process_a_worker_starts_leaves_no_ending(tmp_path):
    run_worker(tmp_path, parent="1")  # its parent is not the entry point
    assert summary.read_endings(str(tmp_path / "endings")) == []


def test_an_ending_of_the_ranks_own_is_kept(tmp_path):
    (tmp_path / "endings").mkdir()
    summary.leave_ending(3, "data missing: /data", 3, {summary.ENV_SUMMARY_DIR: str(tmp_path / "endings")})
    run_worker(tmp_path)
    [ending] = summary.read_endings(str(tmp_path / "endings"))
    assert (ending.code, ending.message) == (3, "data missing: /data")


def test_mp_spawns_carrier_names_the_childs_error():
    class ProcessRaisedException(Exception):
        pass

    text = ('\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n'
            '  File "/x/torch/multiprocessing/spawn.py", line 90, in _wrap\n    fn(i, *args)\n'
            '  File "/workspace/spawn_train.py", line 21, in worker\n    model(x)\nKeyError: \'lr\'\n')
    said = uncaught.describe(ProcessRaisedException, ProcessRaisedException(text), None)
    assert said == "KeyError: 'lr' (spawn_train.py:21 in worker)"
    assert error_of(said) == said
