"""Generated-input test: thousands of malformed and edge-case bodies across the three decision routes.
Every answer must be a 2xx, or a 4xx in the route's own error shape — never a 5xx, never a hang."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.local_only

COUNTS = {"requests": 0, "2xx": 0, "4xx": 0}
EXAMPLES_PER_ROUTE = 850
# One generated body in five is a valid edge case (it costs a model read); the rest are refused cheaply.

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["", " ", "\n", "choice", "noul", "score", "predicate", "yes_no", "true", "false", "é🚀", "a:b", "\u0000"]),
)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
short_text = st.one_of(st.text(max_size=20), st.sampled_from(["Refund please", "", " ", "日本語", "x" * 50]))


@st.composite
def systemone_question(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["choice", "noul", "score", "other"]))
    q: dict[str, Any] = {"type": kind if kind != "other" else draw(json_values)}
    if draw(st.booleans()):
        q["instructions"] = draw(st.one_of(short_text, json_values))
    if kind == "choice":
        q["criteria"] = draw(st.one_of(st.dictionaries(short_text, st.one_of(st.none(), short_text, json_values), max_size=30), json_values))
    elif kind == "noul":
        q["criteria"] = draw(st.one_of(st.none(), st.fixed_dictionaries({}, optional={"true": short_text, "false": st.one_of(short_text, json_values)}), json_values))
    elif kind == "score":
        q["criteria"] = draw(st.one_of(st.lists(st.one_of(short_text, json_values), max_size=12), json_values))
    if draw(st.integers(0, 9)) == 0:
        q[draw(st.text(max_size=5))] = draw(json_values)
    return q


@st.composite
def systemone_body(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    body: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        body["state"] = draw(st.one_of(short_text, json_values))
    if draw(st.integers(0, 9)):
        body["questions"] = draw(st.one_of(st.dictionaries(short_text, systemone_question(), max_size=3), json_values))
    for key in ["model", "instructions", "chat_template_kwargs", "cache_salt"]:
        if draw(st.integers(0, 3)) == 0:
            body[key] = draw(st.one_of(short_text, json_values, st.just({"enable_thinking": True})))
    return body


@st.composite
def openai_body(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    question = st.fixed_dictionaries(
        {"type": st.sampled_from(["predicate", "choice", "score", "bogus"]), "instructions": st.one_of(short_text, json_values)},
        optional={
            "name": st.one_of(short_text, json_values),
            "choices": st.lists(st.fixed_dictionaries({"value": st.one_of(short_text, st.booleans(), json_values)}, optional={"description": short_text}), max_size=30),
            "levels": st.lists(st.fixed_dictionaries({"label": st.one_of(short_text, json_values)}, optional={"description": short_text}), max_size=12),
        },
    )
    body: dict[str, Any] = {
        "model": draw(st.one_of(st.just("m"), short_text, json_values)),
        "input": draw(st.one_of(short_text, st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool"]), "content": st.one_of(short_text, json_values)}), max_size=3), json_values)),
        "questions": draw(st.one_of(st.lists(question, max_size=3), json_values)),
    }
    if draw(st.integers(0, 5)) == 0:
        body[draw(st.sampled_from(["safety_identifier", "prompt_cache_key", "unknown"]))] = draw(json_values)
    return body


@st.composite
def sglang_body(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    question = st.fixed_dictionaries(
        {"id": st.one_of(short_text, json_values), "type": st.sampled_from(["choice", "score", "yes_no", "bogus"])},
        optional={
            "question": st.one_of(short_text, json_values),
            "options": st.lists(st.fixed_dictionaries({"name": st.one_of(short_text, json_values)}, optional={"description": short_text}), max_size=30),
            "levels": st.lists(st.one_of(short_text, json_values), max_size=12),
            "yes": short_text,
            "no": st.one_of(short_text, json_values),
        },
    )
    body: dict[str, Any] = {"input": draw(st.one_of(short_text, json_values)), "questions": draw(st.one_of(st.lists(question, max_size=3), json_values))}
    for key in ["temperature", "prompt_format_version", "return_prompt_token_ids", "chat_template_kwargs"]:
        if draw(st.integers(0, 3)) == 0:
            body[key] = draw(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-3, 3), json_values))
    return body


names = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=12).filter(lambda t: t.strip() != "")


@st.composite
def valid_systemone(draw: st.DrawFn) -> Any:
    """Requests that should be answered: edge values inside every limit."""
    questions: dict[str, Any] = {}
    for qid in draw(st.lists(names, min_size=1, max_size=2, unique=True)):
        kind = draw(st.sampled_from(["choice", "noul", "score"]))
        if kind == "choice":
            options = draw(st.lists(names, min_size=1, max_size=draw(st.sampled_from([3, 8, 30])), unique_by=lambda t: t.strip().casefold()))
            questions[qid] = {"type": "choice", "criteria": {o: draw(st.one_of(st.none(), names, st.just({"k": [1]}))) for o in options}}
        elif kind == "noul":
            questions[qid] = {"type": "noul", "instructions": draw(names), "criteria": draw(st.one_of(st.none(), st.just({"false": "no"})))}
        else:
            questions[qid] = {"type": "score", "criteria": draw(st.lists(names, min_size=1, max_size=10))}
        if draw(st.booleans()):
            questions[qid]["instructions"] = draw(st.one_of(names, st.just(["a", {"b": None}])))
    return {"model": draw(st.one_of(st.just("jev-latest"), names.filter(lambda t: ":" not in t))), "state": draw(st.one_of(names, st.just({"a": [1, None]}), st.just([]))), "questions": questions}


@st.composite
def valid_openai(draw: st.DrawFn) -> Any:
    question = st.one_of(
        st.fixed_dictionaries({"type": st.just("predicate"), "instructions": names}, optional={"name": names}),
        st.fixed_dictionaries({"type": st.just("choice"), "instructions": names, "choices": st.lists(st.one_of(names, st.booleans()), min_size=2, max_size=30, unique_by=lambda v: (type(v), v)).map(lambda vs: [{"value": v} for v in vs])}),
        st.fixed_dictionaries({"type": st.just("score"), "instructions": names, "levels": st.lists(names, min_size=2, max_size=10).map(lambda ls: [{"label": l} for l in ls])}),
    )
    return {"model": "m", "input": draw(names), "questions": draw(st.lists(question, min_size=1, max_size=3))}


@st.composite
def valid_sglang(draw: st.DrawFn) -> Any:
    question = st.one_of(
        st.fixed_dictionaries({"type": st.just("yes_no")}, optional={"question": names, "yes": names, "no": names}),
        st.fixed_dictionaries({"type": st.just("choice"), "options": st.lists(names, min_size=2, max_size=26, unique=True).map(lambda ns: [{"name": n} for n in ns])}),
        st.fixed_dictionaries({"type": st.just("score"), "levels": st.lists(names, min_size=2, max_size=10)}),
    )
    qs = draw(st.lists(question, min_size=1, max_size=3))
    for i, q in enumerate(qs):
        q["id"] = f"q{i}"
    return {"input": draw(names), "questions": qs, "temperature": draw(st.floats(min_value=0.05, max_value=5))}


raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"{", b"[]", b"null", b'{"state": NaN}', b'{"state": "x", "questions": {"a": {"type": "noul", "instructions": "\\ud800"}}}', b"\xff\xfe"]),
)


def check(route: str, response: httpx2.Response) -> None:
    COUNTS["requests"] += 1
    assert response.status_code < 500, f"{route}: {response.status_code} {response.text[:500]}"
    if response.status_code < 300:
        COUNTS["2xx"] += 1
        assert isinstance(response.json(), dict)
        return
    COUNTS["4xx"] += 1
    body = response.json()
    if route == "/v1/systemone":
        detail = body["detail"]
        if response.status_code == 422:
            assert isinstance(detail, list) and detail and all(d["loc"][0] == "body" and isinstance(d["msg"], str) for d in detail), body
        else:
            assert isinstance(detail["error_type"], str) and isinstance(detail["message"], str), body
    elif "error" in body:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    else:
        assert body["object"] == "error" and isinstance(body["message"], str), body


SETTINGS = settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)


@SETTINGS
@given(body=st.one_of(*[systemone_body()] * 4, valid_systemone()))
def test_systemone_never_5xx(http: httpx2.Client, body: Any) -> None:
    check("/v1/systemone", http.post("/v1/systemone", content=json.dumps(body), headers={"content-type": "application/json"}))


@SETTINGS
@given(body=st.one_of(*[openai_body(), sglang_body()] * 4, valid_openai(), valid_sglang()))
def test_decisions_never_5xx(http: httpx2.Client, body: Any) -> None:
    check("/v1/decisions", http.post("/v1/decisions", content=json.dumps(body), headers={"content-type": "application/json"}))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
@given(route=st.sampled_from(["/v1/systemone", "/v1/decisions"]), raw=raw_bodies)
def test_raw_bytes_never_5xx(http: httpx2.Client, route: str, raw: bytes) -> None:
    check(route, http.post(route, content=raw, headers={"content-type": "application/json"}))


def test_fuzz_volume() -> None:
    """Runs last in this module: the generated tests above must have sent at least 2,000 requests."""
    print(f"fuzz: {COUNTS['requests']} requests, {COUNTS['2xx']} answered, {COUNTS['4xx']} refused with 4xx, 0 5xx")
    assert COUNTS["requests"] >= 2000, COUNTS
    assert COUNTS["2xx"] >= 150, f"too few generated requests were valid to exercise the answer path: {COUNTS}"
