"""The three ways benchmarks/peers.py runs the same workload, as pure data: what a user applies
for an ``nnodes``-node job, how its pods name their job and rank, and how its status reads.

- ``ddpjob``: a DDPJob (this project's operator).
- ``pytorchjob``: Kubeflow's PyTorchJob (training-operator v1.8.1) with ``nnodes`` Worker
  replicas and ``restartPolicy: ExitCode`` (its documented policy for retrying a killed
  process, 128+n, and failing on an error exit). No Master replica: with one, the operator
  gives every worker an init container that polls ``nslookup`` for the master (alpine image),
  and the test bed's node agent runs only a pod's first container. Without a Master the
  operator does the same work per pod (a pod and a Service each), and the job succeeds when
  every worker has.
- ``indexedjob``: what Kubernetes does with no operator: a headless Service plus a batch/v1
  Job with ``completionMode: Indexed`` and ``parallelism = completions = nnodes``; the rank is
  the completion index (downward API), the master is ``<job>-0.<service>``. The Job
  controller inside kube-controller-manager does the work; ``restartPolicy: Never`` so that a
  failed pod is replaced by the controller, not restarted in place.

Pure functions of plain data, unit tested in tests/unit/test_peer_systems.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

IMAGE = "python:3.11-slim"  # the test bed ignores images; a real cluster would pull it
NO_NODE = {"bench.ddpjob.dev/no-such-node": "true"}  # pods that stay Pending
MASTER_PORT = 29500


@dataclass(frozen=True)
class PodSeen:
    """One watch event of a pod of a benchmarked job, stamped ``t`` on the benchmark's clock."""

    t: float
    event: str
    name: str
    uid: str
    job: str
    rank: int
    phase: str
    deleting: bool
    exit_code: Optional[int] = None  # the container's, once it terminated


@dataclass(frozen=True)
class JobSeen:
    """One watch event of a benchmarked job: its phase and what its status counts."""

    t: float
    event: str
    name: str
    phase: str  # Pending, Running, Restarting, Succeeded, Failed
    running: int  # pods the status counts as running or done (Running + Succeeded)
    succeeded: int


@dataclass(frozen=True)
class System:
    key: str
    title: str
    api_path: str  # the job collection, "{ns}" for the namespace
    resource: str  # for kubectl delete
    job_label: str
    rank_label: str
    manifests: Callable[..., list[dict]]
    job_state: Callable[[Mapping[str, Any]], tuple[str, int, int]]


# ---------------------------------------------------------------------------------------------
# What the user applies
# ---------------------------------------------------------------------------------------------
def ddpjob_manifests(name: str, namespace: str, nnodes: int, command: Sequence[str], *,
                     pending: bool = False, restarts: int = 0) -> list[dict]:
    spec: dict[str, Any] = {"nnodes": nnodes, "image": IMAGE, "command": list(command), "shmSize": "64Mi",
                            "startupTimeoutSeconds": 600}
    if pending:
        spec["template"] = {"spec": {"nodeSelector": dict(NO_NODE)}}
    if restarts:
        # Recreate, as the peers do: the recovery rows compare replacing a killed rank's pod.
        # (A command of its own under InPlace is restarted in its pod by the kubelet instead;
        # benchmarks/restart_modes.py measures in-place restarts.)
        spec["failurePolicy"] = {"maxRestarts": restarts, "restartMode": "Recreate"}
    return [{"apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob",
             "metadata": {"name": name, "namespace": namespace}, "spec": spec}]


def pytorchjob_manifests(name: str, namespace: str, nnodes: int, command: Sequence[str], *,
                         pending: bool = False, restarts: int = 0) -> list[dict]:
    pod_spec: dict[str, Any] = {"containers": [{"name": "pytorch", "image": IMAGE, "command": list(command)}]}
    if pending:
        pod_spec["nodeSelector"] = dict(NO_NODE)
    spec: dict[str, Any] = {"pytorchReplicaSpecs": {"Worker": {
        "replicas": nnodes, "restartPolicy": "ExitCode", "template": {"spec": pod_spec}}}}
    if restarts:
        spec["runPolicy"] = {"backoffLimit": restarts}
    return [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
             "metadata": {"name": name, "namespace": namespace}, "spec": spec}]


