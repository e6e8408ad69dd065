"""A real Kubernetes control plane as local processes: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler on free 127.0.0.1 ports.

The binaries come from scripts/build-control-plane.sh (built once, cached by version). Flags
follow what envtest and kwokctl use; see docs/testing.md for why each non-default one is set.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ddpjob.local.plan import reserve_free_port

from .certs import Pki, generate_pki
from .kube import write_kubeconfig
from .processes import ManagedProcess, PidFile, ProcessExited, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-control-plane.sh"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# The requests of ServiceAccounts outside kube-system (the operator under test; the controllers
# run as kube-system ones) go to logs/audit.log, metadata only: what the benchmarks count
# (benchmarks/operator_api_cost.py) and a record of what an operator did when a test fails.
# One kube-system controller is logged too: the Job controller, the "no operator at all" peer
# that benchmarks/peers.py compares DDPJob with (an Indexed Job is its work).
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
omitManagedFields: true
rules:
  - level: Metadata
    users: ["system:serviceaccount:kube-system:job-controller"]
  - level: None
    userGroups: ["system:serviceaccounts:kube-system"]
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""


def control_plane_binaries() -> Path:
    """The folder with the four binaries: $DDPJOB_CONTROL_PLANE_DIR (scripts/test.sh sets it),
    or whatever the build script prints (it builds what is missing: minutes the first time)."""
    override = os.environ.get("DDPJOB_CONTROL_PLANE_DIR")
    if override:
        folder = Path(override)
    else:
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{BUILD_SCRIPT} failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
            )
        folder = Path(result.stdout.strip().splitlines()[-1])
    missing = [c for c in COMPONENTS if not (folder / c).is_file()]
    if missing:
        raise RuntimeError(f"{folder} lacks {', '.join(missing)}")
    return folder


def free_port() -> int:
    """A free port below the kernel's ephemeral range, as `ddpjob run` picks its master port:
    one the kernel handed out could be taken by any outgoing connection before our server
    binds it (ddpjob.local.plan.reserve_free_port says why)."""
    with reserve_free_port() as sock:
        return sock.getsockname()[1]


class ControlPlane:
    """Start with ``start()``, stop with ``stop()``; ``kubeconfig`` is an admin kubeconfig."""

    def __init__(self, run_dir: Path, bin_dir: Path, pidfile: PidFile):
        self.run_dir = run_dir
        self.bin_dir = bin_dir
        self.pidfile = pidfile
        self.log_dir = run_dir / "logs"
        # etcd wants a fast disk; /dev/shm is tmpfs on Linux. Keyed by run so parallel
        # checkouts cannot share it.
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else run_dir
        self.etcd_dir = shm / f"ddpjob-etcd-{run_dir.name}"
        self.processes: list[ManagedProcess] = []
        self.pki: Pki | None = None
        self.server = ""
        self.kubeconfig = run_dir / "admin.kubeconfig"
        self.audit_log = self.log_dir / "audit.log"
        self.startup_seconds = 0.0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, timeout: float = 90, attempts: int = 3) -> "ControlPlane":
        """Start everything; if a port we picked was taken in the meantime (another process
        raced us between bind-to-0 and the component's own bind), start over on new ones."""
        started = time.monotonic()
        self.pki = generate_pki(self.run_dir / "pki")
        for attempt in range(1, attempts + 1):
            try:
                self._start_components(timeout)
                break
            except ProcessExited as error:
                self.stop()
                if attempt == attempts or "address already in use" not in str(error):
                    raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _start_components(self, timeout: float) -> None:
        pki = self.pki
        assert pki is not None
        etcd_client_port, etcd_peer_port, apiserver_port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{apiserver_port}"
        write_kubeconfig(
            self.kubeconfig, self.server, pki.ca_cert, user="admin",
            client_cert=pki.admin_cert, client_key=pki.admin_key,
        )
        shutil.rmtree(self.etcd_dir, ignore_errors=True)
        audit_policy = self.run_dir / "audit-policy.yaml"
        audit_policy.write_text(AUDIT_POLICY)
        etcd_url = f"http://127.0.0.1:{etcd_client_port}"
        self._start("etcd", [
            "--name=testbed",
            f"--data-dir={self.etcd_dir}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}",
            f"--initial-cluster=testbed=http://127.0.0.1:{etcd_peer_port}",
            "--unsafe-no-fsync=true",  # a test cluster lives minutes; durability is moot
            "--log-level=warn",
        ])
        self._start("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            # Without these two it looks for a default route and exits on an offline host.
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={apiserver_port}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--authorization-mode=Node,RBAC",
            # As on real clusters, the API server itself admits privileged pods and Pod
            # Security admission (on by default) decides per namespace label.
            "--allow-privileged=true",
            # On top of the default admission plugins, the one OpenShift enables: setting
            # blockOwnerDeletion on an ownerReference needs `update` on the owner's
            # finalizers, so every test that creates a job proves the operator's RBAC has it.
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            "--profiling=false",
            f"--audit-policy-file={audit_policy}",
            f"--audit-log-path={self.audit_log}",
            "--v=1",
        ])
        wait_for(self._apiserver_ready, timeout, f"kube-apiserver /readyz at {self.server}")
        self._start("kube-controller-manager", [
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",  # nothing scrapes its metrics; saves a port and a cert
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.service_account_key}",
            # Each controller acts as its own ServiceAccount, under the bootstrap RBAC
            # roles, as on a kubeadm cluster.
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            # Removes the not-ready taint of a new Node within a second of it reporting
            # Ready, instead of up to five.
            "--node-monitor-period=1s",
            "--v=1",
        ])
        self._start("kube-scheduler", [
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            "--v=1",
        ])
        wait_for(
            self._default_service_account_exists, timeout,
            "the `default` ServiceAccount (made by kube-controller-manager)",
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop(grace_seconds=3)
        self.processes.clear()
        shutil.rmtree(self.etcd_dir, ignore_errors=True)

    def check_running(self) -> None:
        for process in self.processes:
            process.check_running()

    # -- helpers --------------------------------------------------------------------------
    def _start(self, component: str, flags: list[str]) -> ManagedProcess:
        process = ManagedProcess(
            component,
            [str(self.bin_dir / component), *flags],
            self.log_dir / f"{component}.log",
            pidfile=self.pidfile,
            # Nothing in a throwaway cluster is worth a graceful shutdown once the test run
            # is gone (a SIGTERMed API server can linger for a minute retrying etcd).
            death_signal=signal.SIGKILL,
        ).start()
        self.processes.append(process)
        return process

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get(self, path: str) -> tuple[int, bytes]:
        """A raw GET as admin, for probes that should not depend on the client library."""
        request = urllib.request.Request(self.server + path)
        try:
            with urllib.request.urlopen(request, context=self._ssl_context(), timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def _apiserver_ready(self) -> bool:
        self.check_running()
        status, _ = self.get("/readyz")
        return status == 200

    def _default_service_account_exists(self) -> bool:
        self.check_running()
        status, _ = self.get("/api/v1/namespaces/default/serviceaccounts/default")
        return status == 200

    def version(self) -> str:
        status, body = self.get("/version")
        return json.loads(body)["gitVersion"]
