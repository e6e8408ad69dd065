"""`make push REGISTRY=...` (scripts/push-images.sh, issue 36 item 1): tags the built images under
the user's registry, pushes them and says how to use them; bad input is one line, exit 2."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "push-images.sh"
FAKE_DOCKER = """#!/bin/sh
echo "$@" >> "$CALLS"
case "$1 $2" in "image inspect") [ -n "$MISSING" ] && [ "$3" = "$MISSING" ] && exit 1 ;; esac
exit 0
"""


def push(tmp_path, registry: str | None, missing: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    calls = tmp_path / "calls"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPJOB_")}
    env.update(DOCKER=str(docker), CALLS=str(calls), MISSING=missing)
    env.pop("REGISTRY", None)
    if registry is not None:
        env["REGISTRY"] = registry
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    return result, calls.read_text().splitlines() if calls.exists() else []


def test_tags_and_pushes_both_images_and_says_how_to_use_them(tmp_path):
    result, calls = push(tmp_path, "registry.example.com/team/")
    assert result.returncode == 0, result.stderr
    assert "tag localhost/ddpjob/trainer:0.1.0 registry.example.com/team/ddpjob/trainer:0.1.0" in calls
    assert "push registry.example.com/team/ddpjob/trainer:0.1.0" in calls
    assert "push registry.example.com/team/ddpjob/operator:0.1.0" in calls
    assert "export DDPJOB_IMAGE=registry.example.com/team/ddpjob/trainer:0.1.0" in result.stdout
    assert "set image deployment/ddpjob-operator operator=registry.example.com/team/ddpjob/operator:0.1.0" in result.stdout


@pytest.mark.parametrize("registry, needle", [
    (None, "REGISTRY is not set"), ("", "REGISTRY is not set"), ("localhost:5000", "localhost is each node's own"),
    ("a b", "expected host[:port][/path]"), ("$(touch x)", "expected host[:port][/path]"),
])
def test_bad_registry_is_one_line_and_pushes_nothing(tmp_path, registry, needle):
    result, calls = push(tmp_path, registry)
    assert result.returncode == 2 and needle in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not any(c.startswith("push") for c in calls)


def test_an_image_not_built_says_make_images(tmp_path):
    result, calls = push(tmp_path, "r.example.com", missing="localhost/ddpjob/trainer:0.1.0")
    assert result.returncode == 2 and "run make images first" in result.stderr
    assert not any(c.startswith("push") for c in calls)
