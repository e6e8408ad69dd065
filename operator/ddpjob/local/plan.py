"""What each node of a local run executes: its environment, its command, the port, the GPUs.

Pure functions of a DDPJob and this machine's facts (unit-tested); `ddpjob run` (``localrun``)
calls them for every node and attempt. The environment is the operator's pod contract
(``contract.node_environment``) with MASTER_ADDR on loopback, plus the spec's env and a few
local stand-ins for what the kubelet would provide.
"""
from __future__ import annotations

import os
import random
import re
import socket
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.api import spec as api
from ddpjob.local.volumes import LocalMount, rewrite_mount_paths

LOCAL_MASTER_ADDR = "127.0.0.1"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


class LocalRunError(Exception):
    """The job cannot run on this machine as written; the message says why and what to change."""


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LISTEN_PORTS_FROM = 20000  # below it sit the well-known and registered services' ports


def reserve_free_port(range_file: str = EPHEMERAL_RANGE_FILE) -> socket.socket:
    """A socket bound, on every IPv4 address, to a port nobody holds and the kernel never lends.

    The port lies below the kernel's ephemeral range (32768-60999 by default): every outgoing
    connection on this machine takes its local port from that range, so a port picked there
    (``bind(0)``) and let go for a moment can be taken by any program's connect() before
    node 0's rendezvous store binds it, and stay taken for as long as that connection lives
    (EADDRINUSE on every attempt; a CI run under a busy kind cluster hit it). Below the range
    only a program that names the port could take it. The caller keeps the socket open until
    just before the nodes start (docs/local-run.md); where the range leaves no room below it,
    the kernel's choice is the fallback.
    """
    low, _ = _ephemeral_range(range_file)
    candidates = list(range(_LISTEN_PORTS_FROM, low))
    random.shuffle(candidates)
    for port in candidates[:200]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("", port))  # no SO_REUSEADDR: a port in TIME_WAIT is not taken either
            return sock
        except OSError:
            sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    return sock


