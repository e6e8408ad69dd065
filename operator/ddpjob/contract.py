"""The contract between the operator and the program in each pod.

The operator (package ``ddpjob``) never imports torch and the trainer (package ``ddptrainer``)
never imports kopf or kubernetes; this module, standard library only, is what joins them.
It defines, once:

* the environment every DDPJob pod gets (and every local node process under ``ddpjob run``);
* the trainer's exit codes and which of them a restart cannot fix.

``docs/contract.md`` is the page that documents it; a unit test keeps the two in step.

Meanings chosen (the peers disagree, see docs/contract.md):

* ``WORLD_SIZE`` is the number of training *processes*: ``nnodes * nprocPerNode``, the same
  number torchrun gives its workers.
* ``RANK`` on the pod is the global rank of the pod's first process:
  ``node_rank * nprocPerNode``. With one process per pod this is exactly what a plain
  ``init_process_group(init_method="env://")`` script needs; under torchrun each worker gets
  its own ``RANK`` from torchrun, which overrides the pod's.
* The rendezvous is torchrun's static one: ``PET_NNODES``, ``PET_NODE_RANK``,
  ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, so global ranks are deterministic
  (``node_rank * nprocPerNode + local_rank``) and ``torchrun script.py`` needs no flags.
* ``PET_MAX_RESTARTS=0``: torchrun never restarts workers in place; the operator restarts the
  whole gang (a lone in-place restart never rejoins its peers).
"""
from __future__ import annotations

import enum
import json
import os
import time
from typing import Any, Mapping, Optional

# ---------------------------------------------------------------------------------------------
# Version and defaults
# ---------------------------------------------------------------------------------------------
#: The version of this contract, set in every pod as DDPJOB_CONTRACT_VERSION. Bumped when a
#: variable changes meaning or an exit code is added, so that an operator and a trainer image
#: from different releases can tell (the pod entry point warns on a mismatch).
CONTRACT_VERSION = "1"

DEFAULT_MASTER_PORT = 29500  # torchrun's default; every pod has its own IP, so no clashes
DEFAULT_TERMINATION_LOG = "/dev/termination-log"  # the Kubernetes default terminationMessagePath
# The pod entry point the trainer image provides (console script of package ddptrainer).
DEFAULT_POD_COMMAND = ("ddptrain-pod",)

# ---------------------------------------------------------------------------------------------
# Environment variable names
# ---------------------------------------------------------------------------------------------
# torchrun reads each --x-y option from PET_X_Y.
PET_NNODES = "PET_NNODES"
PET_NODE_RANK = "PET_NODE_RANK"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
PET_MAX_RESTARTS = "PET_MAX_RESTARTS"
# What torch.distributed's env:// init reads (for scripts launched without torchrun).
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
# Plain names for scripts and logs.
NODE_RANK = "NODE_RANK"
NNODES = "NNODES"
NPROC_PER_NODE = "NPROC_PER_NODE"
# DDPJob's own.
DDPJOB_NAME = "DDPJOB_NAME"
DDPJOB_NAMESPACE = "DDPJOB_NAMESPACE"
DDPJOB_RESTART_ATTEMPT = "DDPJOB_RESTART_ATTEMPT"
DDPJOB_DEVICE = "DDPJOB_DEVICE"
DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS = "DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS"
DDPJOB_TERMINATION_LOG = "DDPJOB_TERMINATION_LOG"
DDPJOB_CONTRACT_VERSION = "DDPJOB_CONTRACT_VERSION"
DDPJOB_LAUNCHER = "DDPJOB_LAUNCHER"
DDPJOB_LOCAL_RANK_FLAG = "DDPJOB_LOCAL_RANK_FLAG"
#: Not set by the operator: ``0`` in spec.env turns the pod entry point's init guard off.
DDPJOB_INIT_GUARD = "DDPJOB_INIT_GUARD"
#: Progress reporting (docs/contract.md, "Progress"): each training process writes its latest
#: progress to ``<DDPJOB_PROGRESS_DIR>/rank-<RANK>.json``; the pod entry point serves the
#: directory's reports at ``GET http://<pod IP>:<DDPJOB_PROGRESS_PORT>/progress``, which the
#: operator polls. No Kubernetes credentials in the pod.
DDPJOB_PROGRESS_DIR = "DDPJOB_PROGRESS_DIR"
DDPJOB_PROGRESS_PORT = "DDPJOB_PROGRESS_PORT"

