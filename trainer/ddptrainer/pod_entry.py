"""``ddptrain-pod``: the pod entry point. Wait for the master, run torchrun, exit honestly.

Usage::

    ddptrain-pod [POD OPTIONS] [ddptrain flags...]          # the trainer (ddptrainer.main)
    ddptrain-pod [POD OPTIONS] --script PATH [script args]  # your own script
    ddptrain-pod [POD OPTIONS] -m MODULE [module args]      # your own module

POD OPTIONS (only before everything else): ``--termination-log PATH``,
``--rendezvous-timeout-seconds N``, ``--launcher torchrun|spawn`` (default: DDPJOB_LAUNCHER,
else torchrun), ``--local-rank-flag --local_rank|--local-rank`` (default:
DDPJOB_LOCAL_RANK_FLAG), ``--requirements FILE`` (pip install -r FILE, once per container,
before the first attempt: ddptrainer/requirements.py). The rendezvous comes from the environment the operator sets
(PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT; torchrun reads
them itself); with none of them it is a single node on this machine.

Launchers (spec.launcher, docs/launch-styles.md): ``torchrun`` starts PET_NPROC_PER_NODE
copies of the script; ``spawn`` starts it once, for scripts that start their own processes
(mp.spawn). With a local-rank flag, each copy gets ``FLAG=<local rank>`` right after the
script, as torch.distributed.launch passed it. Every Python process started here runs under the
init guard (ddptrainer.init_guard: its init_process_group is checked against the job's world and
bounded by the rendezvous timeout); DDPJOB_INIT_GUARD=0 turns it off.

1. Node ranks other than 0 wait (bounded by DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS, logged) until
   PET_MASTER_ADDR resolves and PET_MASTER_PORT accepts connections: exit 12 if it never does.
   Node 0 does not wait: the port opens only when its own torchrun starts.
2. torchrun runs in this process (torch.distributed.run), so its failure is an exception we can
   read rather than its blanket exit status 1. The pod exits with the worst worker's code
   (see ``choose_exit_code``), a rendezvous that never forms gives 12, and SIGTERM, which
   torchrun forwards to the workers (they save a checkpoint), gives 143.
3. A short summary goes to the termination-message file, for ``kubectl describe`` and for the
   operator's ``status.failedNode.message``.

In InPlace mode the pod runs attempts in a loop (``_attempts``): each attempt waits for the
master, runs the workers and reads their end; success, a permanent code, no order within
DDPJOB_RESTART_WAIT_SECONDS and the kubelet's SIGTERM end the pod, a retryable failure waits
for the operator's order. What its HTTP side says meanwhile (``running``, ``failed``,
``stopping``) and what moves it is one table, ``contract.ENTRY_TRANSITIONS`` (docs/contract.md,
"In-place restart"), kept by ``restart_control.EntryControl``.

Each attempt starts with one line on stderr, ``ddptrain-pod: attempt N starts (run R)``
(``contract.attempt_mark``), the pod's first line included: ``ddpjob logs`` reads the attempts
from them.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NoReturn, Optional, Sequence

from ddpjob import contract
from ddpjob.contract import ExitCode

from . import init_guard, report, requirements, summary, threads, warm_start
from .rendezvous_wait import MasterUnreachable, resolve_address, wait_for_master, wait_for_master_attempt
from .restart_control import (EntryControl, RestartSettings, clear_progress, progress_reported,
                              read_restart_settings, stopper)
from .summary import WorkerEnding
from .text import BadInteger, env_int, first_line
from .warm_start import WarmStart

PROG = "ddptrain-pod"
WARM_START_WAIT_SECONDS = 30.0
DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS = 600
TRAINER_MODULE = "ddptrainer.main"

class PodUsageError(Exception):
    """A bad pod option or environment value (exit 2)."""


@dataclass(frozen=True)
class PodArgs:
    kind: str = "trainer"  # trainer | script | module
    target: str = TRAINER_MODULE
    args: tuple[str, ...] = ()
    termination_log: Optional[str] = None
    rendezvous_timeout_seconds: Optional[int] = None
    launcher: Optional[str] = None
    local_rank_flag: Optional[str] = None
    requirements: Optional[str] = None  # a requirements file, installed before the first attempt


@dataclass(frozen=True)
class NodeEnv:
    nnodes: int = 1
    node_rank: int = 0
    nproc_per_node: str = "1"
    master_addr: Optional[str] = None
    master_port: int = contract.DEFAULT_MASTER_PORT
    rendezvous_timeout_seconds: int = DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS
    #: What master_addr resolved to for this attempt (None: not resolved, or an address
    #: already): torchrun's --master-addr and the workers' MASTER_ADDR (_with_master_address).
    master_address: Optional[str] = None


def _positive_int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise PodUsageError(f"{what}: must be an integer, got {text!r}") from None
    if value < 1:
        raise PodUsageError(f"{what}: must be >= 1, got {value}")
    return value


# What this program can do; "none" (a command of the user's own) is treated as torchrun: it is
# what the pod entry point does when a user runs it as that command.
POD_LAUNCHERS = (contract.LAUNCHER_TORCHRUN, contract.LAUNCHER_SPAWN)


def _choice(value: str, allowed: Sequence[str], what: str) -> str:
    if value not in allowed:
        raise PodUsageError(f"{what}: must be one of {', '.join(allowed)}, got {value!r}")
    return value


def resolve_launch(pod: PodArgs, environ: Mapping[str, str]) -> PodArgs:
    """The launcher and local-rank flag: the pod options, else the operator's variables."""
    launcher = pod.launcher or environ.get(contract.DDPJOB_LAUNCHER) or contract.LAUNCHER_TORCHRUN
    if launcher == contract.LAUNCHER_NONE:
        launcher = contract.LAUNCHER_TORCHRUN
    launcher = _choice(launcher, POD_LAUNCHERS, contract.DDPJOB_LAUNCHER)
    flag = pod.local_rank_flag or environ.get(contract.DDPJOB_LOCAL_RANK_FLAG) or None
    if flag is not None:
        flag = _choice(flag, contract.LOCAL_RANK_FLAGS, contract.DDPJOB_LOCAL_RANK_FLAG)
        if pod.kind == "trainer":
            raise PodUsageError(f"a local-rank flag ({flag}) is for your own script: give it with "
                                "--script PATH or -m MODULE (the built-in trainer reads LOCAL_RANK)")
        if launcher != contract.LAUNCHER_TORCHRUN:
            raise PodUsageError(f"a local-rank flag ({flag}) needs launcher torchrun: with "
                                "launcher spawn your script starts its processes itself")
    if launcher == contract.LAUNCHER_SPAWN and pod.kind == "trainer":
        raise PodUsageError("launcher spawn runs your own script once per pod: give it with "
                            "--script PATH or -m MODULE (the built-in trainer uses launcher torchrun)")
    return dataclasses.replace(pod, launcher=launcher, local_rank_flag=flag)


