"""How far a reader has to walk to follow one reconcile pass (issue 34's measure of the code).

The walk is every call (as ``sys.settrace`` sees it) of a named function of the state machine's rooms (the modules under operator/ddpjob/controller/) while
``reconcile`` runs one pass, in order. Left out, as a reader skips them once they know them: the
vocabulary every room shares (the Plan and its helpers in plan.py, the pod and Service views in
observation.py, the job's memory in memory.py, and the API's value types under api/), and
comprehensions (they read where they stand). A *stay* is a run of consecutive calls in one file
(a reader opens that file once for it); a *return* is a stay in a file the walk had already left
(the reader goes back to a file already read). The fewer of both, the more a pass reads
top-down.

Three passes of a two-node job are walked, with the real spec parser and a fake API
(tests/support/operator_fakes.py): the first pass of a new job (its Service and pods created), a
pass that sees the gang running, and a pass that sees a rank fail and restarts the gang. Each
pass is cut at ``EVENTS`` calls of the whole package (the issue's window; each pass here makes
450-620, so the window holds all of it). ``every_call`` is the same walk with nothing left out:
printed beside it, so that what the definition leaves out stays visible.

    python -m tests.support.reconcile_walk          # each pass's walk, both ways

tests/unit/test_reconcile_walk.py holds the bound the issue sets (under 40 stays and 25 returns).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ddpjob.controller.memory import JobMemory
from ddpjob.controller.reconcile import reconcile

EVENTS = 1600
PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "ddpjob"
ROOMS = "controller/"
VOCABULARY = frozenset({"controller/plan.py", "controller/observation.py", "controller/memory.py"})


@dataclass(frozen=True)
class Walk:
    """One pass's walk: the files of its stays, in order, and how many calls the pass made."""

    stays: tuple[str, ...]
    calls: int

    @property
    def returns(self) -> int:
        seen: set[str] = set()
        count = 0
        for name in self.stays:
            count += name in seen
            seen.add(name)
        return count

    @property
    def files(self) -> int:
        return len(set(self.stays))

    def __str__(self) -> str:
        return (f"{len(self.stays)} stays in {self.files} files, {self.returns} returns "
                f"({self.calls} calls of the package)")


def _in_walk(name: str, function: str) -> bool:
    return name.startswith(ROOMS) and name not in VOCABULARY and not function.startswith("<")


def walk_of(run: Callable[[], object], events: int = EVENTS, *, every_call: bool = False) -> Walk:
    """The walk of ``run()``: its calls of the rooms' functions (``every_call``: of any function
    of the package), cut at ``events`` calls of the package."""
    stays: list[str] = []
    calls = 0
    root = str(PACKAGE) + "/"

    def tracer(frame, event, arg):  # noqa: ARG001
        nonlocal calls
        path = frame.f_code.co_filename
        if event != "call" or not path.startswith(root) or calls >= events:
            return None  # calls only: no line or return events are needed
        calls += 1
        name = path[len(root):]
        if (every_call or _in_walk(name, frame.f_code.co_name)) and (not stays or stays[-1] != name):
            stays.append(name)
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(previous)
    return Walk(tuple(stays), calls)


def _passes() -> dict[str, Callable[[], object]]:
    # Imported here: the fakes are test support, and this module is imported by a unit test only.
    from tests.support.jobs import pod_view
    from tests.support.operator_fakes import NOW, SETTINGS, FakeKube, body

    def one_pass(obj, pods, memory, kube):
        return reconcile(obj, pods, memory, kube=kube, settings=SETTINGS, post_event=lambda event: None,
                         now=NOW)

    def first():
        return one_pass(body(), [], JobMemory(), FakeKube())

    def prepared(pods):
        """A job past its first pass (its pods created), then one pass seeing ``pods``."""
        kube, memory = FakeKube(), JobMemory()
        one_pass(body(), [], memory, kube)
        return lambda: one_pass(body(), pods, memory, kube)

    running = prepared([pod_view(0), pod_view(1)])
    failed = prepared([pod_view(0), pod_view(1, "Failed", exit_code=1)])
    return {"first pass (creates the gang)": first, "the gang running": running,
            "a rank failed (restarts the gang)": failed}


def walks(events: int = EVENTS, *, every_call: bool = False) -> dict[str, Walk]:
    """The walk of each of the three passes (each pass run afresh)."""
    return {name: walk_of(run, events, every_call=every_call) for name, run in _passes().items()}


def main() -> int:
    every = walks(every_call=True)
    for name, walk in walks().items():
        print(f"{name}: {walk}")
        print("    " + " > ".join(stay.removeprefix(ROOMS) for stay in walk.stays))
        print(f"    every call of the package, nothing left out: {every[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