# Progress reporting: where the reports go in the pod, and where the pod serves them.
DEFAULT_PROGRESS_DIR = "/dev/shm/ddpjob-progress"  # /dev/shm: the writable memory volume every pod has
DEFAULT_PROGRESS_PORT = 29400
PROGRESS_PATH = "/progress"
#: The keys of one report (a JSON object, one file per rank); only ``step`` is required.
#: ``throughput`` is in samples per second; ``time`` is the writer's Unix time.
PROGRESS_REPORT_KEYS = ("step", "total_steps", "epoch", "epochs", "loss", "throughput", "time")


def progress_file_name(rank: int) -> str:
    """The file one training process (global rank ``rank``) writes its reports to."""
    return f"rank-{int(rank)}.json"


def read_progress_reports(directory: str, now: Optional[float] = None) -> dict[str, dict[str, Any]]:
    """The reports in ``directory`` by rank, each with ``age_seconds`` (from the file's mtime)."""
    now = time.time() if now is None else now
    reports: dict[str, dict[str, Any]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return reports
    for name in names:
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as file:
                report = json.load(file)
            age = max(0.0, now - os.stat(path).st_mtime)
        except (OSError, ValueError):
            continue
        if isinstance(report, dict) and isinstance(report.get("step"), int):
            report = {k: report[k] for k in PROGRESS_REPORT_KEYS if k in report}
            reports[name[len("rank-"):-len(".json")]] = {**report, "age_seconds": round(age, 3)}
    return reports


# spec.launcher: who starts the pod's nprocPerNode training processes (docs/launch-styles.md).
#: The pod entry point starts nprocPerNode copies of the script with torchrun (the default).
LAUNCHER_TORCHRUN = "torchrun"
#: The pod entry point starts the script once; the script starts its own processes (mp.spawn).
LAUNCHER_SPAWN = "spawn"
#: spec.command runs as written, once per pod; DDPJob starts nothing else.
LAUNCHER_NONE = "none"
LAUNCHERS = (LAUNCHER_TORCHRUN, LAUNCHER_SPAWN, LAUNCHER_NONE)
#: spec.localRankFlag: what torch.distributed.launch passed to each worker (underscore until
#: torch 2.0, dashed since). The pod entry point adds ``FLAG=<local rank>`` after the script.
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")

# Names a user's `env` may not set: the operator owns them.
RESERVED_ENV_NAMES = frozenset(
    {
        PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT,
        PET_MAX_RESTARTS, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK,
        LOCAL_WORLD_SIZE, NODE_RANK, NNODES, NPROC_PER_NODE, DDPJOB_NAME, DDPJOB_NAMESPACE,
        DDPJOB_RESTART_ATTEMPT, DDPJOB_DEVICE, DDPJOB_CONTRACT_VERSION, DDPJOB_LAUNCHER,
        DDPJOB_LOCAL_RANK_FLAG, DDPJOB_PROGRESS_DIR, DDPJOB_PROGRESS_PORT,
    }
)
RESERVED_ENV_PREFIX = "PET_"


def node_environment(
    *,
    job_name: str,
    namespace: str,
    master_addr: str,
    master_port: int,
    nnodes: int,
    nproc_per_node: int,
    node_rank: int,
    restart_attempt: int,
    device: str,
    rendezvous_timeout_seconds: int,
    launcher: str = LAUNCHER_TORCHRUN,
    local_rank_flag: str | None = None,
    progress_dir: str = DEFAULT_PROGRESS_DIR,
    progress_port: int = DEFAULT_PROGRESS_PORT,
) -> dict[str, str]:
    """The environment of one node (one pod), in a stable order.

    The same function serves the operator's pods and ``ddpjob run``'s local processes, so the
    two can never disagree.
    """
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank {node_rank} is outside 0..{nnodes - 1}")
    env = {
        PET_NNODES: str(nnodes),
        PET_NODE_RANK: str(node_rank),
        PET_NPROC_PER_NODE: str(nproc_per_node),
        PET_MASTER_ADDR: master_addr,
        PET_MASTER_PORT: str(master_port),
        PET_MAX_RESTARTS: "0",
        MASTER_ADDR: master_addr,
        MASTER_PORT: str(master_port),
        WORLD_SIZE: str(nnodes * nproc_per_node),
        RANK: str(node_rank * nproc_per_node),
        LOCAL_RANK: "0",
        LOCAL_WORLD_SIZE: str(nproc_per_node),
        NODE_RANK: str(node_rank),
        NNODES: str(nnodes),
        NPROC_PER_NODE: str(nproc_per_node),
        DDPJOB_NAME: job_name,
        DDPJOB_NAMESPACE: namespace,
        DDPJOB_RESTART_ATTEMPT: str(restart_attempt),
        DDPJOB_DEVICE: device,
        DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS: str(rendezvous_timeout_seconds),
        DDPJOB_CONTRACT_VERSION: CONTRACT_VERSION,
        DDPJOB_LAUNCHER: launcher,
        DDPJOB_PROGRESS_DIR: progress_dir,
        DDPJOB_PROGRESS_PORT: str(progress_port),
    }
    if local_rank_flag:
        env[DDPJOB_LOCAL_RANK_FLAG] = local_rank_flag
    return env


# ---------------------------------------------------------------------------------------------
# Exit codes
# ---------------------------------------------------------------------------------------------
class ExitCode(enum.IntEnum):
    """The trainer's exit codes (docs/contract.md has the table)."""

    SUCCESS = 0
    #: An unexpected error (a Python exception). Retryable: a user's script under plain
    #: torchrun reports every worker failure, a lost peer included, as 1 (ddptrain-pod reports
    #: the worker's own code instead), and a restart from the checkpoint answers both.
    FAILURE = 1
    #: A bad flag or value, or a GPU asked for where none is. Permanent: retrying cannot help.
    BAD_CONFIG = 2
    #: The data set is not where the configuration says and may not be downloaded. Permanent.
    DATA_MISSING = 3
    #: No space left on the checkpoint volume. Permanent: a restart writes to the same volume.
    DISK_FULL = 4
    #: MASTER_ADDR never resolved / its port never opened / the rendezvous timed out, or the
    #: script's own init_process_group did not complete within the bound. Retryable.
    RENDEZVOUS_TIMEOUT = 12
    #: A peer rank died or the collective timed out mid-training. Retryable.
    PEER_LOST = 13
    #: SIGTERM (preemption, pod deletion). The trainer saves a checkpoint first and says so in
    #: its termination message; another program's 143 promises nothing. Retryable.
    PREEMPTED = 143


#: Shell conventions: 126 = command not executable, 127 = command not found.
COMMAND_NOT_EXECUTABLE = 126
COMMAND_NOT_FOUND = 127

#: Exit codes a restart cannot fix. Every other non-zero exit, a signal, an OOM kill (137),
#: an eviction or a pod deleted from under the job is retryable.
DEFAULT_PERMANENT_EXIT_CODES: tuple[int, ...] = (
    int(ExitCode.BAD_CONFIG),
    int(ExitCode.DATA_MISSING),
    int(ExitCode.DISK_FULL),
    COMMAND_NOT_EXECUTABLE,
    COMMAND_NOT_FOUND,
)

EXIT_CODE_MEANINGS: Mapping[int, str] = {
    0: "success",
    1: "unexpected error (retryable)",
    2: "bad configuration (permanent)",
    3: "data missing (permanent)",
    4: "disk full: no space left for a checkpoint (permanent)",
    12: "rendezvous timeout: master unreachable (retryable)",
    13: "peer lost (retryable)",
    126: "command not executable (permanent)",
    127: "command not found (permanent)",
    137: "killed (SIGKILL, often the OOM killer) (retryable)",
    143: "terminated: SIGTERM (retryable)",
}


def is_permanent_exit(code: int, permanent_codes: tuple[int, ...] | frozenset[int]) -> bool:
    """Whether a container's exit code means a restart cannot help."""
    return code != 0 and code in permanent_codes


def describe_exit_code(code: int) -> str:
    if code in EXIT_CODE_MEANINGS:
        return EXIT_CODE_MEANINGS[code]
    if code > 128:
        return f"killed by signal {code - 128} (retryable)"
    return "non-zero exit"
