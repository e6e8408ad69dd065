"""Start latency: from `kubectl apply` of a DDPJob to every pod created, to every pod Running
(as the node agent reports it), and from the last pod's exit to the DDPJob's Succeeded.

    python -m benchmarks.operator_start_latency            # 20 runs of a 2-node job
    python -m benchmarks.operator_start_latency --smoke    # 2 runs, for CI

Each run applies one job whose pods run ``python3 -c "import time; time.sleep(1)"``, waits for
Succeeded, deletes it and waits for its pods to go, so runs never overlap. Times come from this
process's own watch of the pods and the DDPJob (see bench_cluster.Recorder); t = 0 is the
DDPJob's ADDED event, i.e. when the API server has stored what `kubectl apply` sent (kubectl's
own start-up and discovery are reported apart, as ``kubectl apply``).
"""
from __future__ import annotations

import sys
from typing import Any

from benchmarks import bench_cluster as bc
from benchmarks.bench_stats import gang_times, status_latencies, summarize, table

NAME = "operator_start_latency"
SMOKE_FIGURES = ["to_all_created_s.median", "to_all_running_s.median",
                 "last_exit_to_succeeded_s.median", "status_latency_s.median"]
STEPS = [("kubectl apply", "kubectl_apply_s"), ("apply -> all pods created", "to_all_created_s"),
         ("apply -> all pods Running", "to_all_running_s"),
         ("last pod exit -> DDPJob Succeeded", "last_exit_to_succeeded_s"),
         ("apply -> DDPJob Succeeded", "to_succeeded_s"),
         ("pod phase change -> status shows it", "status_latency_s")]


def parser():
    p = bc.base_parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--nnodes", type=int, default=2)
    return p


def run(bed: bc.Bed, args) -> dict[str, Any]:
    runs, nnodes = (2, 2) if args.smoke else (args.runs, args.nnodes)
    samples: dict[str, list[float]] = {key: [] for _, key in STEPS}
    per_run = []
    cold = bc.warm_up(bed, nnodes)  # the first job after the operator started
    with bed.namespace("bench-latency") as ns, bc.Recorder(bed, ns) as rec:
        for i in range(runs):
            rec.clear()
            name = f"latency-{i:02d}"
            apply_s = bed.apply([bc.ddpjob(name, ns, nnodes, bc.SLEEP_1)])
            rec.wait(lambda r: r.finished([name]), 300, f"{name} to finish")
            t = gang_times(rec.pods, rec.jobs, name, nnodes)
            if rec.phase(name) != "Succeeded":
                raise RuntimeError(f"{name} ended {rec.phase(name)}, not Succeeded")
            lat = status_latencies(rec.pods, rec.jobs)["latencies"]
            row = {"kubectl_apply_s": apply_s,
                   "to_all_created_s": t["all_created"] - t["job_added"],
                   "to_all_running_s": t["all_running"] - t["job_added"],
                   "last_exit_to_succeeded_s": t["job_succeeded"] - t["last_exit"],
                   "to_succeeded_s": t["job_succeeded"] - t["job_added"]}
            for key, value in row.items():
                samples[key].append(value)
            samples["status_latency_s"] += lat
            per_run.append({**{k: round(v, 4) for k, v in row.items()},
                            "status_latencies_s": [round(x, 4) for x in lat]})
            print(f"run {i + 1}/{runs}: created {row['to_all_created_s']:.3f}s, running "
                  f"{row['to_all_running_s']:.3f}s, exit->Succeeded {row['last_exit_to_succeeded_s']:.3f}s",
                  file=sys.stderr, flush=True)
            bc.delete_jobs(bed, rec)
    stats = {key: summarize(values) for key, values in samples.items()}
    figures = {f"{key}.{stat}": stats[key][stat] for key in stats for stat in ("median", "p95")
               if stats[key]["n"]}
    return {"params": {"runs": runs, "nnodes": nnodes, "command": bc.SLEEP_1},
            "figures": figures, "stats": stats, "first_job_after_operator_start_s": cold, "runs": per_run}


def report(results: dict[str, Any]) -> str:
    p, stats = results["params"], results["stats"]
    rows = [(label, stats[key]["n"], stats[key].get("median"), stats[key].get("p95"),
             stats[key].get("max")) for label, key in STEPS]
    return (f"Start latency: {p['runs']} runs of a {p['nnodes']}-node job (seconds)\n\n"
            + table(["interval", "n", "median", "p95", "max"], rows)
            + "\n\nthe first job after the operator started (not in the table): "
            + ", ".join(f"{k} {v:.3f}s" for k, v in results["first_job_after_operator_start_s"].items()))


def main(argv=None) -> None:
    bc.main(NAME, parser, run, report, argv)


if __name__ == "__main__":
    main()
