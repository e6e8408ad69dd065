"""Carrying out one pass's ``Plan``: the status first (the intent survives a crash), its
Events once it is written, then the children (deletions, the Service, the pods, in-place orders
and the kubelet-restart marks), then the job's Kueue Workload. It decides nothing: a creation
refused for good or another owner's Service in the way is returned to reconcile.py, which
decides again.
"""
from __future__ import annotations

import datetime as dt
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob import restart_orders
from ddpjob.api import goodput, model, names, spec
from ddpjob.api.status import JobStatus, shorten
from ddpjob.controller import builders, kueue, metrics, restart_key, stall_stacks
from ddpjob.controller.kube import ApiError, KubeApi
from ddpjob.controller.memory import JobMemory
from ddpjob.controller.observation import PodView, ServiceView, view_service
from ddpjob.controller.plan import Event, Plan, StacksRequest, soonest
from ddpjob.controller.settings import OperatorSettings

logger = logging.getLogger("ddpjob.controller.reconcile")

PostEvent = Callable[[Event], None]


@dataclass(frozen=True)
class Acted:
    """What carrying out a plan came to: when the next pass is due, a creation the API server
    refused for a reason no retry can fix (its message), which fails the job, and a Service of
    another owner found in the job's Service's place (no pod was created)."""

    requeue_after: Optional[float] = None
    refusal: Optional[str] = None
    service_in_the_way: Optional[ServiceView] = None


def act(body: Mapping[str, Any], job: Optional[spec.DDPJob], old: JobStatus, plan: Plan,
        memory: JobMemory, kube: KubeApi, post_event: PostEvent, now: dt.datetime,
        settings: OperatorSettings) -> Acted:
    """Carry out ``plan``: status first (the intent survives a crash), its events once it is
    written, then the children; returns when the next pass is due.

    A pod creation refused for good is returned, not decided here. The creation's status is
    written by then, so the failure that follows is a second write in the same pass, the one
    pass that writes twice: writing only the failure would mean creating pods before their
    status says so (a crash in between would delete a fresh gang as a stranger's), and leaving
    the failure to the next pass would show the job Pending until some event wakes it."""
    meta = body["metadata"]
    namespace = meta["namespace"]
    deferred = _write_plan_status(body, old, plan, memory, kube, now, settings)
    _post_events(meta, plan, post_event)
    errors = _delete_pods(namespace, plan, memory, kube, post_event)
    if job is not None and plan.ensure_service:
        in_the_way = _ensure_service(job, memory, kube, now)
        if in_the_way is not None:
            return Acted(service_in_the_way=in_the_way)
    if job is not None and plan.create_ranks:
        refusal, refused = _create_pods(job, plan, memory, kube, settings)
        if refusal is not None:
            return Acted(refusal=refusal)
        errors.extend(refused)
    if plan.restart_in_place:
        errors.extend(_order_in_place(namespace, plan, memory, kube))
    errors.extend(_write_kubelet_marks(namespace, plan, memory, kube))
    if plan.delete_job:
        kube.delete_job(namespace, meta["name"], meta.get("uid"))
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ApiError(first.status, first.reason, first.message + more, first.what)
    return Acted(requeue_after=soonest(plan.requeue_after, deferred))


def _write_plan_status(body: Mapping[str, Any], old: JobStatus, plan: Plan, memory: JobMemory,
                       kube: KubeApi, now: dt.datetime, settings: OperatorSettings) -> Optional[float]:
    """The plan's status written, unless only its progress moved within the job's
    progress_status_interval_seconds (then: the seconds until the pass that writes it)."""
    if plan.status == old:
        memory.status = old
        return None
    polling = memory.polling
    since = (now - polling.written_at).total_seconds() if polling.written_at else None
    if (_only_progress_changed(old, plan.status) and since is not None
            and since < settings.progress_status_interval_seconds):
        # Progress alone is rate-limited per job; the next pass past the interval writes it.
        memory.status = old
        metrics.PROGRESS_WRITES_DEFERRED.inc()
        return settings.progress_status_interval_seconds - since
    write_status(body, plan.status, memory, kube)
    if plan.status.progress != old.progress:
        polling.written_at = now
    if plan.status.restarts > old.restarts or plan.status.disruptions > old.disruptions:
        metrics.GANG_RESTARTS.labels(plan.status.reason).inc()
    metrics.observe_goodput(old.goodput, plan.status.goodput)
    return None


