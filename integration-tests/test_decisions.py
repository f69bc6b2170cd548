"""`/v1/decisions` in OpenAI's shape (through the official `openai` client) and in SGLang's shape, each
checked against an independent transformers reading of the same prompt, plus invariance across all shapes."""

from __future__ import annotations

import math
from typing import Any

import httpx2
import pytest
from openai import BadRequestError, OpenAI

from wordings import LETTERS, TICKET, TOL, assert_routes_agree, check_sglang_shape, probabilities, readings_on_every_route


def adapter_body(instructions: str, options: list[tuple[str, str | None]]) -> str:
    """vLLM's adapter wording: every OpenAI question is a lettered choice."""
    lines = [f"Question: {instructions}"]
    for letter, (name, description) in zip(LETTERS, options):
        lines.append(f"{letter}: {name}" if not description else f"{letter}: {name} - {description}")
    lines.append("Answer with the letter of one option only.")
    return "\n".join(lines)


def adapter_read(reference: Any, state: str, instructions: str, options: list[tuple[str, str | None]]) -> Any:
    prompt = reference.render([{"role": "user", "content": f"{state}\n\n{adapter_body(instructions, options)}"}])
    return reference.read_text(prompt, list(LETTERS[: len(options)]))


@pytest.fixture(scope="module")
def openai_client(server_url: str) -> OpenAI:
    return OpenAI(base_url=f"{server_url}/v1", api_key="not-checked", max_retries=0, timeout=120)


def test_openai_client_reads_every_question_type(openai_client: OpenAI, reference: Any) -> None:
    decision = openai_client.decisions.create(
        model="gpt-6-luna",
        input=TICKET,
        questions=[
            {"type": "predicate", "instructions": "Is the customer asking for money back?", "name": "refund"},
            {
                "type": "choice",
                "instructions": "Is the statement 'the customer is angry' true?",
                "choices": [{"value": "true", "description": "the string"}, {"value": True}, {"value": "maybe"}],
            },
            {"type": "score", "instructions": "How upset?", "levels": [{"label": "calm"}, {"label": "annoyed", "description": "some"}, {"label": "furious"}]},
        ],
    )
    assert [a.type for a in decision.answers] == ["predicate", "choice", "score"]
    predicate, choice, score = decision.answers
    assert predicate.name == "refund" and choice.name is None and score.name is None

    expected = adapter_read(reference, TICKET, "Is the customer asking for money back?", [("false", None), ("true", None)])
    assert math.isclose(predicate.probability, expected.probabilities[1], abs_tol=TOL)

    expected = adapter_read(reference, TICKET, "Is the statement 'the customer is angry' true?", [('"true"', "the string"), ("true", None), ('"maybe"', None)])
    got = [p.probability for p in choice.probabilities]
    assert [p.value for p in choice.probabilities] == ["true", True, "maybe"]
    assert isinstance(choice.probabilities[1].value, bool) and isinstance(choice.probabilities[0].value, str)
    assert all(math.isclose(g, e, abs_tol=TOL) for g, e in zip(got, expected.probabilities)), (got, expected.probabilities)
    assert choice.choice == ["true", True, "maybe"][max(range(3), key=lambda i: got[i])]
    assert math.isclose(choice.confidence, max(0.0, (3 * max(got) - 1) / 2), abs_tol=1e-9)

    expected = adapter_read(reference, TICKET, "How upset?", [("calm", None), ("annoyed", "some"), ("furious", None)])
    got = [p.probability for p in score.probabilities]
    assert [(p.value, p.label) for p in score.probabilities] == [(0, "calm"), (1, "annoyed"), (2, "furious")]
    assert all(math.isclose(g, e, abs_tol=TOL) for g, e in zip(got, expected.probabilities))
    assert math.isclose(score.score, sum(i * p for i, p in enumerate(got)), abs_tol=1e-9)

    usage = decision.usage
    assert usage.input_tokens > 0 and usage.output_tokens == 0 and usage.total_tokens == usage.input_tokens
    assert usage.input_tokens_details.cached_tokens >= 0 and usage.output_tokens_details.reasoning_tokens == 0


def test_openai_message_input_is_joined_like_the_adapter(openai_client: OpenAI, reference: Any) -> None:
    decision = openai_client.decisions.create(
        model="m",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "first part"}, {"type": "input_text", "text": "second part"}]},
            {"role": "user", "content": "another message"},
        ],
        questions=[{"type": "predicate", "instructions": "Is there a second message?"}],
    )
    expected = adapter_read(reference, "first part\nsecond part\n\nanother message", "Is there a second message?", [("false", None), ("true", None)])
    assert math.isclose(decision.answers[0].probability, expected.probabilities[1], abs_tol=TOL)


