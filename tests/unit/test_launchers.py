"""Which commands start the pod's nprocPerNode processes themselves (ddpjob.api.launchers): the
one decision behind the launcher rules of ``ddpjob validate``, the CRD, the operator and
``ddpjob run`` (tests/support/manifests.py feeds the same commands to the CEL twin)."""
from __future__ import annotations

import pytest

from ddpjob import contract
from ddpjob.api import launchers, spec
from ddpjob.api.validation import parse_ddpjob, validate_ddpjob
from tests.support.manifests import with_changes

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("command, expected", [
    (["torchrun", "train.py"], "torchrun"),
    (["torchrun"], "torchrun"),
    (["/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py"], "torchrun"),
    (["python", "-m", "torch.distributed.run", "train.py"], "torch.distributed.run"),
    (["python3", "-m", "torch.distributed.launch", "--use-env", "t.py"], "torch.distributed.launch"),
    (["/usr/bin/python3", "-m", "torch.distributed.run"], "torch.distributed.run"),
    (["python3.11", "-u", "-m", "torch.distributed.run", "t.py"], "torch.distributed.run"),
    (["/opt/venv/bin/python", "-uB", "-m", "torch.distributed.launch"], "torch.distributed.launch"),
])
def test_launchers_are_recognised(command, expected):
    assert launchers.launcher_of(command) == expected
    assert launchers.starts_processes_itself(command)


@pytest.mark.parametrize("command", [
    None, [], ["python", "train.py"], ["python3", "-m", "train"], ["python", "-m"],
    ["python", "train.py", "-m", "torch.distributed.run"],  # the launcher's name as an argument
    ["python", "-W", "ignore", "-m", "torch.distributed.run"],  # an option with a value: not looked into
    ["bash", "-c", "torchrun train.py"], ["env", "torchrun"], ["/opt/my-torchrun"], ["torchrun.sh"],
    ["pythonista", "-m", "torch.distributed.run"], ["python", "-m", "torch.distributed.runner"],
    ["ddptrain-pod"],
])
def test_other_commands_are_not_launchers(command):
    assert launchers.launcher_of(command) is None


def test_pod_entry_point_at_any_path():
    assert launchers.is_pod_entry(None) and launchers.is_pod_entry(["/opt/venv/bin/ddptrain-pod"])
    assert not launchers.is_pod_entry(["torchrun"])


def test_torchrun_command_with_two_processes_is_accepted_and_runs_as_written():
    manifest = with_changes({"spec.nprocPerNode": 2, "spec.command": ["torchrun", "/w/train.py"]})
    assert validate_ddpjob(manifest) == []
    job = parse_ddpjob(manifest)
    # The command starts the processes itself: nothing of DDPJob's wraps it.
    assert spec.effective_launcher(job.spec) == contract.LAUNCHER_NONE


def test_plain_python_command_with_two_processes_is_still_refused_naming_the_ways_out():
    problems = validate_ddpjob(with_changes({"spec.nprocPerNode": 2, "spec.command": ["python", "/w/train.py"]}))
    assert [p.path for p in problems] == ["spec.command"], problems
    message = problems[0].message
    assert "runs once per pod" in message and "--script PATH" in message
    assert "command: [torchrun, PATH]" in message and "launcher: none" in message
