"""Print the tables of every recorded benchmark from benchmarks/results/*.json, each with
the command and the machine it was measured on: what benchmarks/README.md quotes.

    python benchmarks/report.py
    python benchmarks/report.py --results-dir /tmp/results --smoke   # the *-smoke.json files
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPERATOR = ["operator_start_latency", "operator_gang_size", "operator_many_jobs", "operator_api_cost",
            "operator_recovery"]


def machine_line(data: dict) -> str:
    m = data["machine"]
    load = "/".join(f"{x:.1f}" for x in m["loadavg_start"])
    end = "/".join(f"{x:.1f}" for x in m.get("loadavg_end", ()))
    return (f"{m['date']}, {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB, kernel {m['kernel']}, "
            f"Python {m['python']}, commit {m['git']}; load average (1/5/15 min) {load} at the start, {end} at the end")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results-dir", type=Path, default=HERE / "results")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    suffix = "-smoke" if a.smoke else ""
    for name in OPERATOR:
        paths = sorted(a.results_dir.glob(f"{name}{suffix}.json")) + sorted(
            p for p in a.results_dir.glob(f"{name}-*{suffix}.json") if a.smoke or not p.stem.endswith("-smoke"))
        if not paths:
            print(f"## {name}: no results in {a.results_dir}\n")
        for path in paths:
            data = json.loads(path.read_text())
            module = importlib.import_module(name)  # its report() formats its own results
            print(f"## {path.stem}\n\n`{data['command']}`\n\n{machine_line(data)}\n\n{module.report(data)}\n")


if __name__ == "__main__":
    main()