def parse_pod_args(argv: Sequence[str]) -> PodArgs:
    argv = list(argv)
    opts: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        if arg == "--":
            i += 1
            break
        if name in ("--script", "-m", "--module", "--termination-log",
                    "--rendezvous-timeout-seconds", "--launcher", "--local-rank-flag", "--requirements"):
            if eq:
                value, i = inline, i + 1
            elif i + 1 < len(argv):
                value, i = argv[i + 1], i + 2
            else:
                raise PodUsageError(f"{name}: needs a value")
            if name == "--script":
                return PodArgs("script", value, tuple(argv[i:]), **opts)
            if name in ("-m", "--module"):
                return PodArgs("module", value, tuple(argv[i:]), **opts)
            if name == "--termination-log":
                opts["termination_log"] = value
            elif name == "--launcher":
                opts["launcher"] = _choice(value, POD_LAUNCHERS, name)
            elif name == "--local-rank-flag":
                opts["local_rank_flag"] = _choice(value, contract.LOCAL_RANK_FLAGS, name)
            elif name == "--requirements":
                opts["requirements"] = value
            else:
                opts["rendezvous_timeout_seconds"] = _positive_int(value, name)
            continue
        break
    return PodArgs("trainer", TRAINER_MODULE, tuple(argv[i:]), **opts)


