"""Helpers for the trainer's multi-process tests: real gloo ranks launched by torchrun.

Every launch gets a clean environment (no inherited RANK/PET_*), one CPU thread per rank and
its own termination-message file, so tests never touch /dev/termination-log.

Tests reach the helpers through the ``mp`` fixture (never ``import conftest``: other test
folders have a conftest module of their own).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import pytest

from ddpjob.local.plan import reserve_free_port
from tests.support.datasets import write_mnist

REPO = Path(__file__).resolve().parents[2]

_DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                    "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "DDPJOB_DEVICE",
                    "DDPJOB_TERMINATION_LOG", "DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS",
                    "DDPTRAINER_SUMMARY_DIR", "DDPTRAINER_DATA_DIR", "DDPTRAINER_CHECKPOINT_DIR",
                    "DDPJOB_NAME", "DDPJOB_NAMESPACE", "DDPJOB_UID")  # whose checkpoints are written


def free_port() -> int:
    """Below the ephemeral range, as `ddpjob run` picks (reserve_free_port says why)."""
    with reserve_free_port() as sock:
        return sock.getsockname()[1]


@pytest.fixture
def trainer_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _DISTRIBUTED_ENV and not k.startswith("PET_")}
    paths = [str(REPO / "operator"), str(REPO / "trainer")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", DDPJOB_TERMINATION_LOG=str(tmp_path / "termination-log"),
               CUDA_VISIBLE_DEVICES="")
    return env


def torchrun(nproc: int, *args: str) -> list[str]:
    """torchrun on this machine (a c10d rendezvous on a free port) running ``args``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *args]


def trainer(*args: str) -> list[str]:
    return ["-m", "ddptrainer.main", *args]


def pod_entry(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddptrainer.pod_entry", *args]


# Small and fast: a tiny CNN on 16x16 FakeData, one thread, no loader workers.
TINY = ("--model", "tiny-cnn", "--dataset", "fake", "--image-size", "16", "--batch-size", "8",
        "--num-workers", "0", "--cpu-threads", "1", "--log-every", "2",
        "--collective-timeout-seconds", "60")


def run(cmd: Sequence[str], env: dict[str, str], timeout: float = 90,
        cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def start(cmd: Sequence[str], env: dict[str, str], log: Path,
          cwd: Optional[Path] = None) -> subprocess.Popen:
    """Start in the background, output to ``log`` (read it with ``log.read_text()``)."""
    handle = open(log, "w")
    return subprocess.Popen(list(cmd), env=env, cwd=cwd, stdout=handle,
                            stderr=subprocess.STDOUT, text=True)


def wait_for_text(log: Path, needle: str, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if needle in text:
            return text
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not seen in {log}:\n{log.read_text()[-4000:]}")


class _Helpers:
    free_port = staticmethod(free_port)
    torchrun = staticmethod(torchrun)
    trainer = staticmethod(trainer)
    pod_entry = staticmethod(pod_entry)
    run = staticmethod(run)
    start = staticmethod(start)
    wait_for_text = staticmethod(wait_for_text)
    write_mnist = staticmethod(write_mnist)
    TINY = TINY
    REPO = REPO


@pytest.fixture
def mp() -> type[_Helpers]:
    return _Helpers
