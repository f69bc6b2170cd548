"""The joint-schema head of Clef-Flash / Clef-Omni (spec/PROMPTS.md §6): every option of every question of one
prompt scored from the backbone's final hidden states. Loaded from `joint_head.safetensors` and its config; a
config that does not match the weights is refused at startup, naming the tensor."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HEAD_CONFIG = "joint_head_config.json"
HEAD_WEIGHTS = "joint_head.safetensors"
CONFIG_KEYS = ("hidden_size", "width", "routing_layers", "layers", "heads", "feedforward")
QUESTION_TYPES = 3
# Both learned logit scales are capped at 100 (the checkpoint clamps their log at ln 100).
MAX_LOG_SCALE = math.log(100.0)


class HeadConfigError(ValueError):
    """The head's config and weights disagree (or either is malformed); the message names the tensor or key."""


@dataclass(frozen=True)
class PooledQuestion:
    """One question of a pooled prompt: its type id (noul 0, choice 1, score 2), the span of its instructions and
    of each option, as absolute [start, end) token positions of the prompt the hidden states are of."""

    type_id: int
    span: tuple[int, int]
    options: tuple[tuple[int, int], ...]


@dataclass
class PooledScores:
    """One pooled read's head output and where its time went."""

    logits: list[list[float]]
    tokens: int
    media_tokens: int
    backbone_seconds: float
    head_seconds: float


