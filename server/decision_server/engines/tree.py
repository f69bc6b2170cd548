"""The tree engine: every read of a batch in one forward pass over the batch's unique tokens.
Reads become paths in a trie (prompt, then multi-token label branches); the trie is packed into one sequence
where each token attends to itself and its ancestors only, at position = its depth, so each path computes
exactly what its own causal prefill would, while shared prefixes are computed once. With a prefix cache,
paths continue from cached keys/values of earlier batches instead of recomputing them. It is exact only when every
layer applies the mask (attention); models with recurrent or convolution layers use the fork engine instead.

The trie is planned into runs (see `plan_passes`): a long shared chain (chat head + state) is a causal run, and the
short branches hanging off it (questions, multi-token labels) one masked run that sees the chain whole; large
independent subtrees (other requests' states) are planned apart, so no run ever spans unrelated requests. Where the
model packs segments (`LoadedModel.packs_segments`: the shard's own decoder, on every device) the runs are segments
of ONE forward pass (`segments.SegmentLayout`): the whole batch reads the weights once per layer, and attention is
computed run by run. Elsewhere (transformers' modeling takes one dense mask, which would compute every product
between requests) each run is a forward pass of its own, after the passes holding its ancestors."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter

import numpy as np
import torch

from decision_server.architectures import EngineRefusedError, tree_refusal
from decision_server.engines.base import NextTokenEngine
from decision_server.engines.types import BatchOutcome, ReadOutcome, ReadSpec, Started
from decision_server.model_base import LaunchedPass, LoadedModel, ScoredPass, ScoreRequest
from decision_server.prefix_cache import CachedPrefix, KeyValues, PrefixCache, Segment
from decision_server.segments import NEW, PAST, AttentionSegment, SegmentLayout, causal_rows, ranges
from decision_server.sequences import common_prefix
from decision_server.transfer import to_device

# Unique prompt tokens of one chunk (the router's default batch, `--max-batch-prefill-tokens`, so a batch is one
# chunk; the shard passes its device's budget, `batch_budget.py`). Models that take a dense (T, T) mask (those that
# do not pack segments) pay for it quadratically, and compute every kept row's full-vocabulary logits at once (600 kB
# in float32 for a 150k vocabulary): DEFAULT_MAX_LOGIT_ROWS rows a chunk for them.
DEFAULT_MAX_PACKED_TOKENS = 8192
DEFAULT_MAX_LOGIT_ROWS = 512
# A shared chain at least this long gets a causal pass of its own (shorter ones ride the branches' masked pass:
# one more pass costs a full walk over the layers).
DEFAULT_MIN_CHAIN_TOKENS = 32
# A subtree at least this large (another state, a very long question) is planned apart from its small siblings.
DEFAULT_MIN_SPLIT_TOKENS = 256
# Token ids are below 2**32 (the wire's uint32): an edge key is its parent shifted past them, or'ed with its token.
EDGE_SHIFT = 32


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
        # Edges by `_edge(parent, token)`: a dict of ints only is one the garbage collector never walks (with tuple
        # keys each collection during a batch walked its 40,000+ entries).
        self._children: dict[int, int] = {}
        self._counted = bytearray()  # 1: already counted in some read's tokens_computed
        # The last path added under each root, and its nodes: the reads of a request follow each other and share
        # their state, so the next path's common prefix with it is found by slice comparisons (`common_prefix`),
        # not one dictionary lookup per token.
        # With the path, how much of it the trie held before: the next read of the request likely shares as much
        # with it (the state), `common_prefix`'s first guess.
        self._last_paths: dict[int, tuple[tuple[int, ...], tuple[int, ...], int]] = {}

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
        existing = self._children.get(_edge(parent, token))
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
        self._counted.append(0)
        self._children[_edge(parent, token)] = node
        return node

    def add_path(self, parent: int, tokens: Sequence[int]) -> list[int]:
        """The nodes of `tokens` under `parent`, the ones not in the trie yet added.

        A batch of 64 requests x 8 questions over 512-token states is about 270,000 prompt tokens; one `add` per
        token cost about 0.5 s of host work per batch (bench/results/2026-12-07-host/), more than an H200's forward
        of it. Here the prefix shared with the root's last path is taken whole, the rest is walked only until the
        first token not in the trie, and everything after that (new, so none of it can be there) is appended in
        bulk (`_extend`)."""
        path = tuple(tokens)
        nodes = self._existing(parent, path)
        held = len(nodes)
        nodes.extend(self._extend(nodes[-1] if nodes else parent, path[held:]))
        if parent < 0:
            self._last_paths[parent] = (path, tuple(nodes), held)
        return nodes

    def _existing(self, parent: int, path: tuple[int, ...]) -> list[int]:
        """The nodes of the longest prefix of `path` under `parent` that the trie already holds."""
        nodes: list[int] = []
        at = parent
        last = self._last_paths.get(parent) if parent < 0 else None
        if last is not None:
            shared = common_prefix(path, last[0], last[2])
            if shared:
                nodes = list(last[1][:shared])
                at = nodes[-1]
        children = self._children
        for token in path[len(nodes) :]:
            found = children.get(_edge(at, token))
            if found is None:
                break
            nodes.append(found)
            at = found
        return nodes

    def _extend(self, parent: int, tokens: tuple[int, ...]) -> range:
        """Appends `tokens` as a new chain under `parent` (none of its edges may exist): `add` per token, in bulk."""
        count = len(tokens)
        first = len(self.tokens)
        if not count:
            return range(first, first)
        if parent >= 0:
            depth, root = self.depths[parent] + 1, self.root_of[parent]
        else:
            root = -1 - parent
            depth = self._root_starts[root]
        nodes = range(first, first + count)
        self.tokens.extend(tokens)
        self.parents.append(max(parent, -1))
        self.parents.extend(range(first, first + count - 1))
        self.depths.extend(range(depth, depth + count))
        self.root_of.extend([root] * count)
        self._counted.extend(bytes(count))
        if count > 64:  # a state: the edges' keys in array steps
            parents = np.arange(first - 1, first + count - 1, dtype=np.int64)
            parents[0] = parent
            keys = ((parents << EDGE_SHIFT) | np.asarray(tokens, dtype=np.int64)).tolist()
        else:  # a question or a label: cheaper without numpy's fixed cost per call
            keys = [_edge(at, token) for at, token in zip((parent, *nodes[:-1]), tokens, strict=True)]
        self._children.update(zip(keys, nodes, strict=True))
        return nodes

    def claim(self, nodes: Sequence[int]) -> int:
        """Marks `nodes`, a path down from a root, as counted; returns how many were not counted before.

        Only such paths are ever claimed, so the counted nodes of any path down from a root are a prefix of it
        (a counted node's ancestors are counted): the first one not counted is found by binary search, and only
        the nodes after it are visited."""
        counted = self._counted
        low, high = 0, len(nodes)  # counted[nodes[:low]] all True; nodes[high:] none counted
        while low < high:
            middle = (low + high) // 2
            if counted[nodes[middle]]:
                low = middle + 1
            else:
                high = middle
        for node in nodes[low:]:
            counted[node] = 1
        return len(nodes) - low

    def missing_nodes(self, read: ReadSpec, labels: bool = True) -> int:
        """How many nodes inserting `read` (from its salt's root) would add, without inserting it (its prompt's
        only, without `labels`)."""
        key = _salt_root(read.cache_salt)
        prompt = tuple(read.prompt)
        held = self._existing(-1 - self._root_ids[key], prompt) if key in self._root_ids else []
        missing = len(prompt) - len(held)
        if not labels:
            return missing
        # A label's nodes below the answer are new from its first token not held on; labels sharing a prefix share
        # its new nodes (one per distinct prefix).
        answer = held[-1] if held and not missing else None
        new_prefixes: set[tuple[int, ...]] = set()
        for label in read.labels:
            at = answer
            for end in range(1, len(label)):
                if at is not None:
                    at = self._children.get(_edge(at, label[end - 1]))
                    if at is not None:
                        continue
                new_prefixes.add(tuple(label[:end]))
        return missing + len(new_prefixes)

    def is_chain(self) -> bool:
        """True when the trie is one path from one root at position 0: a plain causal prefill computes it."""
        return (
            len(self.root_keys) <= 1
            and all(start == 0 for start in self._root_starts)
            and all(parent == index - 1 for index, parent in enumerate(self.parents))
        )

    def children(self) -> list[list[int]]:
        """Each node's children, in insertion order."""
        children: list[list[int]] = [[] for _ in self.tokens]
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                children[parent].append(node)
        return children

    def top_nodes(self) -> dict[int, list[int]]:
        """The nodes directly under each root, by root index."""
        tops: dict[int, list[int]] = {}
        for node, parent in enumerate(self.parents):
            if parent < 0:
                tops.setdefault(self.root_of[node], []).append(node)
        return tops

    def subset_ancestor_matrix(self, nodes: Sequence[int]) -> np.ndarray:
        """allowed[i, j]: nodes[i] may attend nodes[j], for ascending `nodes` (ancestors outside the subset are
        the pass's past and not part of this matrix). Filled a run at a time (rows each the child of the row
        before: a question, a label), not a row at a time."""
        count = len(nodes)
        at = np.asarray(nodes, dtype=np.int64)
        parents = np.asarray(_gather(self.parents, nodes), dtype=np.int64)
        # Each node's parent as a row of the subset, or -1 where the parent is outside it (in the pass's past).
        rows = np.searchsorted(at, parents)
        inside = (rows < count) & (at[np.minimum(rows, count - 1)] == parents)
        parent_rows = np.where(inside, rows, -1)
        allowed = np.zeros((count, count), dtype=bool)
        starts = np.flatnonzero(parent_rows != np.arange(count) - 1).tolist()
        if count and (not starts or starts[0]):
            starts.insert(0, 0)  # the first row starts a run even where its parent is outside (its -1 reads as a chain)
        for start, end in zip(starts, [*starts[1:], count], strict=True):
            parent = int(parent_rows[start])
            if parent >= 0:  # every row of the run sees what its first row's parent sees
                allowed[start:end, : parent + 1] = allowed[parent, : parent + 1]
            allowed[start:end, start:end] = causal_rows(end - start)
        return allowed

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


def _gather(values: list[int], nodes: Sequence[int]) -> list[int]:
    """`[values[node] for node in nodes]`, in C."""
    if len(nodes) < 2:
        return [values[node] for node in nodes]
    return list(itemgetter(*nodes)(values))


def _edge(parent: int, token: int) -> int:
    """The key of the edge `token` under `parent` (a node, or a root's negative id): one int, unique per pair."""
    return (parent << EDGE_SHIFT) | token


def _salt_root(salt: str) -> Hashable:
    return (salt, -1, 0)  # the same key as an empty CachedPrefix, so "no cache hit" shares one root per salt


@dataclass(frozen=True)
class Pass:
    """One forward pass of a plan: `nodes` (ascending) attend to all of `past` (their common ancestors, computed
    by earlier passes) and, among themselves, to their ancestors; `chain` passes are a plain causal run."""

    root: int
    nodes: tuple[int, ...]
    past: tuple[int, ...]
    chain: bool


def plan_passes(trie: TokenTrie, min_chain_tokens: int, min_split_tokens: int) -> list[Pass]:
    """Orders the trie's nodes into passes: every node after all of its ancestors, each pass either a causal
    chain or a masked set of small branches over a fully visible past.

    Under a root (or the end of a chain), the shared chain is followed while each node has one child; then the
    subtrees hanging off its end are split: small ones share one masked pass, large ones are planned on their own
    with the chain as their past.

    The walk goes over runs, not nodes (`_Runs`): a batch of 64 requests over 512-token states is 40,000+ nodes but
    about a thousand runs, and a Python step per node was 10 ms of its host work (bench/results/2026-12-07-plan/).
    """
    runs = _Runs.of(trie)
    passes: list[Pass] = []

    def plan(root: int, tops: list[int], past: tuple[int, ...]) -> None:
        chain: list[int] = []  # runs
        if len(tops) == 1:
            run = tops[0]
            chain.append(run)
            while len(runs.children[run]) == 1:
                run = runs.children[run][0]
                chain.append(run)
            tops = runs.children[run]
        large = [top for top in tops if runs.sizes[top] >= min_split_tokens]
        small = runs.nodes([run for top in tops if runs.sizes[top] < min_split_tokens for run in runs.subtree(top)])
        small.sort()
        chain_nodes = runs.nodes(chain)
        if chain and (len(chain_nodes) >= min_chain_tokens or not small):
            passes.append(Pass(root, tuple(chain_nodes), past, chain=True))
            if small:
                passes.append(Pass(root, tuple(small), past + tuple(chain_nodes), chain=False))
        elif chain or small:
            passes.append(Pass(root, tuple(sorted(chain_nodes + small)), past, chain=False))
        for top in large:
            plan(root, [top], past + tuple(chain_nodes))

    for root, tops in runs.tops.items():
        plan(root, tops, ())
    return passes


@dataclass(frozen=True)
class _Runs:
    """A trie's nodes as runs: maximal stretches of consecutive nodes where each is its predecessor's only child
    (a state, a question: `TokenTrie._extend` appends a new path's nodes in order). A run starts under a root or under
    the last node of another run, since a node with any other child ends its run.

    `starts`/`ends`: node ranges [start, end) per run; `children`: the runs under each run's last node, in node order;
    `sizes`: nodes in each run's subtree; `tops`: the runs directly under each root, by root index."""

    starts: list[int]
    ends: list[int]
    children: list[list[int]]
    sizes: list[int]
    tops: dict[int, list[int]]

    @classmethod
    def of(cls, trie: TokenTrie) -> _Runs:
        count = len(trie)
        parents = np.asarray(trie.parents, dtype=np.int64)
        under = parents >= 0
        child_counts = np.bincount(parents[under], minlength=count)
        continues = np.zeros(count, dtype=bool)
        continues[1:] = (parents[1:] == np.arange(count - 1)) & (child_counts[:-1] == 1)
        first = np.flatnonzero(~continues)
        run_of = np.cumsum(~continues) - 1
        starts = first.tolist()
        ends = [*starts[1:], count]
        start_parents = parents[first]
        parent_runs = np.where(start_parents >= 0, run_of[np.maximum(start_parents, 0)], -1).tolist()
        roots = np.asarray(trie.root_of, dtype=np.int64)[first].tolist()
        children: list[list[int]] = [[] for _ in starts]
        tops: dict[int, list[int]] = {}
        for run, parent in enumerate(parent_runs):
            if parent >= 0:
                children[parent].append(run)
            else:
                tops.setdefault(roots[run], []).append(run)
        sizes = [end - start for start, end in zip(starts, ends, strict=True)]
        for run in range(len(starts) - 1, -1, -1):  # a run's parent run comes before it
            if parent_runs[run] >= 0:
                sizes[parent_runs[run]] += sizes[run]
        return cls(starts, ends, children, sizes, tops)

    def subtree(self, top: int) -> list[int]:
        found, stack = [], [top]
        while stack:
            run = stack.pop()
            found.append(run)
            stack.extend(self.children[run])
        return found

    def nodes(self, runs: Sequence[int]) -> list[int]:
        """The nodes of `runs`, run after run."""
        found: list[int] = []
        for run in runs:
            found.extend(range(self.starts[run], self.ends[run]))
        return found


@dataclass
class PlacedRead:
    """Where one read's prompt and label branches sit in a batch's trie."""

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

    def positions(self, prefix: CachedPrefix) -> np.ndarray:
        """The past positions of `prefix`'s tokens, in order (each piece a run, not a Python step per token)."""
        runs = [np.arange(self.offsets[s.uid], self.offsets[s.uid] + used) for s, used in prefix.pieces]
        return np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)

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


