"""The trainer's throughput as a fraction of this machine's FLOP ceiling, and what each CPU
option does to it (and to the losses).

    python -m benchmarks.trainer_flops              # the recorded figures (~10 min on 2 cores)
    python -m benchmarks.trainer_flops --smoke      # seconds: does it still run?

The ceiling: fp32 matrix multiply (torch.mm, 2048x2048, the best of several) in the same run,
as one process using every core and as one single-threaded process per core at once (what
2 ranks x 1 thread have); the larger is the ceiling. The work: ResNet-18 on 3x32x32 costs about
0.56 GFLOP per image forward (torchvision's count for 224x224 is 1.82, scaled by (32/224)^2
with the stem's stride) and twice that backward: ~217 MFLOP per image per training step
(``FLOP_PER_IMAGE``). Achieved GFLOP/s = images/s x 217 MFLOP; fraction = that / ceiling.

Each variant is the trainer (2 ranks under torchrun, gloo, batch 64 per rank, FakeData) with one
option changed from the baseline, run ``--repeats`` times alternating (ABCD ABCD ...). "Same
results" is checked, not assumed: every variant's losses at the logged steps are compared with
the baseline's (same seed, same data order); the largest relative difference is reported.

* baseline: channels-first, 1 DataLoader worker per rank (what the other trainer benchmarks run);
* channels-last: the model and batches in channels-last memory format (oneDNN's native layout);
* 0 / 2 workers: DataLoader workers per rank (0: batches made in the training process);
  "2 workers" alone is the trainer's default (--num-workers 2, channels-last only on a GPU);
* 2 threads: two intra-op threads per rank (on 2 cores: oversubscribed);
* torch.compile (Inductor, C++ on CPU) on top of channels-last: only when asked for
  (``--variants``), it compiles for minutes per rank on 2 cores.

Three reference rows, in the same run, place those figures (their losses come from other data,
so they are not compared):

* plain DDP loop: the seed-style loop of trainer_vs_plain.py (FakeData, 1 worker per rank), the
  loop the issue's "roughly 30 % of the ceiling" was about;
* DDP, batches in memory: the same model, optimizer and DDP with 4 batches made up front and
  reused: no data loading at all, what gloo's all-reduce leaves of the ceiling;
* no gradient sync: the same, each rank training alone (no DDP): the model's own speed on one
  core per rank, against which the sgemm ceiling is checked.

``--variants`` other than the default list writes results/trainer_flops-selected.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import bench_results, bench_stats, trainer_runs

NAME = "trainer_flops"
FLOP_PER_IMAGE = 217e6  # ResNet-18, 3x32x32, forward + backward
BASELINE = "baseline (channels-first, 1 worker)"
VARIANTS = {  # name -> (trainer flags, intra-op threads per rank)
    BASELINE: (["--no-channels-last", "--num-workers", "1"], 1),
    "channels-last": (["--channels-last", "--num-workers", "1"], 1),
    "2 workers (the trainer's default)": (["--no-channels-last", "--num-workers", "2"], 1),
    "channels-last, 0 workers": (["--channels-last", "--num-workers", "0"], 1),
    "channels-last, 2 workers": (["--channels-last", "--num-workers", "2"], 1),
    "channels-last, 2 threads per rank": (["--channels-last", "--num-workers", "1"], 2),
    "channels-last + torch.compile": (["--channels-last", "--num-workers", "1", "--compile"], 1),
}
PLAIN = "plain DDP loop (seed-style, 1 worker)"
IN_MEMORY = "DDP, batches in memory"
NO_SYNC = "no gradient sync (each rank alone)"
REFERENCES = (PLAIN, IN_MEMORY, NO_SYNC)  # rows whose losses come from other data
SGEMM_SIZE = 2048


# ---------------------------------------------------------------------------------------------
# The ceiling
# ---------------------------------------------------------------------------------------------
def sgemm_worker(threads: int, seconds: float, size: int) -> None:
    """Print the best GFLOP/s of torch.mm over ``seconds`` (run in its own process)."""
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size ** 3 / (time.perf_counter() - started) / 1e9)
    print(json.dumps({"gflops": best}))


def sgemm(processes: int, threads: int, seconds: float, size: int = SGEMM_SIZE) -> float:
    """Total GFLOP/s of ``processes`` concurrent sgemm loops of ``threads`` threads each."""
    cmd = [sys.executable, "-m", "benchmarks.trainer_flops", "--sgemm-worker", str(threads), str(seconds), str(size)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=trainer_runs.checkout_env(threads))
             for _ in range(processes)]
    return sum(json.loads(p.communicate()[0].strip().splitlines()[-1])["gflops"] for p in procs)


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------
def trainer_command(flags: list[str], threads: int, a: argparse.Namespace, checkpoint_dir: str) -> list[str]:
    total = a.warmup + a.steps
    return trainer_runs.torchrun(
        2, "-m", "ddptrainer.main", "--model", "resnet18", "--dataset", "fake", "--image-size", "32",
        "--fake-size", str(total * a.batch_size * 2 + a.batch_size * 2), "--max-steps", str(total),
        "--batch-size", str(a.batch_size), "--cpu-threads", str(threads), "--log-every", str(a.log_every),
        "--log-format", "json", "--checkpoint-every", "0", "--checkpoint-dir", checkpoint_dir, "--no-resume",
        "--device", "cpu", *flags)


def reference_command(name: str, a: argparse.Namespace) -> list[str]:
    total = a.warmup + a.steps
    common = ["--total-steps", str(total), "--batch-size", str(a.batch_size), "--log-every", str(a.log_every)]
    if name == PLAIN:
        return trainer_runs.torchrun(2, "-m", "benchmarks.trainer_vs_plain", "--plain-worker", *common,
                                     "--num-workers", "1", "--fake-size", str(total * a.batch_size * 2 + a.batch_size * 2))
    return trainer_runs.torchrun(2, "-m", "benchmarks.trainer_flops", "--memory-worker", *common,
                                 *(["--no-sync"] if name == NO_SYNC else []))


def memory_worker(argv: list[str]) -> None:
    """One rank of the in-memory loop (under torchrun): ResNet-18, SGD with momentum, DDP unless
    --no-sync, 4 random batches made up front and cycled; JSON progress lines as the trainer's."""
    import torch
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP

    p = argparse.ArgumentParser()
    for name in ("--total-steps", "--batch-size", "--log-every"):
        p.add_argument(name, type=int, required=True)
    p.add_argument("--no-sync", action="store_true")
    a = p.parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    net = model if a.no_sync else DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    data = torch.Generator().manual_seed(rank)
    batches = [(torch.rand(a.batch_size, 3, 32, 32, generator=data), torch.randint(0, 10, (a.batch_size,), generator=data))
               for _ in range(4)]
    for step in range(1, a.total_steps + 1):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = criterion(net(x), y)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % a.log_every == 0:
            print(json.dumps({"event": "progress", "step": step, "loss": loss.item(), "time": time.time()}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def losses(stdout: str) -> dict[int, float]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "progress":
                out[record["step"]] = record["loss"]
    return out


def timed(cmd: list[str], a: argparse.Namespace, threads: int) -> tuple[trainer_runs.TimedRun, dict[int, float]]:
    run = trainer_runs.timed_run(cmd, a.warmup, a.warmup + a.steps, a.batch_size * 2,
                                 env=trainer_runs.checkout_env(threads))
    return run, losses(run.stdout)


def max_relative_difference(mine: dict[int, float], base: dict[int, float]) -> float:
    common = [s for s in base if s in mine]
    if not common:
        return float("nan")
    return max(abs(mine[s] - base[s]) / max(abs(base[s]), 1e-12) for s in common)


def parser() -> argparse.ArgumentParser:
    p = trainer_runs.base_parser(__doc__.splitlines()[0], steps=40, repeats=2)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=[v for v in VARIANTS if "compile" not in v],
                   help="default: all but torch.compile (minutes of compiling per rank on 2 cores; ask for it)")
    p.add_argument("--sgemm-seconds", type=float, default=5.0)
    p.add_argument("--sgemm-worker", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--no-references", action="store_true",
                   help="leave out the plain loop, in-memory and no-sync rows")
    return p


def run(a: argparse.Namespace) -> dict:
    trainer_runs.settle_steps(a)
    variants = [BASELINE, "channels-last"] if a.smoke else list(a.variants)
    if BASELINE not in variants:
        variants.insert(0, BASELINE)
    seconds = 0.5 if a.smoke else a.sgemm_seconds
    ncores = os.cpu_count() or 1
    ceiling_runs = {"1 process x all threads": sgemm(1, ncores, seconds),
                    "1 thread, one process per core": sgemm(ncores, 1, seconds),
                    "1 thread, one process": sgemm(1, 1, seconds)}
    ceiling = max(ceiling_runs["1 process x all threads"], ceiling_runs["1 thread, one process per core"])
    print(f"sgemm: {ceiling_runs}", file=sys.stderr, flush=True)
    rows = variants + ([] if a.no_references else list(REFERENCES))
    ips: dict[str, list[float]] = {v: [] for v in rows}
    cpu: dict[str, list[float]] = {v: [] for v in rows}
    loss_curves: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="ddptrain-flops-") as tmp:
        for i in range(a.repeats):
            for j, name in enumerate(rows):
                if name in REFERENCES:
                    threads, cmd = 1, reference_command(name, a)
                else:
                    flags, threads = VARIANTS[name]
                    cmd = trainer_command(flags, threads, a, f"{tmp}/{i}-{j}")
                result, curve = timed(cmd, a, threads)
                ips[name].append(result.images_per_s)
                cpu[name].append(result.cpu_s)
                loss_curves.setdefault(name, curve)
                print(f"run {i + 1}/{a.repeats} {name:40s} {result.images_per_s:8.1f} images/s "
                      f"{result.cpu_s:6.1f} CPU s", file=sys.stderr, flush=True)
    median = {v: statistics.median(x) for v, x in ips.items()}
    figures = {"ceiling_gflops": ceiling}
    for v in rows:
        figures[f"{v}.images_per_s"] = median[v]
        figures[f"{v}.fraction_of_ceiling"] = median[v] * FLOP_PER_IMAGE / 1e9 / ceiling
        if v not in REFERENCES:
            figures[f"{v}.loss_max_rel_diff"] = max_relative_difference(loss_curves[v], loss_curves[BASELINE])
    return {"params": {"model": "resnet18", "image_size": 32, "ranks": 2, "steps": a.steps, "warmup": a.warmup,
                       "batch_size_per_rank": a.batch_size, "repeats": a.repeats, "cpus": ncores,
                       "flop_per_image": FLOP_PER_IMAGE, "sgemm_size": SGEMM_SIZE,
                       "variants": {v: VARIANTS[v] for v in variants},
                       "references": [v for v in rows if v in REFERENCES]},
            "sgemm_gflops": ceiling_runs, "figures": figures, "images_per_s": ips, "cpu_seconds": cpu,
            "losses": {v: {str(k): x for k, x in c.items()} for v, c in loss_curves.items()}}


