"""Reading label log-probabilities out of whole next-token logits, for models that compute every logit on one rank
(transformers' modeling); the tensor-parallel decoder computes the same values from split logits (layers.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary log-softmax in float32, whatever dtype the model computed in."""
    return torch.log_softmax(logits.float(), dim=-1)


def gather(logprobs: torch.Tensor, rows: Sequence[int], tokens: Sequence[int]) -> list[float]:
    """logprobs[rows[k], tokens[k]] for every k, in one device round trip."""
    if not rows:
        return []
    row_index = torch.tensor(rows, dtype=torch.long, device=logprobs.device)
    token_index = torch.tensor(tokens, dtype=torch.long, device=logprobs.device)
    values: list[float] = logprobs[row_index, token_index].double().tolist()
    return values


def argmax_rows(logprobs: torch.Tensor, rows: Sequence[int]) -> list[int]:
    if not rows:
        return []
    row_index = torch.tensor(rows, dtype=torch.long, device=logprobs.device)
    winners: list[int] = torch.argmax(logprobs[row_index], dim=-1).tolist()
    return winners
