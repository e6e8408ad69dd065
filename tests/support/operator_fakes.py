"""A fake API for the operator's shell, and the DDPJob objects and pods its tests feed it.

``FakeKube`` records the requests a reconcile pass makes, in order, and fails those it is told
to; ``body`` is a DDPJob as the watch delivers it and ``parse`` a stand-in for
``validation.parse_ddpjob`` (these tests are about the shell, not validation); ``run_pass`` is one
reconcile pass with them. ``FakeApiClient`` stands in for the Kubernetes client's ApiClient
under ``kube.Kube`` (the request layer). The progress fakes
(``FakePods``, ``running_status``, ``pods``) are for the polling and hang-detection passes.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import threading

from ddpjob.api import progress, spec
from ddpjob.api.status import RUNNING, JobStatus, format_time, with_phase
from ddpjob.controller.kube import ApiError, CreateOutcome, DeleteOutcome
from ddpjob.controller.reconcile import reconcile
from ddpjob.controller.settings import OperatorSettings
from tests.support.jobs import UID, pod_view

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
SETTINGS = OperatorSettings(coalesce_seconds=0.001)


def at(seconds: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=seconds)


def body(nnodes: int = 2, generation: int = 1, status: dict | None = None, **spec_fields) -> dict:
    obj = {"apiVersion": "ddpjob.dev/v1alpha1", "kind": "DDPJob",
           "metadata": {"name": "train", "namespace": "ns", "uid": UID, "generation": generation},
           "spec": {"nnodes": nnodes, "image": "img", **spec_fields}}
    if status is not None:
        obj["status"] = status
    return obj


def parse(obj: dict) -> spec.DDPJob:
    """A stand-in for validation.parse_ddpjob: these tests are about the shell, not validation."""
    fields = dict(obj["spec"])
    if fields.get("bad"):
        raise ValueError("spec.nnodes: must be an integer >= 1, got string \"two\"")
    if "failurePolicy" in fields:
        fields["failurePolicy"] = spec.FailurePolicy(**fields["failurePolicy"])
    meta = obj["metadata"]
    return spec.DDPJob(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid"), spec=spec.DDPJobSpec(**fields))


def apply_merge_patch(target: dict, patch: dict) -> dict:
    """RFC 7386, as the API server applies a ``merge-patch+json`` body."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply_merge_patch(out[key], value)
        else:
            out[key] = value
    return out


class FakeKube:
    """Records requests in order; fails those it is told to."""

    def __init__(self):
        self.log: list[tuple] = []
        self.status: dict | None = None
        self.create_error: ApiError | None = None
        self.status_error: ApiError | None = None
        self.delete_gone = False
        self.existing_service: dict | None = None  # a Service already there with the job's name
        self.lock = threading.Lock()
        # The job's resourceVersion as the API server would keep it: each write moves it on,
        # and a status write whose precondition is not it is refused (409 Conflict).
        self.resource_version = 100
        self.preconditions: list[str | None] = []

    def patch_status(self, namespace, name, status, *, resource_version=None):
        self.log.append(("patch_status", status["phase"], status["reason"]))
        self.preconditions.append(resource_version)
        if self.status_error:
            raise self.status_error
        if resource_version is not None and resource_version != str(self.resource_version):
            raise ApiError(409, "Conflict", "the object has been modified; please apply your changes "
                           "to the latest version and try again", f"patch status of DDPJob {name}")
        # As the API server does with a JSON merge patch: a null removes, a left-out key stays.
        self.status = apply_merge_patch(self.status or {}, status)
        self.resource_version += 1
        return {"metadata": {"resourceVersion": str(self.resource_version)}, "status": self.status}

    def create_service(self, service):
        self.log.append(("create_service", service["metadata"]["name"]))
        return self.existing_service

    def create_pods(self, pods):
        self.log.append(("create_pods", tuple(p["metadata"]["name"] for p in pods)))
        if self.create_error:
            return [CreateOutcome(p["metadata"]["name"], False, self.create_error) for p in pods]
        return [CreateOutcome(p["metadata"]["name"], True) for p in pods]

    def delete_pods(self, namespace, pods, *, force=False):
        pods = list(pods)
        self.log.append(("force_delete" if force else "delete", tuple(n for n, _ in pods)))
        return [DeleteOutcome(n, u, self.delete_gone or force) for n, u in pods]

    def delete_job(self, namespace, name, uid):
        self.log.append(("delete_job", name, uid))

    def relabel_pod(self, namespace, name, uid, labels, *, annotations=None):
        self.log.append(("relabel", name, tuple(sorted({**labels, **(annotations or {})}.items()))))

    def close(self):
        pass

    def kinds(self) -> list[str]:
        return [entry[0] for entry in self.log]


