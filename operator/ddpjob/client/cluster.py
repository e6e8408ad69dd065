"""The user's side of a cluster: ``ddpjob submit`` talks to the API server here, and only here,
with the user's own kubeconfig and rights.

The official client's ``ApiClient`` does the kubeconfig, auth and TLS; bodies and answers are
plain dicts (as in ``controller/kube.py``, and for the same reason: the API server is the one
validator). ``kubernetes`` is imported when a command connects, so ``ddpjob --help`` and the
commands that need no cluster start without it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from ddpjob.api import names

FIELD_MANAGER = "ddpjob-cli"
REQUEST_TIMEOUT_SECONDS = 30
JOBS = f"/apis/{names.API_GROUP}/{names.API_VERSION}/namespaces/{{namespace}}/{names.PLURAL}"
CONFIGMAPS = "/api/v1/namespaces/{namespace}/configmaps"


class ClusterError(Exception):
    """A request the cluster refused or could not answer; the message is one line for the user."""

    def __init__(self, message: str, status: int = 0, reason: str = ""):
        super().__init__(message)
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class Connection:
    api: Any  # kubernetes.client.ApiClient

    def request(self, method: str, path: str, body: Any = None, *, what: str,
                content_type: str = "application/json", query: Optional[list] = None) -> dict:
        response = self._call(method, path, body, content_type, query)
        raw = response.read() or b"{}"
        try:
            data = json.loads(raw)
        except ValueError:
            data = {"message": raw.decode("utf-8", "replace")[:500]}
        if not 200 <= response.status <= 299:
            raise ClusterError(f"{what}: {data.get('message') or response.reason}", response.status,
                               str(data.get("reason") or ""))
        return data

    def _call(self, method: str, path: str, body: Any, content_type: str, query: Optional[list]) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        query = list(query or [])
        if method in ("POST", "PATCH", "PUT"):
            query.append(("fieldManager", FIELD_MANAGER))
        params = self.api.param_serialize(method=method, resource_path=path, query_params=query or None,
                                          header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            response = self.api.call_api(*params, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except Exception as exc:  # connection refused, timeout, TLS
            raise ClusterError(f"cannot reach the cluster ({self.api.configuration.host}): "
                               f"{type(exc).__name__}: {exc}") from None
        return response


def connect(kubeconfig: Optional[str] = None, context: Optional[str] = None) -> Connection:
    """The user's cluster: ``--kubeconfig`` (else $KUBECONFIG, else ~/.kube/config) and
    ``--context`` (else the current one)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise ClusterError("talking to a cluster needs the Kubernetes client: pip install "
                           "'ddpjob[operator]' (or kubernetes); --dry-run prints the manifests "
                           "without one") from None
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    except Exception as exc:  # ConfigException, a missing or unreadable file
        where = kubeconfig or "$KUBECONFIG or ~/.kube/config"
        raise ClusterError(f"no usable kubeconfig ({where}): {exc}") from None
    return Connection(client.ApiClient(configuration))


# --- DDPJobs and ConfigMaps --------------------------------------------------------------
def get_job(conn: Connection, namespace: str, name: str) -> Optional[dict]:
    try:
        return conn.request("GET", f"{JOBS.format(namespace=namespace)}/{name}", what=f"DDPJob {namespace}/{name}")
    except ClusterError as error:
        if error.status == 404:
            return None
        raise


def create_job(conn: Connection, job: dict) -> dict:
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    return conn.request("POST", JOBS.format(namespace=namespace), job, what=f"create DDPJob {namespace}/{name}")


def put_configmap(conn: Connection, configmap: dict, *, owned_if: tuple[str, str]) -> dict:
    """Create the ConfigMap, or replace one of that name whose label ``owned_if`` (key, value)
    says it is the same job's code; anything else of that name is left alone and refused."""
    namespace, name = configmap["metadata"]["namespace"], configmap["metadata"]["name"]
    collection = CONFIGMAPS.format(namespace=namespace)
    try:
        return conn.request("POST", collection, configmap, what=f"create ConfigMap {namespace}/{name}")
    except ClusterError as error:
        if error.status != 409:
            raise
    existing = conn.request("GET", f"{collection}/{name}", what=f"ConfigMap {namespace}/{name}")
    key, value = owned_if
    if (existing["metadata"].get("labels") or {}).get(key) != value:
        raise ClusterError(f"ConfigMap {namespace}/{name} exists and is not the code `ddpjob submit` "
                           f"wrote for job {value} (no label {key}={value}): choose another --name")
    replacement = {**configmap, "metadata": {**configmap["metadata"],
                                             "resourceVersion": existing["metadata"]["resourceVersion"]}}
    return conn.request("PUT", f"{collection}/{name}", replacement, what=f"replace ConfigMap {namespace}/{name}")


def own_configmap(conn: Connection, configmap: dict, job: dict) -> None:
    """Make the DDPJob the ConfigMap's owner: deleting the job deletes its code."""
    namespace, name = configmap["metadata"]["namespace"], configmap["metadata"]["name"]
    owner = {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": job["metadata"]["name"],
             "uid": job["metadata"]["uid"]}
    conn.request("PATCH", f"{CONFIGMAPS.format(namespace=namespace)}/{name}",
                 {"metadata": {"ownerReferences": [owner]}}, content_type="application/merge-patch+json",
                 what=f"set the owner of ConfigMap {namespace}/{name}")
