"""Policy: failure classification and the two budgets. Whose fault a failed, evicted or deleted pod
is (api/failure_policy.py), what the history records, which budget a restart spends (restarts or
disruptions), when the job fails for good, and which restart mode the next attempt starts in.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import replace
from typing import Optional, Sequence

from ddpjob import contract
from ddpjob.api import failure_policy, node_exclusion, repeated_error, spec
from ddpjob.api.failure_policy import NodeFailure
from ddpjob.api.status import (
    FAILED_NODE_MESSAGE_LIMIT, REASON_LIMIT, RESTARTING, DISRUPTION, FailedNode, FailureRecord,
    JobStatus, disruptions_within, format_time, parse_time, shorten, truncate, with_disruption, with_failure,
    with_phase
)
from ddpjob.controller.observation import DETAIL_LIMIT, MISSING, POD_FAILED, POD_SUCCEEDED, PodView
from ddpjob.controller.plan import Event, Plan, deletable, owned_pods
from ddpjob.controller.policy.finish import fail_job
from ddpjob.controller.policy.kubelet_restarts import restart_by_kubelet, unseen_restarts
from ddpjob.controller.policy.restart_mode import (
    failed_before_training_in_place, restart_inside_pods, restartable_in_place
)
from ddpjob.restart_orders import EntryState


# The trainer's termination message after SIGTERM: "...; checkpoint /ckpt/step-40.pt saved".
_CHECKPOINT_SAVED = re.compile(r"\bcheckpoint\b[^;\n]*\bsaved\b")


def _exit_meaning(code: int, message: str) -> str:
    """What an exit code is known to mean: the code says SIGTERM; only the container's own
    termination message can say a checkpoint was saved."""
    meaning = contract.describe_exit_code(code)
    if code == contract.ExitCode.PREEMPTED and _CHECKPOINT_SAVED.search(message or ""):
        meaning = "preempted: SIGTERM, checkpoint saved (retryable)"
    return meaning


def _describe(failure: NodeFailure) -> str:
    """The culprit and what happened to it: "node 1 (pod train-node-1 on worker-2) exited with
    code 137 (...), OOM-killed", "... was deleted; disrupted: DeletionByTaintManager"."""
    if failure.exit_code is not None:
        what = f"exited with code {failure.exit_code} ({_exit_meaning(failure.exit_code, failure.message)})"
        if failure.reason == "OOMKilled":
            what += ", OOM-killed"
    elif failure.disruption and failure.disruption == failure.reason:
        what = "was stopped by the cluster"
    else:
        what = f"was {failure.reason.lower() or 'lost'}"
    if failure.disruption:
        what += f" (disruption: {failure.disruption})"
    where = f"pod {failure.pod}" + (f" on {failure.node}" if failure.node else "")
    rank = f"rank {failure.rank} on " if failure.rank is not None else ""
    return f"{rank}node {failure.node_rank} ({where}) {what}"


def _failure_record(failure: NodeFailure, status: JobStatus, now: dt.datetime) -> FailureRecord:
    """The history entry of the failure that decided the outcome: the description, then the
    evidence's last line (a traceback's says what went wrong; a disruption's message says who)."""
    evidence = next((line.strip() for line in reversed((failure.message or "").splitlines()) if line.strip()), "")
    message = _describe(failure) + (f": {shorten(evidence, DETAIL_LIMIT)}" if evidence else "")
    return FailureRecord(time=format_time(failure.at or now), attempt=status.restartAttempt,
                         nodeRank=failure.node_rank, rank=failure.rank, pod=failure.pod,
                         nodeName=failure.node, kind=failure.kind,
                         reason=failure.disruption or failure.reason, exitCode=failure.exit_code,
                         message=message)


def _failed_node(failure: NodeFailure) -> FailedNode:
    return FailedNode(nodeRank=failure.node_rank, pod=failure.pod, exitCode=failure.exit_code,
                      reason=shorten(failure.reason, REASON_LIMIT), message=truncate(failure.message, FAILED_NODE_MESSAGE_LIMIT))


def restart_so_far(job: spec.DDPJob, status: JobStatus) -> str:
    """Which budget the restart under way spends, and how much of it is spent."""
    policy = job.spec.failurePolicy
    if status.failureHistory and status.failureHistory[0].kind == DISRUPTION:
        return f"disruption {len(status.recentDisruptions)} of {policy.maxDisruptions}"
    return f"restart {status.restarts} of {policy.maxRestarts}"


