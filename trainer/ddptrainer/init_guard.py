"""The init guard: every ``init_process_group`` in a process the pod entry point starts is
checked against the job's world, and bounded in time.

Why: a script's own idea of the world can disagree with the job's, and torch then either waits
(30 minutes for gloo) or, worse, succeeds. The single-machine ``mp.spawn`` style
(``MASTER_ADDR=localhost``, a probed port, ``rank=i, world_size=nprocs``) on a 2-node job makes
every pod form a world of its own: N independent trainings of the whole data set, silently
(docs/launch-styles.md). So, when the job has more than one node, the guard refuses (exit 2,
permanent, with the lines to change) an init whose world size is not the job's, whose rank is
not one of this node's, or whose master is the loopback address; and in every job it ends a
rendezvous that has not completed within ``DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS`` (exit 12,
retryable) instead of letting it hang.

How it gets there: ``ddptrain-pod`` puts ``worker_site/`` first on ``PYTHONPATH``; its
``sitecustomize`` calls ``install_when_imported()`` in every Python process of the pod, the
children of ``mp.spawn`` included (they inherit the environment, not the parent's patches).
``DDPJOB_INIT_GUARD=0`` in ``spec.env`` turns it off. The guard only wraps the call: the
timeout given to ``init_process_group`` (which also bounds every collective) stays the user's.

Once a process group has started, the guard also makes the interpreter's exit wait a moment
(``settle_collectives_at_exit``), so that gloo's threads never abort a run that succeeded.

The job's facts come from the ``PET_*`` variables: scripts overwrite ``MASTER_ADDR`` in their
own environment (and mp.spawn children inherit that), but nobody writes ``PET_*``.

Standard library at import time; torch is never imported here (it is patched once the script
imports it).
"""
from __future__ import annotations

import atexit
import functools
import importlib.abc
import inspect
import ipaddress
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional
from urllib.parse import parse_qs, urlparse

from ddpjob import contract
from ddpjob.contract import ExitCode

from . import summary
from .text import env_int

PREFIX = "ddptrain-pod: init guard"
DEFAULT_TIMEOUT_SECONDS = 600
_TARGET_MODULE = "torch.distributed"
#: How long a process that started a process group waits at exit, the GIL released, before the
#: interpreter shuts down (see settle_collectives_at_exit).
EXIT_SETTLE_SECONDS = 0.2
_exit_settle_registered = False


@dataclass(frozen=True)
class JobWorld:
    """The world the job has: from the environment the operator (or ``ddpjob run``) set."""

    nnodes: int
    node_rank: int
    nproc_per_node: Optional[int]  # None when torchrun was given "auto"/"gpu"
    master_addr: Optional[str]
    master_port: Optional[int]
    timeout_seconds: float

    @property
    def world_size(self) -> Optional[int]:
        return None if self.nproc_per_node is None else self.nnodes * self.nproc_per_node

    @property
    def ranks(self) -> Optional[range]:
        """The global ranks of this node's processes."""
        if self.nproc_per_node is None:
            return None
        first = self.node_rank * self.nproc_per_node
        return range(first, first + self.nproc_per_node)


@dataclass(frozen=True)
class InitCall:
    """What one ``init_process_group`` call asks for, as torch will resolve it."""

    world_size: Optional[int]
    rank: Optional[int]
    master_addr: Optional[str]  # None: a store or file:// init, no address to judge
    master_port: Optional[int]


def _int(values: Mapping[str, str], name: str, default: Optional[int] = None) -> Optional[int]:
    """The guard only checks: a value it cannot read is one it does not judge (None)."""
    return env_int(values, name, default, invalid=None)


def job_world(environ: Mapping[str, str]) -> Optional[JobWorld]:
    """None outside a DDPJob (no PET_NNODES): the guard then checks nothing."""
    nnodes = _int(environ, contract.PET_NNODES)
    if nnodes is None:
        return None
    timeout = _int(environ, contract.DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS) or DEFAULT_TIMEOUT_SECONDS
    return JobWorld(nnodes=nnodes, node_rank=_int(environ, contract.PET_NODE_RANK) or 0,
                    nproc_per_node=_int(environ, contract.PET_NPROC_PER_NODE, 1),
                    master_addr=environ.get(contract.PET_MASTER_ADDR) or None,
                    master_port=_int(environ, contract.PET_MASTER_PORT),
                    timeout_seconds=float(timeout))


