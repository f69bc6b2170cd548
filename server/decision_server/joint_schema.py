"""Clef-Flash and Clef-Omni: a transformers backbone (Qwen3.5, or the Qwen3-Omni thinker) whose final hidden states
feed the joint-schema head (`joint_head.py`). One pooled read is one backbone forward over the whole prompt; media
placeholders (a stretch of the prompt the router marks) are expanded by the folder's own processor."""

from __future__ import annotations

import hashlib
import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from decision_server.architectures import JointSchemaFamily, joint_schema_family
from decision_server.distributed import ParallelConfig, ShardGroup, join_group
from decision_server.engines.types import InvalidReadError
from decision_server.joint_head import JointSchemaHead, PooledQuestion, PooledScores, load_head
from decision_server.media import (
    AUDIO,
    IMAGE,
    VIDEO,
    DecodedVideo,
    MediaError,
    MediaItem,
    MediaPrompt,
    decode_audio,
    decode_image,
    decode_video,
    has_audio,
)
from decision_server.model_base import pick_attn_implementation
from decision_server.multimodal import PROCESSOR_FILES
from decision_server.transformers_model import TransformersModel

logger = logging.getLogger(__name__)


@dataclass
class JointSchemaModel(TransformersModel):
    """A Clef checkpoint: transformers' backbone, its output embedding (the head's lexical table) and the head."""

    head: JointSchemaHead | None = None
    family: JointSchemaFamily | None = None
    processor: Any = None
    pooled_modalities: tuple[str, ...] = field(default_factory=tuple)
    # Whether the video processor takes `cap_pixels_per_frame` (checked once at load).
    caps_frame_pixels: bool = False
    # Above world size 1 the backbone is split by transformers' tensor-parallel plan over this group; the head (and
    # the vision and audio towers) run whole on every rank, on the backbone's replicated final hidden states.
    group: ShardGroup | None = None
    _lexical: torch.Tensor | None = None

    @property
    def rank(self) -> int:
        return self.group.rank if self.group is not None else 0

    @property
    def world_size(self) -> int:
        return self.group.world_size if self.group is not None else 1

    def close(self) -> None:
        if self.group is not None:
            self.group.close()

    def weight_bytes(self) -> int:
        """Bytes this rank holds: a split parameter counts its local shard."""
        total = 0
        for parameter in self.module.parameters():
            local = getattr(parameter, "to_local", None)
            tensor = local() if callable(local) else parameter
            total += tensor.numel() * tensor.element_size()
        return total

    @property
    def modalities(self) -> tuple[str, ...]:
        return self.pooled_modalities

    @property
    def text_config(self) -> Any:
        config = self.module.config
        thinker = getattr(config, "thinker_config", None)
        return (thinker or config).get_text_config()

    def _backbone(self) -> Any:
        thinker = getattr(self.module, "thinker", None)
        return thinker.model if thinker is not None else self.module.model

    def output_embedding(self) -> torch.Tensor:
        if self._lexical is None:
            thinker = getattr(self.module, "thinker", None)
            # Whole on every rank: under tensor parallelism the LM head may be a sharded DTensor.
            self._lexical = _whole((thinker or self.module).lm_head.weight)
        return self._lexical

    def _same_pass(self, rows: Sequence[Sequence[int]], tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Every rank must run the same backbone forward (the router sends every rank the same reads); a rank
        that would not is an error here, before the forward's collectives, never a silently wrong result."""
        if self.group is None:
            return
        flat = [value for row in rows for value in (len(row), *row)]
        digest = zlib.crc32(torch.tensor(flat, dtype=torch.int64).numpy().tobytes())
        self.group.check_same(
            "the pooled forward (prompts, media tensors, digest)", [len(rows), len(tensors or {}), digest]
        )

    def probe(self) -> float:
        weight = self.output_embedding()
        with torch.inference_mode():
            rows = weight[:8, :64].float()
            return float((rows @ rows.T).sum().item())

    def hidden_states(self, input_ids: Sequence[int], tensors: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """`[L, hidden]` final hidden states (after the backbone's last norm) of one prompt."""
        device = self.device
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=device)
        extra: dict[str, Any] = {}
        for key, value in (tensors or {}).items():
            if key == "use_audio_in_video":
                extra[key] = bool(value)
                continue
            value = value.to(device)
            extra[key] = value.to(self.dtype) if value.is_floating_point() else value
        self._same_pass([list(input_ids)], tensors)
        if self.prepare_forward is not None:
            self.prepare_forward(self.module)
        with torch.inference_mode():
            # An explicit mask: Qwen3-Omni drops its M-RoPE media positions without one.
            output = self._backbone()(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **extra)
        hidden: torch.Tensor = _whole(output.last_hidden_state)[0]
        return hidden

    def padded_hidden_states(self, prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """`[L_i, hidden]` final hidden states of several text-only prompts from one forward, right-padded to the
        longest. Exact to each prompt's own pass up to float rounding, with no padding mask: the backbone is causal
        (attention, and Qwen3.5's gated delta nets and their causal convolutions), so pads after every real token
        change nothing before them, and a row's positions are 0..L-1 as alone. The mask is all ones on purpose: a
        mask over the pads would only hide them from themselves, and an explicit mask takes attention off the causal
        path a solo read runs on."""
        device = self.device
        longest = max(len(ids) for ids in prompts)
        pad = int(getattr(self.text_config, "pad_token_id", None) or 0)
        ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(list(prompt), dtype=torch.long)
        ids = ids.to(device)
        self._same_pass(prompts)
        if self.prepare_forward is not None:
            self.prepare_forward(self.module)
        with torch.inference_mode():
            output = self._backbone()(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        hidden: torch.Tensor = _whole(output.last_hidden_state)
        return [hidden[row, : len(prompt)] for row, prompt in enumerate(prompts)]

    def score_pooled(
        self, input_ids: Sequence[int], questions: Sequence[PooledQuestion], media: MediaPrompt | None = None
    ) -> PooledScores:
        started = time.perf_counter()
        ids = media.input_ids if media is not None else tuple(input_ids)
        hidden = self.hidden_states(ids, media.tensors if media is not None else None)
        self.synchronize()
        backbone = time.perf_counter() - started
        logits, head = self._head(hidden, ids, questions)
        return PooledScores(
            logits=logits,
            tokens=len(ids),
            media_tokens=media.media_tokens if media is not None else 0,
            backbone_seconds=backbone,
            head_seconds=head,
        )

    def score_pooled_padded(
        self, reads: Sequence[tuple[Sequence[int], Sequence[PooledQuestion]]]
    ) -> list[PooledScores]:
        """Several text-only pooled reads: one padded backbone forward (`padded_hidden_states`), then the head on each
        read's own hidden states. The forward's time is shared out by tokens."""
        started = time.perf_counter()
        hiddens = self.padded_hidden_states([ids for ids, _ in reads])
        self.synchronize()
        backbone = time.perf_counter() - started
        total = sum(len(ids) for ids, _ in reads)
        scores = []
        for (ids, questions), hidden in zip(reads, hiddens, strict=True):
            logits, head = self._head(hidden, ids, questions)
            scores.append(
                PooledScores(
                    logits=logits,
                    tokens=len(ids),
                    media_tokens=0,
                    backbone_seconds=backbone * len(ids) / total,
                    head_seconds=head,
                )
            )
        return scores

    def _head(
        self, hidden: torch.Tensor, ids: Sequence[int], questions: Sequence[PooledQuestion]
    ) -> tuple[list[list[float]], float]:
        if self.head is None:
            raise RuntimeError("a joint-schema model without its head")
        started = time.perf_counter()
        with torch.inference_mode():
            token_ids = torch.tensor(list(ids), dtype=torch.long, device=self.device)
            logits = self.head(hidden, token_ids, self.output_embedding(), questions)
            values = [[float(v) for v in row.float().tolist()] for row in logits]
        return values, time.perf_counter() - started

    def prepare_pooled_media(
        self, read_id: int, prompt: Sequence[int], media_range: tuple[int, int], items: Sequence[MediaItem]
    ) -> MediaPrompt:
        """The prompt with its media stretch `prompt[start:end]` expanded by the folder's processor, and the
        processor's tensors (token type ids padded over the text around the stretch). Safe from several threads."""
        if self.processor is None or self.family is None:
            raise InvalidReadError(read_id, "this model folder has no processor: it reads no media")
        start, end = media_range
        if not 0 <= start <= end <= len(prompt):
            raise InvalidReadError(read_id, f"media stretch [{start}, {end}) is outside the prompt of {len(prompt)}")
        for item in items:
            if item.modality not in self.pooled_modalities:
                raise MediaError(item.name, f"this model does not take {item.modality} inputs")
            if hashlib.sha256(item.data).hexdigest() != item.sha256:
                raise MediaError(item.name, "its sha256 does not match its bytes")
        images = [decode_image(item) for item in items if item.modality == IMAGE]
        video_items = [item for item in items if item.modality == VIDEO]
        audio_items = [item for item in items if item.modality == AUDIO]
        videos = [self._video(item) for item in video_items]
        rate = int(getattr(getattr(self.processor, "feature_extractor", None), "sampling_rate", 16_000))
        audio = [decode_audio(item, rate) for item in audio_items]
        # Omni hears a video's soundtrack with it when every video has one (the reference's rule); then separate
        # audio clips cannot be placed, and are refused. Flash ignores soundtracks.
        audio_in_video = self.family.omni and bool(video_items) and all(has_audio(item) for item in video_items)
        if audio_in_video and audio_items:
            raise MediaError(audio_items[0].name, "audio clips cannot be read with videos that have soundtracks")
        if audio_in_video:
            audio = [decode_audio(item, rate) for item in video_items]
        tokenizer = self.processor.tokenizer
        segment = list(prompt[start:end])
        for modality, attribute, count in (
            (IMAGE, "image_token", len(images)),
            (VIDEO, "video_token", len(video_items)),
            (AUDIO, "audio_token", len(audio_items)),
        ):
            token_text = getattr(self.processor, attribute, None)
            if token_text is None:
                if count:
                    raise InvalidReadError(read_id, f"this model's processor has no {modality} placeholder")
                continue
            token = int(tokenizer.convert_tokens_to_ids(token_text))
            placeholders = segment.count(token)
            outside = token in prompt[:start] or token in prompt[end:]
            if placeholders != count or outside:
                raise InvalidReadError(
                    read_id,
                    f"the media stretch has {placeholders} {modality} placeholders for {count} {modality} items",
                )
        text = tokenizer.decode(segment, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if tokenizer(text, add_special_tokens=False)["input_ids"] != segment:
            raise InvalidReadError(read_id, "the media stretch does not decode to text that encodes back to it")
        kwargs: dict[str, Any] = {"add_special_tokens": False, **(self.family.processor_kwargs or {})}
        if self.family.mm_token_type_ids:
            kwargs["return_mm_token_type_ids"] = True
        if videos:
            # Frames sampled at 2 fps already (decode_video): the processor places them in time from the metadata.
            kwargs["video_metadata"] = [video.metadata() for video in videos]
            kwargs["do_sample_frames"] = False
            if self.caps_frame_pixels:
                # transformers' default said out loud, as the next-token media reads do (it warns otherwise).
                kwargs["cap_pixels_per_frame"] = False
        if audio:
            kwargs["audio"] = audio
        if audio_in_video:
            # Each soundtrack is its video's audio slot: the processor interleaves it with the frames.
            kwargs["load_audio_from_video"] = True
            kwargs["audio_from_video_indices"] = list(range(len(video_items)))
        try:
            output = self.processor(
                text=[text],
                images=images or None,
                videos=[video.frames for video in videos] or None,
                return_tensors="pt",
                **kwargs,
            )
        except (ValueError, OSError) as error:
            first = items[0].name if items else "media"
            raise MediaError(first, f"the processor cannot take it: {error}") from None
        expanded = [int(t) for t in output["input_ids"][0].tolist()]
        ids = (*prompt[:start], *expanded, *prompt[end:])
        tensors: dict[str, torch.Tensor] = {}
        for key, value in output.items():
            if key in ("input_ids", "attention_mask") or not isinstance(value, torch.Tensor):
                continue
            if key == "mm_token_type_ids":
                before = torch.zeros((1, start), dtype=value.dtype)
                after = torch.zeros((1, len(prompt) - end), dtype=value.dtype)
                value = torch.cat((before, value, after), dim=1)
            tensors[key] = value
        if audio_in_video:
            # The thinker's M-RoPE interleaves the soundtrack with the frames only when told (a 0-d flag, so it
            # travels with the tensors).
            tensors["use_audio_in_video"] = torch.tensor(True)
        return MediaPrompt(input_ids=ids, tensors=tensors, media_tokens=len(ids) - len(prompt))

    def _video(self, item: MediaItem) -> DecodedVideo:
        """2 fps frames within the video processor's bounds; Omni caps each frame at 256·32·32 pixels as the
        reference reads it (even sides, bilinear)."""
        processor = getattr(self.processor, "video_processor", None)
        bounds = (int(getattr(processor, "min_frames", 4)), int(getattr(processor, "max_frames", 768)))
        video = decode_video(item, *bounds)
        temporal = int(getattr(processor, "temporal_patch_size", 1) or 1)
        if len(video.indices) < temporal:
            raise MediaError(item.name, f"{len(video.indices)} frame(s); this model reads videos of {temporal} or more")
        if self.family is not None and self.family.omni:
            video = replace(video, frames=cap_frame_pixels(video.frames))
        return video


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor-parallel DTensor gathered whole on this rank; any other tensor as it is."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


OMNI_MAX_FRAME_PIXELS = 256 * 32 * 32


def cap_frame_pixels(frames: Any) -> Any:
    """(N, H, W, 3) uint8 frames shrunk so each has at most 262,144 pixels, sides rounded to even (bilinear, rounded
    back to uint8), as Clef-Omni's reference reads video frames; smaller frames are kept as they are."""
    import numpy as np

    height, width = int(frames.shape[1]), int(frames.shape[2])
    if height * width <= OMNI_MAX_FRAME_PIXELS:
        return frames
    scale = (OMNI_MAX_FRAME_PIXELS / (width * height)) ** 0.5
    size = (max(2, round(height * scale / 2) * 2), max(2, round(width * scale / 2) * 2))
    tensor = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    resized = torch.nn.functional.interpolate(tensor, size=size, mode="bilinear").round()
    return resized.to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def load_joint_schema_model(
    path: Path, torch_dtype: torch.dtype, device: torch.device, parallel: ParallelConfig | None = None
) -> JointSchemaModel:
    """The backbone through transformers (above world size 1 split by transformers' tensor-parallel plan for the
    text model), then the head (refused, naming the tensor, if its config and weights disagree), then the processor
    when the folder ships one."""
    import transformers

    from decision_server.architectures import architecture_of
    from decision_server.decoder import UnsupportedModelError

    parallel = parallel or ParallelConfig()
    config = transformers.AutoConfig.from_pretrained(path)
    architecture = architecture_of(config)
    family = joint_schema_family(architecture, path)
    if family is None:
        raise ValueError(f"{path}: {architecture} with joint_head_config.json is not a joint-schema model")
    model_class = getattr(transformers, family.model_class)
    attn = pick_attn_implementation(device, needs_custom_mask=False)
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "attn_implementation": attn}
    if family.omni:
        # The talker and the vocoder speak; a decision model only reads.
        kwargs["enable_audio_output"] = False
    group: ShardGroup | None = None
    if parallel.world_size > 1:
        text = (getattr(config, "thinker_config", None) or config).get_text_config()
        split = _tensor_parallel_refusal(text, parallel.world_size)
        if split is not None:
            raise UnsupportedModelError(
                f"{path}: cannot serve {family.name} with --world-size {parallel.world_size}: {split}"
            )
        from transformers.distributed import DistributedConfig

        # transformers' plan splits the text model's attention heads and MLPs (column then row, one all-reduce
        # each) over the default process group, which join_group has just formed.
        group = join_group(parallel, device)
        kwargs["distributed_config"] = DistributedConfig(tp_size=parallel.world_size)
    try:
        module = model_class.from_pretrained(path, **kwargs)
        if group is not None:
            group.startup_barrier()
    except BaseException:
        if group is not None:
            group.close()
        raise
    if group is None:
        module.to(device)
    module.eval()
    module.requires_grad_(False)
    model = JointSchemaModel(
        module=module,
        path=path,
        device=device,
        dtype=torch_dtype,
        architecture=architecture,
        vocab_size=0,
        embedding_rows=0,
        max_position_embeddings=0,
        attn_implementation=attn,
        prepare_forward=family.prepare_forward,
        family=family,
        group=group,
    )
    text = model.text_config
    # Gathered whole here, while every rank loads in step: Health's probe reads it and must never run a collective.
    lm_head = model.output_embedding()
    model.vocab_size = int(lm_head.shape[0])
    model.embedding_rows = int(model._backbone().get_input_embeddings().weight.shape[0])
    model.max_position_embeddings = int(getattr(text, "max_position_embeddings", 0) or 0)
    model.head = load_head(path, int(text.hidden_size), device, torch_dtype)
    if any((path / name).is_file() for name in PROCESSOR_FILES) and family.media:
        from transformers import AutoProcessor

        model.processor = AutoProcessor.from_pretrained(path)
        parts = {IMAGE: "image_processor", VIDEO: "video_processor", AUDIO: "feature_extractor"}
        model.pooled_modalities = tuple(
            m for m in sorted(family.media) if getattr(model.processor, parts[m], None) is not None
        )
        video_processor = getattr(model.processor, "video_processor", None)
        model.caps_frame_pixels = hasattr(video_processor, "cap_pixels_per_frame")
    logger.info(
        "joint-schema head loaded",
        extra={
            "fields": {
                "path": str(path),
                "family": family.name,
                "modalities": list(model.pooled_modalities),
                "rank": model.rank,
                "world_size": model.world_size,
            }
        },
    )
    return model


def _tensor_parallel_refusal(text_config: Any, world_size: int) -> str | None:
    """Why transformers' plan cannot split this text model over `world_size` ranks (None when it can): it splits
    attention by whole heads (query and key/value) and the MLPs by columns, so each must divide evenly."""
    counts = {
        "attention heads": getattr(text_config, "num_attention_heads", None),
        "key/value heads": getattr(text_config, "num_key_value_heads", None),
        "MLP columns": getattr(text_config, "intermediate_size", None),
    }
    if getattr(text_config, "num_experts", None):
        counts["expert MLP columns"] = getattr(text_config, "moe_intermediate_size", None)
    for what, count in counts.items():
        if count is not None and int(count) % world_size:
            return f"its {int(count)} {what} do not split evenly over {world_size} ranks"
    return None
