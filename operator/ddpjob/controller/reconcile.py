"""One reconcile pass of one DDPJob, top-down: parse, observe, decide, act.

observe.py gathers what the operator sees into one ``Observation``; ``decide`` (decide.py and
its policies) turns it into a ``Plan``; act.py carries the plan out, and the Kueue step of
``kueue``. This module decides nothing itself: it runs the three in order, decides again where
carrying out found what the observation could not show (a creation refused for good, another
owner's Service), and turns an error into the status and an Event.

Synchronous and free of kopf: the job's worker (workqueue.py) runs it in a thread with the pods
of the job as kopf's watch last saw them, and tests run it with a fake ``Kube``. Any API error
reaches the status (reason ReconcileError) and a Warning event: the peers' users never see
theirs (kubeflow/trainer#2713, #3666, #3671).
"""
from __future__ import annotations

import datetime as dt
import logging
from dataclasses import replace
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpjob.api import node_exclusion, spec
from ddpjob.api.status import RUNNING, STATUS_MESSAGE_LIMIT, JobStatus, shorten
from ddpjob.controller import entry_asks, kueue, metrics
from ddpjob.controller.act import (RELABELS_AT_ONCE, Acted, PostEvent, act, act_on_workload, newest_version,
                                   write_status)
from ddpjob.controller.decide import decide, decide_invalid, refuse_creation
from ddpjob.controller.kube import NOT_LEADER, ApiError, KubeApi
from ddpjob.controller.memory import Creations, ErrorBackoff, InPlaceMemory, JobMemory, ProgressPolling
from ddpjob.controller.observation import Observation, PodView, ServiceView
from ddpjob.controller.observe import Poll, observe, poll_targets, visible_pods
from ddpjob.controller.plan import Event, Plan, soonest
from ddpjob.controller.settings import OperatorSettings

__all__ = [  # what callers and tests take from here (the parts live in memory, observe, act)
    "Acted", "Creations", "ErrorBackoff", "InPlaceMemory", "JobMemory", "Parse", "Poll", "PostEvent",
    "ProgressPolling", "RELABELS_AT_ONCE", "default_parse", "poll_targets", "reconcile",
]

logger = logging.getLogger("ddpjob.controller.reconcile")

Parse = Callable[[Mapping[str, Any]], spec.DDPJob]


def default_parse(obj: Mapping[str, Any]) -> spec.DDPJob:
    from ddpjob.api.validation import parse_ddpjob  # imported late: the pure modules do not need it

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
    workloads: Sequence[kueue.WorkloadView] = (),
    services: Optional[Sequence[ServiceView]] = None,
    entry_reader: Optional[entry_asks.EntryStateReader] = None,
) -> Optional[float]:
    """Bring the job one step closer to its spec; returns seconds until a clock needs another
    pass (None: only a change will), or the retry backoff after an error. ``workloads``: the
    Kueue Workloads labelled with the job's name, as the watch last saw them (the job's own is
    the one it controls: ``kueue.standing``). ``services``: the Services labelled with the job's
    name as the watch shows them (None: no Service watch, as in tools and tests; the Service is
    then created with each gang only). ``entry_reader``: where the pods' entry points are
    asked for their state (None: the operator's shared ``entry_asks.READER``)."""
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None  # being deleted: the garbage collector takes the children
    now = now or dt.datetime.now(dt.timezone.utc)
    if _known_stale(meta, memory, now):
        return _backoff(memory, settings)
    status = memory.status if memory.status is not None else JobStatus.from_dict(body.get("status"))
    pods = visible_pods(pods, memory)
    job: Optional[spec.DDPJob] = None
    place = kueue.Standing()
    try:
        job = _parsed(body, memory, parse)
    except ValueError as exc:  # validation.InvalidDDPJob is a ValueError
        seen = Observation(pods, meta.get("generation"))
        plan = decide_invalid(status, f"invalid spec: {exc}", seen, now, uid=meta.get("uid"))
    else:
        place = _standing(job, status, workloads, settings)
        seen = observe(job, status, pods, meta.get("generation"), memory, place, settings, now, poll,
                       services, entry_reader or entry_asks.READER)
        plan = decide(job, status, seen, now, force_delete_after=settings.force_delete_after_seconds)
    try:
        acted = _carry_out(body, job, status, plan, seen, place, memory, kube, post_event, now, settings)
        if job is not None:
            written = memory.status or plan.status
            act_on_workload(job, written, pods, _standing(job, written, workloads, settings), memory, kube, now)
        requeue = _requeue_after(acted, plan, memory, now, settings)
    except ApiError as exc:
        if exc.conflict and exc.of_job_status:
            return _on_status_conflict(body, exc, memory, settings, now)
        return _on_api_error(body, exc, plan, memory, kube, settings, post_event)
    except Exception as exc:  # a bug must reach the user too, not only the operator's log
        logger.exception("%s: reconcile failed", meta.get("name"))
        metrics.RECONCILE_ERRORS.labels("bug").inc()
        return _report_error(body, ApiError(0, type(exc).__name__, str(exc), "reconcile"),
                             memory, kube, settings, post_event)
    memory.errors = ErrorBackoff()
    return requeue


