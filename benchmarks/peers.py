"""Side by side with the peers: the same workloads through a DDPJob, Kubeflow's PyTorchJob
(training-operator v1.8.1, default settings) and an Indexed Job plus a headless Service (the
Job controller of the kube-controller-manager: no operator at all), in one run, on the same
control plane and node agent. Prints DDPJob / peer ratios.

    python benchmarks/peers.py                 # the default sizes below (about 15 min here)
    python benchmarks/peers.py --smoke         # tiny sizes (CI: tests/cluster/test_peers_smoke.py)
    python benchmarks/peers.py --gang 64 --many 20 --systems ddpjob indexedjob

Rows (each system in turn, in its own namespace, pods that sleep as in the other benchmarks):

- start: ``--runs`` runs of a 2-node job: apply -> all pods Running; last pod exit -> the job's
  final phase (DDPJob Succeeded, PyTorchJob condition Succeeded, Job condition Complete);
- gang: one ``--gang``-node job whose pods select no node: job created -> every pod created
  (this watch saw it), and the controller's pod POSTs (audit log);
- many: ``--many`` concurrent ``--many-nnodes``-node jobs created at once: throughput, status
  lag (a pod reached Running / Succeeded -> the job's status counts it) p50/p95, the
  controller's API requests per job and per pod (audit log), CPU seconds and memory;
- recovery: ``--recoveries`` times, one rank of a running 2-node job SIGKILLed (exit 137) ->
  every rank Running again with a new pod for the killed one. DDPJob replaces the whole gang
  (what DDP needs: the survivors cannot rejoin a new rank), the peers only the dead pod.

"The controller" is the DDPJob operator, the training-operator, and for the Indexed Job the
kube-controller-manager (its CPU and memory are those of every controller in it; its requests
are the Job controller's ServiceAccount's only). The Indexed Job's user also creates its
Service: one request more per job, the user's, not counted as the controller's.
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional, Sequence

if __name__ == "__main__" and not __package__:
    # `python benchmarks/peers.py` is `python -m benchmarks.peers` with the repository importable.
    _repo = str(Path(__file__).resolve().parents[1])
    _path = os.pathsep.join(p for p in (_repo, os.environ.get("PYTHONPATH")) if p)
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks.peers", *sys.argv[1:]],
              {**os.environ, "PYTHONPATH": _path})

from benchmarks import bench_cluster as bc  # noqa: E402
from benchmarks import peer_controllers  # noqa: E402
from benchmarks.bench_stats import AuditRecord, count_requests, max_concurrency, parse_audit, summarize, table  # noqa: E402
from benchmarks.peer_systems import (  # noqa: E402
    SYSTEMS, TERMINAL, JobSeen, PodSeen, System, collection_path, gang_replaced, job_seen, milestones, pod_seen,
    status_lags,
)

NAME = "peers"
SLEEP_1 = bc.SLEEP_1
SLEEP_LONG = ["python3", "-c", "import time; time.sleep(3600)"]
JOB_CONTROLLER_USER = "system:serviceaccount:kube-system:job-controller"
SMOKE = {"runs": 1, "gang": 4, "many": 2, "many_nnodes": 2, "recoveries": 1, "many_repeats": 1}
SCENARIOS = ("start", "recovery", "many", "gang")
SMOKE_FIGURES = [f"{s}.{k}" for s in SYSTEMS for k in
                 ("start.to_all_running_s.median", "start.last_exit_to_final_s.median", "gang.created_s.median",
                  "many.jobs_per_minute", "many.requests_per_pod", "recovery.kill_to_all_running_s.median")]


def parser():
    p = bc.base_parser(__doc__.splitlines()[0])
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    p.add_argument("--runs", type=int, default=10, help="2-node start-latency runs per system")
    p.add_argument("--gang", type=int, default=256, help="nodes of the Pending gang")
    p.add_argument("--gang-runs", type=int, default=1)
    p.add_argument("--many", type=int, default=100, help="concurrent jobs")
    p.add_argument("--many-nnodes", type=int, default=4)
    p.add_argument("--recoveries", type=int, default=5)
    p.add_argument("--many-repeats", type=int, default=2,
                   help="many-jobs runs per system, in turns (ABC CBA ...); the table shows the run least "
                   "disturbed by other work on the machine, every run is recorded")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                   help="a subset writes results/peers-<scenarios>.json")
    return p


# ---------------------------------------------------------------------------------------------
# The watch
# ---------------------------------------------------------------------------------------------
class Watch(bc.NamespaceWatch):
    """The namespace's pods and jobs of one system, each event stamped as it arrives."""

    def __init__(self, bed: bc.Bed, system: System, namespace: str):
        self.system, self.title = system, system.title
        super().__init__(bed, namespace, system.job_label, system.api_path)

    def to_pod(self, at: float, event: str, pod: dict) -> Optional[PodSeen]:
        return pod_seen(self.system, at, event, pod)

    def to_job(self, at: float, event: str, job: dict) -> JobSeen:
        return job_seen(self.system, at, event, job)

    def finished(self, names: Sequence[str]) -> bool:
        return all(n in self.job_state and self.job_state[n].phase in TERMINAL for n in names)

    def every_milestone(self, name: str, nnodes: int, timeout: float = 60) -> dict[str, float]:
        """``milestones`` of a finished job once every one is known: the job's terminal phase
        can come on its watch before its pods' last exit comes on theirs (a loaded CI machine:
        the start figures read 'last exit: None')."""
        def known(w: "Watch") -> Optional[dict[str, float]]:
            t = milestones(w.pods, w.jobs, name, nnodes)
            return t if all(v is not None for v in t.values()) else None  # type: ignore[return-value]

        return self.wait(known, timeout, f"every milestone of {name} (its pods' exits)")


