"""The order-quality probe's measures on hand-computed cases, and its labelled set's integrity."""

from __future__ import annotations

import math

from decision_bench.order_quality import ITEMS, disagreement, ece, flip_rate, log_loss, orders


def test_every_item_has_three_or_four_distinct_options_and_its_answer_among_them() -> None:
    assert len(ITEMS) >= 20
    for item in ITEMS:
        assert 3 <= len(item.options) <= 4, item
        assert len(set(item.options)) == len(item.options), item
        assert item.answer in item.options, item


def test_orders_are_every_permutation_with_the_given_one_first() -> None:
    got = orders(("a", "b", "c"))
    assert len(got) == 6 and len(set(got)) == 6
    assert got[0] == ("a", "b", "c")
    assert len(orders(("a", "b", "c", "d"))) == 24


def test_flip_rate_counts_items_with_any_change_and_disagreement_counts_reads() -> None:
    choices = [["a", "a", "a"], ["a", "b", "a"], ["c", "c", "c"], ["b", "a", "c"]]
    assert flip_rate(choices) == 0.5
    # Off the item's most frequent choice: 0 + 1 + 0 + 2 of 12 reads.
    assert disagreement(choices) == 3 / 12
    assert flip_rate([]) == 0.0


def test_ece_and_log_loss() -> None:
    # Two bins: (0.9, right), (0.9, wrong) -> |0.5 - 0.9| on half; (0.3, wrong) x2 -> |0 - 0.3| on half.
    assert math.isclose(ece([0.9, 0.9, 0.3, 0.3], [True, False, False, False]), 0.5 * 0.4 + 0.5 * 0.3)
    assert ece([1.0, 1.0], [True, True]) == 0.0
    assert math.isclose(log_loss([0.5, 0.25]), (math.log(2) + math.log(4)) / 2)
    assert log_loss([0.0]) == -math.log(1e-15)
