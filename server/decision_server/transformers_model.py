"""transformers' own modeling behind the `LoadedModel` interface: the fallback for architectures the shard's decoder
does not implement (hybrid, multimodal, sliding-window ones), at world size 1 only. Reads are text-only here."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decision_server.architectures import lookup
from decision_server.media import MediaPrompt
from decision_server.model_base import LoadedModel, ModelState, ScoredPass, ScoreRequest
from decision_server.multimodal import MediaProcessor
from decision_server.prefix_cache import KeyValues


def _attention_layer_kv(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise RuntimeError(f"cache layer {type(layer).__name__} holds no per-token keys/values")
    return keys, values


class TransformersCacheState(ModelState):
    """A transformers cache built from the model's config, so every layer keeps what it needs to continue: keys and
    values (trimmed to the window on sliding layers), convolution windows and recurrent matrices (linear attention,
    short convolutions). Its layers are updated in place by each pass, so a copy is a deep one."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def copy(self) -> TransformersCacheState:
        return TransformersCacheState(copy.deepcopy(self.cache))


class MediaPrefixState(TransformersCacheState):
    """The cache after a media prompt's shared prefix (its media inside it), and the position offset the model
    computed for the tokens after it (Qwen3.5's M-RoPE `rope_deltas`: the text after an image continues from the
    image's last position, not from its token count; None for models with plain positions)."""

    def __init__(self, cache: Any, rope_deltas: torch.Tensor | None, length: int) -> None:
        super().__init__(cache)
        self.rope_deltas = rope_deltas
        self.length = length

    def copy(self) -> MediaPrefixState:
        return MediaPrefixState(copy.deepcopy(self.cache), self.rope_deltas, self.length)


