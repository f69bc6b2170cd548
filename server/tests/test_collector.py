"""The garbage collector settled for serving (`decision_server.collector`)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from decision_server import collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_settling_collects_freezes_and_raises_the_young_threshold(restored_collector: None) -> None:
    # A reference cycle warm-up left behind is collected, not frozen for the shard's life.
    first, second = Node(), Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    kept = [Node() for _ in range(1000)]
    _, middle, old = gc.get_threshold()
    settled = collector.settle()
    assert gone() is None
    assert settled.frozen_objects == gc.get_freeze_count() >= len(kept)
    assert settled.thresholds == gc.get_threshold() == (collector.YOUNG_THRESHOLD, middle, old)
    # Frozen objects are never walked by a collection again.
    assert all(not any(node is kept[0] for node in gc.get_objects(generation)) for generation in range(3))


def test_cycles_made_after_settling_are_collected_by_the_young_generation(restored_collector: None) -> None:
    collector.settle()
    first, second = Node(), Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    assert gone() is not None  # reference counting cannot free a cycle
    # No explicit collection: YOUNG_THRESHOLD more live objects start one on their own.
    alive = [[] for _ in range(collector.YOUNG_THRESHOLD + 100)]
    assert gone() is None
    assert len(alive) > collector.YOUNG_THRESHOLD
