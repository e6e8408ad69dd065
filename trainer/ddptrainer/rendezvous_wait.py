"""Wait, bounded and logged, until the master's name resolves and its port accepts connections.

A worker pod often starts before node 0's pod has an IP, so its DNS record does not exist yet
("host not found", kubeflow/pytorch-operator#125), and the port opens only when torchrun starts
on node 0 (kubeflow/pytorch-operator#333). Torch's TCPStore retries both by itself nowadays
(a failed lookup was fatal before pytorch/pytorch#74641, #73682;
tests/multiprocess/test_trainer_dns.py shows the pinned torch retrying), but silently: this
wait, before torchrun starts, logs what it waits for and ends in exit 12 (retryable) with a
message that names the master after the rendezvous timeout. It is the only DNS wait.

Standard library only.
"""
from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ddpjob import contract
from ddpjob.contract import EntryState


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
                    log_every_seconds: float = 15.0, quiet_seconds: float = 30.0,
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
        # Log the first failure, a change of reason, and then every log_every_seconds; but not
        # in the first quiet_seconds (node 0 importing torch, slow on a busy machine, is no news: a healthy start prints
        # only "reachable after 1.5s"), unless the bound is reached first.
        patient = now - start < quiet_seconds and now < deadline
        if not patient and (last_logged is None or problem != last_problem
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


def resolve_address(host: str, timeout_seconds: float = 2.0) -> Optional[str]:
    """``host``'s first address (as ``probe`` connects: any family, the resolver's order), or
    None when it does not resolve within the bound (the lookup runs on a daemon thread: glibc's
    has no deadline of its own). An address is returned as it is."""
    found: list[Optional[str]] = [None]

    def look_up() -> None:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            return
        if infos:
            found[0] = str(infos[0][4][0])

    thread = threading.Thread(target=look_up, name="resolve-master", daemon=True)
    thread.start()
    thread.join(timeout_seconds)
    return found[0]


def ask_attempt(host: str, port: int, timeout: float = 2.0) -> tuple[Optional[EntryState], str]:
    """One ``GET /attempt`` of an entry point: (its state, "") or (None, what failed); the
    problem is "" too when it answered but not in the protocol (another image's server)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", contract.ATTEMPT_PATH)
        response = connection.getresponse()
        body = response.read(contract.MAX_ENTRY_ANSWER_BYTES + 1)
    except (OSError, http.client.HTTPException) as e:
        return None, f"{host}:{port}{contract.ATTEMPT_PATH} does not answer ({e})"
    finally:
        connection.close()
    return (contract.parse_entry_state(body) if response.status == 200 else None), ""


def wait_for_master_attempt(host: str, port: int, attempt: int, timeout_seconds: float,
                            log: Callable[[str], None] = print, *, interval: float = 0.5,
                            clock: Callable[[], float] = time.monotonic,
                            sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once node 0's entry point runs ``attempt`` or a later one (``InPlace`` mode).

    Its rendezvous port alone does not say which attempt opened it: while node 0 is still
    stopping the previous attempt, the port is the previous attempt's, and joining it would
    fail this one. A master that answers outside the protocol is not waited for."""
    deadline = clock() + timeout_seconds
    logged = ""
    while True:
        state, problem = ask_attempt(host, port, min(2.0, max(0.1, deadline - clock())))
        if state is None and not problem:
            log(f"master {host}:{port} does not say its attempt; not waiting for it")
            return
        if state is not None:
            if state.attempt >= attempt and state.state == contract.ENTRY_RUNNING:
                return
            problem = f"the master is {state.state} at attempt {state.attempt}"
        if problem != logged:
            log(f"waiting for the master to run attempt {attempt}: {problem}")
            logged = problem
        if clock() >= deadline:
            raise MasterUnreachable(f"the master {host} did not run attempt {attempt} within "
                                    f"{timeout_seconds:.0f}s: {problem}")
        sleep(interval)
