"""Fixtures of the end-to-end suite (docs/testing.md documents them).

DDPJOB_E2E_TARGET selects where the suite runs: ``local`` (default: the control plane and
node agent started here, see testbed.py) or ``kind`` (the current kube context, see kind.py).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.testbed import kind as kind_target
from tests.testbed.kube import Kubectl, KubectlError, api_client_from_kubeconfig
from tests.testbed.node_agent import NodeSpec
from tests.testbed.operator_runner import (
    OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, OperatorProcess, apply_manifests,
    operator_command, operator_environment, render_manifests, service_account_kubeconfig,
)
from tests.testbed.processes import wait_for as _wait_for
from tests.testbed.target import TARGET
from tests.testbed.testbed import LocalTestbed, default_node_specs, wait_for_node_ready

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    """The cluster under test, whichever the target."""

    target: str
    kubectl: Kubectl
    api_client: object  # kubernetes.client.ApiClient
    kubeconfig: Path | None
    context: str | None
    run_dir: Path
    testbed: LocalTestbed | None = None

    def check_running(self) -> None:
        """Raise at once if a local component died (instead of waiting for a timeout)."""
        if self.testbed is not None:
            self.testbed.check_running()

    def pod_logs(self, namespace: str, name: str) -> str:
        """A pod's stdout+stderr. Locally read from the node agent's files (no kubelet
        serves `kubectl logs`), and still readable after the pod is deleted."""
        if self.testbed is None:
            return self.kubectl("logs", "-n", namespace, name, check=False).stdout
        uid = None
        result = self.kubectl("get", "pod", "-n", namespace, name, "-o",
                              "jsonpath={.metadata.uid}", check=False)
        if result.returncode == 0:
            uid = result.stdout.strip() or None
        path = self.testbed.pod_log_path(namespace, name, uid)
        if path is None or not path.exists():
            return ""
        return path.read_text(errors="replace")

    def wait_for(self, predicate: Callable, timeout: float, message: str,
                 interval: float = 0.2):
        """wait_for that also fails fast, with the log tail, if a component died."""

        def checked():
            self.check_running()
            return predicate()

        return _wait_for(checked, timeout, message, interval)


class NodePool:
    """The cluster's nodes. Locally, ``add()`` registers more (GPU nodes, say) with the node
    agent; tests that add nodes remove them again."""

    def __init__(self, cluster: Cluster, names: list[str]):
        self.cluster = cluster
        self.names = names

    def add(self, name: str, *, cpu: str = "4", memory: str = "8Gi", gpus: int = 0,
            pods: int = 110, labels: dict | None = None, taints: list | None = None) -> str:
        if self.cluster.testbed is None:
            pytest.skip("adding nodes needs the local test bed (kind's nodes are fixed)")
        spec = NodeSpec(name, cpu=cpu, memory=memory, pods=pods, gpus=gpus,
                        labels=labels or {}, taints=taints or [])
        self.cluster.kubectl.apply_yaml(spec.to_node())
        wait_for_node_ready(self.cluster.kubectl, name, 60, self.cluster.testbed.agent)
        self.names.append(name)
        return name

    def remove(self, name: str) -> None:
        self.cluster.kubectl("delete", "node", name, "--ignore-not-found")
        if name in self.names:
            self.names.remove(name)


def _install_sigterm_handler() -> None:
    """SIGTERM (CI cancelling the job) behaves like Ctrl-C: pytest then runs the session's
    finalizers, which stop every process the test bed started."""

    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Cluster]:
    if TARGET == "kind":
        context = os.environ.get("DDPJOB_KIND_CONTEXT")
        reason = kind_target.kind_unavailable_reason(context)
        if reason:
            pytest.skip(reason)
        run_dir = tmp_path_factory.mktemp("kind-run")
        yield Cluster("kind", Kubectl(None, context), api_client_from_kubeconfig(None, context),
                      None, context, run_dir)
        return
    if TARGET != "local":
        raise pytest.UsageError(f"DDPJOB_E2E_TARGET={TARGET!r}: expected local or kind")
    _install_sigterm_handler()
    testbed = LocalTestbed()
    try:
        testbed.start(default_node_specs())
    except BaseException:
        testbed.stop()
        raise
    finally:
        request.config.stash[_RUN_DIR] = testbed.run_dir  # reported with any failure
    kubeconfig = testbed.control_plane.kubeconfig
    try:
        yield Cluster("local", Kubectl(kubeconfig), testbed.new_client(), kubeconfig, None,
                      testbed.run_dir, testbed)
    finally:
        testbed.stop()


@pytest.fixture(scope="session")
def kubectl(cluster: Cluster) -> Kubectl:
    return cluster.kubectl


@pytest.fixture(scope="session")
def nodes(cluster: Cluster) -> NodePool:
    names = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return NodePool(cluster, [n["metadata"]["name"] for n in names])


@pytest.fixture(scope="session")
def pod_logs(cluster: Cluster) -> Callable[[str, str], str]:
    return cluster.pod_logs


@pytest.fixture(scope="session")
def wait_for(cluster: Cluster) -> Callable:
    """``wait_for(predicate, timeout, message, interval=0.2)``: the predicate's first truthy
    result, or TimeoutError naming ``message`` and the predicate's last exception."""
    return cluster.wait_for


@pytest.fixture
def namespace(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test (named after it), deleted afterwards. Ready when its
    `default` ServiceAccount exists, which pod admission requires."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_for(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name,
                                check=False).returncode == 0,
        30, f"ServiceAccount default in namespace {name}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture
