"""The tables of every recorded benchmark, from benchmarks/results/*.json, each with the
command and the machine it was measured on: what benchmarks/README.md quotes.

    python -m benchmarks.report                   # print them all
    python -m benchmarks.report --update-readme   # rewrite the README's generated blocks
    python -m benchmarks.report --check-readme    # exit 1 if the README quotes other figures
    python -m benchmarks.report --results-dir /tmp/results --smoke   # the *-smoke.json files

The README's figures are never typed by hand: each block between
``<!-- report: NAME -->`` and ``<!-- /report -->`` is what this prints for results/NAME.json
(a unit test checks that the two agree), and the prose around the blocks cites them.
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
BENCHMARKS = ["operator_start_latency", "operator_gang_size", "operator_many_jobs", "operator_api_cost",
              "operator_progress_cost", "operator_recovery", "restart_modes", "operator_failover", "peers", "trainer_scaling",
              "trainer_vs_plain", "trainer_flops"]
BLOCK = re.compile(r"(<!-- report: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /report -->)", re.S)


def machine_line(data: dict) -> str:
    m = data["machine"]
    load = "/".join(f"{x:.1f}" for x in m["loadavg_start"])
    end = "/".join(f"{x:.1f}" for x in m.get("loadavg_end", ()))
    return (f"{m['date']}, {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB, kernel {m['kernel']}, "
            f"Python {m['python']}, commit {m['git']}; load average (1/5/15 min) {load} at the start, {end} at the end")


def section(path: Path) -> str:
    """One results file as the README quotes it: the command, the machine, the tables."""
    data = json.loads(path.read_text())
    # its report() formats its own results ("peers-start-many": a subset run of benchmarks.peers)
    module = importlib.import_module(f"benchmarks.{data['benchmark'].split('-')[0]}")
    return f"`{data['command']}`\n\n{machine_line(data)}\n\n{module.report(data)}\n"


def results_files(results_dir: Path, smoke: bool = False) -> list[Path]:
    suffix = "-smoke" if smoke else ""
    paths = []
    for name in BENCHMARKS:
        paths += sorted(results_dir.glob(f"{name}{suffix}.json"))
        paths += sorted(p for p in results_dir.glob(f"{name}-*{suffix}.json") if smoke or not p.stem.endswith("-smoke"))
    return paths


def updated_readme(text: str, results_dir: Path) -> str:
    """``text`` with every generated block rewritten from its results file."""
    def block(match: re.Match) -> str:
        path = results_dir / f"{match['name']}.json"
        body = section(path) if path.exists() else f"(no results yet: {path.name} is missing)\n"
        return f"{match.group(1)}{body}{match.group(4)}"
    return BLOCK.sub(block, text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results-dir", type=Path, default=HERE / "results")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--update-readme", action="store_true", help=f"rewrite the generated blocks of {README.name}")
    p.add_argument("--check-readme", action="store_true", help=f"exit 1 if {README.name} is out of date")
    a = p.parse_args(argv)
    if a.update_readme or a.check_readme:
        current = README.read_text()
        updated = updated_readme(current, a.results_dir)
        if a.check_readme:
            print("README up to date" if updated == current else "README out of date: python -m benchmarks.report --update-readme")
            return 0 if updated == current else 1
        README.write_text(updated)
        print(f"rewrote {len(BLOCK.findall(updated))} blocks of {README}")
        return 0
    for path in results_files(a.results_dir, a.smoke):
        print(f"## {path.stem}\n\n{section(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
