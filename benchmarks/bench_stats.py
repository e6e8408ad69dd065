"""Pure helpers of the benchmarks: statistics, and figures derived from what a benchmark
recorded (watch events with their arrival times, audit-log lines). No I/O, no cluster: unit
tested in tests/unit/test_bench_stats.py.

Times are seconds on one clock (``time.time()`` of the benchmark process for watch events;
the API server's clock for audit records: the same host, so the same clock).
"""
from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

JOB_LABEL = "ddpjob.dev/job-name"
RANK_LABEL = "ddpjob.dev/node-rank"
ATTEMPT_LABEL = "ddpjob.dev/restart-attempt"
TERMINAL = ("Succeeded", "Failed")


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------
def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks (numpy's
    default), so the median of an even count is the mean of the middle two."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, got {q}")
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Iterable[float]) -> dict[str, float]:
    """n, median, p95, min, max, mean of the values (empty: only n = 0)."""
    data = list(values)
    if not data:
        return {"n": 0}
    return {"n": len(data), "median": percentile(data, 50), "p95": percentile(data, 95),
            "min": min(data), "max": max(data), "mean": sum(data) / len(data)}


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares ``y = intercept + slope * x``; returns (intercept, slope)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("a fit needs at least two (x, y) pairs")
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var_x = sum((x - mean_x) ** 2 for x in xs)
    if var_x == 0:
        raise ValueError("a fit needs two different x values")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var_x
    return mean_y - slope * mean_x, slope


def growth_exponents(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    """log(y2/y1) / log(x2/x1) between consecutive points: 1 is linear growth, below 1 better
    than linear (a fixed cost being amortised), above 1 worse."""
    exponents = []
    for (x1, y1), (x2, y2) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x1 <= 0 or x2 <= 0 or y1 <= 0 or y2 <= 0 or x1 == x2:
            raise ValueError("growth exponents need positive, distinct x and positive y")
        exponents.append(math.log(y2 / y1) / math.log(x2 / x1))
    return exponents


def max_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t opens)."""
    edges = []
    for start, end in intervals:
        edges += [(start, 1), (end, -1)]
    edges.sort(key=lambda edge: (edge[0], edge[1]))
    open_now = peak = 0
    for _, step in edges:
        open_now += step
        peak = max(peak, open_now)
    return peak


def mean_concurrency(intervals: Sequence[tuple[float, float]]) -> float:
    """Total request time over the span from the first start to the last end: 1.0 for
    back-to-back sequential requests, N when N requests overlap completely."""
    if not intervals:
        return 0.0
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    busy = sum(end - start for start, end in intervals)
    return busy / span if span > 0 else float(len(intervals))


# ---------------------------------------------------------------------------------------------
# Watch observations
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PodObs:
    """One watch event of a DDPJob pod, as the benchmark's watch saw it at time ``t``."""

    t: float
    event: str  # ADDED, MODIFIED, DELETED
    name: str
    uid: str
    job: str
    rank: int
    attempt: int
    phase: str
    running: bool  # the container is running
    exit_code: Optional[int]
    deleting: bool


@dataclass(frozen=True)
class JobObs:
    """One watch event of a DDPJob: its status as the benchmark's watch saw it at ``t``."""

    t: float
    event: str
    name: str
    phase: str
    attempt: int
    restarts: int
    ready: int
    nodes: tuple[tuple[int, str, str], ...]  # (nodeRank, pod, phase)
    progress_step: Optional[int] = None  # status.progress.step, once the job reports


def pod_obs(t: float, event: str, pod: Mapping[str, Any]) -> Optional[PodObs]:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        rank, attempt = int(labels[RANK_LABEL]), int(labels[ATTEMPT_LABEL])
    except (KeyError, ValueError):
        return None
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or [{}]
    state = containers[0].get("state") or {}
    terminated = state.get("terminated") or {}
    return PodObs(t=t, event=event, name=meta.get("name", ""), uid=meta.get("uid", ""),
                  job=labels.get(JOB_LABEL, ""), rank=rank, attempt=attempt,
                  phase=status.get("phase") or "Pending", running="running" in state,
                  exit_code=terminated.get("exitCode"),
                  deleting=meta.get("deletionTimestamp") is not None)