class _NodeKeyValues:
    """Keys/values computed by the passes of one chunk, looked up by trie node: per node its part and its index in
    that part, in arrays (a Python step and a tuple per node was 8 ms of a 64 x 8 x 512 batch's host work)."""

    def __init__(self, nodes: int) -> None:
        self._parts: list[KeyValues] = []
        self._part = np.full(nodes, -1, dtype=np.int64)
        self._index = np.zeros(nodes, dtype=np.int64)

    @classmethod
    def whole(cls, keys: torch.Tensor, values: torch.Tensor) -> _NodeKeyValues:
        """The keys/values of a single pass over every node, in node order."""
        stored = cls(keys.shape[2])
        stored.add(range(keys.shape[2]), keys, values)
        return stored

    def add(self, nodes: Sequence[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        at = np.asarray(nodes, dtype=np.int64)
        self._part[at] = len(self._parts)
        self._index[at] = np.arange(len(at))
        self._parts.append((keys, values))

    def select(self, nodes: Sequence[int]) -> KeyValues | None:
        """(layers, kv_heads, len(nodes), head_dim) keys and values of `nodes`, in that order; None for none."""
        if not len(nodes):
            return None
        at = np.asarray(nodes, dtype=np.int64)
        parts, indices = self._part[at], self._index[at]
        if (parts < 0).any():
            raise KeyError(f"no keys/values computed for node {int(at[np.argmax(parts < 0)])}")
        # Runs of nodes from one part; a run at consecutive indices is a view, any other a gather.
        cuts = (np.flatnonzero(parts[1:] != parts[:-1]) + 1).tolist()
        keys, values = [], []
        for low, high in zip([0, *cuts], [*cuts, len(at)], strict=True):
            part_keys, part_values = self._parts[int(parts[low])]
            run = indices[low:high]
            first = int(run[0])
            if int(run[-1]) - first == high - low - 1 and bool((np.diff(run) == 1).all()):
                keys.append(part_keys[:, :, first : first + high - low])
                values.append(part_values[:, :, first : first + high - low])
            else:
                gather = to_device(run, part_keys.device, torch.long)
                keys.append(part_keys.index_select(2, gather))
                values.append(part_values.index_select(2, gather))
        if len(keys) == 1:
            return keys[0], values[0]
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)


def _concat_past(first: KeyValues | None, second: KeyValues | None) -> KeyValues | None:
    if first is None or second is None:
        return first if second is None else second
    return torch.cat((first[0], second[0]), dim=2), torch.cat((first[1], second[1]), dim=2)


@dataclass
class NodeScores:
    """Label log-probabilities by (node, label token) and greedy tokens by answer node, over a chunk's passes."""

    label: dict[tuple[int, int], float] = field(default_factory=dict)
    greedy: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, request: ScoreRequest, nodes: Sequence[int], scored: ScoredPass) -> NodeScores:
        kept = [nodes[index] for index in request.keep]
        label = {
            (kept[row], token): value
            for row, token, value in zip(request.label_rows, request.label_tokens, scored.label_logprobs, strict=True)
        }
        greedy = {kept[row]: token for row, token in zip(request.greedy_rows, scored.greedy_tokens, strict=True)}
        return cls(label, greedy)

    def merge(self, other: NodeScores) -> None:
        self.label.update(other.label)
        self.greedy.update(other.greedy)


