"""The operator's own Kubernetes requests: nine kinds of write and three reads, nothing else, the
leader election's Lease (get, create, update: ``controller.leader``), and the pod watch's list and
watch of the job-labelled pods (``controller.podwatch``).

Writes: patch a DDPJob's status, create its Service, create and delete its pods, relabel a pod
it restarted in place (a JSON patch of its attempt label that tests the pod's uid), delete the
DDPJob (ttlSecondsAfterFinished); for a job Kueue queues, create its Workload, patch that
Workload's status, and delete it when it is stale (the job queues again with a new one). Reads:
the Service with the job's name when creating it found one there (whose it is), and only for
Kueue, a WorkloadPriorityClass (once per Workload created) and the admitted ResourceFlavors (when
an admitted gang is created). No pass reads a pod, a DDPJob, a Service or a Workload: what the
operator knows of them comes from watches (the pod watch's index, kopf's for the rest), so the
request count per pod is a constant (one create, at most one delete).

Every write but the Lease's passes the ``fence`` first: a replica that is not the leader (or
no longer sure it is: its renew deadline passed) sends nothing (docs/operator.md, "High
availability").

Requests go through the official client's ``ApiClient`` (its auth, TLS and kubeconfig handling)
with plain dicts as bodies. The typed ``CoreV1Api`` methods of kubernetes>=35 validate bodies
with pydantic models that refuse fields they do not know, and a pod template is the user's
to fill; the API server is the one validator. Responses are not deserialised into models either
(a 256-pod gang would spend seconds of CPU on objects nobody reads).

Many-pod operations run on a thread pool of their own (``Kube.pool``, create_workers threads;
workqueue.py lists the operator's pools), so a gang's POSTs overlap instead of being sequential
round trips.
"""
from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Protocol, Sequence

from ddpjob.api import names
from ddpjob.controller import fastjson, metrics
from ddpjob.controller.settings import OperatorSettings

logger = logging.getLogger(__name__)

FIELD_MANAGER = "ddpjob-operator"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
SECRETS = "/api/v1/namespaces/{namespace}/secrets"
NOT_LEADER = "NotLeader"


# Pods per page of the pod watch's list: what the operator holds raw at once, however many pods
# match (docs/security.md, "the pod watch's memory"). A page is held about three times over while
# it decodes (its JSON, its text, the objects: ``_loads``), and a pod's JSON can be 6 times what
# etcd stores (Go writes a control character as \u0001): 10 pods at etcd's limit (1.5 MiB) are
# at most 90 MiB of JSON, 195 MiB in all while decoding, the worst case; 10 pods of 256 KiB of
# annotations each (the API server's limit), 7.5 MiB (32.5 MiB if every character is escaped).
# Typical pods (10-20 KiB) make a page of 100-200 KiB; 1000 pods are 100 round trips.
LIST_PAGE = 10
WATCH_READ_BYTES = 64 * 1024
WATCH_READ_GRACE_SECONDS = 30
MAX_WATCH_EVENT_BYTES = 16 * 1024 * 1024  # the API server's request limit is 3 MiB; etcd's 1.5 MiB
LARGE_BODY_BYTES = 1024 * 1024  # past this, an answer or event is decoded by the standard library


def _loads(raw: bytes) -> Any:
    """orjson (``fastjson``) for the usual answer of a few KiB, the standard library for a large
    one: orjson holds about 12 times its input while it decodes (its parsed document, then the
    objects), the standard library about once (the text). A 12.5 MiB list page of fat pods peaked
    at 175 MiB with orjson, 37 MiB without."""
    return json.loads(raw) if len(raw) > LARGE_BODY_BYTES else fastjson.loads(raw)


def _decoded(raw: bytes) -> dict:
    """An answer's JSON object; what is not one becomes its text (bounded) as the message."""
    try:
        data = _loads(raw)
    except ValueError:
        return {"message": raw.decode("utf-8", "replace")[:500]}
    return data if isinstance(data, dict) else {"message": str(data)[:500]}


# What the DDPJob's own status write is called in its errors (``ApiError.what``); the Workload's
# is "patch status of Workload NAME" and must never be taken for it.
JOB_STATUS_WRITE = "patch status of DDPJob"


