"""Tree reads: every read of a batch in one forward pass over the batch's unique tokens.
Reads become paths in a trie (prompt, then multi-token label branches); the trie is packed into one sequence
where each token attends to itself and its ancestors only, at position = its depth, so each path computes
exactly what its own causal prefill would, while shared prefixes are computed once."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from decision_server.model import LoadedModel
from decision_server.reads.base import ReadStrategy
from decision_server.reads.scoring import argmax_rows, gather, log_probs
from decision_server.reads.types import BatchOutcome, ReadOutcome, ReadSpec

# Defaults sized for a CPU: the dense (T, T) mask and attention scores grow with T squared, and every logit row
# costs a full-vocabulary projection (600 kB in float32 for a 150k vocabulary).
DEFAULT_MAX_PACKED_TOKENS = 4096
DEFAULT_MAX_LOGIT_ROWS = 512


class TokenTrie:
    """Unique token paths laid out in insertion order, so a node's parent always precedes it.

    Each cache salt has its own root: reads with different salts never share a node, so one tenant's
    tokens_computed never reveals that another tenant sent the same prefix.
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []  # -1 for nodes directly under a root
        self.depths: list[int] = []
        self._children: dict[tuple[int, int], int] = {}
        self._roots: dict[str, int] = {}
        self._counted: list[bool] = []  # already counted in some read's tokens_computed

    def __len__(self) -> int:
        return len(self.tokens)

    def root(self, salt: str) -> int:
        # Roots are negative ids so they never collide with node indices in `_children` keys.
        if salt not in self._roots:
            self._roots[salt] = -1 - len(self._roots)
        return self._roots[salt]

    def child(self, parent: int, token: int) -> int | None:
        return self._children.get((parent, token))

    def add(self, parent: int, token: int) -> int:
        existing = self._children.get((parent, token))
        if existing is not None:
            return existing
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent if parent >= 0 else -1)
        self.depths.append(self.depths[parent] + 1 if parent >= 0 else 0)
        self._counted.append(False)
        self._children[(parent, token)] = node
        return node

    def add_path(self, parent: int, tokens: Sequence[int]) -> list[int]:
        nodes = []
        for token in tokens:
            parent = self.add(parent, token)
            nodes.append(parent)
        return nodes

    def claim(self, nodes: Sequence[int]) -> int:
        """Marks nodes as counted; returns how many were not counted before."""
        fresh = 0
        for node in nodes:
            if not self._counted[node]:
                self._counted[node] = True
                fresh += 1
        return fresh

    def missing_nodes(self, read: ReadSpec) -> int:
        """How many nodes inserting `read` would add, without inserting it."""
        virtual: dict[tuple[int, int], int] = {}
        next_virtual = [len(self.tokens)]

        def walk(parent: int, tokens: Sequence[int]) -> int:
            for token in tokens:
                found = self._children.get((parent, token))
                if found is None:
                    found = virtual.get((parent, token))
                if found is None:
                    found = next_virtual[0]
                    next_virtual[0] += 1
                    virtual[(parent, token)] = found
                parent = found
            return parent

        root = self._roots.get(read.cache_salt, -1 - len(self._roots))
        answer = walk(root, read.prompt)
        for label in read.labels:
            walk(answer, label[:-1])
        return next_virtual[0] - len(self.tokens)

    def is_chain(self) -> bool:
        """True when the trie is one path from one root: a plain causal prefill computes it exactly."""
        return len(self._roots) <= 1 and all(parent == index - 1 for index, parent in enumerate(self.parents))

    def ancestor_matrix(self, window: int | None = None) -> np.ndarray:
        """allowed[q, k]: node q may attend node k, i.e. k is q or one of its ancestors (within `window` positions)."""
        size = len(self.tokens)
        allowed = np.zeros((size, size), dtype=bool)
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                # Ancestors of a node all precede it, so the parent's row is complete up to the parent itself.
                allowed[node, : parent + 1] = allowed[parent, : parent + 1]
            allowed[node, node] = True
        if window is not None:
            depths = np.asarray(self.depths)
            # Same rule as transformers' sliding overlay (kv > q - window), in positions, which here are depths.
            allowed &= (depths[:, None] - depths[None, :]) < window
        return allowed


@dataclass
class _PlacedRead:
    read: ReadSpec
    answer_node: int
    # For each label, the nodes whose next-token distribution scores each of its tokens.
    label_nodes: list[list[int]]
    tokens_computed: int


