"""The seeded workload: one question schema per run and, per request index, a state of about N tokens.

Everything is a pure function of (seed, index), so a rerun, or the other server of an A/B run, gets the same requests.
Every fresh state starts with its own ticket line, so no two fresh states share a prefix beyond the chat head."""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from decision_bench.tokens import TokenCounter

KINDS = ("choice", "noul", "score")

_ADJECTIVES = (
    "late",
    "broken",
    "duplicate",
    "missing",
    "urgent",
    "partial",
    "wrong",
    "damaged",
    "expired",
    "locked",
    "slow",
    "new",
    "annual",
    "monthly",
    "shared",
    "premium",
    "old",
    "second",
    "final",
    "blocked",
)
_NOUNS = (
    "order",
    "invoice",
    "refund",
    "parcel",
    "account",
    "password",
    "subscription",
    "payment",
    "card",
    "delivery",
    "receipt",
    "upgrade",
    "login",
    "contract",
    "router",
    "phone",
    "plan",
    "voucher",
    "address",
    "ticket",
)
_VERBS = (
    "arrived",
    "failed",
    "was charged",
    "disappeared",
    "was cancelled",
    "stopped working",
    "was returned",
    "was delayed",
    "was updated",
    "was rejected",
    "came back",
    "was split",
    "got stuck",
    "was renewed",
)
_TAILS = (
    "after the last update",
    "two days ago",
    "without any notice",
    "for the second time",
    "this morning",
    "while I was travelling",
    "even though support promised a fix",
    "and nobody answered my email",
    "right before the deadline",
    "despite the confirmation message",
    "during the weekend",
    "last month",
)
_OPENERS = ("Hello,", "Hi team,", "To whom it may concern,", "Good morning,", "Dear support,")
_TOPICS = (
    "team",
    "product",
    "channel",
    "region",
    "priority queue",
    "language",
    "tier",
    "next step",
    "root cause",
    "owner",
)
_OPTION_WORDS = (
    "billing",
    "technical",
    "sales",
    "shipping",
    "security",
    "legal",
    "accounts",
    "returns",
    "hardware",
    "software",
    "network",
    "mobile",
    "web",
    "partners",
    "onboarding",
    "retention",
    "fraud",
    "compliance",
    "logistics",
    "warranty",
    "refunds",
    "orders",
    "identity",
    "catalog",
    "pricing",
    "marketing",
    "research",
    "payroll",
    "facilities",
    "escalations",
)
_FACTS = (
    "a refund",
    "a data breach",
    "a competitor",
    "a legal threat",
    "a cancellation",
    "a delivery date",
    "an account number",
    "a discount",
    "a second purchase",
    "a previous ticket",
    "a supervisor",
    "a payment failure",
)
_MOODS = (
    "upset",
    "confused",
    "patient",
    "satisfied",
    "impatient",
    "polite",
    "formal",
    "detailed",
    "technical",
    "angry",
)
_LEVELS = ("none", "slight", "moderate", "strong", "extreme", "total", "unbounded", "unheard of", "absolute", "cosmic")


@dataclass(frozen=True)
class WorkloadSpec:
    state_tokens: int
    questions: int
    options: int
    seed: int = 0
    mix: tuple[str, ...] = KINDS
    levels: int = 5
    repeat_state_fraction: float = 0.0
    hot_states: int = 8
    model: str | None = None
    # Send `joint: true` (several questions on one canvas; block-diffusion models only).
    joint: bool = False
    # Share of requests replaced by a deliberately bad one (BAD_KINDS), each answered 4xx by a sound server.
    bad_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.state_tokens < 1:
            raise ValueError(f"state tokens must be ≥ 1, got {self.state_tokens}")
        if self.questions < 1:
            raise ValueError(f"questions must be ≥ 1, got {self.questions}")
        if not 1 <= self.options <= 255:
            raise ValueError(f"options must be within 1..255, got {self.options}")
        if not 1 <= self.levels <= 10:
            raise ValueError(f"score levels must be within 1..10, got {self.levels}")
        if not self.mix or any(kind not in KINDS for kind in self.mix):
            raise ValueError(f"mix must name kinds among {', '.join(KINDS)}, got {','.join(self.mix)}")
        if not 0.0 <= self.repeat_state_fraction <= 1.0:
            raise ValueError(f"repeat-state fraction must be within [0, 1], got {self.repeat_state_fraction}")
        if self.hot_states < 1:
            raise ValueError(f"hot states must be ≥ 1, got {self.hot_states}")
        if not 0.0 <= self.bad_fraction <= 1.0:
            raise ValueError(f"bad fraction must be within [0, 1], got {self.bad_fraction}")


