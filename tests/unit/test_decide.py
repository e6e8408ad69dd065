"""decide(): every path a DDPJob can take, as (job, status, pods, now) -> plan."""
from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from ddpjob.api import spec
from ddpjob.controller.decide import PodView, refuse_creation, view_pod
from tests.support.decisions import decide, decide_invalid
from tests.support.jobs import UID, make_job, pod_view
from ddpjob.api.status import CREATED, JobStatus, NodeState, format_time, with_phase

pytestmark = pytest.mark.unit

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def pod(rank: int, phase: str = "Running", attempt: int = 0, **kw) -> PodView:
    kw.setdefault("created_at", ago(30))
    return pod_view(rank, phase, attempt, **kw)


def failed(rank: int, code, attempt: int = 0, at: float = 5, reason: str = "Error", **kw) -> PodView:
    kw.setdefault("terminated_message", f"rank {rank} says why")
    return pod(rank, "Failed", attempt, exit_code=code, terminated_reason=reason, finished_at=ago(at), **kw)


def gang_status(attempt: int = 0, created_ago: float = 30, phase: str = "Pending", restarts: int = 0,
                nodes=(), start_ago: float = 30, nnodes: int = 2) -> JobStatus:
    """A status whose gang (attempt, of ``nnodes``) was created ``created_ago`` seconds before NOW."""
    base = JobStatus(restartAttempt=attempt, restarts=restarts, nnodes=nnodes, startTime=format_time(ago(start_ago)),
                     nodes=tuple(nodes))
    return with_phase(base, phase, "PodsCreated", "", ago(created_ago), created=True)


def recorded(*ranks: int, phase: str = "Running") -> tuple[NodeState, ...]:
    return tuple(NodeState(nodeRank=r, pod=f"train-node-{r}", phase=phase, ready=phase == "Running") for r in ranks)


def names(pods) -> list[str]:
    return sorted(p.name for p in pods)


def reasons(plan) -> list[str]:
    return [e.reason for e in plan.events]


# --- creating -----------------------------------------------------------------------------------
def test_new_job_creates_every_pod_and_the_service():
    plan = decide(make_job(4), JobStatus(), [], NOW, generation=3)
    assert plan.create_ranks == (0, 1, 2, 3) and plan.attempt == 0 and plan.ensure_service
    s = plan.status
    assert (s.phase, s.ready, s.observedGeneration, s.startTime) == ("Pending", "0/4", 3, format_time(NOW))
    assert s.is_true(CREATED) and s.condition(CREATED).lastTransitionTime == format_time(NOW)
    assert reasons(plan) == ["Created"]
    assert plan.requeue_after == 600  # the startup clock


def test_new_job_suspended_creates_nothing():
    plan = decide(make_job(suspend=True), JobStatus(), [], NOW)
    assert plan.status.phase == "Suspended" and not plan.create_ranks and plan.status.startTime is None


def test_pods_created_but_not_yet_observed_are_not_created_again():
    plan = decide(make_job(), gang_status(), [], NOW, created_ranks=frozenset({0, 1}))
    assert plan.create_ranks == () and plan.status.phase == "Pending"
    assert "2 pod(s) not observed yet" in plan.status.message


def test_a_rank_whose_creation_failed_is_created_again():
    plan = decide(make_job(), gang_status(), [pod(0, "Pending")], NOW, created_ranks=frozenset({0}))
    assert plan.create_ranks == (1,) and plan.ensure_service


def test_pending_pods_are_named_with_the_schedulers_reason():
    pods = [pod(0), pod(1, "Pending", unschedulable="Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")]
    plan = decide(make_job(), gang_status(), pods, NOW)
    s = plan.status
    assert (s.phase, s.ready, s.readyNodes) == ("Pending", "1/2", 1)
    assert "train-node-1 Pending (Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)" in s.message
    assert s.nodes[1].reason == "Unschedulable" and s.nodes[1].message.startswith("0/3 nodes")
    assert plan.requeue_after == pytest.approx(570)


# --- running and succeeding ---------------------------------------------------------------------
def test_all_pods_running_is_running():
    plan = decide(make_job(), gang_status(), [pod(0, node_name="n0"), pod(1, node_name="n1")], NOW)
    s = plan.status
    assert (s.phase, s.ready, s.reason) == ("Running", "2/2", "AllNodesRunning")
    assert s.is_true("Running") and not s.is_true("Restarting")
    assert [n.nodeName for n in s.nodes] == ["n0", "n1"]
    assert reasons(plan) == ["Running"]
    again = decide(make_job(), s, [pod(0, node_name="n0"), pod(1, node_name="n1")], NOW + dt.timedelta(seconds=5))
    assert again.status == s and again.events == ()  # nothing to write, nothing to say


def test_running_means_every_pod_not_only_the_master():
    plan = decide(make_job(), gang_status(), [pod(0), pod(1, "Pending")], NOW)
    assert plan.status.phase == "Pending" and not plan.status.is_true("Running")


def test_node_zero_done_while_others_run_is_still_running():
    plan = decide(make_job(), gang_status(phase="Running"), [pod(0, "Succeeded", exit_code=0), pod(1)], NOW)
    assert plan.status.phase == "Running" and plan.status.ready == "1/2" and "1 succeeded" in plan.status.message


def test_all_pods_succeeded_is_succeeded():
    pods = [pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)]
    plan = decide(make_job(), gang_status(phase="Running"), pods, NOW)
    s = plan.status
    assert (s.phase, s.reason, s.completionTime) == ("Succeeded", "AllNodesSucceeded", format_time(NOW))
    assert reasons(plan) == ["Succeeded"] and plan.delete == ()  # Running policy: nothing runs


def test_succeeded_with_clean_pod_policy_all_deletes_the_finished_pods():
    pods = [pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)]
    plan = decide(make_job(cleanPodPolicy="All"), gang_status(phase="Running"), pods, NOW)
    assert names(plan.delete) == ["train-node-0", "train-node-1"]


def test_a_succeeded_pod_cleaned_up_by_someone_still_counts():
    status = gang_status(phase="Running", nodes=recorded(0, phase="Succeeded") + recorded(1))
    plan = decide(make_job(), status, [pod(1, "Succeeded", exit_code=0)], NOW)
    assert plan.status.phase == "Succeeded"


