"""Kueue: a DDPJob that names a LocalQueue is admitted as one unit (pure functions).

The operator is Kueue's "external framework" for DDPJobs (docs/kueue.md says why this route and
not Kueue's pod groups): for a DDPJob labelled ``kueue.x-k8s.io/queue-name`` it creates a
``kueue.x-k8s.io/v1beta2`` Workload, owned by the DDPJob, with one PodSet of ``nnodes`` pods (the
pod template's requests). Until Kueue admits that Workload, the job holds no pod at all (phase
``Queued``). What the operator then does is what Kueue's own job reconciler does for the
frameworks built into Kueue (sigs.k8s.io/kueue v0.17 pkg/controller/jobframework/reconciler.go):

* admitted (``Admitted`` True, not evicted): create the gang (the normal path);
* evicted (``Evicted`` True: preempted, deactivated, ...): stop the gang gracefully (pods
  deleted, SIGTERM, the trainer saves a checkpoint), and once no pod is left clear the
  Workload's admission (``QuotaReserved`` False, reason Pending; ``Requeued``), so Kueue queues
  it again. The next admission creates the next attempt, which resumes from the checkpoint;
* finished (Succeeded/Failed): set the Workload's ``Finished`` condition, which releases its
  quota at once.

Plain data in, plain data out; reconcile.py does the requests.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

from ddpjob.api import names
from ddpjob.api import spec
from ddpjob.api.status import SUCCEEDED, JobStatus
from ddpjob.controller import builders
from ddpjob.controller.status import format_time

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"  # the storage version of Kueue v0.15+; v1beta1 is still served
WORKLOAD_PLURAL = "workloads"
#: The label that puts a job in a LocalQueue (the same for every Kueue-managed kind).
QUEUE_LABEL = f"{GROUP}/queue-name"
#: The label that names a WorkloadPriorityClass (Kueue's convention for its own frameworks).
PRIORITY_LABEL = f"{GROUP}/priority-class"
WORKLOAD_PRIORITY_CLASS_KIND = "WorkloadPriorityClass"
POD_SET_NAME = "node"
# Condition types and reasons of a Workload (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"
# Evictions after which Kueue's own reconciler marks the Workload Requeued=True.
_REQUEUE_REASONS = ("Preempted", "NodeFailures")


def queue_name(job: spec.DDPJob) -> Optional[str]:
    """The LocalQueue the job names, or None: a job without the label is not Kueue's."""
    return (job.labels or {}).get(QUEUE_LABEL) or None


def priority_class(job: spec.DDPJob) -> Optional[str]:
    return (job.labels or {}).get(PRIORITY_LABEL) or None


def workload_name(job: spec.DDPJob) -> str:
    """``ddpjob-<job>``: at most 60 characters (job names are at most 53)."""
    return f"ddpjob-{job.name}"


@dataclass(frozen=True)
class WorkloadView:
    """What the operator needs of its Workload (kept in the operator's workload index)."""

    name: str
    uid: str
    owner_uid: Optional[str] = None
    generation: int = 0
    resource_version: str = ""
    conditions: tuple[Mapping[str, Any], ...] = ()
    has_admission: bool = False
    cluster_queue: str = ""
    deleting: bool = False
    flavors: tuple[str, ...] = ()  # the ResourceFlavors admitted for the pod set, sorted

    def condition(self, type_: str) -> Optional[Mapping[str, Any]]:
        return next((c for c in self.conditions if c.get("type") == type_), None)

    def is_true(self, type_: str) -> bool:
        cond = self.condition(type_)
        return cond is not None and cond.get("status") == "True"