def _post_events(meta: Mapping[str, Any], plan: Plan, post_event: PostEvent) -> None:
    """The plan's Events, and a stall's stacks (read from the pods before anything touches them)."""
    stacks_event = _read_stacks(meta, plan.stacks) if plan.stacks is not None else None
    for event in plan.events:
        post_event(event)
    if stacks_event is not None:
        post_event(stacks_event)


def _delete_pods(namespace: str, plan: Plan, memory: JobMemory, kube: KubeApi,
                 post_event: PostEvent) -> list[ApiError]:
    """The plan's pods force-deleted (stuck Terminating: said in an Event) and deleted."""
    errors: list[ApiError] = []
    for pods, force in ((plan.force_delete, True), (plan.delete, False)):
        if not pods:
            continue
        if force:
            post_event(Event("Warning", "ForceDeleted",
                             f"Force-deleting {len(pods)} pod(s) stuck Terminating: "
                             + ", ".join(p.name for p in pods)))
        for outcome in kube.delete_pods(namespace, [(p.name, p.uid) for p in pods], force=force):
            if outcome.gone:
                memory.gone_uids.add(outcome.uid)
            if outcome.error is not None:
                errors.append(outcome.error)
    return errors


def _ensure_service(job: spec.DDPJob, memory: JobMemory, kube: KubeApi,
                    now: dt.datetime) -> Optional[ServiceView]:
    """The job's headless Service created; another owner's Service with its name, if the
    creation found one (never adopted, changed or deleted, and no pod is created: none could
    rendezvous; the pass decides again from it)."""
    existing = kube.create_service(builders.build_service(job))
    found = view_service(existing) if existing is not None else None
    if found is not None and found.uid and job.uid is not None and found.owner_uid != job.uid:
        memory.service_found = (found, now)
        return found
    return None


def _create_pods(job: spec.DDPJob, plan: Plan, memory: JobMemory, kube: KubeApi,
                 settings: OperatorSettings) -> tuple[Optional[str], list[ApiError]]:
    """The plan's ranks created for its attempt, each outcome remembered (``memory.creations``);
    returns the first refusal no retry can fix (its message) and the errors a retry may."""
    creations = memory.creations = memory.creations.of(plan.attempt)
    outcomes = kube.create_pods(builders.build_pods(job, plan.attempt, list(plan.create_ranks),
                                                    restart_key=restart_key.KEY,
                                                    kubelet_rules=settings.kubelet_restart_rules))
    for rank, outcome in zip(sorted(plan.create_ranks), outcomes):
        if outcome.created:
            creations.created.add(rank)
            creations.refused.pop(rank, None)
        elif outcome.error is not None:
            creations.refused[rank] = outcome.error.message or str(outcome.error)
    permanent = [o.error for o in outcomes if o.error is not None and o.error.permanent]
    if permanent:
        return permanent[0].message, []
    return None, [o.error for o in outcomes if o.error is not None]


def _write_kubelet_marks(namespace: str, plan: Plan, memory: JobMemory, kube: KubeApi) -> list[ApiError]:
    """Kubelet restarts in place: carried pods relabelled, running ones armed with the next
    attempt (once: the watch may not show a written annotation yet)."""
    arming = [p for p in plan.arm if memory.in_place.armed.get(p.uid) != p.attempt + 1]
    writes = [(p, {names.LABEL_RESTART_ATTEMPT: str(p.attempt),
                   names.LABEL_CONTAINER_RESTARTS: str(p.restarts_seen)}, None) for p in plan.adopt]
    writes += [(p, {}, {names.ANNOTATION_ATTEMPT_AT_START: str(p.attempt + 1)}) for p in arming]
    outcomes = _relabel_all(namespace, writes, kube)
    for p, failed in zip(arming, outcomes[len(plan.adopt):]):
        if not failed:
            memory.in_place.armed[p.uid] = p.attempt + 1
    return [e for failed in outcomes for e in failed]


