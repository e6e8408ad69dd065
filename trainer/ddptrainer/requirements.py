"""`ddptrain-pod --requirements FILE`: the packages a script needs beyond the image's, installed
in the pod before its first attempt.

Why: `ddpjob submit ./project` ships the code but not what it imports; users expect the
requirements.txt beside their script to count, as `ray job submit --runtime-env` and SkyPilot's
setup do. pip installs them into a folder of the container's own (``TARGET``, under its temp
directory), which the workers find first after the entry point's site (PYTHONPATH); the image
is not changed. Once per container: an attempt restarted in place finds them installed (a
marker named after the file's digest). Bounded in time (DDPJOB_REQUIREMENTS_TIMEOUT_SECONDS,
default 900). A failure is a bad configuration (exit 2, permanent: the next attempt would meet
the same index, or the same lack of one), its message pip's last lines and the way out: an
image that has them.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from typing import Callable, Mapping

#: How long pip may take (seconds) unless DDPJOB_REQUIREMENTS_TIMEOUT_SECONDS says otherwise.
DEFAULT_TIMEOUT_SECONDS = 900
TIMEOUT_ENV = "DDPJOB_REQUIREMENTS_TIMEOUT_SECONDS"
_MARKER = ".ddpjob-installed-"
_TAIL_LINES = 3


class RequirementsError(Exception):
    """The requirements could not be installed: one line saying why and what to do."""


def target_dir(node_rank: int) -> str:
    """The container's folder for them (a node's own: `ddpjob run` runs every node on one machine)."""
    return os.path.join(tempfile.gettempdir(), f"ddpjob-requirements-node-{int(node_rank)}")


def _timeout(env: Mapping[str, str]) -> float:
    text = env.get(TIMEOUT_ENV, "")
    return float(text) if text.isdigit() and int(text) > 0 else DEFAULT_TIMEOUT_SECONDS


def install(path: str, node_rank: int, env: Mapping[str, str], log: Callable[[str], None]) -> str:
    """pip install -r ``path`` into target_dir() (once per container); returns the folder."""
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read(1024 * 1024)).hexdigest()[:16]
    except OSError as error:
        raise RequirementsError(f"--requirements {path}: cannot be read ({error.strerror or error})") from None
    target = target_dir(node_rank)
    marker = os.path.join(target, _MARKER + digest)
    if os.path.exists(marker):
        return target
    command = [sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
               "--no-warn-script-location", "--quiet", "--target", target, "-r", path]
    log(f"installing the requirements of {path} into {target}")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_timeout(env),
                              env={k: v for k, v in env.items() if k != "PYTHONPATH"})
    except subprocess.TimeoutExpired:
        raise RequirementsError(f"--requirements {path}: pip did not finish within {_timeout(env):.0f}s "
                                f"({TIMEOUT_ENV}); build an image that has them (--image)") from None
    except OSError as error:
        raise RequirementsError(f"--requirements {path}: pip could not start: {error}") from None
    if done.returncode != 0:
        said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise RequirementsError(f"--requirements {path}: pip failed (exit {done.returncode}): "
                                f"{' / '.join(said[-_TAIL_LINES:]) or 'no output'}; where the pods cannot reach "
                                "a package index, build an image that has them (--image)")
    with open(marker, "w", encoding="ascii"):
        pass
    return target