def job_obs(t: float, event: str, job: Mapping[str, Any]) -> JobObs:
    status = job.get("status") or {}
    nodes = tuple((int(n.get("nodeRank", -1)), str(n.get("pod", "")), str(n.get("phase", "")))
                  for n in status.get("nodes") or ())
    return JobObs(t=t, event=event, name=(job.get("metadata") or {}).get("name", ""),
                  phase=status.get("phase") or "", attempt=int(status.get("restartAttempt") or 0),
                  restarts=int(status.get("restarts") or 0), ready=int(status.get("readyNodes") or 0),
                  nodes=nodes, progress_step=(status.get("progress") or {}).get("step"))


def first_seen(pods: Iterable[PodObs], predicate) -> dict[str, float]:
    """Pod uid -> the first time an event of it satisfied ``predicate``."""
    seen: dict[str, float] = {}
    for p in sorted(pods, key=lambda p: p.t):
        if p.uid not in seen and predicate(p):
            seen[p.uid] = p.t
    return seen


def job_first(jobs: Iterable[JobObs], predicate) -> Optional[float]:
    times = [j.t for j in jobs if predicate(j)]
    return min(times) if times else None


def gang_times(pods: Sequence[PodObs], jobs: Sequence[JobObs], job: str, nnodes: int,
               attempt: int = 0) -> dict[str, Optional[float]]:
    """When (on the watch's clock) a job's gang of one attempt reached each milestone; None
    for one not reached. ``job_added``: the DDPJob appeared; ``all_created``: the last pod's
    ADDED; ``all_running``: every pod seen Running (or already finished); ``last_exit``: the
    last pod seen finished (its container exited, or its phase ended); ``job_succeeded`` / ``job_finished``: the DDPJob's phase."""
    mine = [p for p in pods if p.job == job and p.attempt == attempt]
    js = [j for j in jobs if j.name == job]
    created = first_seen(mine, lambda p: True)
    running = first_seen(mine, lambda p: p.phase == "Running" or p.phase in TERMINAL)
    # A container with restart rules of its own (KEP-5307) reports its exit while the kubelet
    # still shows the pod Running; the operator may finish the job and delete the pod before
    # the phase follows, so the exit is the container's, not the pod's phase.
    exited = first_seen(mine, lambda p: p.phase in TERMINAL or p.exit_code is not None)

    def last(times: dict[str, float]) -> Optional[float]:
        return max(times.values()) if len(times) >= nnodes else None

    return {
        "job_added": job_first(js, lambda j: True),
        "first_created": min(created.values()) if created else None,
        "all_created": last(created),
        "all_running": last(running),
        "last_exit": last(exited),
        "job_succeeded": job_first(js, lambda j: j.phase == "Succeeded"),
        "job_finished": job_first(js, lambda j: j.phase in TERMINAL),
    }


PHASE_ORDER = {"Pending": 0, "Running": 1, "Succeeded": 2, "Failed": 2}


