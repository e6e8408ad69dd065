"""Bad-node avoidance (api/node_exclusion.py): which failures implicate a node, the bounded
status.excludedNodes, and the affinity that keeps the next pods off the excluded nodes."""
from __future__ import annotations

import copy
import datetime as dt
from dataclasses import replace

import pytest

from ddpjob.api import node_exclusion, spec
from ddpjob.api.node_exclusion import implicates, merge_affinity, with_exclusions
from ddpjob.api.status import (
    APPLICATION, DISRUPTION, EXCLUDED_NODES_LIMIT, FAILURE_HISTORY_LIMIT, ExcludedNode, FailureRecord, JobStatus,
    format_time, with_failure,
)
from ddpjob.controller import builders
from ddpjob.controller.reconcile import JobMemory, reconcile
from tests.support.decisions import decide
from tests.support.jobs import make_job, pod_view
from tests.support.operator_fakes import SETTINGS, FakeKube, body, parse

pytestmark = pytest.mark.unit

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
POLICY = spec.FailurePolicy()  # excludeNodeAfterFailures 2


def record(node: str = "n1", code=1, kind: str = APPLICATION, reason: str = "Error", attempt: int = 0) -> FailureRecord:
    return FailureRecord(time=format_time(NOW), attempt=attempt, nodeRank=1, pod="train-node-1", nodeName=node,
                         kind=kind, reason=reason, exitCode=code)


@pytest.mark.parametrize("failure,counts", [
    (record(code=1), True),
    (record(code=137, reason="OOMKilled"), True),
    (record(code=143), False),  # SIGTERM: a peer's torchrun, or a deletion
    (record(code=12), False),  # a peer never joined
    (record(code=13), False),  # a peer was lost
    (record(code=None, reason="Deleted"), False),  # a user's kubectl delete
    (record(code=None, reason="Stalled"), False),  # the suspect of a stall is a guess
    (record(code=None, kind=DISRUPTION, reason="DeletionByTaintManager"), True),  # NotReady, unreachable
    (record(code=None, kind=DISRUPTION, reason="UnhealthyDevice"), True),
    (record(code=None, kind=DISRUPTION, reason="Evicted"), True),  # the kubelet's pressure eviction
    (record(code=None, kind=DISRUPTION, reason="EvictionByEvictionAPI"), False),  # a drain
    (record(code=None, kind=DISRUPTION, reason="PreemptionByScheduler"), False),
    (record(node="", code=1), False),  # never scheduled
])
def test_which_failures_implicate_their_node(failure, counts):
    assert implicates(failure) is counts


def history(*records: FailureRecord) -> JobStatus:
    status = JobStatus()
    for r in records:  # the oldest first, as decide records them
        status = with_failure(status, r)
    return status


def test_a_node_implicated_twice_is_excluded_once_with_why_and_since():
    once = with_exclusions(history(record(attempt=0)), POLICY, NOW)
    assert once.excludedNodes == ()
    later = NOW + dt.timedelta(minutes=5)
    twice = with_exclusions(history(record(attempt=0), record(code=137, reason="OOMKilled", attempt=1)), POLICY, later)
    [entry] = twice.excludedNodes
    assert (entry.nodeName, entry.failures, entry.reason, entry.since) == ("n1", 2, "OOMKilled", format_time(later))
    assert entry.message == "2 failure(s) on n1: attempt 0: exit code 1 (Error); attempt 1: exit code 137 (OOMKilled)"
    # A third failure there: the count moves, the time it was excluded stays.
    thrice = with_exclusions(with_failure(twice, record(attempt=2)), POLICY, later + dt.timedelta(minutes=5))
    assert [(n.failures, n.since) for n in thrice.excludedNodes] == [(3, format_time(later))]


def test_consequences_and_other_nodes_do_not_add_up():
    status = history(record(code=143), record(code=143), record(node="n2"), record(node="n3"))
    assert with_exclusions(status, POLICY, NOW).excludedNodes == ()


def test_zero_turns_it_off_and_a_higher_threshold_waits_for_more():
    status = history(record(), record(), record())
    assert with_exclusions(status, spec.FailurePolicy(excludeNodeAfterFailures=0), NOW).excludedNodes == ()
    assert with_exclusions(status, spec.FailurePolicy(excludeNodeAfterFailures=4), NOW).excludedNodes == ()
    assert len(with_exclusions(status, spec.FailurePolicy(excludeNodeAfterFailures=3), NOW).excludedNodes) == 1


def test_the_threshold_cannot_exceed_the_history_it_counts_in():
    assert spec.MAX_EXCLUDE_AFTER == FAILURE_HISTORY_LIMIT


def test_an_excluded_node_stays_excluded_after_its_failures_leave_the_history():
    status = with_exclusions(history(record(), record()), POLICY, NOW)
    for _ in range(FAILURE_HISTORY_LIMIT):  # ten failures elsewhere push n1's out of the history
        status = with_failure(status, record(node="other", code=143))
    assert [n.nodeName for n in with_exclusions(status, POLICY, NOW).excludedNodes] == ["n1"]