class TreeReads(ReadStrategy):
    name = "tree"

    def __init__(
        self,
        model: LoadedModel,
        max_packed_tokens: int = DEFAULT_MAX_PACKED_TOKENS,
        max_logit_rows: int = DEFAULT_MAX_LOGIT_ROWS,
    ) -> None:
        super().__init__(model)
        if max_packed_tokens < 1 or max_logit_rows < 1:
            raise ValueError("tree read budgets must be positive")
        self.max_packed_tokens = max_packed_tokens
        self.max_logit_rows = max_logit_rows

    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        batch = BatchOutcome(outcomes=[])
        for chunk in self._chunks(reads):
            batch.outcomes.extend(self._run_chunk(chunk, batch))
        return batch

    def _chunks(self, reads: Sequence[ReadSpec]) -> list[list[ReadSpec]]:
        """Splits the batch, in request order, into groups whose packed tree fits the budgets.

        A read too large for the budget on its own still runs, alone. Reads that share a prefix are usually
        adjacent (the router sends a request's questions together), so greedy filling keeps most sharing.
        """
        chunks: list[list[ReadSpec]] = []
        current: list[ReadSpec] = []
        trie = TokenTrie()
        rows = 0
        for read in reads:
            read_rows = 1 + sum(len(label) - 1 for label in read.labels)
            added = trie.missing_nodes(read)
            if current and (len(trie) + added > self.max_packed_tokens or rows + read_rows > self.max_logit_rows):
                chunks.append(current)
                current, trie, rows = [], TokenTrie(), 0
            _place(trie, read)
            current.append(read)
            rows += read_rows
        if current:
            chunks.append(current)
        return chunks

    def _run_chunk(self, reads: Sequence[ReadSpec], batch: BatchOutcome) -> list[ReadOutcome]:
        trie = TokenTrie()
        placed = [_place(trie, read) for read in reads]
        query_nodes = sorted({p.answer_node for p in placed} | {n for p in placed for ns in p.label_nodes for n in ns})
        row_of = {node: row for row, node in enumerate(query_nodes)}

        started = time.perf_counter()
        if trie.is_chain():
            # One read with single-token labels (or labels sharing one branch): the plain causal prefill is exact
            # and lets attention use its fastest causal kernel.
            logits = self.model.next_token_logits(trie.tokens, query_nodes)
        else:
            logits = self.model.next_token_logits(
                trie.tokens, query_nodes, position_ids=trie.depths, attention_mask=self._mask(trie)
            )
        logprobs = log_probs(logits)
        greedy = argmax_rows(logprobs, [row_of[p.answer_node] for p in placed])
        rows: list[int] = []
        tokens: list[int] = []
        for p in placed:
            for label, nodes in zip(p.read.labels, p.label_nodes, strict=True):
                rows.extend(row_of[node] for node in nodes)
                tokens.extend(label)
        values = iter(gather(logprobs, rows, tokens))
        if logprobs.is_cuda:
            torch.cuda.synchronize(logprobs.device)
        batch.forward_seconds += time.perf_counter() - started
        batch.forward_passes += 1
        batch.packed_tokens += len(trie)

        outcomes = []
        for p, greedy_token in zip(placed, greedy, strict=True):
            label_logprobs = [sum(next(values) for _ in label) for label in p.read.labels]
            outcomes.append(
                ReadOutcome(
                    id=p.read.id,
                    label_logprobs=label_logprobs,
                    greedy_token_id=greedy_token,
                    tokens_computed=p.tokens_computed,
                )
            )
        return outcomes

    def _mask(self, trie: TokenTrie) -> torch.Tensor | dict[str, torch.Tensor]:
        full = self.model.tree_attention_mask(torch.from_numpy(trie.ancestor_matrix()))
        window = self.model.sliding_window()
        if window is None or max(trie.depths) < window:
            return full
        windowed = self.model.tree_attention_mask(torch.from_numpy(trie.ancestor_matrix(window)))
        layer_types = getattr(self.model.module.config.get_text_config(), "layer_types", None)
        if layer_types is None:
            # Sliding window without per-layer types (Mistral style): every layer slides.
            return windowed
        # Models with mixed layers pick their mask per layer type from a mapping (see Qwen3Model.forward).
        return {"full_attention": full, "sliding_attention": windowed}


def _place(trie: TokenTrie, read: ReadSpec) -> _PlacedRead:
    prompt_nodes = trie.add_path(trie.root(read.cache_salt), read.prompt)
    answer = prompt_nodes[-1]
    # Only prompt tokens are counted, the first time any read's prompt needs them; label branches are scoring work.
    computed = trie.claim(prompt_nodes)
    label_nodes = [[answer, *trie.add_path(answer, label[:-1])] for label in read.labels]
    return _PlacedRead(read=read, answer_node=answer, label_nodes=label_nodes, tokens_computed=computed)