def read_node_env(environ: Mapping[str, str], pod: PodArgs) -> NodeEnv:
    def get_int(name: str, default: int, low: int) -> int:
        try:
            value = env_int(environ, name, minimum=low)
        except BadInteger as e:
            raise PodUsageError(str(e)) from None
        return default if value is None else value

    timeout = pod.rendezvous_timeout_seconds or get_int(
        contract.DDPJOB_RENDEZVOUS_TIMEOUT_SECONDS, DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS, 1)
    nnodes = get_int(contract.PET_NNODES, 1, 1)
    node_rank = get_int(contract.PET_NODE_RANK, 0, 0)
    if node_rank >= nnodes:
        raise PodUsageError(f"{contract.PET_NODE_RANK}={node_rank}: must be below "
                            f"{contract.PET_NNODES}={nnodes}")
    return NodeEnv(nnodes=nnodes, node_rank=node_rank,
                   nproc_per_node=environ.get(contract.PET_NPROC_PER_NODE) or "1",
                   master_addr=environ.get(contract.PET_MASTER_ADDR) or None,
                   master_port=get_int(contract.PET_MASTER_PORT, contract.DEFAULT_MASTER_PORT, 1),
                   rendezvous_timeout_seconds=timeout)


def _master_progress_port(env: Mapping[str, str]) -> int:
    port = env_int(env, contract.DDPJOB_PROGRESS_PORT, 0, invalid=0) or 0
    return env_int(env, contract.DDPJOB_MASTER_PROGRESS_PORT, port, invalid=port) or port


def torchrun_argv(pod: PodArgs, node: NodeEnv, environ: Mapping[str, str],
                  warm: Optional[WarmStart] = None) -> list[str]:
    """torchrun's own argv: PET_* come from the environment, we add only the rendezvous bound;
    with ``warm``, each worker starts through the pod's warm process (ddptrainer/warm_start.py)."""
    argv: list[str] = []
    if node.master_address:
        argv += ["--master-addr", node.master_address]  # what PET_MASTER_ADDR resolved to
    static = (environ.get("PET_RDZV_BACKEND") or "static") == "static"
    if node.master_addr and static and not environ.get("PET_RDZV_CONF"):
        # The static rendezvous waits 600 s by default for every node's agent; bound it too.
        argv += ["--rdzv-conf", f"timeout={node.rendezvous_timeout_seconds}"]
    worker = worker_argv(pod, local_rank=TORCHRUN_LOCAL_RANK)
    if warm is not None:
        return argv + ["--no-python", *warm.worker_command(worker)]
    return argv + worker


# torchrun substitutes this in every worker's arguments (torch.distributed.elastic's macros):
# the dashed flag is what torchrun itself passes when asked; the underscore spelling, which
# torch.distributed.launch passed before torch 2.0, it no longer can.
TORCHRUN_LOCAL_RANK = "${local_rank}"


def worker_argv(pod: PodArgs, local_rank: str) -> list[str]:
    """The worker's arguments after ``python``: script or ``-m module``, the local-rank flag
    where torch.distributed.launch put it (right after the script), then the user's."""
    flag = [f"{pod.local_rank_flag}={local_rank}"] if pod.local_rank_flag else []
    if pod.kind == "script":
        return [pod.target, *flag, *pod.args]
    return ["-m", pod.target, *flag, *pod.args]


def contract_mismatch(environ: Mapping[str, str]) -> Optional[str]:
    """A warning when the operator that made this pod speaks another contract version.

    Not an error: the variables a version adds are optional to older readers, and a pod started
    by hand (no operator) has no version at all."""
    theirs = environ.get(contract.DDPJOB_CONTRACT_VERSION)
    if theirs and theirs != contract.CONTRACT_VERSION:
        return (f"warning: the operator set {contract.DDPJOB_CONTRACT_VERSION}={theirs} but this "
                f"trainer image speaks contract version {contract.CONTRACT_VERSION}; use an "
                "operator and a trainer image from the same release (docs/contract.md)")
    return None


def normalize_exit_code(code: int) -> int:
    """A worker killed by signal N (negative returncode) exits 128+N, as a shell reports it."""
    return 128 - code if code < 0 else code