def shared_host_dir(cluster: Cluster, namespace: str) -> str:
    """A directory to mount with hostPath (type DirectoryOrCreate) in several pods of a test
    so they share files, as a shared volume would, and that the test reads and writes too.
    Locally a host directory; on kind a folder under the one scripts/kind/up.sh mounts into
    every node at the same path (``$DDPJOB_KIND_SHARED_DIR``), so pods on different nodes share
    it. Without that variable, a path inside the node containers (pods on one node share it)."""
    if cluster.testbed is not None:
        path = cluster.run_dir / "shared" / namespace
        path.mkdir(parents=True, exist_ok=True)
        return str(path)
    shared = kind_target.shared_dir()
    if shared is None:
        return f"/tmp/ddpjob-e2e/{namespace}"
    path = shared / namespace
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)  # the trainer image runs as uid 10001
    return str(path)


@pytest.fixture(scope="session")
def trainer_image() -> str:
    """The image DDPJob pods use: loaded into kind by scripts/kind/up.sh; ignored locally
    (the node agent runs the command on the host's Python)."""
    return os.environ.get("DDPJOB_TRAINER_IMAGE", "localhost/ddpjob/trainer:0.1.0")


@pytest.fixture(scope="session")
def start_operator(cluster: Cluster) -> Callable[..., OperatorProcess]:
    """Start a kopf operator as a host process, authenticated as a ServiceAccount:
    ``start_operator(command=..., namespace=..., service_account=..., name=...)``. Locally
    only; the `operator` fixture uses it for the real one."""
    if cluster.testbed is None:
        pytest.skip("host-process operators need the local test bed")
    testbed = cluster.testbed

    def start(command: str | None = None, *, namespace: str = OPERATOR_NAMESPACE,
              service_account: str = OPERATOR_SERVICE_ACCOUNT, name: str = "operator",
              env: dict[str, str] | None = None) -> OperatorProcess:
        control_plane = testbed.control_plane
        kubeconfig = service_account_kubeconfig(
            cluster.kubectl, control_plane.server, control_plane.pki.ca_cert,
            cluster.run_dir / f"{name}.kubeconfig", namespace, service_account)
        process = OperatorProcess(
            command or operator_command(), kubeconfig, cluster.run_dir / "logs" / f"{name}.log",
            extra_pythonpath=str(REPO_ROOT), env=env,
            register=testbed.extra_processes.append)
        return process.start()

    return start


@pytest.fixture(scope="session")
def operator_session(cluster: Cluster, request: pytest.FixtureRequest):
    """The DDPJob operator for the whole session (see `operator`)."""
    if cluster.testbed is None:
        handle = kind_target.KindOperator(cluster.kubectl, cluster.run_dir / "operator.log")
        handle.start()
        yield handle
        handle.stop()
        return
    try:
        apply_manifests(cluster.kubectl, include_workloads=False)
    except (KubectlError, RuntimeError) as error:
        pytest.fail(f"applying manifests/ failed: {error}")
    # The command and environment of the Deployment (left out of what was applied): the
    # operator under test runs exactly as production runs it.
    documents = render_manifests()
    start = request.getfixturevalue("start_operator")
    handle = start(operator_command(documents), name="ddpjob-operator",
                   env=operator_environment(documents))
    yield handle
    handle.stop()


@pytest.fixture
def operator(operator_session):
    """The DDPJob operator as in production, from manifests/: ``.start()``, ``.kill()``
    (SIGKILL; on kind a force-deleted pod), ``.restart()``, ``.stop()``, ``.logs()``,
    ``.running``, ``.log_path``. One per session; every test gets it running, even after an
    earlier test killed it and failed before starting it again."""
    if not operator_session.running:
        operator_session.start()
    return operator_session


# -- reporting --------------------------------------------------------------------------
_RUN_DIR = pytest.StashKey[Path | None]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    run_dir = item.config.stash.get(_RUN_DIR, None)
    if report.failed and run_dir is not None:
        report.sections.append((
            "ddpjob test bed",
            f"component logs: {run_dir / 'logs'}\npod logs: {run_dir / 'pods'}",
        ))
    if report.failed:
        excerpt = _operator_log_excerpt(item)
        if excerpt:
            report.sections.append(("operator log (this test's namespace, and errors)", excerpt))


_OPERATOR_LOG_LINES = 80  # CI keeps only a few thousand lines of output: enough to see the story


def _operator_log_excerpt(item: pytest.Item) -> str:
    """The operator's log lines about the failed test's namespace, with the errors
    that name no object (an Event kopf could not post), the last _OPERATOR_LOG_LINES of them.
    On kind the operator's log goes with its cluster, so a CI failure shows only this."""
    handle, namespace = item.funcargs.get("operator_session"), item.funcargs.get("namespace")
    if handle is None or not namespace:
        return ""
    try:
        text = handle.logs()
    except Exception as error:  # noqa: BLE001 - a report must not fail the report
        return f"(the operator's log could not be read: {error})"
    wanted = [line for line in text.splitlines()
              if namespace in line or re.search(r"\b(ERROR|CRITICAL|Traceback|Failed to post)\b", line)]
    return "\n".join(wanted[-_OPERATOR_LOG_LINES:])


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    run_dir = config.stash.get(_RUN_DIR, None)
    if run_dir is not None and exitstatus != 0:
        terminalreporter.write_line(f"ddpjob test bed logs: {run_dir}")