class ApiError(Exception):
    """A failed request: HTTP status, the API's reason (AlreadyExists, NotFound, ...) and message."""

    def __init__(self, status: int, reason: str, message: str, what: str = ""):
        self.status, self.reason, self.message, self.what = status, reason, message, what
        super().__init__(f"{what}: {status} {reason}: {message}" if what else f"{status} {reason}: {message}")

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def of_job_status(self) -> bool:
        """The failed request was the DDPJob's status write (``Kube.patch_status``)."""
        return self.what.startswith(JOB_STATUS_WRITE + " ")

    @property
    def conflict(self) -> bool:
        """A write's resourceVersion precondition failed: the object changed since."""
        return self.status == 409 and self.reason == "Conflict"

    @property
    def permanent(self) -> bool:
        """A refusal a retry cannot change: an invalid object or an admission policy (Pod
        Security). Quota (403 'exceeded quota') and RBAC denials are transient: an
        administrator can fix them and the operator keeps trying."""
        if self.status in (400, 422):
            return True
        return self.status == 403 and "violates PodSecurity" in self.message


@dataclass(frozen=True)
class DeleteOutcome:
    name: str
    uid: str
    gone: bool  # the pod no longer exists (deleted now or already)
    error: Optional[ApiError] = None


@dataclass(frozen=True)
class CreateOutcome:
    name: str
    created: bool  # created now, or it already existed
    error: Optional[ApiError] = None


class KubeApi(Protocol):
    """What one reconcile pass may do to the cluster: the operator's five writes and one read
    (whose a Service in the way is), and for Kueue three more writes and two reads; nothing else.

    ``Kube`` implements it over HTTP; the unit tests pass a fake. Keeping the list this short is
    part of the security story (docs/security.md): the operator touches only what it owns.
    """

    def patch_status(self, namespace: str, name: str, status: dict, *,
                     resource_version: Optional[str] = None) -> dict: ...

    def create_service(self, service: dict) -> Optional[dict]: ...

    def create_pods(self, pods: Sequence[dict]) -> list[CreateOutcome]: ...

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]], *,
                    force: bool = False) -> list[DeleteOutcome]: ...

    def delete_job(self, namespace: str, name: str, uid: Optional[str]) -> None: ...

    def relabel_pod(self, namespace: str, name: str, uid: str, labels: Mapping[str, str], *,
                    annotations: Optional[Mapping[str, str]] = None) -> None: ...

    # Kueue (only for a DDPJob that names a LocalQueue; docs/kueue.md)
    def create_workload(self, workload: dict) -> None: ...

    def patch_workload_status(self, namespace: str, name: str, patch: dict) -> None: ...

    def delete_workload(self, namespace: str, name: str, uid: str) -> None: ...

    def get_workload_priority(self, name: str) -> int: ...

    def get_resource_flavor(self, name: str) -> dict: ...


