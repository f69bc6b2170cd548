"""The model interface the engines and the gRPC service use: one forward pass in, label log-probabilities out.
Both model implementations (the shard's own decoder, transformers' modeling) subclass `LoadedModel` here."""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from decision_server import choices
from decision_server.joint_head import PooledQuestion, PooledScores
from decision_server.media import MediaItem, MediaPrompt
from decision_server.prefix_cache import KeyValues
from decision_server.segments import SegmentLayout

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in choices.DTYPE_NAMES}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_dtype(requested: str, device: torch.device, config: Any = None) -> torch.dtype:
    """`auto` off CPU is the checkpoint's own half precision (its config's `dtype`: bfloat16 or float16), and
    bfloat16 for a float32 checkpoint or one that names none, as vLLM and SGLang serve them; on CPU it is float32.

    Why not the faster dtype on CPU too: bfloat16's decisions agree with float32's on 95.3 % of a generated
    workload's questions (SmolLM2, docs/benchmarks.md "Defaults that win"), under the 99.9 % a CPU default must
    keep; where the CPU has fast bfloat16 GEMMs, `--matmul auto` already takes their speed in float32 (`split`)."""
    if requested == "auto":
        if device.type == "cpu":
            return torch.float32
        text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
        named = getattr(text, "dtype", None) or getattr(config, "dtype", None)
        if isinstance(named, str):
            named = DTYPES.get(named)
        return named if named in (torch.bfloat16, torch.float16) else torch.bfloat16
    if requested not in DTYPES:
        raise ValueError(f"unsupported dtype {requested!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[requested]


def pick_attn_implementation(device: torch.device, needs_custom_mask: bool) -> str:
    """sdpa by default: it accepts the arbitrary 4D masks of tree reads.

    flash-attn only takes padding/varlen masks, not a tree mask, so it is used only for other engines on CUDA.
    """
    if device.type == "cuda" and not needs_custom_mask and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


@dataclass(frozen=True)
class ScoreRequest:
    """One forward pass over a packed sequence, and what the engine needs from it.

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
    # A pass packing many reads (instead of `attention_mask`): which keys each run of tokens sees, `past` first.
    # Only models whose `packs_segments` is true take it.
    segments: SegmentLayout | None = None


@dataclass
class ScoredPass:
    label_logprobs: list[float]
    greedy_tokens: list[int]
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


@dataclass
class LaunchedPass:
    """A forward pass whose work is queued on the device (`LoadedModel.launch`). Its keys/values are usable at once
    in further device work (the device's stream orders it after the pass: the prefix cache's copies); its scores
    reach the host in `finish`, the pass's one wait for the device. On CPU every op runs as it is called, so a
    launched pass is already done and `finish` only hands its scores over."""

    keys: torch.Tensor | None
    values: torch.Tensor | None
    collect: Callable[[], tuple[list[float], list[int]]]
    # The device is still computing the pass (CUDA); False where it ran to the end in `launch` (CPU).
    in_flight: bool = False

    @classmethod
    def done(cls, scored: ScoredPass) -> LaunchedPass:
        """A pass that ran to the end before it was handed over (models with no launch of their own)."""
        return cls(scored.keys, scored.values, lambda: (scored.label_logprobs, scored.greedy_tokens))

    def finish(self) -> ScoredPass:
        label_logprobs, greedy_tokens = self.collect()
        return ScoredPass(label_logprobs, greedy_tokens, self.keys, self.values)


class ModelState(ABC):
    """What a model keeps of the tokens it has run so a later pass can continue after them: keys/values of
    attention layers, and the convolution and recurrent states of layers that have no per-token keys."""

    @abstractmethod
    def copy(self) -> ModelState:
        """An independent state that continues from the same tokens; running either leaves the other as it was."""


class KeyValueState(ModelState):
    """Per-token keys/values of every layer, (layers, kv_heads, tokens, head_dim): enough for models whose layers
    are all attention. Passes build new tensors rather than writing into these, so copies may share them."""

    def __init__(self, past: KeyValues | None = None) -> None:
        self.past = past

    def copy(self) -> KeyValueState:
        return KeyValueState(self.past)

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self.past is None:
            self.past = (keys, values)
        else:
            self.past = (torch.cat((self.past[0], keys), dim=2), torch.cat((self.past[1], values), dim=2))


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
    # Which model code runs: "decoder" (the shard's own) or "transformers"; reported by Info.
    implementation: str = "transformers"

    @property
    def compiled_layers(self) -> bool:
        """Whether the layers run as compiled graphs between attentions (`layer_graph`; the own decoder only)."""
        return False

    @property
    def cuda_graph_buckets(self) -> tuple[int, ...]:
        """The token-count buckets whose passes replay as CUDA graphs (`step_graphs`; the own decoder on CUDA)."""
        return ()

    @property
    def segment_attention(self) -> str:
        """How a packed pass attends its segments (`decoder.SEGMENT_KERNELS`); "" where the model takes one dense
        mask instead (`packs_segments` False)."""
        return ""

    @property
    @abstractmethod
    def text_config(self) -> Any:
        """The Hugging Face config of the language model (the text part of a multimodal one)."""

    @abstractmethod
    def score(self, request: ScoreRequest) -> ScoredPass:
        """Runs one forward pass. Every rank of a group must run the same passes in the same order."""

    def launch(self, request: ScoreRequest) -> LaunchedPass:
        """`score` in two steps: the pass queued on the device now, its scores copied to the host by `finish`,
        so the host's work in between (caching the pass's keys/values) runs while the device computes. Here the
        whole pass runs at once; the shard's own decoder splits it."""
        return LaunchedPass.done(self.score(request))

    @abstractmethod
    def probe(self) -> float:
        """A small real matmul on this rank's own weights on its device; finite when the device works.
        Never a collective: Health must answer on each rank alone."""

    @abstractmethod
    def weight_bytes(self) -> int:
        """Bytes of the weights this rank holds."""

    @property
    def modalities(self) -> tuple[str, ...]:
        """The media kinds this model folder processes (a processor ships beside the weights); none by default."""
        return ()

    def media_processor(self) -> MediaPreparing | None:
        """The folder's processor for next-token reads with media (`multimodal.MediaProcessor`); none by default."""
        return None

    def new_state(self) -> ModelState:
        """The state before any token, for `continue_state`."""
        return KeyValueState()

    def continue_state(self, state: ModelState, request: ScoreRequest) -> ScoredPass:
        """Runs `request` as a causal pass after the tokens `state` holds, and adds its tokens to `state`.

        `request.position_ids` must continue the state's positions; the request carries no mask and no past.
        This default keeps per-token keys/values, which is exact when every layer is attention.
        """
        if not isinstance(state, KeyValueState):
            raise TypeError(f"{type(self).__name__} continues KeyValueState, not {type(state).__name__}")
        scored = self.score(replace(request, past=state.past, return_key_values=True))
        if scored.keys is None or scored.values is None:
            raise RuntimeError(f"{type(self).__name__} returned no keys/values for a continued pass")
        state.append(scored.keys, scored.values)
        return scored

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

    def agree_min(self, value: int) -> int:
        """The smallest `value` any rank of the group passed (a collective: every rank calls it together)."""
        return value

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

    def packs_segments(self) -> bool:
        """Whether `score` takes `ScoreRequest.segments`: one pass over every read of a batch, attention computed per
        segment so unrelated requests never meet in a kernel. Where it does, the tree engine runs each batch as one
        forward pass; elsewhere (transformers' attention takes one dense mask) it plans passes per state, since a
        dense mask over many requests costs products quadratic in the batch."""
        return False

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
            f"tree reads need sdpa or eager attention, the model uses {self.attn_implementation}; "
            "use --read-mode fork or naive"
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