def _carry_out(body: Mapping[str, Any], job: Optional[spec.DDPJob], status: JobStatus, plan: Plan,
               seen: Observation, place: kueue.Standing, memory: JobMemory, kube: KubeApi,
               post_event: PostEvent, now: dt.datetime, settings: OperatorSettings) -> Acted:
    """The plan carried out (act.py) for the pods the job's place and history call for; where
    carrying it out found what the observation did not show, decided again and carried out."""
    pods_job = job
    flavors = kueue.pod_flavors(place, bool(plan.create_ranks)) if job is not None else ()
    if flavors:  # admitted: the pods go where the admitted ResourceFlavors say (node pool labels)
        pods_job = kueue.with_flavors(job, [kube.get_resource_flavor(f) for f in flavors])
    if pods_job is not None and plan.create_ranks:  # and off the nodes the job's failures implicate
        pods_job = node_exclusion.avoiding(pods_job, plan.status.excludedNodes)
    acted = act(body, pods_job, status, plan, memory, kube, post_event, now, settings)
    if acted.refusal is not None:
        # A pod no retry can create (an admission policy, an invalid template): the job
        # fails in this same pass, from the status just written for the creation (see act).
        written = memory.status or plan.status
        refused = refuse_creation(job, written, acted.refusal, now)
        return act(body, job, written, refused, memory, kube, post_event, now, settings)
    if acted.service_in_the_way is not None:
        # The Service's name is taken by another owner (the watch did not show it): no pod
        # was created; decided again in this pass from what the creation found.
        seen = replace(seen, service=acted.service_in_the_way)
        held = decide(job, memory.status or plan.status, seen, now,
                      force_delete_after=settings.force_delete_after_seconds)
        return act(body, pods_job, memory.status or plan.status, held, memory, kube, post_event, now, settings)
    return acted


def _requeue_after(acted: Acted, plan: Plan, memory: JobMemory, now: dt.datetime,
                   settings: OperatorSettings) -> Optional[float]:
    """When the next pass is due: the plan's clocks, a Service of another owner to look at
    again, an entry state still to come, the running gang's next progress poll."""
    requeue = acted.requeue_after
    if memory.service_found is not None:  # not watched: look again soon
        requeue = soonest(requeue, settings.creation_retry_max_seconds)
    requeue = soonest(requeue, memory.in_place.recheck_after)  # an entry state still to come
    if plan.status.phase == RUNNING:
        if memory.polling.next_poll is None:  # the gang just started running: ask at the next pass
            memory.polling.next_poll = now
        requeue = soonest(requeue, (memory.polling.next_poll - now).total_seconds())
    return requeue


def _on_api_error(body: Mapping[str, Any], exc: ApiError, plan: Plan, memory: JobMemory, kube: KubeApi,
                  settings: OperatorSettings, post_event: PostEvent) -> Optional[float]:
    metrics.RECONCILE_ERRORS.labels("api").inc()
    delay = _report_error(body, exc, memory, kube, settings, post_event)
    if (delay is not None and memory.creations.of(plan.attempt).refused
            and exc.what.startswith("create pod")):
        # Pods refused for now (a quota): ask again soon, so that a lifted quota is noticed
        # in seconds; the status names the refusal meanwhile (and in a StartupTimeout).
        delay = min(delay, settings.creation_retry_max_seconds)
    return delay


