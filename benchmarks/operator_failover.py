"""Failover: two operator replicas; the leader SIGKILLed in the middle of a gang restart; the time
until the standby holds the Lease and the restart is finished (the new gang all Running).

    python -m benchmarks.operator_failover              # 5 kills
    python -m benchmarks.operator_failover --smoke      # 1 kill, 4 s idle window

Two replicas as in production (docs/operator.md, "High availability"): the same command,
environment and ServiceAccount, two identities, client-go's timings (15 s lease, 10 s renew
deadline, 2 s retry; ``--operator-env`` changes them). One 2-node job with pods that sleep and
take 3 s to exit on SIGTERM; each round SIGKILLs one rank's processes (exit 137: a gang
restart), waits until the DDPJob is Restarting (the leader has written the status and is
deleting the old gang), SIGKILLs the leader, and waits for the next attempt to run. The killed
replica is started again and stands by for the next round, so the replicas take turns.

At the end the leader is stopped with SIGTERM (a rolling update's way): it releases the Lease,
and the time until the other replica holds it is the graceful handover.

Milestones on this process's clock: the Lease seen held by the standby (polled every 0.1 s), the
new attempt's pods all created, all Running. Checked every round, and the run fails if not: the
restart is counted once (status.restarts), each rank of the new attempt has exactly one pod.
Also: the Lease requests of both replicas while nothing happens (audit log), the leader
election's whole API cost.
"""
from __future__ import annotations

import datetime as dt
import sys
import time
from typing import Any, Optional

from benchmarks import bench_cluster as bc
from benchmarks.bench_stats import count_requests, first_seen, summarize, table

NAME = "operator_failover"
SMOKE_FIGURES = ["kill_to_lease_s.median", "kill_to_all_running_s.median", "idle_lease_requests_per_minute"]
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/ddpjob-system/leases/ddpjob-operator"
SLOW_TO_STOP = ["python3", "-c", "import signal, sys, time; "
                "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), sys.exit(143))); time.sleep(3600)"]
STEPS = [("leader killed -> standby holds the Lease", "kill_to_lease_s"),
         ("leader's last renewal -> standby holds the Lease (Lease times)", "last_renewal_to_lease_s"),
         ("leader killed -> new pods all created", "kill_to_new_created_s"),
         ("leader killed -> new gang all Running", "kill_to_all_running_s")]


def parser():
    p = bc.base_parser(__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--idle", type=float, default=30.0, help="seconds of the window counting Lease requests")
    return p


def lease(bed: bc.Bed) -> dict:
    return bed.rest.get(LEASE_PATH)["spec"]


def holder(bed: bc.Bed) -> str:
    try:
        return lease(bed).get("holderIdentity") or ""
    except Exception:  # noqa: BLE001 - not created yet
        return ""


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _micro(text: str) -> Optional[float]:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc).timestamp() \
        if text else None


def idle_lease_requests(bed: bc.Bed, seconds: float) -> dict[str, Any]:
    offset = bed.audit_offset()
    time.sleep(seconds)
    records = [r for r in bed.audit_records(offset, settle=0.5) or [] if r.resource == "leases"]
    return {"seconds": seconds, "requests": len(records), "by_kind": count_requests(records),
            "per_minute": round(len(records) * 60 / seconds, 1)}


def one_failover(bed: bc.Bed, rec: bc.Recorder, replicas: dict, attempt: int, nnodes: int) -> dict[str, Any]:
    leader = replicas[holder(bed)]
    victim = next(p for p in rec.pods_of("failover") if p.attempt == attempt and p.rank == attempt % nnodes)
    if not bed.kill_pod_processes(victim.uid):
        raise RuntimeError(f"no processes found in pod {victim.name}")
    rec.wait(lambda r: r.phase("failover") == "Restarting", 60, f"restart {attempt + 1} to begin")
    leader.kill()
    killed_at = time.time()
    last_renewal = _micro(lease(bed).get("renewTime", ""))  # the dead leader's last word
    wait_for(lambda: holder(bed) not in ("", leader.identity), 60, "the standby to take the Lease")
    took_over_at = time.time()
    taken = lease(bed)
    rec.wait(lambda r: r.running_pods("failover", attempt + 1) == nnodes, 120, f"attempt {attempt + 1} to run")
    new = [p for p in rec.pods if p.attempt == attempt + 1]
    created, running = first_seen(new, lambda p: True), first_seen(new, lambda p: p.phase == "Running")
    restarts = rec.job_state["failover"].restarts
    ranks = {p.uid: p.rank for p in new}
    per_rank = {rank: sum(1 for r in ranks.values() if r == rank) for rank in sorted(set(ranks.values()))}
    if per_rank != {rank: 1 for rank in range(nnodes)}:
        raise RuntimeError(f"attempt {attempt + 1}: pods per rank {per_rank}, expected one each")
    if restarts != attempt + 1:
        raise RuntimeError(f"restart {attempt + 1} was counted as {restarts}")
    leader.start()  # back as the standby for the next round
    return {
        "killed": leader.identity, "new_leader": taken.get("holderIdentity"), "transitions": taken.get("leaseTransitions"),
        "kill_to_lease_s": took_over_at - killed_at,
        "last_renewal_to_lease_s": (_micro(taken.get("acquireTime", "")) or took_over_at) - last_renewal
        if last_renewal else None,
        "kill_to_new_created_s": max(created.values()) - killed_at,
        "kill_to_all_running_s": max(running.values()) - killed_at,
        "restarts": restarts,
    }