def status_latencies(pods: Sequence[PodObs], jobs: Sequence[JobObs],
                     phases: Sequence[str] = ("Running", "Succeeded", "Failed")) -> dict[str, Any]:
    """For every pod phase change (first event of a pod with a new phase in ``phases``), the
    time until the DDPJob's status first lists that pod (same attempt) in that phase or a later
    one: the status has caught up with the change.

    Returns ``latencies`` (seconds), ``matches`` (job, time of the change, time the status
    showed it: one per latency), ``overtaken`` (how many of them the status only showed as a
    later phase: a pod that ran for less than the operator took to report it) and ``missed``
    (changes the status never caught up with)."""
    by_job: dict[str, list[JobObs]] = {}
    for j in sorted(jobs, key=lambda j: j.t):
        by_job.setdefault(j.name, []).append(j)
    changes: list[PodObs] = []
    last_phase: dict[str, str] = {}
    for p in sorted(pods, key=lambda p: p.t):
        if p.event != "DELETED" and p.phase != last_phase.get(p.uid):
            last_phase[p.uid] = p.phase
            if p.phase in phases:
                changes.append(p)
    latencies, matches, overtaken, missed = [], [], 0, 0
    for p in changes:
        # A pod instance moves through the phases in order, and its name is unique within an
        # attempt, so the first status listing (rank, name) for that attempt in this phase or a
        # later one is the one. It can come a hair before our own watch saw the pod (the
        # operator's watch won the race): a small negative latency, kept as measured.
        order = PHASE_ORDER.get(p.phase, 3)
        shown = None
        for j in by_job.get(p.job, ()):
            if j.attempt != p.attempt:
                continue
            phase = next((ph for rank, name, ph in j.nodes if rank == p.rank and name == p.name), None)
            if phase is not None and PHASE_ORDER.get(phase, 3) >= order:
                shown = (j.t, phase)
                break
        if shown is None:
            missed += 1
            continue
        latencies.append(shown[0] - p.t)
        matches.append((p.job, p.t, shown[0]))
        overtaken += shown[1] != p.phase
    return {"latencies": latencies, "matches": matches, "overtaken": overtaken, "missed": missed}


# ---------------------------------------------------------------------------------------------
# The API server's audit log
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AuditRecord:
    """One completed request (stage ResponseComplete) from the audit log."""

    verb: str
    resource: str  # "pods", "ddpjobs/status", ... (resource/subresource)
    namespace: str
    name: str
    code: int
    received: float  # requestReceivedTimestamp, epoch seconds
    completed: float  # stageTimestamp
    username: str = ""  # who sent it

    @property
    def key(self) -> str:
        return f"{self.verb} {self.resource}"


