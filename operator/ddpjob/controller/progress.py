"""Asking a running gang's pods for their ranks' progress reports (the operator's only I/O for
progress; what the reports mean is ``ddpjob.api.progress``).

Each pod serves its ranks' latest reports at ``http://<pod IP>:<DDPJOB_PROGRESS_PORT>/progress``
(docs/contract.md, Progress). The operator polls every ``DDPJOB_OPERATOR_PROGRESS_POLL_SECONDS``:
no Kubernetes credentials in the pods, no API server request (docs/operator.md, "Progress and
hang detection", has the choice and its cost).
"""
from __future__ import annotations

import datetime as dt
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

from ddpjob import contract
from ddpjob.api.progress import RankReport, parse_answer
from ddpjob.controller import metrics

_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="ddpjob-progress")


def fetch(ip: str, port: int, timeout: float) -> Optional[Any]:
    """One pod's answer, or None (not serving: no reports yet, another program, unreachable)."""
    url = f"http://{ip}:{port}{contract.PROGRESS_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - http to a pod
            return json.loads(response.read(1 << 20))
    except (OSError, ValueError):
        return None


def poll_pods(ips: Sequence[str], port: int, timeout: float,
              now: Any = None) -> list[dict[int, RankReport]]:
    """Every pod at once; each answer stamped with the time it came back."""
    def ask(ip: str) -> dict[int, RankReport]:
        body = fetch(ip, port, timeout)
        metrics.PROGRESS_POLLS.labels("yes" if body is not None else "no").inc()
        observed = now() if now else dt.datetime.now(dt.timezone.utc)
        return parse_answer(body, observed) if body is not None else {}

    return list(_POOL.map(ask, [ip for ip in ips if ip]))
