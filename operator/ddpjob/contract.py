"""The contract between the operator and the program in each pod.

The operator (package ``ddpjob``) never imports torch and the trainer (package ``ddptrainer``)
never imports kopf or kubernetes; this module, standard library only, is what joins them.
It defines, once:

* the environment every DDPJob pod gets (and every local node process under ``ddpjob run``);
* the trainer's exit codes, which of them a restart cannot fix, and which failure among several
  is the root cause (``failure_rank``: the operator's ``status.failedNode``, the pod's exit code
  and the init guard's verdicts all sort by it).

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
import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

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
#: The DDPJob's metadata.uid: a job deleted and created again under the same name is another
#: job (the trainer records it as its checkpoints' owner). ``ddpjob run``: one fresh id per run.
DDPJOB_UID = "DDPJOB_UID"
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
#: The answer's key naming the attempt whose workers wrote its reports, where the server knows it
#: (the pod entry point in InPlace mode). A restart in place clears the reports of the attempt
#: before, but until the order arrives the operator already counts the pod in the next attempt:
#: an answer for another attempt than the one polled carries no report of it.
PROGRESS_ATTEMPT_KEY = "attempt"
#: The keys of one report (a JSON object, one file per rank); only ``step`` is required.
#: ``throughput`` is in samples per second; ``time`` is the writer's Unix time;
#: ``checkpoint_seconds``: what the last periodic checkpoint held training up, and
#: ``checkpoint_interval_seconds``: the seconds between the last two (the operator's advice).
PROGRESS_REPORT_KEYS = ("step", "total_steps", "epoch", "epochs", "loss", "throughput", "time",
                        "checkpoint_seconds", "checkpoint_interval_seconds")


def progress_file_name(rank: int) -> str:
    """The file one training process (global rank ``rank``) writes its reports to."""
    return f"rank-{int(rank)}.json"


def clear_progress_reports(directory: str) -> None:
    """Remove the ranks' report files (``rank-*.json``) of ``directory``; nothing else there.
    Before an attempt restarted in place, whose reports the previous attempt's would pass for."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def read_progress_reports(directory: str, now: Optional[float] = None,
                          attempt: Optional[int] = None) -> dict[str, dict[str, Any]]:
    """The reports in ``directory`` by rank, each with ``age_seconds`` (from the file's mtime);
    with ``attempt``, not those that say they were written in another attempt."""
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
            written_in = report.get("attempt")
            if attempt is not None and isinstance(written_in, int) and written_in != attempt:
                continue
            report = {k: report[k] for k in PROGRESS_REPORT_KEYS if k in report}
            reports[name[len("rank-"):-len(".json")]] = {**report, "age_seconds": round(age, 3)}
    return reports


