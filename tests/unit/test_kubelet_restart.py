"""Kubelet restarts in place (a command of your own under restartMode InPlace): the container's
restart rule (builders), what the operator reads of a pod the kubelet restarted (view_pod), and
the decision pass by pass: the failure counted once, the restarted pods carried into the next
attempt, the peers given time to exit and then recreated, permanent codes and the budget as for
any failure (docs/operator.md, "In-place restarts")."""
from __future__ import annotations

import pytest

from ddpjob import contract
from ddpjob.api import names, spec
from ddpjob.api.status import RESTARTING, RUNNING
from ddpjob.controller import builders
from ddpjob.controller.decide import KUBELET_PEER_EXIT_GRACE_SECONDS, view_pod
from tests.support.decisions import decide
from tests.support.jobs import make_job, pod_view
from tests.support.operator_fakes import at, running_status

pytestmark = pytest.mark.unit

OWN_COMMAND = ("python", "train.py")


def own_job(**policy) -> spec.DDPJob:
    return make_job(2, command=OWN_COMMAND, failurePolicy=spec.FailurePolicy(**policy))


def kubelet_pod(rank: int, attempt: int = 0, *, restarts: int = 0, seen: int = 0, running: bool = True,
                exit_code=None, last_exit=None, **fields):
    return pod_view(rank, "Running", attempt, kubelet_restarts=True, restarts=restarts, restarts_seen=seen,
                    running=running, exit_code=exit_code, last_exit_code=last_exit,
                    last_reason="Error" if last_exit else "", node_name=f"node-{rank}",
                    pod_ip=f"10.0.0.{rank + 1}", **fields)


# --- the pod -----------------------------------------------------------------------------------
def test_only_a_command_of_your_own_under_in_place_gets_the_restart_rule():
    container = builders.build_pod(own_job(permanentExitCodes=(3, 2)), 0, 0,
                                   kubelet_rules=True)["spec"]["containers"][0]
    assert container["restartPolicy"] == "Never"
    assert container["restartPolicyRules"] == [
        {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 2, 3]}}]
    recreate = own_job(restartMode=contract.RESTART_MODE_RECREATE)
    entry_point = make_job(2)
    for job in (recreate, entry_point):
        c = builders.build_pod(job, 0, 0, "token", kubelet_rules=True)["spec"]["containers"][0]
        assert "restartPolicyRules" not in c and "restartPolicy" not in c
    # DDPJOB_OPERATOR_KUBELET_RESTART_RULES=false: no rule at all; on by default.
    assert "restartPolicyRules" not in builders.build_pod(own_job(), 0, 0, kubelet_rules=False)["spec"]["containers"][0]
    assert "restartPolicyRules" in builders.build_pod(own_job(), 0, 0)["spec"]["containers"][0]


def test_the_operator_reads_a_kubelet_restart_from_the_pod_and_bounds_what_tenants_write():
    pod = builders.build_pod(own_job(), 1, 0, kubelet_rules=True)
    pod["metadata"]["uid"] = "u1"
    pod["status"] = {"phase": "Running", "containerStatuses": [{
        "name": names.CONTAINER_NAME, "restartCount": 2, "state": {"running": {}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "x" * 10000,
                                     "finishedAt": "2025-01-01T12:00:00Z"}}}]}
    seen = view_pod(pod)
    assert (seen.kubelet_restarts, seen.restarts, seen.restarts_seen, seen.last_exit_code) == (True, 2, 0, 1)
    assert len(seen.last_message) <= 2048
    pod["metadata"]["labels"][names.LABEL_CONTAINER_RESTARTS] = "lots"
    pod["status"]["containerStatuses"][0].update(restartCount=10 ** 12)
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = "1"
    hostile = view_pod(pod)
    assert (hostile.restarts, hostile.restarts_seen, hostile.last_exit_code) == (0, 0, None)
    # An API server without the feature drops the rule: the pod is one to recreate.
    del pod["spec"]["containers"][0]["restartPolicyRules"]
    assert view_pod(pod).kubelet_restarts is False


