"""Asking pod entry points for their state (``GET /attempt``) off the reconcile threads, in
shares per namespace (issue 35, finding 3).

A pass whose gang lost readiness asks the pods what happened (``observe._entry_states``).
Those pods are the job's, so whoever wrote its command can make them answer slowly and flap
their readiness. Asked on the pass's own thread, a pod that answers slowly held a reconcile
thread for a deadline (2 s) per round of 16 pods, again on every pass: a tenant with enough such
jobs held every reconcile thread, and every other namespace's passes queued behind them. What
bounds it here (docs/security.md, threat-model table):

- **threads**: the asks run on one shared pool of ``ASKS_AT_ONCE`` threads, never on the
  pass's; a pass waits for the asks it started for at most ``PASS_WAIT_SECONDS`` (a real entry
  point answers in milliseconds, so the pass that asks usually decides on the answer), then
  goes on without them: the answer wakes the job (``on_done``) and that pass takes it (the job
  is also requeued ``RECHECK_SECONDS`` later while an ask is open);
- **slow namespaces**: a namespace whose ask outlasted a pass's wait is slow for
  ``SLOW_FOR_SECONDS``: its passes do not wait at all meanwhile, so pods that answer slowly
  cost their tenant's passes one wait per ``SLOW_FOR_SECONDS``, not one per pass;
- **shares**: a namespace has at most ``ASKS_PER_NAMESPACE`` asks running at once; the rest
  wait in the namespace's own queue, and a free thread goes to the namespaces in turn, so one
  tenant's slow pods never hold every thread;
- **repetition**: at most one ask per pod in flight, and a pod is asked again no sooner than
  ``REASK_SECONDS`` after its last ask (flapping its readiness does not make it asked on every
  pass); the answer is kept per pod uid in the job's memory (``Ask``) and aged when it is used.

The request itself (the pod's IP only, one deadline, a size bound, a strict parser) is
``restart_orders.fetch_entry_state``.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional

from ddpjob import restart_orders
from ddpjob.contract import EntryState

logger = logging.getLogger("ddpjob.controller.entry_asks")

#: Threads asking entry points, over every job of the operator.
ASKS_AT_ONCE = 64
#: Asks of one namespace running at once (the old per-pass bound, restart_orders.ORDERS_AT_ONCE).
ASKS_PER_NAMESPACE = 16
#: The most a pass waits for the answers of the asks it started.
PASS_WAIT_SECONDS = 0.5
#: While an ask is open, the job's next pass comes this soon to take its answer.
RECHECK_SECONDS = 0.5
#: A pod is asked again no sooner than this after its last ask.
REASK_SECONDS = 2.0
#: A namespace whose ask outlasted a pass's wait: its passes wait for none this long.
SLOW_FOR_SECONDS = 60.0


@dataclass(eq=False)
class Ask:
    """One ``GET /attempt`` of one pod: when it was asked, and once ``done`` is set, what the
    pod said (None: no usable answer) and when (the reader's clock)."""

    namespace: str
    ip: str
    port: int
    deadline: float
    asked_at: float
    state: Optional[EntryState] = None
    answered_at: Optional[float] = None
    #: The pod was seen ready after this ask: its answer says nothing of the pod's later drop.
    stale: bool = False
    #: The pod's ask before this one (its readiness has not come back since): its answer stands
    #: until this one's comes.
    previous: Optional["Ask"] = None
    #: Called (on the reader's thread) once answered: wakes the job whose pass asked.
    on_done: Optional[Callable[[], None]] = None
    done: threading.Event = field(default_factory=threading.Event)

    def answer(self, now: float) -> Optional[EntryState]:
        """The pod's state, its ``seconds_since_failure`` aged by the time since the answer."""
        if not self.done.is_set():
            return self.previous.answer(now) if self.previous is not None else None
        self.previous = None  # answered: let the chain go
        state = self.state
        if state is None or state.seconds_since_failure is None or self.answered_at is None:
            return state
        return replace(state, seconds_since_failure=state.seconds_since_failure + max(0.0, now - self.answered_at))


class EntryStateReader:
    """The shared pool of entry-state asks, with one queue and one share per namespace."""

    def __init__(self, slots: int = ASKS_AT_ONCE, per_namespace: int = ASKS_PER_NAMESPACE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.slots, self.per_namespace, self.clock = slots, per_namespace, clock
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None  # started at the first ask
        self._busy = 0
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[Ask]] = {}
        self._turns: deque[str] = deque()  # namespaces with waiting asks, in turn
        self._slow_until: dict[str, float] = {}  # namespace -> until when its passes do not wait

    def ask(self, namespace: str, ip: str, port: int, deadline: float, *,
            previous: Optional[Ask] = None, on_done: Optional[Callable[[], None]] = None) -> Ask:
        """A new ask of one pod, queued behind its namespace's share; never blocks."""
        if previous is not None:
            previous.previous = None  # one answer back is enough
        ask = Ask(namespace, ip, port, deadline, asked_at=self.clock(), previous=previous, on_done=on_done)
        with self._lock:
            if namespace not in self._waiting:
                self._waiting[namespace] = deque()
                self._turns.append(namespace)
            self._waiting[namespace].append(ask)
            self._dispatch()
        return ask

    def pass_wait(self, namespace: str) -> float:
        """How long a pass of ``namespace`` waits for the asks it started: none while slow."""
        with self._lock:
            return 0.0 if self.clock() < self._slow_until.get(namespace, float("-inf")) else PASS_WAIT_SECONDS

    def wait(self, namespace: str, asks: Iterable[Ask]) -> None:
        """A pass's wait for the asks it started; one still open makes the namespace slow."""
        asks = list(asks)
        wait(asks, self.pass_wait(namespace))
        if any(not a.done.is_set() for a in asks):
            now = self.clock()
            with self._lock:  # pruned as it grows: one entry per namespace that was slow lately
                self._slow_until = {ns: t for ns, t in self._slow_until.items() if t > now}
                self._slow_until[namespace] = now + SLOW_FOR_SECONDS

    def in_flight(self, namespace: str) -> int:
        """Asks of ``namespace`` running now (tests, metrics)."""
        with self._lock:
            return self._running.get(namespace, 0)

    def _dispatch(self) -> None:
        """Start waiting asks while threads are free, one namespace's turn at a time (under the lock)."""
        started = True
        while started and self._busy < self.slots and self._turns:
            started = False
            for _ in range(len(self._turns)):
                namespace = self._turns.popleft()
                queue = self._waiting[namespace]
                if self._busy < self.slots and self._running.get(namespace, 0) < self.per_namespace:
                    self._start(queue.popleft())
                    started = True
                if queue:
                    self._turns.append(namespace)
                else:
                    del self._waiting[namespace]

    def _start(self, ask: Ask) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="ddpjob-entry")
        self._busy += 1
        self._running[ask.namespace] = self._running.get(ask.namespace, 0) + 1
        self._pool.submit(self._run, ask)

    def _run(self, ask: Ask) -> None:
        try:
            # Looked up at each call: tests (and `ddpjob run`'s fakes) replace the function.
            ask.state = restart_orders.fetch_entry_state(ask.ip, ask.port, ask.deadline)
        except Exception:  # a bug must not take a slot for good; the pod counts as silent
            logger.exception("entry state of %s: the ask crashed", ask.ip)
            ask.state = None
        finally:
            ask.answered_at = self.clock()
            # The slot is given back before the answer is told: whoever the answer wakes finds
            # the namespace's count already without this ask.
            with self._lock:
                self._busy -= 1
                left = self._running[ask.namespace] - 1
                if left:
                    self._running[ask.namespace] = left
                else:
                    del self._running[ask.namespace]
                self._dispatch()
            ask.done.set()
            _call(ask.on_done)


def _call(callback: Optional[Callable[[], None]]) -> None:
    if callback is None:
        return
    try:
        callback()
    except Exception:  # the job is gone, the loop closed: its next pass, if any, takes the answer
        logger.debug("entry state: waking the job failed", exc_info=True)


def wait(asks: Iterable[Ask], timeout: float) -> None:
    """Wait at most ``timeout`` seconds in all for ``asks`` to be answered."""
    until = time.monotonic() + timeout
    for ask in asks:
        left = until - time.monotonic()
        if left <= 0 or not ask.done.wait(left):
            return


#: The operator's reader (one per process, like the reconcile pools).
READER = EntryStateReader()
