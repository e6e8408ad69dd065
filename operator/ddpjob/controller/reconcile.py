"""One reconcile pass of one DDPJob: parse, observe, decide, act.

The pass gathers what the operator saw into one ``decide.Observation``, takes the ``Plan`` that
``decide`` returns and the Kueue steps of ``kueue``, and carries them out: it decides nothing
itself. The status is written first, its Events once the write succeeded, then the children.

Synchronous and free of kopf: the job's worker (workqueue.py) runs it in a thread with the pods
of the job as kopf's watch last saw them, and tests run it with a fake ``Kube``. Any API error
reaches the status (reason ReconcileError) and a Warning event: the peers' users never see
theirs (kubeflow/trainer#2713, #3666, #3671).
"""
from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob import restart_orders
from ddpjob.controller import builders, entry_asks, kueue, progress, stall_stacks
from ddpjob.controller import metrics
from ddpjob.api import goodput, model, node_exclusion
from ddpjob.api import progress as progress_reports
from ddpjob.api import spec
from ddpjob.api.status import RUNNING, STATUS_MESSAGE_LIMIT, JobStatus, shorten
from ddpjob.api import names
from ddpjob.controller.decide import decide, decide_invalid, refuse_creation
from ddpjob.controller.observation import Observation, PodView, ServiceView, view_service
from ddpjob.controller.plan import Event, Plan, StacksRequest, is_ours, soonest
from ddpjob.controller.kube import NOT_LEADER, ApiError, KubeApi
from ddpjob.controller.settings import OperatorSettings

logger = logging.getLogger("ddpjob.controller.reconcile")

PostEvent = Callable[[Event], None]
Parse = Callable[[Mapping[str, Any]], spec.DDPJob]


@dataclass
class Creations:
    """The pods of one attempt this process asked the API server for."""

    attempt: int = 0
    created: set[int] = field(default_factory=set)  # ranks created (the watch may not show them yet)
    refused: dict[int, str] = field(default_factory=dict)  # rank -> why the API server refused it

    def of(self, attempt: int) -> "Creations":
        """This attempt's creations (none yet if the record is another attempt's)."""
        return self if attempt == self.attempt else Creations(attempt)


@dataclass
class ProgressPolling:
    """The current attempt's progress reports and the polls of its pods that bring them.

    A poll the pass wants, (attempt, the pods to ask), is left in ``due`` for the worker to run off the
    reconcile threads; the answers come back through ``answers`` (appended by the worker, taken
    by the next pass: a deque, whose append and popleft are thread-safe)."""

    reports: Optional[progress_reports.GangProgress] = None
    next_poll: Optional[dt.datetime] = None  # when to ask the pods again
    due: Optional[tuple[int, tuple[progress.Target, ...]]] = None
    answers: deque = field(default_factory=deque)
    written_at: Optional[dt.datetime] = None  # the last status write that changed status.progress


@dataclass
class ErrorBackoff:
    """Consecutive failed passes (the retry delay doubles with each) and the last error announced."""

    consecutive: int = 0
    last_message: str = ""


@dataclass
class JobMemory:
    """What a job's worker remembers between passes. Losing it (an operator restart) costs
    nothing but a few idempotent requests: the status and the pods hold the truth."""

    status: Optional[JobStatus] = None  # the status last written; authoritative once set
    parsed: Optional[tuple[Any, spec.DDPJob]] = None  # ((generation, uid, labels), job)
    gone_uids: set[str] = field(default_factory=set)  # deleted, whatever a stale watch says
    creations: Creations = field(default_factory=Creations)
    polling: ProgressPolling = field(default_factory=ProgressPolling)
    workload: kueue.WorkloadBook = field(default_factory=kueue.WorkloadBook)
    errors: ErrorBackoff = field(default_factory=ErrorBackoff)
    # A Service not the job's that a creation found with the job's name, and when: what the
    # pass knows of it when the Service watch does not show it (it lacks the job label). It is
    # looked at again (a creation, a GET) every creation_retry_max_seconds.
    service_found: Optional[tuple[ServiceView, dt.datetime]] = None
    in_place: "InPlaceMemory" = field(default_factory=lambda: InPlaceMemory())


