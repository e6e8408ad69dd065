"""`ddpjob run`'s in-place gang restart: the operator's protocol (docs/contract.md, "In-place
restart") between the supervisor and its nodes' entry points, on this machine.

With ``failurePolicy.restartMode: InPlace`` (the default) and the trainer's entry point as the
command, each node gets a port of its own on 127.0.0.1 and a random token. A node whose
workers failed keeps running and says so at ``GET /attempt``; the supervisor asks every node
there (``InPlaceGang.failure``, every ``POLL_SECONDS``), applies the same verdict as for an
exited node, and orders ``POST /restart {"attempt": N+1}`` to every node
(``InPlaceGang.order``): their entry points stop what still runs with SIGTERM and start the
next attempt's workers in the same processes (from their warm process, which has imported
torch already: ddptrainer/warm_start.py). A node that does not take the order, or whose entry
point exited, makes the supervisor start the whole gang again, as before.

The requests are the operator's own (``ddpjob.restart_orders``: one deadline, a bounded
answer, a strict parser), so a node answers here exactly as its pod would to the operator.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.api import spec as api
from ddpjob import restart_orders
from ddpjob.local.plan import LOCAL_MASTER_ADDR, NodeControl, reserve_free_port

POLL_SECONDS = 0.25  # how often the nodes are asked: loopback requests of a few hundred bytes
STATE_DEADLINE_SECONDS = 1.0
#: While every failure seen is a consequence code (a peer lost, 143 from torchrun's stop), told
#: less than this long ago, wait for the root cause: the node whose worker died says so within
#: a second (the operator's CONSEQUENCE_GRACE_SECONDS, for the same reason).
CONSEQUENCE_GRACE_SECONDS = 5.0


def applies(spec: api.DDPJobSpec) -> bool:
    """Whether the nodes restart in place: the operator's own rule (``effective_restart_mode``)."""
    return api.effective_restart_mode(spec) == contract.RESTART_MODE_IN_PLACE


def new_controls(nnodes: int) -> list[NodeControl]:
    """A free port (the kernel's choice) and a fresh token for each node. The ports are released
    at once for the entry points to bind; one taken meanwhile turns that node's in-place restart
    off (it says so), and its failure then restarts the gang as before."""
    controls = []
    holders = [reserve_free_port() for _ in range(nnodes)]  # all held at once: distinct ports
    for holder in holders:
        controls.append(NodeControl(port=holder.getsockname()[1], token=secrets.token_urlsafe(24)))
        holder.close()
    return controls


@dataclass(frozen=True)
class NodeFailureSeen:
    """A node whose entry point says its workers failed in the attempt the gang runs."""

    node_rank: int
    exit_code: int
    message: str


def root_cause(states: Mapping[int, Optional[contract.EntryState]], attempt: int, *,
               permanent_codes: Sequence[int] = contract.DEFAULT_PERMANENT_EXIT_CODES,
               ) -> tuple[Optional[NodeFailureSeen], bool]:
    """(the failure that decides, whether to wait for a better one) from the nodes' answers.

    Only ``failed`` states of ``attempt`` count. The root cause is ``contract.failure_rank``'s,
    as in the operator; while every failure is a consequence code told less than
    ``CONSEQUENCE_GRACE_SECONDS`` ago, the answer says to wait (the node whose worker died has
    not said so yet)."""
    failed = [(rank, s) for rank, s in states.items()
              if s is not None and s.state == contract.ENTRY_FAILED and s.attempt == attempt
              and s.exit_code is not None]
    if not failed:
        return None, False
    rank, state = min(failed, key=lambda item: contract.failure_rank(
        item[1].exit_code, when=-(item[1].seconds_since_failure or 0.0), order=item[0],
        permanent_codes=tuple(permanent_codes)))
    fresh = all(s.exit_code in contract.CONSEQUENCE_EXIT_CODES
                and (s.seconds_since_failure or 0.0) < CONSEQUENCE_GRACE_SECONDS for _, s in failed)
    return NodeFailureSeen(rank, int(state.exit_code or 0), state.message), fresh


class InPlaceGang:
    """The supervisor's side for one run: which attempt the nodes run, their failures, orders."""

    def __init__(self, controls: Sequence[NodeControl], permanent_codes: Sequence[int], *,
                 fetch: Callable[[str, int, float], Optional[contract.EntryState]] = restart_orders.fetch_entry_state,
                 order: Callable[[str, int, str, int, float], bool] = restart_orders.order_restart,
                 first_attempt: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.controls = list(controls)
        self.attempt = first_attempt
        self._permanent = tuple(permanent_codes)
        self._fetch, self._order, self._clock = fetch, order, clock
        self._next_poll = 0.0

    def states(self) -> dict[int, Optional[contract.EntryState]]:
        return {rank: self._fetch(LOCAL_MASTER_ADDR, c.port, STATE_DEADLINE_SECONDS)
                for rank, c in enumerate(self.controls)}

    def failure(self) -> Optional[NodeFailureSeen]:
        """The failure of the running attempt that decides, once it is known (at most one round
        of requests per ``POLL_SECONDS``); None while every node runs (or is still to say)."""
        now = self._clock()
        if now < self._next_poll:
            return None
        self._next_poll = now + POLL_SECONDS
        seen, wait = root_cause(self.states(), self.attempt, permanent_codes=self._permanent)
        return None if wait else seen

    def order(self, attempt: int) -> bool:
        """Order every node to run ``attempt``; True once each took it, False at the first
        refusal or silence (the caller then starts the gang anew). From then on only failures
        of ``attempt`` count: a node's answer about the one before is history."""
        for control in self.controls:
            if not self._order(LOCAL_MASTER_ADDR, control.port, control.token, attempt,
                               restart_orders.ORDER_DEADLINE_SECONDS):
                return False
        self.attempt = attempt
        self._next_poll = 0.0
        return True