def describe_call(arguments: Mapping[str, Any], environ: Mapping[str, str]) -> InitCall:
    """``arguments``: init_process_group's bound arguments (names as in its signature)."""
    world = arguments.get("world_size", -1)
    rank = arguments.get("rank", -1)
    world = None if world in (None, -1) else int(world)
    rank = None if rank in (None, -1) else int(rank)
    init_method = arguments.get("init_method")
    if arguments.get("store") is not None:
        return InitCall(world, rank, None, None)
    if init_method in (None, "env://"):
        return InitCall(world if world is not None else _int(environ, contract.WORLD_SIZE),
                        rank if rank is not None else _int(environ, contract.RANK),
                        environ.get(contract.MASTER_ADDR), _int(environ, contract.MASTER_PORT))
    url = urlparse(str(init_method))
    query = {name: values[0] for name, values in parse_qs(url.query).items()}
    if world is None:
        world = _int(query, "world_size")
    if rank is None:
        rank = _int(query, "rank")
    if url.scheme == "tcp":
        return InitCall(world, rank, url.hostname, url.port)
    return InitCall(world, rank, None, None)


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def world_problems(call: InitCall, job: JobWorld) -> list[str]:
    """Why this init cannot be part of the job's world (empty: it can). Single-node jobs are
    not judged: a script that spawns its own processes on one machine owns that world."""
    if job.nnodes <= 1:
        return []
    problems = []
    if call.world_size is not None and job.world_size is not None and call.world_size != job.world_size:
        problems.append(f"world_size={call.world_size}, but the job has {job.world_size} processes "
                        f"({job.nnodes} nodes x {job.nproc_per_node})")
    ranks = job.ranks
    if call.rank is not None and ranks is not None and call.rank not in ranks:
        problems.append(f"rank={call.rank}, but the processes of node {job.node_rank} have global "
                        f"ranks {ranks.start}..{ranks.stop - 1} (RANK on the pod is the first)")
    if (call.master_addr and is_loopback(call.master_addr)
            and not (job.master_addr and is_loopback(job.master_addr))):
        problems.append(f"the master is {call.master_addr}:{call.master_port}, this pod's own "
                        f"loopback, but the job's master is {job.master_addr}:{job.master_port}")
    return problems


def refusal_message(call: InitCall, job: JobWorld, problems: list[str], where: str) -> str:
    lines = [
        f"{PREFIX}: init_process_group({where}) would not join the {job.nnodes}-node job's world: "
        + "; ".join(problems) + ".",
        "This is the single-machine pattern (mp.spawn with MASTER_ADDR=localhost, a probed port, "
        "rank=i, world_size=nprocs): on several nodes every pod would train alone. Change:",
        '  os.environ["MASTER_ADDR"] = "localhost"   -> delete (DDPJob sets MASTER_ADDR)',
        '  os.environ["MASTER_PORT"] = str(port)     -> delete (DDPJob sets MASTER_PORT)',
        '  world_size = nprocs                       -> world_size = int(os.environ["WORLD_SIZE"])',
        '  rank = i  (the mp.spawn index)            -> rank = int(os.environ["RANK"]) + i',
        "  DistributedSampler(num_replicas=..., rank=...) -> the same world_size and global rank",
        "  mp.spawn(..., nprocs=n)                   -> nprocs = int(os.environ[\"LOCAL_WORLD_SIZE\"])",
        "and set nprocPerNode to the processes the script spawns, launcher: spawn. Or drop mp.spawn "
        "and let the pod entry point start the processes (launcher: torchrun). "
        "See docs/launch-styles.md; DDPJOB_INIT_GUARD=0 turns this check off.",
    ]
    return "\n".join(lines)


def read_verdicts(folder: Optional[str]) -> list[tuple[int, str]]:
    """(exit code, message) left by guarded processes, the root cause first (the contract's
    ranking: permanent codes first)."""
    verdicts = [e for e in summary.read_endings(folder) if e.is_guard_verdict]
    verdicts.sort(key=lambda e: contract.failure_rank(e.code))
    return [(e.code, e.message) for e in verdicts]


def _leave_verdict_and_exit(code: int, message: str) -> None:
    """Say why, leave the verdict for the pod entry point, and exit now: a hung rendezvous
    holds the main thread in C++, so neither an exception nor sys.exit would get through."""
    print(message, file=sys.stderr, flush=True)
    summary.leave_ending(code, message, rank=None)
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
    os._exit(code)