@dataclass
class InPlaceMemory:
    """In-place restarts: the pods seen ready (a pod whose readiness drops after that is asked
    what happened), and the pods ordered into a new attempt whose relabelling the watch may not
    show yet (uid -> attempt)."""

    seen_ready: set[str] = field(default_factory=set)
    ordered: dict[str, int] = field(default_factory=dict)
    # Kubelet restarts: the attempt-at-start annotation written to each pod (uid -> value), so
    # that passes before the watch shows it do not write it again.
    armed: dict[str, int] = field(default_factory=dict)
    # The last GET /attempt of each pod (uid -> ask), open or answered (entry_asks), and when the
    # pass wants the job back for an open one (seconds; None: it does not).
    asks: dict[str, entry_asks.Ask] = field(default_factory=dict)
    recheck_after: Optional[float] = None
    # Wakes the job's worker (any thread): an ask answered after its pass went on.
    wake: Optional[Callable[[], None]] = None


@dataclass(frozen=True)
class Acted:
    """What carrying out a plan came to: when the next pass is due, a creation the API server
    refused for a reason no retry can fix (its message), which fails the job, and a Service of
    another owner found in the job's Service's place (no pod was created)."""

    requeue_after: Optional[float] = None
    refusal: Optional[str] = None
    service_in_the_way: Optional[ServiceView] = None


Poll = Callable[[Sequence[progress.Target], int, float], list]


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
    status = memory.status if memory.status is not None else JobStatus.from_dict(body.get("status"))
    all_uids = {p.uid for p in pods}
    memory.gone_uids &= all_uids  # forget what the watch has caught up with
    pods = _as_ordered([p for p in pods if p.uid not in memory.gone_uids], memory.in_place)

    job: Optional[spec.DDPJob] = None
    place = kueue.Standing()
    try:
        job = _parsed(body, memory, parse)
    except ValueError as exc:  # validation.InvalidDDPJob is a ValueError
        plan = decide_invalid(status, f"invalid spec: {exc}", Observation(pods, meta.get("generation")),
                              now, uid=meta.get("uid"))
    else:
        place = _standing(job, status, workloads, settings)
        seen = _observe(job, status, pods, meta.get("generation"), memory, place, settings, now, poll,
                        services, entry_reader or entry_asks.READER)
        plan = decide(job, status, seen, now, force_delete_after=settings.force_delete_after_seconds)
    try:
        pods_job = job
        flavors = kueue.pod_flavors(place, bool(plan.create_ranks)) if job is not None else ()
        if flavors:  # admitted: the pods go where the admitted ResourceFlavors say (node pool labels)
            pods_job = kueue.with_flavors(job, [kube.get_resource_flavor(f) for f in flavors])
        if pods_job is not None and plan.create_ranks:  # and off the nodes the job's failures implicate
            pods_job = node_exclusion.avoiding(pods_job, plan.status.excludedNodes)
        acted = _act(body, pods_job, status, plan, memory, kube, post_event, now, settings)
        if acted.refusal is not None:
            # A pod no retry can create (an admission policy, an invalid template): the job
            # fails in this same pass, from the status just written for the creation (see _act).
            written = memory.status or plan.status
            refused = refuse_creation(job, written, acted.refusal, now)
            acted = _act(body, job, written, refused, memory, kube, post_event, now, settings)
        elif acted.service_in_the_way is not None:
            # The Service's name is taken by another owner (the watch did not show it): no pod
            # was created; decided again in this pass from what the creation found.
            seen = replace(seen, service=acted.service_in_the_way)
            held = decide(job, memory.status or plan.status, seen, now,
                          force_delete_after=settings.force_delete_after_seconds)
            acted = _act(body, pods_job, memory.status or plan.status, held, memory, kube, post_event, now,
                         settings)
        requeue = acted.requeue_after
        if memory.service_found is not None:  # not watched: look again soon
            requeue = soonest(requeue, settings.creation_retry_max_seconds)
        requeue = soonest(requeue, memory.in_place.recheck_after)  # an entry state still to come
        if job is not None:
            written = memory.status or plan.status
            _act_on_workload(job, written, pods, _standing(job, written, workloads, settings), memory, kube, now)
        if plan.status.phase == RUNNING:
            if memory.polling.next_poll is None:  # the gang just started running: ask at the next pass
                memory.polling.next_poll = now
            requeue = soonest(requeue, (memory.polling.next_poll - now).total_seconds())
    except ApiError as exc:
        metrics.RECONCILE_ERRORS.labels("api").inc()
        delay = _report_error(body, exc, memory, kube, settings, post_event)
        if (delay is not None and memory.creations.of(plan.attempt).refused
                and exc.what.startswith("create pod")):
            # Pods refused for now (a quota): ask again soon, so that a lifted quota is noticed
            # in seconds; the status names the refusal meanwhile (and in a StartupTimeout).
            delay = min(delay, settings.creation_retry_max_seconds)
        return delay
    except Exception as exc:  # a bug must reach the user too, not only the operator's log
        logger.exception("%s: reconcile failed", meta.get("name"))
        metrics.RECONCILE_ERRORS.labels("bug").inc()
        return _report_error(body, ApiError(0, type(exc).__name__, str(exc), "reconcile"),
                             memory, kube, settings, post_event)
    memory.errors = ErrorBackoff()
    return requeue


