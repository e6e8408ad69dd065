"""Starting and stopping the test bed's long-lived processes, and cleaning up after a run
that died without doing so.

Every process gets its own session (process group), so one signal reaches whatever it
started; its stdout and stderr go to a log file (never a pipe nobody reads, which would
block it once the pipe buffer fills). Their pids are recorded in a pidfile so the next run
can kill what a crashed or SIGKILLed run left behind.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

_PR_SET_PDEATHSIG = 1


def _die_with_parent(death_signal: int):
    """For the child: its own session, and ``death_signal`` when the process that started
    it dies, even by SIGKILL (so a killed pytest leaves nothing running).

    The kernel ties this to the *thread* that forked, so only use it for processes started
    from the main thread (the pytest fixtures do).
    """

    def preexec() -> None:
        os.setsid()
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, death_signal)

    return preexec


class ProcessExited(RuntimeError):
    """A process the test bed needs has exited; waiting for it any longer is pointless."""


class PidFile:
    """A JSON list of {pid, argv} for the processes one test bed run started."""

    def __init__(self, path: Path):
        self.path = path

    def _read(self) -> list[dict]:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return []

    def add(self, pid: int, argv: Sequence[str]) -> None:
        entries = self._read()
        entries.append({"pid": pid, "argv": list(argv[:3])})
        self.path.write_text(json.dumps(entries))

    def kill_stale(self) -> list[int]:
        """SIGKILL the process groups of a previous run whose processes still exist.

        A pid is only trusted if /proc/<pid>/cmdline still starts with the same arguments,
        so a recycled pid of an unrelated process is left alone.
        """
        killed = []
        for entry in self._read():
            pid, argv = entry.get("pid"), entry.get("argv")
            if not pid or not argv:
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if cmdline.split("\0")[:len(argv)] != argv:
                continue
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            except PermissionError:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        self.path.unlink(missing_ok=True)
        return killed


class ManagedProcess:
    """One long-lived process in its own process group, logging to a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        pidfile: PidFile | None = None,
        death_signal: int = signal.SIGTERM,
    ):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.pidfile = pidfile
        self.death_signal = death_signal
        self.popen: subprocess.Popen | None = None

    def start(self) -> "ManagedProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                preexec_fn=_die_with_parent(self.death_signal),
            )
        if self.pidfile:
            self.pidfile.add(self.popen.pid, self.argv)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_running(self) -> None:
        """Raise with the log's tail if the process has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise ProcessExited(
                f"{self.name} exited with code {self.popen.returncode}; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole group at once: a crash, not a shutdown."""
        self.signal_group(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()

    def stop(self, grace_seconds: float = 10.0) -> None:
        """SIGTERM the group, wait up to the grace period, then SIGKILL it."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                pass
        # Also reaps children that outlived the group leader.
        self.signal_group(signal.SIGKILL)
        self.popen.wait()


def wait_for(predicate, timeout: float, message: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns something truthy, and return that.

    Exceptions raised by the predicate count as "not yet"; the last one is quoted in the
    TimeoutError so a failing wait says what it last saw. ProcessExited propagates at once.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
            last_error = None
        except ProcessExited:
            raise
        except Exception as error:  # noqa: BLE001 - any failure means "not yet"
            last_error = error
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s: {message}{detail}")
        time.sleep(interval)
