"""`ddpjob run` in a child process, for the multiprocess tier (the local runner's tests and the
hang-detection tests that drive it)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ddpjob_run(*argv: str) -> list[str]:
    return [sys.executable, "-m", "ddpjob.cli", "run", *argv]


def run(manifest: Path, *extra: str, timeout=120, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(ddpjob_run("-f", str(manifest), *extra), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