# ---------------------------------------------------------------------------------------------
# In-place gang restart (docs/contract.md, "In-place restart")
# ---------------------------------------------------------------------------------------------
#: failurePolicy.restartMode. Only ``InPlace`` (with a progress port > 0 and a token) makes the
#: pod entry point wait for a restart order after a retryable failure of its workers.
DDPJOB_RESTART_MODE = "DDPJOB_RESTART_MODE"
#: The credential a restart order carries (``Authorization: Bearer <token>``), random per pod.
#: ``ddpjob run`` gives its local nodes the token itself; the operator gives a pod only
#: DDPJOB_RESTART_TOKEN_SHA256, the token's digest, because a pod's environment is readable by
#: every reader of its namespace (``kubectl describe``, the ``view`` role, monitoring agents) and
#: a digest lets none of them order a restart (docs/security.md, "The restart token").
DDPJOB_RESTART_TOKEN = "DDPJOB_RESTART_TOKEN"
#: The SHA-256 of the pod's restart token, 64 lowercase hex digits: an order is taken when the
#: digest of the token it carries is this one.
DDPJOB_RESTART_TOKEN_SHA256 = "DDPJOB_RESTART_TOKEN_SHA256"
#: Public and random per pod: what the operator's key turns into the pod's token (the entry
#: point never reads it; the operator reads it back from the pod's spec).
DDPJOB_RESTART_NONCE = "DDPJOB_RESTART_NONCE"
#: How long a pod whose workers failed (retryably) waits for an order before it exits.
DDPJOB_RESTART_WAIT_SECONDS = "DDPJOB_RESTART_WAIT_SECONDS"
#: How long the workers of a pod ordered to restart get to save before they are killed.
DDPJOB_RESTART_GRACE_SECONDS = "DDPJOB_RESTART_GRACE_SECONDS"
#: failurePolicy.permanentExitCodes, comma-separated: the pod exits at once on these.
DDPJOB_PERMANENT_EXIT_CODES = "DDPJOB_PERMANENT_EXIT_CODES"
#: Not set by the operator (every pod serves on the same port): node 0's progress port, where
#: the other nodes ask which attempt it runs, when several nodes share one machine (tests).
DDPJOB_MASTER_PROGRESS_PORT = "DDPJOB_MASTER_PROGRESS_PORT"
#: Not set by the operator (a pod serves on every address of its own network namespace): the
#: address the entry point serves its port on. ``ddpjob run`` sets 127.0.0.1, so that only this
#: machine reaches its nodes' ports.
DDPJOB_PROGRESS_ADDRESS = "DDPJOB_PROGRESS_ADDRESS"
#: Not set by the operator (yours to set in the template): ``0`` turns off the warm start of an
#: in-place restart's workers (forked from a process that imported torch: ddptrainer/warm_start.py).
DDPJOB_WARM_START = "DDPJOB_WARM_START"
#: Not set by the operator (yours to set in the template): how long the first attempt's workers
#: report progress before the warm process starts (its import and its idle interpreter are paid
#: only by a job that trains that long; a failure before starts it at once).
DDPJOB_WARM_START_AFTER_SECONDS = "DDPJOB_WARM_START_AFTER_SECONDS"

RESTART_MODE_IN_PLACE = "InPlace"
RESTART_MODE_RECREATE = "Recreate"
RESTART_MODES = (RESTART_MODE_IN_PLACE, RESTART_MODE_RECREATE)  # the default first
DEFAULT_RESTART_WAIT_SECONDS = 60
DEFAULT_RESTART_GRACE_SECONDS = 30
DEFAULT_WARM_START_AFTER_SECONDS = 60

#: The line the pod entry point prints on stdout as each attempt starts (the pod's first, then
#: each one it restarts in place), for ``ddpjob logs``: ``ddptrain-pod: attempt 1 starts (run
#: 5f0c...)``. The run is random per start of the entry point and written nowhere else (not in
#: the environment its programs inherit), and the pod's first log line carries it: a line a
#: program prints to look like a mark cannot know it (docs/contract.md, "Attempt marks").
ATTEMPT_MARK_RUN_HEX = 16
ATTEMPT_MARK = re.compile(r"ddptrain-pod: attempt (\d{1,10}) starts \(run ([0-9a-f]{%d})\)" % ATTEMPT_MARK_RUN_HEX)


def attempt_mark(attempt: int, run: str) -> str:
    """The mark of ``attempt`` of the entry point's ``run`` (ATTEMPT_MARK_RUN_HEX hex digits)."""
    return f"ddptrain-pod: attempt {attempt} starts (run {run})"


def parse_attempt_mark(line: str) -> Optional[tuple[int, str]]:
    """(attempt, run) of a whole line that is a mark, else None."""
    match = ATTEMPT_MARK.fullmatch(line)
    if match is None or int(match.group(1)) > MAX_ATTEMPT:
        return None
    return int(match.group(1)), match.group(2)


