"""The model interface the read strategies and the gRPC service use, and loading a model behind it.
Llama-family and Qwen3 checkpoints run on the shard's own tensor-parallel decoder at every world size; other
architectures fall back to transformers' modeling, at world size 1 only. Reads never see whole logits: they ask
for the log-probabilities of given tokens at given rows, and the greedy token at given rows."""

from __future__ import annotations

import importlib.util
import inspect
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decision_server.distributed import ParallelConfig
from decision_server.prefix_cache import KeyValues

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _attention_layer_kv(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise RuntimeError(f"cache layer {type(layer).__name__} holds no per-token keys/values")
    return keys, values


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """`auto` is float32 on CPU (bfloat16 matmuls are slow and lossy there) and bfloat16 on CUDA."""
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if requested not in DTYPES:
        raise ValueError(f"unsupported dtype {requested!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[requested]


def pick_attn_implementation(device: torch.device, needs_custom_mask: bool) -> str:
    """sdpa by default: it accepts the arbitrary 4D masks of tree reads.

    flash-attn only takes padding/varlen masks, not a tree mask, so it is used only for naive reads on CUDA.
    """
    if device.type == "cuda" and not needs_custom_mask and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


@dataclass(frozen=True)
class ScoreRequest:
    """One forward pass over a packed sequence, and what the read strategy needs from it.

    `keep` lists the positions of the sequence whose next-token distribution is read; the other fields index
    those kept rows: the log-probability of `label_tokens[k]` at row `label_rows[k]` (full-vocabulary
    log-softmax, float32) and the greedy token at each of `greedy_rows`. Without `attention_mask` the pass is
    a plain causal prefill; with `past` (keys/values of earlier tokens) the mask covers past + new keys.
    """

    token_ids: list[int]
    keep: list[int]
    label_rows: list[int]
    label_tokens: list[int]
    greedy_rows: list[int]
    position_ids: list[int] | None = None
    attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None
    past: KeyValues | None = None
    # Return the new tokens' keys/values, (layers, kv_heads, tokens, head_dim) each, for the prefix cache.
    return_key_values: bool = False


@dataclass
class ScoredPass:
    label_logprobs: list[float]
    greedy_tokens: list[int]
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


class LoadedModel(ABC):
    """A causal LM ready for reads on one device (one rank of a tensor-parallel group), with the facts the
    router asks for. Subclasses set these attributes and implement `score` and `probe`."""

    path: Path
    device: torch.device
    dtype: torch.dtype
    architecture: str
    vocab_size: int  # rows of the whole LM head, across ranks
    embedding_rows: int
    max_position_embeddings: int
    attn_implementation: str
    # How float32 linears multiply (`layers.MATMUL_MODES`); transformers' modeling is always "exact".
    matmul: str = "exact"

    @property
    @abstractmethod
    def text_config(self) -> Any:
        """The Hugging Face config of the language model (the text part of a multimodal one)."""

    @abstractmethod
    def score(self, request: ScoreRequest) -> ScoredPass:
        """Runs one forward pass. Every rank of a group must run the same passes in the same order."""

    @abstractmethod
    def probe(self) -> float:
        """A small real matmul on this rank's own weights on its device; finite when the device works.
        Never a collective: Health must answer on each rank alone."""

    @abstractmethod
    def weight_bytes(self) -> int:
        """Bytes of the weights this rank holds."""

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def kv_heads_share(self) -> tuple[int, int]:
        """(key/value heads this rank holds, heads of the whole model): the part of each cached token's
        keys/values stored here."""
        return 1, 1

    @property
    def token_limit(self) -> int:
        """Token ids must be below this to be both embeddable and scoreable."""
        return min(self.vocab_size, self.embedding_rows)

    @property
    def device_name(self) -> str:
        if self.device.type == "cuda":
            return f"cuda:{self.device.index or 0}"
        return self.device.type

    def close(self) -> None:  # noqa: B027  (optional hook: only grouped models have something to leave)
        """Leaves the tensor-parallel group, if any."""

    def supports_prefix_cache(self) -> str | None:
        """None when cached keys/values can be reused as-is, else the reason they cannot."""
        if self.sliding_window() is not None:
            return "sliding-window layers keep only part of the keys; cached prefixes would be wrong"
        if self.attn_implementation not in ("sdpa", "eager"):
            return f"tree reads with a cache need sdpa or eager attention, not {self.attn_implementation}"
        others = sorted(set(self.layer_types() or []) - {"full_attention"})
        if others:
            # Linear-attention / recurrent layers carry a state, not per-token keys a tree can branch from.
            return f"layers of type {', '.join(others)} have no per-token keys/values to reuse"
        return None

    def synchronize(self) -> None:
        """Waits for queued device work, so wall-clock timings of a forward pass are real on CUDA."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def tree_attention_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """Turns a (T, T) boolean "query may attend key" matrix into the 4D mask this model's attention expects.

        transformers returns a 4D mask unchanged (masking_utils._preprocess_mask_arguments), so it must already be
        in the attention function's own convention: sdpa takes booleans (True = attend), eager adds the mask to the
        scores, so it needs 0 / -inf-like floats in the compute dtype.
        """
        allowed = allowed.to(self.device)[None, None, :, :]
        if self.attn_implementation == "sdpa":
            return allowed
        if self.attn_implementation == "eager":
            blocked = torch.finfo(self.dtype).min
            zeros = torch.zeros((), dtype=self.dtype, device=self.device)
            return torch.where(allowed, zeros, torch.full((), blocked, dtype=self.dtype, device=self.device))
        raise NotImplementedError(
            f"tree reads need sdpa or eager attention, the model uses {self.attn_implementation}; use --read-mode naive"
        )

    def sliding_window(self) -> int | None:
        """The attention window of sliding layers, or None when every layer attends to the whole prefix."""
        config = self.text_config
        window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None)
        if window is None:
            return None
        if layer_types is not None and "sliding_attention" not in layer_types:
            return None
        return int(window)

    def layer_types(self) -> list[str] | None:
        """Attention type per layer ("full_attention", "sliding_attention", ...), when the config lists them."""
        layer_types = getattr(self.text_config, "layer_types", None)
        return list(layer_types) if layer_types is not None else None


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
            output = self.module(
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
        # transformers 5 renamed `past_key_values` to `cache`; the old name warns and goes away in 5.40.
        parameters = inspect.signature(self.module.forward).parameters
        cache_argument = "cache" if "cache" in parameters else "past_key_values"
        with torch.inference_mode():
            output = self.module(
                input_ids=torch.tensor([token_ids], dtype=torch.long, device=device),
                position_ids=torch.tensor([position_ids], dtype=torch.long, device=device),
                attention_mask=attention_mask,
                use_cache=True,
                logits_to_keep=torch.tensor(keep, dtype=torch.long, device=device),
                **{cache_argument: cache},
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
    loaded = TransformersModel(
        module=module,
        path=path,
        device=device,
        dtype=dtype,
        architecture=str(architectures[0]),
        vocab_size=int(head.weight.shape[0]),
        embedding_rows=int(module.get_input_embeddings().weight.shape[0]),
        max_position_embeddings=int(getattr(text_config, "max_position_embeddings", 0) or 0),
        attn_implementation=str(config._attn_implementation),
    )
    if loaded.max_position_embeddings <= 0:
        raise ValueError(f"{path}: config has no max_position_embeddings")
    return loaded


def load_model(
    path: Path,
    dtype: str = "auto",
    threads: int | None = None,
    needs_custom_mask: bool = True,
    parallel: ParallelConfig | None = None,
    matmul: str = "exact",
) -> LoadedModel:
    """Loads the HF folder at `path` for inference as rank `parallel.rank` of `parallel.world_size`.

    Llama-family and Qwen3 models get the shard's own decoder (each rank reads only its weight slices); other
    architectures get transformers' modeling, which cannot be split, so they are refused above world size 1.
    `matmul` ("auto", "exact" or "fast", `layers.MATMUL_CHOICES`) is how the own decoder's float32 linears
    multiply; auto picks this CPU's faster GEMM (`layers.resolve_matmul`). transformers' modeling always runs its
    own (exact) linears. The loaded model's `matmul` is the mode that runs, never "auto".
    """
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    from decision_server.decoder import DecoderShape, UnsupportedModelError
    from decision_server.distributed import pick_device as pick_rank_device
    from decision_server.layers import resolve_matmul

    parallel = parallel or ParallelConfig()
    # The weight-loading bar draws with carriage returns, which garbles the JSON-lines log stream.
    hf_logging.disable_progress_bar()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    config = AutoConfig.from_pretrained(path)
    device = pick_rank_device(parallel)
    if threads is None and device.type == "cpu" and parallel.world_size > 1:
        # Ranks on one CPU share its cores: each takes its part rather than all of them, which would oversubscribe.
        torch.set_num_threads(max(1, torch.get_num_threads() // parallel.world_size))
    torch_dtype = resolve_dtype(dtype, device)
    requested_matmul = matmul
    matmul = resolve_matmul(matmul, device.type)
    try:
        DecoderShape.from_config(config).check_world_size(parallel.world_size)
        native_refusal = None
    except UnsupportedModelError as err:
        native_refusal = str(err)
    if native_refusal is None:
        from decision_server.decoder_model import load_decoder_model

        loaded: LoadedModel = load_decoder_model(path, config, torch_dtype, device, parallel, matmul)
        modeling = "decoder"
    elif parallel.world_size > 1:
        raise UnsupportedModelError(
            f"{path}: cannot serve with --world-size {parallel.world_size}: {native_refusal}. "
            "Serve it with --world-size 1 (--num-shard 1), where transformers' modeling runs it."
        )
    else:
        loaded = _load_transformers(path, torch_dtype, device, needs_custom_mask)
        modeling = "transformers"
        if requested_matmul == "fast":
            logger.warning(
                "--matmul applies to the shard's own decoder only; transformers' modeling keeps its linears",
                extra={"fields": {"matmul": requested_matmul, "architecture": loaded.architecture}},
            )
        matmul = "exact"
    logger.info(
        "model loaded",
        extra={
            "fields": {
                "path": str(path),
                "architecture": loaded.architecture,
                "modeling": modeling,
                "dtype": dtype_name(torch_dtype),
                "matmul": matmul,
                "device": loaded.device_name,
                "rank": loaded.rank,
                "world_size": loaded.world_size,
                "weight_bytes": loaded.weight_bytes(),
                "attn_implementation": loaded.attn_implementation,
                "threads": torch.get_num_threads(),
                **({"fallback_reason": native_refusal} if native_refusal else {}),
            }
        },
    )
    return loaded


def _load_transformers(
    path: Path, torch_dtype: torch.dtype, device: torch.device, needs_custom_mask: bool
) -> TransformersModel:
    from transformers import AutoModelForCausalLM

    attn = pick_attn_implementation(device, needs_custom_mask)
    try:
        module = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn)
    except ValueError as err:
        # Some architectures have no sdpa path; eager attention works everywhere, only slower.
        if attn != "sdpa" or "sdpa" not in str(err).lower():
            raise
        logger.warning("sdpa unsupported, falling back to eager attention", extra={"fields": {"reason": str(err)}})
        attn = "eager"
        module = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn)
    return wrap_module(module, path, device, torch_dtype)
