"""The trainer's configuration: one frozen, validated object built from flags and environment.

Every check names the flag it is about, so a bad value ends in one line on stderr,
``ddptrain: error: --lr: must be a number > 0``, and exit code 2 (bad configuration), never a
traceback. argparse's own complaints (unknown flag, bad choice) are turned into the same one
line. Environment variables supply defaults only where a pod sets them (device, folders,
termination-message path); a flag always wins.
"""
from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ddpjob import contract

from .errors import ConfigError
from .ownership import Owner, from_environment

MODELS = ("tiny-cnn", "resnet18", "resnet34", "resnet50", "resnet101")
DATASETS = ("fake", "mnist", "cifar10")
OPTIMIZERS = ("sgd", "adam")
DEVICES = ("auto", "cpu", "gpu")  # "gpu" is the operator's word (spec.device); "cuda" is an alias
BACKENDS = ("auto", "gloo", "nccl")
PRECISIONS = ("auto", "fp32", "bf16")
LOG_FORMATS = ("text", "json")

# The trainer's own environment variables (the operator does not set them; users may).
ENV_DATA_DIR = "DDPTRAINER_DATA_DIR"
ENV_CHECKPOINT_DIR = "DDPTRAINER_CHECKPOINT_DIR"

FAKE_DEFAULT_SIZE = 4096
FAKE_DEFAULT_IMAGE_SIZE = 32
FAKE_DEFAULT_CLASSES = 10


