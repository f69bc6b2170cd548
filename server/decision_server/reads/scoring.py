"""Reading label log-probabilities out of next-token logits, shared by every read strategy.
Both strategies score through the same code so any difference between them comes from the forward pass alone."""

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