class MediaPreparing(Protocol):
    """A folder's processor: a prompt's placeholders and its media expanded into the ids and tensors a forward takes
    (`multimodal.MediaProcessor`). Safe to call from several threads."""

    def prepare(self, read_id: int, prompt: Sequence[int], items: Sequence[MediaItem]) -> MediaPrompt: ...


@runtime_checkable
class MediaScoring(Protocol):
    """A model that reads a processed media prompt in one plain forward (`engines/media.py`): transformers' modeling."""

    max_position_embeddings: int

    def score_media(self, prompt: MediaPrompt, extra: list[int], request: ScoreRequest) -> ScoredPass: ...

    def prefill_media(self, prompt: MediaPrompt, length: int) -> ModelState:
        """The model state after the first `length` tokens of `prompt` (all its media inside them)."""
        ...

    def continue_media_rows(
        self, state: Any, sequences: Sequence[Sequence[int]], rows: Sequence[Sequence[int]]
    ) -> list[torch.Tensor]:
        """Several texts after one `prefill_media` state in one batched forward: log-probs at `rows` of each."""
        ...

    def synchronize(self) -> None: ...


@runtime_checkable
class PooledScoring(Protocol):
    """A joint-schema model (Clef): a backbone pass per prompt scored by the checkpoint's head (`engines/pooled.py`)."""

    max_position_embeddings: int

    @property
    def token_limit(self) -> int: ...

    def score_pooled(
        self, input_ids: Sequence[int], questions: Sequence[PooledQuestion], media: MediaPrompt | None = None
    ) -> PooledScores: ...

    def score_pooled_padded(
        self, reads: Sequence[tuple[Sequence[int], Sequence[PooledQuestion]]]
    ) -> list[PooledScores]: ...

    def prepare_pooled_media(
        self, read_id: int, prompt: Sequence[int], media_range: tuple[int, int], items: Sequence[MediaItem]
    ) -> MediaPrompt: ...


