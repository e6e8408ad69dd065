"""Where a stalled gang was stuck: the Python stacks of its pods' workers, read just before the
restart erases them (docs/operator.md, "Hang detection").

``decide`` says which pods to ask (``Plan.stacks``, a ``plan.StacksRequest``: the suspect's and at most a few others);
the pass asks them (``restart_orders.fetch_stacks``, one deadline for all, before it restarts
or deletes anything) and posts one Warning Event ``StalledStacks`` whose message is
``summarize``'s: each rank's innermost frames, the suspect rank first, within an Event's
message budget. The full answers go to the operator's log (``log_text``). Pure functions of
what the pods said; what a pod says is untrusted and already bounded by contract.parse_stacks.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ddpjob.api.status import STATUS_MESSAGE_LIMIT, shorten

STALLED_STACKS = "StalledStacks"
MAX_PODS = 3  # pods asked for their stacks at one stall: the suspect's and two others
SUSPECT_FRAMES = 5  # innermost frames shown of the suspect rank
OTHER_FRAMES = 3  # ... and of every other rank
EVENT_LIMIT = STATUS_MESSAGE_LIMIT  # kopf cuts an Event's message at 1 KiB
LOG_LIMIT = 64 * 1024  # the operator's log line with every answer
# faulthandler writes 'File "p", line 3 in f'; traceback writes 'File "p", line 3, in f'
_FRAME = re.compile(r'\s*File "(?P<path>[^"]*)", line (?P<line>\d+),? in (?P<name>.+)')
_THREAD_START = ("Thread 0x", "Current thread 0x")
_THREADING_BOOTSTRAP = ("_bootstrap", "_bootstrap_inner")


@dataclass(frozen=True)
class PodStacks:
    """One pod's answer: its ranks' dumps, or why there are none."""

    pod: str
    stacks: Optional[Mapping[str, str]]
    error: str = ""


def _threads(dump: str) -> list[list[tuple[str, str, str]]]:
    """The dump's threads, each a list of (function, file name, line), innermost first."""
    threads: list[list[tuple[str, str, str]]] = []
    current: Optional[list[tuple[str, str, str]]] = None
    for line in dump.splitlines():
        stripped = line.strip()
        if stripped.startswith(_THREAD_START) or current is None:
            current = []
            threads.append(current)
            if stripped.startswith(_THREAD_START):
                continue
        match = _FRAME.match(line)
        if match:
            current.append((match["name"].strip(), os.path.basename(match["path"]), match["line"]))
    return [t for t in threads if t]


def main_frames(dump: str) -> list[tuple[str, str, str]]:
    """The frames of the thread that runs the program: not one started by ``threading`` (whose
    outermost frame is its bootstrap), else the first thread dumped."""
    threads = _threads(dump)
    for frames in threads:
        if frames[-1][0] not in _THREADING_BOOTSTRAP:
            return frames
    return threads[0] if threads else []


def _rank_of(key: str) -> int:
    return int(key.split("/", 1)[0])


def _rank_line(key: str, dump: str, pod: str, count: int, suspect: bool) -> str:
    frames = main_frames(dump)[:count]
    where = " < ".join(f"{name} ({file}:{line})" for name, file, line in frames) or "no Python frames"
    return f"rank {key}{' (suspect)' if suspect else ''} on {pod}: {where}"


def summarize(answers: Sequence[PodStacks], suspect_rank: Optional[int]) -> str:
    """The Event's message: each rank's innermost frames (the suspect rank's first and deepest),
    then the pods that could not be read and why; at most ``EVENT_LIMIT`` characters."""
    lines: list[tuple[tuple[int, int], str]] = []
    failed: list[str] = []
    for answer in answers:
        if answer.stacks is None:
            failed.append(f"{answer.pod}: {answer.error or 'no answer'}")
            continue
        if not answer.stacks:
            failed.append(f"{answer.pod}: no worker answered")
        for key, dump in answer.stacks.items():
            suspect = suspect_rank is not None and _rank_of(key) == suspect_rank
            line = _rank_line(key, dump, answer.pod, SUSPECT_FRAMES if suspect else OTHER_FRAMES, suspect)
            lines.append(((0 if suspect else 1, _rank_of(key)), line))
    if not lines:
        message = "The stacks of the stalled gang could not be read before the restart"
        return shorten(message + (f" ({'; '.join(failed)})" if failed else ""), EVENT_LIMIT)
    message = ("Stacks of the stalled gang before the restart, innermost frame first: "
               + "; ".join(line for _, line in sorted(lines)))
    if failed:
        message += f" [not read: {'; '.join(failed)}]"
    return shorten(message, EVENT_LIMIT)


def log_text(answers: Sequence[PodStacks]) -> str:
    """Every answer in full (each already bounded by the contract), for the operator's log."""
    parts = []
    for answer in answers:
        if answer.stacks is None:
            parts.append(f"--- {answer.pod}: not read: {answer.error}")
            continue
        for key in sorted(answer.stacks, key=_rank_of):
            parts.append(f"--- {answer.pod} rank {key}:\n{answer.stacks[key]}")
    text = "\n".join(parts)
    return text if len(text) <= LOG_LIMIT else text[:LOG_LIMIT] + "\n... (cut)"
