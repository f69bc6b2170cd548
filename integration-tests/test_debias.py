"""Order-debiased reads end to end on the embedded SmolLM2 (float32): `x_debias: "rotate"` on the three wire shapes
and `--debias rotate` as the server default. A rotated read must equal the average, by option name, of the plain
reads of the orders it reports; an option's debiased probability must not depend on where the client listed it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from launchers import Launcher
from wire import exchange, ok_answers, post_systemone

# A debiased read against plain reads of each order: the same prompts in different company (batched tree reads).
INVARIANCE_TOL = 1e-5

STATE = (
    "Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised last week "
    "still hasn't arrived. Please fix this today or I will dispute the charge with my bank."
)
OPTIONS = {
    "billing": "payments, invoices and refunds",
    "technical": "bugs, outages and integrations",
    "sales": None,
    "account": "logins and profile changes",
}
LEVELS = ["calm", "annoyed", "frustrated", "furious"]


def rotated(names: list[str], shift: int) -> list[str]:
    return names[shift:] + names[:shift]


def choice_request(order: list[str], debias: str | None, salt: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "state": STATE,
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team should handle this ticket?",
                "criteria": {name: OPTIONS[name] for name in order},
            }
        },
    }
    if debias is not None:
        body["x_debias"] = debias
    if salt is not None:
        # Its own cache partition: every request computes its prompts from scratch, alike.
        body["cache_salt"] = salt
    return body


def post_ok(http: httpx2.Client, body: dict[str, Any]) -> dict[str, Any]:
    payload, _ = ok_answers(http, body)
    return payload


def test_rotate_equals_the_average_of_the_plain_reads_of_its_orders(http: httpx2.Client) -> None:
    names = list(OPTIONS)
    debiased = post_ok(http, choice_request(names, "rotate"))
    diagnostics = debiased["x_diagnostics"]["team"]
    assert diagnostics["debias"] == "rotate" and diagnostics["orders"] == 4, debiased
    plain = [post_ok(http, choice_request(rotated(names, s), None))["answers"]["team"] for s in range(4)]
    for read in plain:
        assert set(read["probabilities"]) == set(names)
    averaged = {n: sum(r["probabilities"][n] for r in plain) / 4 for n in names}
    got = debiased["answers"]["team"]["probabilities"]
    for name in names:
        assert abs(got[name] - averaged[name]) < INVARIANCE_TOL, (name, got, averaged)
    chosen = debiased["answers"]["team"]["choice"]
    assert chosen == max(averaged, key=lambda n: averaged[n])
    spread = [r["probabilities"][chosen] for r in plain]
    assert abs(diagnostics["order_sensitivity"] - (max(spread) - min(spread))) < INVARIANCE_TOL, (diagnostics, spread)
    # The plain reads do differ by order on this model: the diagnostic measures something real.
    assert diagnostics["order_sensitivity"] > 1e-3, diagnostics


def test_an_options_debiased_probability_does_not_depend_on_where_it_was_listed(http: httpx2.Client) -> None:
    """The issue's test through the stack: the question sent in each of the 4 rotations' own orders gets
    bit-for-bit the same probabilities by name, and the same diagnostics."""
    names = list(OPTIONS)
    answers = []
    for shift in range(4):
        body = choice_request(rotated(names, shift), "rotate", salt=f"debias-{uuid.uuid4()}")
        payload = post_ok(http, body)
        answers.append((payload["answers"]["team"], payload["x_diagnostics"]["team"]))
    first_answer, first_diagnostics = answers[0]
    for answer, diagnostics in answers[1:]:
        assert {n: answer["probabilities"][n] for n in names} == {n: first_answer["probabilities"][n] for n in names}
        assert answer["choice"] == first_answer["choice"]
        assert diagnostics == first_diagnostics


def test_a_score_is_read_in_both_level_orders_and_a_noul_in_both_label_orders(http: httpx2.Client) -> None:
    def score(levels: list[str], debias: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "state": STATE,
            "questions": {"anger": {"type": "score", "instructions": "How frustrated is the customer?", "criteria": levels}},
        }
        if debias:
            body["x_debias"] = debias
        return post_ok(http, body)

    debiased = score(LEVELS, "rotate")
    forward = score(LEVELS, None)["answers"]["anger"]["probabilities"]
    backward = score(LEVELS[::-1], None)["answers"]["anger"]["probabilities"]
    n = len(LEVELS)
    got = debiased["answers"]["anger"]["probabilities"]
    for i in range(n):
        # Level i is shown as label n-1-i in the reversed order.
        expected = (forward[str(i)] + backward[str(n - 1 - i)]) / 2
        assert abs(got[str(i)] - expected) < INVARIANCE_TOL, (i, got, forward, backward)
    assert debiased["x_diagnostics"]["anger"]["orders"] == 2
    assert debiased["answers"]["anger"]["legend"] == {str(i): level for i, level in enumerate(LEVELS)}

    noul = {
        "state": STATE,
        "questions": {
            "dispute": {
                "type": "noul",
                "instructions": "Is the customer threatening to dispute the charge?",
                "criteria": {"true": "they mention their bank or a chargeback", "false": "no such threat"},
            }
        },
    }
    plain = post_ok(http, noul)["answers"]["dispute"]["noul"]
    both = post_ok(http, {**noul, "x_debias": "rotate"})
    averaged = both["answers"]["dispute"]["noul"]
    diagnostics = both["x_diagnostics"]["dispute"]
    assert diagnostics["orders"] == 2 and diagnostics["debias"] == "rotate"
    # Two orders: the other order's P(yes) is 2·avg − plain, and the chosen side moved by their difference.
    swapped = 2 * averaged - plain
    assert 0 <= swapped <= 1 + INVARIANCE_TOL, (plain, averaged)
    assert abs(diagnostics["order_sensitivity"] - abs(plain - swapped)) < INVARIANCE_TOL, (diagnostics, plain, swapped)
    # The no-first order is a different prompt, and this model reads it differently.
    assert abs(plain - swapped) > 1e-4, (plain, swapped)


def test_off_reads_once_and_reports_nothing(http: httpx2.Client) -> None:
    names = list(OPTIONS)
    plain = post_ok(http, choice_request(names, None))
    off = post_ok(http, choice_request(names, "off"))
    assert off["answers"] == plain["answers"]
    assert off["x_diagnostics"]["team"] == plain["x_diagnostics"]["team"]
    assert set(plain["x_diagnostics"]["team"]) == {"label_mass", "argmax_is_label"}


def test_the_decisions_shapes_take_x_debias_and_report_on_each_answer(http: httpx2.Client) -> None:
    sglang = {
        "input": STATE,
        "x_debias": "rotate",
        "questions": [
            {
                "id": "team",
                "type": "choice",
                "question": "Which team should handle this ticket?",
                "options": [{"name": name} for name in OPTIONS],
            },
            {"id": "dispute", "type": "yes_no", "question": "Is the customer threatening a chargeback?"},
        ],
    }
    r = http.post("/v1/decisions", json=sglang)
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert answers["team"]["x_debias"] == "rotate" and answers["team"]["x_orders"] == 4, answers
    assert answers["dispute"]["x_orders"] == 2, answers
    assert abs(sum(answers["team"]["probabilities"].values()) - 1) < 1e-9

    openai = {
        "model": "m",
        "input": STATE,
        "x_debias": "rotate",
        "questions": [{"type": "choice", "instructions": "Which team?", "choices": [{"value": n} for n in OPTIONS]}],
    }
    r = http.post("/v1/decisions", json=openai)
    assert r.status_code == 200, r.text
    answer = r.json()["answers"][0]
    assert answer["x_debias"] == "rotate" and answer["x_orders"] == 4 and answer["x_order_sensitivity"] >= 0, answer


@pytest.mark.parametrize(
    ("route", "body", "status"),
    [
        ("/v1/systemone", choice_request(list(OPTIONS), "sometimes"), 422),
        ("/v1/decisions", {"model": "m", "input": "x", "x_debias": 4, "questions": [{"type": "predicate", "instructions": "i"}]}, 400),
        ("/v1/decisions", {"input": "x", "x_debias": "all", "questions": [{"id": "u", "type": "yes_no", "question": "q"}]}, 400),
    ],
)
def test_a_bad_x_debias_is_refused_naming_the_field(http: httpx2.Client, route: str, body: dict[str, Any], status: int) -> None:
    r = http.post(route, json=body)
    assert r.status_code == status, exchange(body, r)
    assert "x_debias" in r.text, r.text


@pytest.mark.local_only
def test_debias_rotate_is_a_server_default_a_request_can_turn_off(launcher_factory: Callable[..., Launcher], http: httpx2.Client) -> None:
    launcher = launcher_factory(
        ["--hostname", "127.0.0.1", "--dtype", "float32", "--matmul", "exact", "--debias", "rotate"], name="debias"
    )
    launcher.wait_healthy(timeout_s=300)
    names = list(OPTIONS)
    with httpx2.Client(base_url=launcher.url, timeout=120) as client:
        default = post_systemone(client, choice_request(names, None))
        assert default.status_code == 200, default.text
        assert default.json()["x_diagnostics"]["team"]["orders"] == 4
        off = post_systemone(client, choice_request(names, "off"))
        assert off.status_code == 200, off.text
        assert "orders" not in off.json()["x_diagnostics"]["team"]
    # The same answers as the session server's own reads, each way.
    session_rotate = post_ok(http, choice_request(names, "rotate"))["answers"]["team"]["probabilities"]
    session_plain = post_ok(http, choice_request(names, None))["answers"]["team"]["probabilities"]
    for name in names:
        assert abs(default.json()["answers"]["team"]["probabilities"][name] - session_rotate[name]) < INVARIANCE_TOL
        assert abs(off.json()["answers"]["team"]["probabilities"][name] - session_plain[name]) < INVARIANCE_TOL


def test_prior_is_estimated_from_rotated_traffic_then_divided_out_of_one_read(http: httpx2.Client) -> None:
    """PriDe through the stack: the first reads of a question form are rotated and each adds a sample; once the
    form has 8, one read is corrected by the prior, which equals the one computed here from the plain reads."""
    import math

    names = list(OPTIONS)
    n = len(names)
    # A question form of its own: no other test adds samples to its signature.
    instructions = f"Which team should handle this ticket? (form {uuid.uuid4().hex[:8]})"

    def body(state: str, order: list[str], debias: str | None) -> dict[str, Any]:
        request: dict[str, Any] = {
            "state": state,
            "questions": {"team": {"type": "choice", "instructions": instructions, "criteria": {k: OPTIONS[k] for k in order}}},
        }
        if debias:
            request["x_debias"] = debias
        return request

    log_prior_sum = [0.0] * n
    for i in range(8):
        state = f"{STATE} Ticket {i}: the customer writes again about case {1000 + 37 * i}."
        estimating = post_ok(http, body(state, rotated(names, i % n), "prior"))
        diagnostics = estimating["x_diagnostics"]["team"]
        assert diagnostics["debias"] == "rotate" and diagnostics["orders"] == n, diagnostics
        sums = [0.0] * n
        for shift in range(n):
            order = rotated(names, shift)
            p = post_ok(http, body(state, order, None))["answers"]["team"]["probabilities"]
            for j, name in enumerate(order):
                sums[j] += math.log(p[name])
        mean = sum(sums) / n / n
        for j in range(n):
            log_prior_sum[j] += sums[j] / n - mean
    logits = [s / 8 for s in log_prior_sum]
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    prior = [w / sum(weights) for w in weights]

    state = f"{STATE} A new ticket: the card was charged three times."
    corrected = post_ok(http, body(state, names, "prior"))
    diagnostics = corrected["x_diagnostics"]["team"]
    assert diagnostics == {**diagnostics, "debias": "prior", "orders": 1, "prior_samples": 8}, diagnostics
    assert "order_sensitivity" not in diagnostics
    plain = post_ok(http, body(state, names, None))["answers"]["team"]["probabilities"]
    raw = [plain[name] / prior[j] for j, name in enumerate(names)]
    expected = {name: r / sum(raw) for name, r in zip(names, raw)}
    got = corrected["answers"]["team"]["probabilities"]
    for name in names:
        assert abs(got[name] - expected[name]) < INVARIANCE_TOL, (name, got, expected, prior)
