"""Operator settings, read once from the environment (prefix ``DDPJOB_OPERATOR_``).

Namespace scoping is kopf's ``--namespace`` / ``--all-namespaces`` flag; the ``ddpjob-operator``
command (handlers.main) also reads it from ``DDPJOB_OPERATOR_NAMESPACES``, so the Deployment
can scope the operator by setting one variable.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Mapping, Optional

ENV_PREFIX = "DDPJOB_OPERATOR_"
BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class OperatorSettings:
    create_workers: int = 32
    """Threads that create/delete pods at once: a 256-pod gang is 256 overlapping POSTs,
    never 256 sequential round trips (the API server, not the operator, is the limit)."""
    reconcile_workers: int = 8
    """Threads running reconcile passes (one pass per job at a time; many jobs in parallel)."""
    coalesce_seconds: float = 0.05
    """At most one pass per job in this long: an event during a burst waits for the rest of the
    window, so a gang that changes at once costs about one pass and one status write per window,
    not one per pod; the first event after a quiet spell is handled at once."""
    force_delete_after_seconds: float = 60.0
    """A pod still Terminating this long after its deletionTimestamp (which already includes the
    grace period) is force-deleted with grace 0: its node is gone and will never confirm
    (kubeflow/trainer#2072: jobs stuck Restarting forever behind such a pod)."""
    error_backoff_seconds: float = 1.0
    """First retry delay after a reconcile error; doubles per consecutive error."""
    error_backoff_max_seconds: float = 60.0
    creation_retry_max_seconds: float = 5.0
    """Longest wait between retries while the API server refuses a gang's pods for a reason an
    administrator can lift (a ResourceQuota): nothing else tells the operator it was lifted
    (watching quotas would need rights over every namespace's), so it keeps asking, often."""
    request_timeout_seconds: float = 30.0
    """Timeout of each Kubernetes API request the operator makes itself."""
    progress_poll_seconds: float = 10.0
    """How often the operator asks each running pod for its ranks' progress reports (an HTTP
    GET to the pod, no API request). Also the resolution of hang detection."""
    progress_status_interval_seconds: float = 30.0
    """Per job, the least time between two status writes that only refresh status.progress:
    the API cost of progress is at most 60 / this many requests per job per minute."""
    progress_request_timeout_seconds: float = 2.0
    """Deadline of one progress GET to a pod, for the whole request (connect, send, the whole
    answer), not per read: a pod that trickles its answer is cut off at it."""
    manage_jobs_without_queue_name: bool = False
    """Kueue's ``manageJobsWithoutQueueName`` for DDPJobs: a job without the label
    ``kueue.x-k8s.io/queue-name`` is queued in the LocalQueue named ``default`` of its namespace
    (the name Kueue's LocalQueueDefaulting uses), and waits ``Queued`` while there is none, so
    no DDPJob bypasses Kueue (docs/kueue.md). A job that was already running when this was
    turned on is left alone. false: such a job runs without Kueue."""
    kubelet_restart_rules: bool = True
    """A command of your own (no pod entry point) under restartMode InPlace gets the kubelet's
    container restart rules (Kubernetes 1.35+), so a retryable exit restarts the container in
    its pod, and the operator carries such pods into the next attempt (docs/operator.md,
    "In-place restarts"). false: such pods are recreated, as before the rules existed."""
    metrics_port: int = 8081
    """Port of the Prometheus endpoint (/metrics); 0 turns it off."""
    kubeconfig: Optional[str] = None
    """Kubeconfig for the operator's own requests (default: in-cluster, then $KUBECONFIG)."""
    namespaces: str = ""
    """``ddpjob-operator`` only: comma-separated namespaces to serve; empty: all namespaces."""
    liveness_endpoint: str = "http://0.0.0.0:8080/healthz"
    """``ddpjob-operator`` only: kopf's liveness endpoint (the Deployment's probe)."""
    leader_election: bool = True
    """Act only while holding the leader Lease (docs/operator.md, "High availability"), so that
    several replicas can run and one acts. false: act at once, alone (run one replica only)."""
    pod_name: str = ""
    """This replica's identity in the Lease (the Deployment sets it from the pod's name); empty:
    the host name and a random suffix, a new identity for every process."""
    lease_namespace: str = ""
    """Namespace of the Lease; empty: the pod's own (its service account's), else ddpjob-system."""
    lease_name: str = "ddpjob-operator"
    lease_duration_seconds: int = 15
    """How long a standby waits, after it last saw the leader renew, before taking over."""
    renew_deadline_seconds: float = 10.0
    """How long the leader keeps acting without a successful renewal; then it exits."""
    retry_period_seconds: float = 2.0
    """How often the leader renews and a standby looks (client-go's timings: 15, 10, 2)."""


def load_settings(environ: Optional[Mapping[str, str]] = None) -> OperatorSettings:
    """Settings from ``DDPJOB_OPERATOR_<FIELD_NAME_UPPERCASE>`` variables; a bad value is an error
    that names the variable (the operator should refuse to start, not guess)."""
    env = os.environ if environ is None else environ
    values = {}
    for f in fields(OperatorSettings):
        name = ENV_PREFIX + f.name.upper()
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        kind = type(f.default) if f.default is not None else str
        if kind is bool:
            if raw.strip().lower() not in BOOLEANS:
                raise ValueError(f"{name}: expected true or false, got {raw!r}")
            values[f.name] = BOOLEANS[raw.strip().lower()]
            continue
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(f"{name}: expected {kind.__name__}, got {raw!r}") from None
        if isinstance(value, (int, float)) and value <= 0 and f.name not in ("force_delete_after_seconds", "metrics_port"):
            raise ValueError(f"{name}: must be > 0, got {raw!r}")
        if isinstance(value, (int, float)) and value < 0:
            raise ValueError(f"{name}: must be >= 0, got {raw!r}")
        values[f.name] = value
    settings = OperatorSettings(**values)
    _check_lease_timings(settings)
    return settings


def _check_lease_timings(settings: OperatorSettings) -> None:
    """client-go's two rules: a leader must give up before a standby may take over, and must
    get more than one try at renewing before it gives up."""
    duration, deadline, period = (settings.lease_duration_seconds, settings.renew_deadline_seconds,
                                  settings.retry_period_seconds)
    if not duration > deadline:
        raise ValueError(f"{ENV_PREFIX}LEASE_DURATION_SECONDS ({duration}) must be greater than "
                         f"{ENV_PREFIX}RENEW_DEADLINE_SECONDS ({deadline:g})")
    if not deadline > 1.2 * period:
        raise ValueError(f"{ENV_PREFIX}RENEW_DEADLINE_SECONDS ({deadline:g}) must be greater than 1.2 x "
                         f"{ENV_PREFIX}RETRY_PERIOD_SECONDS ({period:g})")
