"""The canvas engine: block-diffusion reads (DiffusionGemma). The encoder runs once per distinct prompt of a batch and
its keys/values are shared by every canvas after that prompt; one read-only bidirectional denoising step runs over
the canvases, batched per prompt and width, and each row's full-vocabulary log-probabilities are read."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

import torch

from decision_server.batch_budget import BatchBudget
from decision_server.engines.types import (
    CanvasBatchOutcome,
    CanvasOutcome,
    CanvasRowOutcome,
    CanvasSpec,
    InvalidReadError,
)
from decision_server.model_base import LoadedModel, capabilities_of
from decision_server.prefix_cache import CachePlan, PrefixCache

READ_KIND = "canvas"
# Prompts sharing fewer leading tokens than this are encoded whole: a copied cache would cost more than it saves.
MIN_SHARED_HEAD = 32


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


def shared_head_clusters(
    prompts: list[tuple[str, tuple[int, ...]]],
) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Distinct (salt, prompt) keys grouped so that each group's prompts have one salt and all start with the same
    `MIN_SHARED_HEAD` tokens or more (sorted, then cut where a neighbour shares less); first-seen order inside."""
    clusters: list[list[tuple[str, tuple[int, ...]]]] = []
    for key in sorted(prompts):
        if clusters:
            last = clusters[-1][-1]
            if last[0] == key[0] and common_prefix_len(last[1], key[1]) >= MIN_SHARED_HEAD:
                clusters[-1].append(key)
                continue
        clusters.append([key])
    order = {key: position for position, key in enumerate(prompts)}
    return sorted((sorted(cluster, key=order.__getitem__) for cluster in clusters), key=lambda c: order[c[0]])


def validate_canvas(read: CanvasSpec, token_limit: int, max_positions: int) -> None:
    """Every problem a canvas read can have, found before any tensor work, naming the read and what was wrong."""
    if not read.prompt:
        raise InvalidReadError(read.id, "prompt has no tokens")
    if not read.canvas:
        raise InvalidReadError(read.id, "canvas has no tokens")
    if not read.rows:
        raise InvalidReadError(read.id, "canvas read has no rows")
    for where, tokens in (("prompt", read.prompt), ("canvas", read.canvas)):
        for token in tokens:
            if token >= token_limit:
                raise InvalidReadError(
                    read.id, f"{where} token id {token} is out of range (vocabulary size {token_limit})"
                )
    total = len(read.prompt) + len(read.canvas)
    if total > max_positions:
        raise InvalidReadError(
            read.id,
            f"prompt of {len(read.prompt)} tokens plus a canvas of {len(read.canvas)} exceeds "
            f"max_position_embeddings {max_positions}",
        )
    for index, row in enumerate(read.rows):
        if row.position >= len(read.canvas):
            raise InvalidReadError(
                read.id, f"row {index}: position {row.position} is outside the canvas of {len(read.canvas)}"
            )
        if not row.tokens:
            raise InvalidReadError(read.id, f"row {index} has no labels")
        if sum(row.group_sizes) != len(row.tokens) or any(size < 1 for size in row.group_sizes):
            raise InvalidReadError(read.id, f"row {index}: every label needs one or more one-token variants")
        for token in row.tokens:
            if token >= token_limit:
                raise InvalidReadError(
                    read.id, f"row {index} label token id {token} is out of range (vocabulary size {token_limit})"
                )


def _batched_cache(cache: Any, copies: int) -> Any:
    """The encoder's cache seen `copies` times along the batch: the same keys/values (expanded, never copied), in a
    shallow copy so the encoder's own cache is left as it was. The decoder only reads it (it concatenates)."""
    batched = copy.copy(cache)
    batched.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in batched.layers:
        layer.keys = layer.keys.expand(copies, -1, -1, -1)
        layer.values = layer.values.expand(copies, -1, -1, -1)
    return batched