# --- failures -----------------------------------------------------------------------------------
def test_permanent_exit_code_fails_at_once_and_frees_the_running_pods():
    plan = decide(make_job(), gang_status(phase="Running"), [pod(0), failed(1, 2)], NOW)
    s = plan.status
    assert (s.phase, s.reason, s.restarts) == ("Failed", "PodFailedPermanent", 0)
    assert s.failedNode.to_dict() == {"nodeRank": 1, "pod": "train-node-1", "exitCode": 2, "reason": "Error",
                                      "message": "rank 1 says why"}
    assert "exited with code 2 (bad configuration (permanent))" in s.message
    assert names(plan.delete) == ["train-node-0"]  # no pod left holding GPUs (kubeflow/trainer#1579)
    assert plan.create_ranks == () and reasons(plan) == ["PodFailedPermanent"]
    assert s.completionTime == format_time(NOW) and s.readyNodes == 0


def test_permanent_failure_with_clean_pod_policy_none_keeps_the_pods():
    plan = decide(make_job(cleanPodPolicy="None"), gang_status(phase="Running"), [pod(0), failed(1, 127)], NOW)
    assert plan.status.phase == "Failed" and plan.delete == ()


@pytest.mark.parametrize("failure", [
    failed(1, 1),  # a Python exception
    failed(1, 137, reason="OOMKilled"),  # the OOM killer: retryable, judged by cause
    failed(1, 13),  # peer lost
    failed(1, 143),  # SIGTERM (no DisruptionTarget: not the cluster's doing as far as anyone says)
    pod(1, "Running", deletion_at=ago(1)),  # deleted from under the job by a plain DELETE (a user)
], ids=["exit1", "oom137", "peer13", "sigterm143", "deleted"])
def test_retryable_failure_restarts_the_whole_gang(failure):
    plan = decide(make_job(), gang_status(phase="Running"), [pod(0), failure], NOW)
    s = plan.status
    assert (s.phase, s.reason, s.restarts, s.restartAttempt) == ("Restarting", "RetryableFailure", 1, 1)
    assert not s.is_true(CREATED) and s.is_true("Restarting")
    assert s.failedNode.nodeRank == 1 and "restart 1 of 3" in s.message
    # every pod goes, the healthy one too; the one already being deleted is left alone
    assert names(plan.delete) == sorted(["train-node-0"] + ([] if failure.deleting else ["train-node-1"]))
    assert plan.create_ranks == ()
    event = plan.events[0]
    assert (event.type, event.reason) == ("Warning", "Restarting") and "node 1 (pod train-node-1)" in event.message


@pytest.mark.parametrize("disrupted, reason", [
    (pod(1, "Failed", pod_reason="Evicted", pod_message="The node was low on resource: memory."), "Evicted"),
    (pod(1, "Running", deletion_at=ago(1), disruption="PreemptionByScheduler"), "PreemptionByScheduler"),
    (pod(1, "Running", deletion_at=ago(1), disruption="EvictionByEvictionAPI",
         disruption_message="Eviction API: evicting"), "EvictionByEvictionAPI"),  # a drain
    (pod(1, "Running", deletion_at=ago(1), disruption="DeletionByTaintManager"), "DeletionByTaintManager"),
    (failed(1, 143, disruption="TerminationByKubelet"), "TerminationByKubelet"),  # exit code and all
    (pod(1, "Failed", pod_reason="NodeLost"), "NodeLost"),
    (failed(1, 1, unhealthy_devices="nvidia.com/gpu GPU-7"), "UnhealthyDevice"),
], ids=["kubelet-evicted", "preempted", "drained", "node-not-ready", "kubelet", "node-lost", "bad-gpu"])
def test_a_disruption_restarts_the_gang_without_spending_max_restarts(disrupted, reason):
    status = gang_status(phase="Running", restarts=2)
    plan = decide(make_job(), status, [pod(0), disrupted], NOW)
    s = plan.status
    assert (s.phase, s.reason, s.restarts, s.disruptions, s.restartAttempt) == ("Restarting", "Disrupted", 2, 1, 1)
    assert s.recentDisruptions == (format_time(NOW),)
    assert "disruption 1 of 10 within 3600s; maxRestarts not spent" in s.message
    [record] = s.failureHistory
    assert (record.kind, record.reason, record.nodeRank, record.pod) == ("Disruption", reason, 1, "train-node-1")
    assert names(plan.delete) == sorted(["train-node-0"] + ([] if disrupted.deleting else ["train-node-1"]))
    assert reasons(plan) == ["Restarting"] and "maxRestarts not spent" in plan.events[0].message


def test_a_disruption_is_the_cause_not_the_peers_it_took_down():
    # rank 0 (plain torchrun: a lost peer is exit 1) failed before node 1's eviction is due
    pods = [failed(0, 1, at=20, node_name="w1"),
            pod(1, "Running", deletion_at=NOW + dt.timedelta(seconds=30), disruption="EvictionByEvictionAPI",
                node_name="w2")]
    s = decide(make_job(), gang_status(phase="Running"), pods, NOW).status
    assert (s.restarts, s.disruptions, s.failedNode.nodeRank) == (0, 1, 1)
    assert s.failureHistory[0].nodeName == "w2"


def test_a_permanent_failure_beside_a_disruption_still_fails_the_job():
    pods = [failed(0, 2), pod(1, "Running", deletion_at=ago(1), disruption="PreemptionByScheduler")]
    s = decide(make_job(), gang_status(phase="Running"), pods, NOW).status
    assert (s.phase, s.reason) == ("Failed", "PodFailedPermanent")
    assert s.failureHistory[0].kind == "Application"


def test_the_disruption_budget_counts_in_a_sliding_window():
    job = make_job(failurePolicy=spec.FailurePolicy(maxDisruptions=2, disruptionWindowSeconds=600))
    evicted = pod(1, "Running", deletion_at=ago(1), disruption="EvictionByEvictionAPI")
    # two disruptions 5 and 2 minutes ago: a third within 10 minutes fails the job, naming the budget
    status = dataclasses.replace(gang_status(phase="Running", restarts=1), disruptions=2,
                                 recentDisruptions=(format_time(ago(300)), format_time(ago(120))))
    plan = decide(job, status, [pod(0), evicted], NOW)
    s = plan.status
    assert (s.phase, s.reason, s.restarts) == ("Failed", "DisruptionBudgetExhausted", 1)
    assert ("disruption budget (failurePolicy.maxDisruptions 2 within disruptionWindowSeconds 600s) is spent"
            in s.message)
    assert reasons(plan) == ["DisruptionBudgetExhausted"] and "node 1 (pod train-node-1)" in plan.events[0].message
    # the same two, 15 and 12 minutes ago, have left the window: the gang restarts
    status = dataclasses.replace(status, recentDisruptions=(format_time(ago(900)), format_time(ago(720))))
    s = decide(job, status, [pod(0), evicted], NOW).status
    assert (s.phase, s.disruptions, s.recentDisruptions) == ("Restarting", 3, (format_time(NOW),))