#: On the progress port: GET (200 while running, else 503, the /attempt body either way).
READY_PATH = "/ready"
#: On the progress port: GET, the entry point's state (``EntryState``), unauthenticated.
ATTEMPT_PATH = "/attempt"
#: On the progress port: POST ``{"attempt": M}`` with the token: restart the workers as M.
RESTART_PATH = "/restart"
ENTRY_RUNNING = "running"
ENTRY_FAILED = "failed"
ENTRY_STOPPING = "stopping"
ENTRY_STATES = (ENTRY_RUNNING, ENTRY_FAILED, ENTRY_STOPPING)
#: What moves the entry point between its states: an order accepted (POST /restart for a
#: later attempt), the attempt's workers failing retryably, the ordered attempt starting.
ENTRY_ORDER = "order"
ENTRY_FAIL = "fail"
ENTRY_BEGIN = "begin"
#: The entry point's transitions, (state, event) -> next state, in one place: restart_control's
#: EntryControl makes every change of its state through this table, and docs/contract.md shows
#: it (a test compares). An event a state does not list leaves the state as it is. Beside it,
#: what ends the pod in any state: success, a permanent code, no order in time, the kubelet's
#: SIGTERM.
ENTRY_TRANSITIONS: dict[tuple[str, str], str] = {
    (ENTRY_RUNNING, ENTRY_FAIL): ENTRY_FAILED,      # wait for an order; /ready says 503
    (ENTRY_RUNNING, ENTRY_ORDER): ENTRY_STOPPING,   # a healthy pod of a failed gang: stop the workers
    (ENTRY_FAILED, ENTRY_ORDER): ENTRY_STOPPING,    # the order the failed pod waited for
    (ENTRY_STOPPING, ENTRY_ORDER): ENTRY_STOPPING,  # a retry of the order, or a newer attempt's
    (ENTRY_STOPPING, ENTRY_FAIL): ENTRY_STOPPING,   # the stopped workers' end: the order stands
    (ENTRY_STOPPING, ENTRY_BEGIN): ENTRY_RUNNING,   # the ordered attempt's workers start
}
#: Bounds of the protocol: the message of /attempt, a /restart body, a whole /attempt answer.
MAX_ENTRY_MESSAGE_CHARS = 1024
MAX_RESTART_BODY_BYTES = 1024
MAX_ENTRY_ANSWER_BYTES = 4096
#: Attempts and ages beyond these are nonsense, not numbers to compute with.
MAX_ATTEMPT = 2**31 - 1
MAX_SECONDS_SINCE_FAILURE = 10.0**9

#: On the progress port: GET with the token: the Python stacks of the pod's live workers
#: (``{"ranks": {"<global rank>": "<faulthandler dump>"}}``), asked by the operator before it
#: restarts a stalled gang. 401 without the token, 503 when no worker runs.
STACKS_PATH = "/stacks"
#: Set by the pod entry point for its workers (never by the operator): the folder where each
#: worker's sitecustomize registers ``faulthandler`` on SIGUSR1 to a file of its own.
DDPJOB_STACKS_DIR = "DDPJOB_STACKS_DIR"
#: Bounds of /stacks: lines and characters of one rank's dump, ranks and bytes of an answer.
MAX_STACK_LINES = 60
MAX_STACK_CHARS = 4096
MAX_STACK_RANKS = 64
MAX_STACKS_ANSWER_BYTES = 16384
_STACK_KEY = re.compile(r"\d{1,7}(/pid\d{1,9})?")


@dataclass(frozen=True)
class EntryState:
    """What a pod entry point says about itself at ``GET /attempt`` (or ``/ready``)."""

    attempt: int
    state: str
    """One of ``ENTRY_STATES``."""
    exit_code: Optional[int] = None
    """The failed attempt's exit code (the node's, as its termination message says)."""
    message: str = ""
    seconds_since_failure: Optional[float] = None
    reported: bool = False
    """Whether the attempt's workers wrote a progress report before they failed: the operator's
    own poll of ``/progress`` may have missed a short attempt that did train, and an attempt
    restarted in place that failed before any report gets new pods (controller/policy/restart_mode.py)."""

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "state": self.state, "exitCode": self.exit_code,
                "message": self.message[:MAX_ENTRY_MESSAGE_CHARS],
                "secondsSinceFailure": self.seconds_since_failure, "reported": self.reported}


