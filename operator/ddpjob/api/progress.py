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
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

from ddpjob.api import spec
from ddpjob.api.status import Progress, format_time, listed, parse_time

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
    checkpoint_seconds: Optional[float] = None
    checkpoint_interval_seconds: Optional[float] = None


@dataclass(frozen=True)
class GangProgress:
    """What the ranks of one attempt have reported so far."""

    attempt: int
    ranks: Mapping[int, RankReport] = field(default_factory=dict)
    #: (step, when) of the furthest rank at the first poll that had reports: the pace since then
    #: gives the ETA.
    first: Optional[tuple[int, dt.datetime]] = None
    #: When this operator process first saw the attempt (after a restart of the operator: its
    #: first pass). Silence is counted from no earlier than this: what the status recorded
    #: before an outage is no evidence that the gang is silent now (``stall``).
    watched_since: Optional[dt.datetime] = None

    @property
    def last_report_at(self) -> Optional[dt.datetime]:
        return max((r.at for r in self.ranks.values()), default=None)

    @property
    def leader(self) -> Optional[RankReport]:
        """The report the status shows: the furthest rank's (the lowest rank among equals); a
        real rank's before what ``from_status`` seeded."""
        return min(self.ranks.values(), key=lambda r: (r.rank < 0, -r.step, r.rank), default=None)


#: The status schema's integers are int64 (the API server refuses a larger one, and with it
#: the whole status write): a reported integer outside 0 .. INT64_MAX is no value.
INT64_MAX = 2 ** 63 - 1
#: The oldest a report may claim to be (about 31 years): older is "very old", not an overflow.
MAX_AGE_SECONDS = 1e9
_RANK_DIGITS = 7  # spec.MAX_NNODES * spec.MAX_NPROC_PER_NODE < 10 ** 7


