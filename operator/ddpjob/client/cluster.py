"""The user's side of a cluster: ``ddpjob submit``, ``status`` and ``logs`` talk to the API server
here, and only here, with the user's own kubeconfig and rights.

The official client's ``ApiClient`` does the kubeconfig, auth and TLS; bodies and answers are
plain dicts (as in ``controller/kube.py``, and for the same reason: the API server is the one
validator). ``kubernetes`` is imported when a command connects, so ``ddpjob --help`` and the
commands that need no cluster start without it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from ddpjob.api import names
from ddpjob.api.status import shorten

FIELD_MANAGER = "ddpjob-cli"
REQUEST_TIMEOUT_SECONDS = 30
JOBS = f"/apis/{names.API_GROUP}/{names.API_VERSION}/namespaces/{{namespace}}/{names.PLURAL}"
CONFIGMAPS = "/api/v1/namespaces/{namespace}/configmaps"
PODS = "/api/v1/namespaces/{namespace}/pods"
#: A followed log waits for lines as long as the pod runs: only connecting is bounded.
CONNECT_TIMEOUT_SECONDS = 10


class ClusterError(Exception):
    """A request the cluster refused or could not answer; the message is one line for the user."""

    def __init__(self, message: str, status: int = 0, reason: str = "", hinted: bool = False):
        super().__init__(message)
        self.status, self.reason = status, reason
        self.hinted = hinted  # the message already says what to do (``hint``): said once


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

    def stream(self, path: str, *, what: str, query: Optional[list] = None, follow: bool = False) -> Any:
        """A GET whose answer is read as it comes (a pod's log): the urllib3 response, unread.
        Without ``follow`` each read waits at most REQUEST_TIMEOUT_SECONDS; with it, forever."""
        timeout = (CONNECT_TIMEOUT_SECONDS, None) if follow else REQUEST_TIMEOUT_SECONDS
        response = self._call("GET", path, None, "application/json", query, accept="*/*", timeout=timeout)
        if not 200 <= response.status <= 299:
            raw = response.response.read(64 * 1024)  # an error's answer: a Status, small
            try:
                message = json.loads(raw).get("message")
            except (ValueError, AttributeError):
                message = raw.decode("utf-8", "replace")[:500]
            raise ClusterError(f"{what}: {message or response.reason}", response.status)
        return response.response

    def _call(self, method: str, path: str, body: Any, content_type: str, query: Optional[list],
              accept: str = "application/json", timeout: Any = REQUEST_TIMEOUT_SECONDS) -> Any:
        headers = {"Accept": accept, "Content-Type": content_type}
        query = list(query or [])
        if method in ("POST", "PATCH", "PUT"):
            query.append(("fieldManager", FIELD_MANAGER))
        params = self.api.param_serialize(method=method, resource_path=path, query_params=query or None,
                                          header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            response = self.api.call_api(*params, _request_timeout=timeout)
        except Exception as exc:  # connection refused, timeout, TLS
            raise ClusterError(f"cannot reach the cluster ({self.api.configuration.host}): "
                               f"{connection_failure(exc)}") from None
        return response


# "[Errno 111] Connection refused", "timed out", "CERTIFICATE_VERIFY_FAILED ...": the cause
# urllib3 wraps in a MaxRetryError whose text is ~400 characters of its own internals.
_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")\]]+")
_CAUSE_LIMIT = 160


def connection_failure(exc: BaseException) -> str:
    """The reason a request could not be made, in a few words: the innermost cause urllib3 names
    (its ``reason``), else the exception's own text, bounded."""
    cause: BaseException = exc
    for _ in range(5):  # MaxRetryError -> NewConnectionError -> ConnectionRefusedError ...
        inner = getattr(cause, "reason", None)
        if not isinstance(inner, BaseException):
            break
        cause = inner
    text = str(cause)
    found = _ERRNO.search(text)
    if found:
        return found.group(0).strip()
    text = text.rpartition(">: ")[2] if ">: " in text else text  # "<...Connection object at 0x..>: why"
    return shorten(text.strip() or type(cause).__name__, _CAUSE_LIMIT)


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
        raise ClusterError(f"no usable kubeconfig ({where}): {exc} (pass --kubeconfig FILE, set "
                           "KUBECONFIG, or choose a --context it has)") from None
    return Connection(client.ApiClient(configuration))


def hint(error: ClusterError, namespace: str, resource: str) -> str:
    """``error`` with what the user can do about it, for the refusals every command meets (once:
    an error already hinted is said as it is)."""
    if getattr(error, "hinted", False):
        return str(error)
    if error.status == 0 and str(error).startswith("cannot reach"):
        return f"{error} (is the cluster up? check --context and --kubeconfig)"
    if error.status == 401:
        return f"{error} (the kubeconfig's credentials were refused: log in again, or choose another --context)"
    if error.status == 403:
        return (f"{error} (you may not read {resource} in namespace {namespace}: ask for that, or "
                f"choose another -n or --context)")
    return str(error)


# --- DDPJobs and ConfigMaps --------------------------------------------------------------
def get_job(conn: Connection, namespace: str, name: str) -> Optional[dict]:
    try:
        return conn.request("GET", f"{JOBS.format(namespace=namespace)}/{name}", what=f"DDPJob {namespace}/{name}")
    except ClusterError as error:
        if error.status == 404:
            return None
        raise


#: DDPJobs asked for per page of a list (the API server's continue token brings the next).
LIST_PAGE = 500
ALL_JOBS = f"/apis/{names.API_GROUP}/{names.API_VERSION}/{names.PLURAL}"


def list_jobs(conn: Connection, namespace: Optional[str]) -> list[dict]:
    """Every DDPJob of ``namespace`` (None: of every namespace), a page at a time."""
    path = ALL_JOBS if namespace is None else JOBS.format(namespace=namespace)
    where = "every namespace" if namespace is None else f"namespace {namespace}"
    items: list[dict] = []
    token = ""
    while True:
        query = [("limit", str(LIST_PAGE))] + ([("continue", token)] if token else [])
        data = conn.request("GET", path, query=query, what=f"list DDPJobs in {where}")
        items.extend(data.get("items") or [])
        token = (data.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def delete_job(conn: Connection, namespace: str, name: str) -> bool:
    """Delete the DDPJob (its pods, Service and code go with it: they are its children, and the
    garbage collector deletes them in the background); False when it was not there."""
    body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
    try:
        conn.request("DELETE", f"{JOBS.format(namespace=namespace)}/{name}", body,
                     what=f"delete DDPJob {namespace}/{name}")
    except ClusterError as error:
        if error.status == 404:
            return False
        raise
    return True


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


# --- Pods and their logs -----------------------------------------------------------------
def list_pods(conn: Connection, namespace: str, label_selector: str) -> list[dict]:
    data = conn.request("GET", PODS.format(namespace=namespace), query=[("labelSelector", label_selector)],
                        what=f"list pods in namespace {namespace}")
    return list(data.get("items") or [])


def pod_log(conn: Connection, namespace: str, pod: str, container: str, *, follow: bool = False,
            tail_lines: Optional[int] = None, limit_bytes: Optional[int] = None,
            timestamps: bool = False) -> Any:
    """The pods/log subresource of one container, as a stream of bytes (urllib3's response:
    ``.read1(n)``, ``.close()``): what the kubelet keeps of the container's stdout and stderr;
    ``timestamps``: each line begins with the kubelet's RFC 3339 time and a space."""
    query = [("container", container)]
    if timestamps:
        query.append(("timestamps", "true"))
    if follow:
        query.append(("follow", "true"))
    if tail_lines is not None:
        query.append(("tailLines", str(tail_lines)))
    if limit_bytes is not None:
        query.append(("limitBytes", str(limit_bytes)))
    return conn.stream(f"{PODS.format(namespace=namespace)}/{pod}/log", query=query, follow=follow,
                       what=f"the log of pod {namespace}/{pod}")
