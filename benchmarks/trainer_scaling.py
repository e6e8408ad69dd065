"""Trainer scaling on this machine's CPU cores: images/s with 1 rank and with 2 ranks (gloo).

    python benchmarks/trainer_scaling.py              # the recorded figure (a few minutes)
    python benchmarks/trainer_scaling.py --smoke      # seconds: does it still run?

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
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
LAYOUTS = {"1 rank x 1 thread": (1, 1), "1 rank x 2 threads": (1, 2), "2 ranks x 1 thread": (2, 1)}


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(nproc: int, threads: int, a: argparse.Namespace, checkpoint_dir: str) -> tuple[float, float]:
    """(images/s between the warmup step and the last, CPU seconds of the whole run)."""
    total = a.warmup + a.steps
    images_per_step = a.batch_size * nproc
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "ddptrainer.main", "--model", a.model, "--dataset", "fake", "--image-size", "32",
           "--fake-size", str(total * images_per_step + images_per_step), "--max-steps", str(total),
           "--batch-size", str(a.batch_size), "--num-workers", str(a.num_workers),
           "--cpu-threads", str(threads), "--log-every", str(a.log_every), "--log-format", "json",
           "--checkpoint-every", "0", "--checkpoint-dir", checkpoint_dir, "--no-resume", "--device", "cpu"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer")]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["OMP_NUM_THREADS"] = str(threads)
    cpu_before = children_cpu_seconds()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    cpu = children_cpu_seconds() - cpu_before
    if proc.returncode != 0:
        sys.exit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    stamps = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "progress":
                stamps[record["step"]] = record["time"]
    if a.warmup not in stamps or total not in stamps:
        sys.exit(f"steps {a.warmup} and {total} not both logged:\n{proc.stdout[-2000:]}")
    return a.steps * images_per_step / (stamps[total] - stamps[a.warmup]), cpu


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--steps", type=int, default=60, help="timed steps (a multiple of --log-every)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny run (seconds)")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    a = p.parse_args(argv)
    if a.smoke:
        a.steps, a.warmup, a.batch_size, a.log_every, a.repeats = 4, 2, 8, 2, 1
    if a.steps % a.log_every or a.warmup % a.log_every:
        sys.exit("--steps and --warmup must be multiples of --log-every")
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_results  # noqa: E402 (standard library only)
    import bench_stats  # noqa: E402 (pure)

    machine = bench_results.machine_info()
    ips: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    cpu: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="ddptrain-scaling-") as tmp:
        for i in range(a.repeats):
            for name, (nproc, threads) in LAYOUTS.items():
                value, cpu_s = timed_run(nproc, threads, a, f"{tmp}/{i}-{nproc}-{threads}")
                ips[name].append(value)
                cpu[name].append(cpu_s)
                print(f"run {i + 1}/{a.repeats} {name:20s} {value:8.1f} images/s  {cpu_s:6.1f} CPU s",
                      file=sys.stderr, flush=True)
    median = {name: statistics.median(values) for name, values in ips.items()}
    base = median["1 rank x 1 thread"]
    speedup = median["2 ranks x 1 thread"] / base
    rows = [(name, median[name], f"{min(ips[name]):.1f}-{max(ips[name]):.1f}", median[name] / base,
             statistics.median(cpu[name])) for name in LAYOUTS]
    print(f"Trainer scaling ({a.model}, batch {a.batch_size} per rank, {a.steps} timed steps, "
          f"median of {a.repeats}; {os.cpu_count()} CPUs)\n")
    print(bench_stats.table(["layout", "images/s", "range", "vs 1 rank x 1 thread", "CPU s per run"], rows))
    print(f"\n2 ranks vs 1 rank x 1 thread: {speedup:.2f}x (parallel efficiency {speedup / 2:.0%}); "
          f"vs 1 rank using both cores: {median['2 ranks x 1 thread'] / median['1 rank x 2 threads']:.2f}x")
    results = {"params": {"model": a.model, "steps": a.steps, "warmup": a.warmup, "batch_size_per_rank": a.batch_size,
                          "num_workers": a.num_workers, "repeats": a.repeats},
               "figures": {f"{name}.images_per_s": value for name, value in median.items()}
               | {"speedup_2_ranks": speedup, "efficiency_2_ranks": speedup / 2},
               "images_per_s": ips, "cpu_seconds": cpu}
    print(f"results: {bench_results.write_results('trainer_scaling', a, machine, results)}")


if __name__ == "__main__":
    main()
