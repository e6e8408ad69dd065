"""Every benchmark in turn, then the plots: the figures of benchmarks/README.md.

    python -m benchmarks.run_all                    # ~30 min on 2 cores
    python -m benchmarks.run_all --quiet-load 1.0   # first wait until the 1-minute load < 1.0
    python -m benchmarks.run_all --only operator_recovery operator_api_cost

Each benchmark is its own command (see the README); this only chains them. The operator
benchmarks need root and the control-plane binaries (as `pytest -m cluster` does); the trainer
one needs torch. A benchmark that fails is reported and the rest still run.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Each run writes results/<name>[-niceN].json, quoted by the README (report.py --update-readme).
RUNS = [("operator_start_latency", []),
        ("operator_gang_size", []), ("operator_gang_size", ["--pods-cpu-limit", "0.5"]),
        ("operator_gang_size", ["--pods-nice", "19"]),
        ("operator_many_jobs", []), ("operator_many_jobs", ["--pods-cpu-limit", "0.5"]),
        ("operator_many_jobs", ["--pods-nice", "19"]),
        ("operator_api_cost", []), ("operator_progress_cost", []), ("operator_recovery", []),
        ("operator_failover", []),
        ("peers", []), ("trainer_scaling", []), ("trainer_vs_plain", []), ("trainer_flops", [])]
BENCHMARKS = sorted({name for name, _ in RUNS})


def wait_for_quiet(threshold: float, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        print(f"load {os.getloadavg()[0]:.2f} >= {threshold}: waiting", file=sys.stderr, flush=True)
        time.sleep(30)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=BENCHMARKS, default=BENCHMARKS)
    p.add_argument("--quiet-load", type=float, help="before each benchmark, wait until the load is below this")
    p.add_argument("--quiet-timeout", type=float, default=1800, help="wait at most this long (seconds)")
    a = p.parse_args(argv)
    failed = []
    for name, args in RUNS:
        if name not in a.only:
            continue
        if a.quiet_load is not None:
            wait_for_quiet(a.quiet_load, a.quiet_timeout)
        print(f"== {name} {' '.join(args)} (load {os.getloadavg()[0]:.2f})", flush=True)
        if subprocess.run([sys.executable, str(HERE / f"{name}.py"), *args]).returncode != 0:
            failed.append(" ".join([name, *args]))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("no matplotlib: plots skipped (pip install -c ci/constraints.txt -e '.[bench]')")
    else:
        subprocess.run([sys.executable, str(HERE / "plot_results.py")], check=False)
    subprocess.run([sys.executable, str(HERE / "report.py"), "--update-readme"], check=False)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