def run(bed: bc.Bed, args) -> dict[str, Any]:
    kills, idle_s, nnodes = (1, 4.0, 2) if args.smoke else (args.kills, args.idle, 2)
    bc.warm_up(bed)
    first = bed.operator
    wait_for(lambda: holder(bed) == first.identity, 60, f"{first.identity} to lead")
    second = bed.second_operator(f"{first.identity}-b")
    replicas = {first.identity: first, second.identity: second}
    rows = []
    try:
        wait_for(lambda: "standing by" in second.logs(), 60, "the second replica to stand by")
        idle = idle_lease_requests(bed, idle_s)
        with bed.namespace("bench-failover") as ns, bc.Recorder(bed, ns) as rec:
            bed.apply([bc.ddpjob("failover", ns, nnodes, SLOW_TO_STOP,
                                 # Recreate: the operator dies while the old gang is deleted.
                                 failurePolicy={"maxRestarts": kills + 5, "restartMode": "Recreate"},
                                 template={"spec": {"terminationGracePeriodSeconds": 30}})])
            rec.wait(lambda r: r.running_pods("failover", 0) == nnodes and r.phase("failover") == "Running",
                     300, "the job to run")
            for attempt in range(kills):
                time.sleep(1)
                row = one_failover(bed, rec, replicas, attempt, nnodes)
                rows.append(row)
                print(f"kill {attempt + 1}/{kills}: {row['killed']} -> {row['new_leader']} holds the Lease after "
                      f"{row['kill_to_lease_s']:.2f}s, the new gang runs after {row['kill_to_all_running_s']:.2f}s",
                      file=sys.stderr, flush=True)
            status = bed.rest.get(f"{bc.JOBS_PATH.format(ns=ns)}/failover")["status"]
            if (status.get("restarts"), status.get("restartAttempt")) != (kills, kills):
                raise RuntimeError(f"after {kills} restart(s) the status says restarts={status.get('restarts')}, "
                                   f"restartAttempt={status.get('restartAttempt')}")
            bc.delete_jobs(bed, rec, timeout=300)
    finally:
        # The first replica leads again for whatever runs next (the session's other tests). If
        # the second leads now, its SIGTERM is a graceful handover: it releases the Lease.
        if not first.running:
            first.start()
        handing_over = holder(bed) == second.identity
        stopped_at = time.time()
        second.stop()
        wait_for(lambda: holder(bed) == first.identity, 60, f"{first.identity} to lead again")
        handover = time.time() - stopped_at if handing_over else None
    stats = {key: summarize([r[key] for r in rows if r[key] is not None]) for _, key in STEPS}
    figures = {f"{key}.{stat}": stats[key][stat] for key in stats for stat in ("median", "p95", "max")
               if stats[key]["n"]}
    figures["idle_lease_requests_per_minute"] = idle["per_minute"]
    if handover is not None:
        figures["graceful_handover_s"] = handover
    return {"params": {"kills": kills, "nnodes": nnodes, "command": SLOW_TO_STOP, "idle_seconds": idle_s,
                       **bc.bed_setup(bed, args)},
            "figures": figures, "stats": stats, "idle": idle, "restarts_counted": status.get("restarts"),
            "graceful_handover_s": handover, "runs": rows}


def report(results: dict[str, Any]) -> str:
    p, stats, idle = results["params"], results["stats"], results["idle"]
    rows = [(label, stats[key]["n"], stats[key].get("median"), stats[key].get("p95"), stats[key].get("max"))
            for label, key in STEPS]
    setup = bc.bed_setup_text(p)
    return (f"Failover: the leader SIGKILLed mid-restart, {p['kills']} time(s), a {p['nnodes']}-node job (seconds)"
            + (f"; {setup}" if setup else "") + "\n\n"
            + table(["interval", "n", "median", "p95", "max"], rows)
            + f"\n\nrestarts counted: {results['restarts_counted']} for {p['kills']} restart(s); one pod per rank "
            f"per attempt. Lease requests of both replicas while idle: {idle['requests']} in {idle['seconds']:.0f} s "
            f"({idle['per_minute']}/min: {idle['by_kind'] or 'none'})"
            + (f". Graceful stop of the leader (SIGTERM) -> the other holds the Lease: "
               f"{results['graceful_handover_s']:.2f} s" if results.get("graceful_handover_s") is not None else ""))


def main(argv=None) -> None:
    bc.main(NAME, parser, run, report, argv)


if __name__ == "__main__":
    main()
