"""``ddptrain-pod``: the pod entry point. Wait for the master, run torchrun, exit honestly.

Usage::

    ddptrain-pod [POD OPTIONS] [ddptrain flags...]          # the trainer (ddptrainer.main)
    ddptrain-pod [POD OPTIONS] --script PATH [script args]  # your own script
    ddptrain-pod [POD OPTIONS] -m MODULE [module args]      # your own module

POD OPTIONS (only before everything else): ``--termination-log PATH``,
``--rendezvous-timeout-seconds N``, ``--launcher torchrun|spawn`` (default: DDPJOB_LAUNCHER,
else torchrun), ``--local-rank-flag --local_rank|--local-rank`` (default:
DDPJOB_LOCAL_RANK_FLAG). The rendezvous comes from the environment the operator sets
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
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping, NoReturn, Optional, Sequence

from ddpjob import contract
from ddpjob.contract import ExitCode

from . import init_guard, report, summary
from .rendezvous_wait import MasterUnreachable, wait_for_master

PROG = "ddptrain-pod"
DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS = 600
TRAINER_MODULE = "ddptrainer.main"

# Exit codes that are consequences of another rank's failure, least informative last.
_CONSEQUENCES = (int(ExitCode.PREEMPTED), int(ExitCode.RENDEZVOUS_TIMEOUT),
                 int(ExitCode.PEER_LOST))


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


@dataclass(frozen=True)
class NodeEnv:
    nnodes: int = 1
    node_rank: int = 0
    nproc_per_node: str = "1"
    master_addr: Optional[str] = None
    master_port: int = contract.DEFAULT_MASTER_PORT
    rendezvous_timeout_seconds: int = DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS


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
    return PodArgs(pod.kind, pod.target, pod.args, pod.termination_log,
                   pod.rendezvous_timeout_seconds, launcher, flag)


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
                    "--rendezvous-timeout-seconds", "--launcher", "--local-rank-flag"):
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
            else:
                opts["rendezvous_timeout_seconds"] = _positive_int(value, name)
            continue
        break
    return PodArgs("trainer", TRAINER_MODULE, tuple(argv[i:]), **opts)


def read_node_env(environ: Mapping[str, str], pod: PodArgs) -> NodeEnv:
    def get_int(name: str, default: int, low: int) -> int:
        raw = environ.get(name)
        if raw in (None, ""):
            return default
        try:
            value = int(raw)
        except ValueError:
            raise PodUsageError(f"{name}={raw!r}: must be an integer") from None
        if value < low:
            raise PodUsageError(f"{name}={raw!r}: must be >= {low}")
        return value

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


def torchrun_argv(pod: PodArgs, node: NodeEnv, environ: Mapping[str, str]) -> list[str]:
    """torchrun's own argv: PET_* come from the environment, we add only the rendezvous bound."""
    argv: list[str] = []
    static = (environ.get("PET_RDZV_BACKEND") or "static") == "static"
    if node.master_addr and static and not environ.get("PET_RDZV_CONF"):
        # The static rendezvous waits 600 s by default for every node's agent; bound it too.
        argv += ["--rdzv-conf", f"timeout={node.rendezvous_timeout_seconds}"]
    return argv + worker_argv(pod, local_rank=TORCHRUN_LOCAL_RANK)


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

    1. a permanent code (bad config 2, data missing 3, 126, 127): retrying cannot help, and
       any one rank saying so decides;
    2. a root cause: any other code (1, 137, a signal, ...), the earliest first;
    3. the codes that are consequences of another failure: 143 (torchrun's SIGTERM to the
       survivors), then 12, then 13 (peer lost).
    Ties: the earliest failure, then the lowest rank.
    """
    def key(item: tuple[int, Any]) -> tuple[int, int, float, int]:
        rank, failure = item
        code = normalize_exit_code(int(failure.exitcode))
        if code in contract.DEFAULT_PERMANENT_EXIT_CODES:
            klass, sub = 0, 0
        elif code in _CONSEQUENCES:
            klass, sub = 2, _CONSEQUENCES.index(code)
        else:
            klass, sub = 1, 0
        return klass, sub, float(getattr(failure, "timestamp", 0) or 0), rank

    rank, failure = min(failures.items(), key=key)
    return rank, normalize_exit_code(int(failure.exitcode))


class _Terminated(Exception):
    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def _raise_terminated(signum: int, _frame: Any) -> NoReturn:
    raise _Terminated(signum)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else type(error).__name__


def _log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _worker_note(summaries: Mapping[int, str], rank: Optional[int]) -> str:
    if rank is not None and rank in summaries:
        return summaries[rank]
    if summaries:
        return summaries[min(summaries)]
    return ""


def _summary_dir() -> Optional[str]:
    """A private folder for the workers' summaries; None (no summaries) on a read-only /tmp."""
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
    pod: Optional[PodArgs] = None
    node_rank = 0
    summary_dir = _summary_dir()
    code, message = 0, ""
    try:
        pod = resolve_launch(parse_pod_args(raw), env)
        node = read_node_env(env, pod)
        node_rank = node.node_rank
        _log(f"node_rank={node.node_rank} nnodes={node.nnodes} nproc_per_node="
             f"{node.nproc_per_node} master={node.master_addr or 'localhost'}:"
             f"{node.master_port} rendezvous_timeout={node.rendezvous_timeout_seconds}s "
             f"run={pod.kind}:{pod.target} launcher={pod.launcher}"
             + (f" local_rank_flag={pod.local_rank_flag}" if pod.local_rank_flag else ""))
        mismatch = contract_mismatch(env)
        if mismatch:
            _log(mismatch)
        _serve_progress(env)
        if node.node_rank != 0 and node.master_addr:
            waited = wait_for_master(node.master_addr, node.master_port,
                                     node.rendezvous_timeout_seconds, _log)
            _log(f"master {node.master_addr}:{node.master_port} is up ({waited.address}); "
                 "starting torchrun")
        if summary_dir:
            os.environ[summary.ENV_SUMMARY_DIR] = summary_dir
        # Every Python process started from here on runs under the init guard.
        os.environ.update(init_guard.guarded_environment(env))
        if pod.launcher == contract.LAUNCHER_SPAWN:
            code, message = _run_once(pod, node, summary_dir)
        else:
            code, message = _run_torchrun(pod, node, env, summary_dir)
        code, message = _guard_verdict(code, message, summary_dir)
    except PodUsageError as e:
        code, message = int(ExitCode.BAD_CONFIG), f"bad configuration: {e}"
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
    except MasterUnreachable as e:
        code, message = int(ExitCode.RENDEZVOUS_TIMEOUT), f"rendezvous timeout: {e}"
        _log(message)
    except _Terminated as e:
        code, message = 128 + e.signum, f"stopped by signal {e.signum} before training started"
        _log(message)
    finally:
        if summary_dir:
            shutil.rmtree(summary_dir, ignore_errors=True)
    path, explicit = summary.resolve_termination_log(pod.termination_log if pod else None, env)
    summary.write_termination_message(f"{PROG}: node {node_rank}: exit {code}: {message}",
                                      path, explicit)
    return code


