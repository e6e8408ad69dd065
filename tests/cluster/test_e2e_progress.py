"""End-to-end: live progress in the status, hang detection (Stalled -> gang restart -> the job
completes from its checkpoint), and the operator's Prometheus metrics moving as jobs run."""
from __future__ import annotations

import re
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests.support.progress_jobs import HANGING_SCRIPT
from tests.testbed import kind as kind_target
from tests.testbed.operator_runner import operator_environment, render_manifests

from .e2e_support import (  # noqa: F401 - e2e is a fixture
    ONE_THREAD_ENV, TINY_TRAINING_ARGS, ddpjob_manifest, e2e, hostpath_volume, prepare_shared_dir,
    table_rows,
)

pytestmark = pytest.mark.cluster
TIMEOUT = 300


def scrape(e2e) -> dict[str, float]:
    """The operator's /metrics, as {series with labels: value}. On the test bed the operator is a
    host process on the Deployment's port; on kind, through the API server's proxy to the
    metrics Service in manifests/operator.yaml (what a Prometheus in the cluster scrapes)."""
    if e2e.local:
        port = operator_environment(render_manifests())["DDPJOB_OPERATOR_METRICS_PORT"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    else:
        text = e2e.core.connect_get_namespaced_service_proxy_with_path(
            "ddpjob-operator-metrics:metrics", "ddpjob-system", "metrics")
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^(ddpjob_[^ ]+) ([0-9.eE+-]+)$", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


def kubectl_row(e2e, name: str, *flags: str) -> dict[str, str]:
    """The job's row of `kubectl get ddpjobs`."""
    _, rows = table_rows(e2e.cluster.kubectl("get", "ddpjobs", "-n", e2e.namespace, *flags).stdout)
    [row] = [r for r in rows if r["NAME"] == name]
    return row


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


def test_a_rank_blocked_in_a_collective_is_stalled_and_the_gang_completes_from_its_checkpoint(
        e2e, shared_host_dir):
    if not e2e.local and kind_target.shared_dir() is None:
        pytest.skip("the script is handed over through a host folder every node mounts "
                    "($DDPJOB_KIND_SHARED_DIR, set by scripts/e2e-kind.sh)")
    prepare_shared_dir(e2e, shared_host_dir)
    Path(shared_host_dir, "hang.py").write_text(textwrap.dedent(HANGING_SCRIPT))
    name = "stall"
    before = scrape(e2e).get('ddpjob_gang_restarts_total{reason="Stalled"}', 0)
    e2e.create(ddpjob_manifest(
        name, e2e.image, args=["--script", "/shared/hang.py"],
        env=[*ONE_THREAD_ENV, {"name": "CKPT", "value": "/shared/ckpt"}, {"name": "HANG", "value": "step"}],
        volumeMounts=[{"name": "shared", "mountPath": "/shared"}],
        template={"spec": {"volumes": [hostpath_volume("shared", shared_host_dir)],
                           "terminationGracePeriodSeconds": 2}},
        failurePolicy={"maxRestarts": 1, "progressTimeoutSeconds": 15}))
    status = e2e.wait_until_finished(name, TIMEOUT)
    assert status["phase"] == "Succeeded", status
    assert (status["restarts"], status["restartAttempt"]) == (1, 1), status
    stalled = e2e.wait_for_event(name, "Stalled")
    assert "no rank reported progress for" in stalled[0]["message"], stalled
    restarting = e2e.wait_for_event(name, "Restarting")
    assert "was stalled" in restarting[0]["message"], restarting
    log = e2e.wait_for_logs(f"{name}-node-0", "finished at step 10")
    assert "rank 0 attempt 1 resumes at step 4" in log, log
    assert scrape(e2e)['ddpjob_gang_restarts_total{reason="Stalled"}'] == before + 1
