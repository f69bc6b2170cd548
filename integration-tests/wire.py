"""HTTP helpers and the response-shape checks every System One answer must pass (spec/API.md §1).

The checks assert the contract, not this implementation: exact answer fields, JSON types, derived numbers
computed from the returned probabilities with TypeSafe's formulas.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import httpx2

from reference import choice_confidence, expectation, score_confidence

REQUEST_ID_HEADER = "x-typesafe-request-id"

ANSWER_FIELDS = {
    "choice": {"type", "choice", "probabilities", "confidence"},
    "noul": {"type", "noul"},
    "score": {"type", "score", "legend", "probabilities", "confidence"},
}


def post_systemone(client: httpx2.Client, body: Any, **kwargs: Any) -> httpx2.Response:
    """POSTs a dict as JSON (non-ASCII kept raw, as the SDKs send it) or raw bytes as given."""
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
    content = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    return client.post("/v1/systemone", content=content, headers=headers, **kwargs)


def affinity_key(state: Any, cache_salt: str = "", instructions: str | None = None) -> str:
    """The state-affinity key (the response header `x-decision-affinity`) by docs/deploy.md#state-affinity's recipe,
    as a client computes it before its first request."""
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    document: list[Any] = ["decision-affinity/1", cache_salt, instructions, text, [], [], []]
    compact = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(compact.encode()).hexdigest()[:32]


def show(response: httpx2.Response, limit: int = 3000) -> str:
    """The status and the body, cut to a readable size, for failure messages."""
    text = response.text
    if len(text) > limit:
        text = text[:limit] + f"… ({len(response.content)} bytes)"
    return f"{response.status_code} {text}"


def show_request(body: Any, limit: int = 2000) -> str:
    text = body.decode(errors="replace") if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


def exchange(body: Any, response: httpx2.Response) -> str:
    return f"\n→ POST /v1/systemone {show_request(body)}\n← {show(response)}"


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def ok_answers(client: httpx2.Client, body: Any, **kwargs: Any) -> tuple[dict[str, Any], httpx2.Response]:
    """POSTs a request that must succeed and checks the whole response against the contract."""
    r = post_systemone(client, body, **kwargs)
    assert r.status_code == 200, f"valid request refused{exchange(body, r)}"
    assert r.headers.get(REQUEST_ID_HEADER), f"no {REQUEST_ID_HEADER} header{exchange(body, r)}"
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    payload = r.json()
    check_response(body, payload)
    return payload, r


def check_response(request: dict[str, Any], payload: Any) -> None:
    """Shape, types and self-consistency of a 200 answer to `request`."""
    assert isinstance(payload, dict), payload
    assert isinstance(payload.get("model"), str) and payload["model"], payload
    extra_top = set(payload) - {"model", "answers", "usage"}
    assert all(k.startswith("x_") for k in extra_top), f"unprefixed top-level fields {extra_top}"

    usage = payload.get("usage")
    assert isinstance(usage, dict), payload
    for key in ("input_tokens", "output_tokens"):
        value = usage.get(key)
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 0, f"usage.{key} = {value!r}"
    assert usage["input_tokens"] > 0, usage

    answers = payload.get("answers")
    assert isinstance(answers, dict), payload
    questions = request["questions"]
    assert list(answers) == list(questions), f"answer ids {list(answers)} != question ids {list(questions)}"
    for qid, question in questions.items():
        check_answer(qid, question, answers[qid])

    diagnostics = payload.get("x_diagnostics")
    assert isinstance(diagnostics, dict), f"x_diagnostics missing: {payload}"
    assert set(diagnostics) == set(questions), f"x_diagnostics ids {list(diagnostics)}"
    for qid, diag in diagnostics.items():
        assert isinstance(diag, dict), diag
        assert is_number(diag.get("label_mass")) and 0 < diag["label_mass"] <= 1 + 1e-6, f"{qid}: {diag}"
        assert isinstance(diag.get("argmax_is_label"), bool), f"{qid}: {diag}"


def label_probabilities(question: dict[str, Any], answer: dict[str, Any]) -> list[float]:
    """The answer's label distribution in label order (choice option order, noul yes/no, score 0..n-1)."""
    if question["type"] == "choice":
        return [answer["probabilities"][name] for name in question["criteria"]]
    if question["type"] == "noul":
        return [answer["noul"], 1 - answer["noul"]]
    return [answer["probabilities"][str(i)] for i in range(len(question["criteria"]))]


