"""The test bed's kubelet stand-in: keeps Nodes Ready and runs their pods as local processes.

Run as ``python -m tests.testbed.node_agent --kubeconfig ADMIN --run-dir DIR --node NAME:cpu=4``
(from tests/, as root). It serves every Node labelled ``testbed.ddpjob.dev/node-agent=true``:
the ``--node`` ones it registers itself, and any a test creates later (see
``NodeSpec.to_node``). For each, it reports capacity and the Ready condition and renews the
Node's Lease in kube-node-lease (what keeps the node lifecycle controller from tainting it).
Pods bound to those Nodes run as described in pod_worker.py; each pod's first container
runs, init and further containers are not. Cluster DNS for the pods runs here too (dns.py).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .dns import ClusterRecords, DnsServer
from .pod_image import host_image_paths
from .pod_network import Bridge
from .pod_status import now
from .pod_volumes import MEMORY_VOLUMES_ROOT, MountpointRegistry
from .pod_worker import AgentContext, PodWorker, delete_finished_pod
from .rest import ApiError, Informer, RestClient

log = logging.getLogger("node_agent")

AGENT_LABEL = "testbed.ddpjob.dev/node-agent"
CAPACITY_ANNOTATION = "testbed.ddpjob.dev/capacity"
LEASE_DURATION_SECONDS = 40
HEARTBEAT_SECONDS = 10
KUBELET_VERSION = "v1.36.3"
# What a v1.36 kubelet declares in status.declaredFeatures (NodeDeclaredFeatures, beta and on)
# that the agent also does; the scheduler places a pod with a RestartAllContainers rule only
# on a node that declares it. (A kubelet also declares the in-place resize features it has
# on; the agent resizes nothing, so it does not.)
DECLARED_FEATURES = ["RestartAllContainersOnContainerExits"]


@dataclass
class NodeSpec:
    """A test node: its name, capacity and labels."""

    name: str
    cpu: str = "4"
    memory: str = "8Gi"
    pods: int = 110
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)

    def capacity(self) -> dict[str, str]:
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods),
                    "ephemeral-storage": "100Gi"}
        if self.gpus:
            # Only GPU nodes advertise the resource, as with the NVIDIA device plugin.
            capacity["nvidia.com/gpu"] = str(self.gpus)
        return capacity

    def to_node(self) -> dict:
        """The Node object; its status is the agent's to write."""
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            AGENT_LABEL: "true",
            **self.labels,
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels,
                         "annotations": {CAPACITY_ANNOTATION: json.dumps(self.capacity())}},
            "spec": {"taints": self.taints} if self.taints else {},
        }

    @classmethod
    def parse(cls, text: str) -> "NodeSpec":
        """``name:cpu=4,memory=8Gi,pods=110,gpus=1`` (every key optional)."""
        name, _, options = text.partition(":")
        values = dict(item.split("=", 1) for item in options.split(",") if item)
        return cls(
            name=name,
            cpu=values.get("cpu", "4"),
            memory=values.get("memory", "8Gi"),
            pods=int(values.get("pods", 110)),
            gpus=int(values.get("gpus", 0)),
        )


AGENT_STARTED = now()  # the conditions never change while the agent runs


def node_status(node: dict, address: str) -> dict:
    capacity = json.loads(node["metadata"].get("annotations", {}).get(CAPACITY_ANNOTATION, "{}"))
    timestamp = now()

    def condition(kind: str, status: str, reason: str, message: str) -> dict:
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": timestamp, "lastTransitionTime": AGENT_STARTED}

    return {"status": {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
            condition("Ready", "True", "KubeletReady", "ddpjob test node agent is ready"),
        ],
        "addresses": [{"type": "InternalIP", "address": address},
                      {"type": "Hostname", "address": node["metadata"]["name"]}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "declaredFeatures": DECLARED_FEATURES,
        "nodeInfo": {
            "architecture": "amd64", "operatingSystem": "linux",
            "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "",
            "containerRuntimeVersion": "ddpjob-testbed://1", "kernelVersion": os.uname().release,
            "osImage": "ddpjob test bed", "machineID": "", "systemUUID": "", "bootID": "",
        },
    }}


