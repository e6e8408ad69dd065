"""Where benchmark figures go: the machine they were measured on, and one JSON file per
benchmark under benchmarks/results/ (``-smoke`` for ``--smoke`` runs). Standard library only,
so the trainer benchmarks can use it without the test bed's dependencies."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"


def machine_info() -> dict[str, Any]:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(int(meminfo["MemTotal"].split()[0]) / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "loadavg_start": os.getloadavg(),
        "git": commit + ("-dirty" if dirty else ""),
    }


def command_line() -> str:
    """How this benchmark was started, as the README quotes it."""
    return " ".join(["python", "-m", f"benchmarks.{Path(sys.argv[0]).stem}"] + sys.argv[1:])


def write_results(name: str, args: argparse.Namespace, machine: dict, results: dict,
                  command: str | None = None) -> Path:
    """``<results dir>/<name>[-niceN][-cpuN][-smoke].json``: the command, the machine (with the load
    average now, at the end) and the results."""
    machine = {**machine, "loadavg_end": os.getloadavg()}
    nice, cores = getattr(args, "pods_nice", 0), getattr(args, "pods_cpu_limit", 0)
    suffix = (f"-nice{nice}" if nice else "") + (f"-cpu{cores:g}" if cores else "") + ("-smoke" if args.smoke else "")
    path = Path(args.results_dir) / f"{name}{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "command": command or command_line(), "machine": machine, **results}
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return path


def run_and_record(name: str, args: argparse.Namespace, run: Callable[[argparse.Namespace], dict],
                   report: Callable[[dict], str]) -> Path:
    """A benchmark command's end: the machine as it was at the start, the run, its tables
    printed and its results file written."""
    machine = machine_info()
    results = run(args)
    print(report(results))
    path = write_results(name, args, machine, results)
    print(f"results: {path}")
    return path
