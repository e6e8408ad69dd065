"""A checkpoint resumed by a gang of another size: the same samples, the same --epochs.

Real gloo ranks under torchrun. The first run stops mid-epoch (--max-steps; its final
checkpoint is written there), the second resumes on fewer or more ranks. Every rank logs the
index of each sample it trains on, so the test sees what the gangs actually consumed.
"""
from __future__ import annotations

import json
import textwrap
from collections import Counter
from math import ceil

import pytest

from ddptrainer import checkpoint

pytestmark = pytest.mark.multiprocess

# The trainer, except that the data set logs "<epoch> <index>" of each sample it serves
# (num_workers 0: samples are fetched in the rank's own process, when its step needs them).
LOGGING_TRAINER = textwrap.dedent('''
    import os, sys
    from torch.utils.data import Dataset
    from ddptrainer import data, main

    log = open(os.path.join(os.environ["SAMPLE_LOG_DIR"],
                            f"rank-{os.environ['RANK']}-{os.getpid()}.txt"), "w")
    epoch = [None]
    original_set_epoch = data.ResumableDistributedSampler.set_epoch

    def set_epoch(self, e, *args, **kwargs):
        epoch[0] = e
        return original_set_epoch(self, e, *args, **kwargs)

    class Logged(Dataset):
        def __init__(self, inner):
            self.inner = inner
        def __len__(self):
            return len(self.inner)
        def __getitem__(self, i):
            log.write(f"{epoch[0]} {i}\\n")
            log.flush()
            return self.inner[i]

    original_build = main.build_dataset

    def build_dataset(config, ctx):
        info = original_build(config, ctx)
        return data.DataInfo(Logged(info.dataset), info.in_channels, info.num_classes)

    data.ResumableDistributedSampler.set_epoch = set_epoch
    main.build_dataset = build_dataset
    sys.exit(main.run(sys.argv[1:]))
''')

N, BATCH, EPOCHS, FIRST_STEPS = 50, 4, 2, 3


def _seen(folder):
    """epoch -> list of sample indices trained on, over every rank of every run."""
    out: dict[int, list[int]] = {}
    for path in folder.iterdir():
        for line in path.read_text().split("\n"):
            if line:
                e, i = map(int, line.split())
                out.setdefault(e, []).append(i)
    return out


def _events(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("before,after", [(2, 1), (1, 3)])
def test_resume_on_another_world_size_is_sample_exact(mp, tmp_path, trainer_env, before, after):
    script = tmp_path / "logging_trainer.py"
    script.write_text(LOGGING_TRAINER)
    logs, ckpt = tmp_path / "samples", tmp_path / "ckpt"
    logs.mkdir()
    env = dict(trainer_env, SAMPLE_LOG_DIR=str(logs))
    args = [*mp.TINY, "--fake-size", str(N), "--batch-size", str(BATCH), "--epochs",
            str(EPOCHS), "--checkpoint-dir", str(ckpt), "--log-format", "json",
            "--checkpoint-every", "0"]
    first = mp.run(mp.torchrun(before, str(script), *args, "--max-steps", str(FIRST_STEPS)),
                   env, timeout=100)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    saved = checkpoint.read(checkpoint.latest_checkpoint(str(ckpt)))
    assert saved["step"] == FIRST_STEPS and saved["epoch"] == 0

    second = mp.run(mp.torchrun(after, str(script), *args), env, timeout=100)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    events = _events(second.stdout)
    # The rest of epoch 1 and all of epoch 2, counted with the new gang's shards.
    rest = ceil((N - FIRST_STEPS * BATCH * before) / after)  # samples per rank, epoch 1
    total = FIRST_STEPS + ceil(rest / BATCH) + ceil(ceil(N / after) / BATCH)
    assert events[0]["event"] == "start" and events[0]["total_steps"] == total
    progress = [e for e in events if e["event"] == "progress"]
    assert max(e["epoch"] for e in progress) == EPOCHS
    assert {e["epochs"] for e in progress} == {EPOCHS}
    assert events[-1]["event"] == "done" and events[-1]["step"] == total

    seen = _seen(logs)
    assert sorted(seen) == [0, 1]
    for epoch, padding_limit in ((0, after), (1, after)):
        counts = Counter(seen[epoch])
        assert set(counts) == set(range(N)), f"epoch {epoch}: samples never seen"
        duplicates = sum(c - 1 for c in counts.values())
        assert duplicates < padding_limit and max(counts.values()) <= 2, counts
    assert saved.get("samples_in_epoch") == FIRST_STEPS * BATCH * before
    # In the interrupted epoch the duplicates are the padding of the new gang's last shards.
    assert len(seen[0]) == FIRST_STEPS * BATCH * before + rest * after