def _serve_progress(env: Mapping[str, str]) -> None:
    """Serve the workers' progress reports for the operator to poll (docs/contract.md)."""
    directory = env.get(contract.DDPJOB_PROGRESS_DIR)
    try:
        port = int(env.get(contract.DDPJOB_PROGRESS_PORT) or 0)
    except ValueError:
        port = 0
    if not directory or port <= 0:
        return
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        _log(f"progress reports are off: cannot create {directory}: {e}")
        return
    if report.serve_progress(directory, port) is None:
        _log(f"progress reports are off: port {port} is taken")


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


def _run_once(pod: PodArgs, node: NodeEnv, summary_dir: Optional[str]) -> tuple[int, str]:
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
    child = subprocess.Popen(argv, start_new_session=not leader)
    group = os.getpgrp() if leader else child.pid

    def forward(signum: int, _frame: Any) -> None:
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
    notes = summary.read_rank_summaries(summary_dir) if summary_dir else {}
    note = _worker_note(notes, None)
    if code == 0:
        return 0, note or "completed"
    message = f"the script exited {code} ({contract.describe_exit_code(code)})" + (f": {note}" if note else "")
    _log(message)
    return code, message


def _run_torchrun(pod: PodArgs, node: NodeEnv, env: Mapping[str, str],
                  summary_dir: Optional[str]) -> tuple[int, str]:
    # Imported late: waiting for the master should not pay for importing torch.
    import torch.distributed.run as torchrun
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    # Workers inherit os.environ (run() put the summary folder and the guard there).
    def summaries() -> dict[int, str]:
        return summary.read_rank_summaries(summary_dir) if summary_dir else {}

    args = torchrun.parse_args(torchrun_argv(pod, node, env))
    started = time.monotonic()
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        rank, code = choose_exit_code(e.failures)
        failure = e.failures[rank]
        note = (_worker_note(summaries(), rank)
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
        note = _worker_note(summaries(), None)
        message = f"stopped by signal {int(e.sigval)}; workers were asked to save: {note}"
        _log(message)
        return code, message
    except (RendezvousError, DistError) as e:
        waited = time.monotonic() - started
        message = (f"rendezvous timeout: the {node.nnodes} nodes did not meet within "
                   f"{waited:.0f}s: {_first_line(e)}")
        _log(message)
        return int(ExitCode.RENDEZVOUS_TIMEOUT), message
    note = _worker_note(summaries(), None)
    return 0, note or "completed"


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
