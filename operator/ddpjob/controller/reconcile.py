"""One reconcile pass of one DDPJob: parse, decide, act, write status.

Synchronous and free of kopf: the job's worker (workqueue.py) runs it in a thread with the pods of the job as
kopf's watch last saw them, and tests run it with a fake ``Kube``. Any API error reaches the
status (reason ReconcileError) and a Warning event: the peers' users never see theirs
(kubeflow/trainer#2713, #3666, #3671).
"""
from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.controller import builders, kueue
from ddpjob.controller import metrics
from ddpjob.api import progress as progress_reports
from ddpjob.api import spec
from ddpjob.controller.decide import Event, Plan, PodView, decide, decide_invalid, refuse_creation
from ddpjob.controller.kube import ApiError, KubeApi
from ddpjob.controller.settings import OperatorSettings
from ddpjob.api.status import RUNNING, STATUS_MESSAGE_LIMIT, JobStatus
from ddpjob.controller.status import shorten

logger = logging.getLogger("ddpjob.controller.reconcile")

PostEvent = Callable[[Event], None]
Parse = Callable[[Mapping[str, Any]], spec.DDPJob]


@dataclass
class JobMemory:
    """What a job's worker remembers between passes. Losing it (an operator restart) costs
    nothing but a few idempotent requests: the status and the pods hold the truth."""

    status: Optional[JobStatus] = None  # the status last written; authoritative once set
    created: dict[int, set[int]] = field(default_factory=dict)  # attempt -> ranks created
    refused: dict[int, dict[int, str]] = field(default_factory=dict)  # attempt -> rank -> why not
    gone_uids: set[str] = field(default_factory=set)  # deleted, whatever a stale watch says
    parsed: Optional[tuple[Any, spec.DDPJob]] = None  # (generation, job)
    consecutive_errors: int = 0
    last_error: str = ""
    progress: Optional[progress_reports.GangProgress] = None  # the current attempt's reports
    next_poll: Optional[dt.datetime] = None  # when to ask the pods for progress again
    # A progress poll the pass wants, (attempt, pod IPs), for the worker to run off the
    # reconcile threads; the answers come back through poll_answers (appended by the worker,
    # taken by the next pass: a deque, whose append and popleft are thread-safe).
    poll_due: Optional[tuple[int, tuple[str, ...]]] = None
    poll_answers: deque = field(default_factory=deque)
    progress_written: Optional[dt.datetime] = None  # the last status write for progress alone
    workload_created: Optional[str] = None  # the job uid whose Kueue Workload this process created
    workload_seen: Optional[str] = None  # ... and whose Workload the watch has shown since


Poll = Callable[[Sequence[str], int, float], list]


def default_parse(obj: Mapping[str, Any]) -> spec.DDPJob:
    from ddpjob.api.schema import parse_ddpjob  # imported late: the pure modules do not need it

    return parse_ddpjob(obj)


def reconcile(
    body: Mapping[str, Any],
    pods: Sequence[PodView],
    memory: JobMemory,
    *,
    kube: KubeApi,
    settings: OperatorSettings,
    post_event: PostEvent,
    now: Optional[dt.datetime] = None,
    parse: Parse = default_parse,
    poll: Optional[Poll] = None,
    workload: Optional[kueue.WorkloadView] = None,
) -> Optional[float]:
    """Bring the job one step closer to its spec; returns seconds until a clock needs another
    pass (None: only a change will), or the retry backoff after an error. ``workload``: the
    job's Kueue Workload as the watch last saw it (only for a job that names a LocalQueue)."""
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None  # being deleted: the garbage collector takes the children
    now = now or dt.datetime.now(dt.timezone.utc)
    status = memory.status if memory.status is not None else JobStatus.from_dict(body.get("status"))
    all_uids = {p.uid for p in pods}
    memory.gone_uids &= all_uids  # forget what the watch has caught up with
    pods = [p for p in pods if p.uid not in memory.gone_uids]

    job: Optional[spec.DDPJob] = None
    try:
        job = _parsed(body, memory, parse)
    except ValueError as exc:  # schema.InvalidDDPJob is a ValueError
        plan = decide_invalid(status, f"invalid spec: {exc}", pods, now, uid=meta.get("uid"),
                              generation=meta.get("generation"))
    else:
        progress = _poll_progress(job, status, pods, memory, settings, now, poll)
        plan = decide(job, status, pods, now, generation=meta.get("generation"),
                      created_ranks=frozenset(memory.created.get(status.restartAttempt, ())),
                      creation_errors=memory.refused.get(status.restartAttempt, {}),
                      force_delete_after=settings.force_delete_after_seconds, progress=progress,
                      hold=kueue.hold(job, status, workload))
    try:
        pods_job = job
        if job is not None and plan.create_ranks and workload is not None and kueue.queue_name(job):
            # Admitted: the pods go where the admitted ResourceFlavors say (node pool labels).
            pods_job = kueue.with_flavors(job, [kube.get_resource_flavor(f) for f in workload.flavors])
        requeue = _act(body, pods_job, status, plan, memory, kube, post_event, now, settings)
        if job is not None and kueue.queue_name(job) is not None:
            _act_on_workload(job, plan, pods, workload, memory, kube, now)
        if plan.status.phase == RUNNING:
            if memory.next_poll is None:  # the gang just started running: ask at the next pass
                memory.next_poll = now
            requeue = _soonest(requeue, (memory.next_poll - now).total_seconds())
    except ApiError as exc:
        metrics.RECONCILE_ERRORS.labels("api").inc()
        delay = _report_error(body, exc, memory, kube, settings, post_event)
        if delay is not None and memory.refused.get(plan.attempt) and exc.what.startswith("create pod"):
            # Pods refused for now (a quota): ask again soon, so that a lifted quota is noticed
            # in seconds; the status names the refusal meanwhile (and in a StartupTimeout).
            delay = min(delay, settings.creation_retry_max_seconds)
        return delay
    except Exception as exc:  # a bug must reach the user too, not only the operator's log
        logger.exception("%s: reconcile failed", meta.get("name"))
        metrics.RECONCILE_ERRORS.labels("bug").inc()
        return _report_error(body, ApiError(0, type(exc).__name__, str(exc), "reconcile"),
                             memory, kube, settings, post_event)
    memory.consecutive_errors, memory.last_error = 0, ""
    return requeue


