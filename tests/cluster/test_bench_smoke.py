"""Each operator benchmark under benchmarks/ still runs: its ``--smoke`` mode, in this
session's test bed and operator, produces every figure it reports and writes its results file.

No timing thresholds: benchmarks are not timed tests (benchmarks/README.md has the figures).
"""
from __future__ import annotations

import importlib
import json
import math

import pytest

from tests.testbed.target import local_testbed_only

OPERATOR_BENCHMARKS = ["operator_start_latency", "operator_gang_size", "operator_many_jobs",
                       "operator_api_cost", "operator_progress_cost", "operator_recovery",
                       "operator_failover"]

# The benchmarks need the local test bed itself: the audit log, process ids, pod processes.
pytestmark = [pytest.mark.cluster, local_testbed_only]


def _import(name: str):
    return importlib.import_module(f"benchmarks.{name}")


@pytest.mark.parametrize("name", OPERATOR_BENCHMARKS)
def test_benchmark_smoke_mode_produces_its_figures(name, cluster, operator, tmp_path):
    bench_cluster = _import("bench_cluster")
    module = _import(name)
    if not operator.running:  # a test before this one may have left it stopped
        operator.start()
    bed = bench_cluster.Bed.from_fixtures(cluster, operator)
    args = module.parser().parse_args(["--smoke", "--results-dir", str(tmp_path)])

    results = module.run(bed, args)

    figures = results["figures"]
    missing = [key for key in module.SMOKE_FIGURES if key not in figures]
    assert not missing, f"{name} --smoke did not produce {missing}; it produced {sorted(figures)}"
    for key, value in figures.items():
        assert isinstance(value, (int, float)) and math.isfinite(value), f"{name}: {key} = {value!r}"
    assert module.report(results).strip()
    path = bench_cluster.write_results(module.NAME, args, bench_cluster.machine_info(), results,
                                       command=f"{name} --smoke (tests/cluster/test_bench_smoke.py)")
    written = json.loads(path.read_text())
    assert path.name == f"{name}-smoke.json"
    assert written["figures"].keys() == figures.keys()
