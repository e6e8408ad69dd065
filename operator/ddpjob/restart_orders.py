"""The operator's half of the in-place gang restart (docs/contract.md, "In-place restart"):
reading a pod entry point's state and ordering it to start the next attempt. `ddpjob run`
(local/in_place.py) plays the operator with the same requests, so its nodes answer as pods do.

Both are HTTP/1.0 requests to the pod's own IP on the progress port. What a pod answers comes
from whoever wrote the job's command, so it is bounded as the progress answer is
(docs/security.md): one deadline for the whole request, the pod's IP only (never a name), no
redirect followed, at most ``ANSWER_LIMIT`` bytes, and a state that fails any check is no
state. They run on the pass's thread, but only for the pods that need them: a pod whose
readiness dropped after it was seen ready (its workers failed, or it is restarting), and the
pods of a gang being restarted; each costs at most its deadline.

The order's credential is the pod's own ``DDPJOB_RESTART_TOKEN``: random per pod, written in
its spec by the operator (``new_token``), read back from the pod object the watch holds. Who
can read the pod's spec (its namespace's users) could restart its training anyway; another
tenant's pod, which can reach the port, cannot.
"""
from __future__ import annotations

import ipaddress
import json
import secrets
import socket
import time
from typing import Optional

from ddpjob import contract
from ddpjob.contract import EntryState, parse_entry_state  # the one reader of what a pod says

ANSWER_LIMIT = contract.MAX_ENTRY_ANSWER_BYTES + 1024  # the whole response: the body's bound and a head
ORDER_DEADLINE_SECONDS = 3.0  # a pod that has not taken the order by then is recreated
ORDERS_AT_ONCE = 16  # orders in flight for one gang
STACKS_DEADLINE_SECONDS = 3.0  # the stacks of a stalled gang: asked before its restart, never holding it up
STACKS_ANSWER_LIMIT = contract.MAX_STACKS_ANSWER_BYTES + 1024


def new_token() -> str:
    return secrets.token_urlsafe(24)


def _request(ip: str, port: int, method: str, path: str, deadline: float, *,
             headers: tuple[str, ...] = (), body: bytes = b"",
             limit: int = ANSWER_LIMIT) -> Optional[tuple[int, bytes]]:
    """(status, body) of one bounded request to ``ip:port`` (at most ``limit`` bytes of
    response); None for no usable answer."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return None  # never a name: nothing is resolved
    until = time.monotonic() + deadline
    host = f"[{address}]" if address.version == 6 else str(address)
    head = [f"{method} {path} HTTP/1.0", f"Host: {host}:{port}", "Connection: close", *headers]
    if method == "POST":
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    request = ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body
    response = bytearray()
    try:
        with socket.create_connection((str(address), port), timeout=deadline) as conn:
            conn.sendall(request)
            while len(response) <= limit:
                left = until - time.monotonic()
                if left <= 0:
                    return None
                conn.settimeout(left)
                chunk = conn.recv(limit + 1 - len(response))
                if not chunk:
                    break
                response += chunk
    except OSError:
        return None
    if len(response) > limit:
        return None
    head_bytes, separator, payload = bytes(response).partition(b"\r\n\r\n")
    status_line = head_bytes.split(b"\r\n", 1)[0].split(None, 2)
    if not separator or len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
        return None
    try:
        return int(status_line[1]), payload
    except ValueError:
        return None


def fetch_entry_state(ip: str, port: int, deadline: float) -> Optional[EntryState]:
    answer = _request(ip, port, "GET", contract.ATTEMPT_PATH, deadline)
    if answer is None or answer[0] != 200:
        return None
    return parse_entry_state(answer[1])


__all__ = ["EntryState", "fetch_entry_state", "fetch_stacks", "new_token", "order_restart",
           "parse_entry_state"]


def order_restart(ip: str, port: int, token: str, attempt: int, deadline: float) -> bool:
    """Whether the pod accepted the order to run ``attempt`` (202, or 200: already doing so)."""
    if not token:
        return False
    answer = _request(ip, port, "POST", contract.RESTART_PATH, deadline,
                      headers=(f"Authorization: Bearer {token}",),
                      body=json.dumps({"attempt": attempt}).encode())
    return answer is not None and answer[0] in (200, 202)


def fetch_stacks(ip: str, port: int, token: str, deadline: float) -> tuple[Optional[dict[str, str]], str]:
    """(the pod's workers' stacks by rank key, "") or (None, why not): GET /stacks with the
    pod's token, bounded like every request here, the answer parsed strictly (never raises)."""
    if not token:
        return None, "the pod takes no token (restartMode Recreate, or a command of its own)"
    answer = _request(ip, port, "GET", contract.STACKS_PATH, deadline,
                      headers=(f"Authorization: Bearer {token}",), limit=STACKS_ANSWER_LIMIT)
    if answer is None:
        return None, f"no usable answer within {deadline:g}s (none, too large, or not HTTP)"
    status, body = answer
    if status == 503:
        return None, "no worker runs"
    if status != 200:
        return None, f"HTTP {status}"
    stacks = contract.parse_stacks(body)
    if stacks is None:
        return None, "a malformed answer"
    return stacks, ""