def delete_all(bed: bc.Bed, watch: Watch, timeout: float = 600) -> None:
    """Delete the namespace's jobs, Services and pods and wait for the pods to be gone."""
    ns = watch.namespace
    bed.kubectl("delete", watch.system.resource, "--all", "-n", ns, "--wait=false")
    watch.wait(lambda w: not w.job_state, timeout, "the jobs to be gone")
    bed.kubectl("delete", "services,pods", "--all", "-n", ns, "--wait=false")
    watch.wait(lambda w: not w.live, timeout, "the pods to be gone")


# ---------------------------------------------------------------------------------------------
# The controllers
# ---------------------------------------------------------------------------------------------
class Controllers:
    """Who does each system's work: process id and API user."""

    def __init__(self, bed: bc.Bed, training_operator: Optional[peer_controllers.TrainingOperator]):
        self.bed, self.training_operator = bed, training_operator

    def pid(self, system: System) -> int:
        if system.key == "ddpjob":
            return self.bed.operator_pid
        if system.key == "pytorchjob":
            assert self.training_operator is not None
            return self.training_operator.pid
        return self.bed.component_pids()["kube-controller-manager"]

    @staticmethod
    def user(system: System) -> str:
        return {"ddpjob": bc.OPERATOR_USER, "pytorchjob": peer_controllers.USER}.get(system.key, JOB_CONTROLLER_USER)

    def audit(self, system: System, offset: int, namespace: str, settle: float = 1.0) -> list[AuditRecord]:
        time.sleep(settle)
        with open(self.bed.audit_log, "rb") as handle:
            handle.seek(offset)
            lines = handle.read().decode(errors="replace").splitlines()
        return [r for r in parse_audit(lines, self.user(system)) if r.namespace == namespace]