def failure_of(job: spec.DDPJob, p: PodView) -> Optional[NodeFailure]:
    # Whose fault: the cluster's when the pod says so (api/failure_policy.py, two budgets).
    disruption = failure_policy.disruption_of(condition_reason=p.disruption, pod_reason=p.pod_reason,
                                              unhealthy_devices=p.unhealthy_devices)
    detail = p.disruption_message or (f"unhealthy: {p.unhealthy_devices}" if p.unhealthy_devices else "")
    if p.phase == POD_FAILED:
        code = p.exit_code
        reason = p.terminated_reason or p.disruption or p.pod_reason or "Failed"
        message = p.terminated_message or p.pod_message or detail
        return NodeFailure(node_rank=p.node_rank, exit_code=code, reason=reason,
                           at=p.finished_at or p.deletion_at, pod=p.name, message=message,
                           disruption=disruption, node=p.node_name, started_at=p.started_at)
    if p.deleting and p.phase != POD_SUCCEEDED:
        # Deleted from under the job (a user, a drain, taint-based eviction of a lost node):
        # the rank is gone, and its peers will hang until the gang restarts.
        reason = p.disruption or p.pod_reason or MISSING
        return NodeFailure(node_rank=p.node_rank, exit_code=None, reason=reason, at=p.deletion_at,
                           pod=p.name, message=p.pod_message or detail, disruption=disruption,
                           node=p.node_name)
    return None


def entry_failure(p: PodView, entry: Optional[EntryState], attempt: int,
                   now: dt.datetime) -> Optional[NodeFailure]:
    """A pod whose entry point says its workers failed (and it waits for an order): the node's
    failure, with the exit code and message it would have ended with."""
    if entry is None or entry.state != contract.ENTRY_FAILED or entry.attempt != attempt:
        return None
    code = entry.exit_code
    reason = "Error" if code else "Failed"
    return NodeFailure(node_rank=p.node_rank, exit_code=code, reason=reason, at=now, pod=p.name,
                       message=entry.message, node=p.node_name)


# How long a failure that only follows another's (a peer lost: 13; 12; 143) waits for that other
# failure to show, when every failure seen so far is an entry point's (a pod's readiness drops
# within a second of its workers' end, but not at the same second as its peers').
CONSEQUENCE_GRACE_SECONDS = 5.0


def consequence_wait(failures: Sequence[NodeFailure], entry_states: Sequence[EntryState]) -> Optional[float]:
    """Seconds to wait for the root cause before acting on ``failures``, or None to act now:
    only while each failure is an entry point's, each a consequence code, all fresh."""
    if len(entry_states) != len(failures) or not all(
            f.exit_code in contract.CONSEQUENCE_EXIT_CODES for f in failures):
        return None
    ages = [e.seconds_since_failure for e in entry_states]
    if any(age is None for age in ages):
        return None
    left = CONSEQUENCE_GRACE_SECONDS - max(ages)  # type: ignore[type-var]
    return left if left > 0 else None


def _restarts_done(status: JobStatus, restarted_by_kubelet: Sequence[PodView]) -> tuple[int, str]:
    """The restarts spent before this failure, and what the message says of those no pass saw.
    Restarts the kubelet did that no pass saw one by one count too, each against the budget: a
    crash loop faster than the passes (or an operator that was down) is not one restart."""
    ended, busiest = unseen_restarts(restarted_by_kubelet)
    unseen = max(0, ended - 1)
    if not unseen or busiest is None:
        return status.restarts, ""
    return status.restarts + unseen, (f"; the kubelet restarted {busiest.name}'s container {ended} time(s) "
                                      "since the operator last accounted for it, each counted as a restart")


def early_error(status: JobStatus, failure: NodeFailure, reported: bool, now: dt.datetime) -> str:
    """The error ``failure`` names, where it can be a deterministic one (api/repeated_error.py):
    an exit of the code's own before the attempt trained; else ""."""
    if failure.disruption or not repeated_error.counts(failure.exit_code):
        return ""
    error = repeated_error.error_of(failure.message)
    if not error:
        return ""
    progress = status.progress
    trained = reported or (progress is not None and progress.attempt == status.restartAttempt)
    # The attempt started when its container did, or (restarted in place, in the same
    # container) when the failure before it was seen; where neither is known, the job's start.
    last = status.failureHistory[0] if status.failureHistory else None
    starts = [failure.started_at, parse_time(last.time) if last and last.attempt == status.restartAttempt - 1 else None]
    start = max((s for s in starts if s is not None), default=None) or parse_time(status.startTime)
    seconds = ((failure.at or now) - start).total_seconds() if start is not None else None
    early = repeated_error.failed_before_training(reported=trained, ever_reported=progress is not None,
                                                  seconds_since_start=seconds)
    return error if early else ""


def errors_before(status: JobStatus) -> list[str]:
    """The errors of the attempts just before the current one, newest first, while the history
    has one failure per attempt in a row."""
    errors, attempt = [], status.restartAttempt - 1
    for record in status.failureHistory:
        if record.attempt != attempt:
            break
        errors.append(record.error)
        attempt -= 1
    return errors


