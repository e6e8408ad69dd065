"""``ddpjob status JOB``: one screen about one DDPJob, from the object the API server holds.

Pure: a DDPJob (a plain dict, as GET returns it) -> text. The status is read with the status
model (api/status.py) and every string in it goes through ``terminal_text``: a pod's
termination message or a node's reason is anyone's who runs code in the job. The screen stays
bounded whatever the status holds (its own bounds, and the few entries of each list shown).
"""
from __future__ import annotations

from typing import Any, Optional

from ddpjob.api import spec as spec_model
from ddpjob.api.status import FailureRecord, JobStatus, terminal_reason
from ddpjob.client.terminal_text import one_line, printable_lines

#: failureHistory entries shown (the status keeps 10), and nodes listed (the status keeps 64).
FAILURES_SHOWN = 5
NODES_SHOWN = 16
#: Characters of one table cell, and of a message that ends a line.
CELL = 40
MESSAGE = 160
#: Lines of status.failedNode.message shown (its last lines: where a traceback says why).
FAILED_NODE_LINES = 20


def render_status(job: dict) -> str:
    """The screen ``ddpjob status`` prints for ``job``."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    status = JobStatus.from_dict(job.get("status") or {})
    policy = spec.get("failurePolicy") or {}
    max_restarts = _int(policy.get("maxRestarts"), _default(spec_model.FailurePolicy, "maxRestarts"))
    max_disruptions = _int(policy.get("maxDisruptions"), _default(spec_model.FailurePolicy, "maxDisruptions"))

    name = one_line(f"{meta.get('namespace', '')}/{meta.get('name', '')}", 2 * CELL)
    lines = [f"DDPJob {name}"]
    if not status.phase:
        lines.append("  Phase:       (none yet: the operator has not seen the job; is it running?)")
    else:
        reason, message = terminal_reason(status) if status.terminal else (status.reason, status.message)
        lines.append(f"  Phase:       {status.phase}" + (f" ({one_line(reason, CELL)})" if reason else ""))
        if message:
            lines.append(f"  Message:     {one_line(message, 2 * MESSAGE)}")
    lines.append(f"  Nodes:       {status.readyNodes}/{status.nnodes or _int(spec.get('nnodes'), 0)} ready")
    lines.append(f"  Attempt:     {status.restartAttempt}   restarts {status.restarts}/{max_restarts}   "
                 f"disruptions {status.disruptions}/{max_disruptions}")
    lines.extend(_progress(status))
    if status.goodput is not None and status.goodput.summary:
        lines.append(f"  Goodput:     {one_line(status.goodput.summary, MESSAGE)}")
    times = [f"started {status.startTime}" if status.startTime else "",
             f"finished {status.completionTime}" if status.completionTime else ""]
    if any(times):
        lines.append("  Time:        " + ", ".join(one_line(t, CELL) for t in times if t))
    lines.extend(_failures(status.failureHistory))
    lines.extend(_failed_node(status))
    lines.extend(_excluded(status))
    lines.extend(_nodes(status))
    return "\n".join(lines) + "\n"


def _default(cls: type, field_name: str) -> int:
    return next(f.default for f in cls.__dataclass_fields__.values() if f.name == field_name)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _progress(status: JobStatus) -> list[str]:
    progress = status.progress
    if progress is None or not (progress.summary or progress.step):
        return ["  Progress:    (none reported)"]
    parts = [one_line(progress.summary or f"step {progress.step}", CELL)]
    if progress.eta:
        parts.append(f"ETA {one_line(progress.eta, CELL)}")
    if progress.epoch is not None:
        parts.append(f"epoch {progress.epoch}" + (f"/{progress.epochs}" if progress.epochs is not None else ""))
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4g}")
    if progress.throughput is not None:
        parts.append(f"{progress.throughput:.4g} samples/s")
    parts.append(f"{progress.ranksReporting} rank(s) reporting, attempt {progress.attempt}")
    return ["  Progress:    " + ", ".join(parts)]


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], indent: str = "    ") -> list[str]:
    """Columns as wide as their widest cell (each cell at most CELL; the last one is free)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]).rstrip() for r in [header, *rows]]


