"""The training loop: steps, epochs, logging windows, checkpoints, resume and preemption.

The step count is global and survives restarts. Progress within an epoch is kept in samples,
not steps: a checkpoint stores (epoch, samples of the epoch consumed by the whole gang, step),
and a resumed run, of any world size or batch size, deals out the rest of that epoch's sample
order (data.ResumableDistributedSampler). So "N steps straight" and "N/2 steps, crash, resume,
N/2 steps" see the same batches in the same order, and a resume on fewer or more ranks sees
every remaining sample of the epoch once and stops after --epochs.

Host-device synchronisation happens on log steps only: the loss is accumulated as a tensor
and averaged across ranks (one all-reduce, one ``.item()``) every ``--log-every`` steps.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from . import checkpoint
from .config import TrainConfig
from .data import (DataInfo, batch_to_device, build_loader, steps_left_in_epoch,
                   steps_per_epoch)
from .distributed import DistContext, barrier
from .errors import ConfigError, Preempted
from .evaluate import EvalResult, Evaluator
from .models import build_model
from .preemption import StopAgreement, StopRequest
from .progress import Progress, eta_seconds
from .report import report_progress


@dataclass
class TrainResult:
    step: int
    total_steps: int
    loss: Optional[float]
    checkpoint: Optional[str]
    elapsed_seconds: float
    evaluation: Optional[EvalResult] = None
    """The final model on the test split (None when there is none or --eval-every 0)."""


def _compatibility(config: TrainConfig, data: DataInfo) -> dict:
    """What a checkpoint must match to be resumable by this run."""
    return {"model": config.model, "dataset": config.dataset, "in_channels": data.in_channels,
            "num_classes": data.num_classes, "optimizer": config.optimizer}


class Trainer:
    def __init__(self, config: TrainConfig, ctx: DistContext, data: DataInfo,
                 progress: Progress, stop: StopRequest):
        self.config, self.ctx, self.data, self.progress = config, ctx, data, progress
        torch.manual_seed(config.seed)  # same initial weights everywhere (DDP also broadcasts)
        model, notes = build_model(config.model, data.in_channels, data.num_classes,
                                   config.weights)
        self.notes = list(notes)  # printed after the start line, which must come first
        # Default: on a GPU only. On CPU it is 1.1x faster here but not the same numbers: the losses
        # differ by 2% after 10 steps (benchmarks/trainer_flops.py), so it is asked for, not imposed.
        self.channels_last = config.model.startswith("resnet") and (
            config.channels_last if config.channels_last is not None else ctx.device.type == "cuda")
        model = model.to(ctx.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.optimizer = self._build_optimizer(model)
        self.loader, self.sampler = build_loader(config, ctx, data)
        self.steps_per_epoch = steps_per_epoch(self.sampler, config.batch_size)
        self.bf16 = config.precision == "bf16" or (
            config.precision == "auto" and ctx.device.type == "cuda")
        self.loss_fn = nn.CrossEntropyLoss()
        # epoch_samples: samples of the current epoch the gang has consumed (all ranks).
        self.epoch, self.epoch_samples, self.step = 0, 0, 0
        self.last_saved_step: Optional[int] = None
        self.last_checkpoint: Optional[str] = None
        self.last_loss: Optional[float] = None
        self.last_throughput: Optional[float] = None  # samples per second, last log window
        # What a periodic checkpoint costs the training loop (the gather and rank 0's host copy;
        # the write runs in the background) and how far apart they are, both in seconds: the
        # operator's checkpoint-interval advice (Young/Daly) reads them from the reports.
        self.checkpoint_seconds: Optional[float] = None
        self.checkpoint_interval_seconds: Optional[float] = None
        self._last_periodic_save: Optional[float] = None
        self.resumed_from: Optional[str] = None
        self.writer = checkpoint.BackgroundWriter()
        problem, newest = checkpoint.prepare_folder(ctx, config.checkpoint_dir, config.owner,
                                                    config.adopt_checkpoints)
        if problem:
            raise ConfigError(f"--checkpoint-dir: {problem}")
        if newest and not config.resume:
            # Starting over next to an older run's higher steps would make a later resume
            # pick the old run's files (the newest checkpoint is the highest step).
            raise ConfigError(f"--no-resume: {config.checkpoint_dir} already holds checkpoints "
                              f"(newest {os.path.basename(newest)}); start from scratch in an "
                              "empty --checkpoint-dir, or delete them")
        if newest:
            self._resume()
        self.total_steps = self._plan_total_steps()
        # Wrap after loading: DDP broadcasts rank 0's parameters at construction anyway.
        self.ddp: nn.Module = (DDP(model, device_ids=[ctx.device.index]
                                   if ctx.device.type == "cuda" else None)
                               if ctx.distributed else model)
        if config.compile:  # after DDP: its bucketing splits the graph where all-reduces go
            self.ddp = torch.compile(self.ddp)
        self.stop = StopAgreement(ctx, stop)
        self.evaluator = (Evaluator(config, ctx, data.test_dataset, self.bf16,
                                    self.channels_last)
                          if data.test_dataset is not None and config.eval_every else None)
        self.last_eval: Optional[tuple[int, EvalResult]] = None  # (step, result)

    def _build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        c = self.config
        if c.optimizer == "adam":
            return torch.optim.Adam(model.parameters(), lr=c.lr, weight_decay=c.weight_decay)
        return torch.optim.SGD(model.parameters(), lr=c.lr, momentum=c.momentum,
                               weight_decay=c.weight_decay)

    # ------------------------------------------------------------------ checkpoints
    def _resume(self) -> None:
        found = checkpoint.find_resumable(self.ctx, self.config.checkpoint_dir,
                                          self.config.owner, self.config.adopt_checkpoints)
        self.notes.extend(found.notes)
        if found.path is None:
            return  # the files went between the listing and now: start from scratch
        path = found.path
        state = checkpoint.load(self.ctx, path, found.state)
        want = _compatibility(self.config, self.data)
        have = state.get("compat", {})
        if have != want:
            diff = ", ".join(f"{k} {have.get(k)!r} (now {v!r})" for k, v in want.items()
                             if have.get(k) != v)
            raise ConfigError(f"--checkpoint-dir: {path} is from another run ({diff}); use "
                              "another --checkpoint-dir or --no-resume")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.epoch_samples = checkpoint.samples_in_epoch(state, self.config.batch_size)
        saved_world = int(state["world_size"])
        saved_batch = int(state.get("batch_size", self.config.batch_size))
        if saved_world == self.ctx.world_size and saved_batch == self.config.batch_size:
            checkpoint.restore_rng(state["rng"][self.ctx.rank], self.ctx.device)
        # else: nothing to restore per rank (another gang); the data order does not need it.
        if self.epoch_samples >= self.sampler.dataset_len:
            self.epoch, self.epoch_samples = self.epoch + 1, 0
        self.last_saved_step, self.last_checkpoint = self.step, path
        self.last_loss = state.get("loss")
        self.resumed_from = (f"{path} at step={self.step} (epoch {self.epoch + 1}, "
                             f"{self.epoch_samples}/{self.sampler.dataset_len} samples done; "
                             f"saved by world_size={saved_world}, now {self.ctx.world_size})")

    def _plan_total_steps(self) -> int:
        """The global step at which training ends: what is left of this epoch and the later
        ones, counted with this gang's world size and batch size (which may differ from those
        of the run that wrote the checkpoint), capped by --max-steps."""
        c = self.config
        left = 0
        if self.epoch < c.epochs:
            left = (steps_left_in_epoch(self.sampler, c.batch_size, self.epoch_samples)
                    + (c.epochs - self.epoch - 1) * self.steps_per_epoch)
        total = self.step + left
        return min(total, c.max_steps) if c.max_steps else total

    def _save(self, blocking: bool = False) -> str:
        """Periodic saves write in the background; the final and SIGTERM ones block."""
        if self.last_saved_step == self.step:
            if blocking:
                checkpoint.flush(self.ctx, self.writer)
            return self.last_checkpoint or ""
        state = {"step": self.step, "epoch": self.epoch, "samples_in_epoch": self.epoch_samples,
                 "batch_size": self.config.batch_size, "loss": self.last_loss,
                 "compat": _compatibility(self.config, self.data),
                 "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        path = checkpoint.save(self.ctx, self.config.checkpoint_dir,
                               self.config.keep_checkpoints, state, self.writer, blocking,
                               self.config.owner)
        self.last_saved_step, self.last_checkpoint = self.step, path
        return path

    # ------------------------------------------------------------------ steps
    def _autocast(self):
        if self.bf16:
            return torch.autocast(device_type=self.ctx.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _run_batch(self, batch) -> torch.Tensor:
        x, y = batch_to_device(batch, self.ctx.device, self.channels_last)
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            loss = self.loss_fn(self.ddp(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _mean_loss(self, window_sum: torch.Tensor, window_steps: int) -> float:
        """The window's loss averaged over its steps and over all ranks (a sync point)."""
        total = (window_sum / window_steps).float()
        if self.ctx.distributed:
            dist.all_reduce(total)  # default group: on the GPU for NCCL
            total = total / self.ctx.world_size
        return float(total.item())

    def _evaluate(self) -> Optional[EvalResult]:
        """Collective: the model on the test split, logged; skipped if done at this step."""
        if self.evaluator is None:
            return None
        if self.last_eval is None or self.last_eval[0] != self.step:
            result = self.evaluator.run(self.model)
            self.last_eval = (self.step, result)
            self.progress.emit(
                "eval", epoch=self.epoch if self.epoch_samples == 0 else self.epoch + 1,
                epochs=self.config.epochs, step=self.step, total_steps=self.total_steps,
                accuracy=round(result.accuracy, 6), correct=result.correct,
                samples=result.samples, eval_loss=round(result.loss, 6),
                eval_seconds=round(result.seconds, 2))
        return self.last_eval[1]

    # ------------------------------------------------------------------ the loop
    def _report(self, force: bool = False) -> None:
        """This rank's progress for the operator (docs/contract.md, "Progress")."""
        report_progress(self.step, self.total_steps, epoch=self.epoch + 1, epochs=self.config.epochs,
                        loss=self.last_loss, throughput=self.last_throughput, force=force,
                        checkpoint_seconds=self.checkpoint_seconds,
                        checkpoint_interval_seconds=self.checkpoint_interval_seconds)

    def _periodic_save(self) -> None:
        """A --checkpoint-every save, timed: what it held the loop, and the time since the last."""
        began = time.perf_counter()
        self._save()  # rank 0 writes it in the background
        ended = time.perf_counter()
        self.checkpoint_seconds = round(ended - began, 4)
        if self._last_periodic_save is not None:
            self.checkpoint_interval_seconds = round(ended - self._last_periodic_save, 3)
        self._last_periodic_save = ended

    def run(self, startup: Optional[dict[str, float]] = None) -> TrainResult:
        """Train to the end (or a stop); ``startup``: the start-up phases' seconds, for the
        start line (startup.py)."""
        c, ctx = self.config, self.ctx
        started = time.perf_counter()
        self.progress.start(
            world_size=ctx.world_size, backend=ctx.backend or "none", device=str(ctx.device),
            model=c.model, dataset=c.dataset, batch_size=c.batch_size,
            global_batch_size=c.batch_size * ctx.world_size,
            precision="bf16" if self.bf16 else "fp32", step=self.step,
            total_steps=self.total_steps, steps_per_epoch=self.steps_per_epoch, **(startup or {}))
        for note in self.notes:
            self.progress.note(note)
        if self.resumed_from:
            self.progress.note(f"resumed from {self.resumed_from}")
        if self.step >= self.total_steps:
            self.progress.note(f"nothing left to train: step={self.step} >= "
                               f"total_steps={self.total_steps}")
        self._report(force=True)  # the first report: every rank got through init
        window_sum = torch.zeros((), device=ctx.device)
        window_steps, data_wait = 0, 0.0
        window_start = time.perf_counter()
        while self.step < self.total_steps:
            if self.epoch >= c.epochs:
                break
            self.sampler.set_epoch(self.epoch, start=self.epoch_samples)
            batches = iter(self.loader)
            while self.step < self.total_steps:
                if self.stop.poll():
                    self._preempted()
                t0 = time.perf_counter()
                batch = next(batches, None)
                data_wait += time.perf_counter() - t0
                if batch is None:
                    break
                window_sum += self._run_batch(batch)
                window_steps += 1
                self.step += 1
                # Every rank's batch has the same size (the sampler pads the shards equally).
                self.epoch_samples += len(batch[1]) * ctx.world_size
                log_step = self.step % c.log_every == 0 or self.step == self.total_steps
                if not log_step:  # every rank, throttled: the operator's stall detection
                    self._report()
                if log_step:
                    self.last_loss = self._mean_loss(window_sum, window_steps)
                    now = time.perf_counter()
                    per_step = (now - window_start) / window_steps
                    self.progress.progress(
                        epoch=self.epoch + 1, epochs=c.epochs, step=self.step,
                        total_steps=self.total_steps, loss=self.last_loss,
                        images_per_sec=c.batch_size * ctx.world_size / per_step,
                        eta_seconds=eta_seconds(self.total_steps - self.step, per_step),
                        world_size=ctx.world_size,
                        data_wait_fraction=data_wait / max(now - window_start, 1e-9))
                    self.last_throughput = c.batch_size * ctx.world_size / per_step
                    self._report(force=True)
                    window_sum.zero_()
                    window_steps, data_wait, window_start = 0, 0.0, time.perf_counter()
                if c.checkpoint_every and self.step % c.checkpoint_every == 0:
                    self._periodic_save()
            # The shards are dealt out from the epoch's order, so the gang has consumed a
            # prefix of it: the epoch is over once that prefix covers every sample.
            if self.epoch_samples >= self.sampler.dataset_len:
                self.epoch, self.epoch_samples = self.epoch + 1, 0
                if c.eval_every and self.epoch % c.eval_every == 0:
                    self._evaluate()
                if self.step < self.total_steps:
                    self._save()  # epoch end
        if window_steps:  # the loop ended off a log step (cannot happen today; be safe)
            self.last_loss = self._mean_loss(window_sum, window_steps)
        path = self._save(blocking=True)
        evaluation = self._evaluate()  # the final model, unless its epoch end just did
        self._finish()
        return TrainResult(step=self.step, total_steps=self.total_steps, loss=self.last_loss,
                           checkpoint=path or None,
                           elapsed_seconds=time.perf_counter() - started,
                           evaluation=evaluation)

    def _finish(self) -> None:
        """Every rank's last collective: after it no rank still talks to another, so tearing
        the groups down cannot cut a peer off mid-message (the final save ends in a broadcast
        from rank 0, which rank 0 can leave before the others have read it)."""
        self.stop.drain()
        barrier(self.ctx)

    def _preempted(self):
        signum = self.stop.agreed_signum or 15
        path = self._save(blocking=True)
        self._finish()
        raise Preempted(f"stopped by signal {signum} at step={self.step}/{self.total_steps}; "
                        f"checkpoint {path} saved", signum)
