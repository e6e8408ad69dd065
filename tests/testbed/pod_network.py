"""Pod networking as a CNI bridge plugin would do it: one network namespace per pod, a veth
pair into a host bridge, an address from the pod CIDR.

Only addresses inside namespaces we create and on our bridge: no default route in the pods
and no forwarding, so nothing a pod sends can leave this machine. The host sits on the
bridge (first address of the CIDR), so tests and the agent's DNS server reach every pod.
Files in /etc/netns/<netns>/ are bind-mounted over /etc/ by `ip netns exec` (iproute2), which
gives each pod its own hosts and resolv.conf without any mount code of ours.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from tests.testbed import host_firewall

log = logging.getLogger(__name__)

NETNS_PREFIX = "ddpjob-"
NETNS_RUN_DIR = Path("/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")
CLUSTER_DOMAIN = "cluster.local"


def _ip(*args: str, input: str | None = None) -> None:
    result = subprocess.run(["ip", *args], input=input, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


@dataclass(frozen=True)
class PodNetwork:
    netns: str
    ip: str
    host_veth: str


def pids_in_netns(netns: str) -> list[int]:
    """Every process whose network namespace is ``netns``: the pod's "cgroup"."""
    try:
        target = os.stat(NETNS_RUN_DIR / netns).st_ino
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == target:
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def kill_netns_processes(netns: str) -> None:
    for pid in pids_in_netns(netns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Bridge:
    """The host bridge and the pod address pool."""

    def __init__(self, name: str, cidr: str):
        self.name = name
        self.network = ipaddress.ip_network(cidr)
        hosts = self.network.hosts()
        self.gateway = str(next(hosts))  # the host's (and the DNS server's) address
        self._lock = threading.Lock()
        self._in_use: set[str] = set()
        # Addresses are handed out in order and wrap around, so a just-freed address is not
        # reused at once (a stale DNS answer would then point at the wrong pod).
        self._next = int(ipaddress.ip_address(self.gateway)) + 1
        self._veth_token = secrets.token_hex(2)
        self._veth_counter = 0
        # Namespaces carry the bridge's name: a second test bed (another bridge) starting on the
        # same host cleans up only its own leftovers, never this one's live pods.
        self.netns_prefix = f"{NETNS_PREFIX}{name}-"

    def netns_name(self, suffix: str) -> str:
        return f"{self.netns_prefix}{suffix}"

    def check_no_overlap(self) -> None:
        """Refuse a CIDR the host already routes: we would hijack real traffic."""
        routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True)
        for line in routes.stdout.splitlines():
            destination, *rest = line.split()
            if destination == "default" or "dev" in rest and rest[rest.index("dev") + 1] == self.name:
                continue
            try:
                route = ipaddress.ip_network(destination, strict=False)
            except ValueError:
                continue
            if route.overlaps(self.network):
                raise RuntimeError(
                    f"pod CIDR {self.network} overlaps the host route {line!r}; "
                    "choose another with DDPJOB_TESTBED_POD_CIDR"
                )

    def setup(self) -> None:
        """(Re)create the bridge, removing whatever a crashed run left behind; then make sure
        pods on it can talk to each other, or say why they cannot."""
        remove_stale_namespaces(self.netns_prefix)
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)
        self.check_no_overlap()
        _ip("link", "add", self.name, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.network.prefixlen}", "dev", self.name)
        _ip("link", "set", self.name, "up")
        host_firewall.accept_bridged_traffic(self.name)
        self.check_pods_can_connect()

    def teardown(self) -> None:
        remove_stale_namespaces(self.netns_prefix)
        host_firewall.remove_rules(self.name)
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)

    def check_pods_can_connect(self, timeout: float = 5.0) -> None:
        """Two throwaway pods on the bridge, one TCP connection between them. A host whose
        firewall drops bridged traffic lets pods resolve names (DNS is host-to-pod) but never
        connect: training would hang on its rendezvous. Fail here instead, saying why."""
        tag = secrets.token_hex(3)
        server = self.create_pod_network(self.netns_name(f"probe-{tag}-a"), "", "")
        client = self.create_pod_network(self.netns_name(f"probe-{tag}-b"), "", "")
        listener = None
        try:
            listener = subprocess.Popen(
                ["ip", "netns", "exec", server.netns, sys.executable, "-I", "-S", "-c", _PROBE_SERVER],
                stdout=subprocess.PIPE, text=True)
            ready = listener.stdout.readline().strip() if listener.stdout else ""
            reply = subprocess.run(
                ["ip", "netns", "exec", client.netns, sys.executable, "-I", "-S", "-c",
                 _PROBE_CLIENT.format(ip=server.ip, port=_PROBE_PORT, timeout=timeout)],
                capture_output=True, text=True, timeout=timeout + 10)
            if ready != "listening" or reply.stdout.strip() != "ok":
                raise RuntimeError(
                    f"pods on bridge {self.name} cannot connect to each other ({server.ip}:"
                    f"{_PROBE_PORT} from {client.ip}: {_last_line(reply.stderr) or 'no reply'}). "
                    f"The host filters bridged traffic: {host_firewall.describe()}. "
                    f"Allow it with: iptables -I FORWARD -i {self.name} -o {self.name} -j ACCEPT "
                    "(the test bed adds this rule itself when iptables is installed)")
        finally:
            if listener is not None:
                listener.kill()
                listener.wait()
            self.release(server)
            self.release(client)

    def _allocate_ip(self) -> str:
        with self._lock:
            first = int(self.network.network_address) + 2
            last = int(self.network.broadcast_address) - 1
            for _ in range(last - first + 1):
                candidate = str(ipaddress.ip_address(self._next))
                self._next = self._next + 1 if self._next < last else first
                if candidate not in self._in_use:
                    self._in_use.add(candidate)
                    return candidate
        raise RuntimeError(f"pod CIDR {self.network} is exhausted")

    def _veth_name(self) -> str:
        with self._lock:
            self._veth_counter += 1
            return f"vd{self._veth_token}{self._veth_counter:x}"  # <= 15 chars (IFNAMSIZ)

    def create_pod_network(self, netns: str, hosts: str, resolv_conf: str) -> PodNetwork:
        ip = self._allocate_ip()
        veth = self._veth_name()
        try:
            etc = NETNS_ETC_DIR / netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts.replace("{POD_IP}", ip))
            (etc / "resolv.conf").write_text(resolv_conf)
            # One `ip -batch` per namespace side: a pod costs two execs, not six.
            _ip("-batch", "-", input=(
                f"netns add {netns}\n"
                f"link add {veth} type veth peer name eth0 netns {netns}\n"
                f"link set {veth} master {self.name} up\n"
            ))
            _ip("-n", netns, "-batch", "-", input=(
                f"addr add {ip}/{self.network.prefixlen} dev eth0\n"
                "link set eth0 up\n"
                "link set lo up\n"
            ))
        except Exception:
            self.release(PodNetwork(netns, ip, veth))
            raise
        return PodNetwork(netns, ip, veth)

    def release(self, network: PodNetwork) -> None:
        """Kill what still runs in the namespace, delete it (the veth pair goes with it)."""
        kill_netns_processes(network.netns)
        subprocess.run(["ip", "netns", "del", network.netns], capture_output=True)
        shutil.rmtree(NETNS_ETC_DIR / network.netns, ignore_errors=True)
        with self._lock:
            self._in_use.discard(network.ip)


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:200] if lines else ""


