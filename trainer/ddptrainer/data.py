"""Data sets (torchvision MNIST, CIFAR-10, FakeData), the sharding sampler and the loader.

Downloading, when allowed, happens once per node (local rank 0) behind a barrier; with no data
and no download the error names the folder, the files expected there and how to provide them
(exit 3, permanent: a restart cannot make the files appear).

No random augmentation: the order of samples is the only randomness, and it comes from the
DistributedSampler's (seed, epoch). That keeps "N steps straight" and "N/2, crash, resume N/2"
identical, which the tests check.
"""
from __future__ import annotations

import math
import os
import signal
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision import datasets, transforms

from .config import TrainConfig
from .distributed import DistContext, barrier
from .text import first_line
from .errors import DataMissingError

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")

_NORMALIZE = {
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


@dataclass(frozen=True)
class DataInfo:
    dataset: Dataset
    in_channels: int
    num_classes: int
    test_dataset: Optional[Dataset] = None
    """The test split (MNIST t10k, CIFAR-10 test_batch); None for FakeData or --eval-every 0."""


def expected_files(config: TrainConfig) -> tuple[str, list[str]]:
    """The folder torchvision reads and the files it needs there."""
    root = os.path.abspath(config.data_dir)
    if config.dataset == "mnist":
        return os.path.join(root, "MNIST", "raw"), list(MNIST_FILES)
    if config.dataset == "cifar10":
        return os.path.join(root, CIFAR10_FOLDER), list(CIFAR10_FILES)
    return root, []


def _missing_message(config: TrainConfig, folder: str, missing: list[str],
                     download_error: Optional[str]) -> str:
    how = {
        "mnist": "the four uncompressed idx files of http://yann.lecun.com/exdb/mnist/",
        "cifar10": "the unpacked 'CIFAR-10 python version' archive "
                   "(https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz)",
    }[config.dataset]
    msg = (f"--data-dir: {config.dataset} not found in {folder} (missing: {', '.join(missing)}); "
           f"put {how} there (e.g. a mounted volume), or pass --download where the network "
           "is reachable")
    if download_error:
        msg += f"; the download failed: {download_error}"
    return msg


class ClassTinted(Dataset):
    """FakeData with each image's class colour added (--fake-signal): the labels FakeData draws
    at random become a function of the image, so a model can learn them and the loss falls, in
    an example that needs no files. The colours are fixed by the seed, the same on every rank."""

    def __init__(self, base: Dataset, num_classes: int, strength: float, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.base = base
        self.tints = (torch.rand(num_classes, 3, 1, 1, generator=generator) * 2 - 1) * strength

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        image, target = self.base[index]
        return image + self.tints[target], target


def _build(config: TrainConfig, download: bool, train: bool = True) -> Dataset:
    root = config.data_dir
    if config.dataset == "fake":
        fake = datasets.FakeData(
            size=config.fake_size, image_size=(3, config.image_size, config.image_size),
            num_classes=config.num_classes, transform=transforms.ToTensor(),
            random_offset=config.seed)
        return ClassTinted(fake, config.num_classes, config.fake_signal, config.seed) if config.fake_signal else fake
    mean, std = _NORMALIZE[config.dataset]
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])
    if config.dataset == "mnist":
        return datasets.MNIST(root, train=train, transform=tf, download=download)
    return datasets.CIFAR10(root, train=train, transform=tf, download=download)