def _only_progress_changed(old: JobStatus, new: JobStatus) -> bool:
    """Progress moved, and with it at most goodput's figures of the same segment (a new segment
    is written at once: its boundary is the pass's time)."""
    return (old.progress != new.progress and goodput.only_refreshed(old.goodput, new.goodput)
            and replace(old, progress=new.progress, goodput=new.goodput) == new)


def write_status(body: Mapping[str, Any], new: JobStatus, memory: JobMemory, kube: KubeApi) -> None:
    """``new`` written, on the condition that the job is as this pass saw it: at the newest
    resourceVersion this worker knows (the event's, or its own last write's). A 409 Conflict
    means someone wrote since: the pass stops there (reconcile drops what it remembered)."""
    meta = body["metadata"]
    # Nulls for what the new status leaves out, against both what the event showed and what
    # this worker last wrote (either may be the newer): a merge patch keeps a left-out key.
    held = memory.status.to_dict() if memory.status is not None else None
    written = kube.patch_status(meta["namespace"], meta["name"],
                                model.merge_patch(new.to_dict(), body.get("status"), held),
                                resource_version=newest_version(meta.get("resourceVersion"), memory.written_version))
    memory.status = new
    version = ((written or {}).get("metadata") or {}).get("resourceVersion")
    memory.written_version = str(version) if version else None


def newest_version(seen: Optional[str], written: Optional[str]) -> Optional[str]:
    """The newer of the event's resourceVersion and this worker's last write's. Both are etcd
    revisions, decimal and comparable (Kubernetes 1.35's comparable resource versions); one that
    is not is taken as the event's, and a wrong pick costs only a Conflict and a pass again."""
    if seen and written and str(seen).isdigit() and str(written).isdigit():
        return str(max(int(seen), int(written)))
    return str(seen) if seen else (written or None)


def _read_stacks(meta: Mapping[str, Any], request: StacksRequest) -> Event:
    """A stall's Event ``StalledStacks``: where the ranks were stuck, read from the pods before
    the pass orders, deletes or recreates them (one deadline for all of them); the full answers
    go to the log. An answer that does not come, or is not one, is said so: it never holds up
    the restart, and never fails the pass."""
    pods = request.pods
    answers: list[stall_stacks.PodStacks] = []
    if pods:
        with ThreadPoolExecutor(max_workers=len(pods)) as pool:
            fetched = list(pool.map(lambda p: restart_orders.fetch_stacks(
                p.pod_ip, contract.DEFAULT_PROGRESS_PORT, _token(meta["namespace"], p),
                restart_orders.STACKS_DEADLINE_SECONDS), pods))
        answers = [stall_stacks.PodStacks(p.name, stacks, error) for p, (stacks, error) in zip(pods, fetched)]
    message = stall_stacks.summarize(answers, request.suspect_rank)
    if not pods:
        message = shorten(message + ": no pod of the gang serves its stacks (they need restartMode InPlace "
                          "and the pod entry point)", stall_stacks.EVENT_LIMIT)
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    logger.warning("%s: stacks of the stalled gang before the restart:\n%s", name,
                   stall_stacks.log_text(answers) or "(no pod to ask)")
    return Event("Warning", stall_stacks.STALLED_STACKS, message)


def _relabel(namespace: str, p: PodView, kube: KubeApi, labels: Mapping[str, str],
             annotations: Optional[Mapping[str, str]] = None) -> list[ApiError]:
    """The pod's labels (and annotations) set, if it is still that pod: a pod gone, or another
    by that name by now, is no error (the watch brings what came instead)."""
    try:
        if annotations:
            kube.relabel_pod(namespace, p.name, p.uid, labels, annotations=annotations)
        else:
            kube.relabel_pod(namespace, p.name, p.uid, labels)
    except ApiError as exc:
        if not (exc.not_found or exc.status in (409, 422)):
            return [exc]
    return []