def choose_exit_code(failures: Mapping[int, Any]) -> tuple[int, int]:
    """(global rank, exit code) that tells the truth about a failed node.

    ``failures`` maps global rank to torchrun's ProcessFailure (exitcode, timestamp). Order:

    1. a permanent code (bad config 2, data missing 3, disk full 4, 126, 127): retrying cannot help, and
       any one rank saying so decides;
    2. a root cause: any other code (1, 137, a signal, ...), the earliest first;
    3. the codes that are consequences of another failure: 143 (torchrun's SIGTERM to the
       survivors), then 12, then 13 (peer lost).
    Ties: the earliest failure, then the lowest rank.
    """
    def key(item: tuple[int, Any]) -> tuple[int, int, float, int]:
        rank, failure = item
        return contract.failure_rank(normalize_exit_code(int(failure.exitcode)),
                                     when=getattr(failure, "timestamp", None), order=rank)

    rank, failure = min(failures.items(), key=key)
    return rank, normalize_exit_code(int(failure.exitcode))


class _Terminated(Exception):
    def __init__(self, signum: int, message: str = ""):
        super().__init__(f"signal {signum}")
        self.signum = signum
        self.message = message


class _RestartOrdered(Exception):
    """The operator ordered a restart while this attempt was starting (InPlace mode)."""


def _raise_terminated(signum: int, _frame: Any) -> NoReturn:
    raise _Terminated(signum)


def _log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _mark_attempt(attempt: int, run: str) -> None:
    """The attempt's first line in the pod's log (docs/contract.md, "Attempt marks"). ``run`` is
    this process's own secret: never in the environment its programs inherit. On stderr, the
    stream of every other line of ours: the runtime reads stdout and stderr apart and stamps
    each line as it reads it, so a mark on stdout could be logged after the stderr line printed
    just after it (seen on kind), and the pod's first line would not be the mark."""
    print(contract.attempt_mark(attempt, run), file=sys.stderr, flush=True)


def _worker_note(endings: Sequence[WorkerEnding], rank: Optional[int]) -> str:
    """What trainer rank ``rank`` said as it ended, else the lowest rank that said anything."""
    said = {e.rank: e.message for e in endings if not e.is_guard_verdict}
    if rank is not None and rank in said:
        return said[rank]
    if said:
        return said[min(said)]  # type: ignore[type-var]
    return ""


def _summary_dir() -> Optional[str]:
    """A private folder for the workers' endings; None (no endings) on a read-only /tmp."""
    try:
        return tempfile.mkdtemp(prefix="ddptrain-pod-")
    except OSError:
        return None


