"""Kubeflow's training-operator (PyTorchJob) as a host process on the test bed, set up the way
its own manifests deploy it (manifests/base of the v1.8.1 module): namespace ``kubeflow``, the
``training-operator`` ServiceAccount with the manifests' ClusterRole, the webhook certificate
Secret, and the binary with its default flags except the ones a host process needs:

- ``--enable-scheme=pytorchjob``: only the PyTorchJob controller (the others would watch CRDs
  that are not installed here; installing them all would only add idle watches);
- ``--metrics-bind-address=0`` / ``--health-probe-bind-address=0`` and a free
  ``--webhook-server-port``: the host's ports are shared (in a pod each has its own);
- its certificate rotator writes the webhook certificate into the Secret and then waits for
  the file at /tmp/k8s-webhook-server/serving-certs/tls.crt, where the kubelet would mount that
  Secret. The process runs in a private mount namespace with a per-run folder bind-mounted
  there, and ``start`` copies the Secret into that folder, as the kubelet does.

The ValidatingWebhookConfiguration is not installed (the API server here cannot reach a webhook
Service), so PyTorchJobs are not validated on admission; the rotator then finds no webhook to
inject its CA into, logs so and carries on. Client QPS and burst stay controller-runtime's
defaults (20 / 30), and ``--controller-threads`` its default of 1: what its users run.
"""
from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Callable, Optional, Sequence

import yaml

from tests.testbed.controlplane import free_port
from tests.testbed.kube import Kubectl
from tests.testbed.operator_runner import service_account_kubeconfig
from tests.testbed.processes import ManagedProcess, wait_for

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "scripts" / "build-training-operator.sh"
VERSION = os.environ.get("DDPJOB_TRAINING_OPERATOR_VERSION", "v1.8.1")
NAMESPACE = "kubeflow"
SERVICE_ACCOUNT = "training-operator"
USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
WEBHOOK_SECRET = "training-operator-webhook-cert"
CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"  # fixed in its pkg/cert


def cached_dir() -> Path:
    """Where scripts/build-training-operator.sh puts the binary and CRDs (or
    $DDPJOB_TRAINING_OPERATOR_DIR)."""
    override = os.environ.get("DDPJOB_TRAINING_OPERATOR_DIR")
    if override:
        return Path(override)
    cache = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))
    return cache / "peers" / f"training-operator-{VERSION}"


def present() -> bool:
    folder = cached_dir()
    return (folder / "training-operator").is_file() and (folder / "crds").is_dir()


def build() -> Path:
    """The folder with the binary and CRDs, built if missing (about 2 minutes cold)."""
    if present():
        return cached_dir()
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def setup_documents(role: dict) -> list[dict]:
    """What its manifests create besides the Deployment: namespace, ServiceAccount, the
    ClusterRole (``role``, read from the module) and its binding, the empty webhook Secret."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
        role,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": SERVICE_ACCOUNT},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE}},
    ]


def operator_argv(binary: Path, cert_dir: Path, extra_flags: Sequence[str] = ()) -> list[str]:
    """The binary in a private mount namespace where ``cert_dir`` is its serving-certs folder."""
    flags = ["--enable-scheme=pytorchjob", "--metrics-bind-address=0", "--health-probe-bind-address=0",
             f"--webhook-server-port={free_port()}", *extra_flags]
    script = (f"mkdir -p {CERT_DIR} && mount --bind {cert_dir} {CERT_DIR} && "
              f'exec {binary} "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "training-operator", *flags]


class TrainingOperator:
    """``start()`` installs what it needs (idempotent) and starts it; ``stop()``; ``pid``."""

    def __init__(self, kubectl: Kubectl, server: str, ca_cert: Path, run_dir: Path,
                 register: Optional[Callable[[ManagedProcess], None]] = None, extra_flags: Sequence[str] = ()):
        self.folder = build()
        self.extra_flags = tuple(extra_flags)
        self.kubectl = kubectl
        self.server, self.ca_cert = server, ca_cert
        self.run_dir = run_dir / "training-operator"
        self.cert_dir = self.run_dir / "serving-certs"
        self.register = register
        self.process: Optional[ManagedProcess] = None

    @property
    def pid(self) -> int:
        """The operator itself (exec'd by the mount-namespace wrapper: the same pid)."""
        assert self.process is not None
        return self.process.pid

    def install(self) -> Path:
        crd = self.folder / "crds" / "kubeflow.org_pytorchjobs.yaml"
        # Server-side: the CRD is too big for client-side apply's last-applied annotation.
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        wait_for(lambda: "True" in self.kubectl(
            "get", "crd", "pytorchjobs.kubeflow.org", "-o",
            "jsonpath={.status.conditions[?(@.type=='Established')].status}").stdout,
            60, "the PyTorchJob CRD to be established", interval=0.5)
        module = self._module_dir()
        role = yaml.safe_load((module / "manifests" / "base" / "rbac" / "role.yaml").read_text())
        self.kubectl.apply_yaml(setup_documents(role))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return service_account_kubeconfig(self.kubectl, self.server, self.ca_cert,
                                          self.run_dir / "kubeconfig", namespace=NAMESPACE,
                                          service_account=SERVICE_ACCOUNT)

    def _module_dir(self) -> Path:
        out = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
        module = Path(out) / f"github.com/kubeflow/training-operator@{VERSION}"
        if not module.is_dir():
            subprocess.run(["go", "mod", "download", f"github.com/kubeflow/training-operator@{VERSION}"],
                           check=True, capture_output=True, cwd="/tmp")
        return module

    def start(self, timeout: float = 120) -> "TrainingOperator":
        kubeconfig = self.install()
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.cert_dir.iterdir():
            stale.unlink()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "MY_POD_NAMESPACE": NAMESPACE}
        self.process = ManagedProcess("training-operator",
                                      operator_argv(self.folder / "training-operator", self.cert_dir, self.extra_flags),
                                      self.run_dir / "training-operator.log", env=env).start()
        if self.register:
            self.register(self.process)
        wait_for(self._mount_secret, timeout, "the training-operator's webhook certificate Secret", interval=0.5)
        wait_for(self._controller_started, timeout, "the training-operator's PyTorchJob controller", interval=0.5)
        return self

    def _mount_secret(self) -> bool:
        """What the kubelet does with the Deployment's Secret volume, once the rotator filled it."""
        assert self.process is not None
        self.process.check_running()
        out = self.kubectl("get", "secret", WEBHOOK_SECRET, "-n", NAMESPACE, "-o", "json").stdout
        data = (yaml.safe_load(out) or {}).get("data") or {}
        if "tls.crt" not in data:
            return False
        for key, value in data.items():
            (self.cert_dir / key).write_bytes(base64.b64decode(value))
        return True

    def _controller_started(self) -> bool:
        assert self.process is not None
        self.process.check_running()
        log = self.process.log_path.read_text(errors="replace")
        return any("Starting workers" in line and "pytorchjob-controller" in line for line in log.splitlines())

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace_seconds=10)
