"""The kopf handlers: thin wiring from watch events to one reconcile worker per DDPJob.

Run it (see docs/operator.md)::

    kopf run --standalone --all-namespaces --liveness=http://0.0.0.0:8080/healthz -m ddpjob.controller.handlers

How a pod change reaches the job's status in well under a second, without polling:

* ``PODS``, the operator's own pod index (``controller.podwatch``), keeps a small ``PodView`` of
  every pod labelled ``ddpjob.dev/job-name``, keyed by (namespace, job). Its watch (a list, then
  a watch, in threads of its own, started by ``startup``) wakes the job's worker when a pod's
  view changed or the pod went (``Runtime.pod_changed``). It is not a kopf index: kopf's
  per-object machinery on every pod event was most of the operator's CPU (podwatch.py says
  why). ``ddpjob_event`` waits until its first list is in, so after an operator restart the
  first pass already sees every existing pod (no duplicates). Passes never read pods from the
  API.
* ``ddpjob_services``, a kopf index, does the same for the jobs' Services (``ServiceView``:
  whose it is), so a job's own Service deleted under it is recreated at once, at no request per
  pass; ``service_event`` wakes the job for its Service.
* ``ddpjob_event`` starts, updates and stops workers.
* The job's worker (``ddpjob.controller.workqueue``) runs one ``reconcile.reconcile`` pass
  in a thread when woken or when one of the job's clocks is due.

High availability (docs/operator.md): the Deployment runs two replicas; both watch (their
index stays warm), only the holder of the leader Lease starts workers (``controller.leader``,
``Runtime.start_election``). kopf's own peering is not used: it pauses a whole operator when
another one with a higher priority appears, has no Lease, no renew deadline and no fencing.

Why not ``@kopf.daemon``/``@kopf.timer``: kopf puts a finalizer on every object that has one,
and a finalizer blocks ``kubectl delete`` whenever the operator is down. This module registers
no daemon, timer or change/deletion handler, so kopf adds no finalizer and stores no progress
or diff-base annotations at all (they are still configured under ``ddpjob.dev``, should one be
added), nor builds a diff base per event (``UnreadDiffBaseStorage``). Why the status is written by ``kube.patch_status`` and not kopf's ``patch.status``:
kopf applies that patch only when a handler returns, and the status must follow pod events
that no DDPJob handler sees; ``Kube.patch_status`` is the one status writer.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Mapping, Optional

import kopf

from ddpjob.api import names
from ddpjob.controller import collector, fastjson, kueue, restart_key
from ddpjob.controller.observation import ServiceView, view_service
from ddpjob.controller.plan import Event
from ddpjob.controller import metrics
from ddpjob.controller.kube import Kube
from ddpjob.controller.leader import lease_namespace, operator_elector
from ddpjob.controller.podwatch import PodIndex, PodWatch
from ddpjob.controller.settings import load_settings
from ddpjob.controller.workqueue import JobKey, Runtime

POD_FILTER = {names.LABEL_JOB_NAME: kopf.PRESENT}
logger = logging.getLogger("ddpjob.operator")


class _QuietWatchHandlers(logging.Filter):
    """kopf logs "Handler 'pod_event' succeeded." at INFO for every watch event: thousands of
    lines (and CPU) for one big gang, saying nothing. Failures are still logged."""

    QUIET = tuple(f"Handler {name!r} succeeded" for name in (
        "ddpjob_event", "workload_event", "ddpjob_workloads",
        "service_event", "ddpjob_services")) + (
        "Activity 'leader' succeeded",)  # the probe handler, at every liveness/readiness check

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and any(q in record.getMessage() for q in self.QUIET))


class UnreadDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base for an operator that has no change handler and no daemon: no essence.

    On every watch event kopf builds the object's essence (what a change handler compares with
    the last handled one) by deep-copying the whole object and then dropping its metadata and
    status. Only change handlers and daemons read it (and its diff); this operator has neither,
    and for 100 jobs that copy was a fifth of the operator's CPU (benchmarks/README.md, many
    jobs). ``configure_kopf`` uses this storage only while the registry has neither kind of
    handler, so adding one brings kopf's own back."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}


def configure_kopf(settings: kopf.OperatorSettings, registry: Optional[kopf.OperatorRegistry] = None) -> None:
    """kopf's own state under the project's API group, and only our Services on its watch."""
    registry = registry if registry is not None else kopf.get_default_registry()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.API_GROUP)
    essence_read = bool(registry._changing.get_all_handlers() or registry._spawning.get_all_handlers())
    storage = kopf.AnnotationsDiffBaseStorage if essence_read else UnreadDiffBaseStorage
    settings.persistence.diffbase_storage = storage(prefix=names.API_GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{names.API_GROUP}/finalizer"  # never added: see above
    _speed_up_kopf_json()
    # Server-side filtering: the API server sends only Services that carry the job label, instead
    # of every Service of the cluster for kopf to drop (the pod watch filters the same way).
    settings.watching.label_selectors["v1", "services"] = names.LABEL_JOB_NAME
    for name in ("kopf.objects", "kopf.activities.probe"):
        kopf_logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietWatchHandlers) for f in kopf_logger.filters):
            kopf_logger.addFilter(_QuietWatchHandlers())


def _speed_up_kopf_json() -> bool:
    """kopf's watch streams decode with ``fastjson.loads`` (fastjson.py says why)."""
    try:
        from kopf._cogs.clients import api as kopf_api  # kopf's private client module
    except ImportError:
        kopf_api = None
    return fastjson.speed_up(kopf_api)


