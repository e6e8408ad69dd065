"""What one reconcile pass sees of its job: the pods as the watch showed them (less those this
process deleted, with the attempt they were ordered into), the current attempt's creations, the
in-place entry points' states, the progress reports, Kueue's hold and the Service with the
job's name, gathered into one ``Observation`` for ``decide``.

It asks (the entry points' /attempt through entry_asks, the progress poll through the worker)
but never writes: act.py carries out what ``decide`` makes of it.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Callable, Optional, Sequence

from ddpjob import contract
from ddpjob import restart_orders
from ddpjob.api import names
from ddpjob.api import progress as progress_reports
from ddpjob.api import spec
from ddpjob.api.status import RUNNING, JobStatus
from ddpjob.controller import entry_asks, kueue, progress
from ddpjob.controller.memory import InPlaceMemory, JobMemory, ProgressPolling
from ddpjob.controller.observation import Observation, PodView, ServiceView
from ddpjob.controller.plan import is_ours, soonest
from ddpjob.controller.settings import OperatorSettings


Poll = Callable[[Sequence[progress.Target], int, float], list]


def observe(job: spec.DDPJob, status: JobStatus, pods: Sequence[PodView], generation: Optional[int],
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


def visible_pods(pods: Sequence[PodView], memory: JobMemory) -> list[PodView]:
    """The pods as the pass takes them: less those this process deleted (whatever a stale watch
    still shows), with the attempt they were ordered into where the watch shows the old label."""
    memory.gone_uids &= {p.uid for p in pods}  # forget what the watch has caught up with
    return _as_ordered([p for p in pods if p.uid not in memory.gone_uids], memory.in_place)


def _as_ordered(pods: list[PodView], in_place: InPlaceMemory) -> list[PodView]:
    """The pods with the attempt they were ordered into, where the watch still shows the old
    label; forgets what the watch has caught up with."""
    uids = {p.uid for p in pods}
    in_place.seen_ready &= uids
    for p in pods:
        if in_place.ordered.get(p.uid, -1) <= p.attempt:
            in_place.ordered.pop(p.uid, None)
    in_place.ordered = {uid: a for uid, a in in_place.ordered.items() if uid in uids}
    # An arming the watch has shown is forgotten: a later edit of the annotation (anyone who may
    # patch the pod) is then written over again.
    shown = {p.uid: p.attempt_at_start for p in pods}
    in_place.armed = {uid: a for uid, a in in_place.armed.items() if uid in uids and shown[uid] != a}
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
        if not (is_ours(job, p) and p.attempt == status.restartAttempt and p.restart_nonce and p.pod_ip):
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