def _standing(job: spec.DDPJob, status: JobStatus, workloads: Sequence[kueue.WorkloadView],
              settings: OperatorSettings) -> kueue.Standing:
    return kueue.standing(job, status, workloads,
                          manage_without_queue_name=settings.manage_jobs_without_queue_name)


def _observe(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], generation: Optional[int],
             memory: JobMemory, place: kueue.Standing, settings: OperatorSettings,
             now: dt.datetime, poll: Optional[Poll],
             services: Optional[Sequence[ServiceView]] = None,
             entry_reader: Optional[entry_asks.EntryStateReader] = None) -> Observation:
    """What this pass saw of the job: its pods, the current attempt's creations so far, its
    progress reports, whether Kueue holds it, the Service with its name."""
    creations = memory.creations.of(status.restartAttempt)
    return Observation(pods, generation, created_ranks=frozenset(creations.created),
                       creation_errors=dict(creations.refused),
                       entry_states=_entry_states(job, status, pods, memory.in_place, settings,
                                                  entry_reader or entry_asks.READER),
                       progress=_poll_progress(job, status, pods, memory.polling, settings, now, poll),
                       hold=kueue.hold(job, status, place),
                       service=_service(job, services, memory, settings, now),
                       service_watched=services is not None)


def _as_ordered(pods: list[PodView], in_place: InPlaceMemory) -> list[PodView]:
    """The pods with the attempt they were ordered into, where the watch still shows the old
    label; forgets what the watch has caught up with."""
    uids = {p.uid for p in pods}
    in_place.seen_ready &= uids
    for p in pods:
        if in_place.ordered.get(p.uid, -1) <= p.attempt:
            in_place.ordered.pop(p.uid, None)
    in_place.ordered = {uid: a for uid, a in in_place.ordered.items() if uid in uids}
    in_place.armed = {uid: a for uid, a in in_place.armed.items() if uid in uids}
    in_place.asks = {uid: a for uid, a in in_place.asks.items() if uid in uids}
    return [replace(p, attempt=in_place.ordered[p.uid]) if p.uid in in_place.ordered else p for p in pods]


