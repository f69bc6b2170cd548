"""The shard's own decoder behind the `LoadedModel` interface: one rank of a tensor-parallel group (or the only
one). Scores come from vocabulary-split logits through all-reduces; every pass first checks that all ranks are
running the same pass, so ranks that were sent different batches fail loudly instead of mixing their results."""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from decision_server.checkpoint import Checkpoint
from decision_server.decoder import Attention, DecoderLM, DecoderShape, LayerKV, SegmentPlan, SegmentRows
from decision_server.distributed import ParallelConfig, ShardGroup, join_group, partition
from decision_server.layers import resolve_matmul, vocab_parallel_score_tensors, widen_fits_memory
from decision_server.model_base import LaunchedPass, LoadedModel, ScoredPass, ScoreRequest
from decision_server.prefix_cache import free_memory_bytes
from decision_server.segments import NEW, PAST, AttentionSegment, KeyRange, SegmentLayout
from decision_server.transfer import to_device

logger = logging.getLogger(__name__)

# Kept rows whose logits are computed at once (`DecoderModel._scores_in_pieces`): 256 rows of a 150k vocabulary are
# 150 MB of float32 logits.
LOGIT_PIECE_ROWS = 256


@dataclass
class DecoderModel(LoadedModel):
    network: DecoderLM
    group: ShardGroup
    config: Any  # the Hugging Face config the network was built from
    path: Path
    device: torch.device
    dtype: torch.dtype
    architecture: str
    vocab_size: int
    embedding_rows: int
    max_position_embeddings: int
    attn_implementation: str = "sdpa"
    matmul: str = "exact"
    implementation: str = "decoder"

    @property
    def text_config(self) -> Any:
        return self.config.get_text_config()

    @property
    def compiled_layers(self) -> bool:
        return self.network.graph is not None

    @property
    def cuda_graph_buckets(self) -> tuple[int, ...]:
        graphs = self.network.step_graphs
        return graphs.captured if graphs is not None else ()

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def kv_heads_share(self) -> tuple[int, int]:
        start, end = self.network.share.kv_heads
        return end - start, self.network.shape.kv_heads

    def agree_min(self, value: int) -> int:
        return int(self.group.all_reduce_min(torch.tensor([value], dtype=torch.int64, device=self.device)).item())

    # How packed passes attend their segments (`decoder.SEGMENT_KERNELS`): "split" on CPU; off CPU "flex" where
    # `choose_segment_kernel` found FlexAttention working at load, else "sdpa". Tests set each on CPU.
    segment_kernel: str = "split"

    @property
    def segment_attention(self) -> str:
        return self.segment_kernel

    def choose_segment_kernel(self) -> str:
        """Sets `segment_kernel` for this device and returns it: off CPU one FlexAttention call per layer, if its
        compiled kernel builds here and equals the per-segment SDPA calls on a small packed layout (a cached prefix,
        two requests, a question tree); otherwise (logged) those SDPA calls."""
        if self.device.type == "cpu":
            self.segment_kernel = "split"
            return self.segment_kernel
        try:
            worst = _flex_probe(self.network, self.dtype, self.device)
            tolerance = 1e-4 if self.dtype == torch.float32 else 3e-2
            if not worst <= tolerance:
                raise ValueError(f"FlexAttention differs from SDPA by {worst:.2e} (tolerance {tolerance})")
            self.segment_kernel = "flex"
        except Exception as err:  # any failure to build or run the kernel: the SDPA calls serve
            logger.warning(
                "segment attention falls back to one SDPA call per segment", extra={"fields": {"why": str(err)}}
            )
            self.segment_kernel = "sdpa"
        return self.segment_kernel

    def packs_segments(self) -> bool:
        return True

    def score(self, request: ScoreRequest) -> ScoredPass:
        return self.launch(request).finish()

    def launch(self, request: ScoreRequest) -> LaunchedPass:
        """The pass queued on the device: its inputs, the score indices included, copied there before the layers (a
        copy to the device waits for what is queued before it), the layers, then the kept rows' scores, computed
        LOGIT_PIECE_ROWS rows at a time (a packed batch may keep thousands of rows, and each costs a full-vocabulary
        row of float32 logits: 600 kB for 150k tokens) and copied to the host in `finish`, once for the pass."""
        if isinstance(request.attention_mask, dict):
            raise ValueError("the decoder has full-attention layers only; it takes one mask, not one per layer type")
        past_length = int(request.past[0].shape[2]) if request.past is not None else 0
        if self.group.world_size > 1:  # the digest reads every token: 2 ms of a 40,000-token pass, for ranks only
            self.group.check_same(
                "the forward pass (tokens, past tokens, kept rows, digest)",
                [len(request.token_ids), past_length, len(request.keep), _digest(request)],
            )
        device = self.device
        pieces = _LogitPieces.of(request)
        with torch.inference_mode():
            ids = to_device(request.token_ids, device, torch.long)
            positions = (
                to_device(request.position_ids, device, torch.long)
                if request.position_ids is not None
                else torch.arange(len(request.token_ids), device=device)
            )
            indices = to_device(pieces.indices, device, torch.long)
            past = None
            if request.past is not None:
                past_keys, past_values = request.past
                past = [LayerKV(past_keys[layer], past_values[layer]) for layer in range(past_keys.shape[0])]
            kept, new = self.network.hidden_states(
                ids, positions, request.attention_mask, past, request.keep, request.segments, self.segment_kernel
            )
            head = self.network.head
            labels, greedy = [], []
            for start, end, label_rows, label_tokens, greedy_rows in pieces.slices(indices):
                piece_labels, piece_greedy = vocab_parallel_score_tensors(
                    head.local_logits(kept[start:end]), head.start, self.group, label_rows, label_tokens, greedy_rows
                )
                labels.append(piece_labels)
                greedy.append(piece_greedy)
            label_values, greedy_tokens = torch.cat(labels).double(), torch.cat(greedy)
            keys: torch.Tensor | None = None
            values: torch.Tensor | None = None
            if request.return_key_values:
                keys = torch.stack([kv.keys for kv in new])
                values = torch.stack([kv.values for kv in new])
            ready = None
            if device.type == "cuda":
                # The scores' copy to the host is queued now, behind the pass and ahead of whatever the host queues
                # next (the next batch's pass): `finish` waits for this pass's scores alone.
                label_values, greedy_tokens = _queued_to_host(label_values), _queued_to_host(greedy_tokens)
                ready = torch.cuda.Event()
                ready.record()

        def collect() -> tuple[list[float], list[int]]:
            if ready is not None:
                ready.synchronize()
            return pieces.collect(label_values, greedy_tokens)

        return LaunchedPass(keys, values, collect, in_flight=ready is not None)

    def probe(self) -> float:
        weight = self.network.embedding.weight
        with torch.inference_mode():
            rows = weight[:8, :64].float()
            value = float((rows @ rows.T).sum().item())
        return value

    def weight_bytes(self) -> int:
        return self.network.parameter_bytes()

    def close(self) -> None:
        self.group.close()


