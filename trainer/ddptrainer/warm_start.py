"""Warm worker start for in-place restarts: the next attempt's workers are forked from a process
that has imported torch already, instead of each starting a new interpreter that imports it.

Importing torch is the largest part of a worker's start (benchmarks/restart_modes.py measured
7.6 s of a 16 s in-place restart on kind). A pod that restarts in place keeps its container, so
it can keep a process that paid for the import once: the *warm process*
(``python -m ddptrainer.warm_start <socket>``), started by the pod entry point in ``InPlace``
mode once the first attempt's workers train (or when they fail first), so that its import does
not compete with theirs. It imports ``PRELOAD`` and then only forks: it never initialises CUDA
(a forked CUDA context is unusable), starts no thread and opens nothing but its socket.

From the next attempt on torchrun starts, for each worker, the *client*
(``warm_start_client.py``: standard library only, run with ``python -S``, a few milliseconds)
in place of ``python -u <script>``. The client passes its argv, environment, working folder and
standard streams (as file descriptors) over the warm process's Unix socket; the warm process
forks a child that takes all of that on, installs what the worker's sitecustomize would (the
init guard, the stack dump: worker_site/), and runs the script or module as ``__main__``
(runpy), exactly as ``python -u`` would. The client stays the process torchrun knows: it passes
on the signals it gets (SIGTERM, so the worker saves) and ends as the worker ended (the same
exit code, or the same signal); a client that dies (torchrun's SIGKILL after its grace) takes
its worker with it. Where the warm process is not there (never started, failed, killed), the
client runs the worker the usual way (``exec python -u``): warm start can only make a start
faster, never fail it.

Trust: the socket is in a folder only this user can enter (0700, in the container's own /tmp),
and the warm process serves only its own user (SO_PEERCRED); whoever can reach it could run
code as this user anyway. A request is bounded (``MAX_REQUEST_BYTES``, a deadline to arrive).

``DDPJOB_WARM_START=0`` (the pod's environment) turns it off: workers start as always. It costs
the pod the memory of one idle interpreter with torch imported (shared copy-on-write with the
workers forked from it; docs/contract.md).
"""
from __future__ import annotations

import io
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpjob import contract

#: What the warm process imports before it forks: what every worker's start pays for.
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data", "torchvision",
           "ddptrainer.main")
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # argv and environment of one worker
REQUEST_DEADLINE_SECONDS = 5.0
CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_start_client.py")
_HEADER = struct.Struct("!I")


def enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(contract.DDPJOB_WARM_START, "1") != "0"


# ------------------------------------------------------------------------ the entry point's side
class WarmStart:
    """The pod entry point's handle on its warm process (one per pod, for the pod's life)."""

    def __init__(self, environ: Mapping[str, str], log: Callable[[str], None]):
        self._environ = dict(environ)
        self._log = log
        self._folder = ""
        self.socket_path = ""
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._lock = threading.Lock()
        self._stopped = False  # for good: the pod's attempts are over

    @property
    def started(self) -> bool:
        return self._proc is not None

    def pids(self) -> tuple[int, ...]:
        """The warm process, which a stop that kills what is left of the workers spares."""
        proc = self._proc
        return (proc.pid,) if proc is not None and proc.poll() is None else ()

    def start_once_reporting(self, progress_dir: Optional[str], after_seconds: float = 0.0,
                             poll_seconds: float = 1.0) -> None:
        """Start the warm process once the first attempt's workers have reported progress for
        ``after_seconds`` (they have imported torch and train: the import no longer competes
        with theirs), from a daemon thread; ``start`` may come first (a failure).

        Why wait: the warm process costs an import (torch, torchvision: seconds of CPU) and an
        idle interpreter's memory, and pays back only at a restart. A job that ends within a
        minute (a smoke run, a probe, a test) never restarts in place; one that fails within it
        mostly fails the same way again (the repeated-error rule ends it); and a failure starts
        the warm process at once anyway, its import overlapping the peers' stop."""
        def watch() -> None:
            from .restart_control import progress_reported

            reporting_since: Optional[float] = None
            while not self.started and not self._stopped:
                if reporting_since is None and progress_reported(progress_dir):
                    reporting_since = time.monotonic()
                if reporting_since is not None and time.monotonic() - reporting_since >= after_seconds:
                    self.start()
                    return
                time.sleep(poll_seconds)

        threading.Thread(target=watch, name="warm-start", daemon=True).start()

    def start(self) -> None:
        """Start the warm process (once; it imports in the background)."""
        with self._lock:
            if self._proc is not None or self._stopped:
                return
            try:
                self._folder = tempfile.mkdtemp(prefix="ddpjob-warm-")  # 0700
                self.socket_path = os.path.join(self._folder, "socket")
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "ddptrainer.warm_start", self.socket_path],
                    stdin=subprocess.PIPE, env=warm_process_environment(self._environ))
            except OSError as e:
                self._log(f"warm start is off: cannot start its process: {e}")
                self._proc = None

    def ready(self, timeout_seconds: float) -> bool:
        """Whether the warm process serves, waiting up to ``timeout_seconds`` for an import
        under way (shorter than a new one)."""
        if self._proc is None:
            return False
        deadline = time.monotonic() + timeout_seconds
        while True:
            if self._proc.poll() is not None:
                return False
            if _answers(self.socket_path):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def worker_command(self, worker_argv: Sequence[str]) -> list[str]:
        """What starts one worker (``worker_argv``: what follows ``python``) through the warm
        process; torchrun runs it with ``--no-python``."""
        return [sys.executable, "-S", CLIENT, self.socket_path, "--", *worker_argv]

    def stop(self) -> None:
        """End the warm process (and its workers); nothing starts it again after this."""
        with self._lock:
            proc, self._proc, self._stopped = self._proc, None, True
        if proc is not None:
            try:
                if not os.path.exists(self.socket_path):
                    # Still importing: it has forked no worker and holds nothing, and it reads
                    # its lifeline only once it serves (a loaded machine's import held the
                    # pod's exit up to 5 s: seen in CI).
                    proc.kill()
                if proc.stdin:
                    proc.stdin.close()  # its lifeline: it kills its workers and exits
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)