def _entry_states(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], in_place: InPlaceMemory,
                  settings: OperatorSettings,
                  reader: entry_asks.EntryStateReader) -> dict[str, restart_orders.EntryState]:
    """Ask the entry points of the current attempt's pods whose readiness dropped after they
    were seen ready what happened (their workers failed: they wait for an order). A pod never
    seen ready by this process is not asked: if its workers failed it exits on its own when its
    wait runs out, and the pod is recreated.

    The asks run on ``reader``'s threads, in the namespace's share (entry_asks): the pass waits
    for the ones it starts for at most ``entry_asks.PASS_WAIT_SECONDS`` (not at all in a
    namespace whose asks ran slow), and an answer that comes later wakes the job
    (``in_place.wake``) for a later pass to take (``in_place.recheck_after`` too). A pod is asked again only
    ``entry_asks.REASK_SECONDS`` after its last ask; its last answer stands meanwhile, unless
    the pod was seen ready since (a new drop: the job comes back when the pod may be asked)."""
    in_place.recheck_after = None
    lost: list[PodView] = []
    for p in pods:
        if not (is_ours(job, p) and p.attempt == status.restartAttempt and p.restart_token and p.pod_ip):
            continue
        if p.container_ready:
            in_place.seen_ready.add(p.uid)
            ask = in_place.asks.get(p.uid)
            if ask is not None:
                ask.stale = True  # kept while open: one ask per pod in flight, however it flaps
        elif p.uid in in_place.seen_ready and p.running and not p.deleting:
            lost.append(p)
    if not lost:
        return {}
    clock = reader.clock()
    started: list[entry_asks.Ask] = []
    for p in lost:
        ask = in_place.asks.get(p.uid)
        if ask is not None and (not ask.done.is_set() or clock - ask.asked_at < entry_asks.REASK_SECONDS):
            if ask.stale and ask.done.is_set():  # asked too recently, before this drop: ask once allowed
                in_place.recheck_after = soonest(in_place.recheck_after,
                                                 entry_asks.REASK_SECONDS - (clock - ask.asked_at))
            continue
        fresh = reader.ask(job.namespace, p.pod_ip, contract.DEFAULT_PROGRESS_PORT,
                           settings.progress_request_timeout_seconds,
                           previous=ask if ask is not None and not ask.stale else None,
                           on_done=in_place.wake)
        in_place.asks[p.uid] = fresh
        started.append(fresh)
    # A whole gang's readiness drops together (its peers lose the dead rank): asked at once,
    # so the pass waits one bound, not one per pod.
    reader.wait(job.namespace, started)
    states: dict[str, restart_orders.EntryState] = {}
    now = reader.clock()
    for p in lost:
        ask = in_place.asks[p.uid]
        if not ask.done.is_set():
            in_place.recheck_after = soonest(in_place.recheck_after, entry_asks.RECHECK_SECONDS)
        if ask.stale:
            continue  # asked before the pod's last drop: the ask after it is still to come
        state = ask.answer(now)
        if state is not None:
            states[p.uid] = state
    return states


def _service(job: spec.DDPJob, services: Optional[Sequence[ServiceView]], memory: JobMemory,
             settings: OperatorSettings, now: dt.datetime) -> Optional[ServiceView]:
    """The Service with the job's name: as the watch shows it, else another owner's that a
    creation found (for creation_retry_max_seconds; then a creation looks again)."""
    name = names.service_name(job.name)
    shown = next((s for s in services or () if s.name == name), None)
    found = memory.service_found
    if shown is not None or (found is not None and
                             (now - found[1]).total_seconds() >= settings.creation_retry_max_seconds):
        memory.service_found = found = None
    return shown or (found[0] if found is not None else None)


def _poll_progress(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], polling: ProgressPolling,
                   settings: OperatorSettings, now: dt.datetime,
                   poll: Optional[Poll]) -> Optional[progress_reports.GangProgress]:
    """Ask the running gang's pods for their ranks' reports, at most every
    progress_poll_seconds; returns what the current attempt has reported so far.

    With ``poll`` (tests, tools) the pods are asked here and now. Without it (the operator) the
    pass only says that a poll is due (``polling.due``): the worker runs it off the reconcile
    threads, and a later pass takes the answers (the first reports of a gang wake the job at
    once; later ones wait for the pass that asks the next poll). A pass never waits on a pod's
    network: pods that cannot answer (gone, or a NetworkPolicy dropping the port) would
    otherwise hold a reconcile thread for the request timeout each, and with many jobs every
    job's status would queue behind them (benchmarks/README.md, peers)."""
    attempt = status.restartAttempt
    if polling.reports is not None and polling.reports.attempt != attempt:
        polling.reports, polling.next_poll = None, None  # a new gang: a new clock
    if polling.reports is None:
        # This process's first sight of the attempt: silence is counted from no earlier than now.
        polling.reports = progress_reports.from_status(status.progress, attempt, watched_since=now)
    while polling.answers:
        polled_attempt, answers = polling.answers.popleft()
        if polled_attempt == attempt:  # an older gang's answers mean nothing now
            polling.reports = progress_reports.merge(polling.reports, attempt, answers)
    if status.phase != RUNNING:
        return polling.reports
    if polling.next_poll is None or now >= polling.next_poll:
        targets = poll_targets(job, status, pods)
        if targets and poll is not None:
            answers = poll(targets, contract.DEFAULT_PROGRESS_PORT, settings.progress_request_timeout_seconds)
            polling.reports = progress_reports.merge(polling.reports, attempt, answers)
        elif targets:
            polling.due = (attempt, tuple(targets))
        polling.next_poll = now + dt.timedelta(seconds=settings.progress_poll_seconds)
    return polling.reports


