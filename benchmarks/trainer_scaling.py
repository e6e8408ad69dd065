"""Trainer scaling on this machine's CPU cores: images/s with 1 rank and with 2 ranks (gloo).

    python -m benchmarks.trainer_scaling              # the recorded figure (a few minutes)
    python -m benchmarks.trainer_scaling --smoke      # seconds: does it still run?

The trainer (ddptrain, ResNet-18 on 3x32x32 FakeData, batch 64 per rank, so the global batch
grows with the ranks: weak scaling, as DDP is used) runs under torchrun in three layouts:

* 1 rank x 1 thread: the per-core baseline;
* 1 rank x 2 threads: one process using both cores through torch's intra-op threads;
* 2 ranks x 1 thread: DDP, one rank per core (what torchrun does with several ranks).

Timing as in trainer_vs_plain.py: global rank 0's JSON progress lines carry wall-clock stamps
at steps ``warmup`` and ``warmup + steps``; images/s = steps x batch x ranks / elapsed. The
layouts alternate (ABCABC...) over ``--repeats`` and the median is reported; the CPU seconds of
each whole run (every process) are recorded too, since they vary far less than wall-clock time
on a machine shared with other work.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
from benchmarks import bench_results
from benchmarks import bench_stats
from benchmarks import trainer_runs

NAME = "trainer_scaling"
LAYOUTS = {"1 rank x 1 thread": (1, 1), "1 rank x 2 threads": (1, 2), "2 ranks x 1 thread": (2, 1)}
BASELINE = "1 rank x 1 thread"


def trainer_command(nproc: int, threads: int, a: argparse.Namespace, checkpoint_dir: str) -> list[str]:
    total = a.warmup + a.steps
    return trainer_runs.torchrun(
        nproc, "-m", "ddptrainer.main", "--model", a.model, "--dataset", "fake", "--image-size", "32",
        "--fake-size", str(total * a.batch_size * nproc + a.batch_size * nproc), "--max-steps", str(total),
        "--batch-size", str(a.batch_size), "--num-workers", str(a.num_workers),
        "--cpu-threads", str(threads), "--log-every", str(a.log_every), "--log-format", "json",
        "--checkpoint-every", "0", "--checkpoint-dir", checkpoint_dir, "--no-resume", "--device", "cpu")


def parser() -> argparse.ArgumentParser:
    p = trainer_runs.base_parser(__doc__.splitlines()[0], steps=60, repeats=3)
    p.add_argument("--model", default="resnet18")
    return p


def run(a: argparse.Namespace) -> dict:
    trainer_runs.settle_steps(a)
    ips: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    cpu: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="ddptrain-scaling-") as tmp:
        for i in range(a.repeats):
            for name, (nproc, threads) in LAYOUTS.items():  # alternating: ABCABC...
                timed = trainer_runs.timed_run(trainer_command(nproc, threads, a, f"{tmp}/{i}-{nproc}-{threads}"),
                                               a.warmup, a.warmup + a.steps, a.batch_size * nproc,
                                               env=trainer_runs.checkout_env(threads))
                ips[name].append(timed.images_per_s)
                cpu[name].append(timed.cpu_s)
                print(f"run {i + 1}/{a.repeats} {name:20s} {timed.images_per_s:8.1f} images/s  "
                      f"{timed.cpu_s:6.1f} CPU s", file=sys.stderr, flush=True)
    median = {name: statistics.median(values) for name, values in ips.items()}
    speedup = median["2 ranks x 1 thread"] / median[BASELINE]
    return {"params": {"model": a.model, "steps": a.steps, "warmup": a.warmup, "batch_size_per_rank": a.batch_size,
                       "num_workers": a.num_workers, "repeats": a.repeats, "cpus": os.cpu_count()},
            "figures": {f"{name}.images_per_s": value for name, value in median.items()}
            | {"speedup_2_ranks": speedup, "efficiency_2_ranks": speedup / 2},
            "images_per_s": ips, "cpu_seconds": cpu}


def report(results: dict) -> str:
    p, f = results["params"], results["figures"]
    ips, cpu = results["images_per_s"], results["cpu_seconds"]
    base = f[f"{BASELINE}.images_per_s"]
    rows = [(name, f[f"{name}.images_per_s"], f"{min(ips[name]):.1f}-{max(ips[name]):.1f}",
             f[f"{name}.images_per_s"] / base, statistics.median(cpu[name])) for name in LAYOUTS]
    return (f"Trainer scaling ({p['model']}, batch {p['batch_size_per_rank']} per rank, {p['steps']} timed steps "
            f"after {p['warmup']}, median of {p['repeats']}; {p.get('cpus', '?')} CPUs)\n\n"
            + bench_stats.table(["layout", "images/s", "range", f"vs {BASELINE}", "CPU s per run"], rows)
            + f"\n\n2 ranks vs {BASELINE}: {f['speedup_2_ranks']:.2f}x (parallel efficiency "
            f"{f['efficiency_2_ranks']:.0%}); vs 1 rank using both cores: "
            f"{f['2 ranks x 1 thread.images_per_s'] / f['1 rank x 2 threads.images_per_s']:.2f}x")


def main(argv=None) -> None:
    bench_results.run_and_record(NAME, parser().parse_args(argv), run, report)


if __name__ == "__main__":
    main()
