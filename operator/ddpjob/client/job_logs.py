"""``ddpjob logs JOB``: which pods are the job's, and what their logs say, attempt by attempt.

Pure: pods (plain dicts, as the API server lists them) -> the node pods to read; the bytes of
one pod's log -> lines marked with the node and the attempt. The I/O is in cli/logs.py.

A log is untrusted input: the job's programs wrote it. Lines are cut at MAX_LINE_BYTES (only
that much of a line is ever held), bytes that are not UTF-8 read as U+FFFD, and control
characters are shown as escapes (``terminal_text``). Attempts come from the pod entry point's
marks (``contract.attempt_mark``): the pod's first line is the entry point's mark of its first
attempt, and it carries the entry point's run, a random word no program of the pod can know.
A later mark is believed only with that run and an attempt no lower; anything else that looks
like a mark is shown as the ordinary line it is. So a program can neither move its lines into
another attempt nor hide any line from ``--attempt N``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Optional

from ddpjob import contract
from ddpjob.api import names
from ddpjob.client.terminal_text import printable

#: The most of one line that is kept (the rest is counted and cut).
MAX_LINE_BYTES = 16 * 1024
#: Pods whose logs are read at once (a connection each, and with -f a thread each): -f of more
#: needs --rank; without -f, a bigger gang's logs are merged that many pods at a time.
MAX_FOLLOWED_PODS = 64
#: Lines of a tailed window held back until its attempt is known, and their bytes.
MAX_HELD_LINES = 10_000
MAX_HELD_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class NodePod:
    """One node's pod of the job, as the logs need it."""

    node_rank: int
    name: str
    #: The attempt the pod was created for (its DDPJOB_RESTART_ATTEMPT) and the one it runs now
    #: (its restart-attempt label): an in-place restart moves the second only.
    first_attempt: int
    attempt: int
    #: Which run of the node this is (``-f`` goes on to the next one): the pod's uid, how often
    #: its container was restarted, and whether its container has started (has a log).
    uid: str = ""
    restarts: int = 0
    started: bool = True

    @property
    def run(self) -> tuple[str, int]:
        return self.uid, self.restarts


def _int(text: object) -> Optional[int]:
    try:
        value = int(str(text))
    except ValueError:
        return None
    return value if 0 <= value <= contract.MAX_ATTEMPT else None


def _first_attempt(pod: dict, fallback: int) -> int:
    for container in (pod.get("spec") or {}).get("containers") or ():
        if container.get("name") == names.CONTAINER_NAME:
            for var in container.get("env") or ():
                if var.get("name") == contract.DDPJOB_RESTART_ATTEMPT:
                    value = _int(var.get("value"))
                    return fallback if value is None else min(value, fallback)
    return fallback


def job_pods(job: dict, pods: Iterable[dict]) -> list[NodePod]:
    """The job's own node pods, in rank order: labelled with the job and one of its node
    ranks, named as the operator names them, and controlled by this DDPJob (its uid in a
    controller ownerReference), so a look-alike pod with the same labels is never read."""
    meta = job.get("metadata") or {}
    job_name, uid = meta.get("name"), meta.get("uid")
    found: dict[int, NodePod] = {}
    for pod in pods:
        pod_meta = pod.get("metadata") or {}
        labels = pod_meta.get("labels") or {}
        rank = _int(labels.get(names.LABEL_NODE_RANK))
        owned = any(o.get("uid") == uid and o.get("controller") is True and o.get("kind") == names.KIND
                    for o in pod_meta.get("ownerReferences") or ())
        if (not uid or not owned or rank is None or labels.get(names.LABEL_JOB_NAME) != job_name
                or pod_meta.get("name") != names.node_pod_name(job_name, rank)):
            continue
        attempt = _int(labels.get(names.LABEL_RESTART_ATTEMPT)) or 0
        restarts, started = _container_run(pod)
        found[rank] = NodePod(rank, pod_meta["name"], _first_attempt(pod, attempt), attempt,
                              uid=str(pod_meta.get("uid") or ""), restarts=restarts, started=started)
    return [found[r] for r in sorted(found)]


