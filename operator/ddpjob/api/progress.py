"""Training progress: what the ranks reported, and when a gang counts as stalled (pure).

Shared by the operator (``controller.decide``, which polls the pods with
``controller.progress``) and ``ddpjob run`` (``local.runner``, which reads the files), so a
job stalls for the same reasons on a laptop and on a cluster.

Each pod of a running gang serves its ranks' latest reports at
``http://<pod IP>:<DDPJOB_PROGRESS_PORT>/progress`` (docs/contract.md, Progress). The operator
polls them every ``DDPJOB_OPERATOR_PROGRESS_POLL_SECONDS``: no Kubernetes credentials in the
pods, no API server request (docs/operator.md, "Progress and hang detection", has the choice
and its cost). A report's age is measured by the pod's own clock (``age_seconds``), so the
operator never compares clocks with a pod: a rank last reported at ``observed - age``.

``merge`` keeps, per rank, the newest report seen in the current attempt; ``to_status`` turns
that into ``status.progress``; ``stall`` says whether the gang has gone silent for longer than
``failurePolicy`` allows (the decision itself is ``decide``'s).
"""
from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ddpjob.api import spec
from ddpjob.api.status import Progress

_LISTED_RANKS = 8  # ranks named in a message before "and N more"


@dataclass(frozen=True)
class RankReport:
    """One rank's newest report, and when it was written (the operator's clock)."""

    rank: int
    step: int
    at: dt.datetime
    total_steps: Optional[int] = None
    epoch: Optional[int] = None
    epochs: Optional[int] = None
    loss: Optional[float] = None
    throughput: Optional[float] = None


@dataclass(frozen=True)
class GangProgress:
    """What the ranks of one attempt have reported so far."""

    attempt: int
    ranks: Mapping[int, RankReport] = field(default_factory=dict)
    #: (step, when) of the furthest rank at the first poll that had reports: the pace since then
    #: gives the ETA.
    first: Optional[tuple[int, dt.datetime]] = None

    @property
    def last_report_at(self) -> Optional[dt.datetime]:
        return max((r.at for r in self.ranks.values()), default=None)

    @property
    def leader(self) -> Optional[RankReport]:
        """The report the status shows: the furthest rank's (the lowest rank among equals); a
        real rank's before what ``from_status`` seeded."""
        return min(self.ranks.values(), key=lambda r: (r.rank < 0, -r.step, r.rank), default=None)


def _opt_int(value: Any) -> Optional[int]:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _opt_float(value: Any) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def parse_answer(body: Any, observed_at: dt.datetime) -> dict[int, RankReport]:
    """A pod's ``/progress`` answer -> its ranks' reports; anything malformed is left out."""
    ranks = body.get("ranks") if isinstance(body, Mapping) else None
    out: dict[int, RankReport] = {}
    for key, report in (ranks or {}).items():
        try:
            rank = int(key)
        except (TypeError, ValueError):
            continue
        step, age = _opt_int((report or {}).get("step")), _opt_float((report or {}).get("age_seconds"))
        if step is None or age is None or rank < 0:
            continue
        out[rank] = RankReport(rank=rank, step=step, at=observed_at - dt.timedelta(seconds=max(0.0, age)),
                               total_steps=_opt_int(report.get("total_steps")),
                               epoch=_opt_int(report.get("epoch")), epochs=_opt_int(report.get("epochs")),
                               loss=_opt_float(report.get("loss")),
                               throughput=_opt_float(report.get("throughput")))
    return out


def merge(previous: Optional[GangProgress], attempt: int,
          answers: Sequence[Mapping[int, RankReport]]) -> GangProgress:
    """The newest report of each rank: earlier polls of this attempt, then these answers."""
    same = previous is not None and previous.attempt == attempt
    ranks = dict(previous.ranks) if same else {}
    first = previous.first if same else None
    for answer in answers:
        for rank, report in answer.items():
            if rank not in ranks or report.at >= ranks[rank].at:
                ranks[rank] = report
    merged = GangProgress(attempt=attempt, ranks=ranks, first=first)
    leader = merged.leader
    if first is None and leader is not None:
        merged = GangProgress(attempt=attempt, ranks=ranks, first=(leader.step, leader.at))
    return merged


def from_status(progress: Optional[Progress], attempt: int) -> Optional[GangProgress]:
    """After an operator restart: the last report the status recorded, so the stall clock does
    not start over (or, worse, take a job that reported for one that never did)."""
    if progress is None or progress.attempt != attempt or not progress.lastReportTime:
        return None
    at = dt.datetime.fromisoformat(progress.lastReportTime.replace("Z", "+00:00"))
    return GangProgress(attempt=attempt, ranks={-1: RankReport(rank=-1, step=progress.step, at=at)})