# --- the decision, pass by pass ----------------------------------------------------------------
def restarted_status(job: spec.DDPJob):
    """Attempt 0 running; node 1's container exited 1 and the kubelet started it again."""
    plan = decide(job, running_status(), [kubelet_pod(0), kubelet_pod(1, restarts=1, last_exit=1)], at(0))
    return plan


def test_a_kubelet_restart_counts_one_restart_and_keeps_every_pod():
    plan = restarted_status(own_job(maxRestarts=3))
    status = plan.status
    assert (status.phase, status.restarts, status.restartAttempt) == (RESTARTING, 1, 1)
    assert status.failureHistory[0].restartMode == contract.RESTART_MODE_IN_PLACE
    assert status.failedNode.nodeRank == 1 and status.failedNode.exitCode == 1
    assert plan.delete == () and plan.restart_in_place == () and plan.create_ranks == ()
    assert "restarted in place by the kubelet" in status.message
    assert plan.requeue_after == KUBELET_PEER_EXIT_GRACE_SECONDS


def test_a_container_that_exited_is_seen_before_the_kubelet_starts_it_again():
    about_to_restart = kubelet_pod(1, running=False, exit_code=1, terminated_reason="Error")
    plan = decide(own_job(), running_status(), [kubelet_pod(0), about_to_restart], at(0))
    assert (plan.status.restarts, plan.status.restartAttempt, plan.delete) == (1, 1, ())


def test_restarted_pods_are_carried_into_the_next_attempt_and_the_others_get_time_to_exit():
    job = own_job(maxRestarts=3)
    status = restarted_status(job).status
    survivor, restarted = kubelet_pod(0), kubelet_pod(1, restarts=1, last_exit=1)
    plan = decide(job, status, [survivor, restarted], at(2))
    assert [(p.name, p.attempt, p.restarts_seen) for p in plan.adopt] == [("train-node-1", 1, 1)]
    assert plan.delete == () and plan.create_ranks == ()  # node 0 has 30 s to exit
    assert plan.status.restarts == 1 and plan.requeue_after <= KUBELET_PEER_EXIT_GRACE_SECONDS - 2

    # Node 0's process exits too (peer lost) and its kubelet restarts it: carried, not counted.
    carried = decide(job, status, [kubelet_pod(0, restarts=1, last_exit=13), restarted], at(5))
    assert sorted(p.name for p in carried.adopt) == ["train-node-0", "train-node-1"]
    both = [kubelet_pod(0, 1, restarts=1, seen=1), kubelet_pod(1, 1, restarts=1, seen=1)]
    running = decide(job, carried.status, both, at(6))
    assert (running.status.phase, running.status.restarts, running.status.restartAttempt) == (RUNNING, 1, 1)


def test_a_peer_that_does_not_exit_in_time_is_recreated():
    job = own_job(maxRestarts=3)
    status = restarted_status(job).status
    restarted = kubelet_pod(1, restarts=1, last_exit=1)
    plan = decide(job, status, [kubelet_pod(0), restarted], at(KUBELET_PEER_EXIT_GRACE_SECONDS + 1))
    assert [p.name for p in plan.delete] == ["train-node-0"]
    assert [p.name for p in plan.adopt] == ["train-node-1"] and plan.status.restarts == 1
    # Once the old pod is gone its rank is created for attempt 1.
    later = decide(job, plan.status, [restarted], at(KUBELET_PEER_EXIT_GRACE_SECONDS + 3))
    assert later.create_ranks == (0,) and later.attempt == 1


def test_a_second_failure_after_the_carry_counts_again():
    job = own_job(maxRestarts=3)
    status = restarted_status(job).status
    again = [kubelet_pod(0, 1, restarts=1, seen=1), kubelet_pod(1, 1, restarts=2, seen=1, last_exit=1)]
    plan = decide(job, status, again, at(10))
    assert (plan.status.restarts, plan.status.restartAttempt) == (2, 2)