def build_dataset(config: TrainConfig, ctx: DistContext) -> DataInfo:
    download_error = None
    if config.download and config.dataset != "fake":
        if ctx.local_rank == 0:
            try:
                _build(config, download=True)
            except Exception as e:  # no network: report it below, after the barrier
                download_error = first_line(e)
        # Everyone waits for the node's download, even when it failed: a rank that raised
        # here alone would leave the others in the barrier until the collective timeout.
        barrier(ctx)
    folder, needed = expected_files(config)
    missing = [name for name in needed if not os.path.isfile(os.path.join(folder, name))]
    if missing:
        raise DataMissingError(_missing_message(config, folder, missing, download_error))
    try:
        ds = _build(config, download=False)
        # FakeData has no test split (and random labels: an accuracy would mean nothing).
        evaluate = config.eval_every > 0 and config.dataset != "fake"
        test = _build(config, download=False, train=False) if evaluate else None
    except RuntimeError as e:  # torchvision: files there but corrupted (CIFAR md5 check)
        raise DataMissingError(f"--data-dir: {config.dataset} in {folder} is unreadable or "
                               f"corrupted ({first_line(e)}); replace the files") from e
    except (OSError, ValueError, TypeError, AssertionError) as e:
        raise DataMissingError(f"--data-dir: {config.dataset} in {folder} could not be read: "
                               f"{first_line(e)}") from e
    if config.dataset == "fake":
        return DataInfo(ds, in_channels=3, num_classes=config.num_classes)
    return DataInfo(ds, in_channels=1 if config.dataset == "mnist" else 3, num_classes=10,
                    test_dataset=test)


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way, with any number of ranks.

    An epoch is one global order of the samples: a permutation that depends on (seed, epoch)
    only, never on the world size. DistributedSampler deals it out round-robin (rank r gets
    positions r, r + W, ...), so after k batches of B on every rank the gang has consumed
    exactly the first k * B * W positions of that order. ``set_epoch(epoch, start=P)`` deals
    out what is left, positions P onward, to this gang: a resume with the same world size gets
    exactly the rest of its shards, one with another world size still sees every remaining
    sample once. Padding (a shard count that does not divide the rest) repeats samples from
    the head of the order, as DistributedSampler does; with ``start=0`` the order is
    DistributedSampler's own.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed,
                         drop_last=False)
        self.dataset_len = len(dataset)  # type: ignore[arg-type]
        self._start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:  # type: ignore[override]
        """``start``: samples of this epoch the gang (of any size) has already consumed."""
        super().set_epoch(epoch)
        self._start = max(0, min(start, self.dataset_len))

    def global_order(self) -> list[int]:
        """This epoch's order of all samples (the same for every world size)."""
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_len, generator=g).tolist()

    def _rest(self) -> int:
        return self.dataset_len - self._start

    def __iter__(self) -> Iterator[int]:
        order = self.global_order()
        rest = order[self._start:]
        padding = -len(rest) % self.num_replicas
        if rest and padding:
            head = order * math.ceil(padding / len(order))
            rest += head[:padding]
        return iter(rest[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return math.ceil(self._rest() / self.num_replicas)


def ignore_termination_signals(_worker_id: int) -> None:
    # torchrun delivers SIGTERM to the worker's whole process group, loader workers included.
    # A loader worker dying of it would crash the step the rank is trying to finish before it
    # saves; the rank shuts its workers down itself on exit.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_loader(config: TrainConfig, ctx: DistContext, data: DataInfo
                 ) -> tuple[DataLoader, ResumableDistributedSampler]:
    sampler = ResumableDistributedSampler(data.dataset, num_replicas=ctx.world_size,
                                          rank=ctx.rank, seed=config.seed)
    pin = config.pin_memory if config.pin_memory is not None else ctx.device.type == "cuda"
    workers = config.num_workers
    loader = DataLoader(
        data.dataset, batch_size=config.batch_size, sampler=sampler, num_workers=workers,
        pin_memory=pin, drop_last=False, persistent_workers=workers > 0,
        worker_init_fn=ignore_termination_signals if workers > 0 else None,
        prefetch_factor=4 if workers > 0 else None,
    )
    return loader, sampler


def steps_per_epoch(sampler: ResumableDistributedSampler, batch_size: int) -> int:
    """Batches per rank in a whole epoch: the same on every rank (the sampler pads)."""
    return math.ceil(math.ceil(sampler.dataset_len / sampler.num_replicas) / batch_size)


def steps_left_in_epoch(sampler: ResumableDistributedSampler, batch_size: int,
                        start: int) -> int:
    """Batches per rank that finish an epoch of which ``start`` samples are already done."""
    rest = max(0, sampler.dataset_len - start)
    return math.ceil(math.ceil(rest / sampler.num_replicas) / batch_size)


def batch_to_device(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device,
                    channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch
    non_blocking = device.type == "cuda"
    x = x.to(device, non_blocking=non_blocking)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y.to(device, non_blocking=non_blocking)
