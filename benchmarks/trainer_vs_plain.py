"""This trainer against a plain seed-style DDP loop, side by side, in one invocation.

Both run ResNet-18 on 3x32x32 FakeData, batch 64 per rank, gloo, 2 ranks under torchrun
(``--standalone``, so one thread per rank), the same data pipeline and optimizer. The trainer
does its extra work inside the timed window: the loss averaged across ranks on log steps, JSON
progress lines, the stop-flag agreement every step, checkpoints every ``--checkpoint-every``
steps. Both runs are timed the same way: wall-clock time stamps that global rank 0 prints at
steps ``warmup`` and ``warmup + steps``; images/s = steps x batch x ranks / elapsed.

    python benchmarks/trainer_vs_plain.py                 # the recorded figure (~5 min)
    python benchmarks/trainer_vs_plain.py --smoke         # seconds: does everything still run?

``--repeats`` alternates plain/trainer runs (AB BA AB BA ...) and reports the median of each,
which evens out a machine whose load drifts. On a machine shared with other work wall-clock figures
still swing, so the CPU seconds each whole run used (every process of it) are printed too: the
same work costs about the same CPU time however busy the machine is. And the median images/s
of all 10-step windows (pooled over the runs) is printed: a burst of other load spoils a few
windows, not the median (it slightly favours the trainer: 1 of its 4 windows holds a save).
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def plain_worker(argv: list[str]) -> None:
    """The seed-style loop most DDP examples contain (with set_epoch, to be fair)."""
    import torch
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import transforms

    p = argparse.ArgumentParser()
    for name in ("--total-steps", "--batch-size", "--num-workers", "--log-every", "--fake-size"):
        p.add_argument(name, type=int, required=True)
    a = p.parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    ddp = DDP(model)
    dataset = torchvision.datasets.FakeData(size=a.fake_size, image_size=(3, 32, 32),
                                            num_classes=10, transform=transforms.ToTensor())
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=a.batch_size, sampler=sampler,
                        num_workers=a.num_workers, persistent_workers=a.num_workers > 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    step, epoch = 0, 0
    while step < a.total_steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(ddp(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0 and step % a.log_every == 0:
                print(json.dumps({"event": "progress", "step": step, "loss": loss.item(),
                                  "time": time.time()}), flush=True)
            if step == a.total_steps:
                break
        epoch += 1
    dist.destroy_process_group()


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *args]


def _cpu_seconds_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(cmd: list[str], warmup: int, total: int, images_per_step: int
           ) -> tuple[float, float, list[float]]:
    """(images/s between the warmup and the last step, CPU seconds of the whole run, images/s
    of each logged window after the warmup).

    The CPU seconds cover every process of the run (torchrun, ranks, loader workers), start-up
    included; on a machine shared with other work they vary far less than wall-clock time.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "operator"), str(REPO / "trainer")] + ([env["PYTHONPATH"]]
                                                           if env.get("PYTHONPATH") else []))
    cpu_before = _cpu_seconds_of_children()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    cpu = _cpu_seconds_of_children() - cpu_before
    if proc.returncode != 0:
        sys.exit(f"benchmark run failed ({proc.returncode}): {' '.join(cmd)}\n"
                 f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    stamps = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "progress":
                stamps[record["step"]] = record["time"]
    if warmup not in stamps or total not in stamps:
        sys.exit(f"steps {warmup} and {total} not both logged by: {' '.join(cmd)}\n"
                 f"{proc.stdout[-2000:]}")
    logged = sorted(s for s in stamps if s >= warmup)
    windows = [(b - a) * images_per_step / (stamps[b] - stamps[a])
               for a, b in zip(logged, logged[1:])]
    return (total - warmup) * images_per_step / (stamps[total] - stamps[warmup]), cpu, windows


def main() -> None:
    if sys.argv[1:2] == ["--plain-worker"]:  # under torchrun: one rank of the plain loop
        plain_worker(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="timed steps (a multiple of --log-every)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--nproc", type=int, default=2, help="gloo ranks")
    p.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=30, help="the trainer's")
    p.add_argument("--repeats", type=int, default=4, help="alternating runs of each")
    p.add_argument("--smoke", action="store_true", help="tiny run for CI (seconds)")
    a = p.parse_args()
    if a.smoke:
        a.steps, a.warmup, a.batch_size, a.log_every, a.checkpoint_every = 4, 2, 8, 2, 4
        a.repeats = 1
    if a.steps % a.log_every or a.warmup % a.log_every:
        sys.exit("--steps and --warmup must be multiples of --log-every")
    total = a.warmup + a.steps
    images_per_step = a.batch_size * a.nproc
    fake_size = total * images_per_step + images_per_step  # one epoch covers the run
    common = ["--batch-size", str(a.batch_size), "--num-workers", str(a.num_workers),
              "--log-every", str(a.log_every)]
    plain = _torchrun(a.nproc, __file__, "--plain-worker", "--total-steps", str(total),
                      "--fake-size", str(fake_size), *common)
    results: dict[str, list[float]] = {"plain": [], "trainer": []}
    cpu: dict[str, list[float]] = {"plain": [], "trainer": []}
    windows: dict[str, list[float]] = {"plain": [], "trainer": []}
    with tempfile.TemporaryDirectory(prefix="ddptrain-bench-") as tmp:
        for i in range(a.repeats):
            trainer = _torchrun(
                a.nproc, "-m", "ddptrainer.main", "--model", "resnet18", "--dataset", "fake",
                "--image-size", "32", "--fake-size", str(fake_size), "--max-steps", str(total),
                "--checkpoint-every", str(a.checkpoint_every), "--checkpoint-dir",
                f"{tmp}/ckpt-{i}", "--no-resume", "--log-format", "json", "--device", "cpu",
                *common)
            # ABBA...: who goes first alternates, so a drift in the machine's load hits both
            pair = [("plain", plain), ("trainer", trainer)]
            for name, cmd in (pair if i % 2 == 0 else pair[::-1]):
                ips, cpu_s, rates = _timed(cmd, a.warmup, total, images_per_step)
                results[name].append(ips)
                cpu[name].append(cpu_s)
                windows[name].extend(rates)
                print(f"run {i + 1}/{a.repeats} {name:8s} {ips:8.1f} images/s  "
                      f"{cpu_s:6.1f} CPU s for the whole run", flush=True)
    plain_ips, trainer_ips = (statistics.median(results[k]) for k in ("plain", "trainer"))
    spread = {k: f"{min(v):.1f}-{max(v):.1f}" for k, v in results.items()}
    print(f"plain loop : {plain_ips:8.1f} images/s (median; runs {spread['plain']})")
    print(f"ddptrain   : {trainer_ips:8.1f} images/s (median; runs {spread['trainer']})")
    print(f"ratio      : {trainer_ips / plain_ips:.3f}x (target >= 0.97x)")
    plain_win, trainer_win = (statistics.median(windows[k]) for k in ("plain", "trainer"))
    print(f"median {a.log_every}-step window over all runs: plain {plain_win:.1f}, ddptrain "
          f"{trainer_win:.1f} images/s; ratio {trainer_win / plain_win:.3f}x")
    plain_cpu, trainer_cpu = (statistics.median(cpu[k]) for k in ("plain", "trainer"))
    print(f"CPU seconds per run (median, {total} steps, start-up included): plain "
          f"{plain_cpu:.1f}, ddptrain {trainer_cpu:.1f}; plain/ddptrain = "
          f"{plain_cpu / trainer_cpu:.3f}x")
    print(json.dumps({"plain_images_per_sec": round(plain_ips, 1),
                      "trainer_images_per_sec": round(trainer_ips, 1),
                      "ratio": round(trainer_ips / plain_ips, 3), "steps": a.steps,
                      "warmup": a.warmup, "batch_size": a.batch_size, "nproc": a.nproc,
                      "window_ratio": round(trainer_win / plain_win, 3),
                      "cpu_ratio": round(plain_cpu / trainer_cpu, 3), "repeats": a.repeats,
                      "runs": results, "cpu_seconds": cpu, "cpu_count": os.cpu_count()}))


if __name__ == "__main__":
    main()