def test_permanent_codes_and_a_spent_budget_fail_at_once():
    exited = kubelet_pod(1, running=False, exit_code=2, terminated_reason="Error")
    permanent = decide(own_job(permanentExitCodes=(2,)), running_status(), [kubelet_pod(0), exited], at(0))
    assert permanent.status.phase == "Failed" and permanent.status.reason == "PodFailedPermanent"
    spent = decide(own_job(maxRestarts=0), running_status(),
                   [kubelet_pod(0), kubelet_pod(1, restarts=1, last_exit=1)], at(0))
    assert spent.status.phase == "Failed" and spent.status.reason == "RestartBudgetExhausted"
    assert sorted(p.name for p in spent.delete) == ["train-node-0", "train-node-1"]


def test_without_the_rule_on_the_pod_the_gang_is_recreated_as_before():
    job = own_job(maxRestarts=3)
    failed = pod_view(1, "Failed", 0, exit_code=1, terminated_reason="Error")
    plan = decide(job, running_status(), [pod_view(0), failed], at(0))
    assert plan.status.failureHistory[0].restartMode == contract.RESTART_MODE_RECREATE
    assert sorted(p.name for p in plan.delete) == ["train-node-0", "train-node-1"]


# --- the attempt a restarted container sees ------------------------------------------------------
def test_the_attempt_comes_from_an_annotation_the_kubelet_reads_at_each_start():
    pod = builders.build_pod(own_job(), 1, 3, kubelet_rules=True)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env[contract.DDPJOB_RESTART_ATTEMPT] == {"name": contract.DDPJOB_RESTART_ATTEMPT, "valueFrom": {
        "fieldRef": {"fieldPath": f"metadata.annotations['{names.ANNOTATION_ATTEMPT_AT_START}']"}}}
    assert pod["metadata"]["annotations"][names.ANNOTATION_ATTEMPT_AT_START] == "3"
    plain = builders.build_pod(own_job(), 1, 3, kubelet_rules=False)
    assert {e["name"]: e for e in plain["spec"]["containers"][0]["env"]}[contract.DDPJOB_RESTART_ATTEMPT]["value"] == "3"


def test_a_running_pod_is_armed_with_the_next_attempt_once_and_a_carried_one_after_its_carry():
    job = own_job(maxRestarts=3)
    fresh = [kubelet_pod(r, attempt_at_start=0) for r in range(2)]
    plan = decide(job, running_status(), fresh, at(0))
    assert sorted(p.name for p in plan.arm) == ["train-node-0", "train-node-1"]
    armed = [kubelet_pod(r, attempt_at_start=1) for r in range(2)]
    assert decide(job, running_status(), armed, at(1)).arm == ()  # nothing to write while idle
    # Node 1 restarted (it saw attempt 1); carried into attempt 1, it is armed with 2.
    status = restarted_status(job).status
    carried = decide(job, status, [kubelet_pod(0, attempt_at_start=1),
                                   kubelet_pod(1, restarts=1, last_exit=1, attempt_at_start=1)], at(2))
    assert [(p.name, p.attempt) for p in carried.arm] == [("train-node-1", 1)]
    # The pod not yet carried (node 0, still in attempt 0's run) is not armed past its restart.
    assert "train-node-0" not in [p.name for p in carried.arm]


