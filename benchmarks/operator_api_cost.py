"""Cost per job: the API requests the operator makes per job and per pod, counted from the
API server's audit log (the test bed logs every request of the operator's ServiceAccount,
metadata only), and proof that it does not poll: the requests it makes while a job's pods
just run.

    python -m benchmarks.operator_api_cost              # jobs of 1 4 16 64 nodes; 30 s idle
    python -m benchmarks.operator_api_cost --smoke      # 1 and 2 nodes; 3 s idle

Each job runs in its own namespace (so its requests are those with that namespace), from
creation to Succeeded and through its deletion. A least-squares fit of requests = a + b x nodes gives
the fixed cost per job (a) and the cost per pod (b). The idle check starts a job whose pods
sleep, waits until they all run and the status has settled, then counts every request the
operator completes in the next ``--idle`` seconds, in any namespace; the leader election's Lease
renewals (docs/operator.md, "High availability") are counted apart: they are the election's cost,
not polling (benchmarks/operator_failover.py measures it with two replicas).
"""
from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks import bench_cluster as bc
from benchmarks.bench_stats import count_requests, linear_fit, table

NAME = "operator_api_cost"
SMOKE_FIGURES = ["requests_per_job_fixed", "requests_per_pod", "idle_requests"]
SLEEP_LONG = ["python3", "-c", "import time; time.sleep(3600)"]


def parser():
    p = bc.base_parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--idle", type=float, default=30.0, help="seconds of the idle window")
    p.add_argument("--idle-nnodes", type=int, default=4)
    p.add_argument("--idle-jobs", type=int, nargs="+", default=[1],
                   help="idle windows with this many running jobs each (e.g. 1 25): the requests must not grow")
    return p


def job_cost(bed: bc.Bed, size: int) -> dict[str, int]:
    with bed.namespace(f"bench-cost-{size}") as ns, bc.Recorder(bed, ns) as rec:
        offset = bed.audit_offset()
        bed.apply([bc.ddpjob("cost", ns, size, bc.SLEEP_1)])
        rec.wait(lambda r: r.finished(["cost"]), 600, f"the {size}-node job to finish")
        if rec.phase("cost") != "Succeeded":
            raise RuntimeError(f"the {size}-node job ended {rec.phase('cost')}")
        bc.delete_jobs(bed, rec, timeout=300)  # what the operator does on deletion counts too
        records = bed.audit_records(offset, namespace=ns)
    if records is None:
        raise RuntimeError(f"no audit log at {bed.audit_log}: the test bed's API server must log "
                           "the operator's requests (tests/cluster/controlplane.py AUDIT_POLICY)")
    return count_requests(records)


def idle_requests(bed: bc.Bed, nnodes: int, seconds: float, jobs: int = 1) -> dict[str, Any]:
    names = ["idle"] if jobs == 1 else [f"idle-{i:03d}" for i in range(jobs)]
    with bed.namespace(f"bench-idle-{jobs}") as ns, bc.Recorder(bed, ns) as rec:
        bed.create_at_once([bc.ddpjob(name, ns, nnodes, SLEEP_LONG) for name in names])
        rec.wait(lambda r: all(r.phase(n) == "Running" and r.running_pods(n, 0) == nnodes for n in names),
                 600, f"the {jobs} idle job(s)' pods to run")
        time.sleep(2)  # the last status write and events land
        offset = bed.audit_offset()
        cpu_before = bed.cpu_snapshot().get("operator", 0.0)
        events_before = len(rec.pods) + len(rec.jobs)
        time.sleep(seconds)
        cpu = bed.cpu_snapshot().get("operator", 0.0) - cpu_before
        watch_events = len(rec.pods) + len(rec.jobs) - events_before
        records = bed.audit_records(offset, settle=0.5) or []
        bc.delete_jobs(bed, rec, timeout=600)
    lease = [r for r in records if r.resource == "leases"]
    others = [r for r in records if r.resource != "leases"]
    return {"seconds": seconds, "nnodes": nnodes, "jobs": jobs, "requests": len(others),
            "by_kind": count_requests(others), "lease_requests": len(lease), "operator_cpu_s": round(cpu, 3),
            "watch_events_meanwhile": watch_events}