def test_an_application_failure_after_disruptions_spends_max_restarts():
    status = dataclasses.replace(gang_status(phase="Running", restarts=3), disruptions=4,
                                 recentDisruptions=(format_time(ago(60)),))
    s = decide(make_job(), status, [pod(0), failed(1, 1)], NOW).status
    assert (s.reason, s.disruptions) == ("RestartBudgetExhausted", 4)


def test_a_pod_gone_after_its_disruption_was_seen_is_a_disruption():
    seen = (NodeState(nodeRank=0, pod="train-node-0", phase="Running", ready=True),
            NodeState(nodeRank=1, pod="train-node-1", phase="Running", reason="DeletionByPodGC", nodeName="gone-node"))
    s = decide(make_job(), gang_status(phase="Running", nodes=seen), [pod(0)], NOW).status
    assert (s.restarts, s.disruptions) == (0, 1)
    assert (s.failureHistory[0].reason, s.failureHistory[0].nodeName) == ("DeletionByPodGC", "gone-node")


# --- the culprit: status and one Event name the rank, pod, node and why ------------------------
def test_a_failing_rank_is_named_with_its_node_and_the_meaning_of_its_exit_code():
    oom = failed(1, 137, reason="OOMKilled", node_name="worker-3",
                 terminated_message="Traceback ...\nRuntimeError: CUDA out of memory")
    plan = decide(make_job(), gang_status(attempt=2, phase="Running", restarts=1),
                  [pod(0, attempt=2), dataclasses.replace(oom, attempt=2)], NOW)
    [event] = plan.events
    assert event.reason == "Restarting"
    for words in ("node 1 (pod train-node-1 on worker-3)", "code 137", "SIGKILL", "OOM-killed",
                  "restart 2 of 3"):
        assert words in event.message, (words, event.message)
    [record] = plan.status.failureHistory
    assert (record.attempt, record.nodeRank, record.nodeName, record.kind, record.reason, record.exitCode) == (
        2, 1, "worker-3", "Application", "OOMKilled", 137)
    assert record.time == format_time(ago(5))  # when it ended, not when the operator looked
    assert record.message.endswith("RuntimeError: CUDA out of memory") and "OOM-killed" in record.message


def test_a_job_that_fails_records_its_culprit_too_and_the_history_stays_bounded():
    history = ()
    for attempt in range(12):
        status = dataclasses.replace(gang_status(attempt, phase="Running"), failureHistory=history)
        history = decide(make_job(failurePolicy=spec.FailurePolicy(maxRestarts=20)), status,
                         [pod(0, attempt=attempt), failed(1, 1, attempt=attempt)], NOW).status.failureHistory
    assert len(history) == 10 and [r.attempt for r in history] == list(range(11, 1, -1))
    status = dataclasses.replace(gang_status(12, phase="Running"), failureHistory=history)
    status = decide(make_job(), status, [pod(0, attempt=12), failed(1, 3, attempt=12)], NOW).status
    assert status.reason == "PodFailedPermanent" and status.failureHistory[0].exitCode == 3
    assert len(status.failureHistory) == 10


def test_a_restart_under_way_says_which_budget_it_spends():
    evicted = pod(1, "Running", deletion_at=ago(1), disruption="EvictionByEvictionAPI")
    status = decide(make_job(), gang_status(phase="Running"), [pod(0), evicted], ago(3)).status
    waiting = decide(make_job(), status, [evicted], NOW).status
    assert waiting.message.startswith("disruption 1 of 10: waiting for 1 old pod(s)"), waiting.message


def test_view_pod_reads_unhealthy_devices_and_the_disruption_message():
    v = view_pod({"metadata": {"name": "p", "labels": {"ddpjob.dev/node-rank": "0", "ddpjob.dev/restart-attempt": "0"}},
                  "status": {"phase": "Failed", "conditions": [
                      {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                       "message": "Taint manager: deleting due to NoExecute taint"}],
                      "containerStatuses": [{"name": "trainer", "allocatedResourcesStatus": [
                          {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-1", "health": "Healthy"},
                                                                   {"resourceID": "GPU-2", "health": "Unhealthy"}]}]}]}})
    assert v.unhealthy_devices == "nvidia.com/gpu GPU-2"
    assert (v.disruption, v.disruption_message) == ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
    # hostile: thousands of devices and odd shapes stay bounded, never a crash
    flood = [{"name": "x" * 300, "resources": [{"resourceID": "y" * 300, "health": "Unhealthy"}] * 500}, "junk", {"resources": "no"}]
    v = view_pod({"metadata": {"name": "p", "labels": {"ddpjob.dev/node-rank": "0", "ddpjob.dev/restart-attempt": "0"}},
                  "status": {"containerStatuses": [{"name": "trainer", "allocatedResourcesStatus": flood}]}})
    assert 0 < len(v.unhealthy_devices) <= 300


def test_eviction_is_recorded_as_the_reason():
    evicted = pod(1, "Failed", pod_reason="Evicted", pod_message="low on memory")
    s = decide(make_job(), gang_status(phase="Running"), [pod(0), evicted], NOW).status
    assert (s.failedNode.reason, s.failedNode.exitCode, s.failedNode.message) == ("Evicted", None, "low on memory")


def test_the_first_failure_is_the_cause_not_the_peers_that_followed():
    pods = [failed(0, 13, at=2), failed(1, 1, at=9)]  # rank 1 died first; rank 0 lost its peer
    s = decide(make_job(), gang_status(phase="Running"), pods, NOW).status
    assert s.failedNode.nodeRank == 1 and s.failedNode.exitCode == 1


def test_a_permanent_failure_wins_over_an_earlier_retryable_one():
    s = decide(make_job(), gang_status(phase="Running"), [failed(0, 1, at=9), failed(1, 3, at=2)], NOW).status
    assert (s.phase, s.failedNode.exitCode) == ("Failed", 3)


def test_spent_restart_budget_fails_the_job():
    status = gang_status(attempt=3, restarts=3, phase="Running")
    plan = decide(make_job(), status, [pod(0, attempt=3), failed(1, 1, attempt=3)], NOW)
    assert (plan.status.phase, plan.status.reason) == ("Failed", "RestartBudgetExhausted")
    assert "restart budget (3) is spent" in plan.status.message and names(plan.delete) == ["train-node-0"]