@dataclass(frozen=True)
class TrainConfig:
    """What to train, on what, and how. Built by :func:`parse_config`; checked on creation."""

    model: str = "resnet18"
    """One of MODELS. ResNets are torchvision's, built without downloading weights."""
    weights: Optional[str] = None
    """A local state_dict file to start from (tensors whose shapes fit are loaded)."""
    dataset: str = "fake"
    """One of DATASETS. ``fake`` is torchvision's FakeData: needs no files."""
    data_dir: str = "./data"
    """Root folder of the data set (a mounted volume in a pod)."""
    download: bool = False
    """Download MNIST/CIFAR-10 when absent: once per node, by local rank 0."""
    fake_size: int = FAKE_DEFAULT_SIZE
    """FakeData: number of samples."""
    image_size: int = FAKE_DEFAULT_IMAGE_SIZE
    """FakeData: images are 3 x image_size x image_size."""
    num_classes: int = FAKE_DEFAULT_CLASSES
    """FakeData: number of classes (MNIST and CIFAR-10 have 10)."""
    fake_signal: float = 0.0
    """FakeData: each image gets its class's colour added, this strong (0 to 1): its random
    labels become learnable, so the loss falls (0: torchvision's FakeData as it is)."""
    batch_size: int = 64
    """Samples per step per rank."""
    epochs: int = 1
    """Passes over the data set."""
    max_steps: int = 0
    """Stop after this many optimizer steps in all (0: no limit besides epochs)."""
    eval_every: int = 1
    """Evaluate on the test split every this many epochs and at the end (0: never).
    FakeData has no test split: never evaluated."""
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    """SGD only."""
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "auto"
    """auto (a GPU if one is visible), cpu, or gpu (cuda:LOCAL_RANK; an error if absent)."""
    backend: str = "auto"
    """auto (nccl on GPU, gloo on CPU), gloo or nccl."""
    precision: str = "auto"
    """auto (bf16 autocast on GPU, fp32 on CPU), fp32 or bf16."""
    num_workers: int = 2
    """DataLoader worker processes per rank."""
    pin_memory: Optional[bool] = None
    """None: on when training on a GPU."""
    cpu_threads: int = 0
    """torch intra-op threads per rank (0: torch's default; torchrun sets 1 with several ranks)."""
    channels_last: Optional[bool] = None
    """Channels-last memory format for the model and batches (ResNets only). None: on a GPU only
    (on CPU no faster within the noise, 0.94x in the quiet run, and it changes the losses beyond
    rounding: benchmarks/trainer_flops.py)."""
    compile: bool = False
    """torch.compile the model (slow start: minutes on 2 CPU cores; benchmarks/trainer_flops.py)."""
    checkpoint_dir: str = "./checkpoints"
    """Where checkpoints are written and resumed from (a volume every node shares in a pod)."""
    checkpoint_every: int = 200
    """Also save every this many steps (0: only at epoch end, at the end, and on SIGTERM)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept; older ones are deleted after a save."""
    resume: bool = True
    """Resume from the newest checkpoint in checkpoint_dir, if any."""
    adopt_checkpoints: bool = False
    """Resume from another job's checkpoints when the folder holds none of this job's (the same
    job created again, a copied folder); by default such a folder is refused."""
    owner: Owner = Owner()
    """The job this process belongs to (DDPJOB_NAMESPACE, DDPJOB_NAME, DDPJOB_UID): whose its
    checkpoints are. Empty: a plain run outside any DDPJob."""
    log_every: int = 10
    """Progress line every this many steps (the loss is averaged across ranks only then)."""
    log_format: str = "text"
    collective_timeout_seconds: int = 600
    """Bound on a rendezvous and on any collective: a lost or hung peer ends in exit 13."""
    termination_log: Optional[str] = None
    """File for a one-line summary (Kubernetes termination message); None: the default path
    /dev/termination-log, written only if it already exists."""
    local_rank: Optional[int] = None
    """Legacy ``--local_rank`` of torch.distributed.launch; LOCAL_RANK in the environment wins."""

    def __post_init__(self) -> None:
        _choice("--model", self.model, MODELS)
        _choice("--dataset", self.dataset, DATASETS)
        _choice("--optimizer", self.optimizer, OPTIMIZERS)
        _choice("--device", self.device, DEVICES)
        _choice("--backend", self.backend, BACKENDS)
        _choice("--precision", self.precision, PRECISIONS)
        _choice("--log-format", self.log_format, LOG_FORMATS)
        _int_range("--fake-size", self.fake_size, 1)
        _int_range("--image-size", self.image_size, 8, 1024)
        _int_range("--num-classes", self.num_classes, 2, 100_000)
        _float_range("--fake-signal", self.fake_signal, low=0.0, high=1.0)
        _int_range("--batch-size", self.batch_size, 1, 65_536)
        _int_range("--epochs", self.epochs, 1)
        _int_range("--max-steps", self.max_steps, 0)
        _int_range("--eval-every", self.eval_every, 0)
        _float_range("--lr", self.lr, low=0.0, low_open=True)
        _float_range("--momentum", self.momentum, low=0.0, high=1.0, high_open=True)
        _float_range("--weight-decay", self.weight_decay, low=0.0)
        _int_range("--seed", self.seed, 0, 2**63 - 1)
        _int_range("--num-workers", self.num_workers, 0, 256)
        _int_range("--cpu-threads", self.cpu_threads, 0, 1024)
        _int_range("--checkpoint-every", self.checkpoint_every, 0)
        _int_range("--keep-checkpoints", self.keep_checkpoints, 1, 1000)
        _int_range("--log-every", self.log_every, 1)
        _int_range("--collective-timeout-seconds", self.collective_timeout_seconds, 1, 86_400)
        if self.local_rank is not None:
            _int_range("--local-rank", self.local_rank, 0, 1023)
        if not self.data_dir:
            raise ConfigError("--data-dir: must be a folder path, not empty")
        if not self.checkpoint_dir:
            raise ConfigError("--checkpoint-dir: must be a folder path, not empty")
        if self.backend == "nccl" and self.device == "cpu":
            raise ConfigError("--backend: nccl needs --device gpu (use gloo or auto on CPU)")


