"""The operator's own Kubernetes requests: create, delete and patch, nothing else.

Reads never happen here: what the operator knows of pods comes from kopf's watch (the pod
index), so the request count per pod is a constant (one create, at most one delete).

Requests go through the official client's ``ApiClient`` (its auth, TLS and kubeconfig handling)
with plain dicts as bodies. The typed ``CoreV1Api`` methods of kubernetes>=35 validate bodies
with pydantic models that refuse fields they do not know, and a pod template is the user's
to fill; the API server is the one validator. Responses are not deserialised into models either
(a 256-pod gang would spend seconds of CPU on objects nobody reads).

Many-pod operations run on a thread pool, so a gang's POSTs overlap instead of being sequential
round trips.
"""
from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Protocol, Sequence

from ddpjob.api import names
from ddpjob.controller import metrics
from ddpjob.controller.settings import OperatorSettings

logger = logging.getLogger(__name__)

FIELD_MANAGER = "ddpjob-operator"


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
    """What one reconcile pass may do to the cluster: the operator's five writes, nothing else.

    ``Kube`` implements it over HTTP; the unit tests pass a fake. Keeping the list this short is
    part of the security story (docs/security.md): the operator touches only what it owns.
    """

    def patch_status(self, namespace: str, name: str, status: dict) -> dict: ...

    def create_service(self, service: dict) -> None: ...

    def create_pods(self, pods: Sequence[dict]) -> list[CreateOutcome]: ...

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]], *,
                    force: bool = False) -> list[DeleteOutcome]: ...

    def delete_job(self, namespace: str, name: str, uid: Optional[str]) -> None: ...

    # Kueue (only for a DDPJob that names a LocalQueue; docs/kueue.md)
    def create_workload(self, workload: dict) -> None: ...

    def patch_workload_status(self, namespace: str, name: str, patch: dict) -> None: ...

    def get_workload_priority(self, name: str) -> int: ...

    def get_resource_flavor(self, name: str) -> dict: ...


class Kube:
    """The requests the operator makes. Tests substitute a fake with the same methods."""

    def __init__(self, api_client: Any, settings: OperatorSettings):
        self.api = api_client
        self.settings = settings
        self.pool = ThreadPoolExecutor(max_workers=settings.create_workers, thread_name_prefix="ddpjob-kube")

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
        # One connection per worker thread (pod requests, and the two pools of reconcile passes in
        # handlers.Runtime), or urllib3 discards and reopens connections.
        configuration.connection_pool_maxsize = settings.create_workers + 2 * settings.reconcile_workers
        return cls(client.ApiClient(configuration), settings)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.api, "close", None)
        if close is not None:
            close()

    # --- one request ---------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, *, what: str = "",
                content_type: str = "application/json", query: Optional[list] = None) -> dict:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        query = list(query or [])
        if method in ("POST", "PATCH", "PUT"):
            query.append(("fieldManager", FIELD_MANAGER))
        params = self.api.param_serialize(method=method, resource_path=path, query_params=query or None,
                                          header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            response = self.api.call_api(*params, _request_timeout=self.settings.request_timeout_seconds)
        except Exception as exc:  # connection refused, timeout, TLS: the same path as an API error
            metrics.API_REQUESTS.labels(method, "0").inc()
            raise ApiError(0, type(exc).__name__, str(exc), what) from exc
        metrics.API_REQUESTS.labels(method, str(response.status)).inc()
        raw = response.read() or b"{}"
        try:
            data = json.loads(raw)
        except ValueError:
            data = {"message": raw.decode("utf-8", "replace")[:500]}
        if not 200 <= response.status <= 299:
            raise ApiError(response.status, str(data.get("reason") or response.reason or ""),
                           str(data.get("message") or ""), what)
        return data

    # --- the operator's operations -------------------------------------------------------------
    def patch_status(self, namespace: str, name: str, status: dict) -> dict:
        """Merge-patch the status subresource; returns the status the server now holds. The
        operator's one status writer (see handlers.py for why not kopf's patch)."""
        path = (f"/apis/{names.API_GROUP}/{names.API_VERSION}/namespaces/{namespace}/"
                f"{names.PLURAL}/{name}/status")
        obj = self.request("PATCH", path, {"status": status}, what=f"patch status of {name}",
                           content_type="application/merge-patch+json")
        return obj.get("status") or {}

    def create_service(self, service: dict) -> None:
        ns, name = service["metadata"]["namespace"], service["metadata"]["name"]
        try:
            self.request("POST", f"/api/v1/namespaces/{ns}/services", service, what=f"create Service {name}")
        except ApiError as exc:
            if not exc.already_exists:
                raise

    def create_pods(self, pods: Sequence[dict]) -> list[CreateOutcome]:
        """Create every pod at once; "already exists" counts as created (idempotent by name)."""
        return list(self.pool.map(self._create_pod, pods))

    def _create_pod(self, pod: dict) -> CreateOutcome:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        started = time.perf_counter()
        try:
            self.request("POST", f"/api/v1/namespaces/{ns}/pods", pod, what=f"create pod {name}")
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
                         what=f"{'force-' if force else ''}delete pod {name}")
        except ApiError as exc:
            # 404: gone already. 409 on a uid precondition: that name is now another pod, so
            # the one we meant is gone too.
            if exc.not_found or exc.status == 409:
                return DeleteOutcome(name, uid, True)
            return DeleteOutcome(name, uid, False, exc)
        return DeleteOutcome(name, uid, force)

    def delete_job(self, namespace: str, name: str, uid: Optional[str]) -> None:
        """ttlSecondsAfterFinished: the DDPJob goes; its children follow by garbage collection."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        path = f"/apis/{names.API_GROUP}/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{name}"
        try:
            self.request("DELETE", path, body, what=f"delete DDPJob {name}")
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
                         what=f"create Workload {name}")
        except ApiError as exc:
            if not exc.already_exists:
                raise

    def patch_workload_status(self, namespace: str, name: str, patch: dict) -> None:
        """Merge-patch a Workload's status. The patch carries the resourceVersion it was computed
        from: a 409 means Kueue wrote first, and the next watch event brings a new pass."""
        from ddpjob.controller import kueue

        path = f"/apis/{kueue.GROUP}/{kueue.VERSION}/namespaces/{namespace}/workloads/{name}/status"
        self.request("PATCH", path, patch, what=f"patch status of Workload {name}",
                     content_type="application/merge-patch+json")

    def get_workload_priority(self, name: str) -> int:
        """The value of a WorkloadPriorityClass: the one read the operator makes, once per
        Workload it creates (Kueue's webhook does not fill a Workload's priority in)."""
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
