"""SIGTERM handling: note the signal, let every rank agree on one step to stop at.

The handler only sets a flag: saving from inside a signal handler would run in the middle of
a step (or a collective). Ranks do not get the signal at the same moment (one pod may be
preempted, torchrun forwards to its workers one by one), yet the checkpoint save is a
collective that every rank must enter at the same step. So every step each rank contributes
its flag to a MAX all-reduce on the CPU-side gloo group, asynchronously: the result of step
i's all-reduce is read at step i+1, by which time it has long completed, so the check costs no
waiting and, on a GPU, no device synchronisation. Every rank reads the same result at the same
step, hence stops at the same step.
"""
from __future__ import annotations

import signal
from typing import Any, Optional

import torch
import torch.distributed as dist

from .distributed import DistContext

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Remembers the first SIGTERM/SIGINT; a second SIGINT interrupts at once (Ctrl-C twice)."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def install(self) -> "StopRequest":
        for sig in HANDLED_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None


class StopAgreement:
    """``poll()`` once per step on every rank; True on every rank at the same step."""

    def __init__(self, ctx: DistContext, request: StopRequest):
        self.ctx = ctx
        self.request = request
        self._pending = None
        self._buffer = torch.zeros(1)
        self.agreed_signum: Optional[int] = None

    def poll(self) -> bool:
        local = float(self.request.signum or 0)
        if not self.ctx.distributed:
            if local:
                self.agreed_signum = int(local)
            return bool(local)
        agreed = 0.0
        if self._pending is not None:
            self._pending.wait()
            agreed = float(self._buffer.item())
        # Contribute the signal number; MAX makes every rank see the same one.
        self._buffer = torch.tensor([local])
        self._pending = dist.all_reduce(self._buffer, op=dist.ReduceOp.MAX,
                                        group=self.ctx.control_group, async_op=True)
        if agreed:
            self.agreed_signum = int(agreed)
        return bool(agreed)

    def drain(self) -> None:
        """Wait for the last all-reduce; every rank has exactly one outstanding at the end."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
