"""The kopf handlers: thin wiring from watch events to one reconcile worker per DDPJob.

Run it (see docs/operator.md)::

    kopf run --standalone --all-namespaces --liveness=http://0.0.0.0:8080/healthz -m ddpjob.controller.handlers

How a pod change reaches the job's status in well under a second, without polling:

* ``ddpjob_pods``, a kopf index fed by the pod watch, keeps a small ``PodView`` of every pod
  labelled ``ddpjob.dev/job-name``, keyed by (namespace, job). The operator never reads pods
  from the API; kopf fills the index from its initial listing before any DDPJob handler runs,
  so after an operator restart the first pass already sees every existing pod (no duplicates).
* ``pod_event`` wakes the job's worker; ``ddpjob_event`` starts, updates and stops workers.
* The job's worker (``ddpjob.controller.workqueue``) runs one ``reconcile.reconcile`` pass
  in a thread when woken or when one of the job's clocks is due.

Why not ``@kopf.daemon``/``@kopf.timer``: kopf puts a finalizer on every object that has one,
and a finalizer blocks ``kubectl delete`` whenever the operator is down. This module registers
no daemon, timer or change/deletion handler, so kopf adds no finalizer and stores no progress
or diff-base annotations at all (they are still configured under ``ddpjob.dev``, should one be
added). Why the status is written by ``kube.patch_status`` and not kopf's ``patch.status``:
kopf applies that patch only when a handler returns, and the status must follow pod events
that no DDPJob handler sees; ``Kube.patch_status`` is the one status writer.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

import kopf

from ddpjob.api import names
from ddpjob.controller import kueue
from ddpjob.controller.decide import Event, PodView, view_pod
from ddpjob.controller import metrics
from ddpjob.controller.kube import Kube
from ddpjob.controller.settings import load_settings
from ddpjob.controller.workqueue import JobKey, Runtime

POD_FILTER = {names.LABEL_JOB_NAME: kopf.PRESENT}


class _QuietWatchHandlers(logging.Filter):
    """kopf logs "Handler 'pod_event' succeeded." at INFO for every watch event: thousands of
    lines (and CPU) for one big gang, saying nothing. Failures are still logged."""

    QUIET = tuple(f"Handler {name!r} succeeded" for name in (
        "pod_event", "ddpjob_event", "ddpjob_pods", "workload_event", "ddpjob_workloads"))

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and any(q in record.getMessage() for q in self.QUIET))


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """kopf's own state under the project's API group, and only our pods on the pod watch."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.API_GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{names.API_GROUP}/finalizer"  # never added: see above
    # Server-side filtering: the API server sends only pods that carry the job label, instead of
    # every pod of the cluster for kopf to drop.
    settings.watching.label_selectors["v1", "pods"] = names.LABEL_JOB_NAME
    kopf_objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietWatchHandlers) for f in kopf_objects.filters):
        kopf_objects.addFilter(_QuietWatchHandlers())


def _kopf_event(body: Mapping[str, Any], event: Event) -> None:
    """Post an Event on the DDPJob through kopf's queue (callable from the reconcile threads)."""
    try:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    except LookupError:  # kopf's event queue exists only inside a running operator
        pass


RUNTIME = Runtime()


# ---------------------------------------------------------------------------------------------
# The handlers (each a few lines; all async and non-blocking, so none waits for a thread)
# ---------------------------------------------------------------------------------------------
@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure_kopf(settings)
    operator_settings = load_settings()
    RUNTIME.start(operator_settings, Kube.connect, _kopf_event)
    metrics.serve(operator_settings.metrics_port)


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
    return {(str(meta.get("namespace")), str(meta["labels"][names.LABEL_JOB_NAME])): view}


@kopf.on.event("v1", "pods", labels=POD_FILTER)
async def pod_event(body: Mapping[str, Any], **_: Any) -> None:
    meta = body.get("metadata") or {}
    RUNTIME.wake((str(meta.get("namespace")), str((meta.get("labels") or {}).get(names.LABEL_JOB_NAME))))


# Kueue's Workloads of queued DDPJobs (docs/kueue.md). Without Kueue's CRDs kopf serves nothing
# here and keeps watching for them to appear; jobs without the queue label never have one.
@kopf.index(kueue.GROUP, kueue.VERSION, kueue.WORKLOAD_PLURAL, labels=POD_FILTER)
async def ddpjob_workloads(body: Mapping[str, Any], **_: Any) -> dict[JobKey, kueue.WorkloadView]:
    meta = body.get("metadata") or {}
    return {(str(meta.get("namespace")), str(meta["labels"][names.LABEL_JOB_NAME])): kueue.view_workload(body)}


@kopf.on.event(kueue.GROUP, kueue.VERSION, kueue.WORKLOAD_PLURAL, labels=POD_FILTER)
async def workload_event(body: Mapping[str, Any], **_: Any) -> None:
    meta = body.get("metadata") or {}
    RUNTIME.wake((str(meta.get("namespace")), str((meta.get("labels") or {}).get(names.LABEL_JOB_NAME))))


@kopf.on.event(names.API_GROUP, names.API_VERSION, names.PLURAL)
async def ddpjob_event(event: Mapping[str, Any], ddpjob_pods: Mapping[JobKey, Any],
                       ddpjob_workloads: Optional[Mapping[JobKey, Any]] = None, **_: Any) -> None:
    RUNTIME.observe(event.get("type"), event["object"], ddpjob_pods, ddpjob_workloads)


# ---------------------------------------------------------------------------------------------
# `ddpjob-operator`: `kopf run --standalone ... -m ddpjob.controller.handlers` with its scope from
# flags or the environment (the Deployment sets DDPJOB_OPERATOR_NAMESPACES)
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
