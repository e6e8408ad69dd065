"""benchmarks/README.md quotes the recorded figures, never hand-typed ones: each generated
block is what benchmarks/report.py prints for its results file."""
from __future__ import annotations

import json
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parents[2] / "benchmarks"

from benchmarks import report


def test_readme_blocks_match_the_recorded_results():
    text = report.README.read_text()
    assert text == report.updated_readme(text, BENCHMARKS_DIR / "results"), (
        "benchmarks/README.md is out of date with benchmarks/results: python -m benchmarks.report --update-readme")


def test_every_recorded_result_is_quoted_and_every_quote_has_results():
    quoted = {m["name"] for m in report.BLOCK.finditer(report.README.read_text())}
    recorded = {p.stem for p in report.results_files(BENCHMARKS_DIR / "results")}
    assert quoted == recorded
    assert not [n for n in quoted if n.endswith("-smoke")]


def test_a_block_is_rewritten_from_its_results_file(tmp_path):
    recorded = json.loads((BENCHMARKS_DIR / "results" / "trainer_scaling.json").read_text())
    recorded["figures"]["2 ranks x 1 thread.images_per_s"] = 1234.5
    recorded["command"] = "python -m benchmarks.trainer_scaling --made-up-here"
    (tmp_path / "trainer_scaling.json").write_text(json.dumps(recorded))
    stale = "intro\n<!-- report: trainer_scaling -->\nold figures\n<!-- /report -->\noutro\n"

    updated = report.updated_readme(stale, tmp_path)

    assert "old figures" not in updated
    assert updated.startswith("intro\n<!-- report: trainer_scaling -->\n`python -m benchmarks.trainer_scaling --made-up-here`")
    assert "| 2 ranks x 1 thread | 1234.5 |" in updated
    assert updated.endswith("<!-- /report -->\noutro\n")


def test_a_block_without_results_says_so(tmp_path):
    updated = report.updated_readme("<!-- report: operator_recovery -->\n<!-- /report -->\n", tmp_path)
    assert "no results yet: operator_recovery.json is missing" in updated
