"""Goodput: how much of a job's wall time was training, and where the rest went (pure).

Shared by the operator (``account``, called by ``controller.decide`` on every pass's status)
and ``ddpjob run`` (``advance`` with the moments a local run sees), so both say the same.

The wall time is cut into segments, each counted in one bucket of ``status.goodput``:

* **Queued**: waiting for Kueue (phase Queued); **Suspended**: held by spec.suspend;
* **Starting**: a gang being made until the attempt's first progress report (scheduling,
  image pulls, the rendezvous, the program's start): the job's first attempt and one resumed
  after a hold;
* **Restarting**: from a failure seen (the pass that restarts the gang) to the next attempt's
  first progress report: the teardown, the new gang's start and rendezvous, the checkpoint load;
* **Training**: from an attempt's first progress report to the attempt's end.

Steps re-done: when an attempt after another reports for the first time, the highest step any
attempt reported before, less the step of that first report, is what the restart undid (the
steps since the last checkpoint: ``ddptrain`` reports once after init, at the step it resumed
from; docs/contract.md, Progress: the step is the run's global step).

A program that never reports progress cannot tell its rendezvous from its training: until the
job's first report its Running time counts as Training, and at that first report the time since
the gang started running moves to Starting (or Restarting). The boundaries are the passes that
see them: a report counts when a progress poll brings it (DDPJOB_OPERATOR_PROGRESS_POLL_SECONDS;
a gang's first reports wake the job at once). The figures move only at passes that change
something else in the status (a phase, a progress report, the end), so they cost no status
write of their own; ``accountedUntil`` says how far they count. Everything is a few numbers:
the status stays bounded however long the job runs.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Optional

from ddpjob.api.progress import format_duration
from ddpjob.api.status import (
    FINISHED_TIME, GOODPUT_SUMMARY_LIMIT, QUEUED, QUEUED_TIME, RESTARTING, RESTARTING_TIME, RUNNING, STARTING_TIME, SUSPENDED,
    SUSPENDED_TIME, TRAINING_TIME, Goodput, JobStatus, parse_time, shorten,
)

#: The bucket (a Goodput field) each segment's seconds go to.
_BUCKETS = {QUEUED_TIME: "queuedSeconds", STARTING_TIME: "startingSeconds", TRAINING_TIME: "trainingSeconds",
            RESTARTING_TIME: "restartingSeconds", SUSPENDED_TIME: "suspendedSeconds"}


@dataclass(frozen=True)
class Moment:
    """What one look at the job saw, as the accounting needs it."""

    finished: bool = False
    held: str = ""  # QUEUED_TIME or SUSPENDED_TIME while held, else ""
    restarting: bool = False  # a failure has restarted the gang (phase Restarting)
    running: bool = False  # every node of the attempt runs
    step: Optional[int] = None  # the step this attempt's ranks reported (None: none yet)
    ever_reported: bool = False  # some attempt of the job has reported progress
    restarts: int = 0  # gang restarts after failures so far (both budgets)


def precise_time(moment: dt.datetime) -> str:
    """RFC 3339 in UTC with milliseconds: the accounting's boundaries (a status' second
    precision would lose up to a second at each)."""
    return moment.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def segment_of(moment: Moment, previous: str) -> str:
    """Where the time goes from this moment on (``previous``: where it went until now)."""
    if moment.finished:
        return FINISHED_TIME
    if moment.held:
        return moment.held
    if moment.running and (moment.step is not None or not moment.ever_reported):
        return TRAINING_TIME
    if moment.restarting or previous == RESTARTING_TIME:
        return RESTARTING_TIME
    return STARTING_TIME


def advance(goodput: Optional[Goodput], moment: Moment, now: dt.datetime) -> Goodput:
    """The accounting after ``moment`` at ``now``: the time since ``accountedUntil`` counted in the
    segment it was in, the new segment begun if it changed, the figures and summary refreshed."""
    if goodput is None:  # the first sight of the job: nothing to count yet
        goodput = Goodput(segmentStart=precise_time(now), accountedUntil=precise_time(now),
                          restarts=moment.restarts, segment=segment_of(moment, ""),
                          highestStep=moment.step, firstStep=moment.step)
        return _figures(goodput)
    if goodput.segment == FINISHED_TIME:
        return goodput
    until = parse_time(goodput.accountedUntil) or now
    elapsed = max(0.0, (now - until).total_seconds())  # another replica's clock may lag a little
    counted = _add(goodput, goodput.segment, elapsed)
    segment = segment_of(moment, goodput.segment)
    started = parse_time(goodput.segmentStart) or now
    in_segment = max(0.0, (now - started).total_seconds())
    redone, last_restart = goodput.stepsRedone, goodput.lastRestartSeconds
    if goodput.segment == TRAINING_TIME and goodput.highestStep is None and moment.step is not None:
        # The job's first report ends a Training segment counted only because nothing had been
        # reported: the time since the gang started running was its start, not training.
        counted = _add(_add(counted, TRAINING_TIME, -in_segment),
                       RESTARTING_TIME if goodput.restarts else STARTING_TIME, in_segment)
        started = now
    elif segment != goodput.segment:
        if segment == TRAINING_TIME and moment.step is not None and goodput.highestStep is not None:
            redone += max(0, goodput.highestStep - moment.step)
        if goodput.segment == RESTARTING_TIME and segment == TRAINING_TIME:
            last_restart = round(in_segment, 3)
        started = now
    steps = [s for s in (goodput.highestStep, moment.step) if s is not None]
    updated = replace(counted, segment=segment, segmentStart=precise_time(started), accountedUntil=precise_time(now),
                      restarts=max(goodput.restarts, moment.restarts), stepsRedone=redone,
                      lastRestartSeconds=last_restart, highestStep=max(steps) if steps else None,
                      firstStep=_first_step(goodput, moment))
    return _figures(updated)


def _add(goodput: Goodput, segment: str, seconds: float) -> Goodput:
    bucket = _BUCKETS.get(segment)
    if bucket is None or not seconds:
        return goodput
    return replace(goodput, **{bucket: round(max(0.0, getattr(goodput, bucket) + seconds), 3)})


def _figures(goodput: Goodput) -> Goodput:
    wall = round(sum(getattr(goodput, b) for b in _BUCKETS.values()), 3)
    # The percentage from the ratio as shown, so that the two agree (0.469996 showed as ratio
    # 0.47 and "46%": seen on kind).
    ratio = round(goodput.trainingSeconds / wall, 4) if wall > 0 else 0.0
    percent = int(ratio * 100 + 1e-9)
    # Without a progress report nothing tells training from the rest of Running, and until a
    # report goes past the first one no step was trained (a gang that fails in its first step
    # every time): say so rather than a percentage ("training 100%", "training 99%").
    shown = f"{percent}%" if trained(goodput) else UNKNOWN
    return replace(goodput, wallSeconds=wall, ratio=ratio, percent=shown,
                   summary=shorten(summary(goodput, wall, percent), GOODPUT_SUMMARY_LIMIT))


#: What the goodput says of training and steps re-done while no rank has reported progress.
UNKNOWN = "unknown"


def _first_step(goodput: Goodput, moment: Moment) -> Optional[int]:
    """Set with the job's first report, unset for good once a report is at another step (a step
    was trained, or a resumed attempt went back): a poll may see only one step of an attempt.
    A goodput counted before the field existed keeps it unset: its steps count as trained."""
    if goodput.highestStep is None:
        return moment.step
    if goodput.firstStep is not None and moment.step is not None and moment.step != goodput.firstStep:
        return None
    return goodput.firstStep


def trained(goodput: Goodput) -> bool:
    """Whether some report was at another step than the job's first one: a step was trained."""
    return goodput.highestStep is not None and goodput.firstStep is None


