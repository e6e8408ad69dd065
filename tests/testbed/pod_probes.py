"""Container probes as a kubelet runs them (pkg/kubelet/prober, pkg/probe in v1.36).

One ``ContainerProbes`` per container *run* (a restart gets a new one, as a new container ID
gets new results in the kubelet). Per probe kind a thread ticks every ``periodSeconds``:
the first tick at once (the kubelet triggers a manual run when a result is missing), none
counted before ``initialDelaySeconds`` have passed since the container started, readiness and
liveness only once the container has *started* (its startup probe passed, or it has none).
``successThreshold``/``failureThreshold`` consecutive results flip the state. The owner hears
only changes: ``on_change(started, ready)``, and ``on_unhealthy(kind, message)`` when a
liveness or startup probe fails for good (the kubelet then kills the container; that probe
stops until the next run).

Initial results, as the kubelet's: readiness Failure (not ready until the first success),
liveness Success, startup Unknown (``started`` false until it succeeds).

Handlers, probed from the node side as the kubelet does: ``httpGet`` and ``tcpSocket`` connect
from the agent (the host, on the pod bridge) to the pod IP (or ``host``); ``exec`` runs the
command inside the container's mount, UTS and network namespaces with the container's
environment and working directory (what a CRI exec gives). ``grpc`` is not modelled: it reports
failure with a message saying so (docs/testing.md).
"""
from __future__ import annotations

import http.client
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urljoin, urlsplit

from .pod_env import expand

log = logging.getLogger(__name__)

USER_AGENT = "kube-probe/1.36"  # what the v1.36 kubelet sends
MAX_BODY_BYTES = 10 * 1024  # the kubelet reads at most this much of a probe's answer
MAX_REDIRECTS = 10
MAX_OUTPUT_BYTES = 10 * 1024  # of an exec probe's output, kept for the log
DEFAULT_PERIOD_SECONDS = 10
DEFAULT_TIMEOUT_SECONDS = 1
DEFAULT_SUCCESS_THRESHOLD = 1
DEFAULT_FAILURE_THRESHOLD = 3

NSENTER = shutil.which("nsenter") or "nsenter"  # util-linux (scripts/install-test-deps.sh)

READINESS, LIVENESS, STARTUP = "readiness", "liveness", "startup"
SPEC_FIELDS = {READINESS: "readinessProbe", LIVENESS: "livenessProbe", STARTUP: "startupProbe"}


class ProbeError(Exception):
    """The probe could not even be tried (a port name the container does not declare)."""


@dataclass(frozen=True)
class Probe:
    kind: str
    spec: dict
    initial_delay: int
    period: int
    timeout: int
    success_threshold: int
    failure_threshold: int

    @classmethod
    def of(cls, kind: str, container: dict) -> "Probe | None":
        spec = container.get(SPEC_FIELDS[kind])
        if not spec:
            return None

        def number(key: str, default: int, least: int) -> int:
            value = spec.get(key)
            return max(int(value), least) if value is not None else default

        return cls(
            kind=kind, spec=spec,
            initial_delay=number("initialDelaySeconds", 0, 0),
            period=number("periodSeconds", DEFAULT_PERIOD_SECONDS, 1),
            timeout=number("timeoutSeconds", DEFAULT_TIMEOUT_SECONDS, 1),
            # Liveness and startup probes must have successThreshold 1 (API validation).
            success_threshold=number("successThreshold", DEFAULT_SUCCESS_THRESHOLD, 1),
            failure_threshold=number("failureThreshold", DEFAULT_FAILURE_THRESHOLD, 1),
        )


@dataclass(frozen=True)
class Target:
    """Where a probe of one container run goes."""

    container: dict
    pod_ip: str
    pid: int  # the container's main process: its namespaces are the container's
    env: dict[str, str]