def test_adopting_and_arming_write_the_pods_labels_and_annotation():
    from ddpjob.controller.reconcile import JobMemory
    from tests.support.operator_fakes import FakeKube, body, run_pass

    job_body = body(command=list(OWN_COMMAND))
    kube, memory = FakeKube(), JobMemory()
    status = restarted_status(own_job()).status
    job_body["status"] = status.to_dict()
    pods = [kubelet_pod(0, attempt_at_start=1), kubelet_pod(1, restarts=1, last_exit=1, attempt_at_start=1)]
    run_pass(job_body, pods, memory, kube, now=at(2))
    relabels = [entry for entry in kube.log if entry[0] == "relabel"]
    assert ("relabel", "train-node-1", ((names.LABEL_CONTAINER_RESTARTS, "1"),
                                        (names.LABEL_RESTART_ATTEMPT, "1"))) in relabels
    assert ("relabel", "train-node-1", ((names.ANNOTATION_ATTEMPT_AT_START, "2"),)) in relabels


def test_a_restarted_pod_that_already_finished_its_run_is_carried_with_its_outcome():
    job = own_job(maxRestarts=3)
    status = restarted_status(job).status
    done = pod_view(0, "Succeeded", 0, kubelet_restarts=True, restarts=1, restarts_seen=0, exit_code=0)
    plan = decide(job, status, [done, kubelet_pod(1, restarts=1, last_exit=1)], at(4))
    assert sorted(p.name for p in plan.adopt) == ["train-node-0", "train-node-1"] and plan.delete == ()
    again = pod_view(0, "Failed", 0, kubelet_restarts=True, restarts=1, restarts_seen=0, exit_code=1)
    failed = decide(job, status, [again, kubelet_pod(1, restarts=1, last_exit=1)], at(4))
    assert (failed.status.restarts, failed.status.restartAttempt) == (2, 2)  # a failure of attempt 1


def test_the_annotation_is_written_once_while_the_watch_catches_up():
    from ddpjob.controller.reconcile import JobMemory
    from tests.support.operator_fakes import FakeKube, body, run_pass

    job_body = body(command=list(OWN_COMMAND), status=running_status().to_dict())
    kube, memory = FakeKube(), JobMemory()
    pods = [kubelet_pod(r, attempt_at_start=0) for r in range(2)]
    for seconds in (1, 2, 3):  # the watch still shows the old annotation
        run_pass(job_body, pods, memory, kube, now=at(seconds))
    assert sorted(entry[1] for entry in kube.log if entry[0] == "relabel") == ["train-node-0", "train-node-1"]


def test_an_exit_the_kubelet_does_not_restart_is_not_taken_for_a_restart():
    """A v1.36 kubelet shows a container with its own restartPolicy that exited 0 with the pod
    still Running, before the phase (kind): that is a success on its way, not a failure."""
    done = kubelet_pod(1, running=False, exit_code=0, terminated_reason="Completed")
    plan = decide(own_job(), running_status(), [kubelet_pod(0), done], at(0))
    assert (plan.status.phase, plan.status.restarts, plan.delete) == (RUNNING, 0, ())


def test_a_big_gangs_pods_are_armed_a_few_at_a_time_and_a_refused_write_is_tried_again():
    """One annotation write per pod and attempt: a 64-pod gang's go RELABELS_AT_ONCE at a time
    (never one after another, never all at once); a pod whose write failed is armed on a
    later pass, one already armed is not written again."""
    import threading
    import time

    from ddpjob.controller import reconcile as reconcile_module
    from ddpjob.controller.kube import ApiError
    from ddpjob.controller.reconcile import JobMemory
    from tests.support.operator_fakes import FakeKube, body, run_pass

    class SlowKube(FakeKube):
        def __init__(self):
            super().__init__()
            self.lock, self.in_flight, self.most = threading.Lock(), 0, 0

        def relabel_pod(self, namespace, name, uid, labels, *, annotations=None):
            with self.lock:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
            try:
                time.sleep(0.02)
                if name == "train-node-5" and not getattr(self, "healed", False):
                    raise ApiError(500, "InternalError", "etcd hiccup", "relabel")
                super().relabel_pod(namespace, name, uid, labels, annotations=annotations)
            finally:
                with self.lock:
                    self.in_flight -= 1

    from dataclasses import replace

    job_body = body(command=list(OWN_COMMAND), nnodes=64, status=replace(running_status(), nnodes=64).to_dict())
    kube, memory = SlowKube(), JobMemory()
    pods = [kubelet_pod(r, attempt_at_start=0) for r in range(64)]
    run_pass(job_body, pods, memory, kube, now=at(1))  # logs the failed write; a later pass retries
    written = sorted(entry[1] for entry in kube.log if entry[0] == "relabel")
    assert len(written) == 63 and "train-node-5" not in written
    assert 1 < kube.most <= reconcile_module.RELABELS_AT_ONCE
    kube.healed = True
    run_pass(job_body, pods, memory, kube, now=at(2))
    assert [entry[1] for entry in kube.log if entry[0] == "relabel"][63:] == ["train-node-5"]


