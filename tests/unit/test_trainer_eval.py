"""Evaluation: shards that count every test sample once; when it runs and what it reports."""
from __future__ import annotations

import pytest

from ddptrainer import main
from ddptrainer.evaluate import ShardSampler
from tests.support.datasets import write_mnist

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("length", [0, 1, 15, 16])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_eval_shards_cover_the_test_split_exactly_once(length, world):
    shards = [list(ShardSampler(length, world, rank)) for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(length))
    assert [len(s) for s in shards] == [len(ShardSampler(length, world, r)) for r in range(world)]


def _run(tmp_path, *argv):
    data = write_mnist(tmp_path / "data", n_train=16, n_test=10)
    return main.run(["--model", "tiny-cnn", "--dataset", "mnist", "--data-dir", str(data),
                     "--batch-size", "8", "--num-workers", "0", "--log-every", "1",
                     "--checkpoint-dir", str(tmp_path / "ckpt"), *argv],
                    environ={"DDPJOB_TERMINATION_LOG": str(tmp_path / "term")})


def test_every_epoch_by_default_and_in_the_summary(tmp_path, capsys):
    assert _run(tmp_path, "--epochs", "2") == 0
    out = capsys.readouterr().out
    evals = [line for line in out.splitlines() if line.startswith("ddptrain: eval ")]
    assert len(evals) == 2 and "epoch=1/2 step=2/4" in evals[0] and "samples=10" in evals[0]
    assert "epoch=2/2 step=4/4" in evals[1]
    assert "accuracy=" in out.splitlines()[-1]  # the done line
    assert "test samples)" in (tmp_path / "term").read_text()


def test_eval_every_zero_never_evaluates(tmp_path, capsys):
    assert _run(tmp_path, "--epochs", "2", "--eval-every", "0") == 0
    out = capsys.readouterr().out
    assert "ddptrain: eval" not in out and "accuracy" not in out
    assert "accuracy" not in (tmp_path / "term").read_text()


def test_a_run_stopped_mid_epoch_evaluates_its_final_model(tmp_path, capsys):
    assert _run(tmp_path, "--epochs", "2", "--max-steps", "3") == 0
    evals = [line for line in capsys.readouterr().out.splitlines() if " eval " in line]
    assert len(evals) == 2 and "epoch=2/2 step=3/3" in evals[1]
