"""End-to-end: live progress in the status, hang detection (Stalled -> gang restart -> the job
completes from its checkpoint), and the operator's Prometheus metrics moving as jobs run."""
from __future__ import annotations

import re
import time

import pytest

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    E2E, FINISHED, ONE_THREAD_ENV, TINY_TRAINING_ARGS, ddpjob_manifest, e2e, hanging_job,
    python_command, scrape, table_rows,
)

pytestmark = pytest.mark.cluster
TIMEOUT = 300


def kubectl_row(e2e, name: str, *flags: str) -> dict[str, str]:
    """The job's row of `kubectl get ddpjobs`."""
    _, rows = table_rows(e2e.cluster.kubectl("get", "ddpjobs", "-n", e2e.namespace, *flags).stdout)
    [row] = [r for r in rows if r["NAME"] == name]
    return row


@pytest.mark.kubelet
def test_the_trainer_reports_progress_into_the_status_and_metrics_move(e2e):
    before = scrape(e2e)
    name = "progress"
    e2e.create(ddpjob_manifest(name, e2e.image, env=ONE_THREAD_ENV,
                               args=[*TINY_TRAINING_ARGS, "--fake-size=320000", "--batch-size=16",
                                     "--epochs=1", "--log-every=5"]))
    running = e2e.wait_for_status(
        name, lambda s: s.get("phase") == "Running" and (s.get("progress") or {}).get("ranksReporting") == 2,
        TIMEOUT, what="status.progress from both ranks")
    progress = running["progress"]
    assert re.fullmatch(r"\d+/10000 \(\d+%\)", progress["summary"]), progress
    assert progress["totalSteps"] == 10000 and progress["epochs"] == 1 and progress["lastReportTime"], progress
    moved = e2e.wait_for_status(
        name, lambda s: (s.get("progress") or {}).get("step", 0) > progress["step"]
        and (s.get("progress") or {}).get("loss") is not None and (s.get("progress") or {}).get("eta"),
        TIMEOUT, what="a later step with a loss and an ETA")
    assert moved["progress"]["step"] > progress["step"]
    # What a user sees while it trains: PROGRESS and ETA in `kubectl get`, the epoch, loss and
    # throughput with -o wide, the last report's time in `kubectl describe`.
    row = kubectl_row(e2e, name)
    assert re.fullmatch(r"\d+/10000 \(\d+%\)", row["PROGRESS"]) and row["PHASE"] == "Running", row
    assert re.fullmatch(r"\d+h\d\dm|\d+m\d\ds|\d+s", row["ETA"]), row
    wide = kubectl_row(e2e, name, "-o", "wide")
    assert wide["EPOCH"] == "1" and float(wide["LOSS"]) > 0 and float(wide["THROUGHPUT"]) > 0, wide
    described = e2e.cluster.kubectl("describe", "ddpjob", name, "-n", e2e.namespace).stdout
    assert re.search(r"Last Report Time:\s+\d{4}-\d\d-\d\dT", described), described
    after = scrape(e2e)
    assert after["ddpjob_reconcile_total"] > before.get("ddpjob_reconcile_total", 0)
    assert after['ddpjob_jobs{phase="Running"}'] >= 1
    assert after['ddpjob_api_requests_total{code="201",verb="POST"}'] >= \
        before.get('ddpjob_api_requests_total{code="201",verb="POST"}', 0) + 2  # the gang's pods
    assert after["ddpjob_pod_creation_latency_seconds_count"] >= \
        before.get("ddpjob_pod_creation_latency_seconds_count", 0) + 2
    assert after['ddpjob_progress_polls_total{answered="yes"}'] > 0
    e2e.delete_job(name)


