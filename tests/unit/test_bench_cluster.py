"""The benchmark harness's own helpers that need no test bed (benchmarks/bench_cluster.py)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import bench_cluster as bc


def test_bed_setup_in_words():
    assert bc.bed_setup_text({"pods_nice": 0, "pods_cpu_limit": 0, "operator_env": {}}) == ""
    assert bc.bed_setup_text({"pods_nice": 19, "pods_cpu_limit": 0.5,
                              "operator_env": {"DDPJOB_OPERATOR_RECONCILE_WORKERS": "32"}}) == (
        "node agent and pods at nice 19, node agent and pods capped at 0.5 core(s), "
        "DDPJOB_OPERATOR_RECONCILE_WORKERS=32")


def test_results_files_are_named_after_the_bed_setup(tmp_path):
    args = argparse.Namespace(results_dir=tmp_path, smoke=False, pods_nice=19, pods_cpu_limit=0.5)
    path = bc.write_results("operator_gang_size", args, {"loadavg_start": (0, 0, 0)}, {"figures": {}})
    assert path.name == "operator_gang_size-nice19-cpu0.5.json"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(os.geteuid() != 0 or not (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists()
                                              or Path("/sys/fs/cgroup/cgroup.subtree_control").exists()),
                    reason="needs root and the cgroup cpu controller (as --pods-cpu-limit does)")
def test_cpu_limited_caps_a_busy_process_and_cleans_up():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with bc.cpu_limited(busy.pid, 0.2):
            groups = [g for root in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup")  # cgroup v1 or v2
                      for g in Path(root).glob(f"ddpjob-bench-{busy.pid}")]
            before, started = _cpu_seconds(busy.pid), time.monotonic()
            time.sleep(2)
            used = (_cpu_seconds(busy.pid) - before) / (time.monotonic() - started)
        assert used < 0.35, f"capped at 0.2 cores, used {used:.2f}"
        assert groups and not any(g.exists() for g in groups), "the cgroup is removed on the way out"
    finally:
        busy.kill()
        busy.wait()
