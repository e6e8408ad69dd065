"""Where a training process's start-up went, for the start line (``startup_<phase>_s`` fields).

A restart's cost after the operator's part is mostly here: the interpreter and torch import,
the rendezvous (which waits for the slowest rank), the data set, the model and the checkpoint
load. The start line says how long each took, so that a slow restart can be told apart from a
slow operator (benchmarks/restart_modes.py reads them).
"""
from __future__ import annotations

import os
import time
from typing import Callable, Optional

_STARTTIME_FIELD = 22  # /proc/<pid>/stat: the start time, clock ticks after boot (proc(5))


def process_start_time(stat_path: str = "/proc/self/stat", proc_stat: str = "/proc/stat") -> Optional[float]:
    """This process's start as Unix time (to the clock tick), or None where /proc cannot say."""
    try:
        with open(stat_path, encoding="ascii", errors="replace") as file:
            stat = file.read()
        with open(proc_stat, encoding="ascii", errors="replace") as file:
            boot = next(int(line.split()[1]) for line in file if line.startswith("btime "))
        # The command name (field 2) is in parentheses and may hold spaces: count after its end.
        after_name = stat[stat.rindex(")") + 2:].split()
        ticks = int(after_name[_STARTTIME_FIELD - 3])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class StartupTimes:
    """Seconds per start-up phase: ``import`` (process start to ``StartupTimes()``, where /proc
    tells the start), then one per ``mark(phase)``, each since the mark before."""

    def __init__(self, clock: Callable[[], float] = time.time, started: Optional[float] = None):
        self._clock = clock
        self._last = clock()
        self.phases: dict[str, float] = {}
        started = process_start_time() if started is None else started
        if started is not None and 0 <= self._last - started < 24 * 3600:
            self.phases["import"] = self._last - started

    def mark(self, phase: str) -> None:
        now = self._clock()
        self.phases[phase] = max(0.0, now - self._last)
        self._last = now

    def fields(self) -> dict[str, float]:
        return {f"startup_{phase}_s": round(seconds, 3) for phase, seconds in self.phases.items()}
