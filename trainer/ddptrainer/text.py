"""Reading small texts: an integer from the environment, the first line of an error.

Standard library only: the pod entry point and the init guard use it before torch is imported.
"""
from __future__ import annotations

from typing import Mapping, Optional

#: How much of an error's first line a message keeps (termination messages are 4 KiB in all).
FIRST_LINE_LIMIT = 300

_RAISE = object()


class BadInteger(ValueError):
    """A variable whose value is not an integer, or is below the allowed minimum."""

    def __init__(self, name: str, raw: str, problem: str):
        super().__init__(f"{name}={raw!r}: {problem}")
        self.name, self.raw, self.problem = name, raw, problem


def env_int(values: Mapping[str, str], name: str, default: Optional[int] = None, *,
            minimum: Optional[int] = None, invalid: object = _RAISE) -> Optional[int]:
    """The integer in ``values[name]`` (the environment, or a URL's query values).

    ``default`` when the name is unset or empty. A value that is not an integer, or is below
    ``minimum``, raises ``BadInteger`` (it names the variable and what is allowed), unless
    ``invalid`` is given: then that is returned instead, for readers that must never fail (a
    progress port, the init guard reading a world it only checks)."""
    raw = values.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        problem = "must be an integer"
    else:
        if minimum is None or value >= minimum:
            return value
        problem = f"must be >= {minimum}"
    if invalid is not _RAISE:
        return invalid  # type: ignore[return-value]
    raise BadInteger(name, raw, problem)


def first_line(text: "str | BaseException", limit: int = FIRST_LINE_LIMIT) -> str:
    """The first line of ``text`` (surrounding blank space dropped), at most ``limit``
    characters. An exception with no text gives its type's name; an empty string, ""."""
    lines = str(text).strip().splitlines()
    if lines:
        return lines[0][:limit]
    return type(text).__name__ if isinstance(text, BaseException) else ""
