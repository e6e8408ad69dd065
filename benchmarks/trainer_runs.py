"""How the trainer benchmarks run and time a training run (standard library only; torch is
imported by the runs, not here).

A run is a torchrun command whose global rank 0 prints JSON progress lines carrying a
wall-clock ``time`` every ``--log-every`` steps (the trainer's ``--log-format json`` and the
plain loop of trainer_vs_plain.py do). Images/s is measured between the stamps of step
``warmup`` and step ``total``, so start-up, data loading warm-up and the first steps stay out
of it; the CPU seconds of the whole run (every process: torchrun, ranks, loader workers) are
measured too, since on a machine shared with other work they vary far less than wall-clock time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_results import RESULTS_DIR

REPO = Path(__file__).resolve().parents[1]
SMOKE = {"steps": 4, "warmup": 2, "batch_size": 8, "log_every": 2, "repeats": 1}  # seconds: does it still run?


@dataclass(frozen=True)
class TimedRun:
    images_per_s: float  # between the stamps of step warmup and step total
    cpu_s: float  # every process of the run, start-up included
    window_images_per_s: list[float]  # each logged window after the warm-up
    stdout: str = ""  # the run's output (its JSON progress lines: losses too)


def base_parser(description: str, steps: int, repeats: int) -> argparse.ArgumentParser:
    """The options every trainer benchmark takes (each adds its own)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="timed steps (a multiple of --log-every)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--repeats", type=int, default=repeats, help="alternating runs of each layout")
    p.add_argument("--smoke", action="store_true", help="tiny run for CI (seconds)")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return p


def settle_steps(a: argparse.Namespace) -> None:
    """The tiny settings under --smoke; exit unless both step stamps will be logged."""
    if a.smoke:
        for key, value in SMOKE.items():
            setattr(a, key, value)
    if a.steps % a.log_every or a.warmup % a.log_every:
        sys.exit("--steps and --warmup must be multiples of --log-every")


def torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


def checkout_env(threads: int | None = None) -> dict[str, str]:
    """This checkout's packages first on the path (the benchmark measures this tree, installed
    or not), and ``threads`` intra-op threads per process when given."""
    env = dict(os.environ)
    # The repository root too: a worker may be a benchmark module itself (`-m benchmarks.X`).
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer"), str(REPO)]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def progress_stamps(stdout: str) -> dict[int, float]:
    """step -> wall-clock time, from the JSON progress lines of global rank 0."""
    stamps = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "progress":
                stamps[record["step"]] = record["time"]
    return stamps


def timed_run(cmd: list[str], warmup: int, total: int, images_per_step: int,
              env: dict[str, str] | None = None) -> TimedRun:
    """Run ``cmd`` to the end and time it; exit with its output if it fails or does not log
    both steps."""
    cpu_before = _children_cpu_seconds()
    proc = subprocess.run(cmd, env=env or checkout_env(), capture_output=True, text=True)
    cpu = _children_cpu_seconds() - cpu_before
    if proc.returncode != 0:
        sys.exit(f"benchmark run failed ({proc.returncode}): {' '.join(cmd)}\n"
                 f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    stamps = progress_stamps(proc.stdout)
    if warmup not in stamps or total not in stamps:
        sys.exit(f"steps {warmup} and {total} not both logged by: {' '.join(cmd)}\n{proc.stdout[-2000:]}")
    logged = sorted(s for s in stamps if s >= warmup)
    windows = [(b - a) * images_per_step / (stamps[b] - stamps[a]) for a, b in zip(logged, logged[1:])]
    return TimedRun((total - warmup) * images_per_step / (stamps[total] - stamps[warmup]), cpu, windows,
                    proc.stdout)
