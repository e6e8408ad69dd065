"""Evaluation on the test split: every rank a disjoint shard, the counts summed across ranks.

DistributedSampler pads the shards to equal length by repeating samples, which is right for
training (every rank must do the same number of steps) and wrong for counting: a repeated
sample would be counted twice. Here each rank takes every world_size-th sample, no padding,
and runs the plain module (not the DDP wrapper, whose forward may talk to the other ranks), so
shards of unequal length need no lockstep; one all-reduce of (correct, samples, loss sum) at
the end gives every rank the exact counts over the whole test split.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from .config import TrainConfig
from .data import batch_to_device, ignore_termination_signals
from .distributed import DistContext


class ShardSampler(Sampler[int]):
    """Rank r of W gets samples r, r + W, r + 2W, ...: disjoint, together exactly once each."""

    def __init__(self, length: int, num_replicas: int, rank: int):
        self.indices = range(rank, length, num_replicas)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True)
class EvalResult:
    correct: int
    samples: int
    loss: float
    """Mean cross-entropy over the test samples."""
    seconds: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.samples if self.samples else 0.0


class Evaluator:
    def __init__(self, config: TrainConfig, ctx: DistContext, dataset: Dataset, bf16: bool,
                 channels_last: bool):
        self.ctx, self.bf16, self.channels_last = ctx, bf16, channels_last
        self.length = len(dataset)  # type: ignore[arg-type]
        workers = config.num_workers
        pin = config.pin_memory if config.pin_memory is not None else ctx.device.type == "cuda"
        self.loader = DataLoader(
            dataset, batch_size=config.batch_size,
            sampler=ShardSampler(self.length, ctx.world_size, ctx.rank), num_workers=workers,
            pin_memory=pin, persistent_workers=workers > 0,
            # Like the training loader's: a SIGTERM to the process group must not kill them
            # before the rank has stopped and saved.
            worker_init_fn=ignore_termination_signals if workers > 0 else None)

    def _autocast(self):
        if self.bf16:
            return torch.autocast(device_type=self.ctx.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def run(self, model: nn.Module) -> EvalResult:
        """Collective: every rank calls it with the same model (the unwrapped module)."""
        started = time.perf_counter()
        device = self.ctx.device
        if self.ctx.distributed:
            # DDP broadcasts rank 0's buffers before each forward, then every rank updates its
            # own (BatchNorm running statistics): evaluate rank 0's, the ones it checkpoints.
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)
        # float64 holds the counts exactly (up to 2**53) and is all-reduced in one call.
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # correct, samples, loss
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode(), self._autocast():
                for batch in self.loader:
                    x, y = batch_to_device(batch, device, self.channels_last)
                    logits = model(x).float()
                    sums[0] += (logits.argmax(dim=1) == y).sum()
                    sums[1] += y.numel()
                    sums[2] += nn.functional.cross_entropy(logits, y, reduction="sum")
        finally:
            model.train(was_training)
        if self.ctx.distributed:
            dist.all_reduce(sums)
        correct, samples, loss_sum = sums.tolist()
        return EvalResult(correct=int(correct), samples=int(samples),
                          loss=loss_sum / samples if samples else float("nan"),
                          seconds=time.perf_counter() - started)