def check_answer(qid: str, question: dict[str, Any], answer: Any) -> None:
    kind = question["type"]
    assert isinstance(answer, dict), f"{qid}: {answer!r}"
    assert answer.get("type") == kind, f"{qid}: type {answer.get('type')!r}, asked {kind!r}"
    fields = set(answer)
    unprefixed = {f for f in fields - ANSWER_FIELDS[kind] if not f.startswith("x_")}
    assert not unprefixed, f"{qid}: unexpected fields {unprefixed} in {answer}"
    assert ANSWER_FIELDS[kind] <= fields, f"{qid}: missing {ANSWER_FIELDS[kind] - fields} in {answer}"

    if kind == "noul":
        assert is_number(answer["noul"]) and 0 <= answer["noul"] <= 1, f"{qid}: {answer}"
        return

    probabilities = answer["probabilities"]
    assert isinstance(probabilities, dict), f"{qid}: {answer}"
    if kind == "choice":
        names = list(question["criteria"])
        assert list(probabilities) == names, f"{qid}: probability keys {list(probabilities)} != options {names}"
    else:
        keys = [str(i) for i in range(len(question["criteria"]))]
        assert list(probabilities) == keys, f"{qid}: probability keys {list(probabilities)} != {keys}"
    for key, value in probabilities.items():
        assert is_number(value) and 0 <= value <= 1, f"{qid}: probability {key!r} = {value!r}"
    p = label_probabilities(question, answer)
    assert abs(math.fsum(p) - 1) < 1e-5, f"{qid}: probabilities sum to {math.fsum(p)}"
    assert is_number(answer["confidence"]) and 0 <= answer["confidence"] <= 1, f"{qid}: {answer}"

    if kind == "choice":
        best = max(p)
        assert answer["choice"] in question["criteria"], f"{qid}: choice {answer['choice']!r}"
        assert probabilities[answer["choice"]] == best, f"{qid}: choice {answer['choice']!r} is not the argmax of {p}"
        assert abs(answer["confidence"] - choice_confidence(p)) < 1e-5, (
            f"{qid}: confidence {answer['confidence']} != (n·p_max − 1)/(n − 1) = {choice_confidence(p)}"
        )
    else:
        levels = question["criteria"]
        legend = answer["legend"]
        assert isinstance(legend, dict), f"{qid}: {answer}"
        assert list(legend) == [str(i) for i in range(len(levels))], f"{qid}: legend keys {list(legend)}"
        for i, level in enumerate(levels):
            assert legend[str(i)] == level, f"{qid}: legend[{i}] = {legend[str(i)]!r}, level {level!r}"
        assert is_number(answer["score"]), f"{qid}: {answer}"
        assert abs(answer["score"] - expectation(p)) < 1e-5, f"{qid}: score {answer['score']} != Σ i·p_i = {expectation(p)}"
        assert abs(answer["confidence"] - score_confidence(p)) < 1e-5, (
            f"{qid}: confidence {answer['confidence']} != TypeSafe's score formula {score_confidence(p)}"
        )


def error_detail(response: httpx2.Response) -> dict[str, Any]:
    """The `{"detail": {"error_type", "message"}}` body of a non-validation error."""
    assert response.headers.get("content-type", "").startswith("application/json"), show(response)
    body = response.json()
    detail = body.get("detail") if isinstance(body, dict) else None
    assert isinstance(detail, dict), f"error body is not {{'detail': {{...}}}}: {show(response)}"
    assert isinstance(detail.get("error_type"), str) and detail["error_type"], show(response)
    assert isinstance(detail.get("message"), str) and detail["message"], show(response)
    return detail
