"""The kopf handlers: thin wiring from watch events to one reconcile worker per DDPJob.

Run it (see docs/operator.md)::

    kopf run --standalone --all-namespaces --liveness=http://0.0.0.0:8080/healthz -m ddpjob.handlers

How a pod change reaches the job's status in well under a second, without polling:

* ``ddpjob_pods``, a kopf index fed by the pod watch, keeps a small ``PodView`` of every pod
  labelled ``ddpjob.dev/job-name``, keyed by (namespace, job). The operator never reads pods
  from the API; kopf fills the index from its initial listing before any DDPJob handler runs,
  so after an operator restart the first pass already sees every existing pod (no duplicates).
* ``pod_event`` wakes the job's worker; ``ddpjob_event`` starts, updates and stops workers.
* A worker is an asyncio task that sleeps until woken (or until a clock of the job is due:
  startup timeout, deadline, TTL, a stuck pod), waits a few milliseconds for sibling events,
  then runs one ``reconcile.reconcile`` pass in a thread (the Kubernetes client is blocking;
  nothing blocking runs on kopf's event loop).

Why not ``@kopf.daemon``/``@kopf.timer``: kopf puts a finalizer on every object that has one,
and a finalizer blocks ``kubectl delete`` whenever the operator is down. This module registers
no daemon, timer or change/deletion handler, so kopf adds no finalizer and stores no progress
or diff-base annotations at all (they are still configured under ``ddpjob.dev``, should one be
added). Why the status is written by ``kube.patch_status`` and not kopf's ``patch.status``:
kopf applies that patch only when a handler returns, and the status must follow pod events
that no DDPJob handler sees; ``Kube.patch_status`` is the one status writer.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

import kopf

from ddpjob import contract
from ddpjob.decide import Event, PodView, view_pod
from ddpjob.kube import Kube
from ddpjob.reconcile import JobMemory, reconcile
from ddpjob.settings import OperatorSettings, load_settings

logger = logging.getLogger("ddpjob.operator")

JobKey = tuple[str, str]  # (namespace, DDPJob name)
POD_FILTER = {contract.LABEL_JOB_NAME: kopf.PRESENT}
UNEXPECTED_ERROR_DELAY = 5.0
MIN_REQUEUE_SECONDS = 0.2  # a clock that is due "now" must not turn the worker into a busy loop


class _QuietWatchHandlers(logging.Filter):
    """kopf logs "Handler 'pod_event' succeeded." at INFO for every watch event: thousands of
    lines (and CPU) for one big gang, saying nothing. Failures are still logged."""

    QUIET = tuple(f"Handler {name!r} succeeded" for name in ("pod_event", "ddpjob_event", "ddpjob_pods"))

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and any(q in record.getMessage() for q in self.QUIET))


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """kopf's own state under the project's API group, and only our pods on the pod watch."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=contract.API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=contract.API_GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{contract.API_GROUP}/finalizer"  # never added: see above
    # Server-side filtering: the API server sends only pods that carry the job label, instead of
    # every pod of the cluster for kopf to drop.
    settings.watching.label_selectors["v1", "pods"] = contract.LABEL_JOB_NAME
    kopf_objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietWatchHandlers) for f in kopf_objects.filters):
        kopf_objects.addFilter(_QuietWatchHandlers())


def job_key(obj: Mapping[str, Any]) -> JobKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class JobWorker:
    """Reconciles one DDPJob whenever woken; one pass at a time."""

    def __init__(self, runtime: "Runtime", body: Mapping[str, Any], pods: Mapping[JobKey, Any]):
        self.runtime, self.body, self.pods = runtime, body, pods
        self.key = job_key(body)
        self.uid = (body.get("metadata") or {}).get("uid")
        self.memory = JobMemory()
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
        """An Event on the DDPJob (kopf queues it from this thread), and the same line in the log."""
        logger.log(logging.WARNING if event.type == "Warning" else logging.INFO,
                   "%s/%s: %s: %s", *self.key, event.reason, event.message)
        try:
            kopf.event(self.body, type=event.type, reason=event.reason, message=event.message)
        except LookupError:  # kopf's event queue exists only inside a running operator
            pass

    def reconcile_once(self, pods: list[PodView]) -> Optional[float]:
        return reconcile(self.body, pods, self.memory, kube=self.runtime.kube,
                         settings=self.runtime.settings, post_event=self.post_event)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        requeue: Optional[float] = None
        while True:
            try:
                timeout = None if requeue is None else max(requeue, MIN_REQUEUE_SECONDS)
                await asyncio.wait_for(self.wakeup.wait(), timeout=timeout)
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(self.runtime.settings.coalesce_seconds)  # let sibling events land
            self.wakeup.clear()
            pods = list(self.pods[self.key]) if self.key in self.pods else []  # on the loop thread
            context = contextvars.copy_context()  # kopf's event queue, for post_event in the thread
            # A job without pods is about to create its gang: seconds of POSTs when the API server
            # is busy. Those passes get their own threads, so the passes of running jobs (a status
            # write each) never queue behind a burst of new jobs (benchmarks/README.md, many jobs).
            pool = self.runtime.pool if pods else self.runtime.gang_pool
            try:
                requeue = await loop.run_in_executor(pool, context.run, self.reconcile_once, pods)
            except Exception:  # a bug, not an API error (those are reported by reconcile)
                logger.exception("%s/%s: reconcile pass crashed", *self.key)
                requeue = UNEXPECTED_ERROR_DELAY

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