def run(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    env = os.environ if environ is None else environ
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    # SIGTERM before torchrun is up: nothing to save yet, stop at once (torchrun installs
    # its own forwarding handlers when it starts the workers).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_terminated)
    run_mark = secrets.token_hex(contract.ATTEMPT_MARK_RUN_HEX // 2)
    _mark_attempt(env_int(env, contract.DDPJOB_RESTART_ATTEMPT, 0, invalid=0) or 0, run_mark)
    pod: Optional[PodArgs] = None
    node_rank = 0
    code, message = 0, ""
    try:
        pod = resolve_launch(parse_pod_args(raw), env)
        node = read_node_env(env, pod)
        node_rank = node.node_rank
        try:
            restart = read_restart_settings(env, _log)
        except BadInteger as e:
            raise PodUsageError(str(e)) from None
        threads_set = _set_worker_threads(pod, node.nproc_per_node, env)
        _log(f"node_rank={node.node_rank} nnodes={node.nnodes} nproc_per_node="
             f"{node.nproc_per_node} master={node.master_addr or 'localhost'}:"
             f"{node.master_port} rendezvous_timeout={node.rendezvous_timeout_seconds}s "
             f"run={pod.kind}:{pod.target} launcher={pod.launcher}"
             + (f" local_rank_flag={pod.local_rank_flag}" if pod.local_rank_flag else "")
             + (f" omp_threads={threads_set}" if threads_set else "")
             + (f" restart=InPlace wait={restart.wait_seconds}s grace={restart.grace_seconds}s"
                if restart else ""))
        if pod.requirements:
            _install_requirements(pod.requirements, node.node_rank, env)
        mismatch = contract_mismatch(env)
        if mismatch:
            _log(mismatch)
        control = _serve_progress(env, restart)
        if control is None or restart is None:
            code, message = _run_attempt(pod, node, env, None)
        else:
            code, message = _run_attempts(pod, node, env, control, restart, run_mark)
    except PodUsageError as e:
        code, message = int(ExitCode.BAD_CONFIG), f"bad configuration: {e}"
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
    except MasterUnreachable as e:
        code, message = int(ExitCode.RENDEZVOUS_TIMEOUT), f"rendezvous timeout: {e}"
        _log(message)
    except _Terminated as e:
        code = 128 + e.signum
        message = e.message or f"stopped by signal {e.signum} before training started"
        _log(message)
    _write_termination(pod, node_rank, env, code, message)
    return code


def _install_requirements(path: str, node_rank: int, env: Mapping[str, str]) -> None:
    """The packages of ``path`` installed (ddptrainer/requirements.py), first on the workers'
    path; a failure is a bad configuration (exit 2)."""
    try:
        target = requirements.install(path, node_rank, env, _log)
    except requirements.RequirementsError as error:
        raise PodUsageError(str(error)) from None
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != target]
    os.environ["PYTHONPATH"] = os.pathsep.join([target, *rest])


def _set_worker_threads(pod: PodArgs, nproc_per_node: str, env: Mapping[str, str]) -> Optional[int]:
    """OMP_NUM_THREADS for torchrun's workers where the job did not set it: the pod's CPUs
    shared among them (ddptrainer/threads.py; torchrun would warn and set 1). A script that
    spawns its own processes (launcher spawn), or a count torchrun picks (auto, gpu), is left
    as it was."""
    if (pod.launcher == contract.LAUNCHER_SPAWN or not nproc_per_node.isdigit()
            or threads.OMP_NUM_THREADS in env or threads.OMP_NUM_THREADS in os.environ):
        return None
    count = threads.per_worker(int(nproc_per_node))
    os.environ[threads.OMP_NUM_THREADS] = str(count)
    return count


def _write_termination(pod: Optional[PodArgs], node_rank: int, env: Mapping[str, str],
                       code: int, message: str) -> None:
    path, explicit = summary.resolve_termination_log(pod.termination_log if pod else None, env)
    summary.write_termination_message(f"{PROG}: node {node_rank}: exit {code}: {message}",
                                      path, explicit)


def _run_attempt(pod: PodArgs, node: NodeEnv, env: Mapping[str, str],
                 control: Optional[EntryControl], attempt: int = 0,
                 warm: Optional[WarmStart] = None) -> tuple[int, str]:
    """One attempt: wait for the master (nodes other than 0), run the workers, read their end."""
    summary_dir = _summary_dir()
    try:
        address: Optional[str] = None
        if node.node_rank != 0 and node.master_addr:
            if control is not None:
                wait_for_master_attempt(node.master_addr, _master_progress_port(env), attempt,
                                        node.rendezvous_timeout_seconds, _log)
            waited = wait_for_master(node.master_addr, node.master_port,
                                     node.rendezvous_timeout_seconds, _log)
            address = waited.address
            _log(f"master {node.master_addr}:{node.master_port} is up ({waited.address}); "
                 "starting torchrun")
        elif node.master_addr:
            address = resolve_address(node.master_addr)  # node 0's own name
        node = _with_master_address(node, address)
        if summary_dir:
            os.environ[summary.ENV_SUMMARY_DIR] = summary_dir
            os.environ[summary.ENV_ENTRY_PID] = str(os.getpid())  # whose children are workers
        else:
            os.environ.pop(summary.ENV_SUMMARY_DIR, None)
        _offer_stacks(control, summary_dir)
        # Every Python process started from here on runs under the init guard.
        os.environ.update(init_guard.guarded_environment(env))
        if pod.launcher == contract.LAUNCHER_SPAWN:
            code, message = _run_once(pod, node, summary_dir, control)
        else:
            code, message = _run_torchrun(pod, node, env, summary_dir, control, warm)
        return _guard_verdict(code, message, summary_dir)
    finally:
        if control is not None:
            control.stacks.directory = None
        os.environ.pop(contract.DDPJOB_STACKS_DIR, None)
        if summary_dir:
            shutil.rmtree(summary_dir, ignore_errors=True)


def _with_master_address(node: NodeEnv, address: Optional[str]) -> NodeEnv:
    """The node with its master as the address the name resolved to, for torchrun and the
    workers (their MASTER_ADDR): torch's store looks a name up for IPv6 first, and in a cluster
    whose DNS forwards what it does not know to a server that does not answer (an offline one;
    kind here), that walk of the search list costs seconds for every store connection, each
    attempt (docs/trainer.md). Where the name does not resolve (yet), it stays."""
    if not address or not node.master_addr or address == node.master_addr:
        return node
    return dataclasses.replace(node, master_address=address)


def _offer_stacks(control: Optional[EntryControl], summary_dir: Optional[str]) -> None:
    """Where the workers dump their stacks on SIGUSR1 (ddptrainer.stacks), for GET /stacks: only
    where the operator can ask (a restart token), in the attempt's private folder."""
    os.environ.pop(contract.DDPJOB_STACKS_DIR, None)
    if control is None or not summary_dir:
        return
    directory = os.path.join(summary_dir, "stacks")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as e:
        _log(f"stacks are off for this attempt: cannot create {directory}: {e}")
        return
    os.environ[contract.DDPJOB_STACKS_DIR] = directory
    control.stacks.directory = directory


def _serve_progress(env: Mapping[str, str],
                    restart: Optional["RestartSettings"] = None) -> Optional[EntryControl]:
    """Serve the workers' progress reports for the operator to poll (docs/contract.md), and in
    InPlace mode the restart protocol on the same port: its EntryControl, else None."""
    directory = env.get(contract.DDPJOB_PROGRESS_DIR) or ""
    port = env_int(env, contract.DDPJOB_PROGRESS_PORT, 0, invalid=0) or 0
    if port <= 0 or not (directory or restart):
        return None
    if directory:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            _log(f"progress reports are off: cannot create {directory}: {e}")
            if restart is None:
                return None
    control = None
    if restart is not None:
        control = EntryControl(restart.first_attempt, token_sha256=restart.token_sha256)
        control.stop_workers = stopper(control, restart.grace_seconds, _log)
    host = env.get(contract.DDPJOB_PROGRESS_ADDRESS) or "0.0.0.0"
    if report.serve_progress(directory, port, host=host, control=control) is None:
        _log(f"progress reports are off: port {port} is taken"
             + ("; no in-place restart either" if control else ""))
        return None
    return control


def _run_attempts(pod: PodArgs, node: NodeEnv, env: Mapping[str, str], control: EntryControl,
                  restart: RestartSettings, run_mark: str) -> tuple[int, str]:
    """InPlace mode: attempts until one succeeds, fails permanently, waits for an order in
    vain, or the kubelet's SIGTERM ends the pod (``_Terminated``, exit 143 as before)."""

    def on_signal(signum: int, _frame: Any) -> None:
        if signum == signal.SIGTERM and control.claim_self_signal():
            if control.active:
                raise _RestartOrdered
            return  # the attempt ended meanwhile: the loop sees the order
        control.end()
        raise _Terminated(signum)

    attempt = restart.first_attempt
    os.environ[contract.DDPJOB_RESTART_ATTEMPT] = str(attempt)
    warm = _warm_start(pod, env, control, restart)
    try:
        return _attempts(pod, node, env, control, restart, run_mark, attempt, on_signal, warm)
    finally:
        if warm is not None:
            warm.stop()


def _warm_start(pod: PodArgs, env: Mapping[str, str], control: EntryControl,
                restart: RestartSettings) -> Optional[WarmStart]:
    """The pod's warm process for the next attempts' workers (ddptrainer/warm_start.py), unless
    it is off or the launcher starts its processes itself (spawn); it starts once the first
    attempt's workers have reported progress for ``restart.warm_start_after_seconds``, or at the
    first failure, whichever comes first."""
    if not warm_start.enabled(env) or pod.launcher == contract.LAUNCHER_SPAWN:
        return None
    warm = WarmStart(env, _log)
    control.stop_workers = stopper(control, restart.grace_seconds, _log, spare=warm.pids)
    warm.start_once_reporting(env.get(contract.DDPJOB_PROGRESS_DIR), restart.warm_start_after_seconds)
    return warm


def _attempts(pod: PodArgs, node: NodeEnv, env: Mapping[str, str], control: EntryControl,
              restart: RestartSettings, run_mark: str, attempt: int,
              on_signal: Callable[[int, Any], None], warm: Optional[WarmStart]) -> tuple[int, str]:
    first = attempt
    while True:
        code, message = 0, ""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        control.workers_active(True)
        try:
            code, message = _run_attempt(pod, node, env, control, attempt,
                                         _warm_if_ready(warm) if attempt != first else None)
        except _RestartOrdered:
            pass
        except MasterUnreachable as e:
            code, message = int(ExitCode.RENDEZVOUS_TIMEOUT), f"rendezvous timeout: {e}"
            _log(message)
        finally:
            control.workers_active(False)
            # torchrun's handlers (and spawn's forwarding ones) outlive the attempt
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, on_signal)
        if control.ordered is None:
            if code == 0 or contract.is_permanent_exit(code, restart.permanent_codes):
                return code, message
            # From the failed state on (the operator may see it at once), a SIGTERM is the
            # kubelet's while this pod waits: the message must say so, wherever it lands.
            try:
                control.fail(code, message, reported=progress_reported(env.get(contract.DDPJOB_PROGRESS_DIR)))
                if warm is not None:
                    warm.start()  # its import overlaps the wait for the order and the peers' stop
                _write_termination(pod, node.node_rank, env, code, message)
                _log(f"attempt {attempt} failed (exit {code}); waiting up to "
                     f"{restart.wait_seconds}s for a restart order")
                ordered = control.wait_for_order(restart.wait_seconds)
            except _Terminated as e:
                raise _Terminated(e.signum, f"stopped by signal {e.signum} while waiting for a "
                                  f"restart order; attempt {attempt} had failed: {message}") from None
            if ordered is None:
                _log(f"no restart order within {restart.wait_seconds}s: exiting {code}")
                return code, message
        attempt = control.ordered or attempt + 1
        clear_progress(env.get(contract.DDPJOB_PROGRESS_DIR))
        os.environ[contract.DDPJOB_RESTART_ATTEMPT] = str(attempt)
        control.begin(attempt)
        _log(f"restarting in place: attempt {attempt}")
        _mark_attempt(attempt, run_mark)


