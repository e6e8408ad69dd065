"""Evaluation on the test split with real gloo ranks: the reported accuracy is exact."""
from __future__ import annotations

import json

import pytest
import torch

from ddptrainer import checkpoint
from ddptrainer.config import parse_config
from ddptrainer.data import build_dataset
from ddptrainer.distributed import DistContext
from ddptrainer.models import build_model

pytestmark = pytest.mark.multiprocess

SINGLE = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"),
                     backend=None)


def _single_process_accuracy(data_dir, state):
    """What one process computes for the saved model over the whole test split."""
    config = parse_config(["--dataset", "mnist", "--data-dir", str(data_dir)], {})
    test = build_dataset(config, SINGLE).test_dataset
    model, _ = build_model("tiny-cnn", 1, 10)
    model.load_state_dict(state["model"])
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(len(test)):
            x, y = test[i]
            correct += int(model(x.unsqueeze(0)).argmax(dim=1).item() == y)
    return correct, len(test)


@pytest.mark.timeout(200)
def test_accuracy_of_two_ranks_equals_a_single_process_evaluation(mp, tmp_path, trainer_env):
    # 15 test samples over 2 ranks: shards of 8 and 7, where a padding sampler would count 16.
    data = mp.write_mnist(tmp_path / "data", n_train=48, n_test=15)
    args = [*mp.TINY, "--checkpoint-dir", str(tmp_path / "ckpt"), "--log-format", "json",
            "--epochs", "3", "--eval-every", "2", "--lr", "0.2"]
    args[args.index("--dataset") + 1] = "mnist"
    i = args.index("--image-size")
    del args[i:i + 2]
    proc = mp.run(mp.torchrun(2, *mp.trainer(*args, "--data-dir", str(data))), trainer_env,
                  timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    evals = [e for e in events if e["event"] == "eval"]
    # every 2nd epoch (epoch 2) and the final model (epoch 3, the end of training)
    assert [(e["epoch"], e["step"]) for e in evals] == [(2, 6), (3, 9)]
    final = evals[-1]
    correct, samples = _single_process_accuracy(
        data, checkpoint.read(checkpoint.latest_checkpoint(str(tmp_path / "ckpt"))))
    assert (final["correct"], final["samples"]) == (correct, samples) == (correct, 15)
    assert final["accuracy"] == pytest.approx(correct / 15, abs=1e-6)
    done = events[-1]
    assert done["event"] == "done" and done["accuracy"] == final["accuracy"]
    message = (tmp_path / "termination-log").read_text()
    assert f"accuracy={correct / 15:.4f} ({correct}/15 test samples)" in message
