"""Real prompts for the tests: chat-template renders of decision questions, tokenized by the model's tokenizer.
Tests read with realistic token sequences (shared chat head and state, per-question tails), not only noise."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

STATES = (
    '{"ticket": "Refund not received", "days": 12}',
    '{"ticket": "App crashes on login", "plan": "pro", "device": "android"}',
)
QUESTIONS = (
    "Question: What does the customer want?\nA: refund - money back\nB: status\n"
    "Answer with the letter of one option only.",
    "Question: Is the customer angry?\nyes\nno\nAnswer with yes or no only.",
    "Question: How urgent is it?\n0: low\n1: medium\n2: high\nAnswer with the number of one level only.",
)


@cache
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def prompt_tokens(model_dir: Path, state: str, question: str) -> list[int]:
    rendered = tokenizer(model_dir).apply_chat_template(
        [{"role": "user", "content": f"{state}\n\n{question}"}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    ids: list[int] = tokenizer(model_dir).encode(rendered, add_special_tokens=False)
    return ids


def label_tokens(model_dir: Path, text: str) -> list[int]:
    ids: list[int] = tokenizer(model_dir).encode(text, add_special_tokens=False)
    return ids