def warm_process_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The warm process's own environment: the pod's, without what is set per worker (each
    child takes its worker's environment whole) and without the workers' sitecustomize (the
    child installs its parts itself, with the worker's environment)."""
    from . import init_guard

    env = {k: v for k, v in environ.items() if k != contract.DDPJOB_STACKS_DIR}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != init_guard.site_dir()]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    return env


def _answers(path: str) -> bool:
    if not path or not os.path.exists(path):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            probe.connect(path)
            probe.sendall(_HEADER.pack(0))  # an empty request: a ping
            return probe.recv(1) == b"\n"
    except OSError:
        return False


# ------------------------------------------------------------------------ the warm process
def serve(path: str, lifeline: int = 0) -> Optional[int]:
    """Fork a worker for each request on ``path`` until ``lifeline`` (the entry point's pipe)
    closes. Returns None in the warm process; in a forked child it never returns (the worker
    runs and the child exits through ``SystemExit``)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    os.chmod(path + ".new", 0o600)
    listener.listen(64)
    os.replace(path + ".new", path)  # it answers from the moment it exists
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(lifeline, selectors.EVENT_READ, "lifeline")
    children: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select(timeout=0.2):
            if key.data == "lifeline":
                if not os.read(lifeline, 4096):
                    _kill_all(children)
                    return None
            elif key.data == "accept":
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                request = _read_request(conn)
                if request is None:
                    conn.close()
                    continue
                if request == "ping":
                    _send(conn, b"\n")
                    conn.close()
                    continue
                fields, fds = request
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _close_all(listener, selector, children, conn, lifeline)
                    _become_worker(fields, fds)  # raises SystemExit
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
                _send(conn, json.dumps({"pid": pid}).encode() + b"\n")
            else:  # the client's connection: anything but our answer means it is gone
                pid = key.data
                try:
                    gone = not key.fileobj.recv(4096)  # type: ignore[union-attr]
                except OSError:
                    gone = True
                if gone:
                    selector.unregister(key.fileobj)
                    _signal(pid, signal.SIGKILL)
        _reap(children, selector)


def _read_request(conn: socket.socket) -> Any:
    """("ping") or (fields, fds) of a request, or None for anything else (another user's, too
    large, malformed, not in time)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            return None
        conn.settimeout(REQUEST_DEADLINE_SECONDS)
        deadline = time.monotonic() + REQUEST_DEADLINE_SECONDS
        data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
        if len(data) < _HEADER.size:
            _close_fds(fds)
            return None
        (length,) = _HEADER.unpack(data[:_HEADER.size])
        if length == 0:
            _close_fds(fds)
            return "ping"
        body = bytearray(data[_HEADER.size:])
        while len(body) < length <= MAX_REQUEST_BYTES and time.monotonic() < deadline:
            chunk = conn.recv(min(65536, length - len(body)))
            if not chunk:
                break
            body += chunk
        fields = json.loads(bytes(body)) if len(body) == length <= MAX_REQUEST_BYTES else None
        if not _valid(fields) or len(fds) != 3:
            _close_fds(fds)
            return None
        conn.settimeout(None)
        return fields, fds
    except (OSError, ValueError):
        return None


def _valid(fields: Any) -> bool:
    argv = fields.get("argv") if isinstance(fields, dict) else None
    runs = isinstance(argv, list) and bool(argv) and all(isinstance(a, str) for a in argv) and (
        (argv[0] == "-m" and len(argv) > 1) or not argv[0].startswith("-"))  # a script or -m module
    return (runs and isinstance(fields, dict)
            and isinstance(fields.get("env"), dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in fields["env"].items())
            and isinstance(fields.get("cwd"), str))


def _close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_all(children: Mapping[int, socket.socket]) -> None:
    for pid in children:
        _signal(pid, signal.SIGKILL)


def _reap(children: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        try:
            selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        _send(conn, json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        conn.close()


def _close_all(listener: socket.socket, selector: selectors.BaseSelector,
               children: Mapping[int, socket.socket], conn: socket.socket, lifeline: int) -> None:
    selector.close()
    listener.close()
    for other in children.values():
        other.close()
    conn.close()
    try:
        os.close(lifeline)
    except OSError:
        pass


# ------------------------------------------------------------------------ a forked worker
def _become_worker(fields: Mapping[str, Any], fds: Sequence[int]) -> None:
    """In the forked child: take on the worker's streams, environment, folder and argv, then run
    it as ``python -u`` would; ends in ``SystemExit`` with the worker's code."""
    os.setsid()  # signals to the warm process's group are not the worker's (the client passes them on)
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    env, argv = fields["env"], list(fields["argv"])
    os.environ.clear()
    os.environ.update(env)
    os.chdir(fields["cwd"])
    sys.stdin = open(0, "r", closefd=False)  # noqa: SIM115 - the worker's, for its life
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
    _install_worker_site(env)
    _apply_thread_settings(env)
    module = argv[1] if argv[0] == "-m" and len(argv) > 1 else None
    script = None if module else argv[0]
    sys.argv = ([script] if script else [module]) + argv[2 if module else 1:]
    user_paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.path.dirname(os.path.abspath(script)) if script else os.getcwd()
    sys.path[:] = [first] + user_paths + [p for p in sys.path[1:] if p not in user_paths]
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")  # type: ignore[arg-type]
    except SystemExit:
        raise
    except KeyboardInterrupt:
        traceback.print_exc()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(130)
    except BaseException as error:  # noqa: BLE001 - as the interpreter would: a traceback, exit 1
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next  # the script's frames, not ours
        sys.excepthook(type(error), error.with_traceback(tb), tb)  # it prints the error's own
        raise SystemExit(1)
    raise SystemExit(0)


def _install_worker_site(env: Mapping[str, str]) -> None:
    """What worker_site/sitecustomize.py does at a new interpreter's start, for this worker's
    environment: the init guard (where the entry point put it on PYTHONPATH), the uncaught
    error's summary (ddptrainer.uncaught) and the stack dump."""
    from . import init_guard

    if init_guard.site_dir() in env.get("PYTHONPATH", "").split(os.pathsep) and \
            env.get(contract.DDPJOB_INIT_GUARD, "1") != "0":
        try:
            init_guard.install_when_imported()
        except Exception as error:  # noqa: BLE001 - a missing guard must not stop the training
            sys.stderr.write(f"ddptrain-pod: init guard: warning: not installed: {error}\n")
    try:
        from . import uncaught

        uncaught.install(env, worker=True)
    except Exception as error:  # noqa: BLE001 - a missing summary must not stop the training
        sys.stderr.write(f"ddptrain-pod: uncaught errors: warning: not installed: {error}\n")
    if env.get(contract.DDPJOB_STACKS_DIR):
        try:
            from . import stacks

            stacks.register_from_environment(env)
        except Exception as error:  # noqa: BLE001 - a missing dump must not stop the training
            sys.stderr.write(f"ddptrain-pod: stacks: warning: not registered: {error}\n")


def _apply_thread_settings(env: Mapping[str, str]) -> None:
    """OpenMP read OMP_NUM_THREADS when torch was imported, in the warm process: the worker's
    value (torchrun sets 1 for several workers per node) is applied now."""
    torch = sys.modules.get("torch")
    value = env.get("OMP_NUM_THREADS", "")
    if torch is not None and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


def _preload(log: Callable[[str], None]) -> None:
    started = time.monotonic()
    done = []
    for name in PRELOAD:
        try:
            __import__(name)
            done.append(name)
        except Exception as error:  # noqa: BLE001 - what fails to import is imported by the worker
            log(f"warm start: {name} not preloaded: {type(error).__name__}: {error}")
    log(f"warm start: {', '.join(done) or 'nothing'} imported in {time.monotonic() - started:.1f}s; "
        "the next attempts fork their workers from it")


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m ddptrainer.warm_start <socket path>", file=sys.stderr)
        raise SystemExit(2)
    # The entry point's group may get a SIGTERM (`ddpjob run` stops a node so): the workers'
    # clients pass theirs on, and this process ends when its lifeline (stdin) closes, which
    # the entry point's end does, however it ends.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def log(message: str) -> None:
        print(f"ddptrain-pod: {message}", file=sys.stderr, flush=True)

    _preload(log)
    serve(args[0])


if __name__ == "__main__":
    main()
