"""Python's cyclic garbage collector, set for a long-running watch consumer.

Every watch event the operator decodes is a few kilobytes of JSON: hundreds of dicts and lists,
so with the interpreter's default thresholds (a young collection every 700 allocations) the
collector ran about once per two pod events, and every tenth of those went on to the middle
generation, every hundredth or so to a full pass over everything the process holds: kopf's
per-object machinery, the Kubernetes client's thousands of classes, the imported modules.
Measured with a callback on ``gc.callbacks`` (100 concurrent 4-node jobs, the many-jobs
benchmark, 2026-12-05): 1,332 collections took 1.26 CPU s of the operator's ~8 s, 0.53 s of it
ten full passes; the time showed in the profile wherever an allocation triggered it, most of it
inside the watch streams' JSON decoding (benchmarks/README.md, "CPU per job: the third round").

Two changes, both standard for long-running Python servers:

* ``gc.freeze()`` once the operator has started: what exists then (modules, classes, the
  client, kopf's registry) lives as long as the process, and a full pass no longer walks it.
* A young generation of ``YOUNG_THRESHOLD`` allocations instead of 700: most of an event's
  objects are freed by reference counting before a collection would look at them. With both,
  the same run took 71 collections and 0.67 CPU s.

Garbage in cycles is still collected (later, in larger batches); nothing here disables the
collector. The cost is memory held a little longer: the peak of that run was the same within
noise (106 against 105 MiB).
"""
from __future__ import annotations

import gc

#: Allocations (net of frees) between two young collections; the interpreter's default is 700.
YOUNG_THRESHOLD = 10_000
#: Young collections per middle one, middle ones per full one (the interpreter's defaults).
OLDER_THRESHOLDS = (10, 10)


def settle() -> int:
    """Collect once, freeze what the started process holds, and raise the young threshold.
    Call it once, after the operator's start (its imports, clients and registries exist).
    Returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    return gc.get_freeze_count()