def summary(goodput: Goodput, wall: float, percent: int) -> str:
    """``training 93% of 2h10m; 3 restarts cost 6m, 410 steps re-done; queued 2m, starting 1m``;
    ``training unknown (no progress reported) of 2h10m`` while no rank has reported progress;
    ``training unknown (no step trained: every report at step 0) of 5m`` while none went past
    the first."""
    reported = goodput.highestStep is not None
    if trained(goodput):
        text = f"training {percent}% of {format_duration(wall)}"
    elif reported:
        text = f"training {UNKNOWN} (no step trained: every report at step {goodput.highestStep}) of {format_duration(wall)}"
    else:
        text = f"training {UNKNOWN} (no progress reported) of {format_duration(wall)}"
    if goodput.restarts:
        plural = "s" if goodput.restarts != 1 else ""
        redone = (f"{goodput.stepsRedone} step{'s' if goodput.stepsRedone != 1 else ''} re-done" if trained(goodput)
                  else f"steps re-done {UNKNOWN}" if not reported else "")
        text += f"; {goodput.restarts} restart{plural} cost {format_duration(goodput.restartingSeconds)}"
        text += f", {redone}" if redone else ""
    others = [f"{name} {format_duration(seconds)}" for name, seconds in (
        ("queued", goodput.queuedSeconds), ("starting", goodput.startingSeconds),
        ("suspended", goodput.suspendedSeconds)) if seconds >= 0.5]
    return text + ("; " + ", ".join(others) if others else "")


# ---------------------------------------------------------------------------------------------
# The operator: from the status a pass writes
# ---------------------------------------------------------------------------------------------
def moment_of(status: JobStatus) -> Moment:
    """What the accounting needs of a status."""
    progress = status.progress
    current = progress is not None and progress.attempt == status.restartAttempt and bool(progress.lastReportTime)
    held = QUEUED_TIME if status.phase == QUEUED else SUSPENDED_TIME if status.phase == SUSPENDED else ""
    return Moment(finished=status.terminal, held=held, restarting=status.phase == RESTARTING,
                  running=status.phase == RUNNING, step=progress.step if current else None,
                  ever_reported=progress is not None, restarts=status.restarts + status.disruptions)


def account(before: JobStatus, after: JobStatus, now: dt.datetime) -> JobStatus:
    """``after`` (the status a pass is about to write over ``before``) with its goodput brought to
    ``now`` when something it counts changed: the segment, the progress, a restart, the end.
    Otherwise it is left as it was, so an idle pass writes nothing."""
    goodput = after.goodput
    if (goodput is not None and goodput.segment == FINISHED_TIME) or (before.terminal and after.terminal):
        return after  # counted to its end (or finished before the operator counted goodput)
    moment = moment_of(after)
    changed = (goodput is None or segment_of(moment, goodput.segment) != goodput.segment
               or before.progress != after.progress or moment.restarts != goodput.restarts)
    return replace(after, goodput=advance(goodput, moment, now)) if changed else after


def only_refreshed(old: Optional[Goodput], new: Optional[Goodput]) -> bool:
    """Whether ``new`` differs from ``old`` only in how far the same segment's figures count (a
    progress refresh, which may wait as progress-only writes do; a new segment may not)."""
    if old is None or new is None:
        return old is new
    return (old.segment, old.segmentStart, old.restarts) == (new.segment, new.segmentStart, new.restarts)
