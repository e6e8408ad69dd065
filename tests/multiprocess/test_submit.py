"""`ddpjob submit --dry-run` of a two-file folder: the manifests it prints are what `ddpjob
validate` accepts and `ddpjob run` trains with, real gloo ranks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.submit_project import write_project

pytestmark = pytest.mark.multiprocess
ROOT = Path(__file__).resolve().parents[2]


def ddpjob(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpjob.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_dry_run_of_a_two_file_folder_validates_and_trains_under_ddpjob_run(tmp_path):
    project = write_project(tmp_path / "my_project")
    printed = ddpjob("submit", str(project), "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "0",
                     "--dry-run", "--", "--steps", "3", timeout=60)
    assert printed.returncode == 0, printed.stderr
    manifest = tmp_path / "job.yaml"
    manifest.write_text(printed.stdout)

    validated = ddpjob("validate", "-f", str(manifest), timeout=60)
    assert validated.returncode == 0, validated.stderr
    assert "DDPJob/my-project is valid" in validated.stdout

    result = ddpjob("run", "-f", str(manifest))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "configMap volume 'code' written from ConfigMap 'my-project-code'" in result.stderr
    for rank in range(4):
        assert f"rank {rank}/4 ok steps=3" in result.stdout, result.stdout


def test_a_launch_era_script_submitted_as_is_runs_with_its_flag_and_environment(tmp_path):
    """Issue 36, item 3: a torch.distributed.launch script (argparse --local_rank, required)
    submitted with no flag about it gets localRankFlag, and --env reaches every process."""
    script = tmp_path / "launch_era.py"
    script.write_text(
        "import argparse, os\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--local_rank', type=int, required=True)\n"
        "args = parser.parse_args()\n"
        "assert args.local_rank == int(os.environ['LOCAL_RANK'])\n"
        "print('rank', os.environ['RANK'], 'local_rank', args.local_rank, 'greeting', os.environ['GREETING'], flush=True)\n")
    printed = ddpjob("submit", str(script), "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
                     "--env", "GREETING=hello", "--dry-run", timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "launch_era.py defines --local_rank" in printed.stderr
    manifest = tmp_path / "job.yaml"
    manifest.write_text(printed.stdout)
    result = ddpjob("run", "-f", str(manifest))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(2):
        assert f"rank {rank} local_rank {rank} greeting hello" in result.stdout, result.stdout


def test_a_folders_requirements_are_installed_before_its_script_runs(tmp_path):
    """Issue 36, item 3: requirements.txt beside train.py, found without a flag; each node pip
    installs it (offline: a wheel the test wrote) before the first attempt, and the script
    imports it."""
    from tests.support.wheels import write_wheel

    project = tmp_path / "needs"
    project.mkdir()
    (project / "requirements.txt").write_text(f"{write_wheel(tmp_path)}\n")
    (project / "train.py").write_text("import os, ddpjob_test_greeting as g\n"
                                      "print('rank', os.environ['RANK'], g.GREETING, flush=True)\n")
    printed = ddpjob("submit", str(project), "--nproc-per-node", "2", "--max-restarts", "0", "--dry-run", timeout=60)
    assert printed.returncode == 0 and "requirements.txt: each pod pip installs it" in printed.stderr, printed.stderr
    manifest = tmp_path / "job.yaml"
    manifest.write_text(printed.stdout)
    result = ddpjob("run", "-f", str(manifest))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(2):
        assert f"rank {rank} hello from a requirement" in result.stdout, result.stdout
