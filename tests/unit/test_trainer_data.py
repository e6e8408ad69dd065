"""Data: torchvision's real MNIST and CIFAR-10 readers on tiny files in the real formats."""
from __future__ import annotations

import hashlib
from collections import Counter

import pytest
import torch
import torchvision

from ddpjob.contract import ExitCode
from ddptrainer import data as data_mod
from ddptrainer.config import parse_config
from ddptrainer.data import ResumableDistributedSampler, build_dataset, build_loader
from ddptrainer.distributed import DistContext
from ddptrainer.errors import DataMissingError
from tests.support.datasets import write_cifar10, write_mnist

pytestmark = pytest.mark.unit

SINGLE = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"),
                     backend=None)


def md5(path):
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def cifar_root(tmp_path, monkeypatch):
    """Tiny CIFAR-10 files, and torchvision told their md5s (it verifies every file against
    the published checksums, which only the real 170 MB archive has)."""
    root = write_cifar10(tmp_path / "data")
    folder = root / "cifar-10-batches-py"
    cls = torchvision.datasets.CIFAR10
    monkeypatch.setattr(cls, "train_list", [[n, md5(folder / n)] for n, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[n, md5(folder / n)] for n, _ in cls.test_list])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5(folder / "batches.meta")})
    return root


def test_mnist_from_idx_files(tmp_path):
    root = write_mnist(tmp_path / "data", n_train=20, n_test=10)
    info = build_dataset(parse_config(["--dataset", "mnist", "--data-dir", str(root)], {}),
                         SINGLE)
    assert (info.in_channels, info.num_classes, len(info.dataset)) == (1, 10, 20)
    x, y = info.dataset[3]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and y == 3


def test_cifar10_from_python_batches(cifar_root):
    info = build_dataset(parse_config(["--dataset", "cifar10", "--data-dir", str(cifar_root)],
                                      {}), SINGLE)
    assert (info.in_channels, info.num_classes, len(info.dataset)) == (3, 10, 20)
    x, y = info.dataset[11]
    assert x.shape == (3, 32, 32) and y == 11 % 4 % 10


def test_fake_data_needs_no_files(tmp_path):
    config = parse_config(["--data-dir", str(tmp_path / "nothing"), "--fake-size", "5",
                           "--image-size", "12", "--num-classes", "3"], {})
    info = build_dataset(config, SINGLE)
    assert (info.in_channels, info.num_classes, len(info.dataset)) == (3, 3, 5)
    assert info.dataset[0][0].shape == (3, 12, 12)


@pytest.mark.parametrize("dataset,folder", [("mnist", "MNIST/raw"),
                                            ("cifar10", "cifar-10-batches-py")])
def test_missing_data_names_the_folder_and_how_to_provide_it(tmp_path, dataset, folder):
    config = parse_config(["--dataset", dataset, "--data-dir", str(tmp_path)], {})
    with pytest.raises(DataMissingError) as err:
        build_dataset(config, SINGLE)
    msg = err.value.message
    assert err.value.exit_code == ExitCode.DATA_MISSING
    assert msg.startswith("--data-dir:") and str(tmp_path / folder) in msg
    assert "--download" in msg and "missing:" in msg


def test_partly_present_mnist_lists_what_is_missing(tmp_path):
    root = write_mnist(tmp_path / "data", n_train=20, n_test=10)
    (root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataMissingError, match=r"\(missing: t10k-labels-idx1-ubyte\)"):
        build_dataset(parse_config(["--dataset", "mnist", "--data-dir", str(root)], {}), SINGLE)


def test_corrupted_cifar_is_data_missing_not_a_traceback(tmp_path):
    root = write_cifar10(tmp_path / "data")  # checksums do not match the published ones
    with pytest.raises(DataMissingError, match="corrupted"):
        build_dataset(parse_config(["--dataset", "cifar10", "--data-dir", str(root)], {}),
                      SINGLE)


def test_failed_download_is_reported_with_the_missing_data(tmp_path, monkeypatch):
    def offline(config, download):
        raise RuntimeError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(data_mod, "_build", offline)
    config = parse_config(["--dataset", "mnist", "--data-dir", str(tmp_path), "--download"], {})
    with pytest.raises(DataMissingError, match="the download failed: <urlopen error"):
        build_dataset(config, SINGLE)


def test_sampler_shards_are_disjoint_and_change_with_the_epoch():
    dataset = list(range(40))
    samplers = [ResumableDistributedSampler(dataset, num_replicas=4, rank=r, seed=7)
                for r in range(4)]
    seen = {}
    for epoch in (0, 1):
        shards = []
        for s in samplers:
            s.set_epoch(epoch)
            shards.append(list(s))
        assert sorted(i for shard in shards for i in shard) == dataset
        seen[epoch] = shards
    assert seen[0] != seen[1]


def test_sampler_resumes_mid_epoch():
    dataset = list(range(30))
    s = ResumableDistributedSampler(dataset, num_replicas=2, rank=1, seed=0)
    s.set_epoch(3)
    full = list(s)
    s.set_epoch(3, start=16)  # 8 samples per rank done: 16 of the gang's
    assert list(s) == full[8:] and len(s) == 7
    s.set_epoch(4)  # the start applies to one epoch only
    assert len(s) == 15


@pytest.mark.parametrize("n", [30, 31, 50])
def test_sampler_order_is_distributed_samplers_own(n):
    for world in (1, 2, 3, 4):
        for rank in range(world):
            ours = ResumableDistributedSampler(list(range(n)), num_replicas=world, rank=rank,
                                               seed=3)
            theirs = torch.utils.data.DistributedSampler(list(range(n)), num_replicas=world,
                                                         rank=rank, shuffle=True, seed=3)
            ours.set_epoch(2)
            theirs.set_epoch(2)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


def _gang_takes(n, world, batch, steps, start, epoch=1):
    """The samples a gang of ``world`` ranks trains on in ``steps`` batches from ``start``."""
    taken = []
    for rank in range(world):
        s = ResumableDistributedSampler(list(range(n)), num_replicas=world, rank=rank, seed=0)
        s.set_epoch(epoch, start=start)
        taken += list(s)[:steps * batch]
    return taken


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2), (2, 3), (3, 2), (4, 4)])
def test_a_resume_on_another_world_size_sees_every_sample_once(before, after):
    n, batch, steps = 50, 4, 3
    first = _gang_takes(n, before, batch, steps, start=0)
    start = steps * batch * before  # what the checkpoint stores
    rest = _gang_takes(n, after, batch, 10**6, start=start)
    seen = first + rest
    assert set(seen) == set(range(n))  # every sample of the epoch ...
    padding = len(seen) - n
    assert 0 <= padding < after  # ... once, but for the padding of the last shards
    assert max(Counter(seen).values()) <= 2


def test_loader_batches(tmp_path):
    config = parse_config(["--fake-size", "10", "--batch-size", "4", "--num-workers", "0"], {})
    loader, sampler = build_loader(config, SINGLE, build_dataset(config, SINGLE))
    sizes = [x.shape[0] for x, _ in loader]
    assert sizes == [4, 4, 2] and data_mod.steps_per_epoch(sampler, 4) == 3