@pytest.mark.parametrize("code,phase", [(0, "Succeeded"), (2, "Failed"), (127, "Failed"), (1, "Running"), (137, "Running")])
def test_an_exit_no_rule_restarts_ends_the_pod_before_the_kubelet_says_so(code, phase):
    """A v1.36 kubelet shows a container with its own restartPolicy terminated while the pod is
    still Running, the phase a moment later (kind). An exit the rule does not restart (0, a
    permanent code) is read as the phase to come; one it restarts keeps the pod Running."""
    pod = builders.build_pod(own_job(), 0, 0, kubelet_rules=True)
    pod["metadata"]["uid"] = "u0"
    pod["status"] = {"phase": "Running", "containerStatuses": [{
        "name": names.CONTAINER_NAME, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": "Error", "message": "bye"}}}]}
    assert view_pod(pod).phase == phase
    # Without the rule (an API server that dropped it), the pod's own word stands.
    del pod["spec"]["containers"][0]["restartPolicyRules"]
    assert view_pod(pod).phase == "Running"


def test_a_job_failed_by_a_permanent_code_keeps_that_pod_and_its_log():
    """The failed job's cleanup deletes the pods still running; the pod that exited with the
    permanent code is finished (its log and status are what the user reads), even while its
    kubelet still shows it Running (the test bed's 2026-12-04 run deleted it)."""
    pods = []
    for rank, code in ((0, None), (1, 2)):
        pod = builders.build_pod(own_job(), rank, 0, kubelet_rules=True)
        pod["metadata"]["uid"] = f"u{rank}"
        state = {"running": {}} if code is None else {"terminated": {"exitCode": code, "reason": "Error"}}
        pod["status"] = {"phase": "Running", "containerStatuses": [{
            "name": names.CONTAINER_NAME, "restartCount": 0, "state": state}]}
        pods.append(view_pod(pod))
    plan = decide(own_job(), running_status(), pods, at(0))
    assert (plan.status.phase, plan.status.reason) == ("Failed", "PodFailedPermanent"), plan.status
    assert [p.name for p in plan.delete] == ["train-node-0"]


# --- restarts no pass saw one by one (issue 35, finding 2) --------------------------------------
def test_every_restart_the_kubelet_did_counts_against_the_budget():
    """An operator that was down, or a crash loop faster than its passes, sees restartCount jump:
    each restart the kubelet did spends the budget, not one per pass."""
    looped = kubelet_pod(1, restarts=5, last_exit=1)
    spent = decide(own_job(maxRestarts=2), running_status(), [kubelet_pod(0), looped], at(0))
    assert (spent.status.phase, spent.status.reason) == ("Failed", "RestartBudgetExhausted")
    assert "restarted train-node-1's container 5 time(s)" in spent.status.message
    assert spent.status.restarts == 4  # the budget of 2 was spent by the third of the five

    kept = decide(own_job(maxRestarts=10), running_status(), [kubelet_pod(0), looped], at(0))
    assert (kept.status.phase, kept.status.restarts, kept.status.restartAttempt) == (RESTARTING, 5, 1)
    assert "5 time(s)" in kept.status.message


def test_a_run_that_just_ended_counts_with_the_restarts_before_it():
    exited_again = kubelet_pod(1, restarts=2, running=False, exit_code=1, terminated_reason="Error")
    plan = decide(own_job(maxRestarts=10), running_status(), [kubelet_pod(0), exited_again], at(0))
    assert plan.status.restarts == 3
    backing_off = kubelet_pod(1, restarts=2, running=False, waiting_reason="CrashLoopBackOff", last_exit=1)
    plan = decide(own_job(maxRestarts=10), running_status(), [kubelet_pod(0), backing_off], at(0))
    assert plan.status.restarts == 3


def test_peers_restarted_with_the_culprit_are_one_gang_restart_each_time():
    """Every pod of a crash-looping gang restarts each time (a peer lost exits too): the gang
    restarted as often as its busiest pod, not the sum over its pods."""
    gang = [kubelet_pod(0, restarts=3, last_exit=13), kubelet_pod(1, restarts=3, last_exit=1)]
    plan = decide(own_job(maxRestarts=10), running_status(), gang, at(0))
    assert plan.status.restarts == 3


# --- the annotation edited by someone who may patch pods (issue 35, "not yet examined") ---------
@pytest.mark.parametrize("edited", ["99", "abc", "-1", "1" * 40, ""])
def test_an_edited_attempt_annotation_moves_no_count_and_is_armed_again(edited):
    """``ddpjob.dev/attempt-at-start`` is not guarded by ddpjob-ownership (docs/security.md): a
    user of the namespace may write anything there. It is only what the next container start
    sees; the status, the budget and the attempt come from the labels and restartCount."""
    from ddpjob.controller.observation import view_pod as view

    raw = {"metadata": {"name": "train-node-1", "uid": "u1", "annotations": {names.ANNOTATION_ATTEMPT_AT_START: edited},
                        "labels": {names.LABEL_NODE_RANK: "1", names.LABEL_RESTART_ATTEMPT: "0"}},
           "spec": {}, "status": {"phase": "Running"}}
    seen = view(raw).attempt_at_start
    assert seen is not None and 0 <= seen <= 1_000_000  # a bounded count, whatever was written

    job = own_job(maxRestarts=3)
    honest = decide(job, running_status(), [kubelet_pod(0, attempt_at_start=1), kubelet_pod(1, attempt_at_start=1)], at(0))
    tampered = decide(job, running_status(), [kubelet_pod(0, attempt_at_start=1), kubelet_pod(1, attempt_at_start=seen)],
                      at(0))
    assert tampered.status == honest.status and tampered.delete == honest.delete == ()
    # Anything but the next attempt is written again on the next pass (once the watch shows it).
    assert [p.name for p in tampered.arm] == ([] if seen == 1 else ["train-node-1"])


def test_an_annotation_edited_after_the_watch_showed_it_is_written_again():
    from ddpjob.controller.reconcile import JobMemory
    from tests.support.operator_fakes import FakeKube, body, run_pass

    job_body = body(command=list(OWN_COMMAND), status=running_status().to_dict())
    kube, memory = FakeKube(), JobMemory()
    armed = [kubelet_pod(0, attempt_at_start=1), kubelet_pod(1, attempt_at_start=0)]
    run_pass(job_body, armed, memory, kube, now=at(1))  # node 1 armed
    shown = [kubelet_pod(0, attempt_at_start=1), kubelet_pod(1, attempt_at_start=1)]
    run_pass(job_body, shown, memory, kube, now=at(2))  # the watch shows it
    edited = [kubelet_pod(0, attempt_at_start=1), kubelet_pod(1, attempt_at_start=7)]
    run_pass(job_body, edited, memory, kube, now=at(3))  # someone wrote 7
    writes = [entry[1] for entry in kube.log if entry[0] == "relabel"]
    assert writes == ["train-node-1", "train-node-1"]
