"""The operator under test, run as in production: applied manifests (CRD, RBAC), then
``kopf run`` authenticated as the ServiceAccount from manifests/, so a verb missing from the
ClusterRole fails a test (the admin credentials the test bed itself uses would hide it).

Locally the operator is a host process (the API server listens on the host's 127.0.0.1,
which pods cannot reach); on kind it is the Deployment from manifests/ (kind.py).
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import urllib.request
from pathlib import Path

import yaml

from .controlplane import REPO_ROOT, free_port
from .kube import Kubectl, write_kubeconfig
from .processes import ManagedProcess, wait_for

MANIFESTS_DIR = REPO_ROOT / "manifests"
OPERATOR_NAMESPACE = "ddpjob-system"
OPERATOR_SERVICE_ACCOUNT = "ddpjob-operator"
OPERATOR_DEPLOYMENT = "ddpjob-operator"
# How the operator starts when manifests/ has no Deployment to copy it from.
# {python} is this interpreter; {liveness} is kopf's health endpoint, which the fixture waits
# for before a test may count on the operator. $DDPJOB_OPERATOR_COMMAND overrides both.
FALLBACK_OPERATOR_COMMAND = (
    "{python} -m kopf run --standalone --all-namespaces --liveness={liveness} -m ddpjob.controller.handlers"
)
TOKEN_DURATION = "24h"


def _operator_container(documents: list[dict]) -> dict | None:
    for document in documents:
        if (document.get("kind") == "Deployment"
                and document["metadata"]["name"] == OPERATOR_DEPLOYMENT):
            return document["spec"]["template"]["spec"]["containers"][0]
    return None


def operator_command(documents: list[dict] | None = None) -> str:
    """$DDPJOB_OPERATOR_COMMAND, else the Deployment's command and args (what production
    runs) with ``--liveness={liveness}`` added, else the fallback."""
    override = os.environ.get("DDPJOB_OPERATOR_COMMAND")
    if override:
        return override
    container = _operator_container(render_manifests() if documents is None else documents)
    if container is None or not container.get("command"):
        return FALLBACK_OPERATOR_COMMAND
    argv = [*container["command"], *container.get("args", [])]
    # A console script of this environment (ddpjob-operator), as the image's PATH finds it.
    local = Path(sys.executable).parent / argv[0]
    if local.exists():
        argv[0] = str(local)
    elif shutil.which(argv[0]) is None:
        raise RuntimeError(
            f"the operator's command {argv[0]!r} (manifests/operator.yaml) is not installed in this "
            "environment: run `bash scripts/setup.sh` (pip install -e '.[all]')")
    return shlex.join(argv) + " --liveness={liveness}"


def operator_replicas(documents: list[dict] | None = None) -> int:
    """How many replicas of the operator the Deployment runs (1 without a Deployment)."""
    for document in render_manifests() if documents is None else documents:
        if document.get("kind") == "Deployment" and document["metadata"]["name"] == OPERATOR_DEPLOYMENT:
            return int(document["spec"].get("replicas", 1))
    return 1


def operator_environment(documents: list[dict] | None = None) -> dict[str, str]:
    """The plain ``value`` env of the Deployment's container, so settings match production."""
    container = _operator_container(render_manifests() if documents is None else documents)
    return {e["name"]: e.get("value", "") for e in (container or {}).get("env", [])
            if "valueFrom" not in e}


def render_manifests(directory: Path = MANIFESTS_DIR) -> list[dict]:
    """Every object under manifests/: ``kubectl kustomize`` when there is a
    kustomization.yaml, else each *.yaml file (CRDs first, so a later CR finds its kind)."""
    if (directory / "kustomization.yaml").exists():
        rendered = Kubectl(None)("kustomize", str(directory)).stdout
        documents = list(yaml.safe_load_all(rendered))
    else:
        documents = []
        for path in sorted(directory.glob("*.yaml")):
            documents += list(yaml.safe_load_all(path.read_text()))
    documents = [d for d in documents if d]
    return sorted(documents, key=lambda d: d.get("kind") != "CustomResourceDefinition")