def post_all(bed: bc.Bed, manifests: Sequence[dict], workers: int = 16) -> float:
    """POST the manifests from ``workers`` threads, as many users at once (bench_cluster's
    create_at_once, for any kind). A job's Service goes before its Job."""
    started = time.time()
    groups: dict[str, list[dict]] = {}
    for m in manifests:
        groups.setdefault(m["metadata"]["name"], []).append(m)

    def create(group: list[dict]) -> None:
        for m in group:
            bed.rest.create(collection_path(m), m)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(create, groups.values()))
    return time.time() - started


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------
def start_latency(bed: bc.Bed, system: System, runs: int, nnodes: int = 2) -> dict[str, Any]:
    keys = ("kubectl_apply_s", "to_all_created_s", "to_all_running_s", "last_exit_to_final_s", "to_final_s")
    samples: dict[str, list[float]] = {k: [] for k in keys}
    with bed.namespace(f"peers-start-{system.key}") as ns, Watch(bed, system, ns) as watch:
        for i in range(runs + 1):  # run 0 warms the controller up and is not counted
            watch.clear()
            name = f"start-{i:02d}"
            apply_s = bed.apply(system.manifests(name, ns, nnodes, SLEEP_1))
            watch.wait(lambda w: w.finished([name]), 300, f"{name} to finish")
            if watch.job_state[name].phase != "Succeeded":
                raise RuntimeError(f"{system.title} {name} ended {watch.job_state[name].phase}")
            t = watch.every_milestone(name, nnodes)
            delete_all(bed, watch)
            if i == 0:
                continue
            row = {"kubectl_apply_s": apply_s, "to_all_created_s": t["all_created"] - t["job_added"],
                   "to_all_running_s": t["all_running"] - t["job_added"],
                   "last_exit_to_final_s": t["job_finished"] - t["last_exit"],
                   "to_final_s": t["job_finished"] - t["job_added"]}
            for k, v in row.items():
                samples[k].append(v)
            print(f"{system.title} start {i}/{runs}: running {row['to_all_running_s']:.3f}s, exit->final "
                  f"{row['last_exit_to_final_s']:.3f}s", file=sys.stderr, flush=True)
    return {k: summarize(v) for k, v in samples.items()}


def pending_gang(bed: bc.Bed, ctl: Controllers, system: System, size: int, runs: int) -> dict[str, Any]:
    created, posts, spans, in_flight, requests = [], [], [], [], []
    with bed.namespace(f"peers-gang-{system.key}") as ns, Watch(bed, system, ns) as watch:
        for i in range(runs):
            bc.settle(timeout=20)  # the previous scenario's pods are torn down (bounded: a shared machine)
            watch.clear()
            name = f"gang-{i}"
            offset = bed.audit_offset()
            post_all(bed, system.manifests(name, ns, size, SLEEP_1, pending=True))
            watch.wait(lambda w: len({p.uid for p in w.pods}) >= size, 900, f"{size} pods of {name}")
            t = milestones(watch.pods, watch.jobs, name, size)
            records = ctl.audit(system, offset, ns)
            pod_posts = [r for r in records if r.key == "create pods" and r.code < 300]
            created.append(t["all_created"] - t["job_added"])
            posts.append(len(pod_posts))
            if pod_posts:
                spans.append(max(r.completed for r in pod_posts) - min(r.received for r in pod_posts))
                in_flight.append(max_concurrency([(r.received, r.completed) for r in pod_posts]))
            requests.append(count_requests(records))
            print(f"{system.title} gang {size}: all {size} pods created after {created[-1]:.3f}s",
                  file=sys.stderr, flush=True)
            delete_all(bed, watch, timeout=900)
    return {"size": size, "created_s": summarize(created), "pod_posts": posts, "post_span_s": summarize(spans),
            "posts_in_flight_max": max(in_flight, default=0), "requests": requests}