def poll_targets(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView]) -> list[progress.Target]:
    """The pods to ask for progress: the current attempt's running pods that are the job's own
    (its controller ownerReference, by uid: a look-alike pod with the job's label must not feed
    the job fake progress and silence hang detection), one per node rank of the attempt's
    world, each with the ranks it hosts (a pod speaks only for those)."""
    targets: dict[int, progress.Target] = {}
    for p in pods:
        if (is_ours(job, p) and p.attempt == status.restartAttempt and p.ready and p.pod_ip
                and 0 <= p.node_rank < status.nnodes and p.node_rank not in targets):
            nproc = p.nproc_per_node or job.spec.nprocPerNode
            targets[p.node_rank] = progress.Target(p.pod_ip, range(p.node_rank * nproc, (p.node_rank + 1) * nproc),
                                                   attempt=status.restartAttempt)
    return [targets[rank] for rank in sorted(targets)]


def _only_progress_changed(old: JobStatus, new: JobStatus) -> bool:
    """Progress moved, and with it at most goodput's figures of the same segment (a new segment
    is written at once: its boundary is the pass's time)."""
    return (old.progress != new.progress and goodput.only_refreshed(old.goodput, new.goodput)
            and replace(old, progress=new.progress, goodput=new.goodput) == new)


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


def _write_status(body: Mapping[str, Any], new: JobStatus, memory: JobMemory, kube: KubeApi) -> None:
    meta = body["metadata"]
    # Nulls for what the new status leaves out, against both what the event showed and what
    # this worker last wrote (either may be the newer): a merge patch keeps a left-out key.
    held = memory.status.to_dict() if memory.status is not None else None
    kube.patch_status(meta["namespace"], meta["name"], model.merge_patch(new.to_dict(), body.get("status"), held))
    memory.status = new