def test_zero_restart_budget_fails_on_the_first_retryable_failure():
    job = make_job(failurePolicy=spec.FailurePolicy(maxRestarts=0))
    assert decide(job, gang_status(phase="Running"), [pod(0), failed(1, 1)], NOW).status.reason == "RestartBudgetExhausted"


def test_custom_permanent_exit_codes():
    job = make_job(failurePolicy=spec.FailurePolicy(permanentExitCodes=(42,)))
    assert decide(job, gang_status(phase="Running"), [pod(0), failed(1, 42)], NOW).status.reason == "PodFailedPermanent"
    assert decide(job, gang_status(phase="Running"), [pod(0), failed(1, 2)], NOW).status.phase == "Restarting"


def test_a_pod_deleted_from_under_the_job_is_a_retryable_failure():
    status = gang_status(phase="Running", nodes=recorded(0, 1))
    plan = decide(make_job(), status, [pod(0)], NOW)  # node 1 existed and is gone
    s = plan.status
    assert (s.phase, s.failedNode.reason, s.restarts) == ("Restarting", "Deleted", 1)
    assert names(plan.delete) == ["train-node-0"]


# --- restarting: never two gangs ---------------------------------------------------------------
def restarting_status() -> JobStatus:
    plan = decide(make_job(), gang_status(phase="Running"), [pod(0), failed(1, 1)], ago(3))
    return plan.status


def test_restart_waits_until_every_old_pod_is_gone():
    status = restarting_status()
    old = [pod(0, deletion_at=NOW + dt.timedelta(seconds=20)), failed(1, 1)]
    plan = decide(make_job(), status, old, NOW)
    assert plan.create_ranks == () and plan.status.phase == "Restarting"
    assert names(plan.delete) == ["train-node-1"]  # the one not yet being deleted
    assert "waiting for 2 old pod(s) to terminate before creating attempt 1" in plan.status.message


def test_restart_creates_the_next_attempt_once_the_old_pods_are_gone():
    status = restarting_status()
    plan = decide(make_job(), status, [], NOW)
    assert plan.create_ranks == (0, 1) and plan.attempt == 1 and plan.ensure_service
    assert plan.status.phase == "Restarting" and plan.status.is_true(CREATED)
    assert plan.status.condition(CREATED).lastTransitionTime == format_time(NOW)  # startup clock restarts
    assert plan.status.startTime == status.startTime  # the deadline clock does not


def test_the_new_gang_running_ends_the_restart():
    status = decide(make_job(), restarting_status(), [], ago(2)).status
    plan = decide(make_job(), status, [pod(0, attempt=1), pod(1, attempt=1)], NOW)
    s = plan.status
    assert (s.phase, s.restarts, s.restartAttempt, s.failedNode) == ("Running", 1, 1, None)
    assert not s.is_true("Restarting")


def test_a_pod_of_an_old_attempt_seen_late_is_deleted():
    plan = decide(make_job(), gang_status(attempt=1, phase="Running"), [pod(0, attempt=1), pod(1, attempt=1), pod(1, attempt=0, uid="old")], NOW)
    assert plan.status.phase == "Running" and [p.uid for p in plan.delete] == ["old"]


def test_namesakes_of_a_deleted_job_must_go_before_the_new_gang_but_are_not_ours_to_delete():
    # The garbage collector removes them (their owner is gone); creating over them would find
    # "already exists" and count another job's pod as ours.
    foreign = pod(0, owner_uid="uid-of-an-earlier-job-named-train")
    plan = decide(make_job(), JobStatus(), [foreign], NOW)
    assert plan.create_ranks == () and plan.delete == () and plan.status.phase == "Pending"
    assert "train-node-0" in plan.status.message


# --- pods that are not ours (issue 11, item 2) ------------------------------------------------------
# A pod carrying the job's label whose controller owner reference is not this job: a user's own
# pod (no owner at all), or one of another DDPJob's. It is never deleted, never counted.
def foreign_pods(attempt: int = 0, **kw):
    return [pod(0, attempt=attempt, owner_uid=None, name="my-debug-pod", uid="foreign-1", **kw),
            pod(1, attempt=attempt, owner_uid="uid-of-another-job", name="other-node-1", uid="foreign-2", **kw)]


def uids(pods) -> set[str]:
    return {p.uid for p in pods}


def test_a_foreign_pod_with_the_name_of_a_node_is_named_and_waited_for():
    squatter = pod(1, owner_uid=None, uid="foreign-1")  # a user's pod called train-node-1
    plan = decide(make_job(), JobStatus(), [squatter], NOW)
    assert plan.create_ranks == () and plan.delete == ()
    assert "train-node-1: not this job's pod(s)" in plan.status.message


def test_a_foreign_pod_does_not_hold_the_gang_back_and_is_not_deleted():
    plan = decide(make_job(), JobStatus(), foreign_pods(), NOW)
    assert plan.create_ranks == (0, 1) and plan.delete == ()


def test_a_foreign_pod_is_not_a_stray_of_the_running_gang():
    pods = [pod(0), pod(1)] + foreign_pods(attempt=3)
    plan = decide(make_job(), gang_status(phase="Running"), pods, NOW)
    assert plan.status.phase == "Running" and plan.delete == ()


def test_a_foreign_pod_is_not_part_of_the_gang_nor_its_failure():
    pods = [pod(0, "Pending")] + [pod(1, "Failed", owner_uid=None, exit_code=1, uid="foreign-1")]
    plan = decide(make_job(), gang_status(), pods, NOW)
    assert plan.status.phase == "Pending" and plan.status.restarts == 0 and plan.delete == ()


def test_a_restart_deletes_only_our_pods():
    pods = [pod(0), failed(1, 1)] + foreign_pods()
    plan = decide(make_job(), gang_status(phase="Running"), pods, NOW)
    assert plan.status.phase == "Restarting" and uids(plan.delete) == {"uid-0-0", "uid-0-1"}


@pytest.mark.parametrize("policy", ["All", "Running"])
def test_cleanup_after_the_end_deletes_only_our_pods(policy):
    pods = [pod(0, "Succeeded"), pod(1, "Succeeded")] + foreign_pods()
    plan = decide(make_job(cleanPodPolicy=policy), gang_status(phase="Running"), pods, NOW)
    assert plan.status.phase == "Succeeded" and not (uids(plan.delete) & {"foreign-1", "foreign-2"})


def test_suspend_deletes_only_our_pods():
    pods = [pod(0), pod(1)] + foreign_pods()
    plan = decide(make_job(suspend=True), gang_status(phase="Running"), pods, NOW)
    assert uids(plan.delete) == {"uid-0-0", "uid-0-1"} and "2 pod(s)" in plan.status.message