class Kube:
    """The requests the operator makes. Tests substitute a fake with the same methods."""

    def __init__(self, api_client: Any, settings: OperatorSettings):
        self.api = api_client
        self.settings = settings
        self.pool = ThreadPoolExecutor(max_workers=settings.create_workers, thread_name_prefix="ddpjob-kube")
        # Whether this replica may write now (the leader election's verdict, checked before
        # every request but the Lease's); a lone operator always may.
        self.fence: Callable[[], bool] = lambda: True

    @classmethod
    def connect(cls, settings: OperatorSettings) -> "Kube":
        """In-cluster credentials, else the kubeconfig (``settings.kubeconfig`` or $KUBECONFIG),
        the same sources kopf logs in with."""
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            if settings.kubeconfig:
                raise config.ConfigException("a kubeconfig is configured")
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(config_file=settings.kubeconfig, client_configuration=configuration)
        # One connection per thread that makes requests (this pool's, and the two pools of
        # reconcile passes in workqueue.Runtime), or urllib3 discards and reopens connections.
        configuration.connection_pool_maxsize = settings.create_workers + 2 * settings.reconcile_workers
        return cls(client.ApiClient(configuration), settings)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.api, "close", None)
        if close is not None:
            close()

    # --- one request ---------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, *, what: str = "",
                content_type: str = "application/json", query: Optional[list] = None,
                timeout: Optional[float] = None, fenced: bool = True, read_body: bool = True) -> dict:
        """One request; the answer's JSON, or ``{}`` for a success when ``read_body`` is False
        (a created or deleted pod comes back whole, kilobytes of JSON nobody reads: decoding
        them was a fifth of what the operator decoded with 100 jobs). An error is always read."""
        if fenced and method != "GET" and not self.fence():
            raise ApiError(0, NOT_LEADER, "this replica does not hold the leader Lease: it writes nothing", what)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        query = list(query or [])
        if method in ("POST", "PATCH", "PUT"):
            query.append(("fieldManager", FIELD_MANAGER))
        params = self.api.param_serialize(method=method, resource_path=path, query_params=query or None,
                                          header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            response = self.api.call_api(*params, _request_timeout=timeout or self.settings.request_timeout_seconds)
        except Exception as exc:  # connection refused, timeout, TLS: the same path as an API error
            metrics.API_REQUESTS.labels(method, "0").inc()
            raise ApiError(0, type(exc).__name__, str(exc), what) from exc
        metrics.API_REQUESTS.labels(method, str(response.status)).inc()
        raw = response.read() or b"{}"
        if not read_body and 200 <= response.status <= 299:
            return {}
        data = _decoded(raw)
        if not 200 <= response.status <= 299:
            raise ApiError(response.status, str(data.get("reason") or response.reason or ""),
                           str(data.get("message") or ""), what)
        return data

    # --- the operator's operations -------------------------------------------------------------
    def patch_status(self, namespace: str, name: str, status: dict, *,
                     resource_version: Optional[str] = None) -> dict:
        """Merge-patch the status subresource; returns the DDPJob as the server now holds it.
        The operator's one status writer (see handlers.py for why not kopf's patch).

        ``resource_version``: the write's precondition. The API server refuses the patch (409
        Conflict) when the job has changed since that version, as client-go's Update does: a
        write that was decided on an older view, say that of a leader stopped mid-pass whose
        successor has written since, never lands over the newer one (docs/security.md)."""
        path = (f"/apis/{names.API_GROUP}/{names.API_VERSION}/namespaces/{namespace}/"
                f"{names.PLURAL}/{name}/status")
        patch: dict = {"status": status}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        return self.request("PATCH", path, patch, what=f"{JOB_STATUS_WRITE} {name}",
                            content_type="application/merge-patch+json")

    def create_service(self, service: dict) -> Optional[dict]:
        """Create the job's Service; None once created. If one of that name exists already, it
        is returned as the API server holds it (one GET): whose it is decides whether the job
        may use it (a Service of another owner is never adopted, changed or deleted)."""
        ns, name = service["metadata"]["namespace"], service["metadata"]["name"]
        try:
            self.request("POST", f"/api/v1/namespaces/{ns}/services", service, what=f"create Service {name}",
                         read_body=False)
        except ApiError as exc:
            if not exc.already_exists:
                raise
            try:
                return self.request("GET", f"/api/v1/namespaces/{ns}/services/{name}", what=f"get Service {name}")
            except ApiError as again:
                if again.not_found:  # deleted in between: the next pass creates it
                    return {"metadata": {"name": name}}
                raise
        return None

    def create_pods(self, pods: Sequence[dict]) -> list[CreateOutcome]:
        """Create every pod at once; "already exists" counts as created (idempotent by name)."""
        return list(self.pool.map(self._create_pod, pods))

    def _create_pod(self, pod: dict) -> CreateOutcome:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        started = time.perf_counter()
        try:
            self.request("POST", f"/api/v1/namespaces/{ns}/pods", pod, what=f"create pod {name}", read_body=False)
            metrics.POD_CREATION_SECONDS.observe(time.perf_counter() - started)
        except ApiError as exc:
            if exc.already_exists:
                return CreateOutcome(name, True)
            return CreateOutcome(name, False, exc)
        return CreateOutcome(name, True)

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]], *,
                    force: bool = False) -> list[DeleteOutcome]:
        """Delete pods given as (name, uid). The uid precondition makes a late delete harmless:
        it can never hit the next attempt's pod of the same name. ``force``: grace period 0."""
        return list(self.pool.map(lambda p: self._delete_pod(namespace, p[0], p[1], force), list(pods)))

    def _delete_pod(self, namespace: str, name: str, uid: str, force: bool) -> DeleteOutcome:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        if force:
            body["gracePeriodSeconds"] = 0
        try:
            self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body,
                         what=f"{'force-' if force else ''}delete pod {name}", read_body=False)
        except ApiError as exc:
            # 404: gone already. 409 on a uid precondition: that name is now another pod, so
            # the one we meant is gone too.
            if exc.not_found or exc.status == 409:
                return DeleteOutcome(name, uid, True)
            return DeleteOutcome(name, uid, False, exc)
        return DeleteOutcome(name, uid, force)

    def relabel_pod(self, namespace: str, name: str, uid: str, labels: Mapping[str, str], *,
                    annotations: Optional[Mapping[str, str]] = None) -> None:
        """Set ``labels`` (and ``annotations``, on a pod created with some) on the pod ``name``
        if it is still the pod ``uid`` (a JSON patch whose test of the uid fails, 422, when the
        name is another pod's by now)."""
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
        for where, values in (("labels", labels), ("annotations", annotations or {})):
            ops += [{"op": "add", "path": f"/metadata/{where}/" + k.replace("~", "~0").replace("/", "~1"),
                     "value": v} for k, v in values.items()]
        self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", ops,
                     what=f"relabel pod {name}", content_type="application/json-patch+json", read_body=False)

    def delete_job(self, namespace: str, name: str, uid: Optional[str]) -> None:
        """ttlSecondsAfterFinished: the DDPJob goes; its children follow by garbage collection."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        path = f"/apis/{names.API_GROUP}/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{name}"
        try:
            self.request("DELETE", path, body, what=f"delete DDPJob {name}", read_body=False)
        except ApiError as exc:
            if not exc.not_found:
                raise

    # --- Kueue (docs/kueue.md) -------------------------------------------------------------------
    def create_workload(self, workload: dict) -> None:
        """The Workload of a queued DDPJob; "already exists" is success (deterministic name)."""
        ns, name = workload["metadata"]["namespace"], workload["metadata"]["name"]
        group_version = workload["apiVersion"]
        try:
            self.request("POST", f"/apis/{group_version}/namespaces/{ns}/workloads", workload,
                         what=f"create Workload {name}", read_body=False)
        except ApiError as exc:
            if not exc.already_exists:
                raise

    def patch_workload_status(self, namespace: str, name: str, patch: dict) -> None:
        """Merge-patch a Workload's status. The patch carries the resourceVersion it was computed
        from: a 409 means Kueue wrote first, and the next watch event brings a new pass."""
        from ddpjob.controller import kueue

        path = f"/apis/{kueue.GROUP}/{kueue.VERSION}/namespaces/{namespace}/workloads/{name}/status"
        self.request("PATCH", path, patch, what=f"patch status of Workload {name}",
                     content_type="application/merge-patch+json", read_body=False)

    def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        """Delete the job's stale Workload (the job queues again with a new one). The uid
        precondition: never the new Workload of the same name; 404 and 409: gone already."""
        from ddpjob.controller import kueue

        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid},
                "propagationPolicy": "Background"}
        path = f"/apis/{kueue.GROUP}/{kueue.VERSION}/namespaces/{namespace}/workloads/{name}"
        try:
            self.request("DELETE", path, body, what=f"delete Workload {name}", read_body=False)
        except ApiError as exc:
            if not (exc.not_found or exc.status == 409):
                raise

    def get_workload_priority(self, name: str) -> int:
        """The value of a WorkloadPriorityClass, read once per Workload the operator creates
        (Kueue's webhook does not fill a Workload's priority in)."""
        from ddpjob.controller import kueue

        obj = self.request("GET", f"/apis/{kueue.GROUP}/{kueue.VERSION}/workloadpriorityclasses/{name}",
                           what=f"get WorkloadPriorityClass {name}")
        return int(obj.get("value") or 0)

    def get_resource_flavor(self, name: str) -> dict:
        """An admitted ResourceFlavor (its nodeLabels and tolerations go on the pods), read when
        an admitted gang is created."""
        from ddpjob.controller import kueue

        return self.request("GET", f"/apis/{kueue.GROUP}/{kueue.VERSION}/resourceflavors/{name}",
                            what=f"get ResourceFlavor {name}")

    # --- the pod watch (controller.podwatch): the job-labelled pods, listed then watched -------
    def list_pods(self, namespace: Optional[str], selector: str) -> tuple[Iterator[dict], str]:
        """Every pod matching ``selector`` in ``namespace`` (None: all namespaces) and the
        resourceVersion to watch from. The pods come one page of ``LIST_PAGE`` at a time, as the
        caller iterates: the first page is read now (it carries the list's resourceVersion, the
        same for every page of one list), each next one once the caller has taken every pod of
        the one before. A pod is anyone's who may create pods, label included, so what the list
        holds raw is at most one page however many pods match (docs/security.md)."""
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        what = f"list pods ({namespace or 'all namespaces'})"
        items, token, version = self._list_page(path, selector, "", what)
        return self._listed_pods(path, selector, items, token, what), version

    def _list_page(self, path: str, selector: str, token: str, what: str) -> tuple[list[dict], str, str]:
        query = [("labelSelector", selector), ("limit", str(LIST_PAGE))] + ([("continue", token)] if token else [])
        page = self.request("GET", path, query=query, what=what)
        meta = page.get("metadata") or {}
        items = page.get("items")
        items = items if isinstance(items, list) else []
        return items, str(meta.get("continue") or ""), str(meta.get("resourceVersion") or "")

    def _listed_pods(self, path: str, selector: str, items: list[dict], token: str,
                     what: str) -> Iterator[dict]:
        """The pods of the first page, then of each next one; each pod is let go of as it is
        handed on (popped), so no page is still held while the next one is read."""
        while True:
            items.reverse()
            while items:
                yield items.pop()
            if not token:
                return
            items, token, _ = self._list_page(path, selector, token, what)

    def watch_pods(self, namespace: Optional[str], selector: str, resource_version: str, *,
                   server_timeout: int, stopped: Callable[[], bool]) -> Iterator[dict]:
        """The watch events after ``resource_version``, decoded, as they come, with bookmarks,
        until the API server ends the watch (``server_timeout`` seconds) or ``stopped()``. An
        event longer than ``MAX_WATCH_EVENT_BYTES`` ends the watch with an error (the API server
        stores no object that large)."""
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        query = [("labelSelector", selector), ("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("resourceVersion", resource_version), ("timeoutSeconds", str(server_timeout))]
        what = f"watch pods ({namespace or 'all namespaces'})"
        params = self.api.param_serialize(method="GET", resource_path=path, query_params=query,
                                          header_params={"Accept": "application/json"},
                                          auth_settings=["BearerToken"])
        # The read timeout outlasts the server's own end of the watch: a quiet watch is not a dead one.
        timeout = (self.settings.request_timeout_seconds, server_timeout + WATCH_READ_GRACE_SECONDS)
        try:
            response = self.api.call_api(*params, _request_timeout=timeout)
        except Exception as exc:
            metrics.API_REQUESTS.labels("WATCH", "0").inc()
            raise ApiError(0, type(exc).__name__, str(exc), what) from exc
        metrics.API_REQUESTS.labels("WATCH", str(response.status)).inc()
        raw = response.response  # urllib3's, not read yet
        try:
            if not 200 <= response.status <= 299:
                data = _decoded(response.read() or b"{}")
                raise ApiError(response.status, str(data.get("reason") or response.reason or ""),
                               str(data.get("message") or ""), what)
            buffer = b""
            for chunk in raw.stream(amt=WATCH_READ_BYTES, decode_content=True):
                *lines, buffer = (buffer + chunk).split(b"\n")
                chunk = b""
                # Each line let go of as it is decoded: while the watch waits for the next
                # chunk, nothing of the events already handed on is held here.
                lines.reverse()
                while lines:
                    line = lines.pop()
                    if line.strip():
                        yield _loads(line)
                    line = b""
                if len(buffer) > MAX_WATCH_EVENT_BYTES:
                    raise ApiError(0, "EventTooLarge", f"a watch event over {MAX_WATCH_EVENT_BYTES} bytes", what)
                if stopped():
                    return
        finally:
            raw.close()

    # --- the restart key's Secret, in the operator's own namespace (controller.restart_key) -----
    def get_secret(self, namespace: str, name: str, *, timeout: float) -> Optional[dict]:
        """The Secret, or None if there is none yet (the operator's Role: this one name)."""
        try:
            return self.request("GET", f"{SECRETS.format(namespace=namespace)}/{name}", what=f"get Secret {name}",
                                timeout=timeout, fenced=False)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def create_secret(self, secret: dict, *, timeout: float) -> dict:
        """Create the Secret; "already exists" is an error here (another replica was first).
        Not fenced: a standby makes the key it will need as leader, and nothing else."""
        meta = secret["metadata"]
        return self.request("POST", SECRETS.format(namespace=meta["namespace"]), secret,
                            what=f"create Secret {meta['name']}", timeout=timeout, fenced=False)

    # --- the leader election's Lease (controller.leader; docs/operator.md, High availability) --
    def get_lease(self, namespace: str, name: str, *, timeout: float) -> Optional[dict]:
        """The Lease, or None if there is none yet."""
        try:
            return self.request("GET", f"{LEASES.format(namespace=namespace)}/{name}", what=f"get Lease {name}",
                                timeout=timeout, fenced=False)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def create_lease(self, lease: dict, *, timeout: float) -> dict:
        """Create the Lease; "already exists" is an error here (another replica was first)."""
        meta = lease["metadata"]
        return self.request("POST", LEASES.format(namespace=meta["namespace"]), lease,
                            what=f"create Lease {meta['name']}", timeout=timeout, fenced=False)

    def replace_lease(self, lease: dict, *, timeout: float) -> dict:
        """Update (PUT) the Lease; its metadata.resourceVersion makes it fail with 409 if
        anyone wrote it since."""
        meta = lease["metadata"]
        return self.request("PUT", f"{LEASES.format(namespace=meta['namespace'])}/{meta['name']}", lease,
                            what=f"update Lease {meta['name']}", timeout=timeout, fenced=False)