class CanvasEngine:
    """Runs canvas reads on transformers' `DiffusionGemmaForBlockDiffusion`: encoder, then the decoder's single step,
    the LM head and the final-logit softcap, exactly as the model's own forward does."""

    name = READ_KIND
    read_kind = READ_KIND
    cache_plan = CachePlan.off("off")
    batch_budget = BatchBudget(0, "unset")
    prefix_cache: PrefixCache | None = None

    def __init__(self, model: LoadedModel) -> None:
        self.capabilities = capabilities_of(model)
        module = self.capabilities.block_diffusion
        if module is None:
            raise ValueError(f"{model.architecture}: canvas reads need a block-diffusion model (encoder and decoder)")
        self.model = model
        self._module = module
        self._softcap = getattr(model.text_config, "final_logit_softcapping", None)

    def run(self, reads: Sequence[CanvasSpec]) -> CanvasBatchOutcome:
        for read in reads:
            validate_canvas(read, self.model.token_limit, self.model.max_position_embeddings)
        if not reads:
            return CanvasBatchOutcome(outcomes=[])
        with torch.inference_mode():
            return self._run_valid(reads)

    def _run_valid(self, reads: Sequence[CanvasSpec]) -> CanvasBatchOutcome:
        batch = CanvasBatchOutcome(outcomes=[])
        rows: dict[int, list[CanvasRowOutcome]] = {}
        computed: dict[int, int] = {}
        # Reads with the same prompt (and salt) share one encoder pass; within it, canvases of one width one step.
        by_prompt: dict[tuple[str, tuple[int, ...]], list[int]] = {}
        for index, read in enumerate(reads):
            by_prompt.setdefault((read.cache_salt, read.prompt), []).append(index)
        caches = self._encode_all(list(by_prompt), batch)
        for key, members in by_prompt.items():
            cache, tokens = caches[key]
            computed[members[0]] = tokens
            by_width: dict[int, list[int]] = {}
            for index in members:
                by_width.setdefault(len(reads[index].canvas), []).append(index)
            for group in by_width.values():
                logprobs = self._step(cache, [reads[index].canvas for index in group], batch)
                for slot, index in enumerate(group):
                    rows[index] = self._rows(reads[index], logprobs[slot])
        for index, read in enumerate(reads):
            batch.outcomes.append(CanvasOutcome(id=read.id, rows=rows[index], tokens_computed=computed.get(index, 0)))
        return batch

    def _encode_all(
        self, prompts: list[tuple[str, tuple[int, ...]]], batch: CanvasBatchOutcome
    ) -> dict[tuple[str, tuple[int, ...]], tuple[Any, int]]:
        """The encoder cache of every distinct (salt, prompt), and the tokens its pass computed. The encoder is
        causal, so prompts of one salt that start alike (the questions of a request share the chat head and the
        state) encode their shared head once; each continues from its own copy of that cache."""
        caches: dict[tuple[str, tuple[int, ...]], tuple[Any, int]] = {}
        for cluster in shared_head_clusters(prompts):
            shared = min(len(prompt) for _, prompt in cluster)
            for _, prompt in cluster:
                shared = min(shared, common_prefix_len(cluster[0][1], prompt))
            if len(cluster) == 1 or shared < MIN_SHARED_HEAD:
                for key in cluster:
                    caches[key] = (self._encode(key[1], batch), len(key[1]))
                continue
            head = self._encode(cluster[0][1][:shared], batch)
            for position, key in enumerate(cluster):
                tail = key[1][shared:]
                cache = self._encode(tail, batch, copy.deepcopy(head)) if tail else head
                caches[key] = (cache, len(tail) + (shared if position == 0 else 0))
        return caches

    def _encode(self, prompt: tuple[int, ...], batch: CanvasBatchOutcome, after: Any = None) -> Any:
        """The encoder's cache after `prompt`, continuing `after` (a cache the pass extends in place) if given."""
        started = time.perf_counter()
        ids = torch.tensor([prompt], dtype=torch.long, device=self.model.device)
        cache = self._module.model.encoder(input_ids=ids, cache=after).cache
        self.model.synchronize()
        batch.forward_seconds += time.perf_counter() - started
        batch.forward_passes += 1
        batch.packed_tokens += len(prompt)
        return cache

    def _step(self, cache: Any, canvases: list[tuple[int, ...]], batch: CanvasBatchOutcome) -> torch.Tensor:
        """Full-vocabulary float32 log-probabilities, (canvases, width, vocab), after one read-only step."""
        started = time.perf_counter()
        ids = torch.tensor(canvases, dtype=torch.long, device=self.model.device)
        hidden = self._module.model.decoder(decoder_input_ids=ids, cache=_batched_cache(cache, len(canvases)))
        logits = self._module.lm_head(hidden.last_hidden_state).float()
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        logprobs = torch.log_softmax(logits, dim=-1)
        self.model.synchronize()
        batch.forward_seconds += time.perf_counter() - started
        batch.forward_passes += 1
        batch.packed_tokens += ids.numel()
        return logprobs

    @staticmethod
    def _rows(read: CanvasSpec, logprobs: torch.Tensor) -> list[CanvasRowOutcome]:
        positions = torch.tensor([row.position for row in read.rows], dtype=torch.long, device=logprobs.device)
        picked = logprobs[positions]
        greedy: list[int] = torch.argmax(picked, dim=-1).tolist()
        outcomes = []
        for slot, row in enumerate(read.rows):
            tokens = torch.tensor(row.tokens, dtype=torch.long, device=logprobs.device)
            values: list[float] = picked[slot, tokens].double().tolist()
            outcomes.append(CanvasRowOutcome(label_logprobs=values, greedy_token_id=greedy[slot]))
        return outcomes
