"""The start line's start-up phases (trainer/ddptrainer/startup.py)."""
from __future__ import annotations

import os
import time

from ddptrainer.startup import StartupTimes, process_start_time


def test_the_process_start_is_read_from_proc_and_is_before_now():
    started = process_start_time()
    assert started is not None
    assert 0 <= time.time() - started < 24 * 3600


def test_a_command_name_with_spaces_and_parentheses_is_skipped(tmp_path):
    fields = ["S"] + ["0"] * 18 + ["250"]  # fields 3..22: the start time is the 22nd
    stat = tmp_path / "stat"
    stat.write_text(f"4242 (my (odd) name) {' '.join(fields)} 0 0\n")
    proc_stat = tmp_path / "proc_stat"
    proc_stat.write_text("cpu 1 2 3\nbtime 1000\n")
    assert process_start_time(str(stat), str(proc_stat)) == 1000 + 250 / os.sysconf("SC_CLK_TCK")


def test_unreadable_proc_gives_no_start(tmp_path):
    assert process_start_time(str(tmp_path / "missing"), str(tmp_path / "missing")) is None


def test_phases_are_the_seconds_between_marks_and_import_the_time_before_the_first():
    now = iter([100.0, 101.5, 101.75, 104.0])
    times = StartupTimes(clock=lambda: next(now), started=97.0)
    times.mark("rendezvous")
    times.mark("data")
    times.mark("model_and_resume")
    assert times.fields() == {"startup_import_s": 3.0, "startup_rendezvous_s": 1.5,
                              "startup_data_s": 0.25, "startup_model_and_resume_s": 2.25}


def test_a_start_time_that_makes_no_sense_is_left_out():
    times = StartupTimes(clock=lambda: 100.0, started=200.0)  # a clock stepped back
    assert "startup_import_s" not in times.fields()