def _ephemeral_range(range_file: str) -> tuple[int, int]:
    try:
        with open(range_file) as f:
            low, high = (int(v) for v in f.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def visible_gpu_ids(environ: Mapping[str, str], dev_dir: str = "/dev") -> list[str]:
    """The CUDA GPUs of this machine, without importing torch.

    A GPU needs an NVIDIA device file (/dev/nvidia0, /dev/nvidia1, ...); CUDA_VISIBLE_DEVICES,
    when set, narrows them as it would for any CUDA program.
    """
    try:
        count = sum(1 for name in os.listdir(dev_dir) if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        count = 0
    if count == 0:
        return []
    if CUDA_VISIBLE_DEVICES in environ:
        return [d.strip() for d in environ[CUDA_VISIBLE_DEVICES].split(",") if d.strip()]
    return [str(i) for i in range(count)]


def check_gpus(spec: api.DDPJobSpec, gpu_ids: list[str]) -> Optional[list[str]]:
    """For device gpu, the GPUs the nodes will share out (one per process, as the pods get)."""
    if spec.device != "gpu":
        return None
    needed = spec.nnodes * spec.nprocPerNode
    if not gpu_ids:
        raise LocalRunError("device: gpu, but this machine has no CUDA GPU (no /dev/nvidia* device); "
                            "set device: cpu to run the job here with gloo")
    if len(gpu_ids) < needed:
        raise LocalRunError(
            f"device: gpu needs nnodes x nprocPerNode = {needed} GPUs (one per process, as the pods "
            f"would get), this machine has {len(gpu_ids)}; lower nnodes or nprocPerNode, or set device: cpu")
    return gpu_ids


_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand_references(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command, args and env values.

    ``$(VAR)`` becomes VAR's value when the container defines it, and stays as written when it
    does not; ``$$`` is an escaped ``$``.
    """
    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


@dataclass(frozen=True)
class LocalSetup:
    """What stays the same for every node and every attempt of one local run."""

    scratch_dir: str
    mounts: tuple[LocalMount, ...] = ()
    gpu_ids: Optional[tuple[str, ...]] = None  # None: device cpu
    #: DDPJOB_UID of every node and attempt: one run is one job, as one DDPJob object is (a
    #: second run of the same file is a namesake created again, whose checkpoints are not this
    #: run's). Fresh for each run (runner).
    run_uid: str = ""


@dataclass(frozen=True)
class NodeControl:
    """In-place restarts (local/in_place.py): a node's port on 127.0.0.1 and its token."""

    port: int
    token: str


def job_environment(job: api.DDPJob, *, node_rank: int, master_port: int, restart_attempt: int,
                    setup: LocalSetup, environ: Mapping[str, str],
                    controls: Optional[Sequence["NodeControl"]] = None) -> dict[str, str]:
    """The variables a node's pod would get (the contract and spec.env), plus local stand-ins.

    Stand-ins, which a spec.env entry may override: the termination log (the kubelet's
    /dev/termination-log is not writable here), PYTHONUNBUFFERED=1 (so output arrives line by
    line) and CUDA_VISIBLE_DEVICES (the node's share of the GPUs; none for device cpu, as a CPU
    pod has none). A valueFrom entry is read from ``environ`` (load-time checked).

    ``controls`` (one per node: in-place restarts) give the node the operator's InPlace
    variables, its own port and token, node 0's port for the attempt handshake, and the loopback
    address to serve on; the progress folder is then the run's, not the attempt's (the entry
    point empties it before each attempt, as in a pod).
    """
    spec = job.spec
    control = controls[node_rank] if controls else None
    contract_env = contract.node_environment(
        job_name=job.name, namespace=job.namespace, job_uid=setup.run_uid,
        master_addr=LOCAL_MASTER_ADDR,
        master_port=master_port, nnodes=spec.nnodes, nproc_per_node=spec.nprocPerNode,
        node_rank=node_rank, restart_attempt=restart_attempt, device=spec.device,
        rendezvous_timeout_seconds=spec.startupTimeoutSeconds,
        launcher=api.effective_launcher(spec), local_rank_flag=spec.localRankFlag,
        # The supervisor reads the reports itself. Only in-place restarts serve a port (each
        # node its own, on loopback: the restart protocol), so the nodes never compete for one.
        progress_dir=progress_dir(setup, restart_attempt), progress_port=control.port if control else 0,
        restart_mode=contract.RESTART_MODE_IN_PLACE if control else None,
        restart_token=control.token if control else None,
        permanent_exit_codes=spec.failurePolicy.permanentExitCodes)
    if control:
        contract_env[contract.DDPJOB_MASTER_PROGRESS_PORT] = str(controls[0].port)
        contract_env[contract.DDPJOB_PROGRESS_ADDRESS] = LOCAL_MASTER_ADDR
    gpus = setup.gpu_ids or ()
    stand_ins = {
        contract.DDPJOB_TERMINATION_LOG: termination_log_path(setup, node_rank),
        "PYTHONUNBUFFERED": "1",
        CUDA_VISIBLE_DEVICES: ",".join(gpus[node_rank * spec.nprocPerNode:(node_rank + 1) * spec.nprocPerNode]),
    }
    env = dict(contract_env)  # also what $(VAR) may refer to, growing in list order as in a pod
    for entry in spec.env:
        name = entry["name"]
        if name in contract_env:
            continue  # the contract wins (validation refuses such entries anyway)
        if "valueFrom" in entry and "value" not in entry:
            env[name] = environ[name]
        else:
            env[name] = rewrite_mount_paths(expand_references(str(entry.get("value", "")), env), setup.mounts)
    for name, value in stand_ins.items():
        env.setdefault(name, value)
    return env


def process_environment(job_env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """A node process's full environment: this shell's, minus the names the job owns, plus the job's.

    Inherited PET_* or RANK-like variables (a shell inside another torchrun job, say) would
    otherwise steer torchrun in the nodes; the pod would not have them either.
    """
    inherited = {k: v for k, v in environ.items()
                 if not k.startswith(contract.RESERVED_ENV_PREFIX) and k not in contract.RESERVED_ENV_NAMES}
    return {**inherited, **job_env}


def node_command(spec: api.DDPJobSpec, env: Mapping[str, str], mounts: tuple[LocalMount, ...] = ()) -> list[str]:
    """command + args as the container would run them (default: the trainer's pod entry point)."""
    argv = list(spec.command or contract.DEFAULT_POD_COMMAND) + list(spec.args)
    return [rewrite_mount_paths(expand_references(arg, env), mounts) for arg in argv]


def progress_dir(setup: LocalSetup, restart_attempt: int) -> str:
    """Where the processes of one attempt write their progress reports (one file per rank)."""
    return os.path.join(setup.scratch_dir, f"progress-attempt-{restart_attempt}")


def termination_log_path(setup: LocalSetup, node_rank: int) -> str:
    return os.path.join(setup.scratch_dir, f"node-{node_rank}.termination-log")