def _on_status_conflict(body: Mapping[str, Any], exc: ApiError, memory: JobMemory,
                        settings: OperatorSettings, now: dt.datetime) -> float:
    """The status write found the job changed since the version the pass saw (another writer:
    a new leader while this one was stopped, a user's edit the watch had not brought yet). The
    status is a pass's first write, so nothing else of this one was done (the second write of
    the one pass that writes twice follows creations, which are idempotent). What this worker
    remembered of the status is dropped, not reported: the next pass starts from the job as
    the watch brings it: any newer version wakes the worker (workqueue.JobWorker.update), and
    the backoff is for a watch that lags."""
    metrics.RECONCILE_ERRORS.labels("conflict").inc()
    logger.info("%s: status not written, the job changed since this pass read it: %s",
                (body.get("metadata") or {}).get("name", "?"), exc.message)
    memory.stale_version = newest_version((body.get("metadata") or {}).get("resourceVersion"),
                                          memory.written_version)
    memory.stale_since = now
    memory.status, memory.written_version = None, None
    memory.errors.consecutive += 1
    return _backoff(memory, settings)


# How long passes wait for the watch to bring a job newer than a refused status write; then
# they go on with what they have (every status write is still conditional: an older view is
# refused again, never written).
STALE_WAIT_SECONDS = 30.0


def _known_stale(meta: Mapping[str, Any], memory: JobMemory, now: dt.datetime) -> bool:
    """The job as this pass has it is no newer than the version a status write was refused at
    (the refused view itself, or older): the watch has not brought the change that conflicted."""
    seen = meta.get("resourceVersion")
    if memory.stale_version is None:
        return False
    since = memory.stale_since or now
    if (seen and newest_version(seen, memory.stale_version) == memory.stale_version
            and (now - since).total_seconds() < STALE_WAIT_SECONDS):
        return True
    memory.stale_version, memory.stale_since = None, None
    return False


def _backoff(memory: JobMemory, settings: OperatorSettings) -> float:
    delay = settings.error_backoff_seconds * 2 ** (max(1, memory.errors.consecutive) - 1)
    return min(delay, settings.error_backoff_max_seconds)


def _standing(job: spec.DDPJob, status: JobStatus, workloads: Sequence[kueue.WorkloadView],
              settings: OperatorSettings) -> kueue.Standing:
    return kueue.standing(job, status, workloads,
                          manage_without_queue_name=settings.manage_jobs_without_queue_name)


def _parsed(body: Mapping[str, Any], memory: JobMemory, parse: Parse) -> spec.DDPJob:
    """The parsed job, parsed again only when it changed: a spec edit (generation), another
    object (uid) or a label edit (labels do not move the generation, and the queue label
    decides whether Kueue holds the job)."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    key = (meta.get("generation"), meta.get("uid"), tuple(sorted((str(k), str(v)) for k, v in labels.items())))
    if memory.parsed is None or memory.parsed[0] != key or key[:2] == (None, None):
        memory.parsed = (key, parse(body))
    return memory.parsed[1]


def _report_error(body: Mapping[str, Any], exc: ApiError, memory: JobMemory,
                  kube: KubeApi, settings: OperatorSettings, post_event: PostEvent) -> Optional[float]:
    """Make the error visible: status reason ReconcileError (the phase is left as it was) and a
    Warning event; then retry with an exponential backoff."""
    name = (body.get("metadata") or {}).get("name", "?")
    if exc.not_found and exc.of_job_status:
        return None  # the DDPJob itself is gone; its DELETED event stops this worker
    if exc.reason == NOT_LEADER:
        # This replica's leadership ran out mid-pass (it is about to exit): it writes nothing
        # more, not even the error (an Event would be a write too); the new leader carries on.
        logger.warning("%s: pass abandoned: %s", name, exc)
        return None
    message = shorten(f"{exc}", STATUS_MESSAGE_LIMIT)
    logger.warning("%s: reconcile error: %s", name, message)
    memory.errors.consecutive += 1
    if message != memory.errors.last_message:
        post_event(Event("Warning", "ReconcileError", message))
        memory.errors.last_message = message
    base = memory.status if memory.status is not None else JobStatus.from_dict(body.get("status"))
    errored = replace(base, reason="ReconcileError", message=message)
    if errored != base:
        try:
            write_status(body, errored, memory, kube)
        except ApiError as again:  # the API server itself is unreachable: the log has it
            logger.warning("%s: could not write the error to the status: %s", name, again)
    return _backoff(memory, settings)
