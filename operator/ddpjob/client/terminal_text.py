"""Text from pods and from the status, made safe to print on the user's terminal.

A pod's output, a termination message, a node's reason: anyone who runs code in the job (or
may write pod status) chose these bytes. Printed raw, an escape sequence could move the cursor,
rewrite earlier lines or retitle the terminal, and a carriage return could overwrite the line
it sits on; so every control character is shown as an escape (``\\x1b``), and text that is not
UTF-8 as U+FFFD.
"""
from __future__ import annotations

import re

from ddpjob import contract

# C0 controls but tab, DEL, C1 controls; and the bidi overrides and isolates, which can make a
# line read in an order other than the one it has (CVE-2021-42574, "Trojan Source").
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every character that could steer a terminal written as an escape."""
    return _UNSAFE.sub(contract.escape, text)


def printable_lines(text: str, width: int) -> list[str]:
    """Multi-line text (a termination message) as printable lines of at most ``width``."""
    return [_clip(printable(line), width) for line in text.splitlines()]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def one_line(text: str, limit: int) -> str:
    """One printable line of at most ``limit`` characters (more: cut, with "...")."""
    return _clip(printable(" ".join(text.split())), limit)
