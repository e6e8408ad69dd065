"""Hang detection under `ddpjob run`: a rank that stops making progress (blocked in a
collective, or never through init) -> Stalled -> the gang restarts -> the job completes from
its checkpoint. The same rule (ddpjob.api.progress.stall) the operator applies."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from tests.support.local_run import run
from tests.support.progress_jobs import HANGING_SCRIPT

pytestmark = pytest.mark.multiprocess


def write_hanging_job(tmp_path: Path, hang: str, *, env: dict[str, str] | None = None, **policy) -> Path:
    variables = {"CKPT": str(tmp_path / "ckpt"), "HANG": hang, **(env or {})}
    spec = {"nnodes": 2, "image": "local", "command": ["python", "-c", textwrap.dedent(HANGING_SCRIPT)],
            "env": [{"name": name, "value": value} for name, value in variables.items()],
            "failurePolicy": {"maxRestarts": 1, **policy},
            "template": {"spec": {"terminationGracePeriodSeconds": 2}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob",
                                    "metadata": {"name": "t"}, "spec": spec}))
    return path


def test_a_rank_blocked_in_a_collective_stalls_the_gang_which_restarts_from_its_checkpoint(tmp_path):
    result = run(write_hanging_job(tmp_path, "step", progressTimeoutSeconds=4), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[node-1] rank 1 hangs at step 4" in result.stdout
    assert "Stalled: no rank reported progress for" in result.stderr
    assert "restarting the gang (restart 1/1)" in result.stderr
    # The second attempt starts where the checkpoint says, not from 0, and finishes.
    assert "[node-0] rank 0 attempt 1 resumes at step 4" in result.stdout
    assert "[node-1] rank 1 finished at step 10" in result.stdout
    assert "succeeded: all 2 nodes exited 0 after 1 restart" in result.stderr


def test_a_rendezvous_that_never_completes_is_caught_by_the_first_report_bound(tmp_path):
    # The restarted gang reports before it imports torch: under CI's load the import alone
    # outlasted the 6 s bound, and the healthy second attempt was taken for a second hang.
    result = run(write_hanging_job(tmp_path, "init", env={"REPORT_BEFORE_IMPORT": "1"},
                                   firstProgressTimeoutSeconds=6, progressTimeoutSeconds=60), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Stalled: no rank reported progress within 6s" in result.stderr
    assert "[node-0] rank 0 attempt 1 resumes at step 0" in result.stdout
    assert "succeeded: all 2 nodes exited 0 after 1 restart" in result.stderr


def test_the_budget_counts_stalls(tmp_path):
    manifest = write_hanging_job(tmp_path, "step", progressTimeoutSeconds=4)
    spec = yaml.safe_load(manifest.read_text())
    spec["spec"]["failurePolicy"]["maxRestarts"] = 0
    manifest.write_text(yaml.safe_dump(spec))
    result = run(manifest, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the restart budget (maxRestarts 0) is spent; job t failed" in result.stderr
