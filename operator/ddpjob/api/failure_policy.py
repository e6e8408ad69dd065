"""What ``spec.failurePolicy`` means: restart the gang, or fail the job (pure, one place).

The operator (``controller.decide``) and ``ddpjob run`` (``local.runner``) both take their
verdict from ``verdict``, so a job fails or restarts for the same reasons on a laptop and on a
cluster. Given the failures of one attempt's nodes:

1. the root cause is the first in the contract's ranking (``contract.failure_rank``, shared
   with the pod's exit code and the init guard): a permanent failure if any (a restart cannot
   help), else a failure of its own before a consequence of another's (143, 12, 13: the peers
   of a dead rank fail after it, PEER_LOST), then the earliest, then the lowest rank;
2. permanent -> the job fails (``PodFailedPermanent``);
3. retryable with the restart budget spent -> the job fails (``RestartBudgetExhausted``);
4. otherwise the whole gang restarts (``RetryableFailure``).

A failure without an exit code (a pod evicted or deleted from under the job) is retryable.

Two budgets. A failure the job's code did not cause, a **disruption** (``disruption_of``: the
pod's DisruptionTarget condition, set by the scheduler's preemption, the Eviction API (a
drain), the taint manager (a NotReady or unreachable node), the pod GC (a node gone) or the
kubelet; a kubelet eviction or NodeLost as the pod's reason; a device of the pod reported
unhealthy in ``allocatedResourcesStatus``), spends ``failurePolicy.maxDisruptions`` within
``disruptionWindowSeconds``, never ``maxRestarts``; spent, the job fails
(``DisruptionBudgetExhausted``). When one node of an attempt was disrupted, the peers that
failed after it failed because of it (a lost peer, 13, or a plain torchrun's 1): the disruption
is the cause, unless some node's code said a restart cannot help (a permanent code).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Iterable, Optional

from ddpjob import contract
from ddpjob.api import spec
from ddpjob.api.status import APPLICATION, DISRUPTION

PERMANENT = "PodFailedPermanent"
BUDGET_SPENT = "RestartBudgetExhausted"
DISRUPTION_BUDGET_SPENT = "DisruptionBudgetExhausted"
RETRYABLE = "RetryableFailure"
#: The restart reason of a disruption within budget.
DISRUPTED = "Disrupted"

#: ``status.reason`` of a pod that the cluster, not its code, ended: the kubelet's node-pressure
#: eviction and critical-pod preemption, an old node controller's unreachable node, a node
#: shutting down.
DISRUPTION_POD_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown"})
#: The DisruptionTarget reasons Kubernetes writes (any reason of that condition is a
#: disruption; these are also recognised once the pod is gone, from what was recorded of it).
DISRUPTION_TARGET_REASONS = frozenset({
    "PreemptionByScheduler", "EvictionByEvictionAPI", "DeletionByTaintManager", "DeletionByPodGC",
    "TerminationByKubelet"})
UNHEALTHY_DEVICE = "UnhealthyDevice"
KNOWN_DISRUPTIONS = DISRUPTION_POD_REASONS | DISRUPTION_TARGET_REASONS | {UNHEALTHY_DEVICE}


def disruption_of(*, condition_reason: str = "", pod_reason: str = "", unhealthy_devices: str = "") -> str:
    """Why the cluster ended a pod, as a CamelCase reason, or "" when nothing says it did (the
    failure is then the application's). ``condition_reason``: the DisruptionTarget condition's
    reason when it is True; ``pod_reason``: the pod's status.reason; ``unhealthy_devices``: the
    devices its containers' allocatedResourcesStatus reports Unhealthy."""
    if condition_reason:
        return condition_reason
    if unhealthy_devices:
        return UNHEALTHY_DEVICE
    return pod_reason if pod_reason in DISRUPTION_POD_REASONS else ""

@dataclass(frozen=True)
class NodeFailure:
    """One node of the current attempt that ended badly."""

    node_rank: int
    exit_code: Optional[int]  # None: no exit code (evicted, deleted, lost)
    reason: str = ""  # Error, OOMKilled, Evicted, Deleted, ...
    at: Optional[dt.datetime] = None  # when it ended, if known
    pod: str = ""  # the pod's name (the operator's; a local run has none)
    message: str = ""  # the container's termination message, or why the node was lost
    disruption: str = ""  # why the cluster ended it (``disruption_of``); "" if the code did
    node: str = ""  # the Kubernetes node it ran on, if known
    rank: Optional[int] = None  # the global rank to blame, where known (a stall's)
    started_at: Optional[dt.datetime] = None  # when its container started, if known

    @property
    def kind(self) -> str:
        return DISRUPTION if self.disruption else APPLICATION


@dataclass(frozen=True)
class Verdict:
    restart: bool
    reason: str  # PERMANENT, BUDGET_SPENT, DISRUPTION_BUDGET_SPENT or RETRYABLE
    cause: NodeFailure
    permanent: bool
    restarts_after: int  # the restart count (maxRestarts' budget) once this verdict is carried out
    budget: int  # the budget the cause spends: maxRestarts, or maxDisruptions for a disruption
    kind: str = APPLICATION
    #: Of that budget, how much is spent once this verdict is carried out (restarts, or the
    #: disruptions within the window).
    spent: int = 0

    def budget_words(self, policy: spec.FailurePolicy) -> str:
        """The budget the cause spends, as a message names it."""
        if self.kind == DISRUPTION:
            return (f"disruption budget (failurePolicy.maxDisruptions {self.budget} within "
                    f"disruptionWindowSeconds {policy.disruptionWindowSeconds}s)")
        return f"restart budget ({self.budget})"

    def spending(self, policy: spec.FailurePolicy) -> str:
        """What a restart on this verdict costs, for the status message and the Event."""
        if self.kind == DISRUPTION:
            return (f"disruption {self.spent} of {self.budget} within {policy.disruptionWindowSeconds}s; "
                    f"maxRestarts not spent")
        return f"restart {self.spent} of {self.budget}"


def is_permanent(failure: NodeFailure, policy: spec.FailurePolicy) -> bool:
    return failure.exit_code is not None and contract.is_permanent_exit(
        failure.exit_code, tuple(policy.permanentExitCodes))


def root_cause(failures: Iterable[NodeFailure], policy: spec.FailurePolicy) -> NodeFailure:
    permanent_codes = tuple(policy.permanentExitCodes)

    def rank(failure: NodeFailure) -> tuple[int, int, float, int]:
        when = failure.at.timestamp() if failure.at is not None else None
        return contract.failure_rank(failure.exit_code, when=when, order=failure.node_rank,
                                     permanent_codes=permanent_codes)

    ordered = sorted(failures, key=rank)
    if not ordered:
        raise ValueError("root_cause needs at least one failure")
    return ordered[0]


def verdict(failures: Iterable[NodeFailure], *, restarts_done: int,
            policy: spec.FailurePolicy, recent_disruptions: int = 0) -> Verdict:
    """Restart the gang or fail the job, and which node's failure decided it.
    ``recent_disruptions``: the disruption restarts within failurePolicy.disruptionWindowSeconds
    before this one."""
    failures = list(failures)
    cause = root_cause(failures, policy)
    budget = policy.maxRestarts
    if is_permanent(cause, policy):
        return Verdict(False, PERMANENT, cause, True, restarts_done, budget, spent=restarts_done)
    disrupted = [f for f in failures if f.disruption]
    if disrupted:  # the peers that failed with it failed because of it
        cause = root_cause(disrupted, policy)
        limit = policy.maxDisruptions
        if recent_disruptions >= limit:
            return Verdict(False, DISRUPTION_BUDGET_SPENT, cause, False, restarts_done, limit, DISRUPTION,
                           recent_disruptions)
        return Verdict(True, RETRYABLE, cause, False, restarts_done, limit, DISRUPTION, recent_disruptions + 1)
    if restarts_done >= budget:
        return Verdict(False, BUDGET_SPENT, cause, False, restarts_done, budget, spent=restarts_done)
    return Verdict(True, RETRYABLE, cause, False, restarts_done + 1, budget, spent=restarts_done + 1)
