"""The operator's Prometheus series: present, and moved by what they count."""
from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

from ddpjob.controller import metrics
from ddpjob.controller.reconcile import JobMemory, reconcile
from ddpjob.controller.settings import OperatorSettings
from tests.support.operator_fakes import NOW, FakeKube, FakePods, at, body, parse, pods, running_status

pytestmark = pytest.mark.unit

SERIES = ("ddpjob_reconcile_total", "ddpjob_reconcile_duration_seconds", "ddpjob_reconcile_errors_total",
          "ddpjob_jobs", "ddpjob_gang_restarts_total", "ddpjob_pod_creation_latency_seconds",
          "ddpjob_api_requests_total", "ddpjob_progress_polls_total")


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_every_documented_series_is_exposed_and_on_the_page():
    text = generate_latest(REGISTRY).decode()
    page = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text(encoding="utf-8")
    for name in SERIES:
        assert f"# HELP {name}" in text, name
        assert f"`{name}" in page, f"docs/operator.md does not document {name}"


def test_jobs_by_phase_reads_the_workers_and_a_stall_counts_a_restart_by_reason():
    metrics.count_jobs_from(lambda: ["Running", "Running", "Pending"])
    assert value("ddpjob_jobs", phase="Running") == 2 and value("ddpjob_jobs", phase="Failed") == 0
    before = value("ddpjob_gang_restarts_total", reason="Stalled")
    fake = FakePods()
    fake.now = NOW
    obj = body(status=running_status().to_dict(), failurePolicy={"progressTimeoutSeconds": 60})
    kube, memory = FakeKube(), JobMemory()
    for seconds in (0, 61):
        reconcile(obj, pods(), memory, kube=kube, settings=OperatorSettings(progress_poll_seconds=1),
                  post_event=lambda e: None, now=at(seconds), parse=parse, poll=fake)
    assert value("ddpjob_gang_restarts_total", reason="Stalled") == before + 1


def test_the_endpoint_serves_the_registry():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    served = metrics.serve(port)
    assert served is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert "ddpjob_reconcile_total" in response.read().decode()
    try:
        assert metrics.serve(port) is None  # taken: logged, not fatal
        assert metrics.serve(0) is None
    finally:
        served[0].shutdown()