def test_the_list_is_bounded_and_keeps_the_newest():
    old = tuple(ExcludedNode(nodeName=f"old-{i}", failures=2, since=format_time(NOW)) for i in range(EXCLUDED_NODES_LIMIT))
    status = with_exclusions(replace(history(record(node="fresh"), record(node="fresh")), excludedNodes=old), POLICY, NOW)
    assert len(status.excludedNodes) == EXCLUDED_NODES_LIMIT
    assert status.excludedNodes[-1].nodeName == "fresh" and status.excludedNodes[0].nodeName == "old-1"


# --- the affinity -------------------------------------------------------------------------------
NOT_IN = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1", "n2"]}


def test_without_an_affinity_of_the_users_the_exclusion_is_one_required_term():
    assert merge_affinity(None, ["n2", "n1", "n2"]) == {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [NOT_IN]}]}}}
    assert merge_affinity(None, []) is None


def test_the_users_terms_each_get_the_exclusion_and_the_rest_is_kept():
    users = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n9"]}]},
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}],
        },
        "podAntiAffinity": {"x": 1},
    }
    before = copy.deepcopy(users)
    merged = merge_affinity(users, ["n1", "n2"])
    assert users == before  # the template is not changed
    terms = merged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # Terms are ORed: the exclusion is ANDed into each, so no term lets an excluded node back in.
    assert terms == [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}, NOT_IN]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n9"]}],
         "matchExpressions": [NOT_IN]},
    ]
    assert merged["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 1, "preference": {}}]
    assert merged["podAntiAffinity"] == {"x": 1}


def test_the_pods_built_for_the_job_carry_it_and_render_does_not():
    job = make_job()
    excluded = (ExcludedNode(nodeName="n1"), ExcludedNode(nodeName="n2"))
    pod = builders.build_pod(node_exclusion.avoiding(job, excluded), 0, 1)
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [NOT_IN]}]}
    assert node_exclusion.avoiding(job, ()) is job
    assert "affinity" not in builders.build_pod(job, 0, 1)["spec"]


# --- the operator -------------------------------------------------------------------------------
def _failing_on(node: str, attempt: int):
    return [pod_view(0, "Running", attempt, node_name="n0"),
            pod_view(1, "Failed", attempt, node_name=node, exit_code=1, terminated_reason="Error",
                     finished_at=NOW - dt.timedelta(seconds=5))]


def test_the_second_failure_on_a_node_excludes_it_and_says_so():
    from ddpjob.api.status import with_phase
    job = make_job(failurePolicy=spec.FailurePolicy(maxRestarts=5))
    status = with_phase(JobStatus(nnodes=2), "Running", "AllNodesRunning", "", NOW, created=True)
    first = decide(job, status, _failing_on("n1", 0), NOW)
    assert first.status.phase == "Restarting" and first.status.excludedNodes == ()
    assert "NodeExcluded" not in [e.reason for e in first.events]
    again = with_phase(replace(first.status, nnodes=2), "Running", "AllNodesRunning", "", NOW, created=True)
    second = decide(job, again, _failing_on("n1", 1), NOW)
    assert [n.nodeName for n in second.status.excludedNodes] == ["n1"]
    [event] = [e for e in second.events if e.reason == "NodeExcluded"]
    assert event.type == "Warning" and "avoid node n1: 2 failure(s) on n1" in event.message


def test_pods_the_excluded_nodes_leave_unschedulable_say_why():
    from ddpjob.api.status import with_phase
    status = with_phase(replace(JobStatus(nnodes=2), excludedNodes=(ExcludedNode(nodeName="n1"),)),
                        "Restarting", "RetryableFailure", "", NOW, created=True)
    waiting = [pod_view(0, "Running"), pod_view(1, "Pending", unschedulable=(
        "Unschedulable: 0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."))]
    message = decide(make_job(), status, waiting, NOW).status.message
    assert "the pods avoid 1 node(s) after failures there: n1; status.excludedNodes" in message
    assert "node(s) didn't match Pod's node affinity/selector" in message  # the scheduler's verdict, as before
    assert "avoid" not in decide(make_job(), replace(status, excludedNodes=()), waiting, NOW).status.message


class _KeepingKube(FakeKube):
    def __init__(self):
        super().__init__()
        self.created: list[dict] = []

    def create_pods(self, pods):
        self.created.extend(pods)
        return super().create_pods(pods)


def test_the_operator_creates_the_next_attempts_pods_off_the_excluded_nodes():
    from ddpjob.api.status import with_phase
    restarting = with_phase(replace(JobStatus(nnodes=2, restartAttempt=2), excludedNodes=(ExcludedNode(nodeName="n1"),)),
                            "Restarting", "RetryableFailure", "", NOW, created=False)
    kube = _KeepingKube()
    reconcile(body(status=restarting.to_dict()), [], JobMemory(), kube=kube, settings=SETTINGS,
              post_event=lambda e: None, now=NOW, parse=parse)
    assert len(kube.created) == 2
    for pod in kube.created:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms == {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]}]}