def run(bed: bc.Bed, args) -> dict[str, Any]:
    sizes, idle_s, idle_nnodes = ([1, 2], 3.0, 2) if args.smoke else (args.sizes, args.idle, args.idle_nnodes)
    bc.warm_up(bed)
    per_size = {}
    for size in sizes:
        counts = job_cost(bed, size)
        per_size[size] = counts
        print(f"{size} nodes: {sum(counts.values())} requests {counts}", file=sys.stderr, flush=True)
    totals = [sum(per_size[s].values()) for s in sizes]
    fixed, per_pod = linear_fit(sizes, totals)
    kinds = sorted({k for counts in per_size.values() for k in counts})
    fits = {k: linear_fit(sizes, [per_size[s].get(k, 0) for s in sizes]) for k in kinds}
    idle_counts = [1] if args.smoke else args.idle_jobs
    idles = {}
    for jobs in idle_counts:
        idles[jobs] = idle_requests(bed, idle_nnodes, idle_s, jobs)
        print(f"idle {idle_s:.0f}s with {jobs} job(s) of {idle_nnodes} pods running: {idles[jobs]['requests']} "
              "requests", file=sys.stderr, flush=True)
    idle = idles[idle_counts[0]]
    return {"params": {"sizes": sizes, "idle_seconds": idle_s, "idle_nnodes": idle_nnodes,
                       "operator_user": bc.OPERATOR_USER},
            "figures": {"requests_per_job_fixed": fixed, "requests_per_pod": per_pod,
                        "idle_requests": idle["requests"]},
            "per_size": per_size, "totals": dict(zip(sizes, totals)),
            "fit_by_kind": {k: {"per_job": a, "per_pod": b} for k, (a, b) in fits.items()},
            "idle": idle, **({"idle_by_jobs": idles} if len(idles) > 1 else {})}


def report(results: dict[str, Any]) -> str:
    sizes = results["params"]["sizes"]
    per_size = {int(k): v for k, v in results["per_size"].items()}
    kinds = sorted(results["fit_by_kind"])
    rows = [[kind] + [per_size[s].get(kind, 0) for s in sizes]
            + [results["fit_by_kind"][kind]["per_job"], results["fit_by_kind"][kind]["per_pod"]]
            for kind in kinds]
    rows.append(["total"] + [sum(per_size[s].values()) for s in sizes]
                + [results["figures"]["requests_per_job_fixed"], results["figures"]["requests_per_pod"]])
    idle = results["idle"]
    return ("API requests the operator made per job, from creation to Succeeded (audit log)\n\n"
            + table(["request"] + [f"{s} node(s)" for s in sizes] + ["fit: per job", "fit: per pod"], rows)
            + f"\n\nidle: {idle['requests']} requests in {idle['seconds']:.0f} s with {idle['nnodes']} pods "
            f"running ({idle['by_kind'] or 'none'})"
            + (f", besides {idle['lease_requests']} Lease renewals (leader election)" if "lease_requests" in idle else "")
            + f"; operator CPU {idle['operator_cpu_s']} s; {idle['watch_events_meanwhile']} watch events meanwhile"
            + idle_growth(results.get("idle_by_jobs") or {}))


def idle_growth(idles: dict) -> str:
    """The idle windows by the number of running jobs: requests (none may grow with them) and
    the operator's CPU (its progress polls of the pods do: one round per job per poll period)."""
    if not idles:
        return ""
    rows = [(jobs, i["jobs"] * i["nnodes"], i["requests"], i.get("lease_requests"), i["operator_cpu_s"],
             1000 * i["operator_cpu_s"] / i["jobs"] / (i["seconds"] / 60))
            for jobs, i in sorted(idles.items(), key=lambda kv: int(kv[0]))]
    return ("\n\nidle windows by running jobs (every pod running, nothing changing):\n\n"
            + table(["running jobs", "pods", "requests (not the Lease)", "Lease requests", "operator CPU s",
                     "operator CPU ms per job per minute"], rows))


def main(argv=None) -> None:
    bc.main(NAME, parser, run, report, argv)


if __name__ == "__main__":
    main()