def format_duration(seconds: float) -> str:
    """``1h05m``, ``12m30s``, ``45s``: short enough for a kubectl column."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def to_status(progress: GangProgress, *, running: bool, format_time: Any,
              previous: Optional[Progress] = None) -> Optional[Progress]:
    """``status.progress`` from the reports; the ETA only while the gang runs."""
    leader = progress.leader
    if leader is None:
        return previous
    if leader.rank < 0 and previous is not None:  # only what from_status seeded: keep the status'
        return previous
    total = leader.total_steps
    summary = f"{leader.step}/{total} ({100 * leader.step // total}%)" if total else str(leader.step)
    eta_seconds: Optional[int] = None
    if running and total and leader.step < total:
        eta_seconds = _eta(progress, total)
    last = progress.last_report_at
    return Progress(summary=summary, eta=format_duration(eta_seconds) if eta_seconds is not None else "",
                    step=leader.step, totalSteps=total, epoch=leader.epoch, epochs=leader.epochs,
                    loss=round(leader.loss, 6) if leader.loss is not None else None,
                    throughput=round(leader.throughput, 1) if leader.throughput is not None else None,
                    etaSeconds=eta_seconds, lastReportTime=format_time(last) if last else None,
                    ranksReporting=sum(1 for r in progress.ranks if r >= 0), attempt=progress.attempt)


def _eta(progress: GangProgress, total: int) -> Optional[int]:
    """Seconds left at the pace of the furthest rank since the attempt's first report."""
    leader, first = progress.leader, progress.first
    if leader is None or first is None or leader.step <= first[0] or leader.at <= first[1]:
        return None
    per_step = (leader.at - first[1]).total_seconds() / (leader.step - first[0])
    return int(round((total - leader.step) * per_step))


@dataclass(frozen=True)
class Stall:
    """The gang has gone silent for too long: why, and which ranks to blame where known."""

    message: str
    silent_ranks: tuple[int, ...]
    suspect_node: int


def stall(job: spec.DDPJob, progress: Optional[GangProgress], running_since: dt.datetime,
          now: dt.datetime) -> tuple[Optional[Stall], Optional[float]]:
    """(the stall, if the gang is stalled; seconds until it would be, if a bound applies)."""
    policy = job.spec.failurePolicy
    world = job.spec.nnodes * job.spec.nprocPerNode
    reported = progress is not None and bool(progress.ranks)
    if reported and policy.progressTimeoutSeconds:
        last = progress.last_report_at
        left = policy.progressTimeoutSeconds - (now - last).total_seconds()
        if left > 0:
            return None, left
        ranks = {r: rep for r, rep in progress.ranks.items() if r >= 0}
        top = max((rep.step for rep in ranks.values()), default=0)
        behind = sorted(r for r, rep in ranks.items() if rep.step < top)
        never = sorted(set(range(world)) - set(ranks)) if ranks else []
        suspects = never or behind
        silent = tuple(sorted(set(range(world)))) if ranks else ()
        lines = ", ".join(f"rank {r} step {rep.step} ({(now - rep.at).total_seconds():.0f}s ago)"
                          for r, rep in sorted(ranks.items())[:_LISTED_RANKS])
        more = len(ranks) - _LISTED_RANKS
        message = (f"no rank reported progress for {(now - last).total_seconds():.0f}s "
                   f"(failurePolicy.progressTimeoutSeconds {policy.progressTimeoutSeconds})")
        if lines:
            message += f"; last reports: {lines}" + (f" and {more} more" if more > 0 else "")
        if suspects:
            message += f"; behind the others: rank(s) {_ranks(suspects)}"
        suspect = (suspects[0] if suspects else 0) // job.spec.nprocPerNode
        return Stall(message, silent, suspect), None
    if not reported and policy.firstProgressTimeoutSeconds:
        left = policy.firstProgressTimeoutSeconds - (now - running_since).total_seconds()
        if left > 0:
            return None, left
        message = (f"no rank reported progress within {policy.firstProgressTimeoutSeconds}s of every "
                   "node running (failurePolicy.firstProgressTimeoutSeconds): a rendezvous or an "
                   f"init that never completed; silent: rank(s) {_ranks(range(world))}")
        return Stall(message, tuple(range(world)), 0), None
    return None, None


def _ranks(ranks: Sequence[int] | range) -> str:
    ranks = list(ranks)
    shown = ", ".join(str(r) for r in ranks[:_LISTED_RANKS])
    return shown + (f" and {len(ranks) - _LISTED_RANKS} more" if len(ranks) > _LISTED_RANKS else "")


