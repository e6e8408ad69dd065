"""A small JSON client for the Kubernetes API, used by the node agent.

The agent handles every object as the plain dict the API server sends (as a kubelet handles
its typed objects), so it talks REST directly: no model classes to convert, and list+watch
with resourceVersion handling it controls, which keeps its hundreds of pod updates cheap.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlencode

import urllib3
import yaml

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str):
        self.status = status
        super().__init__(f"{method} {path} -> {status}: {body[:500]}")


class RestClient:
    def __init__(self, server: str, ca_cert: str, client_cert: str, client_key: str):
        self.server = server.rstrip("/")
        self.pool = urllib3.PoolManager(
            num_pools=4,
            # Blocking: hundreds of pod threads queue for a connection instead of opening
            # (and discarding) extra ones.
            maxsize=48,
            block=True,
            cert_reqs="CERT_REQUIRED",
            ca_certs=ca_cert,
            cert_file=client_cert,
            key_file=client_key,
            retries=False,
        )

    @classmethod
    def from_kubeconfig(cls, path: Path) -> "RestClient":
        """Only the client-certificate kubeconfigs the test bed writes itself."""
        config = yaml.safe_load(Path(path).read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        return cls(
            cluster["server"], cluster["certificate-authority"],
            user["client-certificate"], user["client-key"],
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict | None = None,
        body: dict | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
        attempts: int = 3,
    ) -> dict:
        """One API call; retried on connection errors and 5xx/429, raising ApiError otherwise."""
        headers = {"Accept": "application/json"}
        encoded = None
        if body is not None:
            encoded = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        for attempt in range(1, attempts + 1):
            try:
                response = self.pool.urlopen(
                    method, self.server + path + _query_string(query), body=encoded,
                    headers=headers, timeout=timeout,
                )
            except urllib3.exceptions.HTTPError as error:
                if attempt == attempts:
                    raise
                log.warning("%s %s failed (%s); retrying", method, path, error)
                time.sleep(0.2 * attempt)
                continue
            if response.status in (429, 500, 502, 503, 504) and attempt < attempts:
                time.sleep(0.2 * attempt)
                continue
            text = response.data.decode(errors="replace")
            if not 200 <= response.status < 300:
                raise ApiError(response.status, method, path, text)
            return json.loads(text) if text else {}
        raise AssertionError("unreachable")

    def get(self, path: str, **query) -> dict:
        return self.request("GET", path, query=query or None)

    def create(self, path: str, body: dict) -> dict:
        return self.request("POST", path, body=body)

    def merge_patch(self, path: str, body: dict) -> dict:
        return self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    def strategic_patch(self, path: str, body: dict) -> dict:
        return self.request(
            "PATCH", path, body=body, content_type="application/strategic-merge-patch+json"
        )

    def delete(self, path: str, body: dict | None = None) -> dict:
        return self.request("DELETE", path, body=body)

    def watch_events(self, path: str, query: dict, timeout_seconds: int) -> Iterator[dict]:
        """Yield the decoded events of one watch request until the server ends it."""
        query = {**query, "watch": "true", "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(timeout_seconds)}
        response = self.pool.urlopen(
            "GET", self.server + path + _query_string(query),
            headers={"Accept": "application/json"}, preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=timeout_seconds + 30),
        )
        try:
            if response.status != 200:
                raise ApiError(response.status, "WATCH", path, response.read().decode())
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.release_conn()


def _query_string(query: dict | None) -> str:
    if not query:
        return ""
    return "?" + urlencode(query)


class Informer(threading.Thread):
    """List, then watch, one collection forever; relist when the watch expires (410).

    ``on_event(type, obj)`` gets ADDED, MODIFIED and DELETED, including DELETED for objects
    that vanished while no watch was open, so the handler's view never drifts.
    """

    def __init__(
        self,
        client: RestClient,
        path: str,
        on_event: Callable[[str, dict], None],
        *,
        label_selector: str | None = None,
        stop: threading.Event,
    ):
        super().__init__(name=f"informer {path}", daemon=True)
        self.client = client
        self.path = path
        self.on_event = on_event
        self.query = {"labelSelector": label_selector} if label_selector else {}
        self.stop_event = stop
        self.known: dict[str, dict] = {}  # uid -> last object seen
        self.synced = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                resource_version = self._relist()
                self.synced.set()
                self._watch(resource_version)
            except Exception as error:  # noqa: BLE001 - the agent must outlive API hiccups
                if self.stop_event.is_set():
                    return
                log.warning("informer %s: %s; relisting", self.path, error)
                self.stop_event.wait(1)

    def _emit(self, event_type: str, obj: dict) -> None:
        try:
            self.on_event(event_type, obj)
        except Exception:  # noqa: BLE001
            log.exception("handler for %s %s failed", event_type, self.path)

    def _relist(self) -> str:
        listing = self.client.get(self.path, **self.query)
        seen = {}
        for item in listing.get("items", []):
            uid = item["metadata"]["uid"]
            seen[uid] = item
            self._emit("MODIFIED" if uid in self.known else "ADDED", item)
        for uid, obj in list(self.known.items()):
            if uid not in seen:
                self._emit("DELETED", obj)
        self.known = seen
        return listing["metadata"]["resourceVersion"]

    def _watch(self, resource_version: str) -> None:
        while not self.stop_event.is_set():
            query = {**self.query, "resourceVersion": resource_version}
            for event in self.client.watch_events(self.path, query, timeout_seconds=240):
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    # 410 Gone: our resourceVersion is too old; start over with a list.
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                resource_version = obj["metadata"]["resourceVersion"]
                if kind == "BOOKMARK":
                    continue
                uid = obj["metadata"]["uid"]
                if kind == "DELETED":
                    self.known.pop(uid, None)
                else:
                    self.known[uid] = obj
                self._emit(kind, obj)