async def eventually(predicate, timeout=2.0):
    """Wait (on the running loop) until ``predicate()`` holds; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


# --- progress: the pods' answers and a gang that runs ---------------------------------------------
def running_status(since: float = -100, attempt: int = 0) -> JobStatus:
    base = JobStatus(nnodes=2, restartAttempt=attempt, startTime=format_time(at(-200)))
    created = with_phase(base, "Pending", "PodsCreated", "", at(-200), created=True)
    return with_phase(created, RUNNING, "AllNodesRunning", "2/2 node(s) running", at(since))


def pods(attempt: int = 0):
    return [pod_view(r, "Running", attempt, pod_ip=f"10.0.0.{r + 1}") for r in range(2)]


class FakePods:
    """Stands in for the HTTP GETs to the pods: every rank at ``step``, written just now."""

    def __init__(self):
        self.step, self.calls = 10, []

    def __call__(self, targets, port, timeout):
        self.calls.append((tuple(t.ip for t in targets), port))
        return [{r: progress.RankReport(rank=r, step=self.step, at=self.now, total_steps=100) for r in t.ranks}
                for t in targets]


def run_pass(obj, pods, memory, kube, events=None, now=NOW, services=None):
    events = [] if events is None else events
    return reconcile(obj, pods, memory, kube=kube, settings=SETTINGS, post_event=events.append, now=now, parse=parse,
                     services=services)


def foreign_service(name: str = "train", owner: dict | None = None) -> dict:
    """A Service with the job's name that another user made (``owner``: its controller reference)."""
    meta = {"name": name, "namespace": "ns", "uid": "uid-svc-other", "labels": {"app": "web"}}
    if owner is not None:
        meta["ownerReferences"] = [{"controller": True, **owner}]
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {"selector": {"app": "web"}}}


class FakeResponse:
    def __init__(self, status, body):
        self.status, self.reason, self._body = status, "", body

    def read(self):
        import json
        return json.dumps(self._body).encode()


class FakeApiClient:
    """Answers like the API server: POST 201 or 409 AlreadyExists, DELETE 200 or 404."""

    def __init__(self, existing=(), missing=()):
        self.requests, self.existing, self.missing = [], set(existing), set(missing)
        self.lock = threading.Lock()

    def param_serialize(self, method, resource_path, query_params=None, header_params=None, body=None, auth_settings=None):
        return method, resource_path, header_params, body, query_params

    def call_api(self, method, url, headers, body, query, _request_timeout=None):
        with self.lock:
            self.requests.append((method, url, headers["Content-Type"], body, query))
        name = (body.get("metadata", {}).get("name") if isinstance(body, dict) else None) or url.rsplit("/", 1)[-1]
        if method == "POST" and name in self.existing:
            return FakeResponse(409, {"reason": "AlreadyExists", "message": f"{name} already exists"})
        if method == "POST" and name == "refused":
            return FakeResponse(403, {"reason": "Forbidden", "message": 'violates PodSecurity "restricted:latest"'})
        if method == "DELETE" and name in self.missing:
            return FakeResponse(404, {"reason": "NotFound", "message": "not found"})
        return FakeResponse(201 if method == "POST" else 200, {"status": {"phase": "Running"}})

    def close(self):
        pass