def _warm_if_ready(warm: Optional[WarmStart]) -> Optional[WarmStart]:
    """The warm process if it serves (an import under way is waited for, up to
    WARM_START_WAIT_SECONDS: it is shorter than each worker importing), else None: the workers
    start as usual."""
    if warm is None:
        return None
    warm.start()  # the previous attempt ended before its workers reported or failed: now
    if warm.ready(WARM_START_WAIT_SECONDS):
        _log("workers start from the warm process (torch imported already)")
        return warm
    _log(f"the warm process does not serve within {WARM_START_WAIT_SECONDS:g}s: workers start as usual")
    return None


def _guard_verdict(code: int, message: str, summary_dir: Optional[str]) -> tuple[int, str]:
    """A failed node whose init guard refused a world (2) or timed out a rendezvous (12) exits
    with the guard's code and words: the processes above the guarded one (an mp.spawn parent,
    say) report only "a child failed" (1)."""
    if code == 0:
        return code, message
    verdicts = init_guard.read_verdicts(summary_dir)
    if not verdicts:
        return code, message
    verdict_code, verdict_message = verdicts[0]
    _log(f"the init guard decided the exit code: {verdict_code} (the workers reported {code})")
    return verdict_code, verdict_message


def _run_once(pod: PodArgs, node: NodeEnv, summary_dir: Optional[str],
              control: Optional[EntryControl] = None) -> tuple[int, str]:
    """launcher spawn: the script once; its exit code is the node's.

    The script and the processes it spawns stay in our process group, so that whoever stops
    the node by its group (``ddpjob run``) stops them all. A SIGTERM sent to us alone (the
    kubelet's, to the container's first process) is passed on to the whole group, so the
    spawned processes can save a checkpoint too."""
    import subprocess

    argv = [sys.executable, "-u", *worker_argv(pod, local_rank="0")]
    # Only a group we lead is ours to signal (a pod's first process, a `ddpjob run` node);
    # started inside someone else's group, the script gets a group of its own instead.
    leader = os.getpgrp() == os.getpid()
    child_env = dict(os.environ)
    if node.master_address:
        child_env[contract.MASTER_ADDR] = node.master_address  # (_with_master_address)
    child = subprocess.Popen(argv, start_new_session=not leader, env=child_env)
    group = os.getpgrp() if leader else child.pid

    terminated: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        if not (control is not None and signum == signal.SIGTERM and control.claim_self_signal()):
            terminated.append(signum)  # not a restart order's: the pod ends
        signal.signal(signum, signal.SIG_IGN)  # our group includes us: once is enough
        try:
            os.killpg(group, signum)
        except (ProcessLookupError, PermissionError):
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    try:
        returncode = child.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
    code = normalize_exit_code(returncode)
    note = _worker_note(summary.read_endings(summary_dir), None)
    if control is not None and terminated:
        control.end()
        raise _Terminated(terminated[0], f"stopped by signal {terminated[0]}; the script exited "
                          f"{code}" + (f": {note}" if note else ""))
    if code == 0:
        return 0, note or "completed"
    message = f"the script exited {code} ({contract.describe_exit_code(code)})" + (f": {note}" if note else "")
    _log(message)
    return code, message


