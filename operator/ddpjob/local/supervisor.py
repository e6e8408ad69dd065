"""Process supervision for `ddpjob run`: one gang of local "node" processes.

A node is one process started in its own session, so that it is the leader of its own process
group and owns everything it starts (torchrun and its workers). That lets the supervisor do to
a node what the kubelet does to a pod: SIGTERM the whole group, wait the grace period, SIGKILL
what is left; and when a node's main process exits, kill whatever it left behind (a container's
processes die with its PID 1).

Being in their own sessions also means the terminal's Ctrl-C reaches only `ddpjob run`, which
then stops the nodes in that orderly way instead of every process getting SIGINT at once.

Each node's output (stdout and stderr merged, as `kubectl logs` shows them) is read line by line
by its own thread and printed whole with a `[node-R] ` prefix, so a node with a lot of output
never blocks on a full pipe and lines of different nodes never interleave mid-line.

This module knows nothing about DDPJobs: it runs commands and reports who exited first with what.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, TextIO

POLL_SECONDS = 0.1


class Console:
    """Serialises writes from the reader threads and the supervisor: whole lines only."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, view: Any = None) -> None:
        self._out = out if out is not None else sys.stdout
        self._err = err if err is not None else sys.stderr
        self._lock = threading.Lock()
        self.view = view  # a ProgressView (local/progress_view.py), or None

    def node_line(self, node_rank: int, line: str) -> None:
        if self.view is not None:
            line = self.view.line(node_rank, line)
        self._write(self._out, f"[node-{node_rank}] {line}\n")

    def note(self, message: str) -> None:
        self._write(self._err, f"ddpjob run: {message}\n")

    def _write(self, stream: TextIO, text: str) -> None:
        with self._lock:
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):
                # Our own stdout is gone (`ddpjob run | head`): keep draining the nodes' pipes
                # anyway, or they would block on a full pipe.
                pass


class StopRequest:
    """Ctrl-C, SIGTERM or SIGHUP to `ddpjob run`, recorded by the handler, acted on by the loop.

    SIGHUP is included because the nodes, in their own sessions, would not get it when the
    terminal closes: `ddpjob run` dying of it would leave them running. The handler only sets
    attributes (taking a lock inside a signal handler can deadlock). A second signal asks to
    skip the grace period.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.force = False

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, _frame) -> None:
        if self.signum is not None:
            self.force = True
        else:
            self.signum = signum

    def install(self) -> Callable[[], None]:
        """Install the handlers; returns a function that restores the previous ones.

        Outside the main thread (signal handlers cannot be set there) it installs nothing.
        """
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

        def restore() -> None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

        return restore


@dataclass(frozen=True)
class NodeLaunch:
    """What to run for one node: argv and the complete process environment."""

    node_rank: int
    argv: Sequence[str]
    env: Mapping[str, str]


@dataclass(frozen=True)
class GangOutcome:
    """How a gang ended. ``kind``: succeeded, failed, stopped (by a signal), deadline or
    stalled (``watch`` said so; ``message`` says why)."""

    kind: str
    node_rank: Optional[int] = None
    exit_code: Optional[int] = None
    signum: Optional[int] = None
    message: str = ""
    #: ``failed`` told by a node whose entry point lives on (in-place restarts): it can be
    #: ordered to run the next attempt instead of being started again.
    in_place: bool = False


def exit_code_of(returncode: int) -> int:
    """Popen's returncode as a container's exit code: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class LocalNode:
    """One running node: its process, the thread that prints its output, the one that waits."""

    def __init__(self, launch: NodeLaunch, cwd: str, console: Console, exits: "queue.Queue") -> None:
        self.node_rank = launch.node_rank
        self.exit_code: Optional[int] = None
        self.process: Optional[subprocess.Popen] = None
        self._threads: list[threading.Thread] = []
        try:
            self.process = subprocess.Popen(
                list(launch.argv), cwd=cwd, env=dict(launch.env), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as error:
            # What a container runtime reports for the same mistake: 127 not found, 126 not
            # executable; both permanent by default.
            self.exit_code = 127 if isinstance(error, FileNotFoundError) else 126
            console.node_line(self.node_rank, f"cannot run {launch.argv[0]!r}: {error.strerror}")
            exits.put((self.node_rank, self.exit_code))
            return
        self.pid = self.process.pid
        self._start_thread(self._print_output, console)
        self._start_thread(self._wait, exits)

    def _start_thread(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True,
                                  name=f"node-{self.node_rank}-{target.__name__}")
        thread.start()
        self._threads.append(thread)

    def _print_output(self, console: Console) -> None:
        assert self.process is not None and self.process.stdout is not None
        with self.process.stdout:
            for raw in iter(self.process.stdout.readline, b""):
                console.node_line(self.node_rank, raw.decode("utf-8", "replace").rstrip("\r\n"))

    def _wait(self, exits: "queue.Queue") -> None:
        assert self.process is not None
        code = exit_code_of(self.process.wait())
        # The pod's other processes go with its main one, as a container's do. Done at once,
        # while the group id cannot yet have been reused by an unrelated process.
        self.signal_group(signal.SIGKILL)
        self.exit_code = code
        exits.put((self.node_rank, code))

    @property
    def running(self) -> bool:
        return self.process is not None and self.exit_code is None

    def signal_group(self, signum: int) -> None:
        """Signal every process of the node (the group of its main process)."""
        if self.process is None:
            return
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # the whole group is gone already

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)


