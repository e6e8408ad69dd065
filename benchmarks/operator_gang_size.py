"""Gang size: one DDPJob of 1, 8, 64 and 256 nodes; time to all pods created and to
Succeeded, how that grows with the gang, and proof that the pod creations overlap.

    python benchmarks/operator_gang_size.py             # sizes 1 8 64 256, 3 runs each
    python benchmarks/operator_gang_size.py --smoke     # sizes 1 and 4, one run each

Pods run ``python3 -c "import time; time.sleep(1)"``. The times come from this process's watch
(t = 0: the DDPJob's ADDED event). The overlap comes from the API server's audit log: each of
the operator's pod POSTs is an interval [request received, response complete]; the most
intervals open at once and the mean concurrency (their total time over the span from the first
to the last) are 1 for sequential round trips and grow with real overlap.
"""
from __future__ import annotations

import sys
from typing import Any

import bench_cluster as bc
from bench_stats import (
    gang_times, growth_exponents, max_concurrency, mean_concurrency, percentile, status_latencies,
    summarize, table,
)

NAME = "operator_gang_size"
SMOKE_FIGURES = ["1.to_all_created_s", "4.to_all_created_s", "4.to_succeeded_s"]
TARGET_CREATED_S = 10.0  # a 256-pod job fully created within this, on this machine


def parser():
    p = bc.base_parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--repeats", type=int, default=3)
    return p


def one_run(bed: bc.Bed, rec: bc.Recorder, ns: str, name: str, size: int) -> dict[str, Any]:
    rec.clear()
    offset = bed.audit_offset()
    cpu_before = bed.cpu_snapshot()
    apply_s = bed.apply([bc.ddpjob(name, ns, size, bc.SLEEP_1)])
    rec.wait(lambda r: r.finished([name]), 900, f"{name} to finish")
    cpu = bed.cpu_delta(cpu_before, bed.cpu_snapshot())
    if rec.phase(name) != "Succeeded":
        raise RuntimeError(f"{name} ended {rec.phase(name)}")
    t = gang_times(rec.pods, rec.jobs, name, size)
    lat = status_latencies(rec.pods, rec.jobs)["latencies"]
    row: dict[str, Any] = {
        "kubectl_apply_s": apply_s,
        "to_first_created_s": t["first_created"] - t["job_added"],
        "to_all_created_s": t["all_created"] - t["job_added"],
        "to_all_running_s": t["all_running"] - t["job_added"],
        "to_succeeded_s": t["job_succeeded"] - t["job_added"],
        "status_latency_median_s": percentile(lat, 50) if lat else None,
        "cpu_s": cpu,
    }
    records = bed.audit_records(offset, namespace=ns)
    if records is not None:
        posts = sorted((r.received, r.completed) for r in records
                       if r.key == "create pods" and r.name.startswith(f"{name}-node-"))
        if posts:
            row.update({
                "pod_posts": len(posts),
                "post_span_s": posts[-1][1] - posts[0][0],
                "post_max_concurrency": max_concurrency(posts),
                "post_mean_concurrency": mean_concurrency(posts),
                "post_median_duration_s": percentile([e - s for s, e in posts], 50),
                # relative to the first POST, for the timeline plot
                "post_intervals": [(round(s - posts[0][0], 4), round(e - posts[0][0], 4)) for s, e in posts],
            })
    return row


def run(bed: bc.Bed, args) -> dict[str, Any]:
    sizes, repeats = ([1, 4], 1) if args.smoke else (args.sizes, args.repeats)
    runs: dict[int, list[dict]] = {}
    with bed.namespace("bench-gang") as ns, bc.Recorder(bed, ns) as rec:
        for size in sizes:
            for i in range(repeats):
                row = one_run(bed, rec, ns, f"gang-{size}-{i}", size)
                runs.setdefault(size, []).append(row)
                print(f"{size} nodes, run {i + 1}/{repeats}: created {row['to_all_created_s']:.2f}s, "
                      f"running {row['to_all_running_s']:.2f}s, Succeeded {row['to_succeeded_s']:.2f}s, "
                      f"POST concurrency max {row.get('post_max_concurrency')}", file=sys.stderr, flush=True)
                bc.delete_jobs(bed, rec, timeout=600)
    figures: dict[str, float] = {}
    summary = {}
    for size, rows in runs.items():
        med = {key: percentile([r[key] for r in rows], 50) for key in
               ("to_first_created_s", "to_all_created_s", "to_all_running_s", "to_succeeded_s")}
        if "post_mean_concurrency" in rows[0]:
            med.update({key: percentile([r[key] for r in rows], 50) for key in
                        ("post_span_s", "post_max_concurrency", "post_mean_concurrency", "post_median_duration_s")})
        summary[size] = med
        figures[f"{size}.to_all_created_s"] = med["to_all_created_s"]
        figures[f"{size}.to_succeeded_s"] = med["to_succeeded_s"]
    ordered = sorted(summary)
    growth = {}
    if len(ordered) > 1:
        for key in ("to_all_created_s", "to_succeeded_s"):
            growth[key] = dict(zip([f"{a}->{b}" for a, b in zip(ordered, ordered[1:])],
                                   growth_exponents(ordered, [summary[s][key] for s in ordered])))
    stats = {size: {key: summarize([r[key] for r in rows]) for key in ("to_all_created_s", "to_succeeded_s")}
             for size, rows in runs.items()}
    return {"params": {"sizes": sizes, "repeats": repeats, "command": bc.SLEEP_1,
                       "target_created_s": TARGET_CREATED_S},
            "figures": figures, "summary": summary, "growth_exponents": growth, "stats": stats,
            "runs": runs}


def report(results: dict[str, Any]) -> str:
    summary = results["summary"]
    rows = []
    for size in sorted(summary, key=int):
        s = summary[size]
        rows.append((size, s["to_first_created_s"], s["to_all_created_s"], s["to_all_running_s"],
                     s["to_succeeded_s"], 1000 * s["to_all_created_s"] / int(size),
                     s.get("post_max_concurrency"), s.get("post_mean_concurrency")))
    text = (f"Gang size: median of {results['params']['repeats']} run(s) per size (seconds from the "
            "DDPJob's creation)\n\n"
            + table(["nodes", "first pod created", "all pods created", "all Running", "Succeeded",
                     "ms per pod (created)", "POSTs in flight (max)", "POST concurrency (mean)"], rows))
    for key, exps in results["growth_exponents"].items():
        text += f"\n\ngrowth exponent of {key} (1 = linear): " + ", ".join(f"{k}: {v:.2f}" for k, v in exps.items())
    return text


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    machine = bc.machine_info()
    with bc.Bed.local(args) as bed:
        results = run(bed, args)
    print(report(results))
    print(f"results: {bc.write_results(NAME, args, machine, results)}")


if __name__ == "__main__":
    main()
