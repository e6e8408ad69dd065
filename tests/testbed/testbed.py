"""The local test bed for one pytest session: a lock, a run directory, the control plane and
the node agent, and their teardown however the session ends.

State lives under $DDPJOB_TESTBED_DIR (default /tmp/ddpjob-testbed): ``lock`` (one test bed
per machine: the pod bridge, its DNS port and /etc/netns are machine-wide), ``pids.json``
(what to kill after a crashed run), ``mountpoints.txt`` and ``runs/<time>-<pid>/`` with
logs, certificates, kubeconfigs and each pod's output. The last few runs are kept.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import sys
import time
from pathlib import Path

from .controlplane import ControlPlane, control_plane_binaries
from .kube import Kubectl, api_client_from_kubeconfig
from .node_agent import NodeSpec
from .processes import ManagedProcess, PidFile, wait_for

STATE_ROOT = Path(os.environ.get("DDPJOB_TESTBED_DIR", "/tmp/ddpjob-testbed"))
POD_CIDR = os.environ.get("DDPJOB_TESTBED_POD_CIDR", "10.244.0.0/16")
BRIDGE = os.environ.get("DDPJOB_TESTBED_BRIDGE", "ddpjob0")
KEEP_RUNS = 5
REPO_ROOT = Path(__file__).resolve().parents[2]  # on PYTHONPATH: the test bed is package tests.testbed


def default_node_specs() -> list[NodeSpec]:
    """$DDPJOB_TESTBED_NODES (e.g. ``3`` or ``node-a:cpu=8,gpus=2;node-b``), else 3 CPU
    nodes with 4 cpus: the scale a benchmark can raise without touching the tests."""
    raw = os.environ.get("DDPJOB_TESTBED_NODES", "3")
    if raw.isdigit():
        return [NodeSpec(f"node-{i}") for i in range(int(raw))]
    return [NodeSpec.parse(item) for item in raw.split(";") if item]


class LocalTestbed:
    def __init__(self):
        self.lock_handle = None
        self.run_dir: Path | None = None
        self.control_plane: ControlPlane | None = None
        self.agent: ManagedProcess | None = None
        self.pidfile = PidFile(STATE_ROOT / "pids.json")
        self.extra_processes: list[ManagedProcess] = []  # operators, stopped before the rest
        self._stopped = False

    # -- session lifecycle ----------------------------------------------------------------
    def start(self, node_specs: list[NodeSpec]) -> "LocalTestbed":
        if os.geteuid() != 0:
            raise RuntimeError(
                "the local test bed needs root (network namespaces, bind mounts for the "
                "pods); run as root, or use DDPJOB_E2E_TARGET=kind"
            )
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        killed = self.pidfile.kill_stale()
        if killed:
            print(f"test bed: killed {len(killed)} processes left by a previous run",
                  file=sys.stderr)
        self.run_dir = self._new_run_dir()
        atexit.register(self.stop)
        self.control_plane = ControlPlane(self.run_dir, control_plane_binaries(), self.pidfile)
        self.control_plane.start()
        self.agent = ManagedProcess(
            "node-agent",
            [sys.executable, "-m", "tests.testbed.node_agent",
             "--kubeconfig", self.control_plane.kubeconfig,
             "--run-dir", self.run_dir,
             "--pod-cidr", POD_CIDR, "--bridge", BRIDGE,
             "--mountpoint-record", STATE_ROOT / "mountpoints.txt",
             *[arg for spec in node_specs for arg in ("--node", _spec_arg(spec))]],
            self.run_dir / "logs" / "node-agent.log",
            env={**os.environ, "PYTHONPATH": _pythonpath()},
            pidfile=self.pidfile,
        ).start()
        kubectl = Kubectl(self.control_plane.kubeconfig)
        for spec in node_specs:
            wait_for_node_ready(kubectl, spec.name, 60, self.agent)
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for process in reversed(self.extra_processes):
            process.stop(grace_seconds=5)
        if self.agent is not None:
            self.agent.stop(grace_seconds=15)
        if self.control_plane is not None:
            self.control_plane.stop()
        self.pidfile.path.unlink(missing_ok=True)
        if self.lock_handle is not None:
            self.lock_handle.close()

    def check_running(self) -> None:
        """Raise (with the log tail) if a component died: a clearer failure than a timeout."""
        if self.control_plane is not None:
            self.control_plane.check_running()
        if self.agent is not None:
            self.agent.check_running()

    # -- helpers --------------------------------------------------------------------------
    def _take_lock(self) -> None:
        """One test bed per machine; a second run waits its turn (up to
        $DDPJOB_TESTBED_LOCK_TIMEOUT seconds, default 900) rather than failing."""
        self.lock_handle = open(STATE_ROOT / "lock", "a+")
        timeout = float(os.environ.get("DDPJOB_TESTBED_LOCK_TIMEOUT", "900"))
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            try:
                fcntl.flock(self.lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                self.lock_handle.seek(0)
                holder = self.lock_handle.read().strip()
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"another test bed run still holds {STATE_ROOT / 'lock'} ({holder}) "
                        f"after {timeout:.0f}s; one test bed per machine") from None
                if not announced:
                    print(f"test bed: waiting for {STATE_ROOT / 'lock'} ({holder})",
                          file=sys.stderr)
                    announced = True
                time.sleep(1)
        self.lock_handle.truncate(0)
        self.lock_handle.write(f"pid {os.getpid()}\n")
        self.lock_handle.flush()

    def _new_run_dir(self) -> Path:
        runs = STATE_ROOT / "runs"
        runs.mkdir(exist_ok=True)
        for old in sorted(runs.iterdir())[:-(KEEP_RUNS - 1)]:
            shutil.rmtree(old, ignore_errors=True)
        run_dir = runs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        run_dir.mkdir()
        latest = STATE_ROOT / "latest"
        latest.unlink(missing_ok=True)
        latest.symlink_to(run_dir)
        return run_dir

    def new_client(self):
        assert self.control_plane is not None
        return api_client_from_kubeconfig(self.control_plane.kubeconfig)

    def pod_log_path(self, namespace: str, name: str, uid: str | None = None) -> Path | None:
        """The log of that pod (by uid), or of the latest pod with that name."""
        assert self.run_dir is not None
        pod_dir = self.run_dir / "pods" / namespace / name
        if uid:
            return pod_dir / uid / "container.log"
        candidates = sorted(pod_dir.glob("*/container.log"), key=lambda p: p.stat().st_mtime)
        return candidates[-1] if candidates else None


def _spec_arg(spec: NodeSpec) -> str:
    return f"{spec.name}:cpu={spec.cpu},memory={spec.memory},pods={spec.pods},gpus={spec.gpus}"


def _pythonpath() -> str:
    existing = os.environ.get("PYTHONPATH")
    return f"{REPO_ROOT}:{existing}" if existing else str(REPO_ROOT)


def node_is_ready(kubectl: Kubectl, name: str) -> bool:
    """Ready=True and no not-ready taint left: the scheduler will place pods on it."""
    result = kubectl("get", "node", name, "-o", "json", check=False)
    if result.returncode != 0:
        return False
    node = json.loads(result.stdout)
    ready = any(c["type"] == "Ready" and c["status"] == "True"
                for c in node.get("status", {}).get("conditions", []))
    tainted = any(t["key"].startswith("node.kubernetes.io/")
                  for t in node.get("spec", {}).get("taints") or [])
    return ready and not tainted


def wait_for_node_ready(kubectl: Kubectl, name: str, timeout: float,
                        agent: ManagedProcess | None) -> None:
    def ready() -> bool:
        if agent is not None:
            agent.check_running()
        return node_is_ready(kubectl, name)

    wait_for(ready, timeout, f"node {name} Ready and untainted")

