"""An independent reading of a System One request with plain transformers: the prompt wording of
spec/PROMPTS.md §1, the model's own chat template, one forward pass per question, softmax over the labels.

Nothing here imports the server; it is the yardstick the server's probabilities are compared with.
"""

from __future__ import annotations

import json
import math
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def text_of(value: Any) -> str:
    """A string as is; anything else as JSON with non-ASCII kept and default separators."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _blank(description: Any) -> bool:
    return description is None or description == ""


def option_line(label: str, name: str, description: Any) -> str:
    return f"{label}: {name}" if _blank(description) else f"{label}: {name} - {text_of(description)}"


def side_line(label: str, description: Any) -> str:
    return label if _blank(description) else f"{label}: {text_of(description)}"


def question_body(question: dict[str, Any]) -> tuple[str, list[str]]:
    """The question's part of the user message and its labels, in option order."""
    lines: list[str] = []
    if question.get("instructions") is not None:
        lines.append(f"Question: {text_of(question['instructions'])}")
    kind = question["type"]
    if kind == "choice":
        names = list(question["criteria"].keys())
        assert len(names) <= 26, "the letter wording covers at most 26 options"
        labels = list(string.ascii_uppercase[: len(names)])
        for label, name in zip(labels, names):
            lines.append(option_line(label, name, question["criteria"][name]))
        lines.append("Answer with the letter of one option only.")
    elif kind == "noul":
        criteria = question.get("criteria") or {}
        labels = ["yes", "no"]
        lines.append(side_line("yes", criteria.get("true")))
        lines.append(side_line("no", criteria.get("false")))
        lines.append("Answer with yes or no only.")
    elif kind == "score":
        levels = question["criteria"]
        labels = [str(i) for i in range(len(levels))]
        for label, level in zip(labels, levels):
            lines.append(f"{label}: {text_of(level)}")
        lines.append("Answer with the number of one level only.")
    else:
        raise ValueError(f"unknown question type {kind!r}")
    return "\n".join(lines), labels


def messages_for(request: dict[str, Any], question: dict[str, Any]) -> list[dict[str, str]]:
    body, _labels = question_body(question)
    messages: list[dict[str, str]] = []
    if request.get("instructions") is not None:
        messages.append({"role": "system", "content": text_of(request["instructions"])})
    messages.append({"role": "user", "content": f"{text_of(request['state'])}\n\n{body}"})
    return messages


@dataclass
class Read:
    """What one question's read gives: label probabilities and the numbers derived from them."""

    labels: list[str]
    probabilities: list[float]
    label_mass: float
    argmax_is_label: bool
    prompt_tokens: int


class Reference:
    def __init__(self, model_dir: Path) -> None:
        # One thread: the server under test shares these two cores, and oversubscribed BLAS threads spin.
        torch.set_num_threads(1)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        self._cache: dict[tuple[str, tuple[str, ...]], Read] = {}

    def render(self, messages: list[dict[str, str]]) -> str:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert isinstance(text, str)
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def label_ids(self, prompt_text: str, prompt_ids: list[int], labels: list[str]) -> list[int]:
        """vLLM's label check: each label appended to the prompt must add exactly one new, distinct token."""
        ids = []
        for label in labels:
            extended = self.encode(prompt_text + label)
            assert extended[:-1] == prompt_ids and len(extended) == len(prompt_ids) + 1, (
                f"label {label!r} is not one token after the prompt: {extended[len(prompt_ids) - 2 :]}"
            )
            ids.append(extended[-1])
        assert len(set(ids)) == len(ids), f"labels {labels} share tokens {ids}"
        return ids

    @torch.inference_mode()
    def read_text(self, prompt_text: str, labels: list[str]) -> Read:
        key = (prompt_text, tuple(labels))
        if key in self._cache:
            return self._cache[key]
        prompt_ids = self.encode(prompt_text)
        label_ids = self.label_ids(prompt_text, prompt_ids, labels)
        logits = self.model(torch.tensor([prompt_ids])).logits[0, -1].to(torch.float64)
        logprobs = torch.log_softmax(logits, dim=-1)
        label_lp = logprobs[label_ids]
        probabilities = torch.softmax(label_lp, dim=-1).tolist()
        read = Read(
            labels=labels,
            probabilities=probabilities,
            label_mass=float(torch.exp(label_lp).sum()),
            argmax_is_label=int(torch.argmax(logits)) in label_ids,
            prompt_tokens=len(prompt_ids),
        )
        self._cache[key] = read
        return read

    def read(self, request: dict[str, Any], question: dict[str, Any]) -> Read:
        _body, labels = question_body(question)
        return self.read_text(self.render(messages_for(request, question)), labels)


# ---------------------------------------------------------------------------------------------------------------
# TypeSafe's published confidence formulas (spec/API.md §1), over probabilities renormalised on the labels.


def choice_confidence(p: list[float]) -> float:
    n = len(p)
    if n == 1:
        return 1.0
    return min(1.0, max(0.0, (n * max(p) - 1) / (n - 1)))


def score_confidence(p: list[float]) -> float:
    n = len(p)
    if n == 1:
        return 1.0
    mode = max(range(n), key=lambda i: p[i])
    spread = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return max(0.0, 1 - sum(p[i] * abs(i - mode) for i in range(n)) / spread)


def expectation(p: list[float]) -> float:
    return math.fsum(i * pi for i, pi in enumerate(p))