def report(results: dict) -> str:
    p, f = results["params"], results["figures"]
    ceiling = f["ceiling_gflops"]
    base = f[f"{BASELINE}.images_per_s"]
    rows = []
    for v in [*p["variants"], *p.get("references", [])]:
        x = results["images_per_s"][v]
        diff = f[f"{v}.loss_max_rel_diff"] if f"{v}.loss_max_rel_diff" in f else None
        rows.append((v, f[f"{v}.images_per_s"], f"{min(x):.1f}-{max(x):.1f}", f[f"{v}.images_per_s"] / base,
                     f[f"{v}.images_per_s"] * p["flop_per_image"] / 1e9, f"{f[f'{v}.fraction_of_ceiling']:.0%}",
                     "other data" if diff is None else f"{diff:.1e}", statistics.median(results["cpu_seconds"][v])))
    sg = results["sgemm_gflops"]
    return (f"Trainer vs the FLOP ceiling (resnet18 3x32x32, {p['ranks']} gloo ranks, batch {p['batch_size_per_rank']} "
            f"per rank, {p['steps']} timed steps after {p['warmup']}, median of {p['repeats']}; {p['cpus']} CPUs; "
            f"{p['flop_per_image'] / 1e6:.0f} MFLOP per image)\n\n"
            f"ceiling: sgemm {p['sgemm_size']}x{p['sgemm_size']} fp32: {ceiling:.1f} GFLOP/s ("
            + ", ".join(f"{k}: {v:.1f}" for k, v in sg.items()) + ")\n\n"
            + bench_stats.table(["variant", "images/s", "range", "vs baseline", "GFLOP/s", "of ceiling",
                                 "loss max rel. diff vs baseline", "CPU s per run"], rows))


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--memory-worker"]:  # under torchrun: one rank of the in-memory loop
        memory_worker(argv[1:])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # gloo's threads can abort a finished run at shutdown (docs/launch-styles.md)
    args = parser().parse_args(argv)
    if args.sgemm_worker:
        threads, seconds, size = args.sgemm_worker
        sgemm_worker(int(threads), float(seconds), int(size))
        return
    default = parser().parse_args([]).variants
    bench_results.run_and_record(NAME if args.smoke or args.variants == default else f"{NAME}-selected",
                                 args, run, report)


if __name__ == "__main__":
    main()
