"""A job whose pods fail on purpose, a thousand times and with the largest messages they can
write: what that puts into the status and into Events stays bounded (docs/security.md, "What
failing pods put into the status and Events"). Real reconcile passes against the fake API."""
from __future__ import annotations

import datetime as dt
import json

import pytest

from ddpjob.api.status import STATUS_MESSAGE_LIMIT
from ddpjob.controller import event_budget
from ddpjob.controller.plan import Event
from ddpjob.controller.reconcile import JobMemory
from tests.support.jobs import pod_view
from tests.support.operator_fakes import NOW, FakeKube, body, run_pass

pytestmark = pytest.mark.unit

HOSTILE = ("\x1b[2J\u202e" + "A" * 4000 + "\n") * 16  # 64 KiB of termination message, escapes and all


class _Posted(list):
    """run_pass's event list, each Event admitted by the job's budget first."""

    def __init__(self, memory, events, now):
        super().__init__()
        self.memory, self.events, self.now = memory, events, now

    def append(self, event):
        admitted = self.memory.events.admit(event, self.now)
        if admitted is not None:
            self.events.append(admitted)


def _fail_many(times: int, seconds_apart: float = 1.0, **spec_fields):
    """``times`` gang failures, each a hostile termination message, one every ``seconds_apart``."""
    kube, memory, events = FakeKube(), JobMemory(), []
    job = body(failurePolicy={"maxRestarts": 1000}, **spec_fields)
    now = NOW
    for attempt in range(times):
        # Each Event through the job's budget, as the job's worker posts it (JobWorker.post_event).
        posted = _Posted(memory, events, now)
        run_pass(job, [], memory, kube, posted, now=now)  # the gang (re)created
        running = [pod_view(0, attempt=attempt), pod_view(1, attempt=attempt)]
        run_pass(job, running, memory, kube, posted, now=now)
        failed = [pod_view(0, attempt=attempt),
                  pod_view(1, "Failed", attempt=attempt, exit_code=1, terminated_message=HOSTILE)]
        run_pass(job, failed, memory, kube, posted, now=now)
        now += dt.timedelta(seconds=seconds_apart)
    return kube, memory, events


def test_a_thousand_failures_keep_the_status_and_the_events_bounded():
    kube, memory, events = _fail_many(1000)
    assert memory.status.restarts == 1000 or memory.status.phase == "Failed"
    # The status: the failure history keeps its last ten, each message cut.
    size = len(json.dumps(kube.status))
    assert size < 32 * 1024, size
    assert len(kube.status.get("failureHistory") or []) <= 10
    assert len(kube.status["message"]) <= STATUS_MESSAGE_LIMIT
    assert "\x1b" not in json.dumps(kube.status, ensure_ascii=False)
    # The Events: a burst per reason, then one a minute (1,000 s of failures: about 17 more).
    by_reason: dict[str, int] = {}
    for event in events:
        by_reason[event.reason] = by_reason.get(event.reason, 0) + 1
    allowed = event_budget.BURST + 1000 / event_budget.REFILL_SECONDS + 1
    assert all(count <= allowed for count in by_reason.values()), by_reason
    assert len(events) < 200, len(events)
    assert memory.events.dropped_total > 2000  # three Events a restart without the budget
    said = [e for e in events if e.message.startswith("[")]
    assert said and "not posted" in said[0].message


def test_a_few_restarts_post_every_event():
    _, memory, events = _fail_many(3)
    assert memory.events.dropped_total == 0
    assert [e.reason for e in events].count("Restarting") == 3


def test_the_budget_refills_and_says_what_it_left_out():
    budget = event_budget.EventBudget(burst=2, refill_seconds=60)
    event = Event("Warning", "Restarting", "restart")
    posted = [budget.admit(event, NOW) for _ in range(5)]
    assert [p is not None for p in posted] == [True, True, False, False, False]
    assert budget.admit(event, NOW + dt.timedelta(seconds=30)) is None  # half a token
    later = budget.admit(event, NOW + dt.timedelta(seconds=60))
    assert later is not None and later.message.startswith("[4 earlier Restarting Event(s) not posted")
    assert later.message.endswith("] restart")
    # Another reason has a budget of its own.
    assert budget.admit(Event("Normal", "Running", "running"), NOW) is not None