# -- one probe attempt ----------------------------------------------------------------------
def resolve_port(port, container: dict) -> int:
    """A port number, or a name from the container's ``ports`` (then a numeric string), as
    pkg/probe.ResolveContainerPort."""
    number = None
    if isinstance(port, int):
        number = port
    elif isinstance(port, str):
        named = [p.get("containerPort") for p in container.get("ports") or []
                 if p.get("name") == port]
        if named:
            number = int(named[0])
        elif port.isdigit():
            number = int(port)
        else:
            raise ProbeError(f"port {port} not found")
    if number is None or not 0 < number < 65536:
        raise ProbeError(f"invalid port number: {port!r}")
    return number


def probe_once(probe: Probe, target: Target) -> tuple[bool, str]:
    """Run the handler once: (success, what it said)."""
    spec = probe.spec
    try:
        if "exec" in spec:
            return _exec(spec["exec"], target, probe.timeout)
        if "httpGet" in spec:
            return _http_get(spec["httpGet"], target, probe.timeout)
        if "tcpSocket" in spec:
            return _tcp_socket(spec["tcpSocket"], target, probe.timeout)
        if "grpc" in spec:
            return False, "grpc probes are not supported by the test node agent"
    except ProbeError as error:
        return False, str(error)
    return False, "the probe has no handler"


def _tcp_socket(action: dict, target: Target, timeout: float) -> tuple[bool, str]:
    host = action.get("host") or target.pod_ip
    port = resolve_port(action.get("port"), target.container)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True, ""
    except OSError as error:
        return False, f"dial tcp {host}:{port}: {error}"


