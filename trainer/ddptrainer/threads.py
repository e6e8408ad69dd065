"""How many OpenMP threads each worker of a pod gets: the pod's CPUs shared by its processes.

Why: torchrun, finding OMP_NUM_THREADS unset with several workers per node, prints a warning
box on every pod and sets 1, which leaves a pod with 8 CPUs and 2 workers using 2 of them.
ddptrain-pod sets it first (where the job's env has not): the CPUs the container may use (its
cgroup's CPU limit, else the CPUs it may run on), divided among nproc_per_node, at least 1.
"""
from __future__ import annotations

import math
import os
from typing import Optional

OMP_NUM_THREADS = "OMP_NUM_THREADS"
_CGROUP_V2 = "/sys/fs/cgroup/cpu.max"
_CGROUP_V1 = ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii") as f:
            return f.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return None


def cgroup_cpus(v2: str = _CGROUP_V2, v1: tuple[str, str] = _CGROUP_V1) -> Optional[float]:
    """The container's CPU limit in CPUs (a quota of 150000 per 100000: 1.5), None if none."""
    text = _read(v2)
    if text is not None:
        quota, _, period = text.partition(" ")
        if quota.isdigit() and period.isdigit() and int(period) > 0:
            return int(quota) / int(period)
        return None  # "max": no limit
    quota_text, period_text = _read(v1[0]), _read(v1[1])
    try:
        quota, period = int(quota_text or ""), int(period_text or "")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, capped by the cgroup's limit (rounded up)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    limit = cgroup_cpus()
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)


def per_worker(nproc_per_node: int, cpus: Optional[int] = None) -> int:
    """OMP threads for each of ``nproc_per_node`` workers on ``cpus`` CPUs (default: usable_cpus)."""
    total = usable_cpus() if cpus is None else cpus
    return max(1, total // max(1, nproc_per_node))
