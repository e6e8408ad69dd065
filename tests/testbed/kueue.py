"""The real Kueue on the local test bed: its controller manager as a host process, with the CRDs
and webhooks of the same release (docs/kueue.md, docs/testing.md "Kueue").

scripts/build-kueue.sh builds sigs.k8s.io/kueue/cmd/kueue from the Go module proxy (cached by
version) and copies the release's CRDs and webhook configurations next to the binary. Kueue
runs as in a cluster except for three things the host process needs:

* its webhook server listens on 127.0.0.1 with a serving certificate from the test bed's CA
  (``internalCertManagement`` is off: there is no Service or Secret to rotate certificates in);
* the webhook configurations call ``https://127.0.0.1:<port>/<path>`` with that CA, instead
  of the in-cluster Service (the API server runs on the host too). Only the webhooks of
  Kueue's own API group are installed: the job and pod webhooks would intercept every other
  test's objects, and a stopped Kueue would then block them;
* the DDPJob kind is named in ``integrations.externalFrameworks``.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .certs import _issue, _name, _write_cert, _write_key
from .controlplane import ControlPlane, free_port
from .kube import Kubectl
from .processes import ManagedProcess, PidFile, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-kueue.sh"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_GROUP = "kueue.x-k8s.io"
DDPJOB_FRAMEWORK = "DDPJob.v1alpha1.ddpjob.dev"
WEBHOOK_PREFIX = "ddpjob-testbed-kueue-"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")


def kueue_folder() -> Path:
    """The folder with kueue-manager, crds.yaml and webhooks.yaml: $DDPJOB_KUEUE_DIR, or what
    the build script prints (it builds once: minutes the first time). RuntimeError if it cannot."""
    override = os.environ.get("DDPJOB_KUEUE_DIR")
    if override:
        folder = Path(override)
    else:
        result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600)
        if result.returncode != 0:
            raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
        folder = Path(result.stdout.strip().splitlines()[-1])
    missing = [f for f in ("kueue-manager", "crds.yaml", "webhooks.yaml") if not (folder / f).is_file()]
    if missing:
        raise RuntimeError(f"{folder} lacks {', '.join(missing)}")
    return folder


def _serving_certificate(control_plane: ControlPlane, directory: Path) -> Path:
    """tls.crt/tls.key for 127.0.0.1, signed by the test bed's CA (what the API server trusts
    once it is the webhooks' caBundle)."""
    pki = control_plane.pki
    assert pki is not None
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(_name("kueue-webhook"), key.public_key(), ca_cert.subject, ca_key,
                  server_names=("localhost",), server_ips=("127.0.0.1",))
    _write_key(directory / "tls.key", key)
    _write_cert(directory / "tls.crt", cert)
    return directory


def kueue_config(webhook_port: int, health_port: int, cert_dir: Path) -> dict:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [DDPJOB_FRAMEWORK]},
    }


def local_webhooks(text: str, port: int, ca_bundle: bytes) -> list[dict]:
    """The release's webhook configurations, reduced to Kueue's own API group and pointed at
    the host process."""
    import base64

    out = []
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        hooks = []
        for hook in doc.get("webhooks") or ():
            groups = {g for rule in hook.get("rules") or () for g in rule.get("apiGroups") or ()}
            if groups != {KUEUE_GROUP}:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}
            hook["timeoutSeconds"] = 10
            hooks.append(hook)
        doc["metadata"] = {"name": WEBHOOK_PREFIX + doc["metadata"]["name"]}
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def _established(kubectl: Kubectl, crd: str) -> bool:
    result = kubectl("get", "crd", crd, "-o", "json", check=False)
    if result.returncode != 0:
        return False
    conditions = (json.loads(result.stdout).get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


class Kueue:
    """Kueue's controller manager against the test bed: ``start()``, ``stop()``."""

    def __init__(self, folder: Path, control_plane: ControlPlane, kubectl: Kubectl, run_dir: Path,
                 pidfile: PidFile | None = None):
        self.folder, self.control_plane, self.kubectl, self.run_dir = folder, control_plane, kubectl, run_dir
        self.pidfile = pidfile
        self.process: ManagedProcess | None = None
        self.webhook_names: list[tuple[str, str]] = []
        self.startup_seconds = 0.0

    def start(self, timeout: float = 120) -> "Kueue":
        started = time.monotonic()
        directory = self.run_dir / "kueue"
        directory.mkdir(parents=True, exist_ok=True)
        # The CRDs are large (the Workload's schema embeds a pod template): server-side apply,
        # since the last-applied annotation of a client-side apply would exceed 256 KiB.
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", self.folder / "crds.yaml", timeout=180)
        for plural in ("workloads", "clusterqueues", "localqueues", "resourceflavors", "workloadpriorityclasses"):
            # Not `kubectl wait`: it fails on a CRD whose status has no conditions yet (the
            # Workload CRD takes a moment).
            wait_for(lambda plural=plural: _established(self.kubectl, f"{plural}.{KUEUE_GROUP}"),
                     60, f"CRD {plural}.{KUEUE_GROUP} Established")
        if self.kubectl("get", "namespace", KUEUE_NAMESPACE, check=False).returncode != 0:
            self.kubectl("create", "namespace", KUEUE_NAMESPACE)
        cert_dir = _serving_certificate(self.control_plane, directory / "certs")
        webhook_port, health_port = free_port(), free_port()
        config = directory / "config.yaml"
        config.write_text(yaml.safe_dump(kueue_config(webhook_port, health_port, cert_dir)))
        # With internalCertManagement off, Kueue reads its metrics certificate from a fixed
        # path (cmd/kueue/main.go: /etc/kueue/metrics/certs): a bind mount in a private mount
        # namespace gives it the test bed's, leaving only an empty folder on the host. The
        # visibility API server (an aggregated API, also with fixed certificate paths) is off.
        METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        manager = f"{shlex.quote(str(self.folder / 'kueue-manager'))} " \
                  f"--config={shlex.quote(str(config))} " \
                  "--feature-gates=VisibilityOnDemand=false --zap-log-level=2"
        self.process = ManagedProcess(
            "kueue", ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                      f"mount --bind {shlex.quote(str(cert_dir))} {METRICS_CERTS} "
                      f"&& exec {manager}"],
            self.run_dir / "logs" / "kueue.log",
            env={**os.environ, "KUBECONFIG": str(self.control_plane.kubeconfig)},
            pidfile=self.pidfile).start()

        def healthy() -> bool:
            self.process.check_running()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, timeout, "Kueue's /readyz")
        ca = self.control_plane.pki.ca_cert.read_bytes()
        webhooks = local_webhooks((self.folder / "webhooks.yaml").read_text(), webhook_port, ca)
        self.kubectl.apply_yaml(webhooks)
        self.webhook_names = [(w["kind"].lower(), w["metadata"]["name"]) for w in webhooks]
        # Ready when the webhooks answer: a dry-run object through them.
        probe = {"apiVersion": f"{KUEUE_GROUP}/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "testbed-probe"}}
        wait_for(lambda: self.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(probe),
                                      check=False).returncode == 0, timeout, "Kueue's webhooks")
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        for kind, name in self.webhook_names:
            self.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        self.webhook_names = []
        if self.process is not None:
            self.process.stop(grace_seconds=10)

    def check_running(self) -> None:
        if self.process is not None:
            self.process.check_running()