def _http_get(action: dict, target: Target, timeout: float) -> tuple[bool, str]:
    scheme = (action.get("scheme") or "HTTP").lower()
    host = action.get("host") or target.pod_ip
    port = resolve_port(action.get("port"), target.container)
    path = action.get("path") or "/"
    if not path.startswith("/"):
        path = "/" + path
    headers: dict[str, str] = {}
    for header in action.get("httpHeaders") or []:
        headers[header["name"].title()] = header.get("value", "")
    headers.setdefault("User-Agent", USER_AGENT)
    if "Accept" not in headers:
        headers["Accept"] = "*/*"
    elif not headers["Accept"]:
        del headers["Accept"]  # an empty Accept header asks for none at all
    headers["Connection"] = "close"  # the kubelet's transport disables keep-alives
    deadline = time.monotonic() + timeout  # one timeout for the whole exchange, redirects too
    url = f"{scheme}://{_join(host, port)}{path}"
    first_host = host
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, f"Get {url}: context deadline exceeded"
        try:
            status, location, body = _get(parts, headers, remaining)
        except (OSError, http.client.HTTPException) as error:
            return False, f"Get {url}: {error}"
        if 300 <= status < 400 and location:
            following = urljoin(url, location)
            if urlsplit(following).hostname != first_host:
                # A redirect elsewhere ends the probe: a warning, counted as success.
                return True, f"Probe terminated redirects, Response body: {body[:200]!r}"
            url = following
            continue
        if 200 <= status < 400:
            return True, body.decode(errors="replace")
        return False, f"HTTP probe failed with statuscode: {status}"
    return False, f"Get {url}: stopped after {MAX_REDIRECTS} redirects"


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _get(parts, headers: dict[str, str], timeout: float) -> tuple[int, str | None, bytes]:
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if parts.scheme == "https":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the kubelet does not verify probe certificates
        connection = http.client.HTTPSConnection(parts.hostname, port, timeout=timeout,
                                                 context=context)
    else:
        connection = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.putrequest("GET", target or "/", skip_host="Host" in headers,
                              skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        body = response.read(MAX_BODY_BYTES)
        return response.status, response.getheader("Location"), body
    finally:
        connection.close()


def _exec(action: dict, target: Target, timeout: float) -> tuple[bool, str]:
    # $(VAR) expands from the container's literal env values only (the kubelet's
    # ExpandContainerCommandOnlyStatic).
    static = {e["name"]: e["value"] for e in target.container.get("env") or []
              if "value" in e}
    command = [expand(part, static) for part in action.get("command") or []]
    if not command:
        return False, "exec probe without a command"
    argv = [NSENTER, f"--target={target.pid}", "--mount", "--uts", "--net", "--wd", *command]
    try:
        process = subprocess.Popen(argv, env=target.env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True, close_fds=True)
    except OSError as error:
        return False, f"exec failed: {error}"
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.communicate()
        return False, f"command {command!r} timed out after {timeout}s"
    text = output[-MAX_OUTPUT_BYTES:].decode(errors="replace")
    if process.returncode == 0:
        return True, text
    return False, f"command {command!r} exited {process.returncode}: {text}"


def wait_for_exec(pid: int, launching: list[list[str]], stop: threading.Event,
                  timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = [part.decode(errors="replace")
                        for part in handle.read().split(b"\0")[:-1]]
        except OSError:
            return  # gone: the probes find out themselves
        if argv not in launching:
            return
        stop.wait(0.01)


# -- the probes of one container run ---------------------------------------------------------
class ContainerProbes:
    def __init__(self, target: Target, started_at: float,
                 on_change: Callable[[bool, bool], None],
                 on_unhealthy: Callable[[str, str], None], label: str = ""):
        self.target = target
        self.started_at = started_at  # time.monotonic() of the container start
        self.on_change = on_change
        self.on_unhealthy = on_unhealthy
        self.label = label
        container = target.container
        self.probes = {kind: p for kind in (STARTUP, READINESS, LIVENESS)
                       if (p := Probe.of(kind, container)) is not None}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.started = STARTUP not in self.probes
        self._readiness_ok = READINESS not in self.probes

    @property
    def ready(self) -> bool:
        return self.started and self._readiness_ok

    def start(self, launching: list[list[str]] = ()) -> None:
        """Start probing once the container's command runs: while its main process is still
        one of ``launching`` (the argv of the steps before the exec, which set up its
        namespaces), an exec probe would enter the wrong ones and a connection would fail
        for a reason a kubelet never sees (its runtime reports a container running only
        after the start)."""
        if not self.probes:
            return

        def begin() -> None:
            wait_for_exec(self.target.pid, launching, self._stop)
            for probe in self.probes.values():
                threading.Thread(target=self._loop, args=(probe,), daemon=True,
                                 name=f"{probe.kind} probe {self.label}").start()

        threading.Thread(target=begin, daemon=True, name=f"probes {self.label}").start()

    def stop(self) -> None:
        """No more probes and no more callbacks (the container ended)."""
        with self._lock:
            self._stop.set()

    def _loop(self, probe: Probe) -> None:
        last, run = None, 0
        while not self._stop.is_set():
            due = time.monotonic() - self.started_at >= probe.initial_delay
            # Startup runs until the container started; readiness and liveness only after.
            gated = self.started if probe.kind == STARTUP else not self.started
            if due and not gated:
                success, message = probe_once(probe, self.target)
                run = run + 1 if success == last else 1
                last = success
                threshold = probe.success_threshold if success else probe.failure_threshold
                if run >= threshold and not self._record(probe, success, message):
                    return  # on hold until the next container run, as the kubelet's
            self._stop.wait(probe.period)

    def _record(self, probe: Probe, success: bool, message: str) -> bool:
        """Apply a result that crossed its threshold; False: this probe is done."""
        with self._lock:
            if self._stop.is_set():
                return False
            before = (self.started, self.ready)
            if probe.kind == READINESS:
                self._readiness_ok = success
            elif probe.kind == STARTUP and success:
                self.started = True
            after = (self.started, self.ready)
            if after != before:
                log.info("%s: %s probe %s: started=%s ready=%s", self.label, probe.kind,
                         "succeeded" if success else "failed", *after)
                self.on_change(*after)
            unhealthy = not success and probe.kind in (LIVENESS, STARTUP)
        if unhealthy:
            self.on_unhealthy(probe.kind, message)
            return False
        return probe.kind != STARTUP or not success