# Pod label/annotation writes of one pass in flight at once: a big gang's kubelet-restart
# writes (one per pod and attempt) take the time of a few dozen, not of every pod in a row,
# without taking more of the connection pool than a pass's share.
RELABELS_AT_ONCE = 8


def _relabel_all(namespace: str, writes: Sequence[tuple[PodView, Mapping[str, str], Optional[Mapping[str, str]]]],
                 kube: KubeApi) -> list[list[ApiError]]:
    """Each (pod, labels, annotations) of ``writes`` written (``_relabel``), RELABELS_AT_ONCE at
    a time; the errors of each, in order."""
    if len(writes) <= 1:
        return [_relabel(namespace, p, kube, labels, annotations) for p, labels, annotations in writes]
    with ThreadPoolExecutor(max_workers=min(len(writes), RELABELS_AT_ONCE)) as pool:
        return list(pool.map(lambda w: _relabel(namespace, w[0], kube, w[1], w[2]), writes))


def _token(namespace: str, pod: PodView) -> str:
    """The pod's restart token, made again from its nonce by the operator's key."""
    return restart_key.KEY.token(namespace, pod.name, pod.restart_nonce)


def _order_in_place(namespace: str, plan: Plan, memory: JobMemory, kube: KubeApi) -> list[ApiError]:
    """Order each pod of ``plan.restart_in_place`` into ``plan.attempt`` and relabel those that
    took it (the label then names the attempt the pod runs); a pod that did not answer, or
    refused, is deleted: the next pass creates its rank for the attempt."""
    pods = plan.restart_in_place
    with ThreadPoolExecutor(max_workers=min(len(pods), restart_orders.ORDERS_AT_ONCE)) as pool:
        taken = list(pool.map(lambda p: restart_orders.order_restart(
            p.pod_ip, contract.DEFAULT_PROGRESS_PORT, _token(namespace, p), plan.attempt,
            restart_orders.ORDER_DEADLINE_SECONDS), pods))
    errors: list[ApiError] = []
    refused = [p for p, ok in zip(pods, taken) if not ok]
    for p in (p for p, ok in zip(pods, taken) if ok):
        memory.in_place.ordered[p.uid] = plan.attempt
        memory.in_place.seen_ready.discard(p.uid)  # asked again once ready in the new attempt
        memory.in_place.asks.pop(p.uid, None)
        errors.extend(_relabel(namespace, p, kube, {names.LABEL_RESTART_ATTEMPT: str(plan.attempt)}))
    if refused:
        logger.info("%s: %d pod(s) did not take the restart order: recreating them: %s", namespace,
                    len(refused), ", ".join(p.name for p in refused))
        for outcome in kube.delete_pods(namespace, [(p.name, p.uid) for p in refused]):
            if outcome.gone:
                memory.gone_uids.add(outcome.uid)
            if outcome.error is not None:
                errors.append(outcome.error)
    return errors


def act_on_workload(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], place: kueue.Standing,
                     memory: JobMemory, kube: KubeApi, now: dt.datetime) -> None:
    """Carry out the pass's Kueue step (``kueue.plan_workload``, from the ``status`` written):
    create the job's Workload, delete a stale one (the job queues again), write what Kueue must
    learn (finished, or the quota given back after an eviction)."""
    book = memory.workload
    left = kueue.pods_of(job, [p for p in pods if p.uid not in memory.gone_uids])
    ready = kueue.gang_ready(job, status.restartAttempt, [p for p in pods if p.uid not in memory.gone_uids])
    step = kueue.plan_workload(job, status, place, book, left, now, ready)
    if step is None:
        return
    if place.workload is not None or place.namesake is not None:
        book.seen_for = job.uid
    if step.delete is not None:
        kube.delete_workload(job.namespace, step.delete.name, step.delete.uid)
    if step.create:
        priority = kube.get_workload_priority(step.priority_class) if step.priority_class else None
        kube.create_workload(kueue.build_workload(job, priority, queue=step.queue))
        book.created_for, book.seen_for = job.uid, None
    if step.status_patch is not None and place.workload is not None:
        kube.patch_workload_status(job.namespace, place.workload.name, step.status_patch)
