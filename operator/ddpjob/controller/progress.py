"""Asking a running gang's pods for their ranks' progress reports (the operator's only I/O for
progress; what the reports mean is ``ddpjob.api.progress``).

Each pod serves its ranks' latest reports at ``http://<pod IP>:<DDPJOB_PROGRESS_PORT>/progress``
(docs/contract.md, Progress). The operator polls every ``DDPJOB_OPERATOR_PROGRESS_POLL_SECONDS``:
no Kubernetes credentials in the pods, no API server request (docs/operator.md, "Progress and
hang detection", has the choice and its cost).

The answer comes from a pod, so from whoever wrote the job's command: it is untrusted
(docs/security.md, "Pod -> operator: the progress answer"). What bounds it here:

- **time**: one deadline for the whole request (connect, send, every byte of the answer), not
  per read: a pod that trickles a byte every half second is cut off at the deadline;
- **place**: one plain HTTP/1.0 GET to the pod's own IP (an address, never a name to resolve)
  and port; the answer must be ``200``; a redirect, or anything else, is no answer. Nothing
  is ever followed, so a pod cannot make the operator fetch another URL;
- **size**: the whole response (head and body) at most ``answer_limit(ranks)`` bytes, and no
  more objects and arrays than a real answer for that many ranks has, checked before parsing
  (so no deep nesting reaches the parser); ``NaN``/``Infinity`` and integers too long for
  int64 are no values;
- **concurrency**: the polls are coroutines (a slow pod holds a socket, not a thread), at most
  ``PER_JOB_CONNECTIONS`` at once per job and ``connections`` for the whole operator, taken
  in turn (first come, first served): a job whose pods are slow delays another job's poll by
  at most a deadline or so, and never holds more than its share;
- **ranks**: each pod's answer counts only for the ranks that pod hosts (``api.progress``).
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import json
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.api.progress import RankReport, parse_answer
from ddpjob.controller import metrics

#: Progress GETs open at once over every job's polls (sockets, not threads: a slow pod costs
#: a file descriptor until its deadline).
CONNECTIONS = 512
#: Threads that parse answers (bounded in size, so each parse is short): the poll pool.
DECODE_WORKERS = 4
#: One job's poll opens at most this many connections at once: its pods answer within a
#: deadline each, so a 256-pod gang is polled in 256 / 32 rounds at worst.
PER_JOB_CONNECTIONS = 32
#: Response bytes allowed per rank a pod hosts, and the fixed allowance (status line,
#: headers, the ``{"ranks": {}}`` around the reports). A real report is under 300 bytes.
BYTES_PER_RANK = 512
BYTES_FIXED = 1024
_MAX_CONTAINERS_FIXED = 16  # objects and arrays allowed beside two per hosted rank
_INT_DIGITS = 20  # int64 has at most 19 digits, and a sign


@dataclass(frozen=True)
class Target:
    """One pod to ask: its IP and the global ranks it hosts (node_rank * nproc, ...)."""

    ip: str
    ranks: range
    #: The attempt polled: an answer that names another one carries no report of this attempt.
    attempt: Optional[int] = None


def answer_limit(ranks: int) -> int:
    """The most bytes a pod hosting ``ranks`` ranks may answer (head and body)."""
    return BYTES_FIXED + BYTES_PER_RANK * max(1, ranks)


async def fetch(ip: str, port: int, deadline: float, limit: int) -> Optional[bytes]:
    """The body of one pod's ``200`` answer, or None (no answer within ``deadline`` seconds in
    all, more than ``limit`` bytes, not a 200, not an IP address, unreachable)."""
    try:
        address = ipaddress.ip_address(ip)  # never a name: nothing is resolved
    except ValueError:
        return None
    try:
        return await asyncio.wait_for(_get(address, port, limit), timeout=deadline)
    except (OSError, EOFError, asyncio.TimeoutError, ValueError):
        return None


async def _get(address: Any, port: int, limit: int) -> Optional[bytes]:
    reader, writer = await asyncio.open_connection(str(address), port)
    try:
        host = f"[{address}]" if address.version == 6 else str(address)
        writer.write(f"GET {contract.PROGRESS_PATH} HTTP/1.0\r\nHost: {host}:{port}\r\n"
                     "Accept: application/json\r\nConnection: close\r\n\r\n".encode("ascii"))
        await writer.drain()
        response = bytearray()
        while len(response) <= limit:
            chunk = await reader.read(limit + 1 - len(response))
            if not chunk:
                break
            response += chunk
    finally:
        writer.close()  # the transport closes without waiting for the peer
    if len(response) > limit:
        return None
    return _body_of_200(bytes(response))


def _body_of_200(response: bytes) -> Optional[bytes]:
    """The body of an HTTP/1.x ``200`` response read to its end; None for anything else (a
    redirect is not followed: it is no answer)."""
    head, separator, body = response.partition(b"\r\n\r\n")
    if not separator:
        return None
    lines = head.split(b"\r\n")
    status = lines[0].split(None, 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or status[1] != b"200":
        return None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip() != str(len(body)).encode():
            return None  # cut short (or padded): not the answer the pod meant
        if name.strip().lower() == b"transfer-encoding":
            return None  # HTTP/1.0 has none; a chunked body is not JSON
    return body


def _no_constant(name: str) -> None:
    return None  # NaN, Infinity, -Infinity: JSON has no such values; the field is left out


def _bounded_int(text: str) -> Optional[int]:
    return int(text) if len(text) <= _INT_DIGITS else None  # beyond int64: no value


def decode(body: bytes, ranks: int) -> Optional[Any]:
    """A pod's answer body -> JSON, or None. A real answer for ``ranks`` ranks has 2 + ranks
    objects (``{"ranks": {"0": {...}}}``); more than a few times that many objects and arrays
    is refused before the parser sees them, which also bounds the nesting depth."""
    if body.count(b"{") + body.count(b"[") > _MAX_CONTAINERS_FIXED + 2 * max(1, ranks):
        return None
    try:
        return json.loads(body, parse_constant=_no_constant, parse_int=_bounded_int)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def read_answer(body: Optional[bytes], target: Target, observed: dt.datetime) -> dict[int, RankReport]:
    """One pod's body -> the reports of the ranks it hosts; {} for no (or no usable) answer."""
    parsed = decode(body, len(target.ranks)) if body is not None else None
    metrics.PROGRESS_POLLS.labels("yes" if parsed is not None else "no").inc()
    if parsed is None or not answers_for(parsed, target.attempt):
        return {}
    return parse_answer(parsed, observed, ranks=target.ranks)


