"""A full checkpoint volume, for real: a 1 MiB tmpfs. Exit 4 (permanent), saying so plainly.

Needs permission to mount (root, or CAP_SYS_ADMIN); skipped otherwise. Every mount is
unmounted by its fixture, whatever the test did.
"""
from __future__ import annotations

import os
import subprocess

import pytest
import torch

from ddpjob.contract import DEFAULT_PERMANENT_EXIT_CODES, ExitCode
from ddptrainer import checkpoint
from ddptrainer.distributed import DistContext
from ddptrainer.errors import DiskFullError

pytestmark = pytest.mark.multiprocess

SINGLE = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"),
                     backend=None)


@pytest.fixture
def small_volume(tmp_path):
    """A 1 MiB tmpfs at tmp_path/volume."""
    volume = tmp_path / "volume"
    volume.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(volume)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield volume
    finally:
        if subprocess.run(["umount", str(volume)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(volume)], capture_output=True)


def test_a_large_checkpoint_on_a_full_volume_is_disk_full(small_volume):
    state = {"step": 7, "model": {"w": torch.zeros(600_000)}}  # 2.3 MiB of tensors
    path = small_volume / "ckpt" / "step-00000007.pt"
    with pytest.raises(DiskFullError) as err:
        checkpoint.save(SINGLE, str(path.parent), keep=2, state=state)
    msg = err.value.message
    assert err.value.exit_code == ExitCode.DISK_FULL == 4
    assert ExitCode.DISK_FULL in DEFAULT_PERMANENT_EXIT_CODES
    assert msg.startswith(f"no space left on the volume of {path.parent} writing {path}")
    assert "needs about 2.3 MiB" in msg and "of 1.0 MiB were free before the write" in msg
    assert "--checkpoint-dir a larger volume" in msg and "room for 3 checkpoints" in msg
    assert "inline_container" not in msg
    assert os.listdir(path.parent) == []  # the partial temp file is gone


def test_a_background_write_that_fills_the_volume_is_reported_as_disk_full(small_volume):
    writer = checkpoint.BackgroundWriter()
    state = {"step": 1, "model": {"w": torch.zeros(600_000)}}
    checkpoint.save(SINGLE, str(small_volume), 2, state, writer, blocking=False)
    with pytest.raises(DiskFullError, match="no space left on the volume"):
        checkpoint.flush(SINGLE, writer)  # the next save or the final flush reports it


def test_the_trainer_exits_4_with_the_reason_when_its_volume_fills(mp, small_volume, tmp_path,
                                                                   trainer_env):
    # Leave a few KiB: less than a checkpoint of even the tiny CNN (with its optimizer state
    # and every rank's RNG state).
    ballast = small_volume / "ballast"
    ballast.write_bytes(b"\0" * (1024 * 1024 - 8 * 1024))
    ckpt = small_volume / "ckpt"
    env = dict(trainer_env, PET_NPROC_PER_NODE="2")
    proc = mp.run(mp.pod_entry(*mp.TINY, "--fake-size", "32", "--max-steps", "2",
                               "--checkpoint-dir", str(ckpt)), env, timeout=120)
    assert proc.returncode == ExitCode.DISK_FULL, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"ddptrain: error: no space left on the volume of {ckpt}" in proc.stderr
    assert "inline_container" not in proc.stderr
    message = (tmp_path / "termination-log").read_text()
    assert "exit 4" in message and "disk full: no space left" in message
    assert [n for n in os.listdir(ckpt) if n.startswith(".")] == []