def _kopf_event(body: Mapping[str, Any], event: Event) -> None:
    """Post an Event on the DDPJob through kopf's queue (callable from the reconcile threads, in
    the context of the operator's startup: Runtime.task_context)."""
    try:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    except LookupError:  # kopf's contextvars are not set here: said, never silently dropped
        logger.warning("an Event was not posted (no kopf event queue in this context): %s: %s",
                       event.reason, event.message)


RUNTIME = Runtime()
PODS = PodIndex()  # the pods of every job, as the pod watch last saw them
POD_WATCH: Optional[PodWatch] = None  # started by ``startup``
# The namespaces kopf serves, for the pod watch to serve the same (``main`` sets them from its
# flags); None: from the settings (DDPJOB_OPERATOR_NAMESPACES; empty: all).
NAMESPACES: Optional[list[str]] = None


# ---------------------------------------------------------------------------------------------
# The handlers (each a few lines; all async and non-blocking, so none waits for a thread)
# ---------------------------------------------------------------------------------------------
@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure_kopf(settings)
    operator_settings = load_settings()
    await asyncio.to_thread(load_restart_key, operator_settings)  # before any pass makes a pod
    RUNTIME.start(operator_settings, Kube.connect, _kopf_event,
                  elect=operator_elector if operator_settings.leader_election else None)
    await RUNTIME.start_election()
    start_pod_watch(operator_settings)
    metrics.serve(operator_settings.metrics_port)
    collector.settle()  # everything the process holds from now on: collector.py says why


def load_restart_key(operator_settings: Any, attempts: int = 3) -> None:
    """The restart key from its Secret (restart_key.py), tried a few times. Without it the
    operator still runs, with a key of this process only: pods it did not make are then
    recreated rather than restarted in place, and it says so."""
    namespace = lease_namespace(operator_settings)
    kube = Kube.connect(operator_settings)
    try:
        for attempt in range(1, attempts + 1):
            try:
                restart_key.load(kube, namespace)
                logger.info("restart key: Secret %s/%s", namespace, restart_key.SECRET_NAME)
                return
            except restart_key.RestartKeyError as exc:
                logger.error("restart key: %s", exc)
                return
            except Exception as exc:  # noqa: BLE001 - an API error, a refusal: said, then tried again
                if attempt == attempts:
                    logger.error("restart key: Secret %s/%s could not be read or created (%s); this "
                                 "process uses a key of its own: pods made before it started are "
                                 "recreated, not restarted in place. The operator's Role "
                                 "(manifests/rbac.yaml, ddpjob-operator-restart-key) allows it.",
                                 namespace, restart_key.SECRET_NAME, exc)
                    return
                time.sleep(1.0)
    finally:
        kube.close()