def _choice(flag: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{flag}: {value!r} is not one of {', '.join(allowed)}")


def _int_range(flag: str, value: int, low: int, high: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
        high is not None and value > high
    ):
        allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
        raise ConfigError(f"{flag}: must be {allowed}, got {value!r}")


def _float_range(flag: str, value: float, *, low: float, high: Optional[float] = None,
                 low_open: bool = False, high_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    if high is not None:
        ok = ok and (value < high if high_open else value <= high)
    if not ok:
        low_s = f"> {low:g}" if low_open else f">= {low:g}"
        high_s = "" if high is None else (f" and < {high:g}" if high_open else f" and <= {high:g}")
        raise ConfigError(f"{flag}: must be a finite number {low_s}{high_s}, got {value!r}")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but an error raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str):  # type: ignore[override]
        # argparse says "argument --lr: invalid float value: 'x'"; keep the flag first.
        if message.startswith("argument "):
            message = message[len("argument "):]
            flag, _, rest = message.partition(": ")
            message = f"{flag.split('/')[0]}: {rest}"
        raise ConfigError(message)


def _number(kind: type):
    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            word = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {word}, got {text!r}") from None

    return convert


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog="ddptrain",
        description="Train an image classifier with DistributedDataParallel. Run it under "
        "torchrun (or ddptrain-pod), or as a plain single process.",
        allow_abbrev=False,
    )
    num, flt = _number(int), _number(float)
    g = p.add_argument_group("model and data")
    g.add_argument("--model", choices=MODELS, default="resnet18")
    g.add_argument("--weights", metavar="PATH", help="local state_dict to start from")
    g.add_argument("--dataset", choices=DATASETS, default="fake")
    g.add_argument("--data-dir", metavar="DIR",
                   help=f"data set root (default: ${ENV_DATA_DIR} or ./data)")
    g.add_argument("--download", action="store_true",
                   help="download MNIST/CIFAR-10 if absent (local rank 0 of each node)")
    g.add_argument("--fake-size", type=num, help=f"FakeData samples (default {FAKE_DEFAULT_SIZE})")
    g.add_argument("--image-size", type=num,
                   help=f"FakeData image side (default {FAKE_DEFAULT_IMAGE_SIZE})")
    g.add_argument("--num-classes", type=num,
                   help=f"FakeData classes (default {FAKE_DEFAULT_CLASSES})")
    g.add_argument("--fake-signal", type=flt,
                   help="FakeData: add each image's class colour, this strong (0 to 1), so that the "
                   "labels can be learnt and the loss falls (default 0: pure noise)")
    g.add_argument("--num-workers", type=num, default=2, help="DataLoader workers per rank")
    g.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
                   help="pin host memory (default: on with a GPU)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--batch-size", type=num, default=64, help="per rank")
    g.add_argument("--epochs", type=num, default=1)
    g.add_argument("--max-steps", type=num, default=0, help="0: no limit besides --epochs")
    g.add_argument("--eval-every", type=num, default=1,
                   help="evaluate on the test split every N epochs and at the end (0: never)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd")
    g.add_argument("--lr", type=flt, default=0.05)
    g.add_argument("--momentum", type=flt, default=0.9, help="SGD only")
    g.add_argument("--weight-decay", type=flt, default=0.0)
    g.add_argument("--seed", type=num, default=0)
    g = p.add_argument_group("devices and processes")
    g.add_argument("--device",
                   help=f"auto, cpu or gpu (default: ${contract.DDPJOB_DEVICE} or auto)")
    g.add_argument("--backend", choices=BACKENDS, default="auto")
    g.add_argument("--precision", choices=PRECISIONS, default="auto")
    g.add_argument("--cpu-threads", type=num, default=0)
    g.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="channels-last memory format (default: on a GPU, for ResNets)")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (slow start)")
    g.add_argument("--collective-timeout-seconds", type=num, default=600)
    g.add_argument("--local-rank", "--local_rank", dest="local_rank", type=num,
                   help=argparse.SUPPRESS)  # torch.distributed.launch passes it
    g = p.add_argument_group("checkpoints and output")
    g.add_argument("--checkpoint-dir", metavar="DIR",
                   help=f"default: ${ENV_CHECKPOINT_DIR} or ./checkpoints")
    g.add_argument("--checkpoint-every", type=num, default=200, help="steps; 0: epoch ends only")
    g.add_argument("--keep-checkpoints", type=num, default=2)
    g.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--adopt-checkpoints", action="store_true",
                   help="resume from another job's checkpoints in --checkpoint-dir when it holds "
                   "none of this job's (refused by default)")
    g.add_argument("--log-every", type=num, default=10)
    g.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    g.add_argument("--termination-log", metavar="PATH",
                   help=f"summary file (default: ${contract.DDPJOB_TERMINATION_LOG} or "
                   f"{contract.DEFAULT_TERMINATION_LOG} if it exists)")
    return p