@dataclass(frozen=True)
class Capabilities:
    """What a loaded model can do beyond plain passes, found once (`capabilities_of`) when its engine is built right
    after loading; engines and read kinds read these fields and never probe the model for a method while reads run."""

    # `score` takes `ScoreRequest.segments`: the tree engine runs a batch as one forward pass.
    packs_segments: bool = False
    # Why cached keys/values cannot be reused as-is (`LoadedModel.supports_prefix_cache`), None when they can.
    prefix_cache_refusal: str | None = "off: the model was not probed"
    # Reads with media: the model's plain forward over a processed prompt, and the folder's processor.
    media_scoring: MediaScoring | None = None
    media_processor: MediaPreparing | None = None
    # The joint-schema head (pooled reads).
    pooled: PooledScoring | None = None
    # A block-diffusion module (transformers' `…ForBlockDiffusion`: `module.model.encoder` and `.decoder`).
    block_diffusion: Any = None
    # The model's positions: a prompt whose media expand it beyond them is refused in the media step (0: unknown).
    max_positions: int = 0

    def summary(self) -> dict[str, Any]:
        """The capabilities as log fields."""
        return {
            "packs_segments": self.packs_segments,
            "prefix_cache": self.prefix_cache_refusal or "reusable",
            "media": self.media_processor is not None,
            "joint_head": self.pooled is not None,
            "block_diffusion": self.block_diffusion is not None,
        }


def capabilities_of(model: LoadedModel) -> Capabilities:
    """Every capability of `model`, each checked once against its protocol."""
    module = getattr(model, "module", None)
    inner = getattr(module, "model", None)
    diffusion = all(getattr(inner, part, None) is not None for part in ("encoder", "decoder"))
    return Capabilities(
        packs_segments=model.packs_segments(),
        prefix_cache_refusal=model.supports_prefix_cache(),
        media_scoring=model if isinstance(model, MediaScoring) else None,
        media_processor=model.media_processor(),
        pooled=model if isinstance(model, PooledScoring) else None,
        block_diffusion=module if module is not None and inner is not None and diffusion else None,
        max_positions=int(getattr(model, "max_position_embeddings", 0) or 0),
    )
