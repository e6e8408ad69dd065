"""2 and 3 real gloo ranks: training runs, parameters agree, the sampler shards the data."""
from __future__ import annotations

import textwrap

import pytest
import torch

pytestmark = pytest.mark.multiprocess

# Runs under torchrun: trains with the real Trainer, then leaves what each rank saw.
PROBE = textwrap.dedent('''
    import os, sys, torch
    torch.set_num_threads(1)
    from ddptrainer.config import parse_config
    from ddptrainer.data import build_dataset
    from ddptrainer.distributed import setup, teardown
    from ddptrainer.preemption import StopRequest
    from ddptrainer.progress import Progress
    from ddptrainer.train import Trainer


    def probe(out, argv):
        config = parse_config(argv)
        ctx = setup(config)
        try:
            data = build_dataset(config, ctx)
            trainer = Trainer(config, ctx, data, Progress(ctx.is_main, "text"), StopRequest())
            flat = lambda: torch.cat([p.detach().flatten().clone()
                                      for p in trainer.model.parameters()])
            initial = flat()
            result = trainer.run()
            shards = {}
            for epoch in (0, 1):
                trainer.sampler.set_epoch(epoch)
                shards[epoch] = list(trainer.sampler)
            torch.save({"initial": initial, "final": flat(), "shards": shards,
                        "step": result.step, "loss": result.loss, "world_size": ctx.world_size,
                        "dataset_len": len(data.dataset)}, f"{out}/rank-{ctx.rank}.pt")
        finally:
            teardown(ctx)


    probe(sys.argv[1], sys.argv[2:])
    # As ddptrain does: DDP keeps gloo's threads alive until exit, and one still releasing the
    # last collective's tensors at interpreter shutdown aborts the process ("terminate called
    # without an active exception", exit 134; docs/launch-styles.md). Leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
''')


def _tiny_args(mp, dataset="fake"):
    args = list(mp.TINY)
    if dataset != "fake":  # --image-size is FakeData's own: the config refuses it otherwise
        args[args.index("--dataset") + 1] = dataset
        i = args.index("--image-size")
        del args[i:i + 2]
    return args


def _launch(mp, tmp_path, env, nproc, args):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    cmd = mp.torchrun(nproc, str(probe), str(out), *args,
                      "--checkpoint-dir", str(tmp_path / "ckpt"))
    proc = mp.run(cmd, env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, [torch.load(out / f"rank-{r}.pt") for r in range(nproc)]


def _check_ranks(ranks, nproc, steps):
    for r in ranks:
        assert r["world_size"] == nproc and r["step"] == steps
        assert r["loss"] is not None and r["loss"] == r["loss"]  # finite, not NaN
    # DDP: after the steps every rank holds exactly the same parameters ...
    for r in ranks[1:]:
        assert torch.equal(r["final"], ranks[0]["final"])
    # ... and they moved (training happened).
    assert not torch.equal(ranks[0]["final"], ranks[0]["initial"])
    # The shards of an epoch are disjoint and together cover the data set; when the world
    # size does not divide it, the sampler pads with repeats: exactly that many, no more.
    n = ranks[0]["dataset_len"]
    padding = -n % nproc
    for epoch in (0, 1):
        shards = [r["shards"][epoch] for r in ranks]
        everything = [i for shard in shards for i in shard]
        assert len(everything) == n + padding
        assert set(everything) == set(range(n))
        assert len(everything) - len(set(everything)) == padding, f"epoch {epoch}: overlap"
    # ... and set_epoch reshuffles them.
    assert all(r["shards"][0] != r["shards"][1] for r in ranks)


@pytest.mark.timeout(150)
def test_two_ranks_train_on_fake_data(mp, tmp_path, trainer_env):
    args = [*_tiny_args(mp), "--fake-size", "64", "--max-steps", "3"]
    proc, ranks = _launch(mp, tmp_path, trainer_env, 2, args)
    _check_ranks(ranks, 2, 3)
    # Only global rank 0 prints progress; its first line states the gang.
    starts = [line for line in proc.stdout.splitlines() if line.startswith("ddptrain: start")]
    assert len(starts) == 1 and "world_size=2 backend=gloo device=cpu" in starts[0]


@pytest.mark.timeout(150)
def test_three_ranks_train_on_mnist_files(mp, tmp_path, trainer_env):
    """MNIST read by torchvision from real idx files, 3 ranks, a size 3 does not divide."""
    root = mp.write_mnist(tmp_path / "data", n_train=61)
    args = [*_tiny_args(mp, "mnist"), "--data-dir", str(root), "--epochs", "2", "--max-steps", "4"]
    proc, ranks = _launch(mp, tmp_path, trainer_env, 3, args)
    _check_ranks(ranks, 3, 4)
    assert ranks[0]["dataset_len"] == 61
    assert all(len(r["shards"][0]) == 21 for r in ranks)  # ceil(61 / 3): padded with repeats
    assert "world_size=3" in proc.stdout