@pytest.mark.parametrize("reason, job, status", [
    ("deadline", make_job(activeDeadlineSeconds=10), gang_status(phase="Running", start_ago=60)),
    ("startup timeout", make_job(), gang_status(created_ago=601)),
])
def test_a_job_that_gives_up_releases_only_our_pods(reason, job, status):
    pods = [pod(0), pod(1, "Pending")] + foreign_pods()
    plan = decide(job, status, pods, NOW)
    assert plan.status.phase == "Failed" and uids(plan.delete) == {"uid-0-0", "uid-0-1"}, reason


def test_an_invalid_spec_releases_only_our_pods():
    pods = [pod(0), pod(1)] + foreign_pods()
    plan = decide_invalid(gang_status(phase="Running"), "invalid spec: x", pods, NOW, uid=UID)
    assert uids(plan.delete) == {"uid-0-0", "uid-0-1"}
    assert decide_invalid(JobStatus(), "invalid spec: x", pods, NOW, uid=None).delete == ()


def test_a_foreign_pod_stuck_terminating_is_not_force_deleted():
    stuck = NOW - dt.timedelta(seconds=3600)
    pods = [pod(0, deletion_at=stuck)] + foreign_pods(deletion_at=stuck)
    plan = decide(make_job(), gang_status(phase="Running"), pods, NOW)
    assert uids(plan.force_delete) == {"uid-0-0"}


# --- the spec changed under a running attempt (issue 11, item 1) --------------------------------------
def created(job, pods=(), now=NOW):
    """The status right after the gang of ``job`` was created ``now``."""
    return decide(job, JobStatus(), list(pods), now).status


def test_growing_nnodes_does_not_add_a_pod_to_the_running_gang():
    status = decide(make_job(2), created(make_job(2), now=ago(30)), [pod(0), pod(1)], NOW).status
    assert status.phase == "Running"
    plan = decide(make_job(3), status, [pod(0), pod(1)], NOW)
    assert plan.create_ranks == () and plan.delete == ()
    s = plan.status
    assert (s.phase, s.nnodes, s.ready) == ("Running", 2, "2/2")
    assert "the change applies to the next attempt" in s.message


def test_shrinking_nnodes_does_not_delete_a_pod_of_the_running_gang():
    pods = [pod(0), pod(1), pod(2)]
    status = decide(make_job(3), created(make_job(3), now=ago(30)), pods, NOW).status
    plan = decide(make_job(2), status, pods, NOW)
    assert plan.delete == () and plan.create_ranks == ()
    assert (plan.status.phase, plan.status.nnodes, plan.status.ready) == ("Running", 3, "3/3")


def test_a_changed_image_does_not_touch_the_running_gang_and_the_next_attempt_uses_it():
    status = decide(make_job(2), created(make_job(2), now=ago(30)), [pod(0), pod(1)], NOW).status
    plan = decide(make_job(2, image="new"), status, [pod(0), pod(1)], NOW)
    assert plan.delete == () and plan.create_ranks == () and plan.status.phase == "Running"
    # After a failure, the next attempt is created from the spec as it is now.
    restarting = decide(make_job(3, image="new"), plan.status, [pod(0), failed(1, 1)], NOW).status
    assert restarting.phase == "Restarting" and restarting.nnodes == 2
    nxt = decide(make_job(3, image="new"), restarting, [], NOW)
    assert nxt.create_ranks == (0, 1, 2) and nxt.status.nnodes == 3
    assert nxt.status.podSpecHash == spec.pod_spec_hash(make_job(3, image="new").spec)


def test_fields_that_steer_only_the_operator_are_not_a_shape_change():
    base = make_job(2)
    status = decide(base, created(base, now=ago(30)), [pod(0), pod(1)], NOW).status
    edited = make_job(2, activeDeadlineSeconds=9999, ttlSecondsAfterFinished=5, cleanPodPolicy="All",
                      failurePolicy=spec.FailurePolicy(maxRestarts=9))
    assert spec.pod_spec_hash(edited.spec) == spec.pod_spec_hash(base.spec)
    assert "next attempt" not in decide(edited, status, [pod(0), pod(1)], NOW).status.message


def test_a_changed_spec_while_ranks_are_still_to_be_created_starts_the_next_attempt_in_the_new_shape():
    # Node 1 was refused (say by a quota) and is still to be created: building it from the new
    # spec would mix two shapes in one gang. The gang restarts in the new shape, unbudgeted.
    status = created(make_job(2), now=ago(30))
    plan = decide(make_job(3), status, [pod(0)], NOW)
    s = plan.status
    assert (s.phase, s.reason, s.restarts, s.restartAttempt) == ("Restarting", "SpecChanged", 0, 1)
    assert uids(plan.delete) == {"uid-0-0"} and plan.create_ranks == ()
    assert reasons(plan) == ["SpecChanged"]
    nxt = decide(make_job(3), s, [], NOW)
    assert nxt.create_ranks == (0, 1, 2) and nxt.attempt == 1


def test_a_status_from_an_older_operator_without_a_hash_is_left_as_it_was():
    status = dataclasses.replace(created(make_job(2), now=ago(30)), podSpecHash="")
    plan = decide(make_job(2), status, [pod(0), pod(1)], NOW)
    assert plan.status.phase == "Running" and plan.status.nnodes == 2


def test_pods_of_a_later_attempt_are_adopted_after_a_lost_status_write():
    plan = decide(make_job(), gang_status(attempt=0, phase="Running"), [pod(0, attempt=1), pod(1, attempt=1)], NOW)
    assert plan.status.restartAttempt == 1 and plan.status.phase == "Running" and plan.delete == ()


# --- clocks ---------------------------------------------------------------------------------------
def test_startup_timeout_releases_everything_and_names_the_pending_pods():
    pods = [pod(0), pod(1, "Pending", unschedulable="Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")]
    plan = decide(make_job(cleanPodPolicy="None"), gang_status(created_ago=601), pods, NOW)
    s = plan.status
    assert (s.phase, s.reason) == ("Failed", "StartupTimeout")
    assert "1 of 2 node(s) not running after startupTimeoutSeconds (600s)" in s.message
    assert "train-node-1 Pending (Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.)" in s.message
    # half a gang must not sit on GPUs (kubernetes-sigs/kueue#2796), whatever cleanPodPolicy says
    assert names(plan.delete) == ["train-node-0", "train-node-1"]


