"""One ranking of failures (ddpjob.contract.failure_rank) for the three places that pick the root
cause among several: the operator's status.failedNode (api.failure_policy), the pod's exit code
(ddptrain-pod's choose_exit_code) and the init guard's verdicts. The same failures give the same
pick in all three."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest

from ddpjob import contract
from ddpjob.api import failure_policy, spec
from ddptrainer import init_guard, summary
from ddptrainer.pod_entry import choose_exit_code

pytestmark = pytest.mark.unit

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


@dataclass
class ProcessFailure:  # what torchrun's ChildFailedError holds per rank
    exitcode: int
    timestamp: int


# (rank, exit code, seconds) of each failure -> the rank that is the root cause
SCENARIOS = [
    ([(0, 1, 5)], 0),
    ([(0, 143, 5), (1, 2, 6)], 1),           # permanent beats everything, even an earlier one
    ([(0, 13, 1), (1, 3, 9)], 1),
    ([(0, 13, 1), (1, 137, 2)], 1),          # a cause of its own beats an earlier peer lost
    ([(0, 12, 1), (1, 1, 2)], 1),            # ... and an earlier rendezvous timeout
    ([(0, 143, 1), (1, 1, 2)], 1),
    ([(0, 13, 3), (1, 143, 3)], 1),          # among consequences: 143, then 12, then 13
    ([(0, 13, 3), (1, 12, 4)], 1),
    ([(0, 1, 4), (3, 7, 2)], 3),             # the earliest cause
    ([(2, 13, 1), (1, 13, 1)], 1),           # tie: the lowest rank
    ([(0, 2, 9), (1, 4, 2)], 1),             # two permanent ones: the earliest
]


@pytest.mark.parametrize("failures, cause", SCENARIOS)
def test_the_pod_and_the_operator_pick_the_same_root_cause(failures, cause):
    pod_rank, _ = choose_exit_code({r: ProcessFailure(code, t) for r, code, t in failures})
    node = failure_policy.root_cause(
        [failure_policy.NodeFailure(r, code, "Error", T0 + dt.timedelta(seconds=t))
         for r, code, t in failures], spec.FailurePolicy())
    by_contract = min(failures, key=lambda f: contract.failure_rank(f[1], when=f[2], order=f[0]))
    assert pod_rank == node.node_rank == by_contract[0] == cause


def test_the_operator_ranks_by_the_job_s_own_permanent_codes():
    failures = [failure_policy.NodeFailure(0, 1, at=T0), failure_policy.NodeFailure(1, 42, at=T0 + dt.timedelta(seconds=5))]
    policy = spec.FailurePolicy(permanentExitCodes=(42,))
    assert failure_policy.root_cause(failures, policy).node_rank == 1
    assert failure_policy.verdict(failures, restarts_done=0, policy=policy).reason == failure_policy.PERMANENT
    assert failure_policy.root_cause(failures, spec.FailurePolicy()).node_rank == 0


def test_a_failure_without_a_code_or_a_time_is_a_cause_of_its_own_known_last():
    evicted = failure_policy.NodeFailure(1, None, "Evicted")
    lost = failure_policy.NodeFailure(0, 13, "Error", T0)
    assert failure_policy.root_cause([lost, evicted], spec.FailurePolicy()) == evicted
    assert contract.failure_rank(None) == (1, 0, float("inf"), 0)


def test_the_init_guard_ranks_its_verdicts_the_same_way(tmp_path):
    env = {summary.ENV_SUMMARY_DIR: str(tmp_path)}
    for name, code in (("guard-1.txt", 12), ("guard-2.txt", 2), ("guard-3.txt", 143)):
        (tmp_path / name).write_text(f"{code}\nverdict {code}\n")
    assert summary.leave_ending(1, "a trainer's ending, not a verdict", 0, env)
    assert [code for code, _ in init_guard.read_verdicts(str(tmp_path))] == sorted(
        (12, 2, 143), key=contract.failure_rank) == [2, 143, 12]
