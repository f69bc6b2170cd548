"""The official TypeSafe Python SDK (typesafe-sdk) against the server: it must parse our answers under its
strict schemas, send zstd-compressed bodies we accept, and surface our errors as its typed exceptions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import zstandard
from typesafe_sdk import (
    Choice,
    ChoiceAnswer,
    Noul,
    NoulAnswer,
    Score,
    ScoreAnswer,
    TypeSafeClient,
    TypeSafeUnprocessableEntityError,
)
from typesafe_sdk._core import compression as sdk_compression

from wire import check_response, ok_answers

TICKET = (
    "Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised last week "
    "still hasn't arrived. I've emailed three times. Please fix this today or I will dispute the charge."
)

QUESTIONS = {
    "team": Choice(
        instructions="Which team should handle this ticket?",
        criteria={"Billing": "Payments, invoices, refunds", "Technical": None, "Sales": "Pricing, upgrades"},
    ),
    "urgent": Noul(instructions="Does the customer need an answer today?", criteria={"true": "money is moving"}),
    "anger": Score(instructions="How frustrated is the customer?", criteria=["Calm", "Frustrated", "Very angry"]),
}

# The same questions as wire JSON, to compare the SDK's parse with what the server sends.
WIRE_QUESTIONS: dict[str, Any] = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {"Billing": "Payments, invoices, refunds", "Technical": None, "Sales": "Pricing, upgrades"},
    },
    "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?", "criteria": {"true": "money is moving"}},
    "anger": {"type": "score", "instructions": "How frustrated is the customer?", "criteria": ["Calm", "Frustrated", "Very angry"]},
}


class Recorder:
    """Keeps the requests the SDK puts on the wire."""

    def __init__(self) -> None:
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> None:
        request.read()
        self.requests.append(request)


def sdk_client(server_url: str, recorder: Recorder, compression: Any) -> TypeSafeClient:
    http_client = httpx2.Client(timeout=120.0, event_hooks={"request": [recorder]})
    return TypeSafeClient(base_url=server_url, api_key="any", http_client=http_client, compression=compression)


@pytest.fixture
def zstd_available(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What `typesafe-sdk[zstd]` (backports.zstd) provides, from the zstandard package installed here."""
    if "zstd" not in sdk_compression.COMPRESSORS:
        monkeypatch.setitem(sdk_compression.COMPRESSORS, "zstd", zstandard.ZstdCompressor().compress)
    yield


def assert_same_as_wire(result: Any, wire: dict[str, Any]) -> None:
    answers = wire["answers"]
    assert isinstance(result.answers["team"], ChoiceAnswer)
    assert isinstance(result.answers["urgent"], NoulAnswer)
    assert isinstance(result.answers["anger"], ScoreAnswer)
    team, urgent, anger = result.choices["team"], result.nouls["urgent"], result.scores["anger"]
    assert team.choice == answers["team"]["choice"]
    assert team.probabilities.keys() == answers["team"]["probabilities"].keys()
    for name, p in team.probabilities.items():
        assert abs(p - answers["team"]["probabilities"][name]) < 1e-5
    assert abs(team.confidence - answers["team"]["confidence"]) < 1e-5
    assert abs(urgent.noul - answers["urgent"]["noul"]) < 1e-5
    assert anger.legend == {0: "Calm", 1: "Frustrated", 2: "Very angry"}
    assert set(anger.probabilities) == {0, 1, 2}
    for i, p in anger.probabilities.items():
        assert abs(p - answers["anger"]["probabilities"][str(i)]) < 1e-5
    assert abs(anger.score - answers["anger"]["score"]) < 1e-5
    assert abs(anger.confidence - answers["anger"]["confidence"]) < 1e-5


@pytest.fixture(scope="module")
def wire_answer(http: httpx2.Client) -> dict[str, Any]:
    return ok_answers(http, {"model": "jev-latest", "state": TICKET, "questions": WIRE_QUESTIONS})[0]


def test_sdk_parses_all_three_answer_types(server_url: str, wire_answer: dict[str, Any]) -> None:
    recorder = Recorder()
    with sdk_client(server_url, recorder, compression=False) as client:
        result = client.system_one(state=TICKET, questions=QUESTIONS)
        models = client.models.list()
    sent = [r for r in recorder.requests if r.url.path == "/v1/systemone"]
    assert len(sent) == 1 and "content-encoding" not in sent[0].headers
    assert isinstance(result.model, str) and result.model
    assert isinstance(result.usage.input_tokens, int) and result.usage.input_tokens > 0
    assert isinstance(result.usage.output_tokens, int)
    assert result.request_id
    assert_same_as_wire(result, wire_answer)
    assert result.model in [m.name for m in models.models]


def test_sdk_zstd_compressed_body_is_accepted(server_url: str, wire_answer: dict[str, Any], zstd_available: None) -> None:
    recorder = Recorder()
    padding = {"audit": "x" * 2048}  # the body must be at least 1 KiB for the SDK to compress it
    with sdk_client(server_url, recorder, compression="zstd") as client:
        result = client.system_one(state=TICKET, questions=QUESTIONS, extra_body=padding)
    sent = [r for r in recorder.requests if r.url.path == "/v1/systemone"]
    assert len(sent) == 1, f"{len(sent)} attempts (the SDK retries 5xx)"
    assert sent[0].headers.get("content-encoding") == "zstd", dict(sent[0].headers)
    assert sent[0].content[:4] == b"\x28\xb5\x2f\xfd", "the body on the wire is not a zstd frame"
    assert_same_as_wire(result, wire_answer)


def test_sdk_compressed_large_state(server_url: str, zstd_available: None) -> None:
    recorder = Recorder()
    state = {"messages": [{"from": "customer", "text": f"Message {i}: the refund for order #4471 has not arrived."} for i in range(25)]}
    with sdk_client(server_url, recorder, compression="zstd") as client:
        result = client.system_one(state=state, questions=QUESTIONS)
    assert recorder.requests[-1].headers.get("content-encoding") == "zstd"
    assert set(result.answers) == {"team", "urgent", "anger"}
    raw = result.raw_http_response.json()
    check_response({"questions": WIRE_QUESTIONS}, raw)


def test_sdk_surfaces_validation_errors(server_url: str) -> None:
    recorder = Recorder()
    too_many = Score(instructions="How frustrated?", criteria=[f"Level {i}" for i in range(11)])
    with sdk_client(server_url, recorder, compression=False) as client:
        with pytest.raises(TypeSafeUnprocessableEntityError) as caught:
            client.system_one(state=TICKET, questions={"anger": too_many})
    error = caught.value
    assert error.status == 422
    assert error.request_id, "the error must carry x-typesafe-request-id"
    assert "anger" in str(error) and "criteria" in str(error), str(error)
    assert len([r for r in recorder.requests if r.url.path == "/v1/systemone"]) == 1, "a 422 must not be retried"
