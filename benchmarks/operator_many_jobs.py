"""Many jobs: 1, 10, 50 and 100 concurrent 4-node DDPJobs; throughput (jobs finished per
minute), status latency, and the operator's CPU time and peak memory.

    python -m benchmarks.operator_many_jobs             # 1 10 50 100 jobs of 4 nodes
    python -m benchmarks.operator_many_jobs --smoke     # 1 and 3 jobs of 2 nodes

For each count the operator is restarted (so its peak memory, VmHWM, is this scenario's),
every job is created at once (16 threads POSTing them, as many users would; one `kubectl
apply` of 100 objects creates them one after the other, over most of a minute on this
machine), and the scenario ends when the last one has finished. Throughput = jobs / (last job finished - first job created). Status latency: for
every pod phase change (Running, Succeeded) seen by this process's watch, the time until the
DDPJob's status (also watched here) lists that pod in that phase or a later one (a pod that
ran for less than the status took to follow is shown Succeeded straight away: "overtaken"). CPU seconds come from
/proc/<pid>/stat of each process (utime + stime), for the operator and, to show where the
machine's two cores went, the other test-bed components.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from benchmarks import bench_cluster as bc
from benchmarks.bench_stats import (
    STATUS_LATENCY_PARTS, gang_times, profile_buckets, status_latencies, status_latency_parts, summarize, table,
)

NAME = "operator_many_jobs"
SMOKE_FIGURES = ["3.jobs_per_minute", "3.status_latency_s.median", "3.operator_cpu_s", "3.operator_peak_mib"]
TARGET_STATUS_LATENCY_S = 1.0


def parser():
    p = bc.base_parser(__doc__.splitlines()[0])
    p.add_argument("--counts", type=int, nargs="+", default=[1, 10, 50, 100])
    p.add_argument("--nnodes", type=int, default=4)
    p.add_argument("--py-spy", type=Path, metavar="DIR",
                   help="profile the operator with py-spy during each scenario (raw stacks in DIR/jobs-N.txt)")
    return p


def scenario(bed: bc.Bed, count: int, nnodes: int, settle: bool = True,
             profile: Optional[Path] = None) -> dict[str, Any]:
    restarted = bed.restart_operator()
    bc.warm_up(bed)
    pid = bed.operator_pid
    idle_memory = bc.proc_memory_mib(pid)  # after one job: the operator's resting size
    settled_s = bc.settle() if settle else 0.0  # the previous scenario's pods are torn down
    with bed.namespace(f"bench-many-{count}") as ns, bc.Recorder(bed, ns) as rec:
        names = [f"job-{i:03d}" for i in range(count)]
        audit_offset = bed.audit_offset()
        cpu_before = bed.cpu_snapshot()
        with bed.profiled(profile):
            started = time.time()
            create_s = bed.create_at_once([bc.ddpjob(name, ns, nnodes, bc.SLEEP_1) for name in names])
            rec.wait(lambda r: r.finished(names), 1800, f"{count} jobs to finish")
        cpu = bed.cpu_delta(cpu_before, bed.cpu_snapshot())
        memory = bc.proc_memory_mib(pid)
        failed = [n for n in names if rec.phase(n) != "Succeeded"]
        times = {n: gang_times(rec.pods, rec.jobs, n, nnodes) for n in names}
        latency = status_latencies(rec.pods, rec.jobs)
        records = bed.audit_records(audit_offset, namespace=ns)
        bc.delete_jobs(bed, rec, timeout=900)
    parts = status_latency_parts(latency["matches"], records or [])
    first_added = min(t["job_added"] for t in times.values())
    last_finished = max(t["job_finished"] for t in times.values())
    makespan = last_finished - first_added
    per_job = [t["job_finished"] - t["job_added"] for t in times.values()]
    to_running = [t["all_running"] - t["job_added"] for t in times.values() if t["all_running"]]
    result = {
        "jobs": count, "nnodes": nnodes, "failed": failed, "operator_restarted": restarted,
        "create_all_s": create_s, "first_job_seen_s": first_added - started,
        "makespan_s": makespan, "jobs_per_minute": 60 * count / makespan,
        "job_to_finished_s": summarize(per_job), "job_to_all_running_s": summarize(to_running),
        "status_latency_s": summarize(latency["latencies"]), "status_changes_missed": latency["missed"],
        "status_changes_overtaken": latency["overtaken"],
        "status_latency_parts_s": {name: summarize(values) for name, values in parts.items()},
        "status_writes": sum(1 for r in records or [] if r.key == "patch ddpjobs/status"),
        "operator_cpu_s": cpu.get("operator"), "operator_cpu_ms_per_job": 1000 * cpu.get("operator", 0) / count,
        "operator_rss_before_mib": idle_memory["rss_mib"],
        "operator_peak_mib": memory["peak_mib"], "operator_rss_end_mib": memory["rss_mib"],
        "cpu_s": cpu, "loadavg_1min_end": os.getloadavg()[0], "settled_before_s": settled_s,
    }
    if profile is not None and profile.exists():
        result["operator_profile"] = {k: round(v, 3) for k, v in
                                      profile_buckets(profile.read_text().splitlines()).items()}
    return result


def run(bed: bc.Bed, args) -> dict[str, Any]:
    counts, nnodes = ([1, 3], 2) if args.smoke else (args.counts, args.nnodes)
    scenarios = {}
    for count in counts:
        profile = args.py_spy / f"jobs-{count}.txt" if getattr(args, "py_spy", None) else None
        result = scenario(bed, count, nnodes, settle=not args.smoke, profile=profile)
        scenarios[count] = result
        print(f"{count} jobs: {result['jobs_per_minute']:.1f} jobs/min, status latency median "
              f"{result['status_latency_s'].get('median', float('nan')):.3f}s, operator CPU "
              f"{result['operator_cpu_s']}s, peak {result['operator_peak_mib']:.0f} MiB",
              file=sys.stderr, flush=True)
    figures = {}
    for count, r in scenarios.items():
        figures[f"{count}.jobs_per_minute"] = r["jobs_per_minute"]
        if r["status_latency_s"]["n"]:
            figures[f"{count}.status_latency_s.median"] = r["status_latency_s"]["median"]
            figures[f"{count}.status_latency_s.p95"] = r["status_latency_s"]["p95"]
        figures[f"{count}.operator_cpu_s"] = r["operator_cpu_s"]
        figures[f"{count}.operator_peak_mib"] = r["operator_peak_mib"]
    all_medians = [r["status_latency_s"]["median"] for r in scenarios.values() if r["status_latency_s"]["n"]]
    return {"params": {"counts": counts, "nnodes": nnodes, "command": bc.SLEEP_1,
                       **bc.bed_setup(bed, args),
                       "target_status_latency_s": TARGET_STATUS_LATENCY_S},
            "figures": figures,
            "target_met": {f"status latency median < {TARGET_STATUS_LATENCY_S:.0f} s (every count)":
                           bool(all_medians) and max(all_medians) < TARGET_STATUS_LATENCY_S},
            "scenarios": scenarios}


def report(results: dict[str, Any]) -> str:
    p = results["params"]
    rows = []
    for count in sorted(results["scenarios"], key=int):
        r = results["scenarios"][count]
        lat = r["status_latency_s"]
        rows.append((count, int(count) * r["nnodes"], r["create_all_s"], r["makespan_s"], r["jobs_per_minute"],
                     r["job_to_finished_s"]["median"], lat.get("median"), lat.get("p95"),
                     r["operator_cpu_s"], r["operator_cpu_ms_per_job"], r["operator_rss_before_mib"],
                     r["operator_peak_mib"],
                     r["cpu_s"].get("kube-apiserver"), r["cpu_s"].get("node-agent")))
    setup = bc.bed_setup_text(p)
    text = (f"Many jobs: concurrent {p['nnodes']}-node jobs, created at once{f' ({setup})' if setup else ''}\n\n"
            + table(["jobs", "pods", "creating them s", "makespan s", "jobs/min", "job created->finished median s",
                     "status latency median s", "p95 s", "operator CPU s", "operator CPU ms/job",
                     "operator RSS before MiB", "operator peak MiB", "apiserver CPU s", "node agent CPU s"], rows))
    for what, met in results["target_met"].items():
        text += f"\n\ntarget {what}: {'met' if met else 'MISSED'}"
    for count in sorted(results["scenarios"], key=int):
        profile = results["scenarios"][count].get("operator_profile")
        if profile:
            text += (f"\n\noperator profile at {count} jobs (py-spy, share of samples by package of the deepest "
                     "frame): " + ", ".join(f"{k} {v:.0%}" for k, v in profile.items()))
    rows = []
    for count in sorted(results["scenarios"], key=int):
        r = results["scenarios"][count]
        parts = r.get("status_latency_parts_s") or {}
        if any(v.get("n") for v in parts.values()):
            rows.append([count, r.get("status_writes")] + [
                f"{parts[name]['median']:.3f} / {parts[name]['p95']:.3f}" if parts[name].get("n") else "-"
                for name in STATUS_LATENCY_PARTS])
    if rows:
        text += ("\n\nWhere the status latency goes (median / p95 s), split at the status write that carried each "
                 "change (audit log). The ends are when events reached this benchmark's watch: when that watch "
                 "itself lags, the first part shrinks (below 0 even) and the last grows by as much.\n\n" + table(["jobs", "status writes"] + list(STATUS_LATENCY_PARTS.values()), rows))
    return text


def main(argv=None) -> None:
    bc.main(NAME, parser, run, report, argv)


if __name__ == "__main__":
    main()