def test_openai_errors_have_openai_shape(openai_client: OpenAI, http: httpx2.Client) -> None:
    with pytest.raises(BadRequestError) as raised:
        openai_client.decisions.create(model="m", input="x", questions=[{"type": "choice", "instructions": "i", "choices": [{"value": "a"}]}])
    body = raised.value.body
    assert isinstance(body, dict) and body.get("param") == "questions.0.choices", body
    r = http.post("/v1/decisions", json={"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "i"}], "bogus": 1})
    assert r.status_code == 400
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == "bogus"
    assert r.headers.get("x-typesafe-request-id")


def test_sglang_shape_reads_in_the_profile_wording(http: httpx2.Client, reference: Any) -> None:
    """The default profile renders vLLM's wording on every route, the SGLang shape included (version 101);
    pinning SGLang's version 1 there fails loudly instead of answering from another wording."""
    check_sglang_shape(http, reference, "vllm", 101)
    r = http.post("/v1/decisions", json={"input": "x", "prompt_format_version": 1, "questions": [{"id": "a", "type": "yes_no", "question": "q"}]})
    assert r.status_code == 400 and r.json()["param"] == "prompt_format_version"
    assert "--compat sglang" in r.json()["message"], r.text


def test_sglang_refusals(http: httpx2.Client) -> None:
    r = http.post("/v1/decisions", json={"input": "x", "prompt_format_version": 2, "questions": [{"id": "a", "type": "yes_no", "question": "q"}]})
    assert r.status_code == 400 and r.json()["object"] == "error" and r.json()["param"] == "prompt_format_version"
    r = http.post("/v1/decisions", json={"input": "x", "prompt_format_version": "101", "questions": [{"id": "a", "type": "yes_no", "question": "q"}]})
    assert r.status_code == 400 and r.json()["object"] == "error" and r.json()["param"] == "prompt_format_version"
    mixed = http.post("/v1/decisions", json={"input": "x", "questions": [{"id": "a", "type": "predicate", "instructions": "i"}]})
    assert mixed.status_code == 400 and "mixes" in mixed.text


def test_invariance_across_all_shapes(http: httpx2.Client) -> None:
    """The same question under another id, at another position, and beside other questions reads the same."""
    target_s1 = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "payments", "tech": None}}
    other_s1 = {"type": "noul", "instructions": "Is it urgent?"}
    alone = http.post("/v1/systemone", json={"state": TICKET, "questions": {"a": target_s1}}).json()["answers"]["a"]
    crowd = http.post("/v1/systemone", json={"state": TICKET, "questions": {"x": other_s1, "y": other_s1, "renamed": target_s1}}).json()["answers"]["renamed"]
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(probabilities(alone), probabilities(crowd)))

    target_oa = {"type": "predicate", "instructions": "Is the customer asking for money back?", "name": "a"}
    other_oa = {"type": "score", "instructions": "How upset?", "levels": [{"label": "calm"}, {"label": "angry"}]}
    alone = http.post("/v1/decisions", json={"model": "m", "input": TICKET, "questions": [target_oa]}).json()["answers"][0]
    crowd = http.post("/v1/decisions", json={"model": "m", "input": TICKET, "questions": [other_oa, other_oa, dict(target_oa, name="b")]}).json()["answers"][2]
    assert math.isclose(alone["probability"], crowd["probability"], abs_tol=1e-5)

    target_sg = {"id": "a", "type": "yes_no", "question": "Is the customer asking for money back?"}
    other_sg = {"id": "o", "type": "score", "question": "How upset?", "levels": ["calm", "angry"]}
    alone = http.post("/v1/decisions", json={"input": TICKET, "questions": [target_sg]}).json()["answers"]["a"]
    crowd = http.post("/v1/decisions", json={"input": TICKET, "questions": [other_sg, dict(target_sg, id="zz")]}).json()["answers"]["zz"]
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(probabilities(alone), probabilities(crowd)))


def test_the_wording_is_the_profiles_not_the_shapes(http: httpx2.Client) -> None:
    """The same question reads the same on /v1/systemone and on both /v1/decisions shapes."""
    assert_routes_agree(readings_on_every_route(http))