def answers_for(parsed: Any, attempt: Optional[int]) -> bool:
    """Whether an answer may hold reports of ``attempt``: it names no attempt (a server of the
    user's own, an entry point in Recreate mode, whose pods live for one attempt), or names
    exactly that one (an int; anything else is no answer). An entry point that restarts in place
    answers with the attempt its workers ran in until it starts the next one: those reports
    are the attempt before's, even though the operator already counts the pod in the next."""
    if attempt is None or not isinstance(parsed, Mapping) or contract.PROGRESS_ATTEMPT_KEY not in parsed:
        return True
    named = parsed[contract.PROGRESS_ATTEMPT_KEY]
    return type(named) is int and named == attempt


@contextlib.asynccontextmanager
async def _slot(*semaphores: Optional[asyncio.Semaphore]) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for semaphore in semaphores:
            if semaphore is not None:
                await stack.enter_async_context(semaphore)
        yield


async def poll_pods(pool: Optional[Executor], targets: Sequence[Target], port: int, deadline: float, *,
                    connections: Optional[asyncio.Semaphore] = None,
                    per_job: int = PER_JOB_CONNECTIONS,
                    now: Optional[Callable[[], dt.datetime]] = None) -> list[dict[int, RankReport]]:
    """One job's pods, at most ``per_job`` at once (and one of the operator's ``connections``
    each); one answer per target, stamped with the time it came back. The GETs are coroutines
    on the event loop (a slow pod holds a socket, never a thread); the bodies are parsed on
    ``pool`` (the poll pool; None: asyncio's default), off the event loop."""
    clock = now or (lambda: dt.datetime.now(dt.timezone.utc))
    job_slots = asyncio.Semaphore(per_job)

    async def ask(target: Target) -> tuple[Optional[bytes], dt.datetime]:
        async with _slot(job_slots, connections):  # the job's own slot first: waiting for the
            body = await fetch(target.ip, port, deadline, answer_limit(len(target.ranks)))  # shared one holds nothing
        return body, clock()

    bodies = await asyncio.gather(*(ask(t) for t in targets))
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        pool, lambda: [read_answer(body, t, at) for (body, at), t in zip(bodies, targets)])