@dataclass(frozen=True)
class Request:
    index: int
    state_key: str
    body: bytes
    state_tokens: int
    # Σ over questions of one full per-question prompt (chat head + state + question): what a naive reader prefills.
    naive_prompt_tokens: int
    # The kind of a deliberately bad request (BAD_KINDS), None for a valid one.
    bad: str | None = None


@dataclass
class Workload:
    spec: WorkloadSpec
    counter: TokenCounter
    schema: dict[str, dict[str, Any]] = field(init=False)
    _overhead: int = field(init=False)
    _hot: dict[str, tuple[str, int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.schema = make_schema(self.spec)
        sample_state, _ = self._state("sample")
        self._overhead = sum(
            self.counter.prompt_overhead(sample_state, question_body(question)) for question in self.schema.values()
        )

    def request(self, index: int, stream: str = "run") -> Request:
        """Request number `index` of a stream ("run" for measured requests, "warmup" for discarded ones)."""
        bad_rng = random.Random(f"{self.spec.seed}:{stream}:{index}:bad")
        if stream == "run" and bad_rng.random() < self.spec.bad_fraction:
            kind = bad_rng.choice(sorted(BAD_KINDS))
            return Request(index, f"bad:{kind}", BAD_KINDS[kind](self.schema), 0, 0, bad=kind)
        rng = random.Random(f"{self.spec.seed}:{stream}:{index}:pick")
        if rng.random() < self.spec.repeat_state_fraction:
            key = f"hot:{rng.randrange(self.spec.hot_states)}"
            if key not in self._hot:
                self._hot[key] = self._state(key)
            state, tokens = self._hot[key]
        else:
            key = f"{stream}:{index}"
            state, tokens = self._state(key)
        body: dict[str, Any] = {"state": state, "questions": self.schema}
        if self.spec.model is not None:
            body["model"] = self.spec.model
        if self.spec.joint:
            body["joint"] = True
        return Request(
            index=index,
            state_key=key,
            body=json.dumps(body, ensure_ascii=False).encode(),
            state_tokens=tokens,
            naive_prompt_tokens=self.spec.questions * tokens + self._overhead,
        )

    def _state(self, key: str) -> tuple[str, int]:
        return make_state(self.spec.seed, key, self.spec.state_tokens, self.counter)


def _bad_json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()


# Bad requests a client sends by mistake or on purpose, each one a 4xx from a sound server (never a 5xx, never a hang):
# a body that is not JSON, one cut short, a missing field, an unknown question type, a choice without options, a
# question with an unknown field, and a state far over the token limit.
BAD_KINDS: dict[str, Callable[[dict[str, dict[str, Any]]], bytes]] = {
    "not_json": lambda schema: b"{this is not json",
    "truncated": lambda schema: _bad_json({"state": "x", "questions": schema})[:-7],
    "no_questions": lambda schema: _bad_json({"state": "A ticket."}),
    "unknown_type": lambda schema: _bad_json(
        {"state": "A ticket.", "questions": {"q": {"type": "essay", "instructions": "Write."}}}
    ),
    "empty_choice": lambda schema: _bad_json(
        {"state": "A ticket.", "questions": {"q": {"type": "choice", "instructions": "Pick.", "criteria": {}}}}
    ),
    "extra_field": lambda schema: _bad_json(
        {"state": "A ticket.", "questions": {"q": {"type": "noul", "instructions": "Yes?", "weight": 2}}}
    ),
    "huge_state": lambda schema: _bad_json({"state": "word " * 200_000, "questions": schema}),
}


def make_state(seed: int, key: str, target_tokens: int, counter: TokenCounter) -> tuple[str, int]:
    """A support-ticket text of about `target_tokens` tokens (never fewer), and its token count."""
    rng = random.Random(f"{seed}:state:{key}")
    ticket = "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))
    parts = [f"Ticket {ticket} ({key}). {rng.choice(_OPENERS)}"]
    total = counter.count(parts[0])
    while total < target_tokens:
        chunk = [" " + _sentence(rng) for _ in range(8)]
        for sentence, tokens in zip(chunk, counter.count_many(chunk), strict=True):
            parts.append(sentence)
            total += tokens
            if total >= target_tokens:
                break
    text = "".join(parts)
    return text, counter.count(text)


def _sentence(rng: random.Random) -> str:
    return (
        f"My {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} {rng.choice(_VERBS)} {rng.choice(_TAILS)}, "
        f"so the {rng.choice(_NOUNS)} is still {rng.choice(_ADJECTIVES)}."
    )


def make_schema(spec: WorkloadSpec) -> dict[str, dict[str, Any]]:
    """The run's questions in /v1/systemone shape: kind i is mix[i mod len(mix)], ids q0, q1, …"""
    rng = random.Random(f"{spec.seed}:schema")
    questions: dict[str, dict[str, Any]] = {}
    for position in range(spec.questions):
        kind = spec.mix[position % len(spec.mix)]
        if kind == "choice":
            names = _option_names(rng, spec.options)
            criteria: Any = {
                name: (f"tickets about {rng.choice(_NOUNS)}s" if rng.random() < 0.5 else None) for name in names
            }
            question = {
                "type": "choice",
                "instructions": f"Which {rng.choice(_TOPICS)} fits this ticket best?",
                "criteria": criteria,
            }
        elif kind == "noul":
            question = {
                "type": "noul",
                "instructions": f"Does the customer mention {rng.choice(_FACTS)}?",
                "criteria": {"true": f"the ticket talks about {rng.choice(_FACTS)}"},
            }
        else:
            question = {
                "type": "score",
                "instructions": f"How {rng.choice(_MOODS)} is the customer?",
                "criteria": [f"{level} {rng.choice(_MOODS)}" for level in _LEVELS[: spec.levels]],
            }
        questions[f"q{position}"] = question
    return questions


def _option_names(rng: random.Random, count: int) -> list[str]:
    pool = list(_OPTION_WORDS)
    rng.shuffle(pool)
    if count <= len(pool):
        return pool[:count]
    return pool + [f"{pool[i % len(pool)]} {i // len(pool) + 1}" for i in range(len(pool), count)]


def question_body(question: dict[str, Any]) -> str:
    """The question's part of a per-question prompt, in the default profile's vLLM wording (spec/PROMPTS.md §1)."""
    lines = [f"Question: {question['instructions']}"] if question.get("instructions") else []
    kind = question["type"]
    if kind == "choice":
        for position, (name, description) in enumerate(question["criteria"].items()):
            label = string.ascii_uppercase[position] if position < 26 else name
            lines.append(f"{label}: {name} - {description}" if description else f"{label}: {name}")
        lines.append("Answer with the letter of one option only.")
    elif kind == "noul":
        criteria = question.get("criteria") or {}
        lines.append(f"yes: {criteria['true']}" if criteria.get("true") else "yes")
        lines.append(f"no: {criteria['false']}" if criteria.get("false") else "no")
        lines.append("Answer with yes or no only.")
    else:
        lines.extend(f"{position}: {level}" for position, level in enumerate(question["criteria"]))
        lines.append("Answer with the number of one level only.")
    return "\n".join(lines)
