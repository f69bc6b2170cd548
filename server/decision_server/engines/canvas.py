"""The canvas engine: block-diffusion reads (DiffusionGemma). The encoder runs once per distinct prompt of a batch and
its keys/values are shared by every canvas after that prompt; one read-only bidirectional denoising step runs over
the canvases, batched per prompt and width, and each row's full-vocabulary log-probabilities are read.

Prompts with images run the vision tower inside the encoder pass that covers their image block, with the encoder's
masks built as transformers' `generate` builds them (image tokens attend bidirectionally within their image when
the config says `use_bidirectional_attention: "vision"`). Reads share an encoder pass or a head only with equal
images (by content hash, in order) and equal expanded ids, so equal ids with different images share nothing."""

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
    Started,
)
from decision_server.media import MediaPrompt
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


# A distinct prompt of a batch: what it may share with (its salt, or its salt and media hashes) and its encoded ids.
PromptKey = tuple[Any, tuple[int, ...]]


def prompt_key(read: CanvasSpec) -> PromptKey:
    """Reads share the encoder only with the same salt and the same media (content hashes, in order)."""
    media = tuple(f"{item.modality}:{item.sha256}" for item in read.media)
    return ((read.cache_salt, media) if media else read.cache_salt), read.encoded


def shared_head_clusters(prompts: list[PromptKey]) -> list[list[PromptKey]]:
    """Distinct (group, prompt) keys clustered so that each cluster's prompts have one group (salt, media) and all
    start with the same `MIN_SHARED_HEAD` tokens or more (sorted, then cut where a neighbour shares less);
    first-seen order inside."""
    clusters: list[list[PromptKey]] = []
    for key in sorted(prompts, key=lambda k: (repr(k[0]), k[1])):
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
    if read.media and read.media_prompt is None:
        raise InvalidReadError(read.id, "a read with media reached the engine unprocessed")
    for where, tokens in (("prompt", read.prompt), ("canvas", read.canvas)):
        for token in tokens:
            if token >= token_limit:
                raise InvalidReadError(
                    read.id, f"{where} token id {token} is out of range (vocabulary size {token_limit})"
                )
    encoded = read.encoded
    with_media = " with its media" if read.media_prompt is not None else ""
    total = len(encoded) + len(read.canvas)
    if total > max_positions:
        raise InvalidReadError(
            read.id,
            f"prompt of {len(encoded)} tokens{with_media} plus a canvas of {len(read.canvas)} exceeds "
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

    def start(self, reads: Sequence[CanvasSpec]) -> Started[CanvasBatchOutcome]:
        """`run`: its passes end before it returns."""
        return Started.done(self.run(reads))

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
        # Reads with the same prompt (salt and media) share one encoder pass; within it, canvases of one width one
        # step. The media tensors of a prompt are its first read's (equal hashes and ids: equal processor outputs).
        by_prompt: dict[PromptKey, list[int]] = {}
        media: dict[PromptKey, MediaPrompt] = {}
        for index, read in enumerate(reads):
            key = prompt_key(read)
            by_prompt.setdefault(key, []).append(index)
            if read.media_prompt is not None:
                media.setdefault(key, read.media_prompt)
        caches = self._encode_all(list(by_prompt), media, batch)
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
            media_tokens = read.media_prompt.media_tokens if read.media_prompt is not None else 0
            batch.outcomes.append(
                CanvasOutcome(
                    id=read.id,
                    rows=rows[index],
                    tokens_computed=computed.get(index, 0),
                    media_tokens=media_tokens,
                )
            )
        return batch

    def _encode_all(
        self, prompts: list[PromptKey], media: dict[PromptKey, MediaPrompt], batch: CanvasBatchOutcome
    ) -> dict[PromptKey, tuple[Any, int]]:
        """The encoder cache of every distinct prompt, and the tokens its pass computed. The encoder is causal
        outside image blocks, so prompts of one salt and media that start alike (the questions of a request share
        the chat head, the images and the state) encode their shared head once, the vision tower included, when
        the head holds every image token; each continues from its own copy of that cache."""
        caches: dict[PromptKey, tuple[Any, int]] = {}
        for cluster in shared_head_clusters(prompts):
            shared = min(len(prompt) for _, prompt in cluster)
            for _, prompt in cluster:
                shared = min(shared, common_prefix_len(cluster[0][1], prompt))
            first = media.get(cluster[0])
            # A head that ended inside an image block (or where the block's end is unknown) would cut the block's
            # bidirectional attention: such prompts, like prompts that share too little, are encoded whole.
            holds_media = first is None or (first.media_end is not None and 0 < first.media_end <= shared)
            if len(cluster) == 1 or shared < MIN_SHARED_HEAD or not holds_media:
                for key in cluster:
                    caches[key] = (self._encode(key[1], batch, media=media.get(key)), len(key[1]))
                continue
            head = self._encode(cluster[0][1][:shared], batch, media=first)
            for position, key in enumerate(cluster):
                tail = key[1][shared:]
                cache = self._encode(tail, batch, copy.deepcopy(head)) if tail else head
                caches[key] = (cache, len(tail) + (shared if position == 0 else 0))
        return caches

    def _media_inputs(self, media: MediaPrompt, length: int, after: Any) -> dict[str, Any]:
        """The encoder's keyword arguments for the first `length` ids of a prompt with images: the processor's
        tensors (pixel values, patch positions), and the masks transformers' `generate` builds from the token
        types (each image block bidirectional when the config asks for it)."""
        device = self.model.device
        inputs: dict[str, Any] = {}
        types: torch.Tensor | None = None
        for name, value in media.tensors.items():
            if value.dim() == 2 and value.shape == (1, len(media.input_ids)):
                value = value[:, :length]
            value = value.to(device)
            if name == "mm_token_type_ids":
                types = value
                continue
            inputs[name] = value.to(self.model.dtype) if value.is_floating_point() else value
        if types is None:
            types = torch.zeros((1, length), dtype=torch.long, device=device)
        encoder = self._module.model.encoder
        inputs["attention_mask"] = encoder.create_masks_for_generate(
            config=self._module.config,
            inputs_embeds=torch.empty((1, length, 0), dtype=self.model.dtype, device=device),
            attention_mask=None,
            cache=after,
            position_ids=torch.arange(length, device=device).unsqueeze(0),
            mm_token_type_ids=types,
        )
        return inputs

    def _encode(
        self, prompt: tuple[int, ...], batch: CanvasBatchOutcome, after: Any = None, media: MediaPrompt | None = None
    ) -> Any:
        """The encoder's cache after `prompt`, continuing `after` (a cache the pass extends in place) if given;
        `media`: the processor's outputs for a prompt that starts with these ids and holds all their images."""
        started = time.perf_counter()
        ids = torch.tensor([prompt], dtype=torch.long, device=self.model.device)
        if media is None:
            cache = self._module.model.encoder(input_ids=ids, cache=after).cache
        else:
            if after is None:
                from transformers import DynamicCache

                after = DynamicCache(config=self._module.config.get_text_config())
            inputs = self._media_inputs(media, len(prompt), after)
            cache = self._module.model.encoder(input_ids=ids, cache=after, **inputs).cache
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
