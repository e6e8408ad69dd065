"""The same suite on a kind cluster (DDPJOB_E2E_TARGET=kind): the current kube context, the
operator as the Deployment from manifests/, pod logs from ``kubectl logs``.

scripts/kind/up.sh (via scripts/e2e-kind.sh) creates the cluster, builds and loads the images
and applies manifests/; here the fixtures only check that it is there and use it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .kube import Kubectl
from .operator_runner import OPERATOR_NAMESPACE, apply_manifests, operator_replicas
from .processes import wait_for

SKIP_PREFIX = "kind target needs a Docker engine and a kind cluster: "
OPERATOR_DEPLOYMENT = os.environ.get("DDPJOB_OPERATOR_DEPLOYMENT", "ddpjob-operator")
OPERATOR_SELECTOR = os.environ.get("DDPJOB_OPERATOR_SELECTOR",
                                   "app.kubernetes.io/name=ddpjob-operator")


def shared_dir() -> Path | None:
    """The host folder scripts/kind/up.sh mounts into every node at the same path
    ($DDPJOB_KIND_SHARED_DIR), or None."""
    value = os.environ.get("DDPJOB_KIND_SHARED_DIR")
    return Path(value) if value and Path(value).is_dir() else None


def kind_unavailable_reason(context: str | None) -> str | None:
    """Why the kind target cannot run here, or None if it can."""
    if shutil.which("docker") is None:
        return SKIP_PREFIX + "`docker` is not on PATH"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return SKIP_PREFIX + "`docker info` fails (no Docker engine running)"
    if shutil.which("kind") is None:
        return SKIP_PREFIX + "`kind` is not on PATH"
    probe = Kubectl(None, context)("version", "-o", "json", check=False, timeout=30)
    if probe.returncode != 0:
        return SKIP_PREFIX + f"the kube context is unreachable: {probe.stderr.strip()[:300]}"
    return None


def node_names(kubectl: Kubectl) -> list[str]:
    nodes = json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return [n["metadata"]["name"] for n in nodes]


class KindOperator:
    """The operator Deployment, with the same handle as OperatorProcess. Its replicas (two, one
    leading) go and come together: ``kill()`` force-deletes every one, so the operator is down
    as a host process is; the new pods wait out the dead leader's Lease (about 15 s) before one
    of them acts."""

    def __init__(self, kubectl: Kubectl, log_path: Path):
        self.kubectl = kubectl
        self.log_path = log_path

    def start(self, timeout: float = 180) -> "KindOperator":
        """scripts/e2e-kind.sh deployed it (with the image it built); this only makes sure
        the CRD and RBAC are current and the manifests' replicas are Ready. Re-applying the
        Deployment here would undo an image override."""
        documents = apply_manifests(self.kubectl, include_workloads=False)
        self.kubectl("scale", f"deployment/{OPERATOR_DEPLOYMENT}", "-n", OPERATOR_NAMESPACE,
                     f"--replicas={operator_replicas(documents)}")
        self.kubectl("rollout", "status", f"deployment/{OPERATOR_DEPLOYMENT}",
                     "-n", OPERATOR_NAMESPACE, f"--timeout={int(timeout)}s", timeout=timeout + 30)
        return self

    def _pods(self) -> list[dict]:
        result = self.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_SELECTOR,
                              "-o", "json")
        return json.loads(result.stdout)["items"]

    def kill(self) -> None:
        """Force-delete the operator pod: the closest a cluster gets to SIGKILL."""
        self._save_logs()
        for pod in self._pods():
            self.kubectl("delete", "pod", pod["metadata"]["name"], "-n", OPERATOR_NAMESPACE,
                         "--grace-period=0", "--force", "--wait=false")

    def stop(self) -> None:
        self._save_logs()
        self.kubectl("scale", f"deployment/{OPERATOR_DEPLOYMENT}", "-n", OPERATOR_NAMESPACE,
                     "--replicas=0", check=False)

    def restart(self, timeout: float = 180) -> "KindOperator":
        old = {p["metadata"]["uid"] for p in self._pods()}
        self.kill()
        wait_for(lambda: any(p["metadata"]["uid"] not in old and _ready(p)
                             for p in self._pods()),
                 timeout, "a new operator pod Ready", interval=1)
        return self

    @property
    def running(self) -> bool:
        return any(_ready(p) for p in self._pods())

    def logs(self) -> str:
        """Every replica's log (the leader's and the standby's), each line prefixed with its pod."""
        saved = self.log_path.read_text() if self.log_path.exists() else ""
        return saved + self._current_logs()

    def _current_logs(self) -> str:
        return self.kubectl("logs", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_SELECTOR, "--prefix",
                            "--tail=-1", check=False).stdout

    def _save_logs(self) -> None:
        """A killed pod's log goes with it; keep it, as the local operator log is kept."""
        text = self._current_logs()
        if text:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as handle:
                handle.write(f"--- saved {time.strftime('%H:%M:%S')}\n{text}")


def _ready(pod: dict) -> bool:
    return pod["metadata"].get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", []))
