"""Text a pod writes reaches the status and Events with its control characters as escapes
(issue 35, not yet examined: what failing pods put into Events and the status): ESC sequences,
BEL, OSC-8 links, bidi overrides and zero-width characters from a termination message, a
waiting or scheduling reason, or an entry point's answer; tabs and newlines are kept."""
from __future__ import annotations

import datetime as dt
import json
import unicodedata

import pytest

from ddpjob import contract
from ddpjob.api import spec
from ddpjob.api.status import JobStatus, format_time, with_phase
from ddpjob.controller.observation import view_pod
from tests.support.decisions import decide
from tests.support.jobs import UID, make_job

pytestmark = pytest.mark.unit
NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
HOSTILE = ("\x1b[2J\x1b[31mroot cause\x07 \x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ "
           "\u202eevil\u202c \u200bhidden\u2028\x00\x9b\r\tend\nline 2")
UNSAFE = {"Cc", "Cf", "Zl", "Zp"}


def unsafe_in(text: str) -> list[str]:
    return [hex(ord(c)) for c in text if unicodedata.category(c) in UNSAFE and c not in "\n\t"]


def strings(value):
    """Every string in a status as written (json.dumps would escape the C0 controls itself)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings(item)


def raw_pod(rank: int, state: dict, conditions=(), last: dict | None = None) -> dict:
    container = {"name": "trainer", "state": state, "restartCount": 0, "ready": False}
    if last:
        container["lastState"] = {"terminated": last}
    return {"metadata": {"name": f"train-node-{rank}", "uid": f"u{rank}", "creationTimestamp": format_time(NOW),
                         "labels": {"ddpjob.dev/node-rank": str(rank), "ddpjob.dev/restart-attempt": "0"},
                         "ownerReferences": [{"uid": UID, "controller": True, "kind": "DDPJob", "name": "train"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "trainer"}]},
            "status": {"phase": "Failed" if "terminated" in state else "Pending", "reason": HOSTILE,
                       "message": HOSTILE, "conditions": list(conditions), "containerStatuses": [container]}}


def status() -> JobStatus:
    base = JobStatus(nnodes=2, startTime=format_time(NOW))
    return with_phase(base, "Running", "AllNodesRunning", "", NOW, created=True)


def test_every_text_field_of_a_pod_view_is_escaped():
    pods = [raw_pod(0, {"terminated": {"exitCode": 1, "reason": HOSTILE, "message": HOSTILE,
                                       "finishedAt": format_time(NOW)}}, last={"reason": HOSTILE, "message": HOSTILE}),
            raw_pod(1, {"waiting": {"reason": HOSTILE, "message": HOSTILE}},
                    conditions=[{"type": "PodScheduled", "status": "False", "reason": HOSTILE, "message": HOSTILE},
                                {"type": "DisruptionTarget", "status": "True", "reason": HOSTILE, "message": HOSTILE}])]
    for raw in pods:
        view = view_pod(raw)
        assert view is not None
        for field in ("terminated_reason", "terminated_message", "pod_reason", "pod_message", "waiting_reason",
                      "waiting_message", "unschedulable", "disruption", "disruption_message", "last_reason",
                      "last_message"):
            value = getattr(view, field)
            assert not unsafe_in(value), (field, value)
    assert "\\x1b[31mroot cause\\x07" in view_pod(pods[0]).terminated_message
    assert "\tend\nline 2" in view_pod(pods[0]).terminated_message  # a traceback's layout stays


def test_a_failure_puts_no_control_character_into_the_status_or_the_events():
    job = make_job(failurePolicy=spec.FailurePolicy(maxRestarts=1))
    failed = view_pod(raw_pod(0, {"terminated": {"exitCode": 1, "reason": "Error", "message": HOSTILE,
                                                 "finishedAt": format_time(NOW)}}))
    waiting = view_pod(raw_pod(1, {"waiting": {"reason": "ErrImagePull", "message": HOSTILE}}))
    plan = decide(job, status(), [failed, waiting], NOW)
    written = list(strings(plan.status.to_dict()))
    assert any("root cause" in text for text in written) and plan.status.failureHistory, written
    assert not [text for text in written if unsafe_in(text)], written
    for event in plan.events:
        assert not unsafe_in(event.message), event


def test_an_entry_points_answer_is_escaped_too():
    body = json.dumps({"attempt": 0, "state": contract.ENTRY_FAILED, "exitCode": 1, "message": HOSTILE}).encode()
    state = contract.parse_entry_state(body)
    assert state is not None and not unsafe_in(state.message) and "\\u202eevil" in state.message
    assert len(state.message) <= contract.MAX_ENTRY_MESSAGE_CHARS
