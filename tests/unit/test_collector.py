"""The operator's garbage-collector settings (controller/collector.py): what the started process
holds is frozen out of every later collection, young collections come less often, and garbage in
cycles is still collected."""
from __future__ import annotations

import gc
import weakref

import pytest

from ddpjob.controller import collector

pytestmark = pytest.mark.unit


@pytest.fixture
def restore_collector():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class Node:
    def __init__(self) -> None:
        self.other: "Node" = self


def test_settle_freezes_what_exists_and_keeps_collecting_cycles(restore_collector):
    held = Node()  # alive across the settle: part of the "started process"
    assert any(o is held for o in gc.get_objects())
    frozen = collector.settle()

    assert frozen >= 1 and gc.get_freeze_count() == frozen
    assert not any(o is held for o in gc.get_objects())  # no collection walks it any more
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, *collector.OLDER_THRESHOLDS)
    assert collector.YOUNG_THRESHOLD > 700  # the interpreter's default, which the module replaces

    cycle = Node()  # a reference cycle made after the settle: still the collector's to free
    gone = weakref.ref(cycle)
    del cycle
    assert gone() is not None  # reference counting alone cannot free a cycle
    gc.collect()
    assert gone() is None
