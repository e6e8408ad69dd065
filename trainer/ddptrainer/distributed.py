"""Process group set-up and tear-down; the choice of device and backend.

Three ways to start, one code path:

* under torchrun (or ddptrain-pod): RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT are set;
* one process per pod without torchrun: the pod's own RANK/WORLD_SIZE/MASTER_* (contract.py);
* a plain process with no WORLD_SIZE: world size 1 and no process group at all.

The device comes from LOCAL_RANK (never the global rank: on the second node rank 4 is still
``cuda:0``), the backend from the device (nccl on GPU, gloo on CPU).
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from ddpjob import contract

from .config import TrainConfig
from .errors import ConfigError, RankConfigError, RendezvousTimeoutError, is_collective_failure
from .text import BadInteger, env_int, first_line


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: Optional[str]
    """None when there is no process group (a plain single process)."""
    control_group: Any = None
    """A gloo group for small CPU-side agreements (stop flag, checkpoint barrier), so they
    never queue behind or synchronise with the GPU's NCCL stream."""

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int_env(env: Mapping[str, str], name: str) -> Optional[int]:
    try:
        return env_int(env, name)
    except BadInteger as e:
        raise ConfigError(f"--local-rank: environment {e.name}={e.raw!r} is not an integer") from None


def resolve_device(config: TrainConfig, local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK or cpu; ConfigError (exit 2, never a hang) when a GPU is missing."""
    want = config.device
    if want == "auto":
        want = "gpu" if torch.cuda.is_available() else "cpu"
    if want == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("--device: gpu was asked for but no CUDA device is visible "
                          "(torch.cuda.is_available() is False); use --device cpu or auto")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RankConfigError(f"--device: LOCAL_RANK {local_rank} has no GPU: {count} visible "
                          "(one GPU per process: nprocPerNode must not exceed the GPUs per node)")
    return torch.device("cuda", local_rank)


def resolve_backend(config: TrainConfig, device: torch.device) -> str:
    backend = config.backend
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError("--backend: nccl needs a GPU (the device is cpu); use gloo or auto")
    return backend


def setup(config: TrainConfig, environ: Optional[Mapping[str, str]] = None) -> DistContext:
    env = os.environ if environ is None else environ
    world_size = _int_env(env, contract.WORLD_SIZE)
    rank = _int_env(env, contract.RANK) or 0
    local_rank = _int_env(env, contract.LOCAL_RANK)
    if local_rank is None:
        local_rank = config.local_rank or 0  # torch.distributed.launch's --local_rank
    if config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)
    device = resolve_device(config, local_rank)
    backend = resolve_backend(config, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick kernels
    if world_size is None:
        return DistContext(rank=0, local_rank=local_rank, world_size=1, device=device, backend=None)
    if not 0 <= rank < world_size:
        raise ConfigError(f"--local-rank: environment RANK={rank} is outside 0..{world_size - 1}")
    timeout = datetime.timedelta(seconds=config.collective_timeout_seconds)
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device  # eager NCCL init: a broken GPU fails here, not mid-step
    try:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=timeout, **kwargs)
        control = dist.new_group(backend="gloo", timeout=timeout)
    except ValueError as e:  # env:// complains about a missing MASTER_ADDR/PORT
        raise ConfigError(f"--backend: cannot form the process group: {e}") from e
    except Exception as e:
        if is_collective_failure(e):
            master = f"{env.get(contract.MASTER_ADDR)}:{env.get(contract.MASTER_PORT)}"
            raise RendezvousTimeoutError(
                f"process group with {world_size} ranks via {master} not formed within "
                f"{config.collective_timeout_seconds}s: {first_line(e)}") from e
        raise
    return DistContext(rank=rank, local_rank=local_rank, world_size=world_size, device=device,
                       backend=backend, control_group=control)


def teardown(ctx: Optional[DistContext]) -> None:
    """destroy_process_group, never raising: it runs in ``finally`` after any failure."""
    if ctx is None or not ctx.distributed or not dist.is_initialized():
        return
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier(group=ctx.control_group)

