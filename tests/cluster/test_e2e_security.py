"""End-to-end: Pod Security admission, and what the status republishes from the pods."""
from __future__ import annotations

import json
import time

import pytest

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    ATTEMPT_LABEL, as_user, ddpjob_manifest, e2e, enforce_restricted, grant, python_command,
    terminated_state, user_name, wait_until_allowed,
)

pytestmark = pytest.mark.cluster


@pytest.mark.kubelet
def test_default_pods_are_admitted_under_restricted_pod_security(e2e):
    """the operator's default pods satisfy the "restricted" profile."""
    enforce_restricted(e2e)
    name = "restricted-ok"
    e2e.create(ddpjob_manifest(name, e2e.image, command=python_command("print('admitted')")))
    status = e2e.wait_for_phase(name, ("Succeeded", "Failed"), 120)
    assert status["phase"] == "Succeeded", status
    for pod in e2e.pods(name):
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        container = pod["spec"]["containers"][0]["securityContext"]
        assert container["allowPrivilegeEscalation"] is False
        assert container["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.kubelet
def test_template_that_breaks_restricted_fails_with_the_admission_message(e2e):
    """a template asking for root is refused by Pod Security admission; the job
    fails with the API server's message, and nothing is left behind."""
    enforce_restricted(e2e)
    name = "wants-root"
    e2e.create(ddpjob_manifest(
        name, e2e.image, command=python_command("print('never admitted')"),
        template={"spec": {"securityContext": {"runAsNonRoot": False, "runAsUser": 0}}}))
    status = e2e.wait_for_phase(name, ("Succeeded", "Failed"), 60)
    assert status["phase"] == "Failed", status
    assert status["reason"] == "PodCreationRefused", status
    assert 'violates PodSecurity "restricted:latest"' in status["message"], status
    assert "runAsNonRoot" in status["message"] and "runAsUser=0" in status["message"], status
    assert not e2e.pods(name)
    refused = e2e.wait_for_event(name, "PodCreationRefused")
    assert refused[0]["type"] == "Warning", refused


def test_status_republishes_no_more_than_the_pods_status(e2e):
    """docs/security.md: what the DDPJob's status copies from a failed container is bounded
    and is part of what the pod's own status already shows (FallbackToLogsOnError puts the
    log's last lines there), so a reader of the job sees nothing a reader of the pod could
    not."""
    name = "chatty"
    e2e.create(ddpjob_manifest(name, e2e.image, nnodes=1, command=python_command("""
        import sys
        for i in range(300):
            print(f'line {i:03d} ' + 'x' * 40)
        print('TOKEN=printed-by-a-careless-program')
        sys.exit(2)
        """)))
    status = e2e.wait_for_phase(name, "Failed", 120)
    failed = status["failedNode"]
    [pod] = e2e.pods(name)
    pod_message = terminated_state(pod)["message"]
    assert "TOKEN=printed-by-a-careless-program" in pod_message  # the pod status has it anyway
    assert len(failed["message"]) <= 2048
    assert "TOKEN=printed-by-a-careless-program" in failed["message"]
    # Every whole line the job shows is in the pod's status (a cut first line may be marked).
    shown = [line for line in failed["message"].splitlines()[1:] if line.strip()]
    assert shown and all(line in pod_message for line in shown), (failed, pod_message)
    for node in status.get("nodes", []):
        assert len(node.get("message", "")) <= 256, node


SLEEP_FOREVER = python_command("import time; time.sleep(600)")


def test_a_pod_creator_cannot_take_over_someone_elses_gang(e2e):
    """Issue 21, item 11: a tenant who may only create pods makes one "of" another user's
    running job (its controller ownerReference, uid and all, and the labels of rank 0 of the
    next attempt). Admitted, the operator would adopt that attempt and delete the real gang;
    manifests/ownership-policy.yaml refuses the pod, and the gang runs on untouched."""
    name = "victim"
    e2e.create(ddpjob_manifest(name, e2e.image, command=SLEEP_FOREVER,
                               template={"spec": {"terminationGracePeriodSeconds": 1}}))
    running = e2e.wait_for_phase(name, "Running", 120)
    gang = {p["metadata"]["uid"] for p in e2e.pods(name)}
    real = e2e.pods(name)[0]["metadata"]
    kubectl = e2e.cluster.kubectl
    tenant = user_name("pod-creator")
    grant(kubectl, e2e.namespace, tenant, "pod-creator",
          [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}])
    wait_until_allowed(e2e.cluster, tenant, "create", "pods", e2e.namespace)

    [owner] = real["ownerReferences"]
    forged = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "forged",
        "labels": {**real["labels"], ATTEMPT_LABEL: str(running["restartAttempt"] + 1)},
        # blockOwnerDeletion would need update on ddpjobs/finalizers where the
        # OwnerReferencesPermissionEnforcement plugin runs: a forger simply leaves it out.
        "ownerReferences": [{**owner, "blockOwnerDeletion": False}]},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [
            {"name": "trainer", "image": e2e.image, "command": SLEEP_FOREVER}]}}
    attempt = as_user(kubectl, tenant, "create", "-n", e2e.namespace, "-f", "-",
                      input=json.dumps(forged))

    # The outcome first: for ten seconds (the operator reacts to a pod within one) the gang is
    # the same pods, none being deleted, in the same attempt.
    for _ in range(20):
        pods = {p["metadata"]["uid"]: p for p in e2e.pods(name)}
        status = e2e.status(name)
        kept = gang <= set(pods) and not any(pods[uid]["metadata"].get("deletionTimestamp")
                                             for uid in gang)
        assert kept and status["restartAttempt"] == running["restartAttempt"], (
            f"the gang was touched after a forged pod ({attempt.returncode}: {attempt.stderr}): "
            f"{e2e.pod_summary(name)}, status {status}")
        assert status["phase"] == "Running", status
        time.sleep(0.5)
    assert attempt.returncode != 0, attempt.stdout
    assert "ValidatingAdmissionPolicy 'ddpjob-ownership'" in attempt.stderr, attempt.stderr
    assert e2e.pod("forged") is None
