"""OMP_NUM_THREADS for torchrun's workers: the pod's CPUs shared among them (ddptrainer/threads.py),
so torchrun neither warns nor leaves a pod with 8 CPUs and 2 workers using 2 (issue 36, item 6)."""
from __future__ import annotations

import pytest

from ddptrainer import threads

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("v2, cpus", [("150000 100000", 1.5), ("max 100000", None), ("200000 100000", 2.0),
                                      ("garbage", None)])
def test_the_cgroup_v2_limit(tmp_path, v2, cpus):
    (tmp_path / "cpu.max").write_text(v2 + "\n")
    assert threads.cgroup_cpus(str(tmp_path / "cpu.max"), ("/nonexistent", "/nonexistent")) == cpus


@pytest.mark.parametrize("quota, cpus", [("-1", None), ("300000", 3.0)])
def test_the_cgroup_v1_limit(tmp_path, quota, cpus):
    (tmp_path / "quota").write_text(quota)
    (tmp_path / "period").write_text("100000")
    assert threads.cgroup_cpus("/nonexistent", (str(tmp_path / "quota"), str(tmp_path / "period"))) == cpus


def test_the_cpus_are_shared_among_the_workers_at_least_one_each():
    assert threads.per_worker(2, cpus=8) == 4
    assert threads.per_worker(3, cpus=8) == 2
    assert threads.per_worker(16, cpus=8) == 1
    assert threads.per_worker(0, cpus=4) == 4
    assert threads.per_worker(1) == threads.usable_cpus() >= 1


def test_a_limit_caps_the_affinity(monkeypatch):
    monkeypatch.setattr(threads, "cgroup_cpus", lambda: 1.5)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert threads.usable_cpus() == 2