def _plain_int(value: Any, low: int, high: int) -> Optional[int]:
    """``value`` if it is an int (not a bool) within low..high, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


# What a pod writes (a termination message, a waiting or scheduling reason, an entry point's
# answer) reaches the status, Events, `kubectl describe` and `kubectl get events`, which print
# it raw: the C0 controls but tab and newline, DEL, the C1 controls, the zero-width and bidi
# formatting characters (CVE-2021-42574) and the line and paragraph separators become escapes
# (``\x1b``), so no pod's text can steer a reader's terminal or hide what it says.
_UNSAFE_POD_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e"
                              "\u2060-\u2069\ufeff]")


def escape(match: "re.Match[str]") -> str:
    """One unsafe character as the escape that names it: ``\\x1b``, ``\\u202e``."""
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def pod_text(text: str) -> str:
    """Text a pod wrote, safe to keep in the status and Events (tabs and newlines kept)."""
    return _UNSAFE_POD_TEXT.sub(escape, text)


def parse_entry_state(body: bytes) -> Optional[EntryState]:
    """The pod's answer at /attempt, or None for anything malformed. Never raises.

    The body comes from a pod, untrusted: it is bounded (``MAX_ENTRY_ANSWER_BYTES``), must be a
    JSON object of the protocol's types (a bool is not an int, NaN and Infinity are refused,
    numbers are bounded), a ``failed`` state must carry its exit code, ``reported`` is a bool
    (absent: False), and the message is cut to ``MAX_ENTRY_MESSAGE_CHARS``."""
    if not isinstance(body, (bytes, bytearray)) or len(body) > MAX_ENTRY_ANSWER_BYTES:
        return None
    try:
        data = json.loads(bytes(body).decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    attempt = _plain_int(data.get("attempt"), 0, MAX_ATTEMPT)
    state = data.get("state")
    if attempt is None or not isinstance(state, str) or state not in ENTRY_STATES:
        return None
    raw_code = data.get("exitCode")
    exit_code = None if raw_code is None else _plain_int(raw_code, 0, 255)
    if (raw_code is not None and exit_code is None) or (state == ENTRY_FAILED and exit_code is None):
        return None
    message = data.get("message", "")
    if message is None:
        message = ""
    if not isinstance(message, str):
        return None
    seconds = data.get("secondsSinceFailure")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            return None
        try:
            seconds = float(seconds)
        except OverflowError:
            return None
        if not (math.isfinite(seconds) and 0.0 <= seconds <= MAX_SECONDS_SINCE_FAILURE):
            return None
    reported = data.get("reported", False)  # absent: an entry point from before the field
    if not isinstance(reported, bool):
        return None
    return EntryState(attempt=attempt, state=state, exit_code=exit_code,
                      message=pod_text(message[:MAX_ENTRY_MESSAGE_CHARS])[:MAX_ENTRY_MESSAGE_CHARS], seconds_since_failure=seconds,
                      reported=reported)


def parse_stacks(body: bytes) -> Optional[dict[str, str]]:
    """The pod's answer at /stacks: ``{rank key: dump}``, or None for anything malformed.
    Never raises. Untrusted like /attempt's: bounded in bytes and ranks, keys of the protocol's
    form (``"3"``, or ``"3/pid42"`` where several processes of a pod said they were rank 3),
    each dump a string cut to ``MAX_STACK_LINES`` lines of ``MAX_STACK_CHARS`` in all."""
    if not isinstance(body, (bytes, bytearray)) or len(body) > MAX_STACKS_ANSWER_BYTES:
        return None
    try:
        data = json.loads(bytes(body).decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    ranks = data.get("ranks") if isinstance(data, dict) else None
    if not isinstance(ranks, dict) or len(ranks) > MAX_STACK_RANKS:
        return None
    stacks: dict[str, str] = {}
    for key, text in ranks.items():
        if not (isinstance(key, str) and _STACK_KEY.fullmatch(key) and isinstance(text, str)):
            return None
        stacks[key] = bound_stack(text)
    return stacks


def bound_stack(text: str) -> str:
    """A dump cut to its first ``MAX_STACK_LINES`` lines (faulthandler writes the innermost
    frame first) and ``MAX_STACK_CHARS`` characters, control characters but newlines dropped."""
    lines = text.splitlines()[:MAX_STACK_LINES]
    kept = "\n".join("".join(c for c in line if c.isprintable()) for line in lines)
    return kept[:MAX_STACK_CHARS]


def parse_permanent_exit_codes(text: Optional[str]) -> tuple[int, ...]:
    """``DDPJOB_PERMANENT_EXIT_CODES`` ("2,3,4"): the codes; the defaults when unset or not a
    clean list of codes 1..255 (a pod must not wait on a code the job calls permanent, so a
    garbled list falls back to the defaults rather than to none)."""
    if not text or not text.strip():
        return DEFAULT_PERMANENT_EXIT_CODES
    codes = []
    for part in text.split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or len(part) > 3 or not 1 <= int(part) <= 255:
            return DEFAULT_PERMANENT_EXIT_CODES
        codes.append(int(part))
    return tuple(dict.fromkeys(codes))


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
        DDPJOB_UID, DDPJOB_RESTART_ATTEMPT, DDPJOB_DEVICE, DDPJOB_CONTRACT_VERSION, DDPJOB_LAUNCHER,
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
    job_uid: str = "",
    restart_mode: str | None = None,
    restart_token: str | None = None,
    restart_token_sha256: str | None = None,
    restart_nonce: str | None = None,
    restart_wait_seconds: int = DEFAULT_RESTART_WAIT_SECONDS,
    permanent_exit_codes: Sequence[int] = (),
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
        DDPJOB_UID: job_uid,
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
    if restart_mode:
        env[DDPJOB_RESTART_MODE] = restart_mode
        env[DDPJOB_PERMANENT_EXIT_CODES] = ",".join(str(c) for c in permanent_exit_codes)
        env[DDPJOB_RESTART_WAIT_SECONDS] = str(restart_wait_seconds)
        if restart_token:
            env[DDPJOB_RESTART_TOKEN] = restart_token
        if restart_token_sha256:
            env[DDPJOB_RESTART_TOKEN_SHA256] = restart_token_sha256
            env[DDPJOB_RESTART_NONCE] = restart_nonce or ""
    return env


def restart_token_digest(token: str) -> str:
    """What DDPJOB_RESTART_TOKEN_SHA256 holds for ``token``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


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