_PROBE_PORT = 29999
_PROBE_SERVER = f"""
import socket
s = socket.socket()
s.bind(("0.0.0.0", {_PROBE_PORT}))
s.listen()
print("listening", flush=True)
c, _ = s.accept()
c.sendall(b"ok")
c.close()
"""
_PROBE_CLIENT = """
import socket
print(socket.create_connection(("{ip}", {port}), timeout={timeout}).recv(2).decode())
"""


def remove_stale_namespaces(prefix: str) -> None:
    if NETNS_RUN_DIR.is_dir():
        for entry in NETNS_RUN_DIR.iterdir():
            if entry.name.startswith(prefix):
                kill_netns_processes(entry.name)
                subprocess.run(["ip", "netns", "del", entry.name], capture_output=True)
    if NETNS_ETC_DIR.is_dir():
        for entry in NETNS_ETC_DIR.iterdir():
            if entry.name.startswith(prefix):
                shutil.rmtree(entry, ignore_errors=True)


def hosts_file(hostname: str, subdomain: str | None, namespace: str) -> str:
    """What the kubelet writes as a pod's /etc/hosts; {POD_IP} is filled in on allocation."""
    if subdomain:
        own = f"{{POD_IP}}\t{hostname}.{subdomain}.{namespace}.svc.{CLUSTER_DOMAIN}\t{hostname}"
    else:
        own = f"{{POD_IP}}\t{hostname}"
    return (
        "# Kubernetes-managed hosts file (ddpjob test bed).\n"
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{own}\n"
    )


def resolv_conf(nameserver: str, namespace: str) -> str:
    """What the kubelet writes for dnsPolicy ClusterFirst."""
    return (
        f"search {namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n"
        f"nameserver {nameserver}\n"
        "options ndots:5\n"
    )
