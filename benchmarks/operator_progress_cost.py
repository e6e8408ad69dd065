"""Progress: API cost. Requests per job per minute with 100 running jobs whose pods report
progress every second, counted from the API server's audit log, and the operator's CPU.

    python -m benchmarks.operator_progress_cost             # 100 one-node jobs; 120 s window
    python -m benchmarks.operator_progress_cost --smoke     # 3 jobs; 40 s window

Each pod runs a loop that reports a new step every second (``ddptrainer.report``) and serves
the reports on the contract's port, as the pod entry point does. Once every job runs and has a
first ``status.progress``, the window starts: every request of the operator's ServiceAccount
completed in it is counted (any namespace). The operator runs with its default settings
(progress polled every 10 s, progress-only status writes at most every 30 s per job), unless
``--operator-env`` says otherwise; the expected ceiling is 60 / 30 = 2 requests per job per
minute, all status patches.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks import bench_cluster as bc
from benchmarks.bench_stats import count_requests, table

NAME = "operator_progress_cost"
SMOKE_FIGURES = ["requests_per_job_per_minute"]
REPORTING_POD = ["python3", "-c", (
    "import os, time\n"
    "from ddptrainer.report import report_progress, serve_progress\n"
    "d = os.environ['DDPJOB_PROGRESS_DIR']\n"
    "os.makedirs(d, exist_ok=True)\n"
    "serve_progress(d, int(os.environ['DDPJOB_PROGRESS_PORT']))\n"
    "step = 0\n"
    "while True:\n"
    "    step += 1\n"
    "    report_progress(step, 10**9, loss=1.0, throughput=100.0, force=True)\n"
    "    time.sleep(1)\n")]


def parser():
    p = bc.base_parser(__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--window", type=float, default=120.0, help="seconds of the counting window")
    return p


def run(bed: bc.Bed, args) -> dict[str, Any]:
    jobs, window = (3, 40.0) if args.smoke else (args.jobs, args.window)
    bc.warm_up(bed)
    with bed.namespace("bench-progress") as ns, bc.Recorder(bed, ns) as rec:
        names = [f"job-{i:03d}" for i in range(jobs)]
        bed.create_at_once([bc.ddpjob(n, ns, 1, REPORTING_POD) for n in names])
        rec.wait(lambda r: all(r.phase(n) == "Running" for n in names), 900, f"{jobs} jobs to run")
        started = time.time()
        rec.wait(lambda r: all(_step(r, n) is not None for n in names), 300,
                 "every job's first status.progress")
        first_progress_s = time.time() - started
        offset = bed.audit_offset()
        cpu_before = bed.cpu_snapshot()
        time.sleep(window)
        cpu = bed.cpu_delta(cpu_before, bed.cpu_snapshot())
        records = bed.audit_records(offset, settle=0.5) or []
        steps = [_step(rec, n) or 0 for n in names]
        bc.delete_jobs(bed, rec, timeout=900)
    by_kind = count_requests(records)
    per_job_minute = len(records) / jobs / (window / 60.0)
    print(f"{jobs} jobs, {window:.0f} s: {len(records)} requests = {per_job_minute:.2f} per job per minute "
          f"{by_kind}", file=sys.stderr, flush=True)
    return {"params": {"jobs": jobs, "window_seconds": window, "operator_user": bc.OPERATOR_USER},
            "figures": {"requests_per_job_per_minute": round(per_job_minute, 3),
                        "requests": len(records), "operator_cpu_s": round(cpu.get("operator", 0.0), 3),
                        "first_progress_s": round(first_progress_s, 1),
                        "median_step_shown": sorted(steps)[len(steps) // 2]},
            "by_kind": by_kind}


def _step(rec: bc.Recorder, name: str):
    obs = rec.job_state.get(name)
    return obs.progress_step if obs is not None else None


def report(results: dict[str, Any]) -> str:
    f, p = results["figures"], results["params"]
    rows = [[kind, count, round(count / p["jobs"] / (p["window_seconds"] / 60.0), 3)]
            for kind, count in sorted(results["by_kind"].items())]
    rows.append(["total", f["requests"], f["requests_per_job_per_minute"]])
    return (f"{p['jobs']} running jobs reporting progress every second, {p['window_seconds']:.0f} s window "
            "(audit log)\n\n" + table(["request", "count", "per job per minute"], rows)
            + f"\n\noperator CPU in the window: {f['operator_cpu_s']} s; every job showed progress "
            f"{f['first_progress_s']} s after all ran")


def main(argv=None) -> None:
    bc.main(NAME, parser, run, report, argv)


if __name__ == "__main__":
    main()
