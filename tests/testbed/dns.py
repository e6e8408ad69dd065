"""Cluster DNS for the test pods: the subset of CoreDNS's kubernetes plugin that pods use.

Answers from Services and EndpointSlices, so the real endpointslice controller (in
kube-controller-manager) decides what is published, exactly as on a cluster: the selector,
readiness, ``publishNotReadyAddresses`` and the endpoint ``hostname`` (set only when the
pod's subdomain names the Service). Records:

- ``<service>.<ns>.svc.cluster.local``: a headless Service's ready endpoint addresses, or
  the ClusterIP of a normal one;
- ``<hostname>.<service>.<ns>.svc.cluster.local``: the ready endpoints with that hostname
  (and ``<a-b-c-d>.<service>...`` for endpoints without one), headless Services only.

Like CoreDNS, endpoints whose ``ready`` condition is false are skipped (the controller marks
every endpoint ready when the Service publishes not-ready addresses). Anything else is
NXDOMAIN: there is no upstream resolver here. TTL 5 s, CoreDNS's default.
"""
from __future__ import annotations

import logging
import socket
import socketserver
import struct
import threading

log = logging.getLogger(__name__)

CLUSTER_SUFFIX = ("svc", "cluster", "local")
TTL_SECONDS = 5
TYPE_A, TYPE_ANY, CLASS_IN = 1, 255, 1
RCODE_NXDOMAIN, RCODE_FORMERR = 3, 1
UDP_LIMIT = 512


class ClusterRecords:
    """Services and EndpointSlices as the informers deliver them; queried by name."""

    def __init__(self):
        self._lock = threading.Lock()
        self._services: dict[tuple[str, str], dict] = {}
        self._slices: dict[str, dict] = {}  # uid -> slice

    def on_service(self, event: str, service: dict) -> None:
        key = (service["metadata"]["namespace"], service["metadata"]["name"])
        with self._lock:
            if event == "DELETED":
                self._services.pop(key, None)
            else:
                self._services[key] = service

    def on_endpoint_slice(self, event: str, endpoint_slice: dict) -> None:
        with self._lock:
            if event == "DELETED":
                self._slices.pop(endpoint_slice["metadata"]["uid"], None)
            else:
                self._slices[endpoint_slice["metadata"]["uid"]] = endpoint_slice

    def _ready_endpoints(self, namespace: str, service: str) -> list[dict]:
        endpoints = []
        for endpoint_slice in self._slices.values():
            metadata = endpoint_slice["metadata"]
            if (metadata["namespace"] != namespace
                    or (metadata.get("labels") or {}).get("kubernetes.io/service-name") != service
                    or endpoint_slice.get("addressType") != "IPv4"):
                continue
            for endpoint in endpoint_slice.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready") is False:
                    continue
                endpoints.append(endpoint)
        return endpoints

    def lookup(self, name: str) -> list[str] | None:
        """IPv4 addresses for a name; [] if the name exists without A records; None if it
        does not exist (NXDOMAIN)."""
        labels = name.lower().rstrip(".").split(".")
        if tuple(labels[-3:]) != CLUSTER_SUFFIX:
            return None
        labels = labels[:-3]
        with self._lock:
            if len(labels) == 2:
                service_name, namespace = labels
                service = self._services.get((namespace, service_name))
                if service is None:
                    return None
                cluster_ip = service.get("spec", {}).get("clusterIP")
                if cluster_ip and cluster_ip != "None":
                    return [cluster_ip]
                return sorted({a for e in self._ready_endpoints(namespace, service_name)
                               for a in e.get("addresses", [])})
            if len(labels) == 3:
                host, service_name, namespace = labels
                service = self._services.get((namespace, service_name))
                if service is None or service.get("spec", {}).get("clusterIP") != "None":
                    return None
                addresses = set()
                for endpoint in self._ready_endpoints(namespace, service_name):
                    for address in endpoint.get("addresses", []):
                        endpoint_host = endpoint.get("hostname") or address.replace(".", "-")
                        if endpoint_host == host:
                            addresses.add(address)
                return sorted(addresses) or None
            if len(labels) <= 1:
                return []  # svc.cluster.local, <ns>.svc.cluster.local: empty non-terminals
        return None