def _caller() -> str:
    """The user's line that called init_process_group (the nearest frame outside torch and us)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename.replace("\\", "/")
        if "/torch/" not in name and not name.endswith("init_guard.py"):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def guard(real: Callable[..., Any], environ: Optional[Mapping[str, str]] = None) -> Callable[..., Any]:
    """``real`` (init_process_group) checked and bounded."""
    if getattr(real, "__ddpjob_guarded__", False):
        return real
    signature = inspect.signature(real)

    @functools.wraps(real)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        env = os.environ if environ is None else environ
        job = job_world(env)
        try:
            arguments = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            arguments = None
        if job is None or arguments is None:  # not a job's process / torch reports the bad call
            result = real(*args, **kwargs)
            register_exit_settle()
            return result
        call = describe_call(arguments, env)
        problems = world_problems(call, job)
        if problems:
            where = f"rank={call.rank}, world_size={call.world_size}, master={call.master_addr}:{call.master_port}"
            _leave_verdict_and_exit(int(ExitCode.BAD_CONFIG),
                                    refusal_message(call, job, problems, where) + f" [called at {_caller()}]")
        # No wait for the master's name here: torch's TCPStore retries a name that does not
        # resolve yet until the timeout (pytorch/pytorch#73682, fixed by #74641; shown for the
        # pinned torch by tests/multiprocess/test_trainer_dns.py), and the timer below bounds it.
        deadline = time.monotonic() + job.timeout_seconds
        message = (f"rendezvous timeout: init_process_group(rank={call.rank}, world_size="
                   f"{call.world_size}, master={call.master_addr}:{call.master_port}) did not "
                   f"complete within {job.timeout_seconds:.0f}s "
                   f"({contract.DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS}, spec.startupTimeoutSeconds): "
                   "a peer never joined, or the script's world does not match the job's")
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), _leave_verdict_and_exit,
                                (int(ExitCode.RENDEZVOUS_TIMEOUT), f"{PREFIX}: {message}"))
        timer.daemon = True
        timer.start()
        try:
            result = real(*args, **kwargs)
        finally:
            timer.cancel()
        register_exit_settle()
        return result

    init_process_group.__ddpjob_guarded__ = True  # type: ignore[attr-defined]
    return init_process_group


def settle_collectives_at_exit() -> None:
    """Release the GIL for a moment before the interpreter shuts down.

    Why: with torch 2.14's gloo backend, a DDP model keeps its process group, and with it gloo's
    worker threads, alive until the process ends, even past ``destroy_process_group()``. A worker
    that has just finished the last collective still holds that collective's tensors, and
    releasing them needs the GIL. If the interpreter is already shutting down by then, the thread
    is stopped inside a C++ destructor and the process aborts (SIGABRT, exit 134, "terminate
    called without an active exception") after a run that succeeded: the operator has to count
    that as a crash and restart the gang. Measured with examples/scripts/plain_env_ddp.py, two
    ranks run 40 times: 1 run aborted without this pause; with PYTHONFAULTHANDLER=1, which widens
    the window, 4 of 15 aborted without it and 0 of 40 with it (through worker_site). Sleeping hands the GIL to those workers; atexit
    handlers run while the interpreter is still whole.
    """
    time.sleep(EXIT_SETTLE_SECONDS)


def register_exit_settle() -> None:
    """Register settle_collectives_at_exit once, after a process group started."""
    global _exit_settle_registered
    if not _exit_settle_registered:
        _exit_settle_registered = True
        atexit.register(settle_collectives_at_exit)


def install(distributed: Any) -> None:
    """Patch an imported ``torch.distributed`` (and the c10d module it re-exports from)."""
    real = getattr(distributed, "init_process_group", None)
    if real is None:  # torch built without distributed support
        return
    guarded = guard(real)
    distributed.init_process_group = guarded
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is not None and getattr(c10d, "init_process_group", None) is real:
        c10d.init_process_group = guarded


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches torch.distributed right after it is imported, so that processes that never use
    it do not pay for importing torch, and scripts that set variables before ``import torch``
    (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES) still can."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _TARGET_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            try:
                install(module)
            except Exception as error:  # noqa: BLE001 - never break the user's import
                print(f"{PREFIX}: warning: not installed: {error}", file=sys.stderr, flush=True)

        loader.exec_module = exec_then_patch
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        return spec


def install_when_imported() -> None:
    """Install now if torch.distributed is imported already, else as soon as it is."""
    module = sys.modules.get(_TARGET_MODULE)
    if module is not None:
        install(module)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def site_dir() -> str:
    """The folder whose sitecustomize installs the guard (put first on PYTHONPATH)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_site")


def guarded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a process needs for the guard in it and in every Python process it starts."""
    if environ.get(contract.DDPJOB_INIT_GUARD, "1") == "0":
        return {}
    paths = [site_dir()] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != site_dir()]
    return {"PYTHONPATH": os.pathsep.join(paths)}