class EvidenceRouting(nn.Module):
    """Options attend to the prompt's memory: `x += MHA(LN x, LN mem, LN mem); x += FFN(LN x)`."""

    def __init__(self, width: int, heads: int, feedforward: int) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(width)
        self.memory_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.feedforward_norm = nn.LayerNorm(width)
        # Index 2 is the checkpoint's dropout (no weights): the indices of the two linears stay those it saves.
        self.feedforward = nn.Sequential(
            nn.Linear(width, feedforward), nn.GELU(), nn.Identity(), nn.Linear(feedforward, width)
        )

    def forward(self, options: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        normed = self.memory_norm(memory)
        routed, _ = self.attention(self.query_norm(options), normed, normed, need_weights=False)
        options = options + routed
        out: torch.Tensor = options + self.feedforward(self.feedforward_norm(options))
        return out


class JointSchemaHead(nn.Module):
    """§6's head. Parameter names are the checkpoint's (`joint_head.safetensors` loads with strict names)."""

    def __init__(
        self, hidden_size: int, width: int, routing_layers: int, layers: int, heads: int, feedforward: int
    ) -> None:
        super().__init__()
        self.hidden_norm = nn.LayerNorm(hidden_size)
        self.memory_projection = nn.Linear(hidden_size, width, bias=False)
        self.question_projection = nn.Linear(hidden_size, width, bias=False)
        self.option_question_projection = nn.Linear(hidden_size, width, bias=False)
        self.global_projection = nn.Linear(hidden_size, width, bias=False)
        self.option_context_projection = nn.Linear(hidden_size, width, bias=False)
        self.option_lexical_projection = nn.Linear(hidden_size, width, bias=False)
        self.type_embedding = nn.Embedding(QUESTION_TYPES, width)
        self.evidence_layers = nn.ModuleList(EvidenceRouting(width, heads, feedforward) for _ in range(routing_layers))
        self.option_summary_norm = nn.LayerNorm(width)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(
                d_model=width,
                nhead=heads,
                dim_feedforward=feedforward,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(layers)
        )
        self.field_norm = nn.LayerNorm(width)
        self.option_norm = nn.LayerNorm(width)
        self.residual_scorer = nn.Sequential(nn.Linear(width * 4, width), nn.GELU(), nn.Identity(), nn.Linear(width, 1))
        self.prior_logit_scale = nn.Parameter(torch.zeros(()))
        self.joint_logit_scale = nn.Parameter(torch.zeros(()))
        self.residual_gate = nn.Parameter(torch.zeros(()))

    def forward(
        self, hidden: torch.Tensor, token_ids: torch.Tensor, lm_head: torch.Tensor, questions: Sequence[PooledQuestion]
    ) -> list[torch.Tensor]:
        """Per question, its options' logits (in the prompt's option order), from one prompt's `[L, hidden]` final
        hidden states, its `[L]` token ids and the backbone's output embedding `[vocab, hidden]`."""
        device = hidden.device
        h = self.hidden_norm(hidden)
        memory = self.memory_projection(h).unsqueeze(0)
        global_vector = h[-1]
        counts = [len(q.options) for q in questions]
        spans = [q.span for q in questions] + [span for q in questions for span in q.options]
        means = torch.stack([h[start:end].mean(dim=0) for start, end in spans])
        option_spans = spans[len(questions) :]
        lexical = torch.stack([lm_head[token_ids[start:end]].mean(dim=0).to(h.dtype) for start, end in option_spans])
        question_vectors, contexts = means[: len(questions)], means[len(questions) :]
        option_question = torch.repeat_interleave(
            torch.arange(len(questions), device=device), torch.tensor(counts, device=device)
        )

        # 3. each option is its context, its words and its question, routed through the prompt's evidence.
        options = (
            self.option_context_projection(contexts)
            + self.option_lexical_projection(lexical)
            + self.option_question_projection(question_vectors)[option_question]
        ).unsqueeze(0)
        for routing in self.evidence_layers:
            options = routing(options, memory)
        options = options[0]

        # 4. each field: its question, a summary of its own options weighted by their match, the whole prompt, its
        # type; then the fields read each other and the memory.
        base_fields = self.question_projection(question_vectors)
        width = options.shape[-1]
        summaries = []
        for field, own in zip(base_fields, torch.split(options, counts), strict=True):
            weights = torch.softmax(own @ field / math.sqrt(width), dim=0)
            summaries.append((weights.unsqueeze(-1) * own).sum(dim=0))
        type_ids = torch.tensor([q.type_id for q in questions], dtype=torch.long, device=device)
        fields = (
            base_fields
            + self.option_summary_norm(torch.stack(summaries))
            + self.global_projection(global_vector).unsqueeze(0)
            + self.type_embedding(type_ids)
        ).unsqueeze(0)
        for layer in self.layers:
            fields = layer(fields, memory)
        fields = self.field_norm(fields[0])[option_question]

        # 5. a lexical prior plus a gated joint score.
        anchors = F.normalize(question_vectors + global_vector, dim=-1)[option_question]
        prior_scale = self.prior_logit_scale.clamp(max=MAX_LOG_SCALE).exp()
        prior = prior_scale * (F.normalize(lexical, dim=-1) * anchors).sum(dim=-1)
        normed_options = self.option_norm(options)
        cosine = F.cosine_similarity(fields, normed_options, dim=-1)
        features = torch.cat(
            [fields, normed_options, fields * normed_options, torch.abs(fields - normed_options)], dim=-1
        )
        residual = self.residual_scorer(features).squeeze(-1)
        joint = self.joint_logit_scale.clamp(max=MAX_LOG_SCALE).exp() * cosine + residual
        logits = prior + torch.sigmoid(self.residual_gate) * joint
        return list(torch.split(logits, counts))


def read_head_config(folder: Path) -> dict[str, int]:
    path = folder / HEAD_CONFIG
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise HeadConfigError(f"{path}: cannot read the head config: {error}") from None
    if not isinstance(raw, dict):
        raise HeadConfigError(f"{path}: expected a JSON object")
    missing = [key for key in CONFIG_KEYS if key not in raw]
    if missing:
        raise HeadConfigError(f"{path}: missing {', '.join(missing)} (needs {', '.join(CONFIG_KEYS)})")
    config: dict[str, int] = {}
    for key in CONFIG_KEYS:
        value = raw[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if "layers" in key else 1):
            raise HeadConfigError(
                f"{path}: {key} must be a {'non-negative' if 'layers' in key else 'positive'} integer"
            )
        config[key] = value
    if config["width"] % config["heads"]:
        raise HeadConfigError(f"{path}: width {config['width']} is not a multiple of heads {config['heads']}")
    return config


def load_head(folder: Path, hidden_size: int, device: torch.device, dtype: torch.dtype) -> JointSchemaHead:
    """The folder's head, checked tensor by tensor against its config (and the config against the backbone)."""
    from safetensors.torch import load_file

    config = read_head_config(folder)
    if config["hidden_size"] != hidden_size:
        raise HeadConfigError(
            f"{folder / HEAD_CONFIG}: hidden_size {config['hidden_size']} does not match the backbone's {hidden_size}"
        )
    head = JointSchemaHead(**config)
    weights_path = folder / HEAD_WEIGHTS
    try:
        weights = load_file(str(weights_path))
    except Exception as error:  # safetensors raises several types for a bad file
        raise HeadConfigError(f"{weights_path}: cannot read the head weights: {error}") from None
    check_weights(head, weights, weights_path)
    head.load_state_dict(weights, strict=True)
    head.to(device=device, dtype=dtype)
    head.eval()
    head.requires_grad_(False)
    return head


def check_weights(head: nn.Module, weights: dict[str, Any], source: Path) -> None:
    """Every tensor the config implies is in the file with its shape, and the file holds nothing else."""
    expected = head.state_dict()
    for name, tensor in expected.items():
        if name not in weights:
            raise HeadConfigError(f"{source}: tensor '{name}' is missing ({HEAD_CONFIG} implies it)")
        got = tuple(weights[name].shape)
        if got != tuple(tensor.shape):
            raise HeadConfigError(
                f"{source}: tensor '{name}' has shape {list(got)}, but {HEAD_CONFIG} implies {list(tensor.shape)}"
            )
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise HeadConfigError(f"{source}: tensor '{extra[0]}' is not part of the head {HEAD_CONFIG} describes")
