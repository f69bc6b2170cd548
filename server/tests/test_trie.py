"""The token trie that tree reads pack: node order, ancestor masks, budgeting counts."""

from __future__ import annotations

import numpy as np
import torch

from decision_server.reads import ReadSpec
from decision_server.reads.tree import TokenTrie, _place


def test_ancestor_matrix_of_a_small_tree() -> None:
    trie = TokenTrie()
    root = trie.root("")
    a, b = trie.add_path(root, [10, 11])
    c = trie.add(b, 12)
    d = trie.add(a, 13)  # sibling branch of b under a
    assert trie.add(a, 11) == b  # an existing edge is reused
    assert trie.depths == [0, 1, 2, 1]
    assert trie.parents == [-1, a, b, a]
    expected = np.array(
        [
            [1, 0, 0, 0],  # a sees itself
            [1, 1, 0, 0],  # b sees a
            [1, 1, 1, 0],  # c sees a, b
            [1, 0, 0, 1],  # d sees a, not its sibling b nor c
        ],
        dtype=bool,
    )
    assert (trie.ancestor_matrix() == expected).all()
    assert not trie.is_chain()
    assert c == 2 and d == 3


def test_window_limits_how_far_back_a_node_sees() -> None:
    trie = TokenTrie()
    trie.add_path(trie.root(""), [1, 2, 3, 4])
    windowed = trie.ancestor_matrix(window=2)
    assert windowed[3].tolist() == [False, False, True, True]
    assert trie.is_chain()


def test_salts_get_separate_roots() -> None:
    trie = TokenTrie()
    first = trie.add_path(trie.root("a"), [1, 2])
    second = trie.add_path(trie.root("b"), [1, 2])
    assert set(first).isdisjoint(second)
    assert not trie.is_chain()
    assert not trie.ancestor_matrix()[second[1], first[0]]


def test_missing_nodes_predicts_insertion() -> None:
    generator = torch.Generator().manual_seed(0)
    trie = TokenTrie()
    shared = torch.randint(0, 5, (6,), generator=generator).tolist()
    for i in range(30):
        tail = torch.randint(0, 5, (i % 4,), generator=generator).tolist()
        labels = tuple(tuple(torch.randint(0, 5, (1 + j % 3,), generator=generator).tolist()) for j in range(4))
        read = ReadSpec(id=i, prompt=tuple(shared + tail) or (1,), labels=labels, cache_salt="s" if i % 5 else "t")
        predicted = trie.missing_nodes(read)
        before = len(trie)
        _place(trie, read, None)
        assert len(trie) - before == predicted
    # Parents always precede children: the packed order is a valid causal order.
    assert all(parent < node for node, parent in enumerate(trie.parents))
