"""The token trie that tree reads pack: node order, ancestor masks, budgeting counts."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from decision_server.engines import ReadSpec
from decision_server.engines.tree import Pass, TokenTrie, place_read, plan_passes
from decision_server.sequences import common_prefix


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
        place_read(trie, read, None)
        assert len(trie) - before == predicted
    # Parents always precede children: the packed order is a valid causal order.
    assert all(parent < node for node, parent in enumerate(trie.parents))


def test_paths_added_in_bulk_build_the_trie_one_add_per_token_builds() -> None:
    """`add_path` (the root's last path reused, then bulk appends) gives the very trie `add` builds token by token:
    reads of a request sharing a state, a state shared again later, paths that end inside or run past another,
    several roots (salts, a cached prefix's start), label branches, empty paths."""
    generator = torch.Generator().manual_seed(3)
    bulk, reference = TokenTrie(), TokenTrie()

    def by_token(trie: TokenTrie, parent: int, tokens: list[int]) -> list[int]:
        nodes = []
        for token in tokens:
            parent = trie.add(parent, token)
            nodes.append(parent)
        return nodes

    # 150 and 90: paths longer than 64 new tokens key their edges in array steps (`TokenTrie._extend`).
    states = [torch.randint(0, 6, (n,), generator=generator).tolist() for n in (40, 40, 3, 0, 25, 150, 90)]
    states[1][:20] = states[0][:20]  # two states sharing a head
    for step in range(200):
        state = states[int(torch.randint(0, len(states), (1,), generator=generator))]
        cut = int(torch.randint(0, len(state) + 1, (1,), generator=generator))
        tail = torch.randint(0, 6, (int(torch.randint(0, 5, (1,), generator=generator)),), generator=generator)
        path = state[:cut] + tail.tolist()
        key, start = ("a", 0) if step % 7 else (("cached", 9, 9), 9)
        got = bulk.add_path(bulk.root(key, start), path)
        want = by_token(reference, reference.root(key, start), path)
        assert got == want
        if got:
            label = torch.randint(0, 6, (2,), generator=generator).tolist()
            assert bulk.add_path(got[-1], label) == by_token(reference, want[-1], label)
    for field in ("tokens", "parents", "depths", "root_of", "root_keys", "_children", "_root_starts"):
        assert getattr(bulk, field) == getattr(reference, field), field


def test_claims_count_each_prompt_node_once_even_through_label_branches() -> None:
    """`claim` counts the nodes no earlier claim counted (its binary search relies on claimed nodes being a prefix
    of every path down from a root), also where a prompt runs through another read's unclaimed label branch."""
    generator = torch.Generator().manual_seed(5)
    trie = TokenTrie()
    counted: set[int] = set()
    state = torch.randint(0, 4, (30,), generator=generator).tolist()
    for step in range(300):
        cut = int(torch.randint(0, 31, (1,), generator=generator))
        tail = torch.randint(0, 4, (int(torch.randint(1, 4, (1,), generator=generator)),), generator=generator)
        root = trie.root("x" if step % 3 else ("cached", 1, 5), 0 if step % 3 else 5)
        nodes = trie.add_path(root, state[:cut] + tail.tolist())
        assert trie.claim(nodes) == len(set(nodes) - counted)
        counted |= set(nodes)
        trie.add_path(nodes[-1], torch.randint(0, 4, (2,), generator=generator).tolist())  # a label branch


def test_placing_reads_costs_python_steps_per_read_not_per_token() -> None:
    """Host work that grows with the batch's tokens in Python is what a GPU cannot hide (issue 42: 0.5 ms per read in
    all): placing 8 reads over a 4,000-token state (twice: the engine's chunking and its pass) makes a bounded
    number of Python calls per read, where one `add` per token made over 4,000 (bench/host_batch.py times it)."""
    generator = torch.Generator().manual_seed(0)
    state = torch.randint(0, 1000, (4000,), generator=generator).tolist()
    reads = [ReadSpec(id=i, prompt=(*state, 2000 + i, 7), labels=((1,), (2, 3), (2, 4))) for i in range(8)]
    calls = [0]

    def count(frame: object, event: str, arg: object) -> None:
        if event == "call":
            calls[0] += 1

    for _ in range(2):
        trie = TokenTrie()
        sys.setprofile(count)
        try:
            placed = [place_read(trie, read, None) for read in reads]
        finally:
            sys.setprofile(None)
        assert [p.tokens_computed for p in placed] == [4002] + [2] * 7
    assert calls[0] <= 2 * len(reads) * 30, calls[0]


def test_common_prefix_by_slices() -> None:
    assert common_prefix((), ()) == 0
    assert common_prefix((1, 2, 3), (1, 2, 3)) == 3
    assert common_prefix((1, 2, 3), (1, 2)) == 2
    assert common_prefix((5,), (1, 2)) == 0
    assert common_prefix((1, 2, 3, 4), (1, 2, 9, 4), guess=2) == 2  # a right guess
    assert common_prefix((1, 2, 3, 4), (1, 2, 9, 4), guess=3) == 2  # a wrong one is not taken
    assert common_prefix((1, 2, 3, 4), (1, 2, 9, 4), guess=1) == 2
    assert common_prefix((1, 2), (1, 2, 3), guess=5) == 2
    for n in range(1, 70):
        a = tuple(range(n))
        for k in range(n):
            assert common_prefix(a, (*a[:k], -1, *a[k + 1 :])) == k


def ancestors(trie: TokenTrie, node: int) -> set[int]:
    found = set()
    while (node := trie.parents[node]) >= 0:
        found.add(node)
    return found


def assert_valid_plan(trie: TokenTrie, passes: list[Pass]) -> None:
    """Every node computed once, after its ancestors; a pass's past is exactly the ancestors its nodes share
    outside the pass; a chain pass is a chain."""
    done: set[int] = set()
    for step in passes:
        assert list(step.nodes) == sorted(step.nodes)
        assert set(step.past) <= done
        members = set(step.nodes)
        for node in step.nodes:
            outside = ancestors(trie, node) - members
            assert outside == set(step.past), (node, step)
        if step.chain:
            assert all(trie.parents[b] == a for a, b in zip(step.nodes, step.nodes[1:], strict=False))
        done |= members
    assert sorted(done) == list(range(len(trie)))
    assert sum(len(step.nodes) for step in passes) == len(trie)


def test_plan_runs_the_shared_chain_causally_and_the_branches_together() -> None:
    trie = TokenTrie()
    root = trie.root("")
    head = trie.add_path(root, list(range(100, 140)))  # a 40-token chat head + state
    branches = [trie.add_path(head[-1], [200 + i, 300 + i, 400 + i]) for i in range(3)]
    passes = plan_passes(trie, min_chain_tokens=32, min_split_tokens=256)
    assert_valid_plan(trie, passes)
    assert [(step.chain, len(step.nodes), len(step.past)) for step in passes] == [(True, 40, 0), (False, 9, 40)]
    assert passes[1].nodes == tuple(sorted(n for b in branches for n in b))


def _two_states_trie() -> TokenTrie:
    """Two requests with different 300-token states (4 three-token questions each) under one 10-token chat head,
    and a third, short request after the head."""
    trie = TokenTrie()
    chat = trie.add_path(trie.root(""), list(range(10)))
    for request in range(2):
        state = trie.add_path(chat[-1], [1000 * (request + 1) + i for i in range(300)])
        for question in range(4):
            trie.add_path(state[-1], [50 + question, 60, 70 + request])
    trie.add_path(chat[-1], [7, 8, 9])
    return trie


def test_plan_keeps_a_short_chain_in_the_branch_pass() -> None:
    trie = TokenTrie()
    head = trie.add_path(trie.root(""), [1, 2, 3])
    trie.add_path(head[-1], [4, 5])
    trie.add_path(head[-1], [6])
    passes = plan_passes(trie, min_chain_tokens=32, min_split_tokens=256)
    assert_valid_plan(trie, passes)
    assert [(step.chain, len(step.nodes)) for step in passes] == [(False, 6)]


def test_plan_splits_large_subtrees_into_their_own_passes() -> None:
    # Two requests with different 300-token states under one chat head, and a third, short one: the states never
    # share a dense mask; each state's questions ride one masked pass after it.
    trie = _two_states_trie()
    other_root = trie.add_path(trie.root("salted"), list(range(500, 540)))
    passes = plan_passes(trie, min_chain_tokens=32, min_split_tokens=256)
    assert_valid_plan(trie, passes)
    shapes = [(step.chain, len(step.nodes), len(step.past)) for step in passes]
    assert shapes == [
        (False, 13, 0),  # the short chat head with the short third request
        (True, 300, 10),  # first state
        (False, 12, 310),  # its four questions
        (True, 300, 10),  # second state
        (False, 12, 310),
        (True, 40, 0),  # the other salt's lone read
    ]
    assert passes[-1].nodes == tuple(other_root)


def test_plan_of_a_chain_is_one_causal_pass() -> None:
    trie = TokenTrie()
    trie.add_path(trie.root(""), list(range(5)))
    passes = plan_passes(trie, min_chain_tokens=32, min_split_tokens=256)
    assert [(step.chain, len(step.nodes)) for step in passes] == [(True, 5)]


def plan_by_nodes(trie: TokenTrie, min_chain_tokens: int, min_split_tokens: int) -> list[Pass]:
    """The planner as it walked the trie node by node (until 2026-12-07): the reference the run walk must equal."""
    children = trie.children()
    sizes = [1] * len(trie)
    for node in range(len(trie) - 1, -1, -1):
        if trie.parents[node] >= 0:
            sizes[trie.parents[node]] += sizes[node]
    passes: list[Pass] = []

    def subtree(top: int) -> list[int]:
        found, stack = [], [top]
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(children[node])
        return sorted(found)

    def plan(root: int, tops: list[int], past: tuple[int, ...]) -> None:
        chain: list[int] = []
        if len(tops) == 1:
            node = tops[0]
            chain.append(node)
            while len(children[node]) == 1:
                node = children[node][0]
                chain.append(node)
            tops = children[node]
        large = [top for top in tops if sizes[top] >= min_split_tokens]
        small = sorted(node for top in tops if sizes[top] < min_split_tokens for node in subtree(top))
        if chain and (len(chain) >= min_chain_tokens or not small):
            passes.append(Pass(root, tuple(chain), past, chain=True))
            if small:
                passes.append(Pass(root, tuple(small), past + tuple(chain), chain=False))
        elif chain or small:
            passes.append(Pass(root, tuple(sorted(chain + small)), past, chain=False))
        for top in large:
            plan(root, [top], past + tuple(chain))

    for root, tops in trie.top_nodes().items():
        plan(root, tops, ())
    return passes


@pytest.mark.parametrize("seed", range(12))
def test_the_plan_walked_by_runs_equals_the_plan_walked_by_nodes(seed: int) -> None:
    """`plan_passes` walks runs of nodes; on random batches (several salts and cached roots, states shared by several
    questions, paths that end inside others, label branches, and paths added out of order so that a node's only
    child is not the next node) it must plan exactly the passes the node-by-node walk planned."""
    generator = np.random.default_rng(seed)
    trie = TokenTrie()
    states = [generator.integers(0, 9, size=int(generator.integers(1, 400))).tolist() for _ in range(6)]
    roots = [trie.root("a"), trie.root("b"), trie.root(("cached", 3, 40), 40)]
    ends: list[int] = []
    for _ in range(int(generator.integers(5, 60))):
        root = roots[int(generator.integers(0, len(roots)))]
        if ends and generator.random() < 0.2:  # continue some earlier path (out of node order)
            nodes = trie.add_path(ends[int(generator.integers(0, len(ends)))], generator.integers(0, 9, 3).tolist())
        else:
            state = states[int(generator.integers(0, len(states)))]
            cut = int(generator.integers(0, len(state) + 1))
            tail = generator.integers(0, 9, size=int(generator.integers(0, 30))).tolist()
            nodes = trie.add_path(root, state[:cut] + tail)
        if nodes:
            ends.append(nodes[-1])
            for label in ([1], [2, 3], [2, 4]):
                trie.add_path(nodes[-1], label[:-1])
    for min_chain, min_split in ((32, 256), (1, 1), (5, 40), (1000, 100_000)):
        passes = plan_passes(trie, min_chain, min_split)
        assert passes == plan_by_nodes(trie, min_chain, min_split)
        assert_valid_plan(trie, passes)


def subset_ancestors_by_rows(trie: TokenTrie, nodes: list[int]) -> np.ndarray:
    """`subset_ancestor_matrix` as it was filled a row at a time (until 2026-12-07): the reference."""
    index = {node: i for i, node in enumerate(nodes)}
    allowed = np.zeros((len(nodes), len(nodes)), dtype=bool)
    for i, node in enumerate(nodes):
        parent = index.get(trie.parents[node], -1)
        if parent >= 0:
            allowed[i, : parent + 1] = allowed[parent, : parent + 1]
        allowed[i, i] = True
    return allowed


@pytest.mark.parametrize("seed", range(6))
def test_the_subset_ancestor_matrix_filled_by_runs_equals_the_one_filled_by_rows(seed: int) -> None:
    """On random tries and random ascending subsets (a pass's nodes, and subsets missing parents, first rows whose
    parent is outside, single nodes, the empty set), the run-at-a-time fill equals the row-at-a-time one."""
    generator = np.random.default_rng(seed)
    trie = TokenTrie()
    root = trie.root("")
    ends = [root]
    for _ in range(40):
        parent = ends[int(generator.integers(0, len(ends)))]
        nodes = trie.add_path(parent, generator.integers(0, 5, size=int(generator.integers(1, 12))).tolist())
        ends.extend(nodes[-1:] if generator.random() < 0.7 else nodes)
    for _ in range(20):
        size = int(generator.integers(0, len(trie) + 1))
        subset = sorted(generator.choice(len(trie), size=size, replace=False).tolist())
        got = trie.subset_ancestor_matrix(subset)
        assert got.shape == (size, size)
        assert (got == subset_ancestors_by_rows(trie, subset)).all()
    for step in plan_passes(trie, 4, 30):
        assert (trie.subset_ancestor_matrix(list(step.nodes)) == subset_ancestors_by_rows(trie, list(step.nodes))).all()