def _opt_int(value: Any) -> Optional[int]:
    """A non-negative int64 (an integral float too), else None: nothing unrepresentable
    reaches the status."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if 0 <= value <= INT64_MAX else None


def _opt_float(value: Any) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a double
            return None
        return number if math.isfinite(number) else None
    return None


def _seconds(value: Any) -> Optional[float]:
    """A duration a program reported: 0 to MAX_AGE_SECONDS, else no value."""
    number = _opt_float(value)
    return round(number, 4) if number is not None and 0.0 <= number <= MAX_AGE_SECONDS else None


def _rank(key: Any) -> Optional[int]:
    """A rank key: a short run of ASCII digits ("3"), nothing else (int() also takes " 3",
    "3_0" and other scripts' digits)."""
    if isinstance(key, str) and 0 < len(key) <= _RANK_DIGITS and key.isascii() and key.isdigit():
        return int(key)
    return None


def parse_answer(body: Any, observed_at: dt.datetime,
                 ranks: Optional[range] = None) -> dict[int, RankReport]:
    """A pod's ``/progress`` answer -> its ranks' reports; anything malformed is left out, and
    never more than that report (an odd field, or an odd report, costs only itself).

    ``ranks``: the ranks the pod hosts; a report of any other rank is ignored (a pod speaks
    only for its own ranks, so the reports kept per job never outnumber the job's world)."""
    reported = body.get("ranks") if isinstance(body, Mapping) else None
    if not isinstance(reported, Mapping):
        return {}
    out: dict[int, RankReport] = {}
    for key, report in reported.items():
        rank = _rank(key)
        if rank is None or (ranks is not None and rank not in ranks) or not isinstance(report, Mapping):
            continue
        step, age = _opt_int(report.get("step")), _opt_float(report.get("age_seconds"))
        if step is None or age is None:
            continue
        age = min(max(0.0, age), MAX_AGE_SECONDS)
        out[rank] = RankReport(rank=rank, step=step, at=observed_at - dt.timedelta(seconds=age),
                               total_steps=_opt_int(report.get("total_steps")),
                               epoch=_opt_int(report.get("epoch")), epochs=_opt_int(report.get("epochs")),
                               loss=_opt_float(report.get("loss")),
                               throughput=_opt_float(report.get("throughput")),
                               checkpoint_seconds=_seconds(report.get("checkpoint_seconds")),
                               checkpoint_interval_seconds=_seconds(report.get("checkpoint_interval_seconds")))
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
    watched_since = previous.watched_since if same else None
    merged = GangProgress(attempt=attempt, ranks=ranks, first=first, watched_since=watched_since)
    leader = merged.leader
    if first is None and leader is not None:
        merged = replace(merged, first=(leader.step, leader.at))
    return merged


def from_status(progress: Optional[Progress], attempt: int, watched_since: dt.datetime) -> GangProgress:
    """What this operator process knows of the attempt when it first sees it (``watched_since``):
    the last report the status recorded, if it is this attempt's, so that a job that reported is
    never taken for one that never did (the first-report bound does not apply to it again).

    That report dates the silence no earlier than ``watched_since`` (``stall``): after an
    outage longer than progressTimeoutSeconds the status' last report is old whatever the
    gang does now, and judging from it would restart healthy gangs before any pod was asked.
    A gang that really hung is still found: one progressTimeout after the operator is back."""
    at = parse_time(progress.lastReportTime) if progress is not None else None
    if progress is None or progress.attempt != attempt or at is None:
        return GangProgress(attempt=attempt, watched_since=watched_since)
    return GangProgress(attempt=attempt, ranks={-1: RankReport(rank=-1, step=progress.step, at=at)},
                        watched_since=watched_since)


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


def to_status(progress: GangProgress, *, running: bool, previous: Optional[Progress] = None) -> Optional[Progress]:
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
    # The checkpoint's cost is the slowest rank's (they wait for each other); a later attempt
    # that has not checkpointed yet keeps the figures the status had.
    costs = [r.checkpoint_seconds for r in progress.ranks.values() if r.checkpoint_seconds is not None]
    intervals = [r.checkpoint_interval_seconds for r in progress.ranks.values()
                 if r.checkpoint_interval_seconds is not None]
    cost = max(costs) if costs else previous.checkpointSeconds if previous else None
    interval = max(intervals) if intervals else previous.checkpointIntervalSeconds if previous else None
    return Progress(summary=summary, eta=format_duration(eta_seconds) if eta_seconds is not None else "",
                    step=leader.step, totalSteps=total, epoch=leader.epoch, epochs=leader.epochs,
                    loss=round(leader.loss, 6) if leader.loss is not None else None,
                    throughput=round(leader.throughput, 1) if leader.throughput is not None else None,
                    etaSeconds=eta_seconds, lastReportTime=format_time(last) if last else None,
                    ranksReporting=sum(1 for r in progress.ranks if r >= 0), attempt=progress.attempt,
                    checkpointSeconds=cost, checkpointIntervalSeconds=interval)


def _eta(progress: GangProgress, total: int) -> Optional[int]:
    """Seconds left at the pace of the furthest rank since the attempt's first report."""
    leader, first = progress.leader, progress.first
    if leader is None or first is None or leader.step <= first[0] or leader.at <= first[1]:
        return None
    per_step = (leader.at - first[1]).total_seconds() / (leader.step - first[0])
    seconds = (total - leader.step) * per_step
    return int(round(seconds)) if seconds <= INT64_MAX else None  # an int64 in the status


@dataclass(frozen=True)
class Stall:
    """The gang has gone silent for too long: why, and which ranks to blame where known."""

    message: str
    silent_ranks: tuple[int, ...]
    suspect_node: int
    suspect_rank: Optional[int] = None  # the global rank to blame, where one stands out


def stall(job: spec.DDPJob, progress: Optional[GangProgress], running_since: dt.datetime,
          now: dt.datetime) -> tuple[Optional[Stall], Optional[float]]:
    """(the stall, if the gang is stalled; seconds until it would be, if a bound applies)."""
    policy = job.spec.failurePolicy
    world = job.spec.nnodes * job.spec.nprocPerNode
    reported = progress is not None and bool(progress.ranks)
    watched = progress.watched_since if progress is not None else None
    if reported and _trained_to_the_end(progress, world):
        return None, None  # every rank reported its last step: what is left is the exit (a save, a barrier)
    if reported and policy.progressTimeoutSeconds:
        last = progress.last_report_at
        left = policy.progressTimeoutSeconds - (now - max(last, watched or last)).total_seconds()
        if left > 0:
            return None, left
        ranks = {r: rep for r, rep in progress.ranks.items() if r >= 0}
        top = max((rep.step for rep in ranks.values()), default=0)
        behind = sorted(r for r, rep in ranks.items() if rep.step < top)
        never = sorted(set(range(world)) - set(ranks)) if ranks else []
        suspects = never or behind
        silent = tuple(sorted(set(range(world)))) if ranks else ()
        lines = listed([f"rank {r} step {rep.step} ({(now - rep.at).total_seconds():.0f}s ago)"
                        for r, rep in sorted(ranks.items())], _LISTED_RANKS)
        message = (f"no rank reported progress for {(now - last).total_seconds():.0f}s "
                   f"(failurePolicy.progressTimeoutSeconds {policy.progressTimeoutSeconds})")
        if watched is not None and watched > last:
            message += f" (and for the {(now - watched).total_seconds():.0f}s this operator has watched)"
        if lines:
            message += f"; last reports: {lines}"
        if suspects:
            message += f"; behind the others: rank(s) {_ranks(suspects)}"
        suspect = (suspects[0] if suspects else 0) // job.spec.nprocPerNode
        if suspects:
            last = ranks.get(suspects[0])
            message = (f"rank {suspects[0]} " + (f"last reported step {last.step}" if last else "never reported")
                       + f"; {message}")
        return Stall(message, silent, suspect, suspects[0] if suspects else None), None
    if not reported and policy.firstProgressTimeoutSeconds:
        since = max(running_since, watched or running_since)
        left = policy.firstProgressTimeoutSeconds - (now - since).total_seconds()
        if left > 0:
            return None, left
        message = (f"no rank reported progress within {policy.firstProgressTimeoutSeconds}s of every "
                   "node running (failurePolicy.firstProgressTimeoutSeconds): a rendezvous or an "
                   f"init that never completed; silent: rank(s) {_ranks(range(world))}")
        return Stall(message, tuple(range(world)), 0), None
    return None, None


def _trained_to_the_end(progress: GangProgress, world: int) -> bool:
    ranks = {r: rep for r, rep in progress.ranks.items() if 0 <= r < world}
    return len(ranks) == world and all(rep.total_steps and rep.step >= rep.total_steps for rep in ranks.values())


def _ranks(ranks: Sequence[int] | range) -> str:
    return listed([str(r) for r in ranks], _LISTED_RANKS)


