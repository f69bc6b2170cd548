"""Choices beyond 26 options (spec/PROMPTS.md §4, default profile): each option's code is scored as an exact
token sequence closed by the end-of-turn token. Checked against a naive per-sequence computation with plain
transformers (one cached prompt, then each code's tokens fed one by one)."""

from __future__ import annotations

import copy
import math
from typing import Any

import httpx2
import pytest
import torch

pytestmark = pytest.mark.local_only

STATE = "Ticket: the export button crashes the app on large files."


def code(i: int) -> str:
    """A..Z, AA..AZ, BA.. (spreadsheet style), written independently of the server."""
    n, out = i + 1, ""
    while n:
        n, r = divmod(n - 1, 26)
        out = chr(65 + r) + out
    return out


@torch.inference_mode()
def naive_sequence_logprobs(reference: Any, prompt: str, codes: list[str]) -> list[float]:
    tokenizer, model = reference.tokenizer, reference.model
    prompt_ids = reference.encode(prompt)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = model(torch.tensor([prompt_ids]), use_cache=True)
    first = torch.log_softmax(out.logits[0, -1].double(), -1)
    results = []
    for c in codes:
        ids = reference.encode(prompt + c)
        assert ids[: len(prompt_ids)] == prompt_ids
        sequence = ids[len(prompt_ids) :] + [eot]
        total = float(first[sequence[0]])
        cache = copy.deepcopy(out.past_key_values)
        for previous, token in zip(sequence, sequence[1:]):
            step = model(torch.tensor([[previous]]), past_key_values=cache, use_cache=True)
            cache = step.past_key_values
            total += float(torch.log_softmax(step.logits[0, -1].double(), -1)[token])
        results.append(total)
    return results


def test_255_options_equal_the_naive_per_sequence_computation(http: httpx2.Client, reference: Any) -> None:
    names = [f"Queue {i:03d}" for i in range(255)]
    question = {"type": "choice", "instructions": "Which queue?", "criteria": {n: None for n in names}}
    r = http.post("/v1/systemone", json={"state": STATE, "questions": {"queue": question}}, timeout=600)
    assert r.status_code == 200, r.text
    answer = r.json()["answers"]["queue"]
    got = [answer["probabilities"][n] for n in names]
    assert len(got) == 255 and math.isclose(sum(got), 1.0, abs_tol=1e-9)

    codes = [code(i) for i in range(255)]
    body = "\n".join(["Question: Which queue?", *(f"{c}: {n}" for c, n in zip(codes, names)), "Answer with the code of one option only."])
    prompt = reference.render([{"role": "user", "content": f"{STATE}\n\n{body}"}])
    logprobs = naive_sequence_logprobs(reference, prompt, codes)
    z = max(logprobs)
    weights = [math.exp(lp - z) for lp in logprobs]
    expected = [w / sum(weights) for w in weights]
    worst = max(abs(g - e) for g, e in zip(got, expected))
    assert worst < 1e-4, f"max |p - naive| = {worst}"
    mass = sum(math.exp(lp) for lp in logprobs)
    assert math.isclose(r.json()["x_diagnostics"]["queue"]["label_mass"], mass, abs_tol=1e-4)
    assert answer["choice"] == names[max(range(255), key=lambda i: expected[i])]
