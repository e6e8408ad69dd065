"""End-to-end: `ddpjob submit` of a two-file folder through the user's kubeconfig creates the
ConfigMap and the DDPJob, and the job Succeeds with every rank of one world."""
from __future__ import annotations

import subprocess

import pytest

from tests.support.submit_project import write_project

from .e2e_support import ddpjob_cli, e2e  # noqa: F401 - e2e is a fixture

pytestmark = pytest.mark.cluster
TRAINING_TIMEOUT = 300


def submit(cluster, *argv: str) -> subprocess.CompletedProcess:
    return ddpjob_cli(cluster, "submit", *argv)


@pytest.mark.kubelet
def test_submit_a_folder_and_the_job_succeeds(e2e, tmp_path):
    project = write_project(tmp_path / "two-files")
    result = submit(e2e.cluster, str(project), "--nnodes", "2", "--nproc-per-node", "2",
                    "--image", e2e.image, "-n", e2e.namespace, "--", "--steps", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ddpjob.ddpjob.dev/two-files", result.stdout  # kubectl reads it back
    status = e2e.wait_until_finished("two-files", TRAINING_TIMEOUT)
    assert (status["phase"], status["restarts"]) == ("Succeeded", 0), status
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        log = e2e.wait_for_logs(f"two-files-node-{node}", f"rank {ranks[1]}/4 ok")
        assert f"rank {ranks[0]}/4 ok steps=2" in log, log

    # The code belongs to the job (deleting the job deletes it), and a second submit of the
    # same name is refused, naming the job, instead of replacing a job that ran.
    configmap = e2e.core.read_namespaced_config_map("two-files-code", e2e.namespace)
    job = e2e.job("two-files")
    assert [(o.kind, o.uid) for o in configmap.metadata.owner_references] == [("DDPJob", job["metadata"]["uid"])]
    again = submit(e2e.cluster, str(project), "--image", e2e.image, "-n", e2e.namespace)
    assert again.returncode == 1, again.stderr
    assert f"DDPJob {e2e.namespace}/two-files exists (Succeeded)" in again.stderr and "Traceback" not in again.stderr


def test_submit_refuses_what_the_api_server_refuses_in_one_line(e2e, tmp_path):
    """A name the cluster already uses for a ConfigMap that is not this job's code is left alone."""
    project = write_project(tmp_path / "taken")
    e2e.core.create_namespaced_config_map(e2e.namespace, {"metadata": {"name": "taken-code"}, "data": {"a": "b"}})
    result = submit(e2e.cluster, str(project), "--image", e2e.image, "-n", e2e.namespace)
    assert result.returncode == 1, result.stderr
    assert "ConfigMap" in result.stderr and "taken-code exists" in result.stderr, result.stderr
    assert e2e.job("taken") is None
    assert e2e.core.read_namespaced_config_map("taken-code", e2e.namespace).data == {"a": "b"}