def _soonest(*delays: Optional[float]) -> Optional[float]:
    present = [max(0.0, d) for d in delays if d is not None]
    return min(present) if present else None


def _poll_progress(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], memory: JobMemory,
                   settings: OperatorSettings, now: dt.datetime,
                   poll: Optional[Poll]) -> Optional[progress_reports.GangProgress]:
    """Ask the running gang's pods for their ranks' reports, at most every
    progress_poll_seconds; returns what the current attempt has reported so far.

    With ``poll`` (tests, tools) the pods are asked here and now. Without it (the operator) the
    pass only says that a poll is due (``memory.poll_due``): the worker runs it off the
    reconcile threads, and a later pass takes the answers (the first reports of a gang wake
    the job at once; later ones wait for the pass that asks the next poll). A pass never waits
    on a pod's network: pods that cannot answer (gone, or a NetworkPolicy dropping the port)
    would otherwise hold a reconcile thread for the request timeout each, and with many jobs
    every job's status would queue behind them (benchmarks/README.md, peers)."""
    attempt = status.restartAttempt
    if memory.progress is not None and memory.progress.attempt != attempt:
        memory.progress, memory.next_poll = None, None  # a new gang: a new clock
    if memory.progress is None:
        memory.progress = progress_reports.from_status(status.progress, attempt)
    while memory.poll_answers:
        polled_attempt, answers = memory.poll_answers.popleft()
        if polled_attempt == attempt:  # an older gang's answers mean nothing now
            memory.progress = progress_reports.merge(memory.progress, attempt, answers)
    if status.phase != RUNNING:
        return memory.progress
    if memory.next_poll is None or now >= memory.next_poll:
        ips = [p.pod_ip for p in pods if p.attempt == attempt and p.ready and p.pod_ip]
        if ips and poll is not None:
            answers = poll(ips, contract.DEFAULT_PROGRESS_PORT, settings.progress_request_timeout_seconds)
            memory.progress = progress_reports.merge(memory.progress, attempt, answers)
        elif ips:
            memory.poll_due = (attempt, tuple(ips))
        memory.next_poll = now + dt.timedelta(seconds=settings.progress_poll_seconds)
    return memory.progress


def _only_progress_changed(old: JobStatus, new: JobStatus) -> bool:
    return old.progress != new.progress and replace(old, progress=new.progress) == new


def _parsed(body: Mapping[str, Any], memory: JobMemory, parse: Parse) -> spec.DDPJob:
    key = ((body.get("metadata") or {}).get("generation"), (body.get("metadata") or {}).get("uid"))
    if memory.parsed is None or memory.parsed[0] != key or key == (None, None):
        memory.parsed = (key, parse(body))
    return memory.parsed[1]


def _write_status(body: Mapping[str, Any], new: JobStatus, memory: JobMemory, kube: KubeApi) -> None:
    meta = body["metadata"]
    kube.patch_status(meta["namespace"], meta["name"], new.to_dict())
    memory.status = new