#: How long node 0's agent keeps its store up once every node has passed torchrun's exit barrier.
EXIT_BARRIER_LINGER_SECONDS = 2.0


def _keep_the_store_after_the_exit_barrier() -> None:
    """Node 0's torchrun agent hosts the store; once the last node arrives at the exit barrier
    it returns and closes the store while the other agents may still be reading the barrier's
    key, and a healthy run ends with "Error waiting on exit barrier" and a screen of C++
    frames on those nodes (pytorch/pytorch#69520, open). Its agent now waits a moment after the
    barrier, the store still up. Where torch's agent has no such method, nothing changes."""
    from torch.distributed.elastic.agent.server import api

    barrier = getattr(api.SimpleElasticAgent, "_exit_barrier", None)
    if barrier is None or getattr(barrier, "ddptrainer_lingers", False):
        return

    def exit_barrier_then_linger(self: Any) -> None:
        barrier(self)
        time.sleep(EXIT_BARRIER_LINGER_SECONDS)

    exit_barrier_then_linger.ddptrainer_lingers = True  # type: ignore[attr-defined]
    api.SimpleElasticAgent._exit_barrier = exit_barrier_then_linger  # type: ignore[method-assign]


def _run_torchrun(pod: PodArgs, node: NodeEnv, env: Mapping[str, str],
                  summary_dir: Optional[str],
                  control: Optional[EntryControl] = None,
                  warm: Optional[WarmStart] = None) -> tuple[int, str]:
    # Imported late: waiting for the master should not pay for importing torch.
    import torch.distributed.run as torchrun
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    # Workers inherit os.environ (run() put the endings' folder and the guard there).
    def endings() -> list[WorkerEnding]:
        return summary.read_endings(summary_dir)

    args = torchrun.parse_args(torchrun_argv(pod, node, env, warm))
    if node.node_rank == 0 and node.nnodes > 1:
        _keep_the_store_after_the_exit_barrier()
    started = time.monotonic()
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        rank, code = choose_exit_code(e.failures)
        failure = e.failures[rank]
        note = (_worker_note(endings(), rank)
                # torchrun's message is a real one only when the worker left an error file
                or (failure.message if failure.exitcode < 0
                    or os.path.isfile(failure.error_file or "") else "")
                or "the worker left no summary (see the pod log)")
        others = len(e.failures) - 1
        message = f"worker rank {rank} exited {code} ({contract.describe_exit_code(code)}): {note}"
        if others:
            message += f" [{others} other worker(s) failed too]"
        _log(message)
        return code, message
    except SignalException as e:
        code = 128 + int(e.sigval)
        note = _worker_note(endings(), None)
        if control is not None and int(e.sigval) == signal.SIGTERM and control.claim_self_signal():
            message = f"stopped for a restart order; workers were asked to save: {note}"
            _log(message)
            return code, message
        message = f"stopped by signal {int(e.sigval)}; workers were asked to save: {note}"
        _log(message)
        if control is not None:  # the kubelet's: the pod ends, in any state
            control.end()
            raise _Terminated(int(e.sigval), message) from None
        return code, message
    except (RendezvousError, DistError) as e:
        waited = time.monotonic() - started
        message = (f"rendezvous timeout: the {node.nnodes} nodes did not meet within "
                   f"{waited:.0f}s: {first_line(e)}")
        _log(message)
        return int(ExitCode.RENDEZVOUS_TIMEOUT), message
    note = _worker_note(endings(), None)
    return 0, note or "completed"


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
