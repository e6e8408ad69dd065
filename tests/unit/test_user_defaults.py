"""The image `ddpjob submit` uses when --image is not given (issue 36 item 1): --image, then
$DDPJOB_IMAGE, then the config file's image:, then the built-in; a bad config names the file,
the key and what is allowed, exit 2, nothing created. Through the real entry point."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from ddpjob.client.submission import DEFAULT_IMAGE

pytestmark = pytest.mark.unit


def submit(tmp_path, *flags: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("DDPJOB_IMAGE", "DDPJOB_CONFIG", "XDG_CONFIG_HOME")}
    clean["HOME"] = str(tmp_path / "home")
    clean.update(env)
    return subprocess.run([sys.executable, "-m", "ddpjob.cli", "submit", str(script), "--dry-run", *flags],
                          capture_output=True, text=True, env=clean, timeout=120)


def image_of(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    job = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "DDPJob"][0]
    return job["spec"]["image"]


def write_config(tmp_path, text: str):
    path = tmp_path / "home" / ".config" / "ddpjob" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_built_in_default_when_nothing_is_set(tmp_path):
    assert image_of(submit(tmp_path, env={})) == DEFAULT_IMAGE


def test_the_config_file_then_the_environment_then_the_flag(tmp_path):
    write_config(tmp_path, "image: registry.example.com/team/trainer:2\n")
    assert image_of(submit(tmp_path, env={})) == "registry.example.com/team/trainer:2"
    env = {"DDPJOB_IMAGE": "registry.example.com/me/trainer:3"}
    assert image_of(submit(tmp_path, env=env)) == "registry.example.com/me/trainer:3"
    assert image_of(submit(tmp_path, "--image", "my/img:4", env=env)) == "my/img:4"


def test_xdg_config_home_and_ddpjob_config_name_the_file(tmp_path):
    xdg = tmp_path / "xdg"
    (xdg / "ddpjob").mkdir(parents=True)
    (xdg / "ddpjob" / "config.yaml").write_text("image: a/b:1\n")
    assert image_of(submit(tmp_path, env={"XDG_CONFIG_HOME": str(xdg)})) == "a/b:1"
    named = tmp_path / "team.yaml"
    named.write_text("image: c/d:2\n")
    assert image_of(submit(tmp_path, env={"DDPJOB_CONFIG": str(named), "XDG_CONFIG_HOME": str(xdg)})) == "c/d:2"


@pytest.mark.parametrize("text, needle", [
    ("imag: a/b:1\n", "unknown key imag; allowed: image"),
    ("image: [a, b]\n", "image must be a non-empty string"),
    ("- image\n", "expected a mapping"),
    ("image: a/b:1\n  x: : :\n", "not YAML"),
    ("image: a b\n", "no spaces"),
    ("# x\n" * 20_000, "larger than 64 KiB"),
])
def test_a_bad_config_file_is_one_line_naming_the_file_and_what_is_allowed(tmp_path, text, needle):
    path = write_config(tmp_path, text)
    result = submit(tmp_path, env={})
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert str(path) in result.stderr and needle in result.stderr, result.stderr


def test_a_named_config_file_that_is_missing_is_an_error_not_a_default(tmp_path):
    result = submit(tmp_path, env={"DDPJOB_CONFIG": str(tmp_path / "nope.yaml")})
    assert result.returncode == 2 and "DDPJOB_CONFIG=" in result.stderr and "no such file" in result.stderr


def test_a_bad_environment_image_names_the_variable(tmp_path):
    result = submit(tmp_path, env={"DDPJOB_IMAGE": "a b"})
    assert result.returncode == 2 and "DDPJOB_IMAGE" in result.stderr, result.stderr


def test_the_flag_needs_no_config_file_to_be_readable(tmp_path):
    write_config(tmp_path, "imag: typo\n")
    assert image_of(submit(tmp_path, "--image", "my/img:1", env={})) == "my/img:1"


def test_help_says_where_the_default_comes_from(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ddpjob.cli", "submit", "--help"], capture_output=True, text=True)
    assert "DDPJOB_IMAGE" in result.stdout and "config.yaml" in result.stdout and "make push" in result.stdout
