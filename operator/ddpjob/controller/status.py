"""How a status moves: time stamps, bounded text, conditions and phase changes (pure).

The shape of the status is ``ddpjob.api.status``; this module only makes new statuses from old.
Conditions follow the Kubernetes convention: ``lastTransitionTime`` moves only when a
condition's ``status`` changes, never when its reason or message is refreshed.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Optional

from ddpjob.api.status import (
    CONDITION_TYPES, CREATED, FAILED, RESTARTING, RUNNING, STATUS_MESSAGE_LIMIT, SUCCEEDED,
    SUSPENDED, Condition, JobStatus,
)

# The phases that have a condition of the same name.
_PHASE_CONDITIONS = (RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)


# ---------------------------------------------------------------------------------------------
# Time
# ---------------------------------------------------------------------------------------------
def format_time(moment: dt.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes its own timestamps."""
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Optional[str]) -> Optional[dt.datetime]:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.timezone.utc)
    except ValueError:
        return None


def truncate(text: str, limit: int) -> str:
    """Keep the end of long container output: a traceback's last lines say what went wrong.
    The cut falls at the start of a line where one is near."""
    text = text.strip()
    if len(text) <= limit:
        return text
    kept = text[-(limit - 3):]
    newline = kept.find("\n")
    if 0 <= newline < len(kept) // 4:
        kept = kept[newline + 1:]
    return "..." + kept


def shorten(text: str, limit: int) -> str:
    """Keep the beginning of a long sentence of ours (a status message, an API error): it says
    what the job is doing ("0/64 node(s) started; ..."); the details trail."""
    text = text.strip()
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


# ---------------------------------------------------------------------------------------------
# Conditions
# ---------------------------------------------------------------------------------------------
def set_condition(conditions: tuple[Condition, ...], type_: str, status: bool, reason: str,
                  message: str, now: dt.datetime) -> tuple[Condition, ...]:
    """``conditions`` with ``type_`` set; its lastTransitionTime moves only if status flips."""
    value = "True" if status else "False"
    previous = next((c for c in conditions if c.type == type_), None)
    moved = previous is None or previous.status != value
    updated = Condition(type=type_, status=value, reason=reason, message=message,
                        lastTransitionTime=format_time(now) if moved else previous.lastTransitionTime)
    others = {c.type: c for c in conditions if c.type != type_}
    others[type_] = updated
    known = [others.pop(t) for t in CONDITION_TYPES if t in others]
    return tuple(known) + tuple(others.values())


def with_phase(status: JobStatus, phase: str, reason: str, message: str, now: dt.datetime,
               *, created: Optional[bool] = None, created_reason: str = "",
               created_message: str = "") -> JobStatus:
    """``status`` in ``phase``: the condition named after the phase True, with the phase's
    reason and message; the others False (with the phase as reason when first listed, and the
    reason and message that made them flip when they stop being True).

    ``created`` sets the Created condition: True once the current attempt's pods have been
    created (its lastTransitionTime is when the attempt started: the startup clock), False
    while the gang is being torn down or the job is suspended; None leaves it as it is.
    """
    message = shorten(message, STATUS_MESSAGE_LIMIT)
    conditions = status.conditions
    if created is not None:
        conditions = set_condition(conditions, CREATED, created, created_reason or reason,
                                   created_message or message, now)
    elif status.condition(CREATED) is None:
        conditions = set_condition(conditions, CREATED, False, phase, "", now)
    for type_ in _PHASE_CONDITIONS:
        previous = next((c for c in conditions if c.type == type_), None)
        if type_ == phase:
            conditions = set_condition(conditions, type_, True, reason, message, now)
        elif previous is None:  # not yet: the phase says why
            conditions = set_condition(conditions, type_, False, phase, "", now)
        elif previous.status == "True":  # no longer: why it flipped
            conditions = set_condition(conditions, type_, False, reason, message, now)
    return replace(status, phase=phase, reason=reason, message=message, conditions=conditions)


def terminal_reason(status: JobStatus) -> tuple[str, str]:
    """A finished job's reason and message, from its sticky Succeeded/Failed condition (the top
    level reason may have been overwritten by a later ReconcileError)."""
    cond = status.condition(status.phase)
    if cond is not None and cond.status == "True":
        return cond.reason, cond.message
    return status.reason, status.message