def _act(body: Mapping[str, Any], job: Optional[spec.DDPJob], old: JobStatus, plan: Plan,
         memory: JobMemory, kube: KubeApi, post_event: PostEvent, now: dt.datetime,
         settings: OperatorSettings) -> Optional[float]:
    """Carry out ``plan``: status first (the intent survives a crash), then the children.
    Returns when the next pass is due."""
    meta = body["metadata"]
    namespace = meta["namespace"]
    deferred: Optional[float] = None
    if plan.status != old:
        since = (now - memory.progress_written).total_seconds() if memory.progress_written else None
        if (_only_progress_changed(old, plan.status) and since is not None
                and since < settings.progress_status_interval_seconds):
            # Progress alone is rate-limited per job; the next pass past the interval writes it.
            memory.status = old
            deferred = settings.progress_status_interval_seconds - since
            metrics.PROGRESS_WRITES_DEFERRED.inc()
        else:
            _write_status(body, plan.status, memory, kube)
            if plan.status.progress != old.progress:
                memory.progress_written = now
            if plan.status.restarts > old.restarts:
                metrics.GANG_RESTARTS.labels(plan.status.reason).inc()
    else:
        memory.status = old
    for event in plan.events:
        post_event(event)

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

    if job is not None and plan.create_ranks:
        if plan.ensure_service:
            kube.create_service(builders.build_service(job))
        created = memory.created.setdefault(plan.attempt, set())
        refused = memory.refused.setdefault(plan.attempt, {})
        for book in (memory.created, memory.refused):
            for attempt in [a for a in book if a < plan.attempt]:
                del book[attempt]
        outcomes = kube.create_pods(builders.build_pods(job, plan.attempt, list(plan.create_ranks)))
        for rank, outcome in zip(sorted(plan.create_ranks), outcomes):
            if outcome.created:
                created.add(rank)
                refused.pop(rank, None)
            elif outcome.error is not None:
                refused[rank] = outcome.error.message or str(outcome.error)
        permanent = [o.error for o in outcomes if o.error is not None and o.error.permanent]
        if permanent:
            failed = refuse_creation(job, memory.status or plan.status, permanent[0].message, now)
            _write_status(body, failed.status, memory, kube)
            for event in failed.events:
                post_event(event)
            return failed.requeue_after  # the next pass (woken by the new pods' events) releases what was created
        errors.extend(o.error for o in outcomes if o.error is not None)

    if plan.delete_job:
        kube.delete_job(namespace, meta["name"], meta.get("uid"))
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ApiError(first.status, first.reason, first.message + more, first.what)
    return _soonest(plan.requeue_after, deferred)


def _act_on_workload(job: spec.DDPJob, plan: Plan, pods: Sequence[PodView],
                     workload: Optional[kueue.WorkloadView], memory: JobMemory, kube: KubeApi,
                     now: dt.datetime) -> None:
    """Create the job's Workload if the watch has not shown it yet (once per job: "already
    exists" is success), and write what Kueue must learn: finished, or the quota given back
    after an eviction once no pod is left."""
    status = memory.status or plan.status
    if workload is not None:
        memory.workload_seen = job.uid
    elif not status.terminal and (memory.workload_created != job.uid or memory.workload_seen == job.uid):
        # Not created by this process yet, or seen and gone since (someone deleted it: the
        # gang has been stopped, as Kueue does, and queues again with a new Workload).
        klass = kueue.priority_class(job)
        priority = kube.get_workload_priority(klass) if klass else None
        kube.create_workload(kueue.build_workload(job, priority))
        memory.workload_created, memory.workload_seen = job.uid, None
    left = kueue.pods_of(job, [p for p in pods if p.uid not in memory.gone_uids])
    update = kueue.workload_status_update(job, status, workload, left, now)
    if update is not None and workload is not None:
        kube.patch_workload_status(job.namespace, workload.name, update)


def _report_error(body: Mapping[str, Any], exc: ApiError, memory: JobMemory,
                  kube: KubeApi, settings: OperatorSettings, post_event: PostEvent) -> Optional[float]:
    """Make the error visible: status reason ReconcileError (the phase is left as it was) and a
    Warning event; then retry with an exponential backoff."""
    name = (body.get("metadata") or {}).get("name", "?")
    if exc.not_found and exc.what.startswith("patch status"):
        return None  # the DDPJob itself is gone; its DELETED event stops this worker
    message = shorten(f"{exc}", STATUS_MESSAGE_LIMIT)
    logger.warning("%s: reconcile error: %s", name, message)
    memory.consecutive_errors += 1
    if message != memory.last_error:
        post_event(Event("Warning", "ReconcileError", message))
        memory.last_error = message
    base = memory.status if memory.status is not None else JobStatus.from_dict(body.get("status"))
    errored = replace(base, reason="ReconcileError", message=message)
    if errored != base:
        try:
            _write_status(body, errored, memory, kube)
        except ApiError as again:  # the API server itself is unreachable: the log has it
            logger.warning("%s: could not write the error to the status: %s", name, again)
    delay = settings.error_backoff_seconds * 2 ** (memory.consecutive_errors - 1)
    return min(delay, settings.error_backoff_max_seconds)