def many_jobs(bed: bc.Bed, ctl: Controllers, system: System, count: int, nnodes: int, settle: bool) -> dict[str, Any]:
    pid = ctl.pid(system)
    settled_s = bc.settle(timeout=20) if settle else 0.0
    rss_before = bc.proc_memory_mib(pid)["rss_mib"]
    with bed.namespace(f"peers-many-{system.key}") as ns, Watch(bed, system, ns) as watch:
        names = [f"job-{i:03d}" for i in range(count)]
        offset = bed.audit_offset()
        cpu_before = {**bed.cpu_snapshot(), "controller": bc.proc_cpu_seconds(pid)}
        create_s = post_all(bed, [m for n in names for m in system.manifests(n, ns, nnodes, SLEEP_1)])
        watch.wait(lambda w: w.finished(names), 1800, f"{count} jobs to finish")
        cpu_after = {**bed.cpu_snapshot(), "controller": bc.proc_cpu_seconds(pid)}
        memory = bc.proc_memory_mib(pid)
        failed = [n for n in names if watch.job_state[n].phase != "Succeeded"]
        times = {n: milestones(watch.pods, watch.jobs, n, nnodes) for n in names}
        lags = status_lags(watch.pods, watch.jobs)
        records = ctl.audit(system, offset, ns)
        delete_all(bed, watch, timeout=900)
    cpu = bed.cpu_delta(cpu_before, cpu_after)
    ours = sum(v for k, v in cpu.items() if k not in ("machine", "controller"))
    makespan = max(t["job_finished"] for t in times.values()) - min(t["job_added"] for t in times.values())
    total = len(records)
    return {
        "jobs": count, "nnodes": nnodes, "failed": failed, "create_all_s": create_s, "makespan_s": makespan,
        "jobs_per_minute": 60 * count / makespan,
        "job_to_all_running_s": summarize([t["all_running"] - t["job_added"] for t in times.values() if t["all_running"]]),
        "job_to_finished_s": summarize([t["job_finished"] - t["job_added"] for t in times.values()]),
        "status_lag_s": summarize(lags),
        "requests": count_requests(records), "requests_total": total,
        "requests_per_job": total / count, "requests_per_pod": total / (count * nnodes),
        "controller_cpu_s": cpu.get("controller"), "controller_cpu_ms_per_job": 1000 * cpu.get("controller", 0) / count,
        "controller_rss_before_mib": rss_before, "controller_rss_end_mib": memory["rss_mib"],
        "controller_peak_mib": memory["peak_mib"], "cpu_s": cpu, "settled_before_s": settled_s,
        # CPU that neither the test bed nor its pods used: other work on this shared machine.
        "outside_cpu_s": round(cpu.get("machine", 0) - ours, 2),
        "loadavg_1min_end": os.getloadavg()[0],
    }


def recovery(bed: bc.Bed, system: System, runs: int, nnodes: int = 2) -> dict[str, Any]:
    samples = []
    with bed.namespace(f"peers-recovery-{system.key}") as ns, Watch(bed, system, ns) as watch:
        bed.apply(system.manifests("recovery", ns, nnodes, SLEEP_LONG, restarts=runs + 5))

        def all_running(w: Watch) -> bool:
            ranks = {p.rank for p in w.live.values() if p.phase == "Running" and not p.deleting}
            return len(ranks) >= nnodes

        watch.wait(all_running, 300, "the job to run")
        for i in range(runs):
            time.sleep(1)  # from a quiet gang each time
            rank = i % nnodes
            victim = next(p for p in watch.live.values() if p.rank == rank and p.phase == "Running" and not p.deleting)
            killed_at = time.time()
            if not bed.kill_pod_processes(victim.uid):
                raise RuntimeError(f"no processes in pod {victim.name}")
            watch.wait(lambda w: gang_replaced(w.live, "recovery", nnodes, rank, victim.uid), 300,
                       f"rank {rank} to run again")
            samples.append(time.time() - killed_at)
            print(f"{system.title} recovery {i + 1}/{runs}: {samples[-1]:.3f}s", file=sys.stderr, flush=True)
        delete_all(bed, watch)
    return {"kill_to_all_running_s": summarize(samples)}


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def sizes(args) -> dict[str, int]:
    if args.smoke:
        return dict(SMOKE)
    return {"runs": args.runs, "gang": args.gang, "gang_runs": args.gang_runs, "many": args.many,
            "many_nnodes": args.many_nnodes, "recoveries": args.recoveries, "many_repeats": args.many_repeats}