def test_startup_timeout_names_image_pull_errors():
    pods = [pod(0), pod(1, "Pending", waiting_reason="ImagePullBackOff", waiting_message="Back-off pulling image")]
    s = decide(make_job(), gang_status(created_ago=601), pods, NOW).status
    assert "train-node-1 Pending (ImagePullBackOff: Back-off pulling image)" in s.message


def test_startup_timeout_does_not_apply_once_running():
    plan = decide(make_job(), gang_status(created_ago=10_000, start_ago=10_000, phase="Running"), [pod(0), pod(1)], NOW)
    assert plan.status.phase == "Running" and plan.requeue_after is None


def test_active_deadline_fails_the_job_and_frees_its_pods():
    job = make_job(activeDeadlineSeconds=3600)
    plan = decide(job, gang_status(phase="Running", start_ago=3601), [pod(0), pod(1)], NOW)
    assert (plan.status.phase, plan.status.reason) == ("Failed", "DeadlineExceeded")
    assert names(plan.delete) == ["train-node-0", "train-node-1"]
    early = decide(job, gang_status(phase="Running", start_ago=3000), [pod(0), pod(1)], NOW)
    assert early.status.phase == "Running" and early.requeue_after == pytest.approx(600)


# --- suspend / resume -------------------------------------------------------------------------
def test_suspend_deletes_the_pods_and_stops_the_clocks():
    plan = decide(make_job(suspend=True), gang_status(phase="Running"), [pod(0), pod(1)], NOW)
    s = plan.status
    assert (s.phase, s.startTime, s.restartAttempt, s.restarts) == ("Suspended", None, 1, 0)
    assert not s.is_true(CREATED) and names(plan.delete) == ["train-node-0", "train-node-1"]
    assert reasons(plan) == ["Suspended"]
    again = decide(make_job(suspend=True), s, [pod(0, deletion_at=NOW)], NOW)
    assert again.events == () and again.delete == ()


def test_resume_waits_for_the_old_pods_then_recreates_with_fresh_clocks():
    suspended = decide(make_job(suspend=True), gang_status(phase="Running"), [pod(0), pod(1)], ago(100)).status
    waiting = decide(make_job(), suspended, [pod(0, deletion_at=NOW)], NOW)
    assert waiting.create_ranks == () and waiting.status.phase == "Pending"
    plan = decide(make_job(), suspended, [], NOW)
    assert plan.create_ranks == (0, 1) and plan.attempt == 1
    assert plan.status.startTime == format_time(NOW) and reasons(plan) == ["Resumed", "Created"]


# --- finished jobs ------------------------------------------------------------------------------
def test_a_finished_job_never_restarts():
    done = decide(make_job(), gang_status(phase="Running"), [pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)], ago(10)).status
    plan = decide(make_job(), done, [failed(0, 1), failed(1, 1)], NOW)
    assert plan.status == done and plan.create_ranks == () and plan.events == ()


def test_a_failed_job_ignores_suspend_and_keeps_its_reason():
    failed_status = decide(make_job(), gang_status(phase="Running"), [pod(0), failed(1, 2)], ago(10)).status
    errored = dataclasses.replace(failed_status, reason="ReconcileError", message="boom")
    plan = decide(make_job(suspend=True), errored, [], NOW)
    assert (plan.status.phase, plan.status.reason) == ("Failed", "PodFailedPermanent")


def test_ttl_deletes_the_job_after_it_finished():
    done = decide(make_job(), gang_status(phase="Running"), [pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)], ago(100)).status
    assert decide(make_job(ttlSecondsAfterFinished=60), done, [], NOW).delete_job
    later = decide(make_job(ttlSecondsAfterFinished=300), done, [], NOW)
    assert not later.delete_job and later.requeue_after == pytest.approx(200)
    assert decide(make_job(), done, [], NOW).requeue_after is None


# --- stuck pods, bad specs, refusals ------------------------------------------------------------
def test_a_pod_stuck_terminating_on_a_dead_node_is_force_deleted():
    stuck = pod(1, deletion_at=ago(61))
    plan = decide(make_job(), restarting_status(), [stuck], NOW, force_delete_after=60)
    assert [p.name for p in plan.force_delete] == ["train-node-1"] and plan.create_ranks == ()
    young = decide(make_job(), restarting_status(), [pod(1, deletion_at=ago(10))], NOW, force_delete_after=60)
    assert young.force_delete == () and young.requeue_after == pytest.approx(50)


def test_invalid_spec_fails_without_creating_anything():
    plan = decide_invalid(JobStatus(), "invalid spec: spec.nnodes: must be >= 1", [], NOW, generation=2)
    s = plan.status
    assert (s.phase, s.reason, s.observedGeneration) == ("Failed", "InvalidSpec", 2)
    assert "spec.nnodes" in s.message and reasons(plan) == ["InvalidSpec"] and plan.create_ranks == ()
    assert plan.events[0].type == "Warning"
    again = decide_invalid(s, "invalid spec: spec.nnodes: must be >= 1", [], NOW)
    assert again.status == s and again.events == ()


def test_refused_creation_fails_with_the_admission_message():
    message = 'pods "train-node-0" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true'
    plan = refuse_creation(make_job(), gang_status(), message, NOW)
    assert (plan.status.phase, plan.status.reason) == ("Failed", "PodCreationRefused")
    assert "violates PodSecurity" in plan.status.message
    cleanup = decide(make_job(cleanPodPolicy="None"), plan.status, [pod(1, "Pending")], NOW)
    assert names(cleanup.delete) == ["train-node-1"]  # what did get created is released


# --- conditions -----------------------------------------------------------------------------------
def test_condition_transition_times_stay_put_while_nothing_changes():
    first = decide(make_job(), gang_status(), [pod(0), pod(1)], ago(60)).status
    second = decide(make_job(), first, [pod(0), pod(1)], NOW).status
    assert second.conditions == first.conditions
    assert second.condition("Running").lastTransitionTime == format_time(ago(60))


# --- the view of a pod --------------------------------------------------------------------------
def test_view_pod_reads_what_the_decision_needs():
    obj = {
        "metadata": {"name": "train-node-1", "uid": "u", "namespace": "ns", "creationTimestamp": "2025-01-01T11:00:00Z",
                     "labels": {"ddpjob.dev/job-name": "train", "ddpjob.dev/node-rank": "1", "ddpjob.dev/restart-attempt": "2"},
                     "ownerReferences": [{"kind": "DDPJob", "uid": UID, "controller": True}]},
        "spec": {"nodeName": "node-a"},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {
            "exitCode": 137, "reason": "OOMKilled", "message": "", "finishedAt": "2025-01-01T11:30:00Z"}}}],
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]},
    }
    v = view_pod(obj)
    assert (v.node_rank, v.attempt, v.owner_uid, v.exit_code, v.terminated_reason, v.node_name) == (1, 2, UID, 137, "OOMKilled", "node-a")
    assert v.finished_at == dt.datetime(2025, 1, 1, 11, 30, tzinfo=dt.timezone.utc) and v.disruption == "EvictionByEvictionAPI"
    assert view_pod({"metadata": {"labels": {"ddpjob.dev/job-name": "x"}}}) is None