def _rank(record: FailureRecord) -> str:
    return f"{record.nodeRank}/{record.rank if record.rank is not None else '-'}"


def _failures(history: tuple[FailureRecord, ...]) -> list[str]:
    if not history:
        return ["  Failures:    none"]
    shown = history[:FAILURES_SHOWN]
    more = f", {len(history) - len(shown)} older not shown" if len(history) > len(shown) else ""
    rows = [(one_line(r.time or "-", CELL), str(r.attempt), _rank(r), one_line(r.pod or "-", CELL),
             one_line(r.nodeName or "-", CELL), one_line(r.reason or "-", CELL),
             "-" if r.exitCode is None else str(r.exitCode), one_line(r.restartMode or "(ended the job)", CELL),
             one_line(r.message, MESSAGE)) for r in shown]
    header = ("TIME", "ATTEMPT", "NODE/RANK", "POD", "K8S NODE", "REASON", "EXIT", "RESTART", "MESSAGE")
    return [f"  Failures:    {len(history)} recorded, the newest first{more}", *_table(header, rows)]


def _failed_node(status: JobStatus) -> list[str]:
    node = status.failedNode
    if node is None:
        return []
    exit_code = "" if node.exitCode is None else f", exit {node.exitCode}"
    lines = [f"  Failed node: node {node.nodeRank} (pod {one_line(node.pod or '-', CELL)}"
             f"{exit_code}{', ' + one_line(node.reason, CELL) if node.reason else ''})"]
    said = printable_lines(node.message, 2 * MESSAGE)
    if len(said) > FAILED_NODE_LINES:
        lines.append(f"    | ... ({len(said) - FAILED_NODE_LINES} earlier line(s))")
    lines.extend(f"    | {line}" for line in said[-FAILED_NODE_LINES:])
    return lines


def _excluded(status: JobStatus) -> list[str]:
    if not status.excludedNodes:
        return []
    rows = [(one_line(n.nodeName, CELL), str(n.failures), one_line(n.reason or "-", CELL),
             one_line(n.since or "-", CELL), one_line(n.message, MESSAGE)) for n in status.excludedNodes]
    return ["  Excluded:    Kubernetes nodes the next pods avoid",
            *_table(("K8S NODE", "FAILURES", "REASON", "SINCE", "WHY"), rows)]


def _nodes(status: JobStatus) -> list[str]:
    if not status.nodes:
        return ["  Pods:        none observed in this attempt"]
    shown = status.nodes[:NODES_SHOWN]
    hidden = len(status.nodes) - len(shown) + max(status.unlistedNodes, 0)
    rows = [(str(n.nodeRank), one_line(n.pod, CELL), one_line(n.phase or "-", CELL), "yes" if n.ready else "no",
             "-" if n.exitCode is None else str(n.exitCode), one_line(n.reason or "-", CELL),
             one_line(n.nodeName or "-", CELL), one_line(n.message, MESSAGE)) for n in shown]
    lines = [f"  Pods:        attempt {status.restartAttempt}",
             *_table(("NODE", "POD", "PHASE", "READY", "EXIT", "REASON", "K8S NODE", "MESSAGE"), rows)]
    if hidden > 0:
        lines.append(f"    ... and {hidden} more node(s) not listed (the not-healthy ones are listed first)")
    return lines


def describe_missing(namespace: str, name: str, context: Optional[str] = None) -> str:
    """The one line for a job that is not there."""
    where = f" (context {context})" if context else ""
    return (f"no DDPJob {name} in namespace {namespace}{where}: check the name and -n "
            f"(kubectl get ddpjobs -n {namespace})")
