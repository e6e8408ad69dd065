"""Progress as pictures (issue 36, item 7): the bar `ddpjob run` puts before node 0's progress
lines on a terminal, the sparklines at the end of a run, and the HTML page of `ddpjob run --plot`
and `ddpjob status --plot` (api/progress_plot.py, local/progress_view.py)."""
from __future__ import annotations

import io

import pytest

from ddpjob.api import progress_plot
from ddpjob.api.progress_plot import Point, bar, page, point_of, points_of, sparkline, summary
from ddpjob.cli.main import build_parser
from ddpjob.local.progress_view import ProgressView
from ddpjob.local.supervisor import Console

pytestmark = pytest.mark.unit

LOG = [
    "ddptrain: start world_size=2 backend=gloo step=0/32",
    "ddptrain: progress epoch=1/8 step=4/32 loss=2.3112 images_per_sec=652.4 eta_seconds=3 world_size=2",
    "something else entirely",
    "ddptrain: progress epoch=2/8 step=8/32 loss=2.2930 images_per_sec=1485.1 eta_seconds=1",
    "ddptrain: progress epoch=8/8 step=32/32 loss=1.0482 images_per_sec=1178.2 eta_seconds=0",
    "ddptrain: done step=32/32 loss=1.0482 world_size=2 elapsed_seconds=3.4",
]


def test_the_trainers_lines_become_points_once_per_step():
    points = points_of(LOG)
    assert [p.step for p in points] == [4, 8, 32]
    assert points[-1] == Point(step=32, total=32, loss=1.0482, images_per_sec=1178.2)
    assert point_of("ddptrain: progress step=x loss=1") is None and point_of("no") is None
    assert point_of("ddptrain: progress step=3 loss=nan images_per_sec=inf") == Point(3)


def test_a_log_of_any_length_keeps_the_newest_points():
    lines = (f"ddptrain: progress step={i}/100000 loss={1 / (i + 1)}" for i in range(100_000))
    points = points_of(lines)
    assert len(points) == progress_plot.MAX_POINTS and points[-1].step == 99_999


def test_bar_and_sparkline():
    assert bar(12, 40) == "[██████░░░░░░░░░░░░░░]  30% 12/40"
    assert bar(40, 40).startswith("[" + "█" * 20 + "] 100%") and bar(5, None) == "step 5"
    assert sparkline([3, 2, 1]) == "█▅▁" and sparkline([1, 1]) == "▁▁" and sparkline([]) == ""
    assert len(sparkline(list(range(1000)), width=40)) == 40


def test_the_summary_says_where_the_loss_went():
    assert summary(points_of(LOG)) == ["loss 2.311 ██▁ 1.048 over steps 4-32",
                                       "images/s 652 ▁█▅ 1178 over steps 4-32"]
    assert summary(points_of(LOG[:2])) == []  # one report: nothing to draw


def test_the_page_is_self_contained_and_escapes_what_it_shows():
    text = page(points_of(LOG), "DDPJob <script>alert(1)</script>")
    assert text.count("<svg") == 2 and "<polyline" in text
    assert "<script" not in text and "&lt;script&gt;" in text and "http" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")


def test_ddpjob_run_puts_a_bar_before_node_0s_progress_on_a_terminal_and_draws_at_the_end(tmp_path):
    out, notes = io.StringIO(), []
    view = ProgressView(terminal=True, plot_path=str(tmp_path / "run.html"), title="t")
    console = Console(out=out, err=io.StringIO(), view=view)
    for line in LOG:
        console.node_line(0, line)
    console.node_line(1, LOG[1])  # another node's: as it is
    printed = out.getvalue().splitlines()
    assert printed[1] == "[node-0] [██░░░░░░░░░░░░░░░░░░]  12% 4/32 " + LOG[1]
    assert printed[0] == "[node-0] " + LOG[0] and printed[-1] == "[node-1] " + LOG[1]
    view.finish(notes.append)
    assert notes[0].startswith("loss 2.311 ") and (tmp_path / "run.html").read_text().count("<svg") == 2
    piped = ProgressView(terminal=False)
    assert piped.line(0, LOG[1]) == LOG[1]  # a pipe gets the lines as they are


def test_a_plot_that_cannot_be_written_says_so(tmp_path):
    notes = []
    view = ProgressView(terminal=False, plot_path=str(tmp_path / "missing" / "x.html"))
    for line in LOG:
        view.line(0, line)
    view.finish(notes.append)
    assert notes[-1].startswith(f"--plot {tmp_path}/missing/x.html: not written")


def test_status_plot_and_output_together_are_refused():
    from ddpjob.cli.status import run_status

    args = build_parser().parse_args(["status", "j", "--plot", "-o", "json"])
    err = io.StringIO()
    assert run_status(args, io.StringIO(), err) == 2 and "--plot and -o" in err.getvalue()


def test_logs_and_submit_follow_put_the_bar_before_node_0s_progress_on_a_terminal():
    from ddpjob.cli.logs import _print
    from ddpjob.client.job_logs import LogLine

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for out, barred in ((Terminal(), True), (io.StringIO(), False)):
        _print(LogLine(0, 0, LOG[1]), None, out)
        _print(LogLine(1, 0, LOG[1]), None, out)
        first, second = out.getvalue().splitlines()
        assert first == ("[██░░░░░░░░░░░░░░░░░░]  12% 4/32 " if barred else "") + "node-0 | " + LOG[1]
        assert second == "node-1 | " + LOG[1]
