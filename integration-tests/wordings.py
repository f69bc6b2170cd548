"""Prompt wordings written independently of the server, and route-level checks that the wording is the
profile's (and the strategy's), never the wire shape's. Shared by test_decisions and test_profiles."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx2

TICKET = "Hi, I was charged twice for my March invoice and the refund still hasn't arrived. Please fix this today."
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
TOL = 1e-4


def sglang_body(state: Any, question: dict[str, Any]) -> str:
    """SGLang's wording (prompt_format_version 1), written independently of the server."""
    lines: list[str] = []
    if question["type"] == "yes_no":
        lines.append(f"Is the following true? {question['question']}" if question.get("question") else "Is the following true?")
        for side in ("yes", "no"):
            if question.get(side):
                lines.append(f"{side}: {question[side]}")
        lines.append("Answer with yes or no only.")
    else:
        lines.extend(lettered_lines(question))
    state_text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return f"{state_text}\n\n" + "\n".join(lines)


def vllm_body(state: Any, question: dict[str, Any]) -> str:
    """vLLM's wording (spec/PROMPTS.md §1) of an SGLang-shaped question: what the default profile renders."""
    if question["type"] == "yes_no":
        lines = [f"Question: {question['question']}"] if question.get("question") else []
        for side in ("yes", "no"):
            lines.append(f"{side}: {question[side]}" if question.get(side) else side)
        lines.append("Answer with yes or no only.")
    else:
        lines = lettered_lines(question)
    state_text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
    return f"{state_text}\n\n" + "\n".join(lines)


def lettered_lines(question: dict[str, Any]) -> list[str]:
    """Choice and score lines, the same in both wordings."""
    lines = [f"Question: {question['question']}"] if question.get("question") else []
    if question["type"] == "choice":
        for letter, option in zip(LETTERS, question["options"]):
            d = option.get("description")
            lines.append(f"{letter}: {option['name']} - {d}" if d else f"{letter}: {option['name']}")
        lines.append("Answer with the letter of one option only.")
    else:
        for i, level in enumerate(question["levels"]):
            lines.append(f"{i}: {level}")
        lines.append("Answer with the number of one level only.")
    return lines


SGLANG_QUESTIONS: list[dict[str, Any]] = [
    {"id": "urgent", "type": "yes_no", "question": "Does this need a reply within the hour?", "no": "nothing is at stake"},
    {"id": "team", "type": "choice", "question": "Which team?", "options": [{"name": "billing", "description": "payments"}, {"name": "tech"}]},
    {"id": "tone", "type": "score", "question": "How upset?", "levels": ["calm", "annoyed", "furious"]},
]


def check_sglang_shape(http: httpx2.Client, reference: Any, wording: str, version: int) -> None:
    """The SGLang shape with temperature and token ids, read in the wording the server's profile picks
    (never the shape's), each answer checked against an independent transformers reading."""
    state = {"ticket": TICKET, "days": 12}
    body = {"sglang": sglang_body, "vllm": vllm_body}[wording]
    temperature = 2.0
    r = http.post("/v1/decisions", json={"input": state, "questions": SGLANG_QUESTIONS, "temperature": temperature, "return_prompt_token_ids": True, "prompt_format_version": version})
    assert r.status_code == 200, r.text
    payload = r.json()
    assert payload["object"] == "decisions" and payload["prompt_format_version"] == version
    assert payload["usage"]["completion_tokens"] == 0
    total_prompt = 0
    for question in SGLANG_QUESTIONS:
        answer = payload["answers"][question["id"]]
        labels = {"yes_no": ["yes", "no"], "choice": ["A", "B"], "score": ["0", "1", "2"]}[question["type"]]
        prompt = reference.render([{"role": "user", "content": body(state, question)}])
        expected = reference.read_text(prompt, labels)
        assert answer["prompt_token_ids"] == reference.encode(prompt), question["id"]
        total_prompt += len(answer["prompt_token_ids"])
        assert math.isclose(answer["label_mass"], expected.label_mass, abs_tol=TOL)
        # softmax(lp / T) from the T = 1 reading: lp_k = log(p_k · mass).
        scaled = [math.log(p * expected.label_mass) / temperature for p in expected.probabilities]
        z = max(scaled)
        weights = [math.exp(s - z) for s in scaled]
        tempered = [w / sum(weights) for w in weights]
        got = list(answer["probabilities"].values())
        assert all(math.isclose(g, e, abs_tol=TOL) for g, e in zip(got, tempered)), (question["id"], got, tempered)
        assert len(answer["label_token_ids"]) == len(labels)
    assert payload["usage"]["prompt_tokens"] == total_prompt


def probabilities(answer: dict[str, Any]) -> list[float]:
    p = answer.get("probabilities")
    if isinstance(p, dict):
        return list(p.values())
    if isinstance(p, list):
        return [x["probability"] for x in p]
    return [answer.get("noul", answer.get("probability"))]


def readings_on_every_route(http: httpx2.Client) -> list[list[float]]:
    """One choice and one yes/no question sent on each route; the wording is the profile's, so they must agree.
    vLLM's OpenAI adapter names an option by the JSON text of its value, so the choice's options are the booleans,
    whose JSON text (`true`, `false`) is the same name on every route."""
    systemone = http.post("/v1/systemone", json={"state": TICKET, "questions": {
        "late": {"type": "choice", "instructions": "Is the refund late?", "criteria": {"true": "overdue", "false": None}},
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    }})
    sglang = http.post("/v1/decisions", json={"input": TICKET, "questions": [
        {"id": "late", "type": "choice", "question": "Is the refund late?", "options": [{"name": "true", "description": "overdue"}, {"name": "false"}]},
        {"id": "urgent", "type": "yes_no", "question": "Is it urgent?"},
    ]})
    openai = http.post("/v1/decisions", json={"model": "m", "input": TICKET, "questions": [
        {"type": "choice", "instructions": "Is the refund late?", "choices": [{"value": True, "description": "overdue"}, {"value": False}]},
    ]})
    for r in (systemone, sglang, openai):
        assert r.status_code == 200, r.text
    s1, sg = systemone.json()["answers"], sglang.json()["answers"]
    return [probabilities(s1["late"]), probabilities(sg["late"]), probabilities(openai.json()["answers"][0]),
            probabilities(s1["urgent"]), [sg["urgent"]["probabilities"]["yes"]]]


def assert_routes_agree(readings: list[list[float]]) -> None:
    s1_team, sg_team, oa_team, s1_urgent, sg_urgent = readings
    for other in (sg_team, oa_team):
        assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(s1_team, other)), readings
    assert math.isclose(s1_urgent[0], sg_urgent[0], abs_tol=1e-5), readings