def run_with(bed: bc.Bed, training_operator: Optional[peer_controllers.TrainingOperator], args) -> dict[str, Any]:
    size = {"gang_runs": 1, **sizes(args)}
    systems = [SYSTEMS[k] for k in args.systems]
    ctl = Controllers(bed, training_operator)
    results: dict[str, dict[str, Any]] = {s.key: {} for s in systems}
    load: dict[str, Any] = {"start": os.getloadavg()}
    scenarios = SCENARIOS if args.smoke else args.scenarios
    if "start" in scenarios:
        for s in systems:
            results[s.key]["start"] = start_latency(bed, s, size["runs"])
    if "recovery" in scenarios:
        for s in systems:
            results[s.key]["recovery"] = recovery(bed, s, size["recoveries"])
    if "many" in scenarios:
        runs: dict[str, list[dict]] = {s.key: [] for s in systems}
        for repeat in range(size["many_repeats"]):
            for s in (systems if repeat % 2 == 0 else systems[::-1]):
                runs[s.key].append(many_jobs(bed, ctl, s, size["many"], size["many_nnodes"], settle=not args.smoke))
                print(f"{s.title} many {repeat + 1}: {runs[s.key][-1]['jobs_per_minute']:.1f} jobs/min, "
                      f"outside CPU {runs[s.key][-1]['outside_cpu_s']} s", file=sys.stderr, flush=True)
        for s in systems:
            least_disturbed = min(runs[s.key], key=lambda r: r["outside_cpu_s"])
            results[s.key]["many"] = {**least_disturbed, "all_runs": runs[s.key]}
    if "gang" in scenarios:
        for s in systems:
            results[s.key]["gang"] = pending_gang(bed, ctl, s, size["gang"], size["gang_runs"])
    load["end"] = os.getloadavg()
    return {"params": {"sizes": size, "systems": [s.key for s in systems], "scenarios": list(scenarios),
                       "command": SLEEP_1,
                       "training_operator": peer_controllers.VERSION, **bc.bed_setup(bed, args)},
            "figures": figures(results), "systems": results, "loadavg": load}


ROWS = [  # (label, figure key, higher is better)
    ("2-node job: apply -> all pods Running, median s", "start.to_all_running_s.median", False),
    ("2-node job: apply -> all pods Running, p95 s", "start.to_all_running_s.p95", False),
    ("2-node job: last exit -> final phase, median s", "start.last_exit_to_final_s.median", False),
    ("2-node job: apply -> final phase, median s", "start.to_final_s.median", False),
    ("{gang}-node gang (Pending): all pods created, median s", "gang.created_s.median", False),
    ("{many} x {many_nnodes}-node jobs: jobs/min", "many.jobs_per_minute", True),
    ("{many} x {many_nnodes}-node jobs: job -> all Running, median s", "many.job_to_all_running_s.median", False),
    ("{many} x {many_nnodes}-node jobs: status lag p50 s", "many.status_lag_s.median", False),
    ("{many} x {many_nnodes}-node jobs: status lag p95 s", "many.status_lag_s.p95", False),
    ("killed rank -> all ranks Running again, median s", "recovery.kill_to_all_running_s.median", False),
    ("API requests per job (controller)", "many.requests_per_job", False),
    ("API requests per pod (controller)", "many.requests_per_pod", False),
    ("controller CPU ms per job", "many.controller_cpu_ms_per_job", False),
    ("controller peak memory MiB", "many.controller_peak_mib", False),
]