def test_a_decision_replays_through_v1_score(http: httpx2.Client) -> None:
    """Seed 003, "Pin and replay the prompt": a decision's `prompt_token_ids` and `label_token_ids` sent to
    `/v1/score` with the same `temperature` give back its probabilities; without `apply_softmax` the scores are the
    labels' full-vocabulary probabilities (`exp` of `token_logprobs`)."""
    from wordings import SGLANG_QUESTIONS

    temperature = 0.7
    decided = http.post("/v1/decisions", json={
        "input": {"ticket": TICKET}, "questions": SGLANG_QUESTIONS, "temperature": temperature, "return_prompt_token_ids": True,
    })
    assert decided.status_code == 200, decided.text
    answers = decided.json()["answers"]
    items = [answers[q["id"]]["prompt_token_ids"] for q in SGLANG_QUESTIONS]
    labels = [answers[q["id"]]["label_token_ids"] for q in SGLANG_QUESTIONS]
    replay = http.post("/v1/score", json={
        "query": [], "items": items, "label_token_ids": labels, "apply_softmax": True, "temperature": temperature,
        "return_token_logprobs": True,
    })
    assert replay.status_code == 200, replay.text
    body = replay.json()
    assert body["object"] == "scoring" and len(body["scores"]) == len(SGLANG_QUESTIONS)
    assert body["usage"]["prompt_tokens"] == sum(len(ids) for ids in items)
    for question, scores, logprobs in zip(SGLANG_QUESTIONS, body["scores"], body["token_logprobs"]):
        expected = list(answers[question["id"]]["probabilities"].values())
        # Within float32 tolerance, not bit for bit: the replay continues from the prefix cache's keys/values of
        # the decision's own read, a pass of another shape (1.2e-6 seen).
        assert max(abs(a - b) for a, b in zip(scores, expected)) < 1e-5, (question["id"], scores, expected)
        assert len(logprobs) == len(expected) and all(lp <= 0 for lp in logprobs)
    # Raw scores: one flat label list shared by every item; the query split off the front gives the same ids.
    first = items[0]
    raw = http.post("/v1/score", json={"query": first[:5], "items": [first[5:]], "label_token_ids": labels[0]}).json()
    lps = body["token_logprobs"][0]
    # Two reads of the same tokens through passes of other shapes (which cached prefix each continues from depends on
    # what the tests before it left in the shared server's cache). Each is held to transformers within 1e-5 in log
    # space by the exactness tests, so they may differ by up to 2e-5: a clean-clone CI on a 2-core AMD EPYC without
    # AVX-512 saw 1.14e-5 here (the test alone passes at 1e-5), where this compared them to 1e-5 in relative terms.
    assert all(abs(math.log(s) - lp) <= 2e-5 for s, lp in zip(raw["scores"][0], lps)), (raw, lps)


def test_v1_score_refusals_name_the_item(http: httpx2.Client, server_info: dict[str, Any]) -> None:
    vocab = int(server_info.get("vocab_size") or 49152)
    cases = [
        ({"items": [[1, 2], [1, vocab]], "label_token_ids": [5]}, "items[1]"),
        ({"items": [[1, 2], []], "label_token_ids": [5]}, "items[1]"),
        ({"items": [[1] * (int(server_info.get("max_position_embeddings") or 8192) + 5)], "label_token_ids": [5]}, "items[0]"),
        ({"items": ["text is not ids"], "label_token_ids": [5]}, "items[0]"),
        ({"items": [[1, 2]], "label_token_ids": [[5], [6]]}, "label_token_ids"),
        ({"items": [[1, 2]], "label_token_ids": [5], "temperature": -1}, "temperature"),
    ]
    for body, named in cases:
        r = http.post("/v1/score", json=body)
        assert 400 <= r.status_code < 500, (named, r.status_code, r.text[:200])
        if named is not None:
            assert named in r.text, (named, r.text[:300])
    assert http.get("/health").status_code == 200


def test_v1_score_refuses_a_body_over_the_limit(http: httpx2.Client, server_info: dict[str, Any]) -> None:
    """A 30 MB body (the limit is `max_body_bytes`) is refused with a 4xx, and the server keeps answering.

    Through docker's port proxy this refusal used to be lost 1 run in 4 ("Server disconnected without sending a
    response"): the router refused on the declared length and closed with the upload unread, and the kernel's reset
    took the 413 with it. The raw-socket test in test_validation.py checks the fix itself: the refused body is read
    before the reply."""
    body = {"items": [[1] * 10_000_000], "label_token_ids": [5]}
    assert len(str(body["items"])) > int(server_info.get("max_body_bytes") or 8 << 20)
    r = http.post("/v1/score", json=body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
    assert http.get("/health").status_code == 200
