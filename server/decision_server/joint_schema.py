"""Clef-Flash and Clef-Omni: a transformers backbone (Qwen3.5, or the Qwen3-Omni thinker) whose final hidden states
feed the joint-schema head (`joint_head.py`). One pooled read is one backbone forward over the whole prompt; media
placeholders (a stretch of the prompt the router marks) are expanded by the folder's own processor."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from decision_server.architectures import JointSchemaFamily, joint_schema_family
from decision_server.engines.types import InvalidReadError
from decision_server.joint_head import JointSchemaHead, PooledQuestion, load_head
from decision_server.media import IMAGE, MediaError, MediaItem, MediaPrompt, decode_image
from decision_server.model_base import pick_attn_implementation
from decision_server.multimodal import PROCESSOR_FILES
from decision_server.transformers_model import TransformersModel

logger = logging.getLogger(__name__)


@dataclass
class PooledScores:
    """One pooled read's head output and where its time went."""

    logits: list[list[float]]
    tokens: int
    media_tokens: int
    backbone_seconds: float
    head_seconds: float


@dataclass
class JointSchemaModel(TransformersModel):
    """A Clef checkpoint: transformers' backbone, its output embedding (the head's lexical table) and the head."""

    head: JointSchemaHead | None = None
    family: JointSchemaFamily | None = None
    processor: Any = None
    pooled_modalities: tuple[str, ...] = field(default_factory=tuple)

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
        thinker = getattr(self.module, "thinker", None)
        weight: torch.Tensor = (thinker or self.module).lm_head.weight
        return weight

    def probe(self) -> float:
        weight = self.output_embedding()
        with torch.inference_mode():
            rows = weight[:8, :64].float()
            return float((rows @ rows.T).sum().item())

    def hidden_states(self, input_ids: Sequence[int], tensors: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """`[L, hidden]` final hidden states (after the backbone's last norm) of one prompt."""
        device = self.device
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=device)
        extra = {}
        for key, value in (tensors or {}).items():
            value = value.to(device)
            extra[key] = value.to(self.dtype) if value.is_floating_point() else value
        if self.prepare_forward is not None:
            self.prepare_forward(self.module)
        with torch.inference_mode():
            # An explicit mask: Qwen3-Omni drops its M-RoPE media positions without one.
            output = self._backbone()(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **extra)
        hidden: torch.Tensor = output.last_hidden_state[0]
        return hidden

    def score_pooled(
        self, input_ids: Sequence[int], questions: Sequence[PooledQuestion], media: MediaPrompt | None = None
    ) -> PooledScores:
        if self.head is None:
            raise RuntimeError("a joint-schema model without its head")
        started = time.perf_counter()
        ids = media.input_ids if media is not None else tuple(input_ids)
        hidden = self.hidden_states(ids, media.tensors if media is not None else None)
        self.synchronize()
        backbone = time.perf_counter() - started
        with torch.inference_mode():
            token_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
            logits = self.head(hidden, token_ids, self.output_embedding(), questions)
            values = [[float(v) for v in row.float().tolist()] for row in logits]
        head = time.perf_counter() - started - backbone
        return PooledScores(
            logits=values,
            tokens=len(ids),
            media_tokens=media.media_tokens if media is not None else 0,
            backbone_seconds=backbone,
            head_seconds=head,
        )

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
        images = []
        for item in items:
            if item.modality not in self.pooled_modalities:
                raise MediaError(item.name, f"this model does not take {item.modality} inputs")
            if hashlib.sha256(item.data).hexdigest() != item.sha256:
                raise MediaError(item.name, "its sha256 does not match its bytes")
            images.append(decode_image(item))
        tokenizer = self.processor.tokenizer
        segment = list(prompt[start:end])
        image_token = int(tokenizer.convert_tokens_to_ids(self.processor.image_token))
        placeholders = segment.count(image_token)
        outside = image_token in prompt[:start] or image_token in prompt[end:]
        if placeholders != len(images) or outside:
            raise InvalidReadError(
                read_id, f"the media stretch has {placeholders} image placeholders for {len(images)}"
            )
        text = tokenizer.decode(segment, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if tokenizer(text, add_special_tokens=False)["input_ids"] != segment:
            raise InvalidReadError(read_id, "the media stretch does not decode to text that encodes back to it")
        kwargs: dict[str, Any] = {"add_special_tokens": False, **(self.family.processor_kwargs or {})}
        if self.family.mm_token_type_ids:
            kwargs["return_mm_token_type_ids"] = True
        try:
            output = self.processor(text=[text], images=images or None, return_tensors="pt", **kwargs)
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
        return MediaPrompt(input_ids=ids, tensors=tensors, media_tokens=len(ids) - len(prompt))


def load_joint_schema_model(path: Path, torch_dtype: torch.dtype, device: torch.device) -> JointSchemaModel:
    """The backbone through transformers, then the head (refused, naming the tensor, if its config and weights
    disagree), then the processor when the folder ships one."""
    import transformers

    from decision_server.architectures import architecture_of
    from decision_server.model import load_config

    config = load_config(path)
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
    module = model_class.from_pretrained(path, **kwargs)
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
    )
    text = model.text_config
    lm_head = model.output_embedding()
    model.vocab_size = int(lm_head.shape[0])
    model.embedding_rows = int(model._backbone().get_input_embeddings().weight.shape[0])
    model.max_position_embeddings = int(getattr(text, "max_position_embeddings", 0) or 0)
    model.head = load_head(path, int(text.hidden_size), device, torch_dtype)
    if any((path / name).is_file() for name in PROCESSOR_FILES) and family.media:
        from transformers import AutoProcessor

        model.processor = AutoProcessor.from_pretrained(path)
        takes_images = getattr(model.processor, "image_processor", None) is not None
        model.pooled_modalities = tuple(m for m in sorted(family.media) if m == IMAGE and takes_images)
    logger.info(
        "joint-schema head loaded",
        extra={"fields": {"path": str(path), "family": family.name, "modalities": list(model.pooled_modalities)}},
    )
    return model