def test_view_pod_reads_the_scheduler_verdict():
    obj = {"metadata": {"name": "p", "uid": "u", "labels": {"ddpjob.dev/node-rank": "0", "ddpjob.dev/restart-attempt": "0"}},
           "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                          "message": "0/1 nodes are available"}]}}
    assert view_pod(obj).unschedulable == "Unschedulable: 0/1 nodes are available"


# --- status text (issue 11, item 4) -------------------------------------------------------------
SCHEDULER_VERDICT = ("Unschedulable: 0/64 nodes are available: 64 Insufficient nvidia.com/gpu. preemption: "
                     "0/64 nodes are available: 64 No preemption victims found for incoming pod, " * 3)


def test_a_long_waiting_message_keeps_its_beginning_and_groups_the_same_verdict():
    nnodes = 64
    pods = [pod(r, "Pending", unschedulable=SCHEDULER_VERDICT) for r in range(nnodes)]
    s = decide(make_job(nnodes), gang_status(nnodes=nnodes), pods, NOW).status
    assert len(s.message) <= 1024
    assert s.message.startswith("0/64 node(s) started; waiting for 64 pod(s) train-node-0, train-node-1,")
    assert "and 59 more Pending (Unschedulable: 0/64 nodes are available" in s.message
    assert len(s.message) < 450  # one clause for the 64 pods, not 64 copies of the verdict
    assert all(len(n.message) <= 256 and n.message.startswith("0/64 nodes") for n in s.nodes)


def test_a_startup_timeout_message_keeps_its_count():
    pods = [pod(r, "Pending", unschedulable=SCHEDULER_VERDICT, waiting_reason=str(r)) for r in range(64)]
    s = decide(make_job(64), gang_status(created_ago=601, nnodes=64), pods, NOW).status
    assert s.reason == "StartupTimeout" and len(s.message) <= 1024
    assert s.message.startswith("64 of 64 node(s) not running after startupTimeoutSeconds (600s): ")


def test_a_long_termination_message_keeps_its_last_lines():
    traceback = "Traceback (most recent call last):\n" + "  File x, line 1\n" * 400 + "ValueError: the cause"
    s = decide(make_job(), gang_status(phase="Running"), [pod(0), failed(1, 1, terminated_message=traceback)],
               NOW).status
    assert s.failedNode.message.endswith("ValueError: the cause") and len(s.failedNode.message) <= 2048
    assert s.failedNode.message.startswith("...  File x")  # cut at a line
    node = s.nodes[1]
    assert node.message.endswith("ValueError: the cause") and len(node.message) <= 256


@pytest.mark.parametrize("message, says_saved", [
    ("", False),
    ("Terminated", False),
    ("ddptrain-pod: node 1: exit 143: stopped by signal 15 at step=40/90; checkpoint /ckpt/step-40.pt saved", True),
])
def test_exit_143_says_checkpoint_saved_only_when_the_container_said_so(message, says_saved):
    pods = [pod(0), failed(1, 143, reason="Error", terminated_message=message)]
    s = decide(make_job(), gang_status(phase="Running"), pods, NOW).status
    assert "exited with code 143 (" in s.message and "SIGTERM" in s.message
    assert ("checkpoint saved" in s.message) == says_saved, s.message


def test_pods_refused_by_the_api_server_are_named_with_the_reason():
    quota = ('pods "train-node-1" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=1, '
             'limited: pods=1')
    plan = decide(make_job(), gang_status(), [pod(0)], NOW, creation_errors={1: quota})
    assert plan.create_ranks == (1,)  # tried again
    assert "train-node-1 not created (pods \"train-node-1\" is forbidden: exceeded quota: compute" in plan.status.message
    timed_out = decide(make_job(), gang_status(created_ago=601), [pod(0)], NOW, creation_errors={1: quota}).status
    assert timed_out.reason == "StartupTimeout" and "exceeded quota: compute" in timed_out.message


def test_the_shape_fingerprint_ignores_fields_left_at_their_defaults():
    # A field added later with a default must not make running jobs look reshaped.
    assert spec.pod_spec_hash(make_job(2).spec) == spec.pod_spec_hash(make_job(2, shmSize="2Gi").spec)
    assert spec.pod_spec_hash(make_job(2).spec) != spec.pod_spec_hash(make_job(2, shmSize="4Gi").spec)
    assert spec.pod_spec_hash(make_job(2).spec) != spec.pod_spec_hash(make_job(3).spec)


# --- big gangs: a bounded status keeps every rank's facts (api/status.py, NODES_LISTED) ---------
def big_running_status(nnodes: int, succeeded=()):
    """The status decide writes for a running gang of ``nnodes`` (``succeeded`` ranks done)."""
    pods = [pod(r, "Succeeded", exit_code=0) if r in succeeded else pod(r) for r in range(nnodes)]
    plan = decide(make_job(nnodes), gang_status(phase="Running", nnodes=nnodes), pods, NOW)
    return plan.status, pods


def test_a_big_gang_lists_a_bounded_number_of_nodes_and_counts_the_rest():
    from ddpjob.api.status import NODES_LISTED
    s, _ = big_running_status(5000)
    assert (s.phase, s.readyNodes, len(s.nodes), s.unlistedNodes) == ("Running", 5000, NODES_LISTED, 5000 - NODES_LISTED)
    assert s.observedRanks == "0-4999" and s.ready == "5000/5000"


def test_a_big_gangs_rank_that_succeeded_and_was_cleaned_up_still_counts_as_succeeded():
    s, pods = big_running_status(5000, succeeded={4321})
    assert 4321 not in {n.nodeRank for n in s.nodes} and s.succeededRanks == "4321"
    plan = decide(make_job(5000), s, [p for p in pods if p.node_rank != 4321], NOW)
    assert plan.status.phase == "Running" and plan.status.failedNode is None and not plan.create_ranks
    assert plan.status.succeededRanks == "4321" and "1 succeeded" in plan.status.message


def test_a_big_gangs_rank_observed_then_gone_is_a_failure():
    s, pods = big_running_status(5000)
    assert 4321 not in {n.nodeRank for n in s.nodes}
    plan = decide(make_job(5000), s, [p for p in pods if p.node_rank != 4321], NOW)
    f = plan.status.failedNode
    assert (plan.status.phase, f.nodeRank, f.pod, f.reason) == ("Restarting", 4321, "train-node-4321", "Deleted")
    assert not plan.create_ranks


def test_a_status_written_before_the_rank_sets_still_counts_its_listed_nodes():
    # An older operator listed every node and wrote no rank sets: its entries are the record.
    status = gang_status(phase="Running", nodes=recorded(0, phase="Succeeded") + recorded(1))
    assert status.observedRanks == "" and status.succeededRanks == ""
    assert decide(make_job(), status, [pod(1)], NOW).status.phase == "Running"
    assert decide(make_job(), status, [pod(0, "Succeeded", exit_code=0)], NOW).status.failedNode.nodeRank == 1


def test_the_biggest_gang_all_failed_with_hostile_pods_writes_a_bounded_status():
    import json
    from ddpjob.api.spec import MAX_NNODES
    from ddpjob.api.status import NODES_LISTED
    hostile = "\x01" * 4096  # longer than any bound, in the costliest JSON character
    pods = [failed(r, 1, reason=hostile, terminated_message=hostile, pod_reason=hostile,
                   pod_message=hostile, node_name=hostile) for r in range(MAX_NNODES)]
    plan = decide(make_job(MAX_NNODES, failurePolicy=spec.FailurePolicy(maxRestarts=0)),
                  gang_status(phase="Running", nnodes=MAX_NNODES), pods, NOW)
    s = plan.status
    assert (s.phase, len(s.nodes), s.unlistedNodes) == ("Failed", NODES_LISTED, MAX_NNODES - NODES_LISTED)
    size = len(json.dumps({"status": s.to_dict()}).encode())
    assert size < 512 * 1024, size


# --- the job's Service: its own, never another's (docs/security.md) -----------------------------
from ddpjob.controller.decide import ServiceView  # noqa: E402

OURS = ServiceView("train", "uid-svc", owner_uid=UID, owner=f"DDPJob train (uid {UID})")
OTHERS = ServiceView("train", "uid-svc-2", owner_uid=None, owner="Deployment web (uid uid-web)")
NAMESAKES = ServiceView("train", "uid-svc-3", owner_uid="uid-old-job", owner="DDPJob train (uid uid-old-job)")


@pytest.mark.parametrize("service, whose", [
    (OTHERS, "its controller is Deployment web (uid uid-web)"),
    (NAMESAKES, "its controller is DDPJob train (uid uid-old-job)"),
    (ServiceView("train", "u"), "it has no controller owner reference"),
])
def test_a_service_not_the_jobs_holds_the_new_gang_and_names_its_owner(service, whose):
    plan = decide(make_job(4), JobStatus(), [], NOW, service=service, service_watched=True)
    s = plan.status
    assert not plan.create_ranks and not plan.ensure_service and not plan.delete
    assert (s.phase, s.reason) == ("Pending", "ServiceConflict")
    assert "Service train is not this job's" in s.message and whose in s.message
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ServiceConflict")]
    assert whose in plan.events[0].message
    # The startup clock runs from now: the job fails if the Service is still there then.
    assert s.is_true(CREATED) and plan.requeue_after == 600


def test_a_service_in_the_way_is_reported_once_and_nothing_is_created_while_it_stays():
    first = decide(make_job(4), JobStatus(), [], NOW, service=OTHERS, service_watched=True)
    later = decide(make_job(4), first.status, [], NOW + dt.timedelta(seconds=60), service=OTHERS,
                   service_watched=True)
    assert (later.status.phase, later.status.reason) == ("Pending", "ServiceConflict")
    assert not later.create_ranks and not later.ensure_service and not later.events
    assert "4 pod(s) not created: Service train is not this job's" in later.status.message


def test_a_service_in_the_way_fails_the_job_after_the_startup_timeout():
    first = decide(make_job(4), JobStatus(), [], NOW, service=OTHERS, service_watched=True)
    plan = decide(make_job(4), first.status, [], NOW + dt.timedelta(seconds=601), service=OTHERS,
                  service_watched=True)
    assert (plan.status.phase, plan.status.reason) == ("Failed", "StartupTimeout")
    assert "Service train is not this job's" in plan.status.message and not plan.create_ranks


def test_once_the_service_in_the_way_is_gone_the_gang_and_its_service_are_created():
    first = decide(make_job(4), JobStatus(), [], NOW, service=OTHERS, service_watched=True)
    plan = decide(make_job(4), first.status, [], NOW + dt.timedelta(seconds=60), service_watched=True)
    assert plan.create_ranks == (0, 1, 2, 3) and plan.ensure_service
    assert plan.status.reason == "NodesPending"


def test_a_restart_with_a_service_in_the_way_is_held_too():
    status = with_phase(JobStatus(nnodes=2, restarts=1, restartAttempt=1), "Restarting", "RetryableFailure",
                        "node 1 failed", ago(5), created=False)
    plan = decide(make_job(), status, [], NOW, service=OTHERS, service_watched=True)
    assert (plan.status.phase, plan.status.reason, plan.create_ranks) == ("Restarting", "ServiceConflict", ())


def test_the_jobs_own_service_deleted_while_it_runs_is_recreated_and_the_gang_left_alone():
    plan = decide(make_job(), gang_status(phase="Running"), [pod(0), pod(1)], NOW, service_watched=True)
    assert plan.ensure_service and not plan.create_ranks and not plan.delete
    assert plan.status.phase == "Running" and reasons(plan) == ["ServiceMissing"]
    kept = decide(make_job(), gang_status(phase="Running"), [pod(0), pod(1)], NOW, service=OURS,
                  service_watched=True)
    assert not kept.ensure_service and not kept.events


def test_without_a_service_watch_nothing_is_known_missing():
    plan = decide(make_job(), gang_status(phase="Running"), [pod(0), pod(1)], NOW)
    assert not plan.ensure_service


def test_a_running_gang_keeps_running_beside_a_service_in_the_way_and_says_so():
    plan = decide(make_job(), gang_status(phase="Running"), [pod(0), pod(1)], NOW, service=OTHERS,
                  service_watched=True)
    assert plan.status.phase == "Running" and not plan.delete and not plan.ensure_service
    assert "Service train is not this job's" in plan.status.message