def view_workload(obj: Mapping[str, Any]) -> WorkloadView:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    owner = next((o.get("uid") for o in meta.get("ownerReferences") or ()
                  if o.get("kind") == names.KIND and o.get("controller")), None)
    admission = status.get("admission") or {}
    return WorkloadView(
        name=str(meta.get("name", "")), uid=str(meta.get("uid", "")), owner_uid=owner,
        generation=int(meta.get("generation") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        conditions=tuple(dict(c) for c in status.get("conditions") or ()),
        has_admission=bool(admission), cluster_queue=str(admission.get("clusterQueue") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        flavors=tuple(sorted({str(f) for a in admission.get("podSetAssignments") or ()
                              if a.get("name") == POD_SET_NAME for f in (a.get("flavors") or {}).values()})))


def build_workload(job: spec.DDPJob, priority: Optional[int] = None) -> dict[str, Any]:
    """The Workload of a queued job: one PodSet of nnodes pods shaped like rank 0's pod (every
    pod of a gang asks for the same resources), so Kueue reserves quota for the whole gang."""
    pod = builders.build_pod(job, 0, 0)
    template = {"metadata": {"labels": {names.LABEL_JOB_NAME: job.name}}, "spec": pod["spec"]}
    wl_spec: dict[str, Any] = {
        "queueName": queue_name(job),
        "podSets": [{"name": POD_SET_NAME, "count": job.spec.nnodes, "template": template}],
    }
    klass = priority_class(job)
    if klass:
        # Kueue's webhook does not fill priority in; its CEL rule wants it with the reference.
        wl_spec["priorityClassRef"] = {"group": GROUP, "kind": WORKLOAD_PRIORITY_CLASS_KIND, "name": klass}
        wl_spec["priority"] = int(priority or 0)
    meta: dict[str, Any] = {"name": workload_name(job), "namespace": job.namespace,
                            "labels": {names.LABEL_JOB_NAME: job.name}}
    if job.uid:
        meta["ownerReferences"] = [builders.owner_reference(job)]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload", "metadata": meta, "spec": wl_spec}


def with_flavors(job: spec.DDPJob, flavors: Sequence[Mapping[str, Any]]) -> spec.DDPJob:
    """The job as its pods are built once admitted: the admitted ResourceFlavors' ``nodeLabels``
    added to the pods' nodeSelector and their ``tolerations`` to the pods' tolerations, as
    Kueue's job reconciler does for its own kinds (a flavor per node pool). Kueue chose
    flavors that agree with the template's own nodeSelector, so the template's keys win."""
    labels: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for flavor in flavors:
        fspec = flavor.get("spec") or {}
        labels.update(fspec.get("nodeLabels") or {})
        tolerations.extend(t for t in fspec.get("tolerations") or () if t not in tolerations)
    if not labels and not tolerations:
        return job
    tmpl = job.spec.template.spec
    merged = replace(tmpl, nodeSelector={**labels, **dict(tmpl.nodeSelector)},
                     tolerations=tuple(tmpl.tolerations) + tuple(t for t in tolerations if t not in tmpl.tolerations))
    template = replace(job.spec.template, spec=merged)
    return replace(job, spec=replace(job.spec, template=template))


@dataclass(frozen=True)
class Hold:
    """The job may not have pods now: ``reason`` and ``message`` for its status."""

    reason: str
    message: str


def hold(job: spec.DDPJob, status: JobStatus, workload: Optional[WorkloadView]) -> Optional[Hold]:
    """Whether Kueue keeps the job from running (None: no queue, finished, or admitted)."""
    queue = queue_name(job)
    if queue is None or status.terminal:
        return None
    where = f"LocalQueue {queue}"
    if workload is None:
        return Hold("Queued", f"queued in {where}: creating Workload {workload_name(job)}")
    if job.uid is not None and workload.owner_uid != job.uid:
        return Hold("Queued", f"queued in {where}: Workload {workload.name} belongs to another "
                    "object (a deleted namesake's, going by garbage collection)")
    if workload.is_true(EVICTED):
        cond = workload.condition(EVICTED) or {}
        reason = "Preempted" if cond.get("reason") == "Preempted" else "Evicted"
        return Hold(reason, f"evicted by Kueue ({cond.get('reason')}: {cond.get('message', '')}); "
                    f"the gang is stopped and waits in {where} again")
    if workload.is_true(ADMITTED) and not workload.deleting:
        return None
    cond = workload.condition(QUOTA_RESERVED) or {}
    why = cond.get("message") or "waiting for Kueue"
    return Hold("Queued", f"queued in {where} (Workload {workload.name}, {job.spec.nnodes} pod(s) as "
                f"one unit): {why}")


def workload_status_update(job: spec.DDPJob, status: JobStatus, workload: Optional[WorkloadView],
                           pods_left: int, now: dt.datetime) -> Optional[dict[str, Any]]:
    """The Workload status to write after this pass (the body of a merge patch that carries
    the observed resourceVersion, so a write over a newer Kueue update fails and is retried),
    or None.

    A finished job sets ``Finished`` (Kueue releases the quota at once). An evicted job whose
    pods are all gone gives its reservation back, as Kueue's job reconciler does
    (``UnsetQuotaReservationWithCondition`` + ``SetRequeuedCondition``): Kueue then queues it
    again."""
    if queue_name(job) is None or workload is None or workload.deleting:
        return None
    if job.uid is not None and workload.owner_uid != job.uid:
        return None
    conditions = list(workload.conditions)
    if status.terminal:
        if workload.is_true(FINISHED):
            return None
        succeeded = status.phase == SUCCEEDED
        _set(conditions, FINISHED, True, "Succeeded" if succeeded else "Failed",
             f"DDPJob {job.name} {'succeeded' if succeeded else 'failed'}: {status.reason}",
             workload.generation, now)
        return _patch(workload, {"conditions": conditions})
    if workload.is_true(EVICTED) and pods_left == 0 and (workload.has_admission or workload.is_true(QUOTA_RESERVED)):
        evicted = workload.condition(EVICTED) or {}
        message = str(evicted.get("message") or "evicted")
        _set(conditions, REQUEUED, evicted.get("reason") in _REQUEUE_REASONS,
             str(evicted.get("reason") or "Evicted"), message, workload.generation, now)
        _set(conditions, QUOTA_RESERVED, False, "Pending", message, workload.generation, now)
        if workload.is_true(ADMITTED):
            _set(conditions, ADMITTED, False, "NoReservation", "The workload has no reservation",
                 workload.generation, now)
        return _patch(workload, {"conditions": conditions, "admission": None})
    return None


def _patch(workload: WorkloadView, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": workload.resource_version}, "status": status}


def _set(conditions: list[Mapping[str, Any]], type_: str, value: bool, reason: str, message: str,
         generation: int, now: dt.datetime) -> None:
    """apimachinery's SetStatusCondition: lastTransitionTime moves only when status flips."""
    text = "True" if value else "False"
    for i, cond in enumerate(conditions):
        if cond.get("type") == type_:
            moved = cond.get("status") != text
            conditions[i] = {**cond, "status": text, "reason": reason, "message": message[:32768],
                             "observedGeneration": generation,
                             "lastTransitionTime": format_time(now) if moved else cond.get("lastTransitionTime")}
            return
    conditions.append({"type": type_, "status": text, "reason": reason, "message": message[:32768],
                       "observedGeneration": generation, "lastTransitionTime": format_time(now)})


def pods_of(job: spec.DDPJob, pods: Sequence[Any]) -> int:
    """How many pods the job still owns (an evicted job gives its quota back at zero)."""
    return sum(1 for p in pods if job.uid is None or p.owner_uid == job.uid)