def _parse_question(message: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, qname, qtype, end offset of the question)."""
    if len(message) < 12:
        raise ValueError("short message")
    query_id, flags, qdcount = struct.unpack("!HHH", message[:6])
    if qdcount != 1:
        raise ValueError("expected one question")
    labels, offset = [], 12
    while True:
        length = message[offset]
        offset += 1
        if length == 0:
            break
        if length & 0xC0:
            raise ValueError("compressed question name")
        labels.append(message[offset:offset + length].decode("ascii", errors="replace"))
        offset += length
    qtype, qclass = struct.unpack("!HH", message[offset:offset + 4])
    return query_id, flags, ".".join(labels), qtype, offset + 4


def answer(records: ClusterRecords, message: bytes, limit: int | None) -> bytes:
    """The response to one query; truncated (TC bit) past ``limit`` bytes, for UDP."""
    try:
        query_id, flags, name, qtype, question_end = _parse_question(message)
    except (ValueError, IndexError, struct.error):
        query_id = struct.unpack("!H", message[:2])[0] if len(message) >= 2 else 0
        return struct.pack("!HHHHHH", query_id, 0x8000 | RCODE_FORMERR, 0, 0, 0, 0)
    question = message[12:question_end]
    addresses = records.lookup(name)
    rcode = RCODE_NXDOMAIN if addresses is None else 0
    answers = []
    if addresses and qtype in (TYPE_A, TYPE_ANY):
        for address in addresses:
            # 0xC00C: a pointer to the question's name at offset 12.
            answers.append(struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL_SECONDS, 4)
                           + socket.inet_aton(address))
    response_flags = 0x8000 | 0x0400 | (flags & 0x0100) | rcode  # QR, AA, copy RD
    truncated = False
    if limit is not None:
        while answers and 12 + len(question) + sum(map(len, answers)) > limit:
            answers.pop()
            truncated = True
    if truncated:
        response_flags |= 0x0200
    header = struct.pack("!HHHHHH", query_id, response_flags, 1, len(answers), 0, 0)
    return header + question + b"".join(answers)


class DnsServer:
    """UDP and TCP on ``address``:53, each in a daemon thread."""

    def __init__(self, records: ClusterRecords, address: str, port: int = 53):
        self.records = records
        self.address = address
        self.port = port
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._tcp: socketserver.ThreadingTCPServer | None = None

    def start(self) -> None:
        self._udp.bind((self.address, self.port))
        threading.Thread(target=self._serve_udp, name="dns-udp", daemon=True).start()
        records = self.records

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                while True:
                    header = self.request.recv(2)
                    if len(header) < 2:
                        return
                    (length,) = struct.unpack("!H", header)
                    data = b""
                    while len(data) < length:
                        chunk = self.request.recv(length - len(data))
                        if not chunk:
                            return
                        data += chunk
                    reply = answer(records, data, None)
                    self.request.sendall(struct.pack("!H", len(reply)) + reply)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._tcp = socketserver.ThreadingTCPServer((self.address, self.port), Handler)
        self._tcp.daemon_threads = True
        threading.Thread(target=self._tcp.serve_forever, name="dns-tcp", daemon=True).start()
        log.info("cluster DNS on %s:%s", self.address, self.port)

    def _serve_udp(self) -> None:
        while True:
            try:
                message, peer = self._udp.recvfrom(4096)
            except OSError:
                return
            try:
                self._udp.sendto(answer(self.records, message, UDP_LIMIT), peer)
            except Exception:  # noqa: BLE001 - one bad packet must not stop the server
                log.exception("DNS query from %s failed", peer)

    def stop(self) -> None:
        self._udp.close()
        if self._tcp is not None:
            self._tcp.shutdown()
            self._tcp.server_close()