def indexed_job_manifests(name: str, namespace: str, nnodes: int, command: Sequence[str], *,
                          pending: bool = False, restarts: int = 0) -> list[dict]:
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    env = [{"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}},
           {"name": "WORLD_SIZE", "value": str(nnodes)},
           {"name": "MASTER_ADDR", "value": f"{name}-0.{name}"},
           {"name": "MASTER_PORT", "value": str(MASTER_PORT)}]
    pod_spec: dict[str, Any] = {"subdomain": name, "restartPolicy": "Never",
                                "containers": [{"name": "worker", "image": IMAGE, "command": list(command),
                                                "env": env}]}
    if pending:
        pod_spec["nodeSelector"] = dict(NO_NODE)
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                        "selector": {"batch.kubernetes.io/job-name": name}}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
           "spec": {"completionMode": "Indexed", "completions": nnodes, "parallelism": nnodes,
                    "backoffLimit": restarts, "template": {"spec": pod_spec}}}
    return [service, job]


# ---------------------------------------------------------------------------------------------
# How their status reads
# ---------------------------------------------------------------------------------------------
def _true_conditions(status: Mapping[str, Any]) -> list[str]:
    return [c.get("type", "") for c in status.get("conditions") or () if c.get("status") == "True"]


def ddpjob_state(job: Mapping[str, Any]) -> tuple[str, int, int]:
    status = job.get("status") or {}
    phase = status.get("phase") or "Pending"
    if status.get("unlistedNodes"):  # a gang of more than 64: status.nodes lists 64, the counts are whole
        from ddpjob.api.status import parse_rank_ranges

        succeeded = len(parse_rank_ranges(status.get("succeededRanks") or "", int(status.get("nnodes") or 0)))
        return phase, int(status.get("readyNodes") or 0) + succeeded, succeeded
    phases = [n.get("phase") for n in status.get("nodes") or ()]
    return (phase, sum(p in ("Running", "Succeeded") for p in phases), sum(p == "Succeeded" for p in phases))


def pytorchjob_state(job: Mapping[str, Any]) -> tuple[str, int, int]:
    status = job.get("status") or {}
    replicas = (status.get("replicaStatuses") or {}).values()
    active = sum(int(r.get("active") or 0) for r in replicas)
    succeeded = sum(int(r.get("succeeded") or 0) for r in replicas)
    true = _true_conditions(status)
    phase = next((p for p in ("Succeeded", "Failed", "Restarting", "Running") if p in true), "Pending")
    return phase, active + succeeded, succeeded


def indexed_job_state(job: Mapping[str, Any]) -> tuple[str, int, int]:
    status = job.get("status") or {}
    true = _true_conditions(status)
    ready, succeeded = int(status.get("ready") or 0), int(status.get("succeeded") or 0)
    if "Complete" in true:
        phase = "Succeeded"
    elif "Failed" in true:
        phase = "Failed"
    else:
        phase = "Running" if ready else "Pending"
    return phase, ready + succeeded, succeeded


SYSTEMS = {
    "ddpjob": System("ddpjob", "DDPJob", "/apis/ddpjob.dev/v1alpha1/namespaces/{ns}/ddpjobs", "ddpjobs",
                     "ddpjob.dev/job-name", "ddpjob.dev/node-rank", ddpjob_manifests, ddpjob_state),
    "pytorchjob": System("pytorchjob", "PyTorchJob", "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs",
                         "pytorchjobs", "training.kubeflow.org/job-name", "training.kubeflow.org/replica-index",
                         pytorchjob_manifests, pytorchjob_state),
    "indexedjob": System("indexedjob", "Indexed Job", "/apis/batch/v1/namespaces/{ns}/jobs", "jobs",
                         "batch.kubernetes.io/job-name", "batch.kubernetes.io/job-completion-index",
                         indexed_job_manifests, indexed_job_state),
}


