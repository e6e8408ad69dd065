"""Recovery: time from a rank's death (its process SIGKILLed, exit 137: retryable) to the gang
running again (every pod of attempt + 1 Running).

    python -m benchmarks.operator_recovery              # 10 restarts of a 2-node job
    python -m benchmarks.operator_recovery --smoke      # 1 restart

One job with pods that sleep and a large restart budget; each round SIGKILLs every process in
one rank's pod (the ranks take turns), as the OOM killer or a segfault would, and waits for the
next attempt to run. The milestones, on this process's clock (its watch): the pod seen Failed,
the DDPJob seen Restarting, the last pod of the old attempt gone (the healthy ranks are deleted
too, and the new gang waits for all of them), every pod of the new attempt created, all
Running. The operator's requests per restart come from the audit log.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks import bench_cluster as bc
from benchmarks.bench_stats import count_requests, first_seen, summarize, table

NAME = "operator_recovery"
SMOKE_FIGURES = ["kill_to_all_running_s.median"]
SLEEP_LONG = ["python3", "-c", "import time; time.sleep(3600)"]
STEPS = [("rank killed -> pod seen Failed", "kill_to_pod_failed_s"),
         ("rank killed -> DDPJob Restarting", "kill_to_restarting_s"),
         ("rank killed -> old pods all gone", "kill_to_old_gone_s"),
         ("rank killed -> new pods all created", "kill_to_new_created_s"),
         ("rank killed -> new gang all Running", "kill_to_all_running_s")]


def parser():
    p = bc.base_parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--nnodes", type=int, default=2)
    return p


def first(observations, predicate):
    return min((o.t for o in observations if predicate(o)), default=None)


def one_restart(bed: bc.Bed, rec: bc.Recorder, ns: str, nnodes: int, attempt: int) -> dict[str, Any]:
    victim = next(p for p in rec.pods_of("recovery") if p.attempt == attempt and p.rank == attempt % nnodes)
    old_uids = {p.uid for p in rec.pods_of("recovery") if p.attempt == attempt}
    offset = bed.audit_offset()
    killed_at = time.time()
    if not bed.kill_pod_processes(victim.uid):
        raise RuntimeError(f"no processes found in pod {victim.name}")
    rec.wait(lambda r: r.running_pods("recovery", attempt + 1) == nnodes, 300,
             f"attempt {attempt + 1} to run")
    after = [p for p in rec.pods if p.t >= killed_at]
    jobs = [j for j in rec.jobs if j.t >= killed_at]
    gone = [p.t for p in after if p.uid in old_uids and p.event == "DELETED"]
    new = [p for p in after if p.attempt == attempt + 1]
    created = first_seen(new, lambda p: True)
    running = first_seen(new, lambda p: p.phase == "Running")
    failed_at = first(after, lambda p: p.uid == victim.uid and p.phase == "Failed")
    exit_code = next((p.exit_code for p in after if p.uid == victim.uid and p.exit_code is not None), None)
    records = bed.audit_records(offset, namespace=ns, settle=0.5) or []
    row = {
        "victim": victim.name, "exit_code": exit_code,
        "kill_to_pod_failed_s": failed_at - killed_at if failed_at else None,
        "kill_to_restarting_s": (first(jobs, lambda j: j.phase == "Restarting") or killed_at) - killed_at,
        "kill_to_old_gone_s": max(gone) - killed_at if len(gone) == len(old_uids) else None,
        "kill_to_new_created_s": max(created.values()) - killed_at,
        "kill_to_all_running_s": max(running.values()) - killed_at,
        "requests": count_requests(records),
    }
    return row


def run(bed: bc.Bed, args) -> dict[str, Any]:
    runs, nnodes = (1, 2) if args.smoke else (args.runs, args.nnodes)
    bc.warm_up(bed)
    rows = []
    with bed.namespace("bench-recovery") as ns, bc.Recorder(bed, ns) as rec:
        bed.apply([bc.ddpjob("recovery", ns, nnodes, SLEEP_LONG,
                             # The recreated gang is what is measured (in place: restart_modes.py).
                             failurePolicy={"maxRestarts": runs + 5, "restartMode": "Recreate"})])
        rec.wait(lambda r: r.running_pods("recovery", 0) == nnodes and r.phase("recovery") == "Running",
                 300, "the job to run")
        for attempt in range(runs):
            time.sleep(1)  # let the status settle: a restart from a quiet gang each time
            row = one_restart(bed, rec, ns, nnodes, attempt)
            rows.append(row)
            print(f"restart {attempt + 1}/{runs}: {row['victim']} exit {row['exit_code']}, running again "
                  f"after {row['kill_to_all_running_s']:.3f}s", file=sys.stderr, flush=True)
        bc.delete_jobs(bed, rec, timeout=300)
    stats = {key: summarize([r[key] for r in rows if r[key] is not None]) for _, key in STEPS}
    figures = {f"{key}.{stat}": stats[key][stat] for key in stats for stat in ("median", "p95")
               if stats[key]["n"]}
    requests = [sum(r["requests"].values()) for r in rows]
    return {"params": {"runs": runs, "nnodes": nnodes, "command": SLEEP_LONG},
            "figures": figures, "stats": stats,
            "requests_per_restart": summarize(requests), "runs": rows}


def report(results: dict[str, Any]) -> str:
    p, stats = results["params"], results["stats"]
    rows = [(label, stats[key]["n"], stats[key].get("median"), stats[key].get("p95"), stats[key].get("max"))
            for label, key in STEPS]
    last = results["runs"][-1]["requests"]
    return (f"Recovery: {p['runs']} gang restart(s) of a {p['nnodes']}-node job (seconds)\n\n"
            + table(["interval", "n", "median", "p95", "max"], rows)
            + f"\n\noperator requests per restart: median {results['requests_per_restart'].get('median')} "
            f"(last one: {last})")


def main(argv=None) -> None:
    bc.main(NAME, parser, run, report, argv)


if __name__ == "__main__":
    main()
