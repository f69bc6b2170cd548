"""The fork engine: each shared head of a batch is prefilled once with the model's state (cache), the state is copied
at every branch point, and each branch (question tail, multi-token label) runs from its own copy as a causal pass.

No pass relies on an attention mask, so this is exact for layers that ignore one (Qwen3.5's gated delta nets,
LFM2's short convolutions), whose recurrence a one-pass tree mask cannot split (the tree engine refuses them).
The batch is laid out in the tree engine's trie: a branch is a run of nodes between branch points, computed once."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from decision_server.engines.base import NextTokenEngine
from decision_server.engines.tree import NodeScores, PlacedRead, TokenTrie, place_read, read_outcomes
from decision_server.engines.types import BatchOutcome, ReadSpec
from decision_server.model_base import ModelState, ScoreRequest


@dataclass
class _Wanted:
    """The rows a batch reads: label tokens scored after each node, and the answer nodes (greedy token)."""

    labels: dict[int, list[int]] = field(default_factory=dict)
    answers: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, placed: Sequence[PlacedRead]) -> _Wanted:
        labels: dict[int, set[int]] = {}
        for p in placed:
            for label, nodes in zip(p.read.labels, p.label_nodes, strict=True):
                for node, token in zip(nodes, label, strict=True):
                    labels.setdefault(node, set()).add(token)
        return cls({node: sorted(tokens) for node, tokens in labels.items()}, {p.answer_node for p in placed})

    def __contains__(self, node: int) -> bool:
        return node in self.labels or node in self.answers


class ForkEngine(NextTokenEngine):
    name = "fork"

    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        batch = BatchOutcome(outcomes=[])
        trie = TokenTrie()
        # Counting as the tree engine does: a prompt token is counted on the first read that needs it.
        placed = [place_read(trie, read, None) for read in reads]
        wanted = _Wanted.of(placed)
        children = trie.children()
        scores = NodeScores()
        for tops in trie.top_nodes().values():
            # Each root (cache salt) starts from the empty state: salts never share computed tokens.
            self._run_tree(trie, children, tops, self.model.new_state(), wanted, scores, batch)
        batch.packed_tokens += len(trie)
        batch.outcomes = read_outcomes(placed, scores)
        return batch

    def _run_tree(
        self,
        trie: TokenTrie,
        children: list[list[int]],
        tops: list[int],
        state: ModelState,
        wanted: _Wanted,
        scores: NodeScores,
        batch: BatchOutcome,
    ) -> None:
        """Depth first: every branch but the last of a branch point runs on a copy of the point's state, the last on
        the state itself, so only one copy per branch point on the current path is alive at a time."""
        stack: list[tuple[int, ModelState, bool]] = [
            (top, state, index == len(tops) - 1) for index, top in reversed(list(enumerate(tops)))
        ]
        while stack:
            first, parent_state, owns_state = stack.pop()
            branch_state = parent_state if owns_state else parent_state.copy()
            chain = [first]
            while len(children[chain[-1]]) == 1:
                chain.append(children[chain[-1]][0])
            self._advance(trie, chain, branch_state, wanted, scores, batch)
            kids = children[chain[-1]]
            stack.extend((kid, branch_state, index == len(kids) - 1) for index, kid in reversed(list(enumerate(kids))))

    def _advance(
        self,
        trie: TokenTrie,
        chain: list[int],
        state: ModelState,
        wanted: _Wanted,
        scores: NodeScores,
        batch: BatchOutcome,
    ) -> None:
        """One causal pass over `chain` after `state`, reading the rows the batch wants among its nodes."""
        keep = [index for index, node in enumerate(chain) if node in wanted]
        # A head nobody reads still needs a row for the pass's LM head; the last one costs a single projection.
        keep = keep or [len(chain) - 1]
        label_rows: list[int] = []
        label_tokens: list[int] = []
        for row, index in enumerate(keep):
            for token in wanted.labels.get(chain[index], ()):
                label_rows.append(row)
                label_tokens.append(token)
        request = ScoreRequest(
            token_ids=[trie.tokens[node] for node in chain],
            keep=keep,
            label_rows=label_rows,
            label_tokens=label_tokens,
            greedy_rows=[row for row, index in enumerate(keep) if chain[index] in wanted.answers],
            # Positions are depths: explicit on every call, so no model infers them from state it kept (trap 2).
            position_ids=[trie.depths[node] for node in chain],
        )
        started = time.perf_counter()
        scored = self.model.continue_state(state, request)
        self.model.synchronize()
        batch.forward_seconds += time.perf_counter() - started
        batch.forward_passes += 1
        scores.merge(NodeScores.of(request, chain, scored))
