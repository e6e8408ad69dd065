"""End-to-end: two operator replicas, one leading (docs/operator.md, "High availability").

The leader is SIGKILLed in the middle of a gang restart (the old gang still terminating): the
standby takes the Lease within a lease duration and a little, and finishes the restart from the
job's status and the pods. Nothing lost (the job Succeeds), nothing done twice (one restart
counted, one pod per rank per attempt, ever).

Local test bed only: the replicas are two host processes here; on kind the operator's two pods
are the Deployment's, and `operator.kill()` takes both down (tests/testbed/kind.py).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.testbed.operator_runner import OPERATOR_NAMESPACE, operator_command, operator_environment, render_manifests
from tests.testbed.target import local_testbed_only

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    ATTEMPT_LABEL, PodRecorder, ddpjob_manifest, e2e, hostpath_volume, prepare_shared_dir, python_command,
)

pytestmark = [pytest.mark.cluster, local_testbed_only]

LEASE = "ddpjob-operator"
LEASE_DURATION, RETRY_PERIOD = 15, 2.0  # the defaults (operator/ddpjob/controller/settings.py)
# Attempt 0: every rank runs until the test creates `fail`, then rank 1 exits 1 (retryable);
# every pod takes 3 s to exit on SIGTERM, so the gang restart is still deleting pods when the
# leader is killed. Attempt 1: each rank succeeds after a second.
RANKS = python_command("""
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), sys.exit(143)))
    if int(os.environ["DDPJOB_RESTART_ATTEMPT"]) > 0:
        time.sleep(1)
        sys.exit(0)
    while not os.path.exists("/gate/fail"):
        time.sleep(0.1)
    if os.environ["NODE_RANK"] == "1":
        sys.exit(1)
    time.sleep(600)
""")


def lease_holder(kubectl) -> str:
    result = kubectl("get", "lease", LEASE, "-n", OPERATOR_NAMESPACE, "-o", "json", check=False)
    if result.returncode != 0:
        return ""
    return json.loads(result.stdout)["spec"].get("holderIdentity") or ""


def test_the_standby_takes_over_mid_restart_and_nothing_is_lost_or_done_twice(
        e2e, operator, start_operator, shared_host_dir, kubectl):
    wait_for = e2e.cluster.wait_for
    wait_for(lambda: lease_holder(kubectl) == operator.identity, 30, "the session's operator to lead")
    documents = render_manifests()
    standby = start_operator(operator_command(documents), name="ddpjob-operator-standby",
                             env=operator_environment(documents))
    name = "failover"
    try:
        wait_for(lambda: "standing by" in standby.logs(), 30, "the second replica to stand by")
        prepare_shared_dir(e2e, shared_host_dir)
        manifest = ddpjob_manifest(
            # Recreate: the restart must still be deleting the old gang when the leader dies (a
            # command of its own would otherwise be restarted in its pods by the kubelet).
            name, e2e.image, command=RANKS, failurePolicy={"maxRestarts": 3, "restartMode": "Recreate"},
            volumeMounts=[{"name": "gate", "mountPath": "/gate"}],
            template={"spec": {"volumes": [hostpath_volume("gate", shared_host_dir)],
                               "terminationGracePeriodSeconds": 30}})
        with PodRecorder(e2e, name) as pods:
            e2e.create(manifest)
            e2e.wait_for_phase(name, "Running", 120)
            assert lease_holder(kubectl) == operator.identity  # the standby took nothing meanwhile
            (Path(shared_host_dir) / "fail").touch()
            e2e.wait_for_phase(name, "Restarting", 60)
            operator.kill()  # SIGKILL, while the old gang is still terminating
            killed = time.monotonic()
            old_gang = [p["metadata"]["name"] for p in e2e.pods(name)
                        if p["metadata"]["labels"][ATTEMPT_LABEL] == "0"]
            assert old_gang, f"the restart was over before the leader died: {e2e.pod_summary(name)}"
            wait_for(lambda: lease_holder(kubectl) == standby.identity, LEASE_DURATION + 20,
                     "the standby to take the Lease")
            took_over = time.monotonic() - killed
            status = e2e.wait_for_phase(name, ("Succeeded", "Failed"), 120)
            seen = pods.describe()

        # "A bit": the standby sees the last renewal up to a jittered retry period late, counts
        # the lease duration from then, and looks again up to a retry period after it expired;
        # plus this test's kubectl polling.
        assert took_over <= LEASE_DURATION + 2 * 1.2 * RETRY_PERIOD + 3, (took_over, standby.logs()[-3000:])
        assert status["phase"] == "Succeeded", (status, seen)
        assert (status["restarts"], status["restartAttempt"]) == (1, 1), status
        assert pods.attempts() == {0, 1}, seen
        assert pods.pods_per_rank(0) == {0: 1, 1: 1} and pods.pods_per_rank(1) == {0: 1, 1: 1}, seen
        # The killed leader may or may not have posted its Event (kopf posts from a queue); the
        # new leader never posts a second one: it counts nothing again.
        restarting = [e for e in e2e.events(name) if e["reason"] == "Restarting"]
        assert len(restarting) <= 1 and all(e.get("count", 1) == 1 for e in restarting), restarting
        assert "became the leader" in standby.logs()
        # The new leader's own Events reach the job it took over: it creates attempt 1, which
        # succeeds, and says both (a new leader's workers once posted nothing: workqueue.py).
        def new_leader_events():
            events = e2e.events(name)
            created = [e for e in events if e["reason"] == "Created" and "(attempt 1)" in e.get("message", "")]
            succeeded = [e for e in events if e["reason"] == "Succeeded"]
            return (created, succeeded) if created and succeeded else None
        wait_for(new_leader_events, 30, "the new leader's Events: Created (attempt 1) and Succeeded")
        assert "an Event was not posted" not in standby.logs(), standby.logs()[-3000:]
    finally:
        # Back to one leading session operator for the tests after this one: the killed one
        # comes back as the standby, then the standby stops and releases the Lease to it.
        operator.start()
        standby.stop()
        wait_for(lambda: lease_holder(kubectl) == operator.identity, 3 * RETRY_PERIOD + 10,
                 "the session's operator to lead again (the standby released the Lease)")
