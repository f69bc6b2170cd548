"""Tree reads: every read of a batch in one forward pass over the batch's unique tokens.
Reads become paths in a trie (prompt, then multi-token label branches); the trie is packed into one sequence
where each token attends to itself and its ancestors only, at position = its depth, so each path computes
exactly what its own causal prefill would, while shared prefixes are computed once. With a prefix cache,
paths continue from cached keys/values of earlier batches instead of recomputing them."""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from decision_server.model import LoadedModel, ScoreRequest
from decision_server.prefix_cache import CachedPrefix, KeyValues, PrefixCache, Segment
from decision_server.reads.base import ReadStrategy
from decision_server.reads.types import BatchOutcome, ReadOutcome, ReadSpec

# Defaults sized for a CPU: the dense (T, T) mask and attention scores grow with T squared, and every logit row
# costs a full-vocabulary projection (600 kB in float32 for a 150k vocabulary).
DEFAULT_MAX_PACKED_TOKENS = 4096
DEFAULT_MAX_LOGIT_ROWS = 512


class TokenTrie:
    """Unique token paths laid out in insertion order, so a node's parent always precedes it.

    Paths start from roots: one per cache salt (reads with different salts never share a node, so one tenant's
    tokens_computed never reveals that another sent the same prefix), or one per cached prefix they continue.
    A root's `start` is the position of its first token (the cached prefix length).
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []  # -1 for nodes directly under a root
        self.depths: list[int] = []  # absolute positions
        self.root_of: list[int] = []  # index of the node's root in `root_keys`
        self.root_keys: list[Hashable] = []
        self._root_ids: dict[Hashable, int] = {}
        self._root_starts: list[int] = []
        self._children: dict[tuple[int, int], int] = {}
        self._counted: list[bool] = []  # already counted in some read's tokens_computed

    def __len__(self) -> int:
        return len(self.tokens)

    def root(self, key: Hashable, start: int = 0) -> int:
        # Roots are negative ids so they never collide with node indices in `_children` keys.
        if key not in self._root_ids:
            self._root_ids[key] = len(self.root_keys)
            self.root_keys.append(key)
            self._root_starts.append(start)
        return -1 - self._root_ids[key]

    def add(self, parent: int, token: int) -> int:
        existing = self._children.get((parent, token))
        if existing is not None:
            return existing
        node = len(self.tokens)
        self.tokens.append(token)
        if parent >= 0:
            self.parents.append(parent)
            self.depths.append(self.depths[parent] + 1)
            self.root_of.append(self.root_of[parent])
        else:
            root = -1 - parent
            self.parents.append(-1)
            self.depths.append(self._root_starts[root])
            self.root_of.append(root)
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
        """How many nodes inserting `read` (from its salt's root) would add, without inserting it."""
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

        key = _salt_root(read.cache_salt)
        root = -1 - self._root_ids[key] if key in self._root_ids else -1 - len(self.root_keys)
        answer = walk(root, read.prompt)
        for label in read.labels:
            walk(answer, label[:-1])
        return next_virtual[0] - len(self.tokens)

    def is_chain(self) -> bool:
        """True when the trie is one path from one root at position 0: a plain causal prefill computes it."""
        return (
            len(self.root_keys) <= 1
            and all(start == 0 for start in self._root_starts)
            and all(parent == index - 1 for index, parent in enumerate(self.parents))
        )

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


def _salt_root(salt: str) -> Hashable:
    return (salt, -1, 0)  # the same key as an empty CachedPrefix, so "no cache hit" shares one root per salt


@dataclass
class _PlacedRead:
    read: ReadSpec
    prefix_length: int  # prompt tokens served from the cache
    prompt_nodes: list[int]  # nodes of prompt[prefix_length:]
    answer_node: int
    # For each label, the nodes whose next-token distribution scores each of its tokens.
    label_nodes: list[list[int]]
    tokens_computed: int
    tokens_cached: int = 0


class _PastLayout:
    """Cached segments used by a chunk, laid out one after another as the forward pass's past keys/values."""

    def __init__(self, prefixes: Sequence[CachedPrefix]) -> None:
        self.used: dict[int, tuple[Segment, int]] = {}
        for prefix in prefixes:
            for segment, used in prefix.pieces:
                _, known = self.used.get(segment.uid, (segment, 0))
                self.used[segment.uid] = (segment, max(known, used))
        self.offsets: dict[int, int] = {}
        total = 0
        for uid, (_, used) in self.used.items():
            self.offsets[uid] = total
            total += used
        self.length = total

    def positions(self, prefix: CachedPrefix) -> list[int]:
        return [self.offsets[s.uid] + i for s, used in prefix.pieces for i in range(used)]

    def key_values(self) -> KeyValues | None:
        if not self.used:
            return None
        pieces = [(segment, used) for segment, used in self.used.values()]
        keys = torch.cat([_present(segment.keys)[:, :, :used] for segment, used in pieces], dim=2)
        values = torch.cat([_present(segment.values)[:, :, :used] for segment, used in pieces], dim=2)
        return keys, values


def _present(tensor: torch.Tensor | None) -> torch.Tensor:
    if tensor is None:
        raise RuntimeError("a cached segment lost its keys/values while in use")
    return tensor


class TreeReads(ReadStrategy):
    name = "tree"

    def __init__(
        self,
        model: LoadedModel,
        max_packed_tokens: int = DEFAULT_MAX_PACKED_TOKENS,
        max_logit_rows: int = DEFAULT_MAX_LOGIT_ROWS,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        super().__init__(model)
        if max_packed_tokens < 1 or max_logit_rows < 1:
            raise ValueError("tree read budgets must be positive")
        if prefix_cache is not None and (reason := model.supports_prefix_cache()) is not None:
            raise ValueError(f"prefix cache unavailable for {model.architecture}: {reason}")
        self.max_packed_tokens = max_packed_tokens
        self.max_logit_rows = max_logit_rows
        self.prefix_cache = prefix_cache

    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        batch = BatchOutcome(outcomes=[])
        for chunk in self._chunks(reads):
            batch.outcomes.extend(self._run_chunk(chunk, batch))
        return batch

    def _chunks(self, reads: Sequence[ReadSpec]) -> list[list[ReadSpec]]:
        """Splits the batch, in request order, into groups whose packed tree fits the budgets.

        A read too large for the budget on its own still runs, alone. Reads that share a prefix are usually
        adjacent (the router sends a request's questions together), so greedy filling keeps most sharing.
        Budgets count tokens as if nothing were cached, so cache hits only ever make a pass smaller.
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
            _place(trie, read, None)
            current.append(read)
            rows += read_rows
        if current:
            chunks.append(current)
        return chunks

    def _cached_prefix(self, read: ReadSpec) -> CachedPrefix | None:
        if self.prefix_cache is None:
            return None
        # The answer position's own token is always computed: its hidden state gives the next-token logits.
        return self.prefix_cache.match(read.cache_salt, read.prompt[:-1])

    def _run_chunk(self, reads: Sequence[ReadSpec], batch: BatchOutcome) -> list[ReadOutcome]:
        prefixes = [self._cached_prefix(read) for read in reads]
        past = _PastLayout([prefix for prefix in prefixes if prefix is not None])
        trie = TokenTrie()
        placed = [_place(trie, read, prefix) for read, prefix in zip(reads, prefixes, strict=True)]
        claimed_past: set[int] = set()
        for p, prefix in zip(placed, prefixes, strict=True):
            if prefix is not None:
                positions = set(past.positions(prefix))
                p.tokens_cached = len(positions - claimed_past)
                claimed_past |= positions
        query_nodes = sorted({p.answer_node for p in placed} | {n for p in placed for ns in p.label_nodes for n in ns})
        row_of = {node: row for row, node in enumerate(query_nodes)}

        rows: list[int] = []
        tokens: list[int] = []
        for p in placed:
            for label, nodes in zip(p.read.labels, p.label_nodes, strict=True):
                rows.extend(row_of[node] for node in nodes)
                tokens.extend(label)
        request = ScoreRequest(
            token_ids=trie.tokens,
            keep=query_nodes,
            label_rows=rows,
            label_tokens=tokens,
            greedy_rows=[row_of[p.answer_node] for p in placed],
        )
        started = time.perf_counter()
        if self.prefix_cache is not None:
            request = replace(
                request,
                position_ids=trie.depths,
                attention_mask=self._mask_with_past(trie, past, prefixes),
                past=past.key_values(),
                return_key_values=True,
            )
        elif not trie.is_chain():
            request = replace(request, position_ids=trie.depths, attention_mask=self._mask(trie))
        # else: one read with single-token labels (or labels sharing one branch): the plain causal prefill is exact
        # and lets attention use its fastest causal kernel.
        scored = self.model.score(request)
        greedy = scored.greedy_tokens
        values = iter(scored.label_logprobs)
        batch.forward_seconds += time.perf_counter() - started
        batch.forward_passes += 1
        batch.packed_tokens += len(trie)

        if self.prefix_cache is not None and scored.keys is not None and scored.values is not None:
            self._remember(placed, scored.keys, scored.values)

        outcomes = []
        for p, greedy_token in zip(placed, greedy, strict=True):
            label_logprobs = [sum(next(values) for _ in label) for label in p.read.labels]
            outcomes.append(
                ReadOutcome(
                    id=p.read.id,
                    label_logprobs=label_logprobs,
                    greedy_token_id=greedy_token,
                    tokens_computed=p.tokens_computed,
                    tokens_cached=p.tokens_cached,
                )
            )
        return outcomes

    def _mask(self, trie: TokenTrie) -> torch.Tensor | dict[str, torch.Tensor]:
        full = self.model.tree_attention_mask(torch.from_numpy(trie.ancestor_matrix()))
        window = self.model.sliding_window()
        if window is None or max(trie.depths) < window:
            return full
        windowed = self.model.tree_attention_mask(torch.from_numpy(trie.ancestor_matrix(window)))
        layer_types = self.model.layer_types()
        if layer_types is None:
            # Sliding window without per-layer types (Mistral style): every layer slides.
            return windowed
        # Models with mixed layers pick their mask per layer type from a mapping (see Qwen3Model.forward).
        return {"full_attention": full, "sliding_attention": windowed}

    def _mask_with_past(
        self, trie: TokenTrie, past: _PastLayout, prefixes: Sequence[CachedPrefix | None]
    ) -> torch.Tensor | None:
        if past.length == 0 and trie.is_chain():
            return None
        tree = trie.ancestor_matrix()
        # Each node sees the cached tokens of the prefix its root continues, and nothing of other prefixes.
        by_root = np.zeros((len(trie.root_keys), past.length), dtype=bool)
        root_index = {key: index for index, key in enumerate(trie.root_keys)}
        for prefix in prefixes:
            if prefix is not None and prefix.key in root_index:
                by_root[root_index[prefix.key], past.positions(prefix)] = True
        allowed = np.concatenate([by_root[np.asarray(trie.root_of, dtype=np.int64)], tree], axis=1)
        return self.model.tree_attention_mask(torch.from_numpy(allowed))

    def _remember(self, placed: Sequence[_PlacedRead], keys: torch.Tensor, values: torch.Tensor) -> None:
        cache = self.prefix_cache
        assert cache is not None
        for p in placed:

            def provide(start: int, p: _PlacedRead = p) -> KeyValues | None:
                if start < p.prefix_length:
                    return None  # part of what this read continued from was evicted meanwhile
                nodes = torch.tensor(p.prompt_nodes[start - p.prefix_length :], dtype=torch.long, device=keys.device)
                return keys.index_select(2, nodes), values.index_select(2, nodes)

            cache.insert(p.read.cache_salt, p.read.prompt, provide)


def _place(trie: TokenTrie, read: ReadSpec, prefix: CachedPrefix | None) -> _PlacedRead:
    if prefix is None:
        root, skip = trie.root(_salt_root(read.cache_salt)), 0
    else:
        root, skip = trie.root(prefix.key, prefix.length), prefix.length
    prompt_nodes = trie.add_path(root, read.prompt[skip:])
    answer = prompt_nodes[-1]
    # Only prompt tokens are counted, the first time any read's prompt needs them; label branches are scoring work.
    computed = trie.claim(prompt_nodes)
    label_nodes = [[answer, *trie.add_path(answer, label[:-1])] for label in read.labels]
    return _PlacedRead(
        read=read,
        prefix_length=skip,
        prompt_nodes=prompt_nodes,
        answer_node=answer,
        label_nodes=label_nodes,
        tokens_computed=computed,
    )