def _essential(body: Mapping[str, Any]) -> tuple:
    meta = body.get("metadata") or {}
    return meta.get("generation"), meta.get("deletionTimestamp")


class Runtime:
    """The operator process's state: settings, the API client, the workers by job."""

    def __init__(self) -> None:
        self.settings = OperatorSettings()
        self.kube: Any = None
        self.pool: Optional[ThreadPoolExecutor] = None  # passes of jobs that have pods
        self.gang_pool: Optional[ThreadPoolExecutor] = None  # passes of jobs that have none yet
        self.workers: dict[JobKey, JobWorker] = {}
        self._stopping: set[asyncio.Task] = set()  # asyncio keeps only weak references to tasks

    def start(self, settings: OperatorSettings, connect: Callable[[OperatorSettings], Any]) -> None:
        self.settings = settings
        self.kube = connect(settings)
        self.pool = ThreadPoolExecutor(max_workers=settings.reconcile_workers, thread_name_prefix="ddpjob-reconcile")
        self.gang_pool = ThreadPoolExecutor(max_workers=settings.reconcile_workers, thread_name_prefix="ddpjob-gang")

    def observe(self, event_type: Optional[str], body: Mapping[str, Any], pods: Mapping[JobKey, Any]) -> None:
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
            self.workers[key] = JobWorker(self, body, pods)
        else:
            worker.update(body)

    def wake(self, key: JobKey) -> None:
        worker = self.workers.get(key)
        if worker is not None:
            worker.wakeup.set()

    async def stop(self) -> None:
        workers, self.workers = list(self.workers.values()), {}
        await asyncio.gather(*(w.stop() for w in workers), *self._stopping, return_exceptions=True)
        for pool in (self.pool, self.gang_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        if self.kube is not None:
            self.kube.close()


RUNTIME = Runtime()


# ---------------------------------------------------------------------------------------------
# The handlers (each a few lines; all async and non-blocking, so none waits for a thread)
# ---------------------------------------------------------------------------------------------
@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure_kopf(settings)
    RUNTIME.start(load_settings(), Kube.connect)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    await RUNTIME.stop()


@kopf.index("v1", "pods", labels=POD_FILTER)
async def ddpjob_pods(body: Mapping[str, Any], **_: Any) -> dict[JobKey, PodView]:
    """(namespace, job name) -> the views of its pods. An empty dict drops a pod that lost its
    rank labels (None would keep its old value)."""
    view = view_pod(body)
    if view is None:
        return {}
    meta = body.get("metadata") or {}
    return {(str(meta.get("namespace")), str(meta["labels"][contract.LABEL_JOB_NAME])): view}


@kopf.on.event("v1", "pods", labels=POD_FILTER)
async def pod_event(body: Mapping[str, Any], **_: Any) -> None:
    meta = body.get("metadata") or {}
    RUNTIME.wake((str(meta.get("namespace")), str((meta.get("labels") or {}).get(contract.LABEL_JOB_NAME))))


@kopf.on.event(contract.API_GROUP, contract.API_VERSION, contract.PLURAL)
async def ddpjob_event(event: Mapping[str, Any], ddpjob_pods: Mapping[JobKey, Any], **_: Any) -> None:
    RUNTIME.observe(event.get("type"), event["object"], ddpjob_pods)


# ---------------------------------------------------------------------------------------------
# `ddpjob-operator`: `kopf run --standalone ... -m ddpjob.handlers` with its scope from flags or
# the environment (the Deployment sets DDPJOB_OPERATOR_NAMESPACES)
# ---------------------------------------------------------------------------------------------
def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    defaults = load_settings()
    parser = argparse.ArgumentParser(
        prog="ddpjob-operator",
        description="The DDPJob operator: kopf, standalone (one replica, no peering), with a liveness endpoint.")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NS",
                       help="serve only this namespace (repeatable; default: $DDPJOB_OPERATOR_NAMESPACES, "
                       "comma-separated, or all namespaces)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="serve every namespace")
    parser.add_argument("--liveness", default=defaults.liveness_endpoint,
                        help="kopf's liveness endpoint (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    namespaces = args.namespaces or ([] if args.all_namespaces else
                                     [n.strip() for n in defaults.namespaces.split(",") if n.strip()])
    kopf.configure(verbose=args.verbose)
    kopf.run(standalone=True, clusterwide=not namespaces, namespaces=namespaces,
             liveness_endpoint=args.liveness)
    return 0
