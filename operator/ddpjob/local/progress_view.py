"""Node 0's progress as `ddpjob run` relays it: a bar before each progress line on a terminal,
and at the end the loss and throughput as sparklines and, with ``--plot FILE``, an HTML page
(api/progress_plot.py draws them)."""
from __future__ import annotations

import collections
import os
from typing import Callable, Optional

from ddpjob.api import progress_plot


class ProgressView:
    def __init__(self, terminal: bool, plot_path: Optional[str] = None, title: str = "") -> None:
        self.terminal = terminal
        self.plot_path = plot_path
        self.title = title
        self._lines: collections.deque[str] = collections.deque(maxlen=progress_plot.MAX_POINTS)

    def line(self, node_rank: int, text: str) -> str:
        """The line as it is printed (with a bar in front on a terminal); node 0's progress kept."""
        if node_rank != 0:
            return text
        point = progress_plot.point_of(text)
        if point is None:
            return text
        self._lines.append(text)
        return f"{progress_plot.bar(point.step, point.total)} {text}" if self.terminal else text

    def finish(self, note: Callable[[str], None]) -> None:
        """The sparklines, and the page where --plot asked for one."""
        points = progress_plot.points_of(self._lines)
        for line in progress_plot.summary(points):
            note(line)
        if self.plot_path is None:
            return
        try:
            with open(self.plot_path, "w", encoding="utf-8") as f:
                f.write(progress_plot.page(points, self.title))
        except OSError as error:
            note(f"--plot {self.plot_path}: not written: {error.strerror or error}")
            return
        note(f"loss and images/s against the step: {os.path.abspath(self.plot_path)}")
