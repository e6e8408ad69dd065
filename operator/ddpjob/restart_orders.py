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

The order's credential is the pod's restart token. ``ddpjob run`` gives each local node a random
one (``new_token``). The operator never writes a pod's token anywhere: a pod's spec is readable
by every reader of its namespace (``kubectl describe``, the ``view`` role, monitoring agents),
and a token there would let any of them restart the training or read its stacks. Instead a pod
gets a random public nonce and the digest of its token (contract.DDPJOB_RESTART_TOKEN_SHA256);
the token is the HMAC of the pod's namespace, name and nonce under the operator's key
(``RestartKey``, kept in a Secret of the operator's namespace: controller/restart_key.py), so
every replica, and the operator after a restart, can make it again and nobody else can.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
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


KEY_BYTES = 32
NONCE_LIMIT = 64  # characters of a nonce read back from a pod (ours are 22)


class RestartKey:
    """The operator's key: a pod's restart token from its namespace, name and nonce."""

    def __init__(self, key: bytes):
        if len(key) < KEY_BYTES:
            raise ValueError(f"a restart key has at least {KEY_BYTES} bytes, got {len(key)}")
        self._key = key

    def __repr__(self) -> str:
        return "RestartKey(...)"  # never the key in a log line

    def token(self, namespace: str, pod_name: str, nonce: str) -> str:
        """The pod's token; "" for a pod without a nonce (not made to be restarted in place)."""
        if not nonce or len(nonce) > NONCE_LIMIT:
            return ""
        message = f"{namespace}/{pod_name}/{nonce}".encode("utf-8")
        return base64.urlsafe_b64encode(hmac.new(self._key, message, hashlib.sha256).digest()).decode("ascii").rstrip("=")

    def credential(self, namespace: str, pod_name: str) -> tuple[str, str]:
        """A new pod's (nonce, digest of its token): what its spec carries."""
        nonce = secrets.token_urlsafe(16)
        return nonce, contract.restart_token_digest(self.token(namespace, pod_name, nonce))


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


__all__ = ["EntryState", "fetch_entry_state", "fetch_stacks", "new_token", "RestartKey", "order_restart",
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