def start_pod_watch(operator_settings: Any) -> PodWatch:
    """The pod watch, on a client of its own (its connections stay open for minutes)."""
    global POD_WATCH
    namespaces = NAMESPACES if NAMESPACES is not None else [
        n.strip() for n in operator_settings.namespaces.split(",") if n.strip()]
    POD_WATCH = PodWatch(Kube.connect(operator_settings), namespaces, PODS, RUNTIME.pod_changed)
    POD_WATCH.start()
    return POD_WATCH


@kopf.on.probe(id="leader")
def leader_probe(**_: Any) -> dict[str, Any]:
    """In the liveness endpoint's answer: this replica's identity and whether it leads (a
    standby is alive and healthy too)."""
    return RUNTIME.leadership()


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if POD_WATCH is not None:
        POD_WATCH.stop()
    await RUNTIME.stop()


def _job_key(body: Mapping[str, Any]) -> JobKey:
    """(namespace, job name) of a labelled child: the key of the indexes and the workers."""
    meta = body.get("metadata") or {}
    return str(meta.get("namespace")), str((meta.get("labels") or {}).get(names.LABEL_JOB_NAME))


# The jobs' Services (labelled like their pods): a job's own Service deleted while it runs is
# recreated at once, and a labelled Service of another owner with the job's name is seen before
# anything is created. One that lacks the label is found by the creation (kube.create_service).
@kopf.index("v1", "services", labels=POD_FILTER)
async def ddpjob_services(body: Mapping[str, Any], **_: Any) -> dict[JobKey, ServiceView]:
    return {_job_key(body): view_service(body)}


@kopf.on.event("v1", "services", labels=POD_FILTER)
async def service_event(body: Mapping[str, Any], **_: Any) -> None:
    RUNTIME.wake(_job_key(body))


# Kueue's Workloads of queued DDPJobs (docs/kueue.md). Without Kueue's CRDs kopf serves nothing
# here and keeps watching for them to appear; jobs without the queue label never have one.
@kopf.index(kueue.GROUP, kueue.VERSION, kueue.WORKLOAD_PLURAL, labels=POD_FILTER)
async def ddpjob_workloads(body: Mapping[str, Any], **_: Any) -> dict[JobKey, kueue.WorkloadView]:
    return {_job_key(body): kueue.view_workload(body)}


@kopf.on.event(kueue.GROUP, kueue.VERSION, kueue.WORKLOAD_PLURAL, labels=POD_FILTER)
async def workload_event(body: Mapping[str, Any], **_: Any) -> None:
    RUNTIME.wake(_job_key(body))


@kopf.on.event(names.API_GROUP, names.API_VERSION, names.PLURAL)
async def ddpjob_event(event: Mapping[str, Any], ddpjob_workloads: Optional[Mapping[JobKey, Any]] = None,
                       ddpjob_services: Optional[Mapping[JobKey, Any]] = None, **_: Any) -> None:
    if POD_WATCH is not None:
        await POD_WATCH.wait_ready()  # every existing pod in the index before the first pass
    RUNTIME.observe(event.get("type"), event["object"], PODS, ddpjob_workloads, ddpjob_services)


# ---------------------------------------------------------------------------------------------
# `ddpjob-operator`: `kopf run --standalone ... -m ddpjob.controller.handlers` with its scope from
# flags or the environment (the Deployment sets DDPJOB_OPERATOR_NAMESPACES)
# ---------------------------------------------------------------------------------------------
def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    defaults = load_settings()
    parser = argparse.ArgumentParser(
        prog="ddpjob-operator",
        description="The DDPJob operator: kopf, standalone (no kopf peering; replicas elect a leader on a "
        "Lease), with a liveness endpoint.")
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
    global NAMESPACES
    NAMESPACES = list(namespaces)  # the pod watch's scope: the same as kopf's
    kopf.run(standalone=True, clusterwide=not namespaces, namespaces=namespaces,
             liveness_endpoint=args.liveness)
    return 0
