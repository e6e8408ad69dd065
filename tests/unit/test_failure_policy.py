"""api/failure_policy.py: whose fault a failure was, and which budget it spends."""
from __future__ import annotations

import pytest

from ddpjob.api import failure_policy as fp
from ddpjob.api import spec

pytestmark = pytest.mark.unit

POLICY = spec.FailurePolicy(maxRestarts=3, maxDisruptions=2, disruptionWindowSeconds=600)


@pytest.mark.parametrize("facts, expected", [
    ({"condition_reason": "EvictionByEvictionAPI"}, "EvictionByEvictionAPI"),
    ({"condition_reason": "SomethingNew"}, "SomethingNew"),  # any DisruptionTarget is the cluster's
    ({"pod_reason": "Evicted"}, "Evicted"),
    ({"pod_reason": "NodeLost"}, "NodeLost"),
    ({"unhealthy_devices": "nvidia.com/gpu GPU-1"}, "UnhealthyDevice"),
    ({"pod_reason": "OutOfcpu"}, ""),  # a pod the kubelet refused: the job's request
    ({}, ""),
])
def test_disruption_of(facts, expected):
    assert fp.disruption_of(**facts) == expected


def test_an_application_failure_spends_max_restarts():
    ruling = fp.verdict([fp.NodeFailure(1, 1)], restarts_done=1, policy=POLICY, recent_disruptions=2)
    assert (ruling.restart, ruling.kind, ruling.restarts_after, ruling.spent) == (True, "Application", 2, 2)
    assert ruling.spending(POLICY) == "restart 2 of 3"


def test_a_disruption_spends_its_own_budget_and_names_it_when_spent():
    evicted = fp.NodeFailure(1, None, "Deleted", disruption="EvictionByEvictionAPI")
    ruling = fp.verdict([evicted], restarts_done=3, policy=POLICY, recent_disruptions=1)
    assert (ruling.restart, ruling.kind, ruling.restarts_after, ruling.spent) == (True, "Disruption", 3, 2)
    spent = fp.verdict([evicted], restarts_done=0, policy=POLICY, recent_disruptions=2)
    assert (spent.restart, spent.reason) == (False, "DisruptionBudgetExhausted")
    assert "maxDisruptions 2 within disruptionWindowSeconds 600s" in spent.budget_words(POLICY)


def test_the_disruption_is_the_cause_of_the_peers_that_failed_with_it_but_not_of_a_permanent_code():
    peer = fp.NodeFailure(0, 1, "Error")
    evicted = fp.NodeFailure(1, 143, "Error", disruption="TerminationByKubelet")
    assert fp.verdict([peer, evicted], restarts_done=0, policy=POLICY).cause is evicted
    bad_config = fp.NodeFailure(0, 2, "Error")
    assert fp.verdict([bad_config, evicted], restarts_done=0, policy=POLICY).reason == fp.PERMANENT


def test_a_zero_disruption_budget_fails_on_the_first_disruption():
    policy = spec.FailurePolicy(maxDisruptions=0)
    ruling = fp.verdict([fp.NodeFailure(0, None, disruption="PreemptionByScheduler")], restarts_done=0, policy=policy)
    assert ruling.reason == "DisruptionBudgetExhausted"