class TreeEngine(NextTokenEngine):
    name = "tree"

    def __init__(
        self,
        model: LoadedModel,
        max_packed_tokens: int = DEFAULT_MAX_PACKED_TOKENS,
        max_logit_rows: int | None = None,
        prefix_cache: PrefixCache | None = None,
        min_chain_tokens: int = DEFAULT_MIN_CHAIN_TOKENS,
        min_split_tokens: int = DEFAULT_MIN_SPLIT_TOKENS,
    ) -> None:
        super().__init__(model)
        if (reason := tree_refusal(model.text_config)) is not None:
            # Never silently wrong: a masked pass over such layers mixes the questions of a batch.
            raise EngineRefusedError(f"tree reads cannot serve {model.architecture}: {reason}")
        if max_logit_rows is None:
            # A model that packs segments computes its logits in pieces of rows (`DecoderModel._scores_in_pieces`).
            max_logit_rows = max_packed_tokens if self.capabilities.packs_segments else DEFAULT_MAX_LOGIT_ROWS
        if max_packed_tokens < 1 or max_logit_rows < 1:
            raise ValueError("tree read budgets must be positive")
        if prefix_cache is not None and (reason := self.capabilities.prefix_cache_refusal) is not None:
            raise ValueError(f"prefix cache unavailable for {model.architecture}: {reason}")
        self.max_packed_tokens = max_packed_tokens
        self.max_logit_rows = max_logit_rows
        self.prefix_cache = prefix_cache
        self.min_chain_tokens = min_chain_tokens
        self.min_split_tokens = min_split_tokens

    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        return self._start_valid(reads).finish()

    def _start_valid(self, reads: Sequence[ReadSpec]) -> Started[BatchOutcome]:
        """Each chunk planned, launched and cached in turn (a chunk's prefixes match what the chunks before it
        cached); the scores of all of them collected in `finish`."""
        batch = BatchOutcome(outcomes=[])
        chunks = [self._start_chunk(chunk, batch) for chunk in self._chunks(reads)]

        def finish() -> BatchOutcome:
            for chunk in chunks:
                batch.outcomes.extend(chunk.finish())
            return batch

        return Started(finish, in_flight=any(chunk.in_flight for chunk in chunks))

    def _chunks(self, reads: Sequence[ReadSpec]) -> list[list[ReadSpec]]:
        """Splits the batch, in request order, into groups whose packed tree fits the budgets: `max_packed_tokens`
        unique prompt tokens (label branches ride along, bounded by `max_logit_rows`). A batch the router formed
        under the same token budget is one chunk, and with a model that packs segments one forward pass.

        A read too large for the budget on its own still runs, alone. Reads that share a prefix are usually
        adjacent (the router sends a request's questions together), so greedy filling keeps most sharing.
        Budgets count tokens as if nothing were cached, so cache hits only ever make a pass smaller.

        For a model that runs passes one after another (no segments), with a prefix cache, a chunk also holds at
        most one new state: a read whose prompt is mostly new and adds `min_split_tokens` or more (another
        request's state, not one more question about the same state). Such subtrees get passes of their own anyway
        (`plan_passes`); packed together they share no work, and every pass keeps its keys/values for the cache
        until the chunk ends, so more of them are alive at once (measured on a 2-core Intel, Qwen3-0.6B shape: four
        540-token states in one chunk computed 199 tokens/s, one per chunk 218, bench/results/2026-12-02-c16).
        """
        one_state = self.prefix_cache is not None and not self.capabilities.packs_segments
        if not one_state and self._fits_one_chunk(reads):
            return [list(reads)]
        chunks: list[list[ReadSpec]] = []
        current: list[ReadSpec] = []
        trie = TokenTrie()
        prompt_tokens = rows = 0
        holds_state = False
        for read in reads:
            read_rows = 1 + sum(len(label) - 1 for label in read.labels)
            added = trie.missing_nodes(read, labels=False)
            new_state = one_state and added >= self.min_split_tokens and 2 * added > len(read.prompt)
            if current and (
                prompt_tokens + added > self.max_packed_tokens
                or rows + read_rows > self.max_logit_rows
                or (new_state and holds_state)
            ):
                chunks.append(current)
                current, trie, prompt_tokens, rows, holds_state = [], TokenTrie(), 0, 0, False
                added = len(read.prompt)
            place_read(trie, read, None)
            current.append(read)
            prompt_tokens += added
            rows += read_rows
            holds_state = holds_state or new_state
        if current:
            chunks.append(current)
        return chunks

    def _fits_one_chunk(self, reads: Sequence[ReadSpec]) -> bool:
        """Whether the whole batch surely fits the budgets, without a trie: each read's prompt counted less its
        common prefix with the read before it of the same salt, an upper bound on the trie's unique tokens (the trie
        shares at least that prefix). A batch the router packed to this budget almost always fits; `_chunks` then
        costs one prefix comparison per read, not a second trie."""
        rows = sum(1 + sum(len(label) - 1 for label in read.labels) for read in reads)
        if rows > self.max_logit_rows:
            return False
        tokens = 0
        # Per salt: the read before, and how much it shared with the one before it (the next read of a request
        # likely shares as much: `common_prefix`'s first guess, two slice comparisons instead of a binary search).
        before: dict[str, tuple[tuple[int, ...], int]] = {}
        for read in reads:
            prompt = tuple(read.prompt)
            last, guess = before.get(read.cache_salt, ((), 0))
            shared = common_prefix(prompt, last, guess)
            tokens += len(prompt) - shared
            if tokens > self.max_packed_tokens:
                return False
            before[read.cache_salt] = (prompt, shared or guess)
        return True

    def _cached_prefix(self, read: ReadSpec) -> CachedPrefix | None:
        if self.prefix_cache is None:
            return None
        # The answer position's own token is always computed: its hidden state gives the next-token logits.
        return self.prefix_cache.match(read.cache_salt, read.prompt[:-1])

    def _start_chunk(self, reads: Sequence[ReadSpec], batch: BatchOutcome) -> Started[list[ReadOutcome]]:
        prefixes = [self._cached_prefix(read) for read in reads]
        trie = TokenTrie()
        placed = [place_read(trie, read, prefix) for read, prefix in zip(reads, prefixes, strict=True)]
        claimed_past: set[tuple[int, int]] = set()
        for p, prefix in zip(placed, prefixes, strict=True):
            if prefix is not None:
                positions = {(segment.uid, i) for segment, used in prefix.pieces for i in range(used)}
                p.tokens_cached = len(positions - claimed_past)
                claimed_past |= positions
        cached_of_root = {
            trie.root_of[p.answer_node]: prefix
            for p, prefix in zip(placed, prefixes, strict=True)
            if prefix is not None and prefix.length > 0
        }
        if self._single_pass(trie, cached_of_root):
            scores = self._start_single_pass(trie, placed, prefixes, batch)
        elif self.capabilities.packs_segments:
            scores = self._start_packed(trie, placed, prefixes, cached_of_root, batch)
        else:
            scores = Started.done(self._run_passes(trie, placed, cached_of_root, batch))
        batch.packed_tokens += len(trie)
        return Started(lambda: read_outcomes(placed, scores.finish()), scores.in_flight)

    def _single_pass(self, trie: TokenTrie, cached_of_root: dict[int, CachedPrefix]) -> bool:
        """One dense-mask pass over everything: for models whose keys cannot be reused across passes (sliding
        windows, recurrent layers), and when the planner would make just one pass anyway."""
        if self.capabilities.prefix_cache_refusal is not None:
            return True
        if trie.is_chain():
            return not cached_of_root
        return False

    def _start_single_pass(
        self,
        trie: TokenTrie,
        placed: Sequence[PlacedRead],
        prefixes: Sequence[CachedPrefix | None],
        batch: BatchOutcome,
    ) -> Started[NodeScores]:
        past = _PastLayout([prefix for prefix in prefixes if prefix is not None])
        nodes = list(range(len(trie)))
        request = self._score_request(trie, nodes, placed)
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
        launched = self._launch(request, batch)
        if self.prefix_cache is not None and launched.keys is not None and launched.values is not None:
            self._remember(placed, _NodeKeyValues.whole(launched.keys, launched.values))
        return self._scores_later(request, nodes, launched, batch)

    def _run_passes(
        self,
        trie: TokenTrie,
        placed: Sequence[PlacedRead],
        cached_of_root: dict[int, CachedPrefix],
        batch: BatchOutcome,
    ) -> NodeScores:
        passes = plan_passes(trie, self.min_chain_tokens, self.min_split_tokens)
        needed_later = {node for step in passes for node in step.past}
        remember = self.prefix_cache is not None
        stored = _NodeKeyValues(len(trie))
        scores = NodeScores()
        # Each root's cached keys/values, gathered from the cache's segments once for all its passes.
        cached_past = {root: _PastLayout([prefix]).key_values() for root, prefix in cached_of_root.items()}
        for step in passes:
            nodes = list(step.nodes)
            request = self._score_request(trie, nodes, placed)
            past = _concat_past(cached_past.get(step.root), stored.select(step.past))
            mask = None
            if not step.chain:
                past_length = 0 if past is None else int(past[0].shape[2])
                tree = trie.subset_ancestor_matrix(nodes)
                allowed = np.concatenate([np.ones((len(nodes), past_length), dtype=bool), tree], axis=1)
                mask = self.model.tree_attention_mask(torch.from_numpy(allowed))
            keep_keys = remember or any(node in needed_later for node in nodes)
            request = replace(
                request,
                position_ids=_gather(trie.depths, nodes),
                attention_mask=mask,
                past=past,
                return_key_values=keep_keys,
            )
            scored = self._forward(request, batch)
            if keep_keys and scored.keys is not None and scored.values is not None:
                stored.add(nodes, scored.keys, scored.values)
            scores.merge(NodeScores.of(request, nodes, scored))
        if remember:
            self._remember(placed, stored)
        return scores

    def _start_packed(
        self,
        trie: TokenTrie,
        placed: Sequence[PlacedRead],
        prefixes: Sequence[CachedPrefix | None],
        cached_of_root: dict[int, CachedPrefix],
        batch: BatchOutcome,
    ) -> Started[NodeScores]:
        """Every read of the chunk in one forward pass: the planned passes (`plan_passes`: each state a causal chain,
        the short branches after it one masked run) become segments of one token stream, each seeing its cached
        prefix and the runs before it that hold its ancestors (`segments.SegmentLayout`). The weights are read once
        for the whole batch, and no kernel spans two requests."""
        passes = plan_passes(trie, self.min_chain_tokens, self.min_split_tokens)
        stream = list(itertools.chain.from_iterable(step.nodes for step in passes))
        at = np.empty(len(trie), dtype=np.int64)  # each node's index in the stream
        at[np.asarray(stream, dtype=np.int64)] = np.arange(len(stream))
        layout = _PastLayout([prefix for prefix in prefixes if prefix is not None])
        cached = {root: ranges(layout.positions(prefix), PAST) for root, prefix in cached_of_root.items()}
        segments, start = [], 0
        for step in passes:
            end = start + len(step.nodes)
            tree = None if step.chain else trie.subset_ancestor_matrix(step.nodes)
            past = cached.get(step.root, ()) + ranges(at[np.asarray(step.past, dtype=np.int64)], NEW)
            segments.append(AttentionSegment(start, end, past, tree))
            start = end
        remember = self.prefix_cache is not None
        request = replace(
            self._score_request(trie, stream, placed),
            position_ids=_gather(trie.depths, stream),
            segments=SegmentLayout(tuple(segments)),
            past=layout.key_values(),
            return_key_values=remember,
        )
        launched = self._launch(request, batch)
        # The cache's copies of the pass's keys/values are queued behind it, and its bookkeeping runs while the
        # device computes: on a GPU the host's largest piece of work per batch after planning, no longer between
        # one batch's forward and the next.
        if remember and launched.keys is not None and launched.values is not None:
            stored = _NodeKeyValues(len(trie))
            stored.add(stream, launched.keys, launched.values)
            self._remember(placed, stored)
        return self._scores_later(request, stream, launched, batch)

    def _scores_later(
        self, request: ScoreRequest, nodes: Sequence[int], launched: LaunchedPass, batch: BatchOutcome
    ) -> Started[NodeScores]:
        """The pass's `NodeScores` once `finish` collects its scores, holding only what that needs: not the pass's
        keys/values (cached by now) nor its inputs, so a pass in flight keeps little device memory alive while the
        model thread plans and launches the next batch."""
        launched = replace(launched, keys=None, values=None)
        rows = replace(request, token_ids=[], position_ids=None, attention_mask=None, past=None, segments=None)
        return Started(lambda: NodeScores.of(rows, nodes, self._finish(launched, batch)), launched.in_flight)

    def _score_request(self, trie: TokenTrie, nodes: Sequence[int], placed: Sequence[PlacedRead]) -> ScoreRequest:
        """A pass over `nodes` keeping the rows of the answer and label nodes among them. The per-node work (a packed
        pass is every node of the batch, 40,000+) runs in C: `itemgetter` gathers, an index array, no dict per node."""
        whole = len(nodes) == len(trie)  # every node (a packed or single pass): no membership to check
        members = None if whole else set(nodes)
        label_pairs = sorted(
            {
                (node, token)
                for p in placed
                for label, label_nodes in zip(p.read.labels, p.label_nodes, strict=True)
                for node, token in zip(label_nodes, label, strict=True)
                if members is None or node in members
            }
        )
        answers = sorted({p.answer_node for p in placed if members is None or p.answer_node in members})
        query_nodes = sorted({node for node, _ in label_pairs} | set(answers))
        local = np.empty(len(trie), dtype=np.int64)  # each node's index in `nodes`
        local[np.asarray(nodes, dtype=np.int64)] = np.arange(len(nodes))
        row_of = {node: row for row, node in enumerate(query_nodes)}
        return ScoreRequest(
            token_ids=_gather(trie.tokens, nodes),
            keep=local[np.asarray(query_nodes, dtype=np.int64)].tolist(),
            label_rows=[row_of[node] for node, _ in label_pairs],
            label_tokens=[token for _, token in label_pairs],
            greedy_rows=[row_of[node] for node in answers],
        )

    def _forward(self, request: ScoreRequest, batch: BatchOutcome) -> ScoredPass:
        return self._finish(self._launch(request, batch), batch)

    def _launch(self, request: ScoreRequest, batch: BatchOutcome) -> LaunchedPass:
        """The pass queued on the device (`LoadedModel.launch`); `_finish` waits for its scores. What the host does
        in between (`_remember`) runs while the device computes; on CPU the pass is done when this returns."""
        started = time.perf_counter()
        launched = self.model.launch(request)
        batch.forward_seconds += time.perf_counter() - started
        batch.forward_passes += 1
        return launched

    @staticmethod
    def _finish(launched: LaunchedPass, batch: BatchOutcome) -> ScoredPass:
        started = time.perf_counter()
        scored = launched.finish()
        batch.forward_seconds += time.perf_counter() - started
        return scored

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

    def _remember(self, placed: Sequence[PlacedRead], stored: _NodeKeyValues) -> None:
        """Caches every read's prompt. Where a read shares more than its cached prefix with the next read of its salt
        (the state of a request's questions), that shared part is cached first: the questions then hang off it as
        they do in the trie, where caching the first read whole and cutting its segment at the second read's question
        copied the state's keys/values once more (`PrefixCache._split`)."""
        cache = self.prefix_cache
        assert cache is not None
        after = {}  # per read: the read after it of the same salt
        last_of_salt: dict[str, int] = {}
        for index, p in enumerate(placed):
            if (before := last_of_salt.get(p.read.cache_salt)) is not None:
                after[before] = index
            last_of_salt[p.read.cache_salt] = index
        guess = 0
        shared_before = [0] * len(placed)  # with the read before of the same salt
        for index, p in enumerate(placed):
            prompt = tuple(p.read.prompt)
            if (following := after.get(index)) is not None:
                shared = common_prefix(prompt, tuple(placed[following].read.prompt), guess)
                shared_before[following] = shared
                guess = shared or guess
                # Once per group: the reads after the first find the shared part cached by their own insert.
                if max(p.prefix_length, shared_before[index]) < shared < len(prompt):
                    cache.insert(p.read.cache_salt, prompt[:shared], self._provider(p, stored, shared))
            cache.insert(p.read.cache_salt, prompt, self._provider(p, stored, len(prompt)))

    @staticmethod
    def _provider(p: PlacedRead, stored: _NodeKeyValues, end: int) -> Callable[[int], KeyValues | None]:
        """`PrefixCache.insert`'s `provide` for `p.read.prompt[:end]`: the keys/values of its tokens [start, end)."""

        def provide(start: int) -> KeyValues | None:
            if start < p.prefix_length:
                return None  # part of what this read continued from was evicted meanwhile
            return stored.select(p.prompt_nodes[start - p.prefix_length : end - p.prefix_length])

        return provide


