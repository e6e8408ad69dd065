"""On a CUDA machine: NCCL under torchrun, bf16, and a resume that restores the CUDA RNG.

Skipped where no GPU is visible; benchmarks/gpu_h200.sh runs these on a lent H200.
"""
from __future__ import annotations

import json

import pytest
import torch

from ddptrainer import checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.multiprocess,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture
def gpu_env(trainer_env):
    env = dict(trainer_env)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the CPU tests hide GPUs; these need one
    return env


def _events(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.timeout(180)
def test_nccl_bf16_train_then_resume(mp, tmp_path, gpu_env):
    ckpt = tmp_path / "ckpt"
    args = ["--device", "gpu", "--model", "resnet18", "--dataset", "fake", "--image-size", "64",
            "--fake-size", "4096", "--batch-size", "32", "--num-workers", "2", "--log-every", "2",
            "--log-format", "json", "--checkpoint-dir", str(ckpt)]
    first = mp.run(mp.torchrun(1, *mp.trainer(*args, "--max-steps", "4")), gpu_env, timeout=150)
    assert first.returncode == 0, first.stderr[-3000:]
    start = _events(first.stdout)[0]
    assert (start["backend"], start["device"], start["precision"]) == ("nccl", "cuda:0", "bf16")
    state = checkpoint.read(checkpoint.latest_checkpoint(str(ckpt)))
    assert state["step"] == 4 and state["rng"][0]["cuda"] is not None

    second = mp.run(mp.torchrun(1, *mp.trainer(*args, "--max-steps", "6")), gpu_env, timeout=150)
    assert second.returncode == 0, second.stderr[-3000:]
    events = _events(second.stdout)
    assert events[0]["step"] == 4 and events[-1]["event"] == "done" and events[-1]["step"] == 6
    assert all(e["loss"] == e["loss"] for e in events if e["event"] == "progress")  # no NaN


@pytest.mark.timeout(120)
def test_gpu_index_beyond_the_visible_ones_is_bad_config(mp, gpu_env):
    """LOCAL_RANK with no GPU of its own: exit 2 with the reason, never a hang."""
    n = torch.cuda.device_count()
    env = dict(gpu_env, RANK="0", WORLD_SIZE="1", LOCAL_RANK=str(n), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(mp.free_port()))
    proc = mp.run([*mp.pod_entry()[:1], "-m", "ddptrainer.main", "--device", "gpu",
                   *mp.TINY[2:]], env, timeout=100)
    assert proc.returncode == 2
    assert f"--device: LOCAL_RANK {n} has no GPU: {n} visible" in proc.stderr