class NodeAgent:
    def __init__(self, client: RestClient, run_dir: Path, bridge: Bridge,
                 registry: MountpointRegistry):
        self.client = client
        self.bridge = bridge
        self.stop_event = threading.Event()
        self.nodes: dict[str, dict] = {}  # name -> Node
        self.nodes_lock = threading.Lock()
        self.workers: dict[str, PodWorker] = {}  # pod uid -> worker
        self.workers_lock = threading.Lock()
        self.records = ClusterRecords()
        python_bin = str(Path(sys.executable).parent)
        base_env = {
            # The "image" environment: this interpreter first, so `python` and the
            # project's console scripts resolve as they would in the trainer image.
            "PATH": f"{python_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        if os.environ.get("PYTHONPATH"):  # a checkout other than the installed one (a worktree)
            base_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        image_paths = host_image_paths(base_env.get("PYTHONPATH"))
        if image_paths:
            log.info("bound read-only into each pod's private /tmp: %s", image_paths)
        self.context = AgentContext(
            client=client, bridge=bridge, pods_dir=run_dir / "pods", registry=registry,
            fetch=self._fetch, base_env=base_env, image_paths=image_paths,
        )

    # -- API objects ----------------------------------------------------------------------
    def _fetch(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return self.client.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def register(self, spec: NodeSpec) -> None:
        try:
            self.client.create("/api/v1/nodes", spec.to_node())
        except ApiError as error:
            if error.status != 409:
                raise
            node = spec.to_node()
            self.client.strategic_patch(f"/api/v1/nodes/{spec.name}",
                                        {"metadata": node["metadata"]})

    def _renew(self, node: dict) -> None:
        name = node["metadata"]["name"]
        self.client.strategic_patch(f"/api/v1/nodes/{name}/status",
                                    node_status(node, self.bridge.gateway))
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        renew_time = now().replace("Z", ".000000Z")
        try:
            self.client.merge_patch(lease_path, {"spec": {"renewTime": renew_time}})
        except ApiError as error:
            if error.status != 404:
                raise
            self.client.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                "metadata": {"name": name, "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": name,
                    "uid": node["metadata"]["uid"]}]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                         "renewTime": renew_time},
            })

    def _heartbeat_loop(self) -> None:
        while not self.stop_event.wait(HEARTBEAT_SECONDS):
            with self.nodes_lock:
                nodes = list(self.nodes.values())
            for node in nodes:
                try:
                    self._renew(node)
                except Exception as error:  # noqa: BLE001 - try again next beat
                    log.warning("heartbeat of %s failed: %s", node["metadata"]["name"], error)

    # -- watches --------------------------------------------------------------------------
    def on_node(self, event: str, node: dict) -> None:
        name = node["metadata"]["name"]
        with self.nodes_lock:
            if event == "DELETED":
                self.nodes.pop(name, None)
                return
            is_new = name not in self.nodes
            self.nodes[name] = node
        if is_new:
            log.info("serving node %s", name)
            self._renew(node)

    def on_pod(self, event: str, pod: dict) -> None:
        node_name = pod["spec"].get("nodeName")
        with self.nodes_lock:
            if node_name not in self.nodes:
                return
        uid = pod["metadata"]["uid"]
        with self.workers_lock:
            worker = self.workers.get(uid)
            if event == "DELETED":
                if worker is not None:
                    worker.vanished()
                    self.workers.pop(uid, None)
                return
            deleting = pod["metadata"].get("deletionTimestamp") is not None
            if worker is None:
                terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
                if deleting or terminal:
                    # Never ran here (or ran before an agent restart): nothing to stop.
                    if deleting:
                        threading.Thread(target=delete_finished_pod, args=(self.client, pod),
                                         daemon=True).start()
                    return
                worker = PodWorker(self.context, pod)
                self.workers[uid] = worker
                worker.start()
                return
        worker.refresh(pod)
        if deleting:
            grace = pod["metadata"].get("deletionGracePeriodSeconds", 30)
            threading.Thread(target=worker.terminate, args=(grace,), daemon=True).start()

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, specs: list[NodeSpec]) -> None:
        DnsServer(self.records, self.bridge.gateway).start()
        informers = [
            Informer(self.client, "/api/v1/services", self.records.on_service,
                     stop=self.stop_event),
            Informer(self.client, "/apis/discovery.k8s.io/v1/endpointslices",
                     self.records.on_endpoint_slice, stop=self.stop_event),
            Informer(self.client, "/api/v1/nodes", self.on_node,
                     label_selector=f"{AGENT_LABEL}=true", stop=self.stop_event),
        ]
        for informer in informers:
            informer.start()
        for informer in informers:
            informer.synced.wait()
        for spec in specs:
            self.register(spec)
        pods = Informer(self.client, "/api/v1/pods", self.on_pod, stop=self.stop_event)
        pods.start()
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        while not self.stop_event.wait(1):  # a timeout keeps the main thread responsive
            pass

    def shutdown(self) -> None:
        self.stop_event.set()
        with self.workers_lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.vanished()  # no more API calls: the cluster is going away too
        for worker in workers:
            worker.done.wait(timeout=5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--node", action="append", default=[], type=NodeSpec.parse,
                        help="name:cpu=4,memory=8Gi,pods=110,gpus=0 (repeatable)")
    parser.add_argument("--pod-cidr", default="10.244.0.0/16")
    parser.add_argument("--bridge", default="ddpjob0")
    parser.add_argument("--mountpoint-record", type=Path, required=True,
                        help="file listing host paths created as mount targets")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    if os.geteuid() != 0:
        sys.exit("the node agent needs root (network namespaces, bind mounts)")

    registry = MountpointRegistry(args.mountpoint_record)
    registry.remove_all()  # what a crashed run left
    bridge = Bridge(args.bridge, args.pod_cidr)
    bridge.setup()
    agent = NodeAgent(RestClient.from_kubeconfig(args.kubeconfig), args.run_dir, bridge,
                      registry)

    def stop(signum, frame):  # noqa: ARG001
        log.info("signal %s: shutting down", signum)
        agent.stop_event.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        agent.run(args.node)
    finally:
        agent.shutdown()
        bridge.teardown()
        registry.remove_all()
        try:
            MEMORY_VOLUMES_ROOT.rmdir()
        except OSError:
            pass
        log.info("stopped")


if __name__ == "__main__":
    main()