def _queued_to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of device `tensor` in pinned host memory, queued on the device's stream (valid once it has run)."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


@dataclass(frozen=True)
class _LogitPieces:
    """A pass's kept rows in pieces of LOGIT_PIECE_ROWS, with each piece's score indices (its own label rows, label
    tokens and greedy rows) laid end to end in `indices`, one host list the pass copies to the device at once."""

    bounds: tuple[tuple[int, int, int, int], ...]  # per piece: first row, labels, greedy rows, offset in indices
    indices: list[int]
    label_order: list[int]  # the request's label index of each label value, in piece order
    greedy_order: list[int]
    labels: int
    greedy: int

    @classmethod
    def of(cls, request: ScoreRequest) -> _LogitPieces:
        count = max(-(-len(request.keep) // LOGIT_PIECE_ROWS), 1)  # one piece even with no kept rows
        label_at: list[list[int]] = [[] for _ in range(count)]
        greedy_at: list[list[int]] = [[] for _ in range(count)]
        for k, row in enumerate(request.label_rows):
            label_at[row // LOGIT_PIECE_ROWS].append(k)
        for k, row in enumerate(request.greedy_rows):
            greedy_at[row // LOGIT_PIECE_ROWS].append(k)
        bounds: list[tuple[int, int, int, int]] = []
        indices: list[int] = []
        for number, (labels, greedy) in enumerate(zip(label_at, greedy_at, strict=True)):
            start = number * LOGIT_PIECE_ROWS
            bounds.append((start, len(labels), len(greedy), len(indices)))
            indices += [request.label_rows[k] - start for k in labels]
            indices += [request.label_tokens[k] for k in labels]
            indices += [request.greedy_rows[k] - start for k in greedy]
        return cls(
            bounds=tuple(bounds),
            indices=indices,
            label_order=[k for labels in label_at for k in labels],
            greedy_order=[k for greedy in greedy_at for k in greedy],
            labels=len(request.label_rows),
            greedy=len(request.greedy_rows),
        )

    def slices(self, indices: torch.Tensor) -> list[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per piece: its rows [start, end) and its label rows, label tokens and greedy rows, as views of `indices`
        (`self.indices` on the device)."""
        out = []
        for start, labels, greedy, at in self.bounds:
            out.append(
                (
                    start,
                    start + LOGIT_PIECE_ROWS,
                    indices[at : at + labels],
                    indices[at + labels : at + 2 * labels],
                    indices[at + 2 * labels : at + 2 * labels + greedy],
                )
            )
        return out

    def collect(self, label_values: torch.Tensor, greedy_tokens: torch.Tensor) -> tuple[list[float], list[int]]:
        """The pass's scores on the host, in the request's order: the pass's one wait for the device."""
        labels: list[float] = [0.0] * self.labels
        greedy: list[int] = [0] * self.greedy
        for k, value in zip(self.label_order, label_values.double().tolist(), strict=True):
            labels[k] = value
        for k, token in zip(self.greedy_order, greedy_tokens.tolist(), strict=True):
            greedy[k] = token
        return labels, greedy


def _digest(request: ScoreRequest) -> int:
    """A checksum of what defines the pass, the same on every rank that was sent the same reads."""
    parts = [
        request.token_ids,
        request.position_ids or [],
        request.keep,
        request.label_rows,
        request.label_tokens,
        request.greedy_rows,
        [bound for segment in request.segments.segments for bound in (segment.start, segment.end)]
        if request.segments is not None
        else [],
    ]
    flat = [value for part in parts for value in (len(part), *part)]
    return zlib.crc32(np.asarray(flat, dtype=np.int64).tobytes())


def load_decoder_model(
    path: Path,
    config: Any,
    dtype: torch.dtype,
    device: torch.device,
    parallel: ParallelConfig,
    matmul: str = "exact",
    matmul_record: Path | None = None,
) -> DecoderModel:
    """Joins the group, resolves `matmul` (auto: timed on this CPU, one mode for all ranks; `matmul_record` keeps
    the probes' fastest times across loads, `layers.MatmulProbe.kept_with`), reads this rank's weight slices, then
    waits for every rank to be loaded."""
    group = join_group(parallel, device)
    started = time.perf_counter()
    try:
        shape = DecoderShape.from_config(config)
        start, end = partition(shape.intermediate_size, group.world_size, group.rank)
        with Checkpoint(path) as checkpoint:
            # auto times the GEMMs at this rank's widest linear, the fused gate/up projection, with weights as
            # exact in bfloat16 as the checkpoint's (a split weight is then one bfloat16 part, not two).
            bfloat16_weights = checkpoint.stored_dtypes("_proj.weight") == {"BF16"}
            widest = (shape.hidden_size, 2 * (end - start))
            # `--matmul auto` in half precision may widen the linears to float32: this rank's share of them, at
            # 4 bytes a value instead of the dtype's, must fit in the memory free now (`layers.widen_fits_memory`).
            widened_extra = checkpoint.elements("_proj.weight") // group.world_size * (4 - dtype.itemsize)
            widen_fits = widen_fits_memory(widened_extra, free_memory_bytes(device))
            matmul = resolve_matmul(
                matmul, device.type, dtype, widest, group, bfloat16_weights, matmul_record, widen_fits
            )
            network = DecoderLM.load(checkpoint, config, group, dtype, device, matmul)
            bytes_read = checkpoint.bytes_read
        group.startup_barrier()
    except BaseException:
        group.close()
        raise
    text_config = config.get_text_config()
    architectures = getattr(config, "architectures", None) or [type(config).__name__]
    model = DecoderModel(
        network=network,
        group=group,
        config=config,
        path=path,
        device=device,
        dtype=dtype,
        architecture=str(architectures[0]),
        vocab_size=network.shape.vocab_size,
        embedding_rows=network.embedding.rows,
        max_position_embeddings=int(getattr(text_config, "max_position_embeddings", 0) or 0),
        matmul=matmul,
    )
    if model.max_position_embeddings <= 0:
        raise ValueError(f"{path}: config has no max_position_embeddings")
    share = network.share
    logger.info(
        "rank weights loaded",
        extra={
            "fields": {
                "rank": group.rank,
                "world_size": group.world_size,
                "kv_heads": list(share.kv_heads),
                "heads": list(share.heads),
                "intermediate": list(share.intermediate),
                "vocab": list(share.vocab),
                "checkpoint_bytes_read": bytes_read,
                "seconds": round(time.perf_counter() - started, 3),
            }
        },
    )
    return model


def _flex_probe(network: DecoderLM, dtype: torch.dtype, device: torch.device) -> float:
    """The largest difference between FlexAttention and per-segment SDPA on small packed layouts with this model's
    heads (random queries and keys), every pass and kept-rows form a served batch takes, so that their kernels are
    compiled here, at load, and never while serving: two requests with a question tree each, one after cached keys
    (several tiles); one short request (one tile); 8 kept rows and 1."""
    attention = network.layers[0].attention
    assert isinstance(attention, Attention)
    tree = np.tri(24, dtype=bool)
    tree[12:, 4:12] = False  # two branches after a shared stem of 4 tokens
    layouts = (
        (
            40,
            SegmentLayout(
                (
                    AttentionSegment(0, 150, ()),
                    AttentionSegment(150, 174, (KeyRange(NEW, 0, 150),), tree),
                    AttentionSegment(174, 300, (KeyRange(PAST, 0, 40),)),
                    AttentionSegment(300, 324, (KeyRange(PAST, 0, 40), KeyRange(NEW, 174, 300)), tree),
                )
            ),
        ),
        (0, SegmentLayout((AttentionSegment(0, 36, ()), AttentionSegment(36, 60, (KeyRange(NEW, 0, 36),), tree)))),
    )
    generator = torch.Generator().manual_seed(0)

    def random(heads: int, tokens: int) -> torch.Tensor:
        return torch.randn(heads, tokens, attention.head_dim, generator=generator).to(device=device, dtype=dtype)

    differences: list[torch.Tensor] = []
    scale = attention.head_dim**-0.5
    for past_length, layout in layouts:
        query = random(attention.heads, layout.tokens)
        new = LayerKV(random(attention.kv_heads, layout.tokens), random(attention.kv_heads, layout.tokens))
        past = LayerKV(random(attention.kv_heads, past_length), random(attention.kv_heads, past_length))
        with torch.inference_mode():
            plans = [SegmentPlan.of(layout, past_length, dtype, device, kernel) for kernel in ("flex", "sdpa")]
            outputs = [plan.attend(query, new, past, scale) for plan in plans]
            for keep in (list(range(layout.tokens - 8, layout.tokens)), [layout.tokens - 1]):
                kept = [SegmentRows.of(keep, plan, layout, device) for plan in plans]
                outputs += [rows.attend(query, new, past, scale) for rows in kept]
        differences += [
            (flex.float() - sdpa.float()).abs().max() for flex, sdpa in zip(outputs[0::2], outputs[1::2], strict=True)
        ]
    return float(torch.stack(differences).max().item())  # NaN stays NaN