@pytest.mark.kubelet
def test_a_rank_blocked_in_a_collective_is_stalled_and_the_gang_completes_from_its_checkpoint(
        e2e, shared_host_dir):
    name = "stall"
    before = scrape(e2e).get('ddpjob_gang_restarts_total{reason="Stalled"}', 0)
    e2e.create(hanging_job(e2e, shared_host_dir, name, env=[{"name": "HANG", "value": "step"}],
                           failurePolicy={"maxRestarts": 1, "progressTimeoutSeconds": 15}))
    e2e.wait_for_phase(name, "Running", TIMEOUT)
    pods_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in e2e.pods(name)}
    status = e2e.wait_until_finished(name, TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert (status["restarts"], status["restartAttempt"]) == (1, 1), status
    # The stall restarted the gang inside the same pods (issue 22): nothing was recreated.
    assert status["failureHistory"][0]["restartMode"] == "InPlace", status["failureHistory"]
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in e2e.pods(name)} == pods_before
    stalled = e2e.wait_for_event(name, "Stalled")
    assert "no rank reported progress for" in stalled[0]["message"], stalled
    restarting = e2e.wait_for_event(name, "Restarting")
    assert "was stalled" in restarting[0]["message"], restarting
    # read from the pods before the restart: where rank 1 was stuck (issue 23, item 3)
    stacks = e2e.wait_for_event(name, "StalledStacks")
    assert stacks[0]["type"] == "Warning", stacks
    assert re.search(r"rank 1( \(suspect\))? on stall-node-1: stuck_in_collective \(hang\.py:\d+\)",
                     stacks[0]["message"]), stacks
    log = e2e.wait_for_logs(f"{name}-node-0", "finished at step 10")
    assert "rank 0 attempt 1 resumes at step 4" in log, log
    assert scrape(e2e)['ddpjob_gang_restarts_total{reason="Stalled"}'] == before + 1


# A pod that answers the progress poll one byte every half second, for ever: a per-read timeout
# never fires, the GET never ends (issue 21, item 1).
TRICKLING_POD = python_command("""
    import os, socket, threading, time
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(os.environ["DDPJOB_PROGRESS_PORT"])))
    server.listen(64)
    def trickle(connection):
        try:
            connection.recv(4096)
            for byte in b"HTTP/1.0 200 OK\\r\\n\\r\\n" + b" " * 100000:
                connection.sendall(bytes([byte]))
                time.sleep(0.5)
        except OSError:
            pass
        finally:
            connection.close()
    print("trickling", flush=True)
    while True:
        connection, _ = server.accept()
        threading.Thread(target=trickle, args=(connection,), daemon=True).start()
""")

# A pod that serves honest progress (one step a second) for 40 s, then exits 0.
HONEST_POD = python_command("""
    import json, os, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    started = time.time()
    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):
            report = {"step": int(time.time() - started), "total_steps": 40, "age_seconds": 0}
            body = json.dumps({"ranks": {"0": report}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    server = ThreadingHTTPServer(("0.0.0.0", int(os.environ["DDPJOB_PROGRESS_PORT"])), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(40)
    print("done", flush=True)
""")


def test_a_tenant_whose_pods_trickle_never_stops_another_tenants_job_from_being_polled(e2e):
    """As a hostile tenant: a 17-pod job whose pods trickle their answers (more pods than the
    operator once had poll threads), then a healthy job in another namespace that must be
    polled to survive (its first-report bound is 20 s). It is polled, shows its progress and
    finishes; the trickling job is polled too, and shows nothing."""
    other = E2E(e2e.cluster, f"{e2e.namespace[:50]}-b", e2e.image)
    e2e.cluster.kubectl("create", "namespace", other.namespace)
    try:
        e2e.cluster.wait_for(
            lambda: e2e.cluster.kubectl("get", "serviceaccount", "default", "-n", other.namespace,
                                        check=False).returncode == 0,
            30, f"ServiceAccount default in namespace {other.namespace}")
        e2e.create(ddpjob_manifest("trickle", e2e.image, nnodes=17, command=TRICKLING_POD, launcher="none"))
        e2e.wait_for_phase("trickle", "Running", TIMEOUT)
        e2e.wait_for_logs("trickle-node-16", "trickling")
        time.sleep(3)  # the trickling job's first poll is under way
        other.create(ddpjob_manifest(
            "honest", e2e.image, nnodes=1, command=HONEST_POD, launcher="none",
            failurePolicy={"maxRestarts": 0, "firstProgressTimeoutSeconds": 20, "progressTimeoutSeconds": 20}))
        reporting = other.wait_for_status(
            "honest", lambda s: (s.get("progress") or {}).get("ranksReporting") == 1 or s.get("phase") in FINISHED,
            TIMEOUT, what="the honest job's progress")
        assert reporting.get("phase") not in FINISHED, reporting
        status = other.wait_until_finished("honest", TIMEOUT)
        assert status["phase"] == "Succeeded", status
        assert status["progress"]["step"] > 0, status
        trickling = e2e.status("trickle")
        assert trickling["phase"] == "Running" and not (trickling.get("progress") or {}).get("ranksReporting"), trickling
    finally:
        e2e.cluster.kubectl("delete", "namespace", other.namespace, "--wait=false", "--ignore-not-found")