def parse_config(argv: Optional[Sequence[str]] = None,
                 environ: Optional[Mapping[str, str]] = None) -> TrainConfig:
    """Flags (and environment defaults) to a validated config; ConfigError on a bad value."""
    env = os.environ if environ is None else environ
    ns = build_parser().parse_args(argv)
    fake_only = {"fake_size": ns.fake_size, "image_size": ns.image_size,
                 "num_classes": ns.num_classes, "fake_signal": ns.fake_signal}
    if ns.dataset != "fake":
        for name, value in fake_only.items():
            if value is not None:
                raise ConfigError(f"--{name.replace('_', '-')}: only for --dataset fake "
                                  f"({ns.dataset} has its own)")
    device = ns.device
    if device is None:
        device = env.get(contract.DDPJOB_DEVICE) or "auto"
        if device.lower() not in DEVICES + ("cuda",):
            raise ConfigError(f"--device: {contract.DDPJOB_DEVICE}={device!r} is not one of "
                              f"{', '.join(DEVICES)}")
    device = device.lower()
    device = "gpu" if device == "cuda" else device
    return TrainConfig(
        model=ns.model,
        weights=ns.weights,
        dataset=ns.dataset,
        data_dir=ns.data_dir if ns.data_dir is not None else env.get(ENV_DATA_DIR) or "./data",
        download=ns.download,
        fake_size=FAKE_DEFAULT_SIZE if ns.fake_size is None else ns.fake_size,
        image_size=FAKE_DEFAULT_IMAGE_SIZE if ns.image_size is None else ns.image_size,
        num_classes=FAKE_DEFAULT_CLASSES if ns.num_classes is None else ns.num_classes,
        fake_signal=0.0 if ns.fake_signal is None else ns.fake_signal,
        batch_size=ns.batch_size,
        epochs=ns.epochs,
        max_steps=ns.max_steps,
        eval_every=ns.eval_every,
        optimizer=ns.optimizer,
        lr=ns.lr,
        momentum=ns.momentum,
        weight_decay=ns.weight_decay,
        seed=ns.seed,
        device=device,
        backend=ns.backend,
        precision=ns.precision,
        num_workers=ns.num_workers,
        pin_memory=ns.pin_memory,
        cpu_threads=ns.cpu_threads,
        channels_last=ns.channels_last,
        compile=ns.compile,
        checkpoint_dir=(ns.checkpoint_dir if ns.checkpoint_dir is not None
                        else env.get(ENV_CHECKPOINT_DIR) or "./checkpoints"),
        checkpoint_every=ns.checkpoint_every,
        keep_checkpoints=ns.keep_checkpoints,
        resume=ns.resume,
        adopt_checkpoints=ns.adopt_checkpoints,
        owner=from_environment(env),
        log_every=ns.log_every,
        log_format=ns.log_format,
        collective_timeout_seconds=ns.collective_timeout_seconds,
        termination_log=(ns.termination_log if ns.termination_log is not None
                         else env.get(contract.DDPJOB_TERMINATION_LOG) or None),
        local_rank=ns.local_rank,
    )
