"""The per-job work queue: one asyncio worker per DDPJob, woken by events or its own clocks.

A worker sleeps until woken (a pod or DDPJob event) or until a clock of the job is due
(startup timeout, deadline, TTL, a stuck pod), runs at most one pass per coalescing window
(so sibling events of a burst land in one pass), and runs one ``reconcile.reconcile`` pass in a thread (the Kubernetes client is blocking;
nothing blocking runs on the event loop). One pass at a time per job; passes of different jobs
run in parallel on two thread pools (see ``JobWorker._run``). kopf-free: the handlers feed it.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

from ddpjob import contract
from ddpjob.controller import metrics
from ddpjob.controller.decide import Event, PodView
from ddpjob.controller.kube import Kube
from ddpjob.controller.progress import poll_pods
from ddpjob.controller.reconcile import JobMemory, reconcile
from ddpjob.controller.settings import OperatorSettings

logger = logging.getLogger("ddpjob.operator")

JobKey = tuple[str, str]  # (namespace, DDPJob name)
EmitEvent = Callable[[Mapping[str, Any], Event], None]
UNEXPECTED_ERROR_DELAY = 5.0
MIN_REQUEUE_SECONDS = 0.2  # a clock that is due "now" must not turn the worker into a busy loop


def job_key(obj: Mapping[str, Any]) -> JobKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class JobWorker:
    """Reconciles one DDPJob whenever woken; one pass at a time."""

    def __init__(self, runtime: "Runtime", body: Mapping[str, Any], pods: Mapping[JobKey, Any],
                 workloads: Optional[Mapping[JobKey, Any]] = None):
        self.runtime, self.body, self.pods = runtime, body, pods
        self.workloads = workloads if workloads is not None else {}
        self.key = job_key(body)
        self.uid = (body.get("metadata") or {}).get("uid")
        self.memory = JobMemory()
        self.poll_task: Optional[asyncio.Task] = None  # the job's progress poll, at most one
        self.wakeup = asyncio.Event()
        self.wakeup.set()  # the first pass runs at once
        self.task = asyncio.create_task(self._run(), name=f"ddpjob {self.key[0]}/{self.key[1]}")

    def update(self, body: Mapping[str, Any]) -> None:
        """A new version of the DDPJob. Only a spec change (generation) or a deletion needs a pass;
        the events of our own status writes do not."""
        old, self.body = self.body, body
        if _essential(old) != _essential(body):
            self.wakeup.set()

    def post_event(self, event: Event) -> None:
        """An Event on the DDPJob, and the same line in the log."""
        logger.log(logging.WARNING if event.type == "Warning" else logging.INFO,
                   "%s/%s: %s: %s", *self.key, event.reason, event.message)
        self.runtime.emit_event(self.body, event)

    def reconcile_once(self, pods: list[PodView], workload: Any = None) -> Optional[float]:
        started = time.perf_counter()
        try:
            return reconcile(self.body, pods, self.memory, kube=self.runtime.kube,
                             settings=self.runtime.settings, post_event=self.post_event,
                             workload=workload)
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
            self.wakeup.clear()
            last_pass = loop.time()
            pods = list(self.pods[self.key]) if self.key in self.pods else []  # on the loop thread
            # The job's Kueue Workload (an index store of one), only for a queued job.
            workload = next(iter(self.workloads[self.key]), None) if self.key in self.workloads else None
            context = contextvars.copy_context()  # kopf's event queue, for post_event in the thread
            # A job without pods is about to create its gang: seconds of POSTs when the API server
            # is busy. Those passes get their own threads, so the passes of running jobs (a status
            # write each) never queue behind a burst of new jobs (benchmarks/README.md, many jobs).
            pool = self.runtime.pool if pods else self.runtime.gang_pool
            try:
                requeue = await loop.run_in_executor(pool, context.run, self.reconcile_once, pods, workload)
            except Exception:  # a bug, not an API error (those are reported by reconcile)
                logger.exception("%s/%s: reconcile pass crashed", *self.key)
                requeue = UNEXPECTED_ERROR_DELAY
            self._start_poll()

    def _start_poll(self) -> None:
        """The progress poll the last pass asked for, in the background: HTTP to the pods on a
        pool of its own, never on the reconcile threads; the next pass takes its answers."""
        due = self.memory.poll_due
        if due is None or self.poll_task is not None:
            return  # none wanted, or one in flight (the next due time asks again)
        self.memory.poll_due = None
        self.poll_task = asyncio.create_task(self._poll(*due), name=f"ddpjob poll {self.key[0]}/{self.key[1]}")

    async def _poll(self, attempt: int, ips: tuple[str, ...]) -> None:
        settings = self.runtime.settings
        try:
            answers = await asyncio.get_running_loop().run_in_executor(
                self.runtime.poll_pool, poll_pods, ips, contract.DEFAULT_PROGRESS_PORT,
                settings.progress_request_timeout_seconds)
            self.memory.poll_answers.append((attempt, answers))
            known = self.memory.progress
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
    return meta.get("generation"), meta.get("deletionTimestamp")


class Runtime:
    """The operator process's state: settings, the API client, the workers by job."""

    def __init__(self) -> None:
        self.settings = OperatorSettings()
        self.kube: Optional[Kube] = None
        self.emit_event: EmitEvent = lambda body, event: None
        self.pool: Optional[ThreadPoolExecutor] = None  # passes of jobs that have pods
        self.gang_pool: Optional[ThreadPoolExecutor] = None  # passes of jobs that have none yet
        self.poll_pool: Optional[ThreadPoolExecutor] = None  # progress polls (HTTP to pods)
        self.workers: dict[JobKey, JobWorker] = {}
        self._stopping: set[asyncio.Task] = set()  # asyncio keeps only weak references to tasks

    def start(self, settings: OperatorSettings, connect: Callable[[OperatorSettings], Kube],
              emit_event: Optional[EmitEvent] = None) -> None:
        """``connect`` makes the API client; ``emit_event`` posts a Kubernetes Event (kopf's
        queue in the operator; None in tests, where the log line is enough)."""
        self.settings = settings
        self.kube = connect(settings)
        self.emit_event = emit_event or (lambda body, event: None)
        self.pool = ThreadPoolExecutor(max_workers=settings.reconcile_workers, thread_name_prefix="ddpjob-reconcile")
        metrics.count_jobs_from(lambda: [w.memory.status.phase for w in list(self.workers.values())
                                         if w.memory.status is not None])
        self.gang_pool = ThreadPoolExecutor(max_workers=settings.reconcile_workers, thread_name_prefix="ddpjob-gang")
        self.poll_pool = ThreadPoolExecutor(max_workers=settings.reconcile_workers, thread_name_prefix="ddpjob-poll")

    def observe(self, event_type: Optional[str], body: Mapping[str, Any], pods: Mapping[JobKey, Any],
                workloads: Optional[Mapping[JobKey, Any]] = None) -> None:
        key, uid = job_key(body), (body.get("metadata") or {}).get("uid")
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
            self.workers[key] = JobWorker(self, body, pods, workloads)
        else:
            worker.update(body)

    def wake(self, key: JobKey) -> None:
        worker = self.workers.get(key)
        if worker is not None:
            worker.wakeup.set()

    async def stop(self) -> None:
        workers, self.workers = list(self.workers.values()), {}
        await asyncio.gather(*(w.stop() for w in workers), *self._stopping, return_exceptions=True)
        for pool in (self.pool, self.gang_pool, self.poll_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        if self.kube is not None:
            self.kube.close()