def _repeated_error(status: JobStatus, ruling: failure_policy.Verdict, reported: bool, now: dt.datetime,
                    policy: spec.FailurePolicy) -> tuple[str, str]:
    """(the error this failure records, "" if none counts; the job's last words where it makes
    failurePolicy.repeatedErrorAttempts in a row, else "")."""
    if ruling.kind == DISRUPTION or ruling.permanent:
        return "", ""
    error = early_error(status, ruling.cause, reported, now)
    attempts = policy.repeatedErrorAttempts
    if not repeated_error.repeated(error, errors_before(status), attempts):
        return error, ""
    said = repeated_error.words(error, attempts, status.restartAttempt - attempts + 1)
    return error, (f"{_describe(ruling.cause)}; {said}; a restart cannot fix this "
                   f"(failurePolicy.repeatedErrorAttempts: {attempts})")


def on_failure(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], now: dt.datetime,
                failures: list[NodeFailure], restart_reason: Optional[str] = None,
                reported: bool = False, restarted_by_kubelet: tuple[PodView, ...] = ()) -> Plan:
    """``reported``: an entry point of the failed attempt says its workers reported progress.
    ``restarted_by_kubelet``: the attempt's pods whose container the kubelet restarts in place."""
    policy = job.spec.failurePolicy
    window = disruptions_within(status, now, policy.disruptionWindowSeconds)
    restarts_done, counted = _restarts_done(status, restarted_by_kubelet)
    ruling = failure_policy.verdict(failures, restarts_done=restarts_done, policy=policy,
                                    recent_disruptions=len(window))
    first = ruling.cause
    error, repeated_words = _repeated_error(status, ruling, reported, now, policy)
    if repeated_words:
        ruling = replace(ruling, restart=False, reason=repeated_error.REPEATED_ERROR)
    keep = restartable_in_place(job, status, pods, reported) if ruling.restart else ()
    by_kubelet = (ruling.restart and bool(restarted_by_kubelet) and spec.kubelet_restarts_in_place(job.spec)
                  and not failed_before_training_in_place(status, reported))
    fallback = (ruling.restart and failed_before_training_in_place(status, reported)
                and spec.effective_restart_mode(job.spec) == contract.RESTART_MODE_IN_PLACE)
    mode = "" if not ruling.restart else (
        contract.RESTART_MODE_IN_PLACE if keep or by_kubelet else contract.RESTART_MODE_RECREATE)
    # The culprit goes into the history whatever comes next (restart or failure).
    recorded = with_failure(replace(status, recentDisruptions=window),
                            replace(_failure_record(first, status, now), restartMode=mode, error=error))
    # A node implicated often enough is avoided from the next attempt on (api/node_exclusion.py).
    status = node_exclusion.with_exclusions(recorded, policy, now)
    excluded = tuple(Event("Warning", "NodeExcluded", f"The next pods avoid node {n.nodeName}: {n.message}")
                     for n in node_exclusion.newly_excluded(recorded, status))
    if ruling.reason == failure_policy.PERMANENT or repeated_words:
        return fail_job(job, recorded, pods, now, ruling.reason,
                        repeated_words or f"{_describe(first)}: a restart cannot fix this", _failed_node(first))
    if ruling.reason in (failure_policy.BUDGET_SPENT, failure_policy.DISRUPTION_BUDGET_SPENT):
        return fail_job(job, replace(recorded, restarts=restarts_done), pods, now, ruling.reason,
                        f"{_describe(first)}{counted} and the {ruling.budget_words(policy)} is spent",
                        _failed_node(first))

    spent = (with_disruption(replace(status, restarts=restarts_done), now, policy.disruptionWindowSeconds)
             if ruling.kind == DISRUPTION else replace(status, restarts=ruling.restarts_after))
    if ruling.kind == DISRUPTION and restart_reason is None:
        restart_reason = failure_policy.DISRUPTED
    message = f"{_describe(first)}{counted}; {ruling.spending(policy)}: deleting the gang"
    restarting = replace(spent, restartAttempt=status.restartAttempt + 1,
                         failedNode=_failed_node(first), readyNodes=0)
    restarting = with_phase(restarting, RESTARTING, restart_reason or ruling.reason, message, now, created=False,
                            created_reason="Restarting", created_message=message)
    event = Event("Warning", "Restarting",
                  f"{_describe(first)}" + (f" [{first.reason}]" if first.reason else "")
                  + f"; restarting all {status.nnodes} node(s) ({ruling.spending(policy)})")
    if keep:
        return restart_inside_pods(job, restarting, pods, now, keep, event, excluded)
    if by_kubelet:
        return restart_by_kubelet(job, restarting, pods, now, restarted_by_kubelet, event, excluded)
    if fallback:
        event = replace(event, message=event.message + (
            f"; recreating the pods: attempt {status.restartAttempt} was restarted in place and "
            "failed before its first progress report"))
    # Every pod of the attempt goes, including the healthy ranks: they would hang in a
    # collective with the dead one until a watchdog fires (kubeflow/trainer#2269).
    return Plan(status=restarting, delete=deletable(owned_pods(job, pods)), events=(event,) + excluded)