def collection_path(manifest: Mapping[str, Any]) -> str:
    """Where to POST one of the manifests above."""
    api, kind = manifest["apiVersion"], manifest["kind"]
    ns = manifest["metadata"]["namespace"]
    plural = {"DDPJob": "ddpjobs", "PyTorchJob": "pytorchjobs", "Job": "jobs", "Service": "services"}[kind]
    prefix = "/api/v1" if api == "v1" else f"/apis/{api}"
    return f"{prefix}/namespaces/{ns}/{plural}"


def pod_seen(system: System, t: float, event: str, pod: Mapping[str, Any]) -> Optional[PodSeen]:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        job, rank = labels[system.job_label], int(labels[system.rank_label])
    except (KeyError, ValueError):
        return None
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or [{}]
    terminated = (containers[0].get("state") or {}).get("terminated") or {}
    return PodSeen(t=t, event=event, name=meta.get("name", ""), uid=meta.get("uid", ""), job=job, rank=rank,
                   phase=status.get("phase") or "Pending", deleting=meta.get("deletionTimestamp") is not None,
                   exit_code=terminated.get("exitCode"))


def job_seen(system: System, t: float, event: str, job: Mapping[str, Any]) -> JobSeen:
    phase, running, succeeded = system.job_state(job)
    return JobSeen(t=t, event=event, name=(job.get("metadata") or {}).get("name", ""), phase=phase,
                   running=running, succeeded=succeeded)


# ---------------------------------------------------------------------------------------------
# Figures from what the watch saw
# ---------------------------------------------------------------------------------------------
TERMINAL = ("Succeeded", "Failed")


def milestones(pods: Sequence[PodSeen], jobs: Sequence[JobSeen], job: str, nnodes: int) -> dict[str, Optional[float]]:
    """When one job (not restarted) reached each milestone, on the watch's clock."""
    mine = sorted((p for p in pods if p.job == job), key=lambda p: p.t)

    def last(predicate) -> Optional[float]:
        first: dict[str, float] = {}
        for p in mine:
            if p.uid not in first and predicate(p):
                first[p.uid] = p.t
        return max(first.values()) if len(first) >= nnodes else None

    js = [j for j in jobs if j.name == job]
    return {"job_added": min((j.t for j in js), default=None),
            "all_created": last(lambda p: True),
            "all_running": last(lambda p: p.phase == "Running" or p.phase in TERMINAL),
            # a container with restart rules of its own shows its exit before the pod's phase
            "last_exit": last(lambda p: p.phase in TERMINAL or p.exit_code is not None),
            "job_finished": min((j.t for j in js if j.phase in TERMINAL), default=None)}


def status_lags(pods: Sequence[PodSeen], jobs: Sequence[JobSeen]) -> list[float]:
    """For every pod that the watch saw reach Running and Succeeded: the time until its job's
    status counted that many pods running (or done) / succeeded. The peers' statuses count
    pods, not name them, so the k-th pod of a job to reach a phase is matched with the first
    status that counts k; a status seen a hair before the pod event (the controller's watch
    won the race) gives a small negative lag, kept as measured."""
    by_job: dict[str, list[JobSeen]] = {}
    for j in sorted(jobs, key=lambda j: j.t):
        by_job.setdefault(j.name, []).append(j)
    reached: dict[tuple[str, str], set[str]] = {}
    lags = []
    for p in sorted(pods, key=lambda p: p.t):
        if p.event == "DELETED":
            continue
        for kind, hit in (("running", p.phase in ("Running", "Succeeded")), ("succeeded", p.phase == "Succeeded")):
            done = reached.setdefault((p.job, kind), set())
            if not hit or p.uid in done:
                continue
            done.add(p.uid)
            need = len(done)
            shown = next((j.t for j in by_job.get(p.job, ()) if getattr(j, kind) >= need), None)
            if shown is not None:
                lags.append(shown - p.t)
    return lags


def gang_replaced(pods: Mapping[str, PodSeen], job: str, nnodes: int, victim_rank: int, victim_uid: str) -> bool:
    """Every rank of ``job`` has a Running pod again, the killed one a new pod (``pods``: the
    live pods by uid)."""
    running = {p.rank: p.uid for p in pods.values() if p.job == job and p.phase == "Running" and not p.deleting}
    return len(running) >= nnodes and running.get(victim_rank) not in (None, victim_uid)