def _act(body: Mapping[str, Any], job: Optional[spec.DDPJob], old: JobStatus, plan: Plan,
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
    deferred: Optional[float] = None
    if plan.status != old:
        polling = memory.polling
        since = (now - polling.written_at).total_seconds() if polling.written_at else None
        if (_only_progress_changed(old, plan.status) and since is not None
                and since < settings.progress_status_interval_seconds):
            # Progress alone is rate-limited per job; the next pass past the interval writes it.
            memory.status = old
            deferred = settings.progress_status_interval_seconds - since
            metrics.PROGRESS_WRITES_DEFERRED.inc()
        else:
            _write_status(body, plan.status, memory, kube)
            if plan.status.progress != old.progress:
                polling.written_at = now
            if plan.status.restarts > old.restarts or plan.status.disruptions > old.disruptions:
                metrics.GANG_RESTARTS.labels(plan.status.reason).inc()
            metrics.observe_goodput(old.goodput, plan.status.goodput)
    else:
        memory.status = old
    stacks_event = _read_stacks(meta, plan.stacks) if plan.stacks is not None else None
    for event in plan.events:
        post_event(event)
    if stacks_event is not None:
        post_event(stacks_event)

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

    if job is not None and plan.ensure_service:
        existing = kube.create_service(builders.build_service(job))
        found = view_service(existing) if existing is not None else None
        if found is not None and found.uid and job.uid is not None and found.owner_uid != job.uid:
            # Another owner's Service has the name: never adopted, changed or deleted, and no
            # pod is created (none could rendezvous); the pass decides again from it.
            memory.service_found = (found, now)
            return Acted(service_in_the_way=found)
    if job is not None and plan.create_ranks:
        creations = memory.creations = memory.creations.of(plan.attempt)
        outcomes = kube.create_pods(builders.build_pods(job, plan.attempt, list(plan.create_ranks),
                                                        new_token=restart_orders.new_token,
                                                        kubelet_rules=settings.kubelet_restart_rules))
        for rank, outcome in zip(sorted(plan.create_ranks), outcomes):
            if outcome.created:
                creations.created.add(rank)
                creations.refused.pop(rank, None)
            elif outcome.error is not None:
                creations.refused[rank] = outcome.error.message or str(outcome.error)
        permanent = [o.error for o in outcomes if o.error is not None and o.error.permanent]
        if permanent:
            return Acted(refusal=permanent[0].message)
        errors.extend(o.error for o in outcomes if o.error is not None)

    if plan.restart_in_place:
        errors.extend(_order_in_place(namespace, plan, memory, kube))
    # Kubelet restarts in place: carried pods relabelled, running ones armed with the next
    # attempt (once: the watch may not show a written annotation yet).
    arming = [p for p in plan.arm if memory.in_place.armed.get(p.uid) != p.attempt + 1]
    writes = [(p, {names.LABEL_RESTART_ATTEMPT: str(p.attempt),
                   names.LABEL_CONTAINER_RESTARTS: str(p.restarts_seen)}, None) for p in plan.adopt]
    writes += [(p, {}, {names.ANNOTATION_ATTEMPT_AT_START: str(p.attempt + 1)}) for p in arming]
    outcomes = _relabel_all(namespace, writes, kube)
    for p, failed in zip(arming, outcomes[len(plan.adopt):]):
        if not failed:
            memory.in_place.armed[p.uid] = p.attempt + 1
    errors.extend(e for failed in outcomes for e in failed)

    if plan.delete_job:
        kube.delete_job(namespace, meta["name"], meta.get("uid"))
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ApiError(first.status, first.reason, first.message + more, first.what)
    return Acted(requeue_after=soonest(plan.requeue_after, deferred))


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
                p.pod_ip, contract.DEFAULT_PROGRESS_PORT, p.restart_token,
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


def _order_in_place(namespace: str, plan: Plan, memory: JobMemory, kube: KubeApi) -> list[ApiError]:
    """Order each pod of ``plan.restart_in_place`` into ``plan.attempt`` and relabel those that
    took it (the label then names the attempt the pod runs); a pod that did not answer, or
    refused, is deleted: the next pass creates its rank for the attempt."""
    pods = plan.restart_in_place
    with ThreadPoolExecutor(max_workers=min(len(pods), restart_orders.ORDERS_AT_ONCE)) as pool:
        taken = list(pool.map(lambda p: restart_orders.order_restart(
            p.pod_ip, contract.DEFAULT_PROGRESS_PORT, p.restart_token, plan.attempt,
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


def _act_on_workload(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], place: kueue.Standing,
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


def _report_error(body: Mapping[str, Any], exc: ApiError, memory: JobMemory,
                  kube: KubeApi, settings: OperatorSettings, post_event: PostEvent) -> Optional[float]:
    """Make the error visible: status reason ReconcileError (the phase is left as it was) and a
    Warning event; then retry with an exponential backoff."""
    name = (body.get("metadata") or {}).get("name", "?")
    if exc.not_found and exc.what.startswith("patch status"):
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
            _write_status(body, errored, memory, kube)
        except ApiError as again:  # the API server itself is unreachable: the log has it
            logger.warning("%s: could not write the error to the status: %s", name, again)
    delay = settings.error_backoff_seconds * 2 ** (memory.errors.consecutive - 1)
    return min(delay, settings.error_backoff_max_seconds)
