"""The trainer benchmarks still run: each one's ``--smoke`` mode trains for real (gloo ranks
under torchrun), writes its results file with every figure, and its report formats it.

No timing thresholds: benchmarks are not timed tests (benchmarks/README.md has the figures).
"""
from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FIGURES = {
    "trainer_scaling": ["1 rank x 1 thread.images_per_s", "1 rank x 2 threads.images_per_s",
                        "2 ranks x 1 thread.images_per_s", "speedup_2_ranks", "efficiency_2_ranks"],
    "trainer_vs_plain": ["plain.images_per_s", "trainer.images_per_s", "ratio", "window_ratio",
                         "plain.cpu_s", "trainer.cpu_s", "cpu_ratio"],
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_trainer_benchmark_smoke_mode_writes_its_figures(name, tmp_path):
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--smoke", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    written = json.loads((tmp_path / f"{name}-smoke.json").read_text())
    assert written["benchmark"] == name
    assert written["command"] == f"python -m benchmarks.{name} --smoke --results-dir {tmp_path}"
    figures = written["figures"]
    assert sorted(figures) == sorted(FIGURES[name])
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in figures.values()), figures
    report = importlib.import_module(f"benchmarks.{name}").report(written)
    assert "images/s" in report and report in proc.stdout


def test_trainer_flops_smoke_mode_writes_the_ceiling_and_each_variant(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.trainer_flops", "--smoke", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    written = json.loads((tmp_path / "trainer_flops-smoke.json").read_text())
    figures = written["figures"]
    module = importlib.import_module("benchmarks.trainer_flops")
    assert figures["ceiling_gflops"] > 0
    for variant in (module.BASELINE, "channels-last"):
        assert figures[f"{variant}.images_per_s"] > 0 and 0 < figures[f"{variant}.fraction_of_ceiling"]
        assert math.isfinite(figures[f"{variant}.loss_max_rel_diff"])
    assert figures[f"{module.BASELINE}.loss_max_rel_diff"] == 0.0
    for reference in module.REFERENCES:  # the plain loop, in-memory DDP, no sync: other data
        assert figures[f"{reference}.images_per_s"] > 0
        assert f"{reference}.loss_max_rel_diff" not in figures
    assert written["params"]["references"] == list(module.REFERENCES)
    assert module.report(written) in proc.stdout
