"""The benchmarks' pure helpers (benchmarks/bench_stats.py): statistics, the figures derived
from watch events and audit-log lines, the metrics parser."""
from __future__ import annotations

import json
import math

import pytest


from benchmarks import bench_stats as bs

pytestmark = pytest.mark.unit


# -- statistics -----------------------------------------------------------------------------
@pytest.mark.parametrize("values, q, expected", [
    ([3.0], 50, 3.0),
    ([1, 2, 3, 4], 50, 2.5),          # even count: mean of the middle two
    ([4, 1, 3, 2], 50, 2.5),          # order does not matter
    ([1, 2, 3, 4, 5], 0, 1),
    ([1, 2, 3, 4, 5], 100, 5),
    (list(range(1, 21)), 95, 19.05),  # numpy's linear interpolation
    ([10, 20], 25, 12.5),
])
def test_percentile(values, q, expected):
    assert bs.percentile(values, q) == pytest.approx(expected)


def test_percentile_refuses_nothing_and_bad_q():
    with pytest.raises(ValueError):
        bs.percentile([], 50)
    with pytest.raises(ValueError):
        bs.percentile([1], 101)


def test_summarize():
    s = bs.summarize([5, 1, 3])
    assert s == {"n": 3, "median": 3, "p95": pytest.approx(4.8), "min": 1, "max": 5, "mean": 3}
    assert bs.summarize([]) == {"n": 0}


def test_linear_fit_recovers_a_line():
    assert bs.linear_fit([1, 4, 16, 64], [7 + 2 * x for x in (1, 4, 16, 64)]) == \
        (pytest.approx(7), pytest.approx(2))
    with pytest.raises(ValueError):
        bs.linear_fit([1], [1])
    with pytest.raises(ValueError):
        bs.linear_fit([2, 2], [1, 3])


def test_growth_exponents():
    linear = bs.growth_exponents([1, 8, 64], [0.5, 4, 32])
    assert linear == [pytest.approx(1), pytest.approx(1)]
    fixed_cost = bs.growth_exponents([1, 256], [1.0, 1.0])
    assert fixed_cost == [pytest.approx(0)]
    quadratic = bs.growth_exponents([2, 4], [1, 4])
    assert quadratic == [pytest.approx(2)]
    with pytest.raises(ValueError):
        bs.growth_exponents([0, 1], [1, 2])


def test_concurrency_of_sequential_and_overlapping_requests():
    sequential = [(0, 1), (1, 2), (2, 3)]  # back to back: an end closes before the next opens
    assert bs.max_concurrency(sequential) == 1
    assert bs.mean_concurrency(sequential) == pytest.approx(1)
    overlapping = [(0, 1), (0, 1), (0.5, 1.5)]
    assert bs.max_concurrency(overlapping) == 3
    assert bs.mean_concurrency(overlapping) == pytest.approx(2)
    assert bs.max_concurrency([]) == 0
    assert bs.mean_concurrency([]) == 0