def stop_nodes(nodes: Sequence[LocalNode], grace_seconds: float, stop: StopRequest) -> None:
    """The kubelet's pod deletion for each node: SIGTERM, up to the grace period, SIGKILL."""
    for node in nodes:
        if node.running:
            node.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while any(n.running for n in nodes) and time.monotonic() < deadline and not stop.force:
        time.sleep(POLL_SECONDS / 2)
    for node in nodes:
        if node.running:
            node.signal_group(signal.SIGKILL)
    for node in nodes:
        if node.process is not None:
            node.process.wait()
        node.join(timeout=5)


class Gang:
    """The nodes of one gang, started once and kept across in-place restarts until ``stop``.

    ``wait`` returns how the running attempt ended: all nodes exited 0, one exited non-zero (the
    first, as the waiter threads saw them), ``failure`` told of one whose process lives on (an
    in-place node whose workers failed: ``failed`` with ``in_place``), ``watch`` found it
    stalled, the deadline passed, or a signal came.
    """

    def __init__(self, *, cwd: str, grace_seconds: float, stop: StopRequest, console: Console) -> None:
        self._cwd, self._grace, self._stop, self._console = cwd, grace_seconds, stop, console
        self._exits: "queue.Queue[tuple[int, int]]" = queue.Queue()
        self.nodes: list[LocalNode] = []
        self._waiting: set[int] = set()

    def start(self, launches: Sequence[NodeLaunch], before_launch: Callable[[], None] = lambda: None) -> None:
        before_launch()
        for launch in launches:
            self.nodes.append(LocalNode(launch, self._cwd, self._console, self._exits))
        self._waiting = {n.node_rank for n in self.nodes}

    def wait(self, *, deadline: Optional[float] = None,
             watch: Optional[Callable[[], Optional[tuple[int, str]]]] = None, watch_seconds: float = 1.0,
             failure: Optional[Callable[[], Optional[tuple[int, int, str]]]] = None) -> GangOutcome:
        next_watch = time.monotonic() + watch_seconds
        while self._waiting:
            if self._stop.requested:
                return GangOutcome("stopped", signum=self._stop.signum)
            if deadline is not None and time.monotonic() >= deadline:
                return GangOutcome("deadline")
            if watch is not None and time.monotonic() >= next_watch:
                next_watch = time.monotonic() + watch_seconds
                stalled = watch()
                if stalled is not None:
                    return GangOutcome("stalled", node_rank=stalled[0], message=stalled[1])
            if failure is not None:
                seen = failure()
                if seen is not None:
                    return GangOutcome("failed", node_rank=seen[0], exit_code=seen[1],
                                       message=seen[2], in_place=True)
            try:
                rank, code = self._exits.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            self._waiting.discard(rank)
            if code != 0:
                # The queue orders exits as the waiter threads saw them: the first failure
                # decides, the peers that fail after it (they lost a rank) do not.
                return GangOutcome("failed", node_rank=rank, exit_code=code)
        return GangOutcome("succeeded")

    def stop(self) -> None:
        stop_nodes(self.nodes, self._grace, self._stop)
        self.nodes = []
