"""What ``spec.failurePolicy`` means: restart the gang, or fail the job (pure, one place).

The operator (``controller.decide``) and ``ddpjob run`` (``local.runner``) both take their
verdict from ``verdict``, so a job fails or restarts for the same reasons on a laptop and on a
cluster. Given the failures of one attempt's nodes:

1. the root cause is a permanent failure if any (a restart cannot help), else the earliest one,
   then the lowest rank: the peers of a dead rank fail after it (PEER_LOST), not before;
2. permanent -> the job fails (``PodFailedPermanent``);
3. retryable with the restart budget spent -> the job fails (``RestartBudgetExhausted``);
4. otherwise the whole gang restarts (``RetryableFailure``).

A failure without an exit code (a pod evicted or deleted from under the job) is retryable.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Iterable, Optional

from ddpjob import contract
from ddpjob.api import spec

PERMANENT = "PodFailedPermanent"
BUDGET_SPENT = "RestartBudgetExhausted"
RETRYABLE = "RetryableFailure"

_FAR_FUTURE = dt.datetime.max.replace(tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class NodeFailure:
    """One node of the current attempt that ended badly."""

    node_rank: int
    exit_code: Optional[int]  # None: no exit code (evicted, deleted, lost)
    reason: str = ""  # Error, OOMKilled, Evicted, Deleted, ...
    at: Optional[dt.datetime] = None  # when it ended, if known


@dataclass(frozen=True)
class Verdict:
    restart: bool
    reason: str  # PERMANENT, BUDGET_SPENT or RETRYABLE
    cause: NodeFailure
    permanent: bool
    restarts_after: int  # the restart count once this verdict is carried out
    budget: int


def is_permanent(failure: NodeFailure, policy: spec.FailurePolicy) -> bool:
    return failure.exit_code is not None and contract.is_permanent_exit(
        failure.exit_code, tuple(policy.permanentExitCodes))


def root_cause(failures: Iterable[NodeFailure], policy: spec.FailurePolicy) -> NodeFailure:
    ordered = sorted(failures, key=lambda f: (not is_permanent(f, policy), f.at or _FAR_FUTURE,
                                               f.node_rank))
    if not ordered:
        raise ValueError("root_cause needs at least one failure")
    return ordered[0]


def verdict(failures: Iterable[NodeFailure], *, restarts_done: int,
            policy: spec.FailurePolicy) -> Verdict:
    """Restart the gang or fail the job, and which node's failure decided it."""
    cause = root_cause(failures, policy)
    budget = policy.maxRestarts
    if is_permanent(cause, policy):
        return Verdict(False, PERMANENT, cause, True, restarts_done, budget)
    if restarts_done >= budget:
        return Verdict(False, BUDGET_SPENT, cause, False, restarts_done, budget)
    return Verdict(True, RETRYABLE, cause, False, restarts_done + 1, budget)
