"""Python's cyclic garbage collector, settled once the shard is loaded and warm.

A shard's heap at that point holds about 566,000 objects (torch, transformers, compiled graphs, the model's
modules) that never become garbage, yet every full collection walks them all again. A batch creates hundreds of
thousands of tracked objects (trie keys, read tuples, the prefix cache's bookkeeping), enough to trigger a full
collection every few batches: 250-300 ms each, on the model thread, between two forwards. Measured with
`bench/host_batch.py` (64 x 8 x 512 tree batch, 2-core AMD EPYC): collections took 105 ms per batch on average
(medians hid them: most batches paid 10 ms, every third one 270 ms), against 15 ms settled.

Settling collects what warm-up left, moves every surviving object into the permanent generation (`gc.freeze`, never
walked again) and lets the youngest generation grow to `YOUNG_THRESHOLD` objects before a collection, as vLLM and
SGLang freeze their heaps after start-up. Nothing the shard holds from then on is freed later than it would be: its
reads' objects are freed by reference counting; only reference cycles wait for a collection, which still comes."""

from __future__ import annotations

import gc
from dataclasses import dataclass

# Allocations (less deallocations) of tracked objects before a young collection; Python's default is 700. Measured
# (bench/results/2026-12-07-gc/thresholds.txt): frozen, collections per 64 x 8 x 512 batch took 28.9 ms at 700,
# 15.1 ms at 10,000 and 15.0 ms at 50,000; 10,000 keeps the cyclic garbage that may wait small.
YOUNG_THRESHOLD = 10_000


@dataclass(frozen=True)
class Settled:
    frozen_objects: int
    thresholds: tuple[int, int, int]


def settle() -> Settled:
    """Collects, freezes what is left and raises the young generation's threshold (the older ones keep theirs)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return current()


def current() -> Settled:
    """The collector as it is now (also for a shard told to leave it alone)."""
    return Settled(frozen_objects=gc.get_freeze_count(), thresholds=gc.get_threshold())
