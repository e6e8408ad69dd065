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
  quota at once;
* running: keep the Workload's ``PodsReady`` condition, which Kueue's ``waitForPodsReady``
  reads (``pods_ready_condition``, generatePodsReadyCondition's rules): False ``WaitForStart``
  until every pod of the gang is ready, True ``Started``; False ``WaitForRecovery`` while a pod
  is not (a restart in place, whose pods' readiness drops for its seconds), True ``Recovered``
  again. Without it Kueue would evict every DDPJob after ``waitForPodsReady.timeout``;
* changed (``standing``): a Workload that no longer describes the pods the job would create
  (nnodes, the pod template, the LocalQueue: a queued job edited, a suspended one reshaped) is
  deleted once the job has no pod left and a new one is created, i.e. the job queues again, as
  Kueue does when a job's pod sets no longer match its Workload (``EnsureOneWorkload``). A job
  that names no LocalQueue any more gives its Workload up the same way (or marks it Finished
  when it ends): what Kueue admitted is always released, whatever the labels say now.

Which Workload is the job's: the one whose controller ownerReference is the job's uid. Others
that carry the job's label are ignored, never deleted or patched.

Plain data in, plain data out (``pod_flavors`` and ``plan_workload`` are a pass's Kueue steps);
reconcile.py does the requests.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

from ddpjob.api import names
from ddpjob.api import spec
from ddpjob.api.status import CREATED, SUCCEEDED, JobStatus, format_time
from ddpjob.controller import builders

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"  # the storage version of Kueue v0.15+; v1beta1 is still served
WORKLOAD_PLURAL = "workloads"
#: The label that puts a job in a LocalQueue (the same for every Kueue-managed kind).
QUEUE_LABEL = f"{GROUP}/queue-name"
#: The label that names a WorkloadPriorityClass (Kueue's convention for its own frameworks).
PRIORITY_LABEL = f"{GROUP}/priority-class"
WORKLOAD_PRIORITY_CLASS_KIND = "WorkloadPriorityClass"
POD_SET_NAME = "node"
#: The LocalQueue of a job without the queue label when the operator manages every DDPJob
#: (``manage_jobs_without_queue_name``): the name Kueue's LocalQueueDefaulting uses.
DEFAULT_LOCAL_QUEUE = "default"
#: On the Workload: the fingerprint (``spec.pod_spec_hash``) of the spec its pod set was built
#: from, so that any pod-shaping edit (not only nnodes or requests) is noticed.
POD_SPEC_HASH_ANNOTATION = f"{names.API_GROUP}/pod-spec-hash"
# Condition types and reasons of a Workload (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"
PODS_READY = "PodsReady"
WAIT_FOR_START, WAIT_FOR_RECOVERY, STARTED, RECOVERED = "WaitForStart", "WaitForRecovery", "Started", "Recovered"
_NOT_READY = "Not all pods are ready or succeeded"
_WAITING_FOR_RECOVERY = "At least one pod has failed, waiting for recovery"
_READY = "All pods reached readiness and the workload is running"
# Evictions after which Kueue's own reconciler marks the Workload Requeued=True.
_REQUEUE_REASONS = ("Preempted", "NodeFailures")


def queue_name(job: spec.DDPJob) -> Optional[str]:
    """The LocalQueue the job's label names, or None."""
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
    queue_name: str = ""  # spec.queueName
    pod_count: Optional[int] = None  # the count of the pod set "node" (None: no such pod set)
    pod_spec_hash: str = ""  # POD_SPEC_HASH_ANNOTATION ("" on a Workload of an older operator)

    def condition(self, type_: str) -> Optional[Mapping[str, Any]]:
        return next((c for c in self.conditions if c.get("type") == type_), None)

    def is_true(self, type_: str) -> bool:
        cond = self.condition(type_)
        return cond is not None and cond.get("status") == "True"


def view_workload(obj: Mapping[str, Any]) -> WorkloadView:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    admission = status.get("admission") or {}
    wl_spec = obj.get("spec") or {}
    pod_sets = [ps for ps in wl_spec.get("podSets") or () if isinstance(ps, Mapping)]
    count = pod_sets[0].get("count") if len(pod_sets) == 1 and pod_sets[0].get("name") == POD_SET_NAME else None
    return WorkloadView(
        name=str(meta.get("name", "")), uid=str(meta.get("uid", "")), owner_uid=builders.owner_uid(meta),
        generation=int(meta.get("generation") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        conditions=tuple(dict(c) for c in status.get("conditions") or ()),
        has_admission=bool(admission), cluster_queue=str(admission.get("clusterQueue") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        flavors=tuple(sorted({str(f) for a in admission.get("podSetAssignments") or ()
                              if a.get("name") == POD_SET_NAME for f in (a.get("flavors") or {}).values()})),
        queue_name=str(wl_spec.get("queueName") or ""),
        pod_count=count if isinstance(count, int) and not isinstance(count, bool) else None,
        pod_spec_hash=str((meta.get("annotations") or {}).get(POD_SPEC_HASH_ANNOTATION) or ""))


def build_workload(job: spec.DDPJob, priority: Optional[int] = None,
                   queue: Optional[str] = None) -> dict[str, Any]:
    """The Workload of a queued job: one PodSet of nnodes pods shaped like rank 0's pod (every
    pod of a gang asks for the same resources), so Kueue reserves quota for the whole gang.
    ``queue``: the LocalQueue (``Standing.queue``; default: the job's label)."""
    pod = builders.build_pod(job, 0, 0)
    template = {"metadata": {"labels": {names.LABEL_JOB_NAME: job.name}}, "spec": pod["spec"]}
    wl_spec: dict[str, Any] = {
        "queueName": queue or queue_name(job),
        "podSets": [{"name": POD_SET_NAME, "count": job.spec.nnodes, "template": template}],
    }
    klass = priority_class(job)
    if klass:
        # Kueue's webhook does not fill priority in; its CEL rule wants it with the reference.
        wl_spec["priorityClassRef"] = {"group": GROUP, "kind": WORKLOAD_PRIORITY_CLASS_KIND, "name": klass}
        wl_spec["priority"] = int(priority or 0)
    meta: dict[str, Any] = {"name": workload_name(job), "namespace": job.namespace,
                            "labels": {names.LABEL_JOB_NAME: job.name},
                            "annotations": {POD_SPEC_HASH_ANNOTATION: spec.pod_spec_hash(job.spec)}}
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


@dataclass(frozen=True)
class Standing:
    """Where the job stands with Kueue in this pass (``standing``)."""

    queue: Optional[str] = None  # the LocalQueue it is queued in (its label, or the default); None: none
    workload: Optional[WorkloadView] = None  # its own Workload (controlled by the job's uid)
    namesake: Optional[WorkloadView] = None  # a Workload with its Workload's name that is not its own
    stale: Optional[str] = None  # why its own Workload no longer describes the job, or None


def started(status: JobStatus) -> bool:
    """Whether the job has ever had a gang (a running job is never queued after the fact)."""
    return status.restartAttempt > 0 or status.is_true(CREATED) or status.terminal


def standing(job: spec.DDPJob, status: JobStatus, workloads: Sequence[WorkloadView], *,
             manage_without_queue_name: bool = False) -> Standing:
    """Which Workload is the job's, which LocalQueue it is queued in, and whether that Workload
    still describes it.

    The queue: the job's label; without it, with ``manage_without_queue_name`` (the operator's
    setting, Kueue's ``manageJobsWithoutQueueName``), the LocalQueue named ``default`` in the
    job's namespace (Kueue's LocalQueueDefaulting), but only for a job that has a Workload
    already or has never had a gang: turning the setting on never stops a running job.

    Stale (re-queue: ``plan_workload`` deletes it once no pod is left and creates a new one):
    the job is suspended (``spec.suspend``: a stopped job holds no quota; resumed, it queues
    again, as Kueue's own job kinds do), or it is queued nowhere now, or in another LocalQueue,
    or the pods it would create (the
    next attempt's, from the spec; while an attempt runs, that attempt's, as recorded in the
    status) are not the Workload's pod set (count, or the spec's fingerprint)."""
    own = [w for w in workloads if job.uid is None or w.owner_uid == job.uid]
    workload = next((w for w in own if w.name == workload_name(job)), own[0] if own else None)
    namesake = next((w for w in workloads if w not in own and w.name == workload_name(job)), None)
    queue = queue_name(job)
    if queue is None and manage_without_queue_name and (workload is not None or not started(status)):
        queue = DEFAULT_LOCAL_QUEUE
    return Standing(queue=queue, workload=workload, namesake=namesake,
                    stale=None if workload is None else _stale(job, status, workload, queue))


def _stale(job: spec.DDPJob, status: JobStatus, workload: WorkloadView, queue: Optional[str]) -> Optional[str]:
    if job.spec.suspend:
        return f"the job is suspended: Workload {workload.name} gives its quota back"
    if queue is None:
        return f"the job names no LocalQueue any more (Workload {workload.name} was in {workload.queue_name})"
    if queue != workload.queue_name:
        return f"the job moved from LocalQueue {workload.queue_name} to {queue}"
    if status.is_true(CREATED) and not status.terminal and status.podSpecHash:
        nnodes, shape = status.nnodes, status.podSpecHash  # the running attempt's own shape
    else:
        nnodes, shape = job.spec.nnodes, spec.pod_spec_hash(job.spec)
    if workload.pod_count != nnodes:
        return (f"Workload {workload.name} was admitted for {workload.pod_count} pod(s), "
                f"the job now has {nnodes}")
    if workload.pod_spec_hash and workload.pod_spec_hash != shape:
        return f"the pod template changed since Workload {workload.name} was built"
    return None


def hold(job: spec.DDPJob, status: JobStatus, place: Standing) -> Optional[Hold]:
    """Whether Kueue keeps the job from running (None: not queued, finished, or admitted)."""
    queue, workload = place.queue, place.workload
    if queue is None or status.terminal:
        return None
    where = f"LocalQueue {queue}"
    if place.stale is not None:
        return Hold("Queued", f"queued in {where}: {place.stale}: queueing again with a new Workload")
    if workload is None:
        if place.namesake is not None:
            return Hold("Queued", f"queued in {where}: Workload {place.namesake.name} belongs to another "
                        "object (a deleted namesake's, going by garbage collection)")
        return Hold("Queued", f"queued in {where}: creating Workload {workload_name(job)}")
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


@dataclass
class WorkloadBook:
    """A job worker's memory of its Workload: whose Workload this process created, and whether
    the watch has shown it since (so one that disappears is told from one not seen yet)."""

    created_for: Optional[str] = None  # the job uid whose Workload this process created
    seen_for: Optional[str] = None  # ... and whose Workload the watch has shown since


@dataclass(frozen=True)
class WorkloadPlan:
    """What one pass does about a queued job's Workload, after the job's own plan."""

    create: bool = False  # create it: not created by this process yet, or seen and gone since
    queue: Optional[str] = None  # ... in this LocalQueue
    delete: Optional[WorkloadView] = None  # delete this one (stale, no pod left): the job queues again
    priority_class: Optional[str] = None  # ... with this WorkloadPriorityClass's value (a read)
    status_patch: Optional[dict[str, Any]] = None  # what Kueue must learn (workload_status_update)


def pod_flavors(place: Standing, creating: bool) -> tuple[str, ...]:
    """The ResourceFlavors whose node labels and tolerations go on the pods a pass creates
    (``with_flavors``): those Kueue admitted the gang on; none for a job Kueue does not queue."""
    if not creating or place.workload is None or place.queue is None or place.stale is not None:
        return ()
    return place.workload.flavors


def plan_workload(job: spec.DDPJob, status: JobStatus, place: Standing, book: WorkloadBook,
                  pods_left: int, now: dt.datetime, pods_ready: bool = False) -> Optional[WorkloadPlan]:
    """What to do about the job's Workload once the pass has written ``status`` (None: the job
    is not queued and owns no Workload). It is created if the watch has not shown it (once per
    job: "already exists" is success), or again when it was seen and is gone since (someone
    deleted it, or this operator did because it was stale: the gang has been stopped, as Kueue
    does, and queues again with a new Workload). A stale one is deleted once no pod of the job
    is left (the quota stays reserved while pods of what it admitted still exist). A suspended
    job has none: it queues again when resumed."""
    workload = place.workload
    if place.queue is None and workload is None:
        return None
    create = (place.queue is not None and workload is None and place.namesake is None
              and not status.terminal and not job.spec.suspend and (book.created_for != job.uid or book.seen_for == job.uid))
    delete = (workload if workload is not None and place.stale is not None and not workload.deleting
              and not status.terminal and pods_left == 0 else None)
    return WorkloadPlan(create=create, queue=place.queue if create else None, delete=delete,
                        priority_class=priority_class(job) if create else None,
                        status_patch=None if delete else workload_status_update(
                            job, status, workload, pods_left, now, pods_ready))


def workload_status_update(job: spec.DDPJob, status: JobStatus, workload: Optional[WorkloadView],
                           pods_left: int, now: dt.datetime, pods_ready: bool = False) -> Optional[dict[str, Any]]:
    """The Workload status to write after this pass (the body of a merge patch that carries
    the observed resourceVersion, so a write over a newer Kueue update fails and is retried),
    or None.

    A finished job sets ``Finished`` (Kueue releases the quota at once). An evicted job whose
    pods are all gone gives its reservation back, as Kueue's job reconciler does
    (``UnsetQuotaReservationWithCondition`` + ``SetRequeuedCondition``): Kueue then queues it
    again. Whatever the job's labels say now: what was admitted is released."""
    if workload is None or workload.deleting:
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
        if workload.condition(PODS_READY) is not None:  # the next admission's pods start over
            _set(conditions, PODS_READY, False, WAIT_FOR_START, _NOT_READY, workload.generation, now)
        return _patch(workload, {"conditions": conditions, "admission": None})
    wanted = pods_ready_condition(workload, pods_ready)
    if wanted is not None:
        _set(conditions, PODS_READY, *wanted, workload.generation, now)
        return _patch(workload, {"conditions": conditions})
    return None


def pods_ready_condition(workload: WorkloadView, pods_ready: bool) -> Optional[tuple[bool, str, str]]:
    """The ``PodsReady`` condition (status, reason, message) the Workload should have, when it
    differs from what it has; None otherwise. Kueue's generatePodsReadyCondition
    (pkg/controller/jobframework/reconciler.go), with one saving: no condition is written where
    there is none and it would say WaitForStart, which Kueue's workload controller reads the
    same as none (admittedNotReadyWorkload); that write would cost every job a request. An
    evicted Workload is left alone: its gang is being stopped."""
    current = workload.condition(PODS_READY)
    reason = str((current or {}).get("reason") or "")
    if workload.is_true(ADMITTED) and workload.is_true(EVICTED):
        return None
    if not workload.is_true(ADMITTED):
        wanted = (False, WAIT_FOR_START, _NOT_READY)  # a readmission starts over
    elif pods_ready:
        wanted = (True, RECOVERED if reason in (WAIT_FOR_RECOVERY, RECOVERED) else STARTED, _READY)
    elif current is not None and (current.get("status") == "True" or reason == WAIT_FOR_RECOVERY):
        wanted = (False, WAIT_FOR_RECOVERY, _WAITING_FOR_RECOVERY)
    else:
        wanted = (False, WAIT_FOR_START, _NOT_READY)
    if current is None:
        return wanted if wanted[1] != WAIT_FOR_START else None
    if current.get("status") == ("True" if wanted[0] else "False") and reason == wanted[1]:
        return None
    return wanted


def gang_ready(job: spec.DDPJob, attempt: int, pods: Sequence[Any]) -> bool:
    """Kueue's ``PodsReady`` for a DDPJob: every node of the attempt has a pod that is Ready
    (its container's readiness: the entry point's ``/ready`` where it serves one) or Succeeded,
    as Kueue counts a batch Job's ready and succeeded pods against its parallelism."""
    ranks = {p.node_rank for p in pods
             if p.attempt == attempt and (job.uid is None or p.owner_uid == job.uid) and not p.deleting
             and ((p.phase == "Running" and p.container_ready) or p.phase == "Succeeded")}
    return len(ranks) >= job.spec.nnodes


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