# ---------------------------------------------------------------------------------------------
# Which failure is the root cause
# ---------------------------------------------------------------------------------------------
#: Exit codes a process gets *because* another one failed, the most telling first: 143 (torchrun
#: stops the survivors with SIGTERM; or a preemption), 12 (a peer never joined the rendezvous),
#: 13 (a peer was lost mid-training: it died first).
CONSEQUENCE_EXIT_CODES: tuple[int, ...] = (
    int(ExitCode.PREEMPTED),
    int(ExitCode.RENDEZVOUS_TIMEOUT),
    int(ExitCode.PEER_LOST),
)


def failure_rank(exit_code: Optional[int], *, when: Optional[float] = None, order: int = 0,
                 permanent_codes: tuple[int, ...] | frozenset[int] = DEFAULT_PERMANENT_EXIT_CODES,
                 ) -> tuple[int, int, float, int]:
    """The sort key that puts the root cause of several failures first (the smallest key).

    One ranking for the three places that pick one failure among several: the operator's root
    cause (``api.failure_policy``, nodes), the pod's exit code (``ddptrain-pod``, its worker
    processes) and the init guard's verdicts. In order:

    1. a permanent code (``permanent_codes``): a restart cannot help, and one process saying so
       decides;
    2. a cause of its own: any other failure (1, 137, a signal, or no exit code at all: a pod
       evicted or deleted);
    3. a consequence of another failure, in ``CONSEQUENCE_EXIT_CODES``' order (143, 12, 13);

    then the earliest (``when``, in seconds; unknown sorts last), then the lowest ``order`` (a
    node or global rank).
    """
    if exit_code is not None and is_permanent_exit(exit_code, permanent_codes):
        klass, sub = 0, 0
    elif exit_code in CONSEQUENCE_EXIT_CODES:
        klass, sub = 2, CONSEQUENCE_EXIT_CODES.index(exit_code)
    else:
        klass, sub = 1, 0
    return klass, sub, float("inf") if when is None else float(when), order


def describe_exit_code(code: int) -> str:
    if code in EXIT_CODE_MEANINGS:
        return EXIT_CODE_MEANINGS[code]
    if code > 128:
        return f"killed by signal {code - 128} (retryable)"
    return "non-zero exit"
