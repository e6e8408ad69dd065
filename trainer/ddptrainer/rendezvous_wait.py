"""Wait, bounded and logged, until the master's name resolves and its port accepts connections.

A worker pod often starts before node 0's pod has an IP, so its DNS record does not exist yet,
and torch's TCPStore treats a failed lookup as fatal ("host not found",
kubeflow/pytorch-operator#125, pytorch/pytorch#73682). A resolving name is not enough either:
the port opens only when torchrun starts on node 0 (kubeflow/pytorch-operator#333). So we wait
for both, with backoff, and give up after the rendezvous timeout (exit 12, retryable).

Standard library only.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Callable, Optional


class MasterUnreachable(Exception):
    """The master did not become reachable within the bound."""


@dataclass(frozen=True)
class WaitResult:
    address: str
    """The IP address the connection succeeded to."""
    seconds: float
    attempts: int


def probe(host: str, port: int, connect_timeout: float) -> tuple[Optional[str], str]:
    """One attempt: (connected address, "") or (None, what failed)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return None, f"{host} does not resolve ({e.strerror or e})"
    except OSError as e:
        return None, f"{host} does not resolve ({e})"
    last = ""
    for family, kind, proto, _name, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(connect_timeout)
                s.connect(sockaddr)
                return str(sockaddr[0]), ""
        except OSError as e:
            last = f"{host} resolves to {sockaddr[0]} but port {port} does not accept ({e})"
    return None, last or f"{host} resolves to no address"


def wait_for_master(host: str, port: int, timeout_seconds: float,
                    log: Callable[[str], None] = print, *, connect_timeout: float = 2.0,
                    first_interval: float = 0.5, max_interval: float = 5.0,
                    log_every_seconds: float = 15.0,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> WaitResult:
    """Return once ``host:port`` accepts a TCP connection; MasterUnreachable after the bound."""
    start = clock()
    deadline = start + timeout_seconds
    interval = first_interval
    attempts = 0
    last_logged = None
    last_problem = ""
    while True:
        attempts += 1
        address, problem = probe(host, port, min(connect_timeout, max(0.1, deadline - clock())))
        now = clock()
        if address is not None:
            if attempts > 1:
                log(f"master {host}:{port} reachable at {address} after {now - start:.1f}s "
                    f"({attempts} attempts)")
            return WaitResult(address=address, seconds=now - start, attempts=attempts)
        # Log the first failure, a change of reason, and then every log_every_seconds.
        if (last_logged is None or problem != last_problem
                or now - last_logged >= log_every_seconds):
            log(f"waiting for master {host}:{port}: {problem} "
                f"({now - start:.0f}s of {timeout_seconds:.0f}s)")
            last_logged = now
        last_problem = problem
        if now >= deadline:
            raise MasterUnreachable(
                f"master {host}:{port} not reachable within {timeout_seconds:.0f}s "
                f"({attempts} attempts): {problem}")
        sleep(max(0.0, min(interval, deadline - now)))
        interval = min(interval * 2, max_interval)