# -- watch observations ---------------------------------------------------------------------
def pod(name, uid, phase, *, job="j", rank=0, attempt=0, running=False, exit_code=None, deleting=False):
    status = {"phase": phase}
    if running:
        status["containerStatuses"] = [{"state": {"running": {}}}]
    if exit_code is not None:
        status["containerStatuses"] = [{"state": {"terminated": {"exitCode": exit_code}}}]
    meta = {"name": name, "uid": uid, "labels": {bs.JOB_LABEL: job, bs.RANK_LABEL: str(rank),
                                                 bs.ATTEMPT_LABEL: str(attempt)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": status}


def job(name, phase, nodes=(), attempt=0):
    return {"metadata": {"name": name}, "status": {
        "phase": phase, "restartAttempt": attempt,
        "nodes": [{"nodeRank": r, "pod": p, "phase": ph} for r, p, ph in nodes]}}


def test_pod_obs_reads_labels_and_state():
    obs = bs.pod_obs(1.0, "MODIFIED", pod("j-node-1", "u1", "Failed", rank=1, attempt=2, exit_code=137))
    assert (obs.job, obs.rank, obs.attempt, obs.phase, obs.exit_code, obs.running) == ("j", 1, 2, "Failed", 137, False)
    assert bs.pod_obs(1.0, "ADDED", {"metadata": {"name": "x", "labels": {}}}) is None


def two_node_run():
    """A 2-node job: created at 10, pods added 10.1/10.2, Running 10.5/10.6, exit 11.5/11.7."""
    P = lambda t, e, *a, **k: bs.pod_obs(t, e, pod(*a, **k))  # noqa: E731
    J = lambda t, e, *a, **k: bs.job_obs(t, e, job(*a, **k))  # noqa: E731
    pods = [
        P(10.1, "ADDED", "j-node-0", "a", "Pending", rank=0),
        P(10.2, "ADDED", "j-node-1", "b", "Pending", rank=1),
        P(10.5, "MODIFIED", "j-node-0", "a", "Running", rank=0, running=True),
        P(10.6, "MODIFIED", "j-node-1", "b", "Running", rank=1, running=True),
        P(11.5, "MODIFIED", "j-node-0", "a", "Succeeded", rank=0, exit_code=0),
        P(11.7, "MODIFIED", "j-node-1", "b", "Succeeded", rank=1, exit_code=0),
    ]
    jobs = [
        J(10.0, "ADDED", "j", ""),
        J(10.05, "MODIFIED", "j", "Pending"),
        J(10.58, "MODIFIED", "j", "Pending", nodes=[(0, "j-node-0", "Running"), (1, "j-node-1", "Pending")]),
        J(10.7, "MODIFIED", "j", "Running", nodes=[(0, "j-node-0", "Running"), (1, "j-node-1", "Running")]),
        J(11.8, "MODIFIED", "j", "Succeeded", nodes=[(0, "j-node-0", "Succeeded"), (1, "j-node-1", "Succeeded")]),
    ]
    return pods, jobs


def test_gang_times():
    pods, jobs = two_node_run()
    t = bs.gang_times(pods, jobs, "j", 2)
    assert t == {"job_added": 10.0, "first_created": 10.1, "all_created": 10.2, "all_running": 10.6,
                 "last_exit": 11.7, "job_succeeded": 11.8, "job_finished": 11.8}
    missing = bs.gang_times(pods, jobs, "j", 3)  # a third pod never came
    assert missing["all_created"] is None and missing["all_running"] is None


def test_gang_times_last_exit_is_the_containers_when_the_pod_phase_never_followed():
    # A container with restart rules of its own (KEP-5307) shows its exit while its pod is
    # still Running; the operator can finish the job and delete the pod before the phase moves.
    pods, jobs = two_node_run()
    P = lambda t, e, *a, **k: bs.pod_obs(t, e, pod(*a, **k))  # noqa: E731
    exited_running = [p for p in pods if p.phase != "Succeeded"] + [
        P(11.4, "MODIFIED", "j-node-0", "a", "Running", rank=0, exit_code=0),
        P(11.6, "MODIFIED", "j-node-1", "b", "Running", rank=1, exit_code=0),
        P(11.9, "DELETED", "j-node-1", "b", "Running", rank=1, exit_code=0)]
    t = bs.gang_times(exited_running, jobs, "j", 2)
    assert (t["last_exit"], t["job_succeeded"]) == (11.6, 11.8)


def test_status_latencies_match_pod_rank_phase_and_attempt():
    pods, jobs = two_node_run()
    result = bs.status_latencies(pods, jobs)
    # node-0 Running 10.5 -> 10.58; node-1 Running 10.6 -> 10.7; Succeeded 11.5 and 11.7 -> 11.8
    assert result["missed"] == 0 and result["overtaken"] == 0
    assert sorted(result["latencies"]) == pytest.approx(sorted([0.08, 0.1, 0.3, 0.1]))


def test_status_latency_of_a_phase_the_status_skipped_counts_until_it_caught_up():
    pods, jobs = two_node_run()
    no_running = [j for j in jobs if j.phase != "Running" and j.phase != "Pending"] + [
        j for j in jobs if j.phase == "Pending" and not j.nodes]
    result = bs.status_latencies(pods, no_running)
    # Running (10.5, 10.6) was never listed; Succeeded at 11.8 caught up with both changes.
    assert result["missed"] == 0 and result["overtaken"] == 2
    assert sorted(result["latencies"]) == pytest.approx(sorted([1.3, 1.2, 0.3, 0.1]))


def test_status_latency_of_another_attempt_does_not_count():
    pods, jobs = two_node_run()
    wrong_attempt = [j for j in jobs if j.phase != "Succeeded"] + [
        bs.job_obs(11.8, "MODIFIED", job("j", "Succeeded", attempt=1,
                                         nodes=[(0, "j-node-0", "Succeeded"), (1, "j-node-1", "Succeeded")]))]
    result = bs.status_latencies(pods, wrong_attempt)
    assert result["missed"] == 2 and len(result["latencies"]) == 2


# -- audit log ------------------------------------------------------------------------------
USER = "system:serviceaccount:ddpjob-system:ddpjob-operator"


def audit_line(verb, resource, *, user=USER, stage="ResponseComplete", subresource=None,
               namespace="ns", name="x", start="2026-11-30T02:16:59.682061Z",
               end="2026-11-30T02:16:59.782061Z", code=201):
    ref = {"resource": resource, "namespace": namespace, "name": name}
    if subresource:
        ref["subresource"] = subresource
    return json.dumps({"stage": stage, "verb": verb, "user": {"username": user}, "objectRef": ref,
                       "responseStatus": {"code": code}, "requestReceivedTimestamp": start,
                       "stageTimestamp": end})


def test_parse_audit_keeps_the_users_completed_requests():
    lines = [
        audit_line("create", "pods"),
        audit_line("create", "pods", user="admin"),
        audit_line("watch", "pods", stage="ResponseStarted"),
        audit_line("patch", "ddpjobs", subresource="status", code=200),
        "",
        '{"truncated',
    ]
    records = bs.parse_audit(lines, USER)
    assert [r.key for r in records] == ["create pods", "patch ddpjobs/status"]
    assert [r.username for r in bs.parse_audit(lines)] == [USER, "admin", USER]  # None: everyone's
    assert records[0].completed - records[0].received == pytest.approx(0.1, abs=1e-5)  # float epochs
    assert bs.count_requests(records + records[:1]) == {"create pods": 2, "patch ddpjobs/status": 1}


def test_created_at_is_the_api_servers_receipt_of_the_create_whoever_sent_it():
    """The gang-size figures' reference: the job's create on the API server's clock, not when
    a loaded watch saw it (that made 'pods created' negative)."""
    lines = ['{"truncated',
             audit_line("create", "ddpjobs", user="admin", name="other", start="2026-11-30T02:16:58Z"),
             audit_line("create", "ddpjobs", user="admin", name="x", code=409, start="2026-11-30T02:16:58.5Z"),
             audit_line("create", "ddpjobs", user="admin", stage="ResponseStarted"),
             audit_line("create", "ddpjobs", user="admin", name="x", start="2026-11-30T02:17:00Z"),
             audit_line("create", "ddpjobs", user="admin", name="x", subresource="status")]
    everyones = bs.parse_audit(lines)
    assert bs.created_at(everyones, "ddpjobs", "ns", "x") == bs._epoch("2026-11-30T02:17:00Z")
    assert bs.created_at(everyones, "ddpjobs", "other-ns", "x") is None
    assert bs.created_at(bs.parse_audit(lines, USER), "ddpjobs", "ns", "x") is None  # only the admin created it


# -- metrics, tables ------------------------------------------------------------------------
METRICS = """\
# HELP apiserver_request_duration_seconds [STABLE] Response latency
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{verb="POST",resource="pods",le="0.1"} 3
apiserver_request_duration_seconds_sum{component="apiserver",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 1.5
apiserver_request_duration_seconds_count{component="apiserver",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 10
apiserver_request_duration_seconds_count{component="apiserver",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 7
apiserver_flowcontrol_rejected_requests_total{flow_schema="a,b",priority_level="x"} 2
"""


def test_parse_metrics_and_deltas():
    names = ["apiserver_request_duration_seconds_sum", "apiserver_request_duration_seconds_count",
             "apiserver_flowcontrol_rejected_requests_total"]
    after = bs.parse_metrics(METRICS, names)
    assert len(after) == 4  # the bucket is not asked for
    before = {k: v / 2 for k, v in after.items()}
    assert bs.metrics_delta(before, after, "apiserver_request_duration_seconds_count",
                            verb="POST", resource="pods") == 5
    assert bs.metrics_delta(before, after, "apiserver_request_duration_seconds_count",
                            resource="pods") == 8.5
    assert bs.metrics_delta({}, after, "apiserver_flowcontrol_rejected_requests_total",
                            flow_schema="a,b") == 2  # a comma inside quotes


def test_table():
    text = bs.table(["a", "b"], [(1, 0.12345), ("x", None), (2, 1234.5)])
    assert text.splitlines() == ["| a | b |", "| --- | --- |", "| 1 | 0.123 |", "| x | - |",
                                 "| 2 | 1234.5 |"]
    assert not math.isnan(bs.percentile([1.0, 2.0], 50))


def test_profile_buckets_take_the_deepest_known_frame():
    collapsed = [
        "<module> (kopf/__main__.py:1);handle (kopf/_core/a.py:3);loads (json/decoder.py:9) 6",
        "run (ddpjob/reconcile.py:5);request (urllib3/pool.py:7) 3",
        "idle (other.py:1) 1",
        "garbage",
    ]
    assert bs.profile_buckets(collapsed) == {"json": 0.6, "urllib3": 0.3, "other": 0.1}
    assert bs.profile_buckets([]) == {}


def _write(name: str, received: float, completed: float, code: int = 200) -> bs.AuditRecord:
    return bs.AuditRecord("patch", "ddpjobs/status", "ns", name, code, received, completed)


def test_status_latency_parts_split_at_the_write_that_carried_the_change():
    matches = [("a", 10.0, 10.5),   # carried by the write done at 10.45 (not the earlier one)
               ("b", 20.0, 20.3),   # b's only write
               ("c", 30.0, 30.2)]   # no write of c recorded: left out
    records = [_write("a", 9.0, 9.1), _write("a", 10.2, 10.45), _write("a", 10.6, 10.7),
               _write("b", 20.1, 20.25), _write("b", 20.12, 20.28, code=409),
               bs.AuditRecord("create", "pods", "ns", "c", 201, 29.0, 29.1)]

    parts = bs.status_latency_parts(matches, records)

    assert parts["operator"] == pytest.approx([0.2, 0.1])
    assert parts["api"] == pytest.approx([0.25, 0.15])
    assert parts["watch"] == pytest.approx([0.05, 0.05])
    for i, (_, changed, shown) in enumerate(matches[:2]):  # the parts add up to the latency
        assert sum(parts[k][i] for k in parts) == pytest.approx(shown - changed)


def test_status_latencies_name_the_job_and_times_of_each_match():
    pods, jobs = two_node_run()
    result = bs.status_latencies(pods, jobs)
    assert [shown - changed for _, changed, shown in result["matches"]] == pytest.approx(result["latencies"])
    assert {job for job, _, _ in result["matches"]} == {"j"}
