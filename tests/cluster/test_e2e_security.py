"""End-to-end: Pod Security admission."""
from __future__ import annotations

import pytest

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    ddpjob_manifest, e2e, enforce_restricted, python_command,
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