def apply_manifests(kubectl: Kubectl, *, include_workloads: bool) -> list[dict]:
    """Apply manifests/ and wait until its CRDs are established. Without
    ``include_workloads`` the operator's Deployment is left out (the local test bed runs the
    operator as a host process instead)."""
    documents = render_manifests()
    if not include_workloads:
        documents = [d for d in documents if d.get("kind") not in ("Deployment", "Pod")]
    if not documents:
        raise RuntimeError(f"no manifests found under {MANIFESTS_DIR}")
    kubectl.apply_yaml(documents, "--server-side", "--force-conflicts")
    for crd in (d for d in documents if d.get("kind") == "CustomResourceDefinition"):
        kubectl("wait", "--for=condition=Established", "--timeout=60s",
                f"crd/{crd['metadata']['name']}")
    return documents


def service_account_kubeconfig(
    kubectl: Kubectl, server: str, ca_cert: Path, path: Path,
    namespace: str = OPERATOR_NAMESPACE, service_account: str = OPERATOR_SERVICE_ACCOUNT,
) -> Path:
    """A kubeconfig with a TokenRequest token of that ServiceAccount: what the operator's
    pod would get mounted."""
    token = kubectl("create", "token", service_account, "-n", namespace,
                    f"--duration={TOKEN_DURATION}").stdout.strip()
    return write_kubeconfig(path, server, ca_cert, user=f"{namespace}-{service_account}",
                            token=token, namespace=namespace)


class OperatorProcess:
    """The operator as a host process: ``start()``, ``kill()`` (SIGKILL: a crash),
    ``restart()``, ``stop()``, ``logs()``; its output accumulates in ``log_path``.

    ``identity`` (default: the log's name) is its name in the leader Lease
    (``DDPJOB_OPERATOR_POD_NAME``, as the Deployment sets it from the pod's name): the same across
    restarts, like a pod's container restarting, so a restarted operator takes its own Lease
    back at once; two processes with two identities are two replicas."""

    def __init__(self, command: str, kubeconfig: Path, log_path: Path, *,
                 extra_pythonpath: str | None = None, env: dict[str, str] | None = None,
                 register=None, identity: str | None = None):
        self.command_template = command
        self.identity = identity or log_path.stem
        self.extra_env = {"DDPJOB_OPERATOR_POD_NAME": self.identity, **(env or {})}
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.extra_pythonpath = extra_pythonpath
        self.register = register  # called with each ManagedProcess, for session teardown
        self.process: ManagedProcess | None = None
        self.liveness_url: str | None = None

    def _argv(self) -> list[str]:
        self.liveness_url = f"http://127.0.0.1:{free_port()}/healthz"
        command = self.command_template.format(python=sys.executable,
                                               liveness=self.liveness_url)
        if "{liveness}" not in self.command_template:
            self.liveness_url = None
        return shlex.split(command)

    def start(self, timeout: float = 60) -> "OperatorProcess":
        env = {**os.environ, **self.extra_env, "KUBECONFIG": str(self.kubeconfig)}
        if self.extra_pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (self.extra_pythonpath, os.environ.get("PYTHONPATH")) if p)
        self.process = ManagedProcess("operator", self._argv(), self.log_path, env=env).start()
        if self.register:
            self.register(self.process)
        if self.liveness_url:
            wait_for(self._alive, timeout, f"operator liveness at {self.liveness_url}",
                     interval=0.2)
        return self

    def _alive(self) -> bool:
        assert self.process is not None
        self.process.check_running()
        with urllib.request.urlopen(self.liveness_url, timeout=2) as response:
            return response.status == 200

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace_seconds=10)

    def restart(self, timeout: float = 60) -> "OperatorProcess":
        self.kill()
        return self.start(timeout)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
