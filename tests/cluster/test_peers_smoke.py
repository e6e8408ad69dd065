"""benchmarks/peers.py still runs: its ``--smoke`` mode (tiny sizes) in this session's test bed
and operator, with the training-operator started next to them, produces every figure for all
three systems and writes its results file. No timing thresholds.

The PyTorchJob side needs the training-operator binary (scripts/build-training-operator.sh, about
2 minutes cold, cached under ~/.cache/ddpjob/peers/); without it the test skips, saying so.
"""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import bench_cluster, peer_controllers, peers
from tests.testbed.target import local_testbed_only

pytestmark = [pytest.mark.cluster, local_testbed_only]


def test_peers_smoke_mode_produces_every_figure_for_all_three(cluster, operator, tmp_path):
    if not peer_controllers.present():
        pytest.skip(f"no training-operator binary in {peer_controllers.cached_dir()}: "
                    "run scripts/build-training-operator.sh (about 2 minutes, cached)")
    if not operator.running:
        operator.start()
    bed = bench_cluster.Bed.from_fixtures(cluster, operator)
    args = peers.parser().parse_args(["--smoke", "--results-dir", str(tmp_path)])

    results = peers.run(bed, args)

    figures = results["figures"]
    missing = [key for key in peers.SMOKE_FIGURES if key not in figures]
    assert not missing, f"peers --smoke did not produce {missing}; it produced {sorted(figures)}"
    for key, value in figures.items():
        assert isinstance(value, float) and math.isfinite(value), f"{key} = {value!r}"
    for system in peers.SYSTEMS:
        many = results["systems"][system]["many"]
        assert many["failed"] == [] and many["requests_total"] > 0, (system, many)
        assert results["systems"][system]["gang"]["pod_posts"] == [peers.SMOKE["gang"]], system
    report = peers.report(results)
    assert "DDPJob / PyTorchJob" in report and "DDPJob / Indexed Job" in report
    path = bench_cluster.write_results(peers.NAME, args, bench_cluster.machine_info(), results,
                                       command="peers --smoke (tests/cluster/test_peers_smoke.py)")
    assert json.loads(path.read_text())["figures"].keys() == figures.keys()