def _repeat_cache(cache: Any, times: int) -> None:
    """Repeats every layer's state of a batch-1 cache `times` along the batch, in place: keys and values, and the
    convolution and recurrent states of linear-attention and short-convolution layers."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            value = getattr(layer, name, None)
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                setattr(layer, name, value.repeat_interleave(times, dim=0))
        for name in ("conv_states", "recurrent_states"):
            states = getattr(layer, name, None)
            if isinstance(states, dict):
                for key, value in states.items():
                    if isinstance(value, torch.Tensor):
                        states[key] = value.repeat_interleave(times, dim=0)
            elif isinstance(states, torch.Tensor):
                setattr(layer, name, states.repeat_interleave(times, dim=0))


@dataclass
class TransformersModel(LoadedModel):
    """A transformers PreTrainedModel in eval mode: the fallback for architectures without the shard's own
    decoder, at world size 1 only. Its logits are whole on one device, so scores come straight from them."""

    module: Any  # a transformers PreTrainedModel; typed loosely because transformers is not typed
    path: Path
    device: torch.device
    dtype: torch.dtype
    architecture: str
    vocab_size: int
    embedding_rows: int
    max_position_embeddings: int
    attn_implementation: str
    # Run before every forward: per-architecture fixes of state a module keeps between calls (architectures.py).
    prepare_forward: Callable[[Any], None] | None = None
    implementation: str = "transformers"
    # The folder's processor, when the architecture reads media and one ships (multimodal.py).
    media: MediaProcessor | None = None

    @property
    def modalities(self) -> tuple[str, ...]:
        return self.media.modalities if self.media is not None else ()

    def media_processor(self) -> MediaProcessor | None:
        return self.media

    def score_media(self, prompt: MediaPrompt, extra: Sequence[int], request: ScoreRequest) -> ScoredPass:
        """One plain forward over a processed media prompt followed by `extra` tokens (a multi-token label's
        prefix); `request` says which rows to read, counted over the whole sequence. Positions are the model's own
        (M-RoPE for Qwen3.5 comes from the processor's grids), and no state is kept for later passes."""
        from decision_server.scoring import argmax_rows, gather, log_probs

        device = self.device
        ids = torch.tensor([[*prompt.input_ids, *extra]], dtype=torch.long, device=device)
        tensors = {key: value.to(device) for key, value in prompt.tensors.items()}
        if "mm_token_type_ids" in tensors and extra:
            padding = torch.zeros((1, len(extra)), dtype=tensors["mm_token_type_ids"].dtype, device=device)
            tensors["mm_token_type_ids"] = torch.cat((tensors["mm_token_type_ids"], padding), dim=1)
        for key, value in tensors.items():
            if value.is_floating_point():
                tensors[key] = value.to(self.dtype)
        with torch.inference_mode():
            output = self._call(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                logits_to_keep=torch.tensor(request.keep, dtype=torch.long, device=device),
                use_cache=False,
                **tensors,
            )
            logprobs = log_probs(output.logits[0].float())
        return ScoredPass(
            label_logprobs=gather(logprobs, request.label_rows, request.label_tokens),
            greedy_tokens=argmax_rows(logprobs, request.greedy_rows),
        )

    def prefill_media(self, prompt: MediaPrompt, length: int) -> MediaPrefixState:
        """The cache after the first `length` tokens of a media prompt, which hold all its media: the vision tower
        and those tokens' layers run once, and every read continuing it (`continue_media_rows`) shares them.
        Positions are the model's own, as in `score_media`."""
        from transformers import DynamicCache

        device = self.device
        ids = torch.tensor([prompt.input_ids[:length]], dtype=torch.long, device=device)
        tensors = {}
        for key, value in prompt.tensors.items():
            # Per-token outputs (token types) cover the whole prompt; the prefix takes its own stretch.
            if value.dim() == 2 and value.shape == (1, len(prompt.input_ids)):
                value = value[:, :length]
            value = value.to(device)
            tensors[key] = value.to(self.dtype) if value.is_floating_point() else value
        cache = DynamicCache(config=self.module.config)
        with torch.inference_mode():
            self._call(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                logits_to_keep=1,
                use_cache=True,
                **{self._cache_argument(): cache},
                **tensors,
            )
        inner = getattr(self.module, "model", None)
        deltas = getattr(inner, "rope_deltas", None)
        return MediaPrefixState(cache, deltas.clone() if isinstance(deltas, torch.Tensor) else None, length)

    def continue_media_rows(
        self, state: MediaPrefixState, sequences: Sequence[Sequence[int]], rows: Sequence[Sequence[int]]
    ) -> list[torch.Tensor]:
        """Several texts after one media prefix in one forward, the prefix's state repeated along the batch: per
        sequence the log-probabilities (float32, (len(rows[k]), vocab)) at its positions `rows[k]`. Shorter
        sequences are padded at their end; every pass here is causal (attention, short convolutions, linear
        attention), so padding after a position changes nothing at it. `state` is not changed."""
        from decision_server.scoring import log_probs

        device = self.device
        width = max(len(sequence) for sequence in sequences)
        ids = torch.tensor(
            [[*sequence, *([sequence[-1]] * (width - len(sequence)))] for sequence in sequences],
            dtype=torch.long,
            device=device,
        )
        keep = sorted({row for sequence_rows in rows for row in sequence_rows})
        where = {row: index for index, row in enumerate(keep)}
        cache = copy.deepcopy(state.cache)
        _repeat_cache(cache, len(sequences))
        with torch.inference_mode():
            if self.prepare_forward is not None:
                self.prepare_forward(self.module)
            inner = getattr(self.module, "model", None)
            if state.rope_deltas is not None and inner is not None:
                inner.rope_deltas = state.rope_deltas
            try:
                output = self.module(
                    input_ids=ids,
                    use_cache=True,
                    logits_to_keep=torch.tensor(keep, dtype=torch.long, device=device),
                    **{self._cache_argument(): cache},
                )
            finally:
                if self.prepare_forward is not None:
                    self.prepare_forward(self.module)
            logits = output.logits
            return [
                log_probs(logits[k, [where[row] for row in sequence_rows]].float())
                for k, sequence_rows in enumerate(rows)
            ]

    @property
    def text_config(self) -> Any:
        return self.module.config.get_text_config()

    def score(self, request: ScoreRequest) -> ScoredPass:
        from decision_server.scoring import argmax_rows, gather, log_probs

        keys = values = None
        if request.past is None and not request.return_key_values:
            logits = self._logits(request.token_ids, request.keep, request.position_ids, request.attention_mask)
        else:
            if isinstance(request.attention_mask, dict):
                raise ValueError("a pass continuing cached keys/values takes one mask, not one per layer type")
            positions = request.position_ids or list(range(len(request.token_ids)))
            logits, keys, values = self._logits_with_cache(
                request.token_ids, request.keep, positions, request.attention_mask, request.past
            )
        logprobs = log_probs(logits)
        return ScoredPass(
            label_logprobs=gather(logprobs, request.label_rows, request.label_tokens),
            greedy_tokens=argmax_rows(logprobs, request.greedy_rows),
            keys=keys,
            values=values,
        )

    def new_state(self) -> TransformersCacheState:
        from transformers import DynamicCache

        # With the config the cache gets one layer of the right kind per decoder layer (linear, sliding, shared).
        return TransformersCacheState(DynamicCache(config=self.module.config))

    def continue_state(self, state: ModelState, request: ScoreRequest) -> ScoredPass:
        from decision_server.scoring import argmax_rows, gather, log_probs

        if not isinstance(state, TransformersCacheState):
            raise TypeError(f"transformers models continue TransformersCacheState, not {type(state).__name__}")
        if request.attention_mask is not None or request.past is not None:
            raise ValueError("a pass continuing a model state is causal: it takes no mask and no past keys/values")
        device = self.device
        positions = request.position_ids
        if positions is None:
            start = int(state.cache.get_seq_length())
            positions = list(range(start, start + len(request.token_ids)))
        with torch.inference_mode():
            output = self._call(
                input_ids=torch.tensor([request.token_ids], dtype=torch.long, device=device),
                position_ids=torch.tensor([positions], dtype=torch.long, device=device),
                use_cache=True,
                logits_to_keep=torch.tensor(request.keep, dtype=torch.long, device=device),
                **{self._cache_argument(): state.cache},
            )
            logprobs = log_probs(output.logits[0])
        return ScoredPass(
            label_logprobs=gather(logprobs, request.label_rows, request.label_tokens),
            greedy_tokens=argmax_rows(logprobs, request.greedy_rows),
        )

    def _call(self, **kwargs: Any) -> Any:
        if self.prepare_forward is not None:
            self.prepare_forward(self.module)
        return self.module(**kwargs)

    def _cache_argument(self) -> str:
        # transformers 5 renamed `past_key_values` to `cache`; the old name warns and goes away in 5.40.
        parameters = inspect.signature(self.module.forward).parameters
        return "cache" if "cache" in parameters else "past_key_values"

    def _logits(
        self,
        token_ids: list[int],
        keep: list[int],
        position_ids: list[int] | None = None,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Float32 next-token logits, shape (len(keep), vocab), at positions `keep` of one forward pass.

        Only the kept rows go through the LM head (`logits_to_keep`), which matters with 150k-token vocabularies.
        Without `attention_mask` the pass is the model's plain causal prefill; a mapping gives one mask per
        layer type (full / sliding attention) to models that accept it.
        """
        device = self.device
        ids = torch.tensor([token_ids], dtype=torch.long, device=device)
        positions = (
            torch.tensor([position_ids], dtype=torch.long, device=device)
            if position_ids is not None
            else torch.arange(len(token_ids), device=device).unsqueeze(0)
        )
        keep_index = torch.tensor(keep, dtype=torch.long, device=device)
        with torch.inference_mode():
            output = self._call(
                input_ids=ids,
                position_ids=positions,
                attention_mask=attention_mask,
                logits_to_keep=keep_index,
                use_cache=False,
            )
            logits: torch.Tensor = output.logits[0].float()
            return logits

    def _logits_with_cache(
        self,
        token_ids: list[int],
        keep: list[int],
        position_ids: list[int],
        attention_mask: torch.Tensor | None,
        past: KeyValues | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Like `_logits`, continuing from `past` keys/values, and returning the new tokens' ones.

        `past` and the returned keys/values are (layers, kv_heads, tokens, head_dim); the mask, when given, covers
        past + new keys, shape (1, 1, new, past + new).
        """
        from transformers import DynamicCache

        device = self.device
        cache = DynamicCache()
        past_length = 0
        if past is not None:
            past_keys, past_values = past
            past_length = past_keys.shape[2]
            for layer in range(past_keys.shape[0]):
                cache.update(past_keys[layer].unsqueeze(0), past_values[layer].unsqueeze(0), layer)
        with torch.inference_mode():
            output = self._call(
                input_ids=torch.tensor([token_ids], dtype=torch.long, device=device),
                position_ids=torch.tensor([position_ids], dtype=torch.long, device=device),
                attention_mask=attention_mask,
                use_cache=True,
                logits_to_keep=torch.tensor(keep, dtype=torch.long, device=device),
                **{self._cache_argument(): cache},
            )
            # The cache object is filled in place, whatever the output field is called in this version.
            layers = [_attention_layer_kv(layer) for layer in cache.layers]
            keys = torch.stack([layer_keys[0, :, past_length:] for layer_keys, _ in layers])
            values = torch.stack([layer_values[0, :, past_length:] for _, layer_values in layers])
            logits: torch.Tensor = output.logits[0].float()
        return logits, keys, values

    def probe(self) -> float:
        """A small real matmul on the model's own weights on its device; finite when the device works."""
        weight = self.module.get_input_embeddings().weight
        with torch.inference_mode():
            rows = weight[:8, :64].float()
            value = float((rows @ rows.T).sum().item())
        return value

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())


def wrap_module(module: Any, path: Path, device: torch.device, dtype: torch.dtype) -> TransformersModel:
    """Puts an instantiated causal LM on `device` in eval mode and reads the facts the shard reports."""
    module.to(device)
    module.eval()
    # Inference only: no parameter ever needs a gradient, and tensors derived from weights stay plain.
    module.requires_grad_(False)
    config = module.config
    text_config = config.get_text_config()
    architectures = getattr(config, "architectures", None) or [type(module).__name__]
    head = module.get_output_embeddings()
    if head is None:
        raise ValueError(f"{path}: model {architectures[0]} has no LM head")
    embedding_rows = int(module.get_input_embeddings().weight.shape[0])
    # Gemma4's per-layer input embeddings have their own table; a token past it would fail inside the forward.
    per_layer_rows = getattr(text_config, "vocab_size_per_layer_input", None)
    if getattr(text_config, "hidden_size_per_layer_input", None) and per_layer_rows:
        embedding_rows = min(embedding_rows, int(per_layer_rows))
    architecture = str(architectures[0])
    loaded = TransformersModel(
        module=module,
        path=path,
        device=device,
        dtype=dtype,
        architecture=architecture,
        vocab_size=int(head.weight.shape[0]),
        embedding_rows=embedding_rows,
        max_position_embeddings=int(getattr(text_config, "max_position_embeddings", 0) or 0),
        attn_implementation=str(config._attn_implementation),
        prepare_forward=lookup(architecture).prepare_forward,
        media=MediaProcessor.for_folder(path, lookup(architecture)),
    )
    if loaded.max_position_embeddings <= 0:
        raise ValueError(f"{path}: config has no max_position_embeddings")
    return loaded