def _epoch(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def parse_audit(lines: Iterable[str], username: Optional[str] = None) -> list[AuditRecord]:
    """The requests ``username`` completed (every user's when None), in log order.
    Long-running requests (watches) log ResponseStarted and, when they end, ResponseComplete:
    only the latter is a record, so a watch counts once, when it ends."""
    records = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line cut short by the reader racing the writer
        sender = (event.get("user") or {}).get("username") or ""
        if event.get("stage") != "ResponseComplete" or (username is not None and sender != username):
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        records.append(AuditRecord(
            verb=event.get("verb", ""), resource=resource, namespace=ref.get("namespace", ""),
            name=ref.get("name", ""), code=int((event.get("responseStatus") or {}).get("code") or 0),
            received=_epoch(event["requestReceivedTimestamp"]), completed=_epoch(event["stageTimestamp"]),
            username=sender))
    return records


def created_at(records: Iterable[AuditRecord], resource: str, namespace: str, name: str) -> Optional[float]:
    """When the API server received the request that created ``resource`` ``namespace/name``
    (whoever sent it: parse_audit's records of every user), or None: the reference on the API
    server's own clock for figures taken from its audit log (a watch stamps an object when it
    arrives, later on a loaded machine)."""
    for r in records:
        if r.key == f"create {resource}" and r.namespace == namespace and r.name == name and r.code < 300:
            return r.received
    return None


STATUS_LATENCY_PARTS = {
    "operator": "pod change -> the operator's status write reaches the API server",
    "api": "the status write inside the API server",
    "watch": "write done -> the DDPJob change reaches a watcher",
}


def status_latency_parts(matches: Iterable[tuple[str, float, float]],
                         records: Iterable[AuditRecord]) -> dict[str, list[float]]:
    """Each status latency (from status_latencies' ``matches``) split at the operator's status
    write that carried it, the last one of that job completed by the time the status was seen
    (audit log, same host clock):

    * ``operator``: the change reaching the operator's watch, its coalescing window, waiting
      for a reconcile thread, the pass and the request's way to the API server;
    * ``api``: the write inside the API server (received -> response);
    * ``watch``: the stored change reaching the benchmark's watch.

    A change no recorded write precedes (the audit log was cut short) is left out."""
    writes: dict[str, list[AuditRecord]] = {}
    for r in sorted(records, key=lambda r: r.completed):
        if r.key == "patch ddpjobs/status" and r.code < 300:
            writes.setdefault(r.name, []).append(r)
    parts: dict[str, list[float]] = {name: [] for name in STATUS_LATENCY_PARTS}
    for job, changed, shown in matches:
        carried = [w for w in writes.get(job, ()) if w.completed <= shown]
        if not carried:
            continue
        write = carried[-1]
        parts["operator"].append(write.received - changed)
        parts["api"].append(write.completed - write.received)
        parts["watch"].append(shown - write.completed)
    return parts


def count_requests(records: Iterable[AuditRecord]) -> dict[str, int]:
    """"verb resource" -> count, most frequent first."""
    return dict(Counter(r.key for r in records).most_common())


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (numbers as given; floats with 3 significant decimals)."""
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Prometheus text (the API server's /metrics)
# ---------------------------------------------------------------------------------------------
def parse_metrics(text: str, names: Sequence[str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples of the named metrics: (name, sorted label pairs) -> value. Histogram series are
    named as exposed (``..._sum``, ``..._count``); buckets are skipped."""
    wanted = set(names)
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        if name not in wanted:
            continue
        pairs = []
        for item in _split_labels(labels.rstrip("}")):
            key, _, raw = item.partition("=")
            pairs.append((key, raw.strip('"')))
        try:
            samples[(name, tuple(sorted(pairs)))] = float(value)
        except ValueError:
            continue
    return samples


def _split_labels(text: str) -> list[str]:
    """``a="x",b="y,z"`` -> ['a="x"', 'b="y,z"'] (commas inside quotes stay)."""
    items, current, quoted, escaped = [], "", False, False
    for char in text:
        if escaped:
            current += char
            escaped = False
        elif char == "\\":
            current += char
            escaped = True
        elif char == '"':
            current += char
            quoted = not quoted
        elif char == "," and not quoted:
            items.append(current)
            current = ""
        else:
            current += char
    if current:
        items.append(current)
    return items


def metrics_delta(before: Mapping, after: Mapping, name: str, **labels: str) -> float:
    """The increase of ``name`` between two parse_metrics snapshots, summed over the series
    whose labels include ``labels``."""
    def total(snapshot: Mapping) -> float:
        return sum(value for (n, pairs), value in snapshot.items()
                   if n == name and all((k, v) in pairs for k, v in labels.items()))

    return total(after) - total(before)


# ---------------------------------------------------------------------------------------------
# py-spy profiles
# ---------------------------------------------------------------------------------------------
# py-spy names a frame "function (package/module.py:line)"
PROFILE_BUCKETS = (("ddpjob", "(ddpjob/"), ("kopf", "(kopf/"), ("aiohttp", "(aiohttp/"),
                   ("kubernetes client", "(kubernetes/"), ("urllib3", "(urllib3/"), ("ssl", "(ssl.py"),
                   ("json", "(json/"), ("yaml", "(yaml/"), ("asyncio", "(asyncio/"), ("logging", "(logging/"),
                   ("threading", "(threading.py"))


def profile_buckets(collapsed: Iterable[str]) -> dict[str, float]:
    """Share of a py-spy ``--format raw`` profile's samples per package: each sample goes to
    the package of its deepest frame that belongs to one (``other`` if none)."""
    counts: Counter = Counter()
    for line in collapsed:
        stack, _, number = line.rstrip().rpartition(" ")
        if not stack or not number.isdigit():
            continue
        bucket = "other"
        for frame in reversed(stack.split(";")):
            match = next((name for name, marker in PROFILE_BUCKETS if marker in frame), None)
            if match:
                bucket = match
                break
        counts[bucket] += int(number)
    total = sum(counts.values())
    return {name: count / total for name, count in counts.most_common()} if total else {}
