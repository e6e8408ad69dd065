"""Checkpoint-interval advice: the interval that would lose the least training at the failure
rate a job has seen, from the checkpoint cost its program reports (pure; issue 23).

Checkpointing often costs the time each checkpoint holds training up (C); checkpointing rarely
costs the steps re-done after each failure (on average half an interval). Young's first-order
optimum is sqrt(2 C M) for a mean time between failures M; Daly's higher-order refinement,
used here, is sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + C / 18M) - C while C < 2M, and M beyond
(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22, 2006).

C is ``status.progress.checkpointSeconds`` (what the last periodic checkpoint held the training
loop, the slowest rank's; ``ddptrain`` writes in the background, so this is its gather and host
copy, not the disk write); the current interval is ``checkpointIntervalSeconds``; M is the job's
running seconds (training, starting and restarting: not queued or suspended) per restart. One
restart is little evidence of a rate: the advice is an Event, never a change, and it is given
at each restart (so at most maxRestarts + the disruption budget Events), only where the
interval in use is off by more than ``OFF_BY`` either way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ddpjob.api.progress import format_duration
from ddpjob.api.status import Goodput, Progress

OFF_BY = 2.0  # the factor either way beyond which the interval in use is worth a word


def daly_interval(cost: float, mtbf: float) -> float:
    """The optimum seconds between checkpoints for a checkpoint cost and a mean time between
    failures (both > 0; Daly 2006, eq. 37)."""
    if cost <= 0 or mtbf <= 0:
        raise ValueError("the cost and the mean time between failures must be positive")
    if cost >= 2 * mtbf:
        return mtbf
    x = math.sqrt(cost / (2 * mtbf))
    return math.sqrt(2 * cost * mtbf) * (1 + x / 3 + x * x / 9) - cost


@dataclass(frozen=True)
class Advice:
    interval: float  # the suggested seconds between checkpoints
    current: Optional[float]  # the interval in use, as reported
    cost: float
    mtbf: float
    restarts: int

    @property
    def worth_saying(self) -> bool:
        return self.current is not None and not (self.interval / OFF_BY <= self.current <= self.interval * OFF_BY)

    @property
    def message(self) -> str:
        now = (f"checkpoints every {format_duration(self.current)} " if self.current is not None
               else "checkpoints ")
        return (f"{now}hold training up {self.cost:.3g}s each; with {self.restarts} restart(s) so far (one per "
                f"{format_duration(self.mtbf)} of running), one every {format_duration(self.interval)} would "
                "lose the least time (Young/Daly: status.goodput.suggestedCheckpointIntervalSeconds)")


def advise(goodput: Optional[Goodput], progress: Optional[Progress]) -> Optional[Advice]:
    """The advice for a job's figures, or None until it has restarted and reported a cost."""
    if goodput is None or goodput.restarts < 1 or progress is None or not progress.checkpointSeconds:
        return None
    running = goodput.trainingSeconds + goodput.startingSeconds + goodput.restartingSeconds
    if running <= 0:
        return None
    mtbf = running / goodput.restarts
    interval = round(daly_interval(progress.checkpointSeconds, mtbf), 1)
    return Advice(interval=interval, current=progress.checkpointIntervalSeconds,
                  cost=progress.checkpointSeconds, mtbf=mtbf, restarts=goodput.restarts)
