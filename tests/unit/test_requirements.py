"""A folder's requirements.txt installed in each pod before the first attempt (issue 36, item 3):
ddptrainer/requirements.py, ddptrain-pod --requirements, and what `ddpjob submit` passes."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import yaml

from ddptrainer import pod_entry, requirements
from tests.support.wheels import write_wheel

pytestmark = pytest.mark.unit


@pytest.fixture
def temp(tmp_path, monkeypatch):
    monkeypatch.setattr(requirements.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path


def test_installed_once_per_container_and_importable_from_the_folder(temp):
    wheel = write_wheel(temp)
    listed = temp / "requirements.txt"
    listed.write_text(f"# what train.py imports\n{wheel}\n")
    logged = []
    target = requirements.install(str(listed), 1, dict(os.environ), logged.append)
    assert target == str(temp / "tmp" / "ddpjob-requirements-node-1") and len(logged) == 1
    done = subprocess.run([sys.executable, "-c", "import ddpjob_test_greeting as g; print(g.GREETING)"],
                          env=dict(os.environ, PYTHONPATH=target), capture_output=True, text=True)
    assert done.stdout.strip() == "hello from a requirement", done.stderr
    assert requirements.install(str(listed), 1, dict(os.environ), logged.append) == target and len(logged) == 1


def test_a_failure_is_one_line_with_pips_words_and_the_way_out(temp):
    listed = temp / "requirements.txt"
    listed.write_text("this is not === a requirement\n")
    with pytest.raises(requirements.RequirementsError) as caught:
        requirements.install(str(listed), 0, dict(os.environ), lambda _: None)
    message = str(caught.value)
    assert message.startswith(f"--requirements {listed}: pip failed (exit ") and "\n" not in message
    assert "build an image that has them" in message
    with pytest.raises(requirements.RequirementsError, match="cannot be read"):
        requirements.install(str(temp / "missing.txt"), 0, {}, lambda _: None)


def test_the_pod_entry_takes_the_option_first():
    pod = pod_entry.parse_pod_args(["--requirements", "/workspace/code/requirements.txt", "--script", "t.py", "-x"])
    assert (pod.requirements, pod.kind, pod.target, pod.args) == ("/workspace/code/requirements.txt", "script", "t.py", ("-x",))
    assert pod_entry.resolve_launch(pod, {}).requirements == pod.requirements  # kept with the launcher chosen


def submit(*argv):
    from ddpjob.cli.main import build_parser
    from ddpjob.cli.submit import run_submit

    out, err = io.StringIO(), io.StringIO()
    code = run_submit(build_parser().parse_args(["submit", *argv, "--dry-run"]), out, err)
    return code, out.getvalue(), err.getvalue()


def test_submit_passes_a_folders_requirements_and_says_so(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "train.py").write_text("import torch\n")
    (tmp_path / "p" / "requirements.txt").write_text("einops\n")
    (tmp_path / "p" / "deps.txt").write_text("einops\n")
    code, out, err = submit(str(tmp_path / "p"))
    assert code == 0, err
    args = list(yaml.safe_load_all(out))[-1]["spec"]["args"]
    assert args == ["--requirements", "/workspace/code/requirements.txt", "--script", "/workspace/code/train.py"]
    assert "requirements.txt: each pod pip installs it" in err
    args = list(yaml.safe_load_all(submit(str(tmp_path / "p"), "--requirements", "deps.txt")[1]))[-1]["spec"]["args"]
    assert args[:2] == ["--requirements", "/workspace/code/deps.txt"]
    assert "--requirements" not in list(yaml.safe_load_all(submit(str(tmp_path / "p"), "--requirements", "none")[1]))[-1]["spec"]["args"]
    code, out, err = submit(str(tmp_path / "p"), "--requirements", "nope.txt")
    assert code == 2 and "--requirements nope.txt: not a file of the code" in err and out == ""
    code, out, err = submit(str(tmp_path / "p"), "--launcher", "torchrun-command")
    assert code == 2 and "has no pod entry point to install it" in err