def figures(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    out = {}
    for system, scenarios in results.items():
        for _, key, _ in ROWS:
            scenario, *path = key.split(".")
            value: Any = scenarios.get(scenario, {})
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            if isinstance(value, (int, float)):
                out[f"{system}.{key}"] = float(value)
    return out


def outside_cpu(run: dict[str, Any]) -> float:
    if "outside_cpu_s" in run:
        return run["outside_cpu_s"]
    cpu = run["cpu_s"]
    return cpu.get("machine", 0) - sum(v for k, v in cpu.items() if k not in ("machine", "controller"))


def report(results: dict[str, Any]) -> str:
    p, figs = results["params"], results["figures"]
    systems = p["systems"]
    peers = [s for s in systems if s != "ddpjob"]
    headers = ["row"] + [SYSTEMS[s].title for s in systems] + [f"DDPJob / {SYSTEMS[s].title}" for s in peers
                                                              if "ddpjob" in systems]
    rows = []
    for label, key, higher in ROWS:
        values = [figs.get(f"{s}.{key}") for s in systems]
        ratios = []
        if "ddpjob" in systems:
            mine = figs.get(f"ddpjob.{key}")
            for s in peers:
                theirs = figs.get(f"{s}.{key}")
                ratios.append(mine / theirs if mine is not None and theirs else None)
        rows.append([label.format(**p["sizes"]) + (" (higher is better)" if higher else "")] + values + ratios)
    load = results.get("loadavg", {})
    text = (f"Peers: the same workloads through {', '.join(SYSTEMS[s].title for s in systems)} on one test bed "
            f"(training-operator {p['training_operator']}, default settings); ratios below 1 favour DDPJob "
            "except where higher is better\n\n" + table(headers, rows))
    if load:
        text += ("\n\nload average (1/5/15 min) " + "/".join(f"{x:.1f}" for x in load["start"]) + " at the start, "
                 + "/".join(f"{x:.1f}" for x in load["end"]) + " at the end")
    many_runs = [(SYSTEMS[s].title, r) for s in systems
                 for r in (results["systems"][s].get("many") or {}).get("all_runs")
                 or ([results["systems"][s]["many"]] if "many" in results["systems"][s] else [])]
    if many_runs:
        text += ("\n\nevery many-jobs run: jobs/min, and in brackets the CPU seconds that other work on this shared "
                 "machine used meanwhile (not the test bed, its pods or the benchmark): "
                 + "; ".join(f"{t} {r['jobs_per_minute']:.1f} ({outside_cpu(r):.0f} s in {r['makespan_s']:.0f} s)"
                             for t, r in many_runs))
    req_rows = []
    for s in systems:
        many = results["systems"][s].get("many") or {}
        gang = results["systems"][s].get("gang") or {}
        req_rows.append([SYSTEMS[s].title, ", ".join(f"{k} {v}" for k, v in (many.get("requests") or {}).items()),
                         ", ".join(f"{k} {v}" for k, v in ((gang.get("requests") or [{}])[-1]).items())])
    text += ("\n\ncontroller requests by kind (audit log): the many-jobs run, all jobs; the Pending gang, last run\n\n"
             + table(["system", f"{p['sizes']['many']} jobs", f"{p['sizes']['gang']}-node gang"], req_rows))
    return text


def run(bed: bc.Bed, args) -> dict[str, Any]:
    """In a test bed that already runs the DDPJob operator (the pytest session's, or Bed.local):
    start the training-operator if PyTorchJob is benchmarked, run, stop it."""
    with ExitStack() as stack:
        training_operator = None
        if "pytorchjob" in args.systems:
            control_plane = bed.testbed.control_plane
            training_operator = peer_controllers.TrainingOperator(
                bed.kubectl, control_plane.server, control_plane.pki.ca_cert, bed.testbed.run_dir,
                register=bed.testbed.extra_processes.append).start()
            stack.callback(training_operator.stop)
        return run_with(bed, training_operator, args)


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    name = NAME if args.smoke or set(args.scenarios) == set(SCENARIOS) else "-".join([NAME, *args.scenarios])
    bc.main(name, lambda: parser(), run, report, argv)


if __name__ == "__main__":
    main()
