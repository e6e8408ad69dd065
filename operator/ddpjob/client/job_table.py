"""``ddpjob list`` and ``-o``: DDPJobs as a table, as names, or as JSON or YAML, in kubectl's forms.

Pure: plain dicts as the API server returns them -> text. Every string of a status goes through
``terminal_text`` (a pod's message is anyone's who runs code in the job), and each cell is
bounded, so a row is one line whatever the status holds.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any, Optional, Sequence

import yaml

from ddpjob.api import names
from ddpjob.api.status import JobStatus, terminal_reason
from ddpjob.client.terminal_text import one_line

#: kubectl's -o values that ``list`` and ``status`` take (wide: ``list`` only).
OUTPUTS = ("wide", "name", "json", "yaml")
#: The resource.group that kubectl reads back from ``-o name``: `kubectl delete ddpjob.ddpjob.dev/x`.
RESOURCE = f"{names.SINGULAR}.{names.API_GROUP}"
CELL = 40
MESSAGE = 80


def name_of(job: dict) -> str:
    """``-o name``'s line for a job."""
    return f"{RESOURCE}/{(job.get('metadata') or {}).get('name', '')}"


def as_document(jobs: Sequence[dict], output: str, *, single: bool = False) -> str:
    """``jobs`` as ``-o json`` or ``-o yaml`` print them: the object itself when one was asked for
    by name (``single``), else a List, as kubectl writes one."""
    data: Any = jobs[0] if single else {"apiVersion": "v1", "kind": "List", "items": list(jobs),
                                        "metadata": {"resourceVersion": ""}}
    if output == "json":
        return json.dumps(data, indent=4, sort_keys=False, ensure_ascii=False) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def age(created: Optional[str], now: dt.datetime) -> str:
    """kubectl's AGE: 45s, 12m, 5h, 3d, 2y (the largest whole unit; <unknown> without a time)."""
    try:
        then = dt.datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("y", 365 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= size):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


HEADER = ("NAME", "PHASE", "READY", "RESTARTS", "PROGRESS", "AGE")
WIDE = ("REASON", "ATTEMPT", "ETA", "MESSAGE")


def row(job: dict, now: dt.datetime, *, wide: bool = False, namespace: bool = False) -> tuple[str, ...]:
    """One job's cells (``namespace``: the NAMESPACE column first, as ``-A`` has it)."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    status = JobStatus.from_dict(job.get("status") or {})
    nnodes = status.nnodes or (spec.get("nnodes") if isinstance(spec.get("nnodes"), int) else 0)
    progress = status.progress.summary if status.progress is not None and status.progress.summary else "-"
    cells = [one_line(str(meta.get("name", "")), 63), one_line(status.phase or "-", CELL),
             f"{status.readyNodes}/{nnodes}", str(status.restarts), one_line(progress, CELL),
             age(meta.get("creationTimestamp"), now)]
    if namespace:
        cells.insert(0, one_line(str(meta.get("namespace", "")), 63))
    if wide:
        reason, message = terminal_reason(status) if status.terminal else (status.reason, status.message)
        eta = status.progress.eta if status.progress is not None and status.progress.eta else "-"
        cells += [one_line(reason or "-", CELL), str(status.restartAttempt), one_line(eta, CELL),
                  one_line(message or "-", MESSAGE)]
    return tuple(cells)


def header(*, wide: bool = False, namespace: bool = False) -> tuple[str, ...]:
    return (("NAMESPACE",) if namespace else ()) + HEADER + (WIDE if wide else ())


def table(rows: Sequence[tuple[str, ...]], head: tuple[str, ...]) -> str:
    """kubectl's table: columns as wide as their widest cell, three spaces apart."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "".join(("   ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip() + "\n" for r in [head, *rows])
