"""Gang size: one DDPJob of 1, 8, 64 and 256 nodes; time to all pods created and to
Succeeded, how that grows with the gang, and proof that the pod creations overlap.

    python -m benchmarks.operator_gang_size             # sizes 1 8 64 256, 3 runs each
    python -m benchmarks.operator_gang_size --smoke     # sizes 1 and 4, one run each

Pods run ``python3 -c "import time; time.sleep(1)"``. The times come from this process's watch
(t = 0: the DDPJob's ADDED event). The overlap comes from the API server's audit log: each of
the operator's pod POSTs is an interval [request received, response complete]; the most
intervals open at once and the mean concurrency (their total time over the span from the first
to the last) are 1 for sequential round trips and grow with real overlap.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from benchmarks import bench_cluster as bc
from benchmarks.bench_stats import (
    created_at, gang_times, growth_exponents, max_concurrency, mean_concurrency, metrics_delta, percentile,
    profile_buckets, status_latencies, table,
)

NAME = "operator_gang_size"
SMOKE_FIGURES = ["pending.4.created_s", "full.4.created_s", "4.to_succeeded_s"]
TARGET_CREATED_S = 10.0  # a 256-pod job fully created within this, on this machine


def parser():
    p = bc.base_parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--series", nargs="+", choices=["pending", "full"], default=["pending", "full"],
                   help="pending: creation only, the pods left Pending; full: to Succeeded (default: both)")
    p.add_argument("--target-created-s", type=float, default=TARGET_CREATED_S,
                   help="the biggest gang fully created within this (default: %(default)s)")
    p.add_argument("--py-spy", type=Path, metavar="DIR",
                   help="profile the operator with py-spy during each run (collapsed stacks in DIR)")
    return p


def one_run(bed: bc.Bed, rec: bc.Recorder, ns: str, name: str, size: int, *,
            pending: bool = False, profile: Optional[Path] = None) -> dict[str, Any]:
    """One job of ``size`` nodes, to Succeeded. ``pending``: its pods select no node, so they
    are created and stay Pending: creation alone, without the test bed starting 256 processes
    on the same two cores meanwhile; the job is deleted once every pod exists."""
    rec.clear()
    offset = bed.audit_offset()
    cpu_before, metrics_before = bed.cpu_snapshot(), bed.metrics()
    spec = {"template": {"spec": {"nodeSelector": {"bench.ddpjob.dev/no-such-node": "true"}}}} if pending else {}
    with bed.profiled(profile):
        apply_s = bed.apply([bc.ddpjob(name, ns, size, bc.SLEEP_1, **spec)])
        if pending:
            rec.wait(lambda r: len(r.pods_of(name)) >= size, 300, f"{size} pods of {name}")
        else:
            rec.wait(lambda r: r.finished([name]), 900, f"{name} to finish")
    cpu, metrics_after = bed.cpu_delta(cpu_before, bed.cpu_snapshot()), bed.metrics()
    if not pending and rec.phase(name) != "Succeeded":
        raise RuntimeError(f"{name} ended {rec.phase(name)}")
    t = gang_times(rec.pods, rec.jobs, name, size)
    lat = status_latencies(rec.pods, rec.jobs)["latencies"]
    row: dict[str, Any] = {
        "kubectl_apply_s": apply_s,
        "to_first_created_s": t["first_created"] - t["job_added"],
        "to_all_created_s": t["all_created"] - t["job_added"],
        "cpu_s": cpu,
        "loadavg_1min_end": os.getloadavg()[0],
        **apiserver_figures(metrics_before, metrics_after),
    }
    if profile is not None and profile.exists():
        row["operator_profile"] = {k: round(v, 3) for k, v in profile_buckets(profile.read_text().splitlines()).items()}
    if not pending:
        row.update({
            "to_all_running_s": t["all_running"] - t["job_added"],
            "to_succeeded_s": t["job_succeeded"] - t["job_added"],
            "status_latency_median_s": percentile(lat, 50) if lat else None,
        })
    everyones = bed.audit_records(offset, namespace=ns, username=None)
    if everyones is not None:
        records = [r for r in everyones if r.username == bc.OPERATOR_USER]
        posts = sorted((r.received, r.completed) for r in records
                       if r.key == "create pods" and r.name.startswith(f"{name}-node-"))
        # The API server's clock throughout: from its receipt of the DDPJob (the watch sees the
        # job later on a loaded machine, which made the figure negative: CI of 84b0628).
        job_created = created_at(everyones, "ddpjobs", ns, name) or t["job_added"]
        if posts:
            row.update({
                "pod_posts": len(posts),
                # The API's own record: every pod exists once its POST has completed.
                "to_first_post_s": posts[0][0] - job_created,
                "to_last_post_done_s": max(e for _, e in posts) - job_created,
                "post_span_s": posts[-1][1] - posts[0][0],
                "post_max_concurrency": max_concurrency(posts),
                "post_mean_concurrency": mean_concurrency(posts),
                "post_median_duration_s": percentile([e - s for s, e in posts], 50),
                # relative to the first POST, for the timeline plot
                "post_intervals": [(round(s - posts[0][0], 4), round(e - posts[0][0], 4)) for s, e in posts],
            })
    return row


def apiserver_figures(before: dict, after: dict) -> dict[str, Any]:
    """From the API server's metrics: how long its pod POSTs took on average, and how long the
    requests of ServiceAccounts (the operator's flow schema) waited in priority-and-fairness
    queues before running."""
    figures: dict[str, Any] = {}
    count = metrics_delta(before, after, "apiserver_request_duration_seconds_count", verb="POST", resource="pods")
    if count:
        figures["apiserver_pod_post_mean_s"] = metrics_delta(
            before, after, "apiserver_request_duration_seconds_sum", verb="POST", resource="pods") / count
    waited = metrics_delta(before, after, "apiserver_flowcontrol_request_wait_duration_seconds_count",
                           flow_schema="service-accounts")
    if waited:
        figures["apf_service_accounts_mean_wait_s"] = metrics_delta(
            before, after, "apiserver_flowcontrol_request_wait_duration_seconds_sum",
            flow_schema="service-accounts") / waited
    figures["apf_rejected"] = metrics_delta(before, after, "apiserver_flowcontrol_rejected_requests_total")
    # Where a POST's time goes inside the API server: its etcd write, and admission (every
    # CREATE's, pods being nearly all of them during a gang); the rest is the handler chain
    # itself (decoding, defaulting, validation, the response) and waiting for a CPU.
    stored = metrics_delta(before, after, "etcd_request_duration_seconds_count", operation="create", resource="pods")
    if stored:
        figures["etcd_pod_create_mean_s"] = metrics_delta(
            before, after, "etcd_request_duration_seconds_sum", operation="create", resource="pods") / stored
    for step in ("admit", "validate"):
        admitted = metrics_delta(before, after, "apiserver_admission_step_admission_duration_seconds_count",
                                 operation="CREATE", type=step)
        if admitted:
            figures[f"admission_create_{step}_mean_s"] = metrics_delta(
                before, after, "apiserver_admission_step_admission_duration_seconds_sum",
                operation="CREATE", type=step) / admitted
    return figures


SERIES = {"full": "to Succeeded", "pending": "creation only (pods left Pending)"}
KEYS = ("to_first_created_s", "to_all_created_s", "to_last_post_done_s", "to_all_running_s",
        "to_succeeded_s", "status_latency_median_s", "post_span_s", "post_max_concurrency",
        "post_mean_concurrency", "post_median_duration_s", "apiserver_pod_post_mean_s",
        "etcd_pod_create_mean_s", "admission_create_admit_mean_s", "admission_create_validate_mean_s")


def created_s(row: dict[str, Any]) -> float:
    """When every pod existed: the API's record (last POST completed) when the audit log is
    there, else when our watch had seen them all."""
    return row.get("to_last_post_done_s", row["to_all_created_s"])


def run(bed: bc.Bed, args) -> dict[str, Any]:
    sizes, repeats = ([1, 4], 1) if args.smoke else (args.sizes, args.repeats)
    chosen = ("pending", "full") if args.smoke else tuple(s for s in ("pending", "full") if s in args.series)
    target_s = TARGET_CREATED_S if args.smoke else args.target_created_s
    runs: dict[str, dict[int, list[dict]]] = {series: {} for series in ("full", "pending") if series in chosen}
    bc.warm_up(bed)
    settle = (lambda: 0.0) if args.smoke else bc.settle  # a smoke run checks figures exist, not their values
    settle()
    with bed.namespace("bench-gang") as ns, bc.Recorder(bed, ns) as rec:
        for size in sizes:
            for series in chosen:
                for i in range(repeats):
                    name = f"gang-{size}-{series}-{i}"
                    profile = args.py_spy / f"{name}.txt" if getattr(args, "py_spy", None) else None
                    row = one_run(bed, rec, ns, name, size, pending=series == "pending", profile=profile)
                    row["created_s"] = created_s(row)
                    runs[series].setdefault(size, []).append(row)
                    print(f"{size} nodes, {series}, run {i + 1}/{repeats}: created {row['created_s']:.2f}s "
                          f"(watch {row['to_all_created_s']:.2f}s), Succeeded {row.get('to_succeeded_s', 0):.2f}s, "
                          f"POSTs in flight max {row.get('post_max_concurrency')}", file=sys.stderr, flush=True)
                    bc.delete_jobs(bed, rec, timeout=600)
                    row["settled_after_s"] = settle()
    summary: dict[str, dict[int, dict]] = {}
    figures: dict[str, float] = {}
    for series, by_size in runs.items():
        summary[series] = {}
        for size, rows in by_size.items():
            med = {key: percentile([r[key] for r in rows if r.get(key) is not None], 50)
                   for key in ("created_s",) + KEYS if any(r.get(key) is not None for r in rows)}
            summary[series][size] = med
            figures[f"{series}.{size}.created_s"] = med["created_s"]
            if series == "full":
                figures[f"{size}.to_succeeded_s"] = med["to_succeeded_s"]
    growth: dict[str, dict[str, float]] = {}
    ordered = sorted(sizes)
    if len(ordered) > 1:
        for series, key in (("pending", "created_s"), ("full", "created_s"), ("full", "to_succeeded_s")):
            if series not in summary:
                continue
            values = [summary[series][s][key] for s in ordered]
            growth[f"{series}.{key}"] = dict(zip([f"{a}->{b}" for a, b in zip(ordered, ordered[1:])],
                                                 growth_exponents(ordered, values)))
    biggest = max(sizes)
    return {"params": {"sizes": sizes, "repeats": repeats, "command": bc.SLEEP_1,
                       "target_created_s": target_s, **bc.bed_setup(bed, args)},
            "figures": figures, "summary": summary, "growth_exponents": growth,
            "target_met": {f"{biggest} pods created < {target_s:g} s ({series})":
                           summary[series][biggest]["created_s"] < target_s for series in summary},
            "runs": runs}


def report(results: dict[str, Any]) -> str:
    setup = bc.bed_setup_text(results["params"])
    text = (f"Gang size: median of {results['params']['repeats']} run(s) per size; seconds from the "
            + (f"DDPJob's creation; {setup}. " if setup else "DDPJob's creation. ")
            + "'all created' = the last pod POST completed (audit log); 'seen' = "
            "when this process's watch had seen every pod.\n")
    for series, by_size in results["summary"].items():
        rows = []
        for size in sorted(by_size, key=int):
            s = by_size[size]
            rows.append((size, s.get("to_first_created_s"), s["created_s"], s.get("to_all_created_s"),
                         1000 * s["created_s"] / int(size), s.get("post_max_concurrency"),
                         s.get("post_mean_concurrency"), s.get("post_median_duration_s"),
                         s.get("to_all_running_s"), s.get("to_succeeded_s")))
        text += (f"\n{SERIES[series]}\n\n"
                 + table(["nodes", "first pod", "all created", "seen", "ms/pod", "POSTs in flight (max)",
                          "mean concurrency", "POST median s", "all Running", "Succeeded"], rows) + "\n")
    for key, exps in results["growth_exponents"].items():
        text += f"\ngrowth exponent of {key} (1 = linear): " + ", ".join(f"{k}: {v:.2f}" for k, v in exps.items())
    for what, met in results["target_met"].items():
        text += f"\ntarget {what}: {'met' if met else 'MISSED'}"
    biggest = max(next(iter(results["runs"].values())), key=int)
    for series in results["summary"]:
        s = results["summary"][series][biggest]
        each = ", ".join(f"{created_s(row):.2f}" for row in results["runs"][series][biggest])
        text += f"\n\n{biggest} nodes, {SERIES[series]}: all created after {each} s in its runs"
        if s.get("apiserver_pod_post_mean_s") is not None:
            text += ("; inside the API server a pod POST took " + ", ".join(
                f"{what} {s[key]:.4f} s" for what, key in (
                    ("in all", "apiserver_pod_post_mean_s"), ("of it the etcd write", "etcd_pod_create_mean_s"),
                    ("mutating admission", "admission_create_admit_mean_s"),
                    ("validating admission", "admission_create_validate_mean_s")) if s.get(key) is not None)
                + " (means; median of the runs)")
    for row in results["runs"].get("full", {}).get(biggest, [])[:1]:
        text += f"\n\nwhere the CPU went during the {biggest}-node run to Succeeded ({row['to_succeeded_s']:.1f} s):\n\n"
        text += table(["process", "CPU s"], cpu_rows(row["cpu_s"]))
        if row.get("operator_profile"):
            text += "\n\noperator profile (py-spy, share of samples by package of the deepest frame): " + \
                ", ".join(f"{k} {v:.0%}" for k, v in row["operator_profile"].items())
    return text


def cpu_rows(cpu: dict[str, float]) -> list[tuple[str, float]]:
    """Each component's CPU seconds, the pods' (their processes and the `ip` commands that
    plumb their network, once exited), and what the rest of the machine used."""
    rows = [(name, value) for name, value in sorted(cpu.items(), key=lambda kv: -kv[1]) if name != "machine"]
    if "machine" in cpu:
        rows.append(("everything else (kernel threads, other work)", cpu["machine"] - sum(v for _, v in rows)))
        rows.append(("all cores, busy", cpu["machine"]))
    return rows


def main(argv=None) -> None:
    bc.main(NAME, parser, run, report, argv)


if __name__ == "__main__":
    main()
