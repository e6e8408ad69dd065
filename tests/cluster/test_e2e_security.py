"""End-to-end: Pod Security admission, and what the status republishes from the pods."""
from __future__ import annotations

import pytest

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    ddpjob_manifest, e2e, enforce_restricted, python_command, terminated_state,
)

pytestmark = pytest.mark.cluster


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