def _container_run(pod: dict) -> tuple[int, bool]:
    """(the trainer container's restartCount, whether it has started: running or ended)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        if status.get("name") == names.CONTAINER_NAME:
            state = status.get("state") or {}
            return _int(status.get("restartCount")) or 0, "running" in state or "terminated" in state
    return 0, False


def next_run(job: Optional[dict], pods: Iterable[dict], followed: NodePod) -> tuple[Optional[NodePod], bool]:
    """After the log of ``followed`` ended, or before it began (its container not started yet:
    no log to read): (the node's next run to follow, if it has started: a new pod for the rank,
    its container restarted by the kubelet, or ``followed`` itself once its container is up;
    whether to keep waiting for one: the job is still there and not finished)."""
    if job is None:
        return None, False
    for pod in job_pods(job, pods):
        if pod.node_rank == followed.node_rank and pod.started and (pod.run != followed.run or not followed.started):
            return pod, True
    phase = (job.get("status") or {}).get("phase")
    return None, phase not in FINISHED_PHASES


#: Phases after which no pod of the job runs again.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def gone_attempts_note(pods: list[NodePod], selected: Optional[int] = None) -> Optional[str]:
    """One line for the attempts whose pods were recreated since: their logs went with them."""
    gone = {p.node_rank: p.first_attempt for p in pods
            if p.first_attempt > 0 and (selected is None or selected < p.first_attempt)}
    if not gone:
        return None
    nodes = ", ".join(f"node-{r} since attempt {a}" for r, a in sorted(gone.items())[:8])
    more = f" and {len(gone) - 8} more" if len(gone) > 8 else ""
    which = f"attempt {selected}" if selected is not None else "earlier attempts"
    return (f"the logs of {which} are gone for some nodes: their pods were recreated ({nodes}{more}), "
            "and a pod's log is deleted with it")


# ---------------------------------------------------------------------------------------------
# Lines
# ---------------------------------------------------------------------------------------------
class LineSplitter:
    """Bytes as they come -> whole lines, each at most MAX_LINE_BYTES (the rest of a longer line
    is dropped and counted): memory stays bounded whatever a program prints."""

    def __init__(self, limit: int = MAX_LINE_BYTES):
        self.limit = limit
        self._part = bytearray()
        self._cut = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            room = self.limit - len(self._part)
            self._part += piece[:max(room, 0)]
            self._cut += max(len(piece) - max(room, 0), 0)
            if end < 0:
                return lines
            lines.append(self._take())
            start = end + 1

    def finish(self) -> list[bytes]:
        """The last line, if the log did not end with a newline."""
        return [self._take()] if self._part or self._cut else []

    def _take(self) -> bytes:
        line = bytes(self._part).rstrip(b"\r")
        if self._cut:
            line += f" ... [{self._cut} more bytes cut]".encode()
        self._part.clear()
        self._cut = 0
        return line


def split_timestamp(line: bytes) -> tuple[str, bytes]:
    """The kubelet's RFC 3339 time (``timestamps=true``) and the line; the time as a sort key
    (fractions padded: the kubelet drops trailing zeros)."""
    stamp, space, rest = line.partition(b" ")
    if not space or not stamp.endswith(b"Z") or len(stamp) > 40:
        return "", line
    text = stamp[:-1].decode("ascii", "replace")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(9, '0')[:9]}", rest


@dataclass(frozen=True)
class LogLine:
    """One line of output: a node's, with the attempt it belongs to (None: not known), or a
    header of ours (``header``: the node's attempt changed)."""

    node_rank: int
    attempt: Optional[int]
    text: str
    time: str = ""
    header: bool = False


def format_line(line: LogLine) -> str:
    """``node-1 | text``; a header ``node-1 ==> attempt 1 ...``, a form no program's line takes
    (every line of theirs has the ``|``)."""
    return f"node-{line.node_rank} {'==>' if line.header else '|'} {line.text}"


class PodLogParser:
    """One pod's log, line by line -> LogLines with their attempt.

    ``at_log_start``: the lines begin at the log's first one (no --tail). Otherwise ``anchor``
    is the log's first line, read apart (a few bytes of it), and the window's first lines are
    held back (bounded) until a mark says which attempt follows, or the window is read.
    """

    def __init__(self, pod: NodePod, *, at_log_start: bool, anchor: Optional[bytes] = None,
                 window: Optional[int] = None):
        self.pod = pod
        self._run: Optional[str] = None
        self._attempt: Optional[int] = None
        self._shown: object = object()  # the attempt of the last header (none yet)
        self._first = at_log_start
        self._held: Optional[deque] = None
        self._held_bytes = 0
        self._window = window
        self._seen = 0
        if not at_log_start:
            if anchor is not None:
                self._take_anchor(anchor)
            self._attempt = self._fallback()
            if self._run is not None and pod.first_attempt != pod.attempt:
                self._held = deque()

    def _fallback(self) -> Optional[int]:
        """The attempt of lines no mark speaks for: the pod's one attempt, if it ran one only."""
        return self.pod.attempt if self.pod.first_attempt == self.pod.attempt else None

    def _take_anchor(self, raw: bytes) -> bool:
        mark = contract.parse_attempt_mark(raw.decode("utf-8", "replace"))
        if mark is not None and mark[0] == self.pod.first_attempt:
            self._attempt, self._run = mark
            return True
        return False

    def feed(self, raw: bytes, time: str = "") -> list[LogLine]:
        self._seen += 1
        out: list[LogLine] = []
        if self._first:
            self._first = False
            if self._take_anchor(raw):
                return self._header(out, time)
            self._attempt = self._fallback()
        mark = contract.parse_attempt_mark(raw.decode("utf-8", "replace")) if self._run else None
        if mark is not None and mark[1] == self._run and (self._attempt is None or mark[0] >= self._attempt):
            if self._held is not None:  # the window's first lines: the attempt before this one
                self._release(out, mark[0] - 1)
            self._attempt = mark[0]
            return self._header(out, time)
        line = LogLine(self.pod.node_rank, self._attempt, printable(raw.decode("utf-8", "replace")), time)
        if self._held is None:
            return self._header(out, time) + [line]
        self._held.append(line)
        self._held_bytes += len(raw)
        if len(self._held) >= MAX_HELD_LINES or self._held_bytes >= MAX_HELD_BYTES or (
                self._window is not None and self._seen >= self._window):
            self._release(out, self.pod.attempt)  # no mark in the window: the pod's attempt now
        return out

    def finish(self) -> list[LogLine]:
        out: list[LogLine] = []
        if self._held is not None:
            self._release(out, self.pod.attempt)
        return out

    def _release(self, out: list[LogLine], attempt: int) -> None:
        held, self._held = self._held or (), None
        self._attempt = attempt
        for line in held:
            self._header(out, line.time)
            out.append(LogLine(line.node_rank, attempt, line.text, line.time))

    def _header(self, out: list[LogLine], time: str) -> list[LogLine]:
        if self._attempt != self._shown:
            self._shown = self._attempt
            if self._attempt is None:
                text = (f"attempt unknown (pod {self.pod.name} ran attempts {self.pod.first_attempt}-"
                        f"{self.pod.attempt} and its log has no attempt marks to tell them apart)")
            else:
                text = f"attempt {self._attempt} (pod {self.pod.name})"
            out.append(LogLine(self.pod.node_rank, self._attempt, text, time, header=True))
        return out


def select(lines: Iterable[LogLine], attempt: Optional[int]) -> list[LogLine]:
    """The lines of ``attempt`` (None: all)."""
    return [line for line in lines if attempt is None or line.attempt == attempt]
