"""Progress reports: how a training process says how far it is, and how a pod serves that.

Standard library only (no torch), so a script of your own can use it, or copy it: the whole
protocol is "write one small JSON object to ``$DDPJOB_PROGRESS_DIR/rank-$RANK.json``, replacing
the previous one" (docs/contract.md, "Progress")::

    from ddptrainer.report import report_progress
    report_progress(step=step, total_steps=total, epoch=epoch, loss=loss)

Outside a DDPJob (no ``DDPJOB_PROGRESS_DIR``) it does nothing. Writes are throttled to one per
``min_interval`` seconds per process (the last step is always written with ``force=True``),
so calling it every step costs next to nothing.

The pod entry point (``ddptrain-pod``) serves the directory with ``serve_progress``:
``GET /progress`` answers ``{"ranks": {"<rank>": {<report>..., "age_seconds": s}}}``, where
``age_seconds`` is how long ago the rank's file was written, by the pod's own clock (the
operator never compares clocks with the pod). The operator polls it; nothing in the pod talks
to the Kubernetes API.
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ddpjob import contract

from .text import env_int

if TYPE_CHECKING:
    from .restart_control import EntryControl

_last_write: dict[str, float] = {}


def _number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN
    return value


def _process_group_rank() -> Optional[int]:
    """This process's rank in torch.distributed's default group, if the program has already
    imported torch and started one (never imports torch itself: this module stays
    dependency-free)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a half-initialised or exotic backend: fall back to the environment
        return None
    return None


def _reporting_rank(rank: Optional[int], env: Mapping[str, str]) -> int:
    """Which ``rank-N.json`` this process writes. ``RANK`` alone is not enough: processes
    started by ``mp.spawn`` inherit the pod's ``RANK`` (the pod's *first* rank), so every one of
    them would overwrite the same file, and hang detection would see one rank where there are
    several. The process group, once started, knows the truth."""
    if rank is not None:
        return int(rank)
    started = _process_group_rank()
    if started is not None:
        return started
    return env_int(env, contract.RANK, 0, invalid=0) or 0


def report_progress(step: int, total_steps: Optional[int] = None, *, epoch: Optional[int] = None,
                    epochs: Optional[int] = None, loss: Optional[float] = None,
                    throughput: Optional[float] = None, force: bool = False,
                    min_interval: float = 1.0, rank: Optional[int] = None,
                    environ: Optional[Mapping[str, str]] = None,
                    checkpoint_seconds: Optional[float] = None,
                    checkpoint_interval_seconds: Optional[float] = None) -> bool:
    """Record this process's progress (``throughput`` in samples per second; optionally what a
    periodic checkpoint holds training up and the seconds between two, for the operator's
    checkpoint-interval advice). Returns whether a report was written (False: not in a DDPJob,
    throttled, or the directory is not writable).

    The rank is ``rank`` if given, else the started process group's rank, else ``$RANK``."""
    env = os.environ if environ is None else environ
    directory = env.get(contract.DDPJOB_PROGRESS_DIR)
    if not directory:
        return False
    path = os.path.join(directory, contract.progress_file_name(_reporting_rank(rank, env)))
    now = time.time()
    if not force and now - _last_write.get(path, -math.inf) < min_interval:
        return False
    report = {"step": int(step), "total_steps": total_steps, "epoch": epoch, "epochs": epochs,
              "loss": _number(loss), "throughput": _number(throughput), "time": round(now, 3),
              "checkpoint_seconds": _number(checkpoint_seconds),
              "checkpoint_interval_seconds": _number(checkpoint_interval_seconds),
              # The attempt it was written in: a container the kubelet restarts in its pod finds
              # the last run's files in /dev/shm, which must not pass for its own.
              "attempt": env_int(env, contract.DDPJOB_RESTART_ATTEMPT, None, invalid=None)}
    report = {k: v for k, v in report.items() if v is not None}
    try:
        os.makedirs(directory, exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(report, file)
        os.replace(temporary, path)  # a reader never sees half a report
    except OSError:
        return False  # reporting must never break training
    _last_write[path] = now
    return True


def progress_answer(directory: str, control: Optional["EntryControl"] = None) -> dict[str, Any]:
    """The ``/progress`` answer: the ranks' reports and, with ``control``, the attempt their
    workers run in (contract.PROGRESS_ATTEMPT_KEY). The attempt is read before the files and
    checked after them: reports read while another attempt began are not sent under either."""
    if control is None:  # a program of your own: the reports of the attempt it runs in
        return {"ranks": contract.read_progress_reports(
            directory, attempt=env_int(os.environ, contract.DDPJOB_RESTART_ATTEMPT, None, invalid=None))}
    attempt = control.attempt
    reports = contract.read_progress_reports(directory)
    if control.attempt != attempt:
        reports = {}
    return {contract.PROGRESS_ATTEMPT_KEY: attempt, "ranks": reports}


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up (the operator's poll timed out, a probe only connected, a hostile
    tenant's pod) costs the pod's log nothing: socketserver would print a whole traceback for
    each, and anything that can reach the port could fill the log. Any other error of a handler
    is a bug of ours: one line, with its type, never a traceback in the middle of training."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        print(f"ddptrain: progress server: {type(error).__name__}: {error} (from {client_address[0]})",
              file=sys.stderr, flush=True)


def serve_progress(directory: str, port: int, host: str = "0.0.0.0",
                   control: Optional["EntryControl"] = None) -> Optional[ThreadingHTTPServer]:
    """Serve ``GET /progress`` on ``port`` from a daemon thread; None if the port is taken.

    With ``control`` (the pod entry point in ``InPlace`` mode) the same server also answers
    ``GET /ready``, ``GET /attempt``, ``POST /restart`` (ddptrainer.restart_control) and
    ``GET /stacks`` (ddptrainer.stacks)."""
    from . import restart_control, stacks

    class Handler(BaseHTTPRequestHandler):
        timeout = restart_control.REQUEST_TIMEOUT_SECONDS  # a slow client cannot hold a thread

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            path = self.path.split("?")[0]
            if path == contract.PROGRESS_PATH:
                self._answer(200, progress_answer(directory, control))
                return
            if control is not None and path == contract.STACKS_PATH:
                self.close_connection = True
                self._answer(*stacks.answer_stacks(control.authorized, self.headers, control.stacks))
                return
            answer = restart_control.answer_get(control, path) if control else None
            if answer is None:
                self.send_error(404)
                return
            self._answer(*answer)

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            path = self.path.split("?")[0]
            if control is None or path != contract.RESTART_PATH:
                self.close_connection = True
                self.send_error(405 if path in (contract.PROGRESS_PATH, contract.READY_PATH,
                                                contract.ATTEMPT_PATH, contract.STACKS_PATH) else 404)
                return
            try:
                status, body = restart_control.answer_restart(control, self.headers,
                                                              self.rfile.read)
            except OSError:  # the body did not come within the timeout
                self.close_connection = True
                return
            self.close_connection = True  # an unread body must not be taken for a request
            self._answer(status, body)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:  # the operator polls: keep the pod log clean
            pass

    try:
        server = _QuietServer((host, port), Handler)
    except OSError:
        return None
    threading.Thread(target=server.serve_forever, daemon=True, name="ddpjob-progress").start()
    return server