def read_outcomes(placed: Sequence[PlacedRead], scores: NodeScores) -> list[ReadOutcome]:
    """Each read's label log-probabilities (the sum over a label's tokens) and greedy token, in request order."""
    outcomes = []
    for p in placed:
        label_logprobs = [
            sum(scores.label[(node, token)] for node, token in zip(nodes, label, strict=True))
            for label, nodes in zip(p.read.labels, p.label_nodes, strict=True)
        ]
        outcomes.append(
            ReadOutcome(
                id=p.read.id,
                label_logprobs=label_logprobs,
                greedy_token_id=scores.greedy[p.answer_node],
                tokens_computed=p.tokens_computed,
                tokens_cached=p.tokens_cached,
            )
        )
    return outcomes


def place_read(trie: TokenTrie, read: ReadSpec, prefix: CachedPrefix | None) -> PlacedRead:
    """Inserts `read` (from its salt's root, or after a cached prefix) and claims its new prompt nodes."""
    if prefix is None:
        root, skip = trie.root(_salt_root(read.cache_salt)), 0
    else:
        root, skip = trie.root(prefix.key, prefix.length), prefix.length
    prompt_nodes = trie.add_path(root, read.prompt[skip:])
    answer = prompt_nodes[-1]
    # Only prompt tokens are counted, the first time any read's prompt needs them; label branches are scoring work.
    computed = trie.claim(prompt_nodes)
    label_nodes = [
        [answer, *trie.add_path(answer, label[:-1])] if len(label) > 1 else [answer] for label in read.labels
    ]
    return PlacedRead(
        read=read,
        prefix_length=skip,
        prompt_nodes=prompt_nodes,
        answer_node=answer,
        label_nodes=label_nodes,
        tokens_computed=computed,
    )
