"""The operator's Prometheus metrics, served at ``:$DDPJOB_OPERATOR_METRICS_PORT/metrics``.

prometheus_client's default registry (so the process and Python collectors come too). The other
modules only call the small functions below; docs/operator.md ("Metrics") lists every series.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from ddpjob.api.status import PHASES, RESTARTING_TIME, TRAINING_TIME, Goodput

logger = logging.getLogger(__name__)

RECONCILES = Counter("ddpjob_reconcile_total", "Reconcile passes run.")
RECONCILE_SECONDS = Histogram(
    "ddpjob_reconcile_duration_seconds", "Duration of one reconcile pass (its API requests included).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
RECONCILE_ERRORS = Counter(
    "ddpjob_reconcile_errors_total", "Reconcile passes that ended in an error (kind: api, bug, or conflict: "
    "a status write refused because the job changed since the pass read it).", ["kind"])
GANG_RESTARTS = Counter(
    "ddpjob_gang_restarts_total", "Gang restarts, by the status reason (RetryableFailure, Stalled).", ["reason"])
POD_CREATION_SECONDS = Histogram(
    "ddpjob_pod_creation_latency_seconds", "Time from the operator's pod POST to the API server's answer.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
API_REQUESTS = Counter(
    "ddpjob_api_requests_total", "Kubernetes API requests the operator made itself (not kopf's watches), "
    "by verb and HTTP status code (0: no answer).", ["verb", "code"])
PROGRESS_POLLS = Counter(
    "ddpjob_progress_polls_total", "Progress GETs to pods (no API server request), by whether the pod "
    "answered.", ["answered"])
PROGRESS_WRITES_DEFERRED = Counter(
    "ddpjob_progress_status_writes_deferred_total",
    "Progress-only status writes held back by DDPJOB_OPERATOR_PROGRESS_STATUS_INTERVAL_SECONDS.")

RESTART_SECONDS = Histogram(
    "ddpjob_gang_restart_duration_seconds",
    "Time a gang restart cost: from the failure seen to the next attempt's first progress report "
    "(status.goodput.lastRestartSeconds).",
    buckets=(1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600))

LEADER = Gauge(
    "ddpjob_leader", "1 while this replica holds the leader Lease and reconciles; 0 while it stands by.")


class _JobsByPhase:
    """``ddpjob_jobs{phase}``: the jobs this operator reconciles, by the phase it last wrote."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[str]] = lambda: ()

    def collect(self):
        family = GaugeMetricFamily("ddpjob_jobs", "DDPJobs by status.phase.", labels=["phase"])
        counts = {phase: 0 for phase in PHASES}
        for phase in self.source():
            if phase in counts:
                counts[phase] += 1
        for phase, count in counts.items():
            family.add_metric([phase], count)
        yield family


JOBS_BY_PHASE = _JobsByPhase()
REGISTRY.register(JOBS_BY_PHASE)


class _GoodputByJob:
    """``ddpjob_job_goodput_ratio{namespace,name}``: each job's status.goodput.ratio, as last
    written, for the jobs this operator reconciles (a job's series goes with its worker)."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[tuple[str, str, Optional[Goodput]]]] = lambda: ()

    def collect(self):
        family = GaugeMetricFamily(
            "ddpjob_job_goodput_ratio", "Share of the job's wall time spent training (status.goodput.ratio).",
            labels=["namespace", "name"])
        for namespace, name, goodput in self.source():
            if goodput is not None:
                family.add_metric([namespace, name], goodput.ratio)
        yield family


GOODPUT_BY_JOB = _GoodputByJob()
REGISTRY.register(GOODPUT_BY_JOB)


def goodput_from(source: Callable[[], Iterable[tuple[str, str, Optional[Goodput]]]]) -> None:
    """Where ``ddpjob_job_goodput_ratio`` reads each job's goodput (the operator's workers)."""
    GOODPUT_BY_JOB.source = source


def observe_goodput(old: Optional[Goodput], new: Optional[Goodput]) -> None:
    """A status write that ended a restart (the next attempt reported): its duration observed."""
    if (old is not None and new is not None and old.segment == RESTARTING_TIME
            and new.segment == TRAINING_TIME and new.lastRestartSeconds is not None):
        RESTART_SECONDS.observe(new.lastRestartSeconds)


def count_jobs_from(source: Callable[[], Iterable[str]]) -> None:
    """Where ``ddpjob_jobs`` reads the phases (the operator's workers)."""
    JOBS_BY_PHASE.source = source


def serve(port: int) -> Optional[object]:
    """Start the /metrics endpoint; a port in use is logged, not fatal (metrics are optional)."""
    if port <= 0:
        return None
    try:
        return start_http_server(port)
    except OSError as error:
        logger.warning("metrics endpoint not started on port %s: %s", port, error)
        return None
