"""The per-job work queue: one asyncio worker per DDPJob, woken by events or its own clocks.

A worker sleeps until woken (a pod or DDPJob event) or until a clock of the job is due
(startup timeout, deadline, TTL, a stuck pod), runs at most one pass per coalescing window (so
sibling events of a burst land in one pass), and runs one ``reconcile.reconcile`` pass in a
thread (the Kubernetes client is blocking; nothing blocking runs on the event loop). One pass
at a time per job; passes of different jobs run in parallel. kopf-free: the handlers feed it.

The operator's threads, one pool per purpose (docs/operator.md, "Threads"):

* ``Runtime.pool`` (``ddpjob-reconcile``, reconcile_workers threads): passes of jobs that have
  pods, a status write each.
* ``Runtime.gang_pool`` (``ddpjob-gang``, reconcile_workers threads): passes of jobs that have
  no pod yet, about to create a gang (seconds of POSTs on a busy API server); apart, so that
  running jobs' passes never queue behind a burst of new jobs, nor new jobs behind them.
* ``Runtime.poll_pool`` (``ddpjob-poll``, ``progress.DECODE_WORKERS`` threads): parsing the
  progress answers of pods, one task per job's poll. The GETs themselves are coroutines on the
  event loop (``progress.poll_pods``): a pod that cannot answer, or trickles, holds a socket
  until the request's deadline, never a thread and never a pass; ``Runtime.poll_connections``
  bounds the sockets of all jobs, ``progress.PER_JOB_CONNECTIONS`` those of one.
* ``Kube.pool`` (``ddpjob-kube``, create_workers threads): the API requests of one pass that
  go out together (a gang's pod POSTs and DELETEs). The pass waits for them; these threads
  wait on nothing but the API server.
* ``entry_asks.READER`` (``ddpjob-entry``, ``entry_asks.ASKS_AT_ONCE`` threads): the in-place
  restart's ``GET /attempt`` of pods whose readiness dropped, at most
  ``entry_asks.ASKS_PER_NAMESPACE`` of one namespace at once, a free thread going to the
  namespaces in turn. A pass waits for its asks at most ``entry_asks.PASS_WAIT_SECONDS``, and
  not at all in a namespace whose asks ran slow; a later answer wakes the job.
* A pass's own requests to its job's pods (``reconcile``: the in-place restart's
  ``POST /restart``, a stall's ``GET /stacks``): a short-lived pool of at
  most ``restart_orders.ORDERS_AT_ONCE`` threads per call, gone when the call returns, each
  request under one deadline of a few seconds. Per pass, not shared, on purpose: another
  tenant's pods that answer slowly hold only their own job's pass, never the threads another
  job's restart needs. Rare (a failure or a stall), so the threads' start costs nothing measurable.
* ``ddpjob-leader-election``, one thread (``controller.leader``): a Lease round every retry
  period, apart from the event loop and the pools, so that no busy pass delays a renewal.
* kopf's own executor runs its one synchronous handler, ``handlers.startup``; every other
  handler is async and never waits for a thread.

With leader election (``controller.leader``) the Runtime of a standby replica only remembers
the jobs kopf shows it (its watches and the pod index stay warm) and starts no worker; when it
becomes the leader it starts a worker for every job it knows, and each rebuilds from the
job's status and the pods, as after an operator restart. A leader that can no longer renew
exits the process (``Runtime.exit``): its pod restarts as a standby.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import contextvars
import functools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

from ddpjob import contract
from ddpjob.controller import metrics
from ddpjob.controller.observation import PodView
from ddpjob.controller.plan import Event
from ddpjob.controller.kube import Kube
from ddpjob.controller import progress
from ddpjob.controller.reconcile import JobMemory, reconcile
from ddpjob.controller.settings import OperatorSettings

logger = logging.getLogger("ddpjob.operator")

JobKey = tuple[str, str]  # (namespace, DDPJob name)
EmitEvent = Callable[[Mapping[str, Any], Event], None]
# (kube, settings, on_started, on_stopped) -> an elector with run(stop), is_leader(), release()
Elect = Callable[[Kube, OperatorSettings, Callable[[], None], Callable[[], None]], Any]
LOST_LEADERSHIP_EXIT_CODE = 1
DRAIN_SECONDS = 10.0  # a graceful stop waits this long for passes in flight before releasing the Lease
UNEXPECTED_ERROR_DELAY = 5.0
MIN_REQUEUE_SECONDS = 0.2  # a clock that is due "now" must not turn the worker into a busy loop


def job_key(obj: Mapping[str, Any]) -> JobKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class JobWorker:
    """Reconciles one DDPJob whenever woken; one pass at a time."""

    def __init__(self, runtime: "Runtime", body: Mapping[str, Any], pods: Mapping[JobKey, Any],
                 workloads: Optional[Mapping[JobKey, Any]] = None,
                 services: Optional[Mapping[JobKey, Any]] = None):
        self.runtime, self.body, self.pods = runtime, body, pods
        self.workloads = workloads if workloads is not None else {}
        self.services = services  # None: no Service watch (the Service is created with each gang)
        self.key = job_key(body)
        self.uid = (body.get("metadata") or {}).get("uid")
        self.memory = JobMemory()
        # An entry point's answer that came after its pass went on wakes the job (from the
        # asking thread: entry_asks), so a restart waits for the answer, not for a clock.
        loop = asyncio.get_running_loop()
        self.memory.in_place.wake = lambda: loop.call_soon_threadsafe(self.wakeup.set)
        self.poll_task: Optional[asyncio.Task] = None  # the job's progress poll, at most one
        self.wakeup = asyncio.Event()
        self.wakeup.set()  # the first pass runs at once
        # In the operator's own context (Runtime.context), whoever creates the worker: a new
        # leader creates them from a callback of the election's thread, whose context lacks
        # kopf's, and every Event of those jobs was lost (kopf.event needs its contextvars).
        self.task = asyncio.create_task(self._run(), name=f"ddpjob {self.key[0]}/{self.key[1]}",
                                        context=runtime.task_context())

    def update(self, body: Mapping[str, Any]) -> None:
        """A new version of the DDPJob. Only a spec change (generation), a label change (the
        Kueue queue label) or a deletion needs a pass; the events of our own status writes do not,
        unless a status write of this worker was refused as stale (any newer version is then
        the one the worker waits for: reconcile._on_status_conflict)."""
        old, self.body = self.body, body
        if _essential(old) != _essential(body) or self.memory.stale_version is not None:
            self.wakeup.set()

    def post_event(self, event: Event) -> None:
        """An Event on the DDPJob, within the job's Event budget (event_budget.py), and the same
        line in the log."""
        admitted = self.memory.events.admit(event, dt.datetime.now(dt.timezone.utc))
        if admitted is None:
            return
        event = admitted
        logger.log(logging.WARNING if event.type == "Warning" else logging.INFO,
                   "%s/%s: %s: %s", *self.key, event.reason, event.message)
        self.runtime.emit_event(self.body, event)

    def reconcile_once(self, pods: list[PodView], workloads: tuple = (),
                       services: Optional[list] = None) -> Optional[float]:
        if not self.runtime.may_act():
            return None  # no longer sure to be the leader: the process is about to exit
        started = time.perf_counter()
        try:
            return reconcile(self.body, pods, self.memory, kube=self.runtime.kube,
                             settings=self.runtime.settings, post_event=self.post_event,
                             workloads=workloads, services=services)
        finally:
            metrics.RECONCILES.inc()
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        requeue: Optional[float] = None
        last_pass = float("-inf")
        while True:
            try:
                timeout = None if requeue is None else max(requeue, MIN_REQUEUE_SECONDS)
                await asyncio.wait_for(self.wakeup.wait(), timeout=timeout)
            except asyncio.TimeoutError:
                pass
            # At most one pass per coalescing window: an event in the middle of a burst waits out
            # the rest of the window (a gang that changes at once still costs about one pass and
            # one status write per window), but the first event after a quiet spell (the job's
            # creation, a lone pod exit) is handled at once instead of a window later
            # (benchmarks/README.md, peers: the 50 ms were most of DDPJob's start and finish lag).
            delay = self.runtime.settings.coalesce_seconds - (loop.time() - last_pass)
            if delay > 0:
                await asyncio.sleep(delay)
            # A job without pods is about to create its gang: seconds of POSTs when the API server
            # is busy. Those passes get their own threads, so the passes of running jobs (a status
            # write each) never queue behind a burst of new jobs (benchmarks/README.md, many jobs).
            gang = not any(True for _ in self.pods.get(self.key, ()))
            pool, slots = ((self.runtime.gang_pool, self.runtime.gang_slots) if gang else
                           (self.runtime.pool, self.runtime.pass_slots))
            # The pass waits here, on the loop, until one of its pool's threads is free, and only
            # then takes the pods: a pass queued behind busy threads (status writes to a slow API
            # server) sees the pod changes that came meanwhile, instead of a snapshot as old as
            # its wait, which took another pass, and another wait, to catch up with them.
            async with slots:
                self.wakeup.clear()
                last_pass = loop.time()
                pods = list(self.pods[self.key]) if self.key in self.pods else []  # on the loop thread
                # The Kueue Workloads labelled with the job's name (reconcile keeps to the job's own).
                workloads = tuple(self.workloads[self.key]) if self.key in self.workloads else ()
                services = (None if self.services is None else
                            list(self.services[self.key]) if self.key in self.services else [])
                context = contextvars.copy_context()  # kopf's event queue, for post_event in the thread
                try:
                    requeue = await loop.run_in_executor(pool, context.run, self.reconcile_once, pods, workloads,
                                                         services)
                except Exception:  # a bug, not an API error (those are reported by reconcile)
                    logger.exception("%s/%s: reconcile pass crashed", *self.key)
                    requeue = UNEXPECTED_ERROR_DELAY
            self._start_poll()

    def _start_poll(self) -> None:
        """The progress poll the last pass asked for, in the background: HTTP to the pods on the
        poll pool, never on the reconcile threads; the next pass takes its answers."""
        due = self.memory.polling.due
        if due is None or self.poll_task is not None:
            return  # none wanted, or one in flight (the next due time asks again)
        self.memory.polling.due = None
        self.poll_task = asyncio.create_task(self._poll(*due), name=f"ddpjob poll {self.key[0]}/{self.key[1]}")

    async def _poll(self, attempt: int, targets: tuple[progress.Target, ...]) -> None:
        settings = self.runtime.settings
        try:
            answers = await progress.poll_pods(self.runtime.poll_pool, targets, contract.DEFAULT_PROGRESS_PORT,
                                               settings.progress_request_timeout_seconds,
                                               connections=self.runtime.poll_connections)
            self.memory.polling.answers.append((attempt, answers))
            known = self.memory.polling.reports
            if any(answers) and (known is None or not known.ranks):
                # The gang's first reports: a pass now, so that progress shows and the startup
                # bound ends at once. Later answers wait for the pass that asks the next poll
                # (progress_poll_seconds): one pass per poll, not two
                # (benchmarks/README.md, progress API cost).
                self.wakeup.set()
        except Exception:  # never let a poll take the worker down; the next one may do better
            logger.exception("%s/%s: progress poll crashed", *self.key)
        finally:
            self.poll_task = None

    async def stop(self) -> None:
        tasks = [task for task in (self.task, self.poll_task) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # their CancelledErrors, as results


def _essential(body: Mapping[str, Any]) -> tuple:
    meta = body.get("metadata") or {}
    return meta.get("generation"), meta.get("deletionTimestamp"), meta.get("labels") or {}


class Runtime:
    """The operator process's state: settings, the API client, the workers by job, and whether
    this replica leads."""

    def __init__(self) -> None:
        self.settings = OperatorSettings()
        self.kube: Optional[Kube] = None
        self.emit_event: EmitEvent = lambda body, event: None
        # The threads, one pool per purpose (the module's docstring says why each).
        self.pool: Optional[ThreadPoolExecutor] = None  # passes of jobs that have pods
        self.gang_pool: Optional[ThreadPoolExecutor] = None  # passes of jobs that have none yet
        self.poll_pool: Optional[ThreadPoolExecutor] = None  # parsing pods' progress answers
        self.poll_connections: Optional[asyncio.Semaphore] = None  # progress GETs open at once
        # One slot per thread of ``pool`` / ``gang_pool``: a pass takes the job's pods only once it
        # holds one (JobWorker._run says why).
        self.pass_slots: asyncio.Semaphore = asyncio.Semaphore(1)
        self.gang_slots: asyncio.Semaphore = asyncio.Semaphore(1)
        self.workers: dict[JobKey, JobWorker] = {}
        # Every job kopf has shown, with its pod and Workload indexes: a standby starts their
        # workers the moment it leads.
        self.known: dict[JobKey, tuple[Mapping[str, Any], Mapping[JobKey, Any], Optional[Mapping[JobKey, Any]],
                                       Optional[Mapping[JobKey, Any]]]] = {}
        self.leading = False  # workers run (set on the event loop)
        self.elector: Any = None  # None: no leader election, this process acts alone
        self.identity = ""
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.exit: Callable[[int], None] = os._exit  # on lost leadership; tests replace it
        self._election_stop = threading.Event()
        self._election_thread: Optional[threading.Thread] = None
        self._stopping: set[asyncio.Task] = set()  # asyncio keeps only weak references to tasks
        # The context of the last observe(): a kopf event handler's, where kopf's contextvars
        # (its Event queue and loop, set only for the object handlers, and its settings) are
        # set. Every worker runs in a copy of it (task_context).
        self.context: Optional[contextvars.Context] = None
        self.pod_views: dict[str, tuple[JobKey, PodView]] = {}  # pod uid -> what a pass last could see of it

    def start(self, settings: OperatorSettings, connect: Callable[[OperatorSettings], Kube],
              emit_event: Optional[EmitEvent] = None, *, elect: Optional[Elect] = None) -> None:
        """``connect`` makes the API client; ``emit_event`` posts a Kubernetes Event (kopf's
        queue in the operator; None in tests, where the log line is enough). Without ``elect``
        this process leads at once; with it, it stands by until ``start_election`` wins."""
        self.settings = settings
        self.kube = connect(settings)
        self.emit_event = emit_event or (lambda body, event: None)
        self.pool = ThreadPoolExecutor(max_workers=settings.reconcile_workers, thread_name_prefix="ddpjob-reconcile")
        metrics.count_jobs_from(lambda: [w.memory.status.phase for w in list(self.workers.values())
                                         if w.memory.status is not None])
        metrics.goodput_from(lambda: [(*key, w.memory.status.goodput) for key, w in list(self.workers.items())
                                      if w.memory.status is not None])
        self.gang_pool = ThreadPoolExecutor(max_workers=settings.reconcile_workers, thread_name_prefix="ddpjob-gang")
        self.pass_slots = asyncio.Semaphore(settings.reconcile_workers)
        self.gang_slots = asyncio.Semaphore(settings.reconcile_workers)
        self.poll_pool = ThreadPoolExecutor(max_workers=progress.DECODE_WORKERS, thread_name_prefix="ddpjob-poll")
        self.poll_connections = asyncio.Semaphore(progress.CONNECTIONS)
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        if elect is None:
            self._lead()
            return
        self.elector = elect(self.kube, settings, self._on_elected, self._on_deposed)
        self.identity = getattr(self.elector, "identity", "")
        self.kube.fence = self.may_act
        metrics.LEADER.set(0)

    def task_context(self) -> contextvars.Context:
        """A copy of the last observe()'s context (else the current one) for a worker's task."""
        return (self.context or contextvars.copy_context()).copy()

    async def start_election(self) -> None:
        """The first round now (a free Lease is this replica's before kopf's watches start, so
        a lone operator acts as soon as before), then a round every retry period in a thread
        (a busy event loop must not delay a renewal)."""
        if self.elector is None:
            return
        self.loop = asyncio.get_running_loop()
        await self.loop.run_in_executor(None, self.elector.step)
        self._election_thread = threading.Thread(target=self.elector.run, args=(self._election_stop,),
                                                 name="ddpjob-leader-election", daemon=True)
        self._election_thread.start()
        if not self.elector.is_leader():
            logger.info("%s: standing by: the Lease is held by %s", self.identity,
                        getattr(self.elector, "holder", "") or "nobody yet")

    def may_act(self) -> bool:
        """Whether this replica may write now: the leader, within its renew deadline."""
        return self.elector is None or bool(self.elector.is_leader())

    def leadership(self) -> dict[str, Any]:
        """For the liveness endpoint: who this replica is and whether it leads."""
        return {"identity": self.identity, "leading": self.leading and self.may_act(),
                "election": self.elector is not None}

    def _on_elected(self) -> None:  # the election's thread
        if self.loop is None:
            self._lead()
        else:
            self.loop.call_soon_threadsafe(self._lead)

    def _on_deposed(self) -> None:  # the election's thread
        """Stop acting at once, whatever the workers are doing: exit, and let the pod restart
        (as a standby). Waiting for the event loop or the passes could take longer than the
        gap before another replica takes over."""
        logger.critical("%s: exiting with status %d so that no two replicas act; the next process "
                        "stands by", self.identity, LOST_LEADERSHIP_EXIT_CODE)
        for handler in logging.getLogger().handlers:
            handler.flush()
        self.exit(LOST_LEADERSHIP_EXIT_CODE)

    def _lead(self) -> None:
        """Start a worker for every job known so far; each rebuilds from status and pods."""
        if self.leading:
            return
        self.leading = True
        metrics.LEADER.set(1)
        for key, (body, pods, workloads, services) in list(self.known.items()):
            if key not in self.workers:
                self.workers[key] = JobWorker(self, body, pods, workloads, services)
        if self.elector is not None:
            logger.info("%s: leading: reconciling %d known job(s)", self.identity, len(self.workers))

    def observe(self, event_type: Optional[str], body: Mapping[str, Any], pods: Mapping[JobKey, Any],
                workloads: Optional[Mapping[JobKey, Any]] = None,
                services: Optional[Mapping[JobKey, Any]] = None) -> None:
        key, uid = job_key(body), (body.get("metadata") or {}).get("uid")
        self.context = contextvars.copy_context()  # kopf's, for the workers (cheap: a mapping's root)
        if event_type == "DELETED":
            self.known.pop(key, None)
        else:
            self.known[key] = (body, pods, workloads, services)
        if not self.leading:
            return  # a standby only keeps track
        worker = self.workers.get(key)
        if worker is not None and (event_type == "DELETED" or worker.uid != uid):
            # Gone, or deleted and recreated under the same name: the old worker's memory is void.
            del self.workers[key]
            stopping = asyncio.create_task(worker.stop())
            self._stopping.add(stopping)
            stopping.add_done_callback(self._stopping.discard)
            worker = None
        if event_type == "DELETED":
            return
        if worker is None:
            self.workers[key] = JobWorker(self, body, pods, workloads, services)
        else:
            worker.update(body)

    def wake(self, key: JobKey) -> None:
        worker = self.workers.get(key)
        if worker is not None:
            worker.wakeup.set()

    def pod_changed(self, key: JobKey, uid: str, view: Optional[PodView]) -> None:
        """A pod watch event (``view`` None: the pod is gone, or lost its rank labels). Wakes the
        job only when what its passes see of the pod changed: most pod events (a condition, a
        timestamp, the kubelet's bookkeeping) change nothing a pass reads, and each would cost a
        pass, and a thread of the pool, for nothing (benchmarks/README.md, many jobs). The
        time-bound decisions have clocks of their own."""
        before = self.pod_views.pop(uid, None) if view is None else self.pod_views.get(uid)
        if view is not None:
            if before == (key, view):
                return
            self.pod_views[uid] = (key, view)
        if before is not None and before[0] != key:
            self.wake(before[0])  # relabelled to another job: the old one has lost it
        self.wake(key)

    async def stop(self) -> None:
        """Stop the workers; a leader then waits (a bounded time) for the passes in flight and
        releases the Lease, so that a standby takes over within a retry period."""
        workers, self.workers = list(self.workers.values()), {}
        await asyncio.gather(*(w.stop() for w in workers), *self._stopping, return_exceptions=True)
        drained = await self._drain([self.pool, self.gang_pool], DRAIN_SECONDS)
        if self.poll_pool is not None:
            self.poll_pool.shutdown(wait=False, cancel_futures=True)
        if self.elector is not None:
            await self._end_election(release=drained)
        if self.kube is not None:
            self.kube.close()

    async def _drain(self, pools: list[Optional[ThreadPoolExecutor]], timeout: float) -> bool:
        """Shut the pools down; True once the passes running in them have finished."""
        loop = asyncio.get_running_loop()
        waits = [loop.run_in_executor(None, functools.partial(p.shutdown, wait=True, cancel_futures=True))
                 for p in pools if p is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
            return True
        except asyncio.TimeoutError:
            logger.warning("reconcile passes still running after %.0fs of shutdown", timeout)
            return False

    async def _end_election(self, release: bool) -> None:
        self._election_stop.set()
        thread = self._election_thread
        loop = asyncio.get_running_loop()
        if thread is not None:
            await loop.run_in_executor(None, thread.join, self.settings.renew_deadline_seconds)
            if thread.is_alive():
                return  # a round still in flight: let the Lease expire rather than race it
        if release:
            await loop.run_in_executor(None, self.elector.release)
        else:
            logger.warning("%s: not releasing the Lease (passes may still write): it expires by itself",
                           self.identity)
        self.leading = False
        metrics.LEADER.set(0)
