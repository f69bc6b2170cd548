"""Calibration with provenance end to end on the embedded SmolLM2 (float32): `POST /v1/calibrations` reads a small
labelled set through the decision pipeline and fits it per question signature; `x_calibration` applies the fit after
any debiasing and names it in every answer. The fit's held-out scores are recomputed here from plain reads of the
same examples (the split reproduced from its seed), so the set is read as a request would be.
"""

from __future__ import annotations

import copy
import math
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from launchers import Launcher
from wire import exchange, ok_answers

# Reads of the same prompt in different company (a set's examples batch together; a request reads alone).
READ_TOL = 1e-5
# The fit's scores against the same scores computed here from separate reads.
SCORE_TOL = 1e-4

TEAMS = {"billing": "payments, invoices and refunds", "technical": "bugs, outages and errors", "sales": "new purchases and quotes"}
TICKETS = [
    ("I was charged twice for my March invoice, please refund one payment.", "billing", True),
    ("The app crashes every time I open the settings page.", "technical", True),
    ("We would like a quote for 50 more seats next quarter.", "sales", False),
    ("My card was declined but the money left my account.", "billing", True),
    ("Your API returns error 500 since this morning.", "technical", True),
    ("Do you offer a discount for nonprofits buying the premium plan?", "sales", False),
    ("Where is the refund you promised last week?", "billing", True),
    ("Login works but the dashboard never loads.", "technical", False),
    ("Can someone call me about upgrading our whole team?", "sales", False),
    ("The invoice shows the wrong VAT number.", "billing", False),
    ("Sync with our calendar stopped working after the update.", "technical", True),
    ("I want to buy the enterprise plan, who do I talk to?", "sales", False),
]


def team_question(order: list[str] | None = None) -> dict[str, Any]:
    names = order or list(TEAMS)
    return {"type": "choice", "instructions": "Which team should handle this ticket?", "criteria": {n: TEAMS[n] for n in names}}


URGENT = {"type": "noul", "instructions": "Does the customer say they are losing money or blocked right now?"}


def example(i: int) -> dict[str, Any]:
    text, team, urgent = TICKETS[i]
    # Each example lists the options in its own order: the fit maps them by name.
    names = list(TEAMS)
    order = names[i % 3 :] + names[: i % 3]
    return {"state": text, "questions": {"team": team_question(order), "urgent": URGENT}, "answers": {"team": team, "urgent": urgent}}


def calibration_set(name: str, seed: int = 3) -> dict[str, Any]:
    return {"name": name, "examples": [example(i) for i in range(len(TICKETS))], "seed": seed}


# The held-out split, as the router draws it (calibration/fit.rs: splitmix64-seeded xorshift64*, Fisher-Yates).
MASK = (1 << 64) - 1


def rng(seed: int) -> Callable[[], int]:
    z = (seed + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    state = [(z ^ (z >> 31)) | 1]

    def next_u64() -> int:
        s = state[0]
        s ^= s >> 12
        s ^= (s << 25) & MASK
        s ^= s >> 27
        state[0] = s
        return (s * 0x2545F4914F6CDD1D) & MASK

    return next_u64


def holdout(n: int, fraction: float, seed: int) -> list[bool]:
    k = min(max(math.floor(n * fraction + 0.5), 1), n - 1)
    order = list(range(n))
    draw = rng(seed)
    for i in range(n - 1, 0, -1):
        j = draw() % (i + 1)
        order[i], order[j] = order[j], order[i]
    held = [False] * n
    for i in order[:k]:
        held[i] = True
    return held


def calibrate(p: list[float], temperature: float, biases: list[float] | None) -> list[float]:
    logits = [math.log(max(x, 1e-300)) / temperature + (biases[i] if biases else 0.0) for i, x in enumerate(p)]
    top = max(logits)
    w = [math.exp(z - top) for z in logits]
    return [x / sum(w) for x in w]


def scores(reads: list[tuple[list[float], int]]) -> dict[str, float]:
    log_loss = sum(-math.log(max(p[t], 1e-300)) for p, t in reads) / len(reads)
    bins: dict[int, list[float]] = {}
    for p, t in reads:
        chosen = max(range(len(p)), key=lambda i: (p[i], -i))
        b = min(int(p[chosen] * 10), 9)
        entry = bins.setdefault(b, [0.0, 0.0])
        entry[0] += p[chosen]
        entry[1] += 1.0 if chosen == t else 0.0
    ece = sum(abs(conf - correct) for conf, correct in bins.values()) / len(reads)
    return {"ece": ece, "log_loss": log_loss}


def plain_reads(http: httpx2.Client) -> list[dict[str, Any]]:
    reads = []
    for i in range(len(TICKETS)):
        body = {k: v for k, v in example(i).items() if k != "answers"}
        payload, _ = ok_answers(http, body)
        reads.append(payload["answers"])
    return reads


def fit(http: httpx2.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/calibrations", json=body)
    assert r.status_code == 201, exchange(body, r)
    result = r.json()
    assert isinstance(result, dict)
    return result


def ask(state: str, calibration: str, **extra: Any) -> dict[str, Any]:
    return {"state": state, "x_calibration": calibration, "questions": {"team": team_question(), "urgent": URGENT}, **extra}


def test_a_set_is_read_as_requests_are_and_fitted_per_signature(http: httpx2.Client, server_info: dict[str, Any]) -> None:
    result = fit(http, calibration_set(f"tickets-{uuid.uuid4().hex[:8]}"))
    n = len(TICKETS)
    assert (result["n"], result["n_fit"] + result["n_holdout"]) == (2 * n, 2 * n), result
    assert result["model"] == server_info["model_id"]
    assert result["model_fingerprint"] == server_info["calibrations"]["model_fingerprint"], server_info
    assert result["prompt_format"] == server_info["prompt_format"], (result, server_info)
    assert result["debias"] == "off" and result["seed"] == 3 and result["holdout_fraction"] == 0.3
    by_kind = {s["kind"]: s for s in result["signatures"]}
    assert set(by_kind) == {"choice", "noul"}, result
    choice, noul = by_kind["choice"], by_kind["noul"]
    assert choice["labels"] == sorted(TEAMS) and noul["labels"] == ["true", "false"]
    # 12 answers per signature: far below 30 fitted answers per label, so a temperature or none at all.
    for s in (choice, noul):
        assert s["method"] in ("temperature", "none") and "biases" not in s, s
        assert 0.01 <= s["temperature"] <= 100 and (s["n"], s["n_fit"], s["n_holdout"]) == (n, 8, 4), s

    # The held-out scores, recomputed from plain reads of the same examples.
    reads = plain_reads(http)
    held = holdout(n, 0.3, 3)
    labels = sorted(TEAMS)
    choice_reads = [([reads[i]["team"]["probabilities"][name] for name in labels], labels.index(TICKETS[i][1])) for i in range(n)]
    noul_reads = [([reads[i]["urgent"]["noul"], 1 - reads[i]["urgent"]["noul"]], 0 if TICKETS[i][2] else 1) for i in range(n)]
    for s, rows in ((choice, choice_reads), (noul, noul_reads)):
        test_rows = [r for r, h in zip(rows, held) if h]
        before = scores(test_rows)
        after = scores([(calibrate(p, s["temperature"], None), t) for p, t in test_rows])
        for key in ("ece", "log_loss"):
            assert abs(s["before"][key] - before[key]) < SCORE_TOL, (s, before)
            assert abs(s["after"][key] - after[key]) < SCORE_TOL, (s, after)
        # What is kept lowered the held-out log-loss; a 'none' is temperature 1 and names the fit it rejected.
        if s["method"] == "temperature":
            assert after["log_loss"] < before["log_loss"] and "reason" not in s, s
        else:
            assert s["temperature"] == 1.0 and s["after"] == s["before"], s
            assert s["reason"].startswith("method 'temperature'"), s

    # Applied: the plain read's probabilities, calibrated by name, with the fit named in the diagnostics.
    state = "Please refund the duplicate charge on my card."
    plain, _ = ok_answers(http, {"state": state, "questions": {"team": team_question(), "urgent": URGENT}})
    payload, _ = ok_answers(http, ask(state, result["id"]))
    names = list(TEAMS)
    want = calibrate([plain["answers"]["team"]["probabilities"][k] for k in sorted(names)], choice["temperature"], None)
    got = payload["answers"]["team"]["probabilities"]
    for name, w in zip(sorted(names), want):
        assert abs(got[name] - w) < READ_TOL, (got, want)
    want_yes = calibrate([plain["answers"]["urgent"]["noul"], 1 - plain["answers"]["urgent"]["noul"]], noul["temperature"], None)[0]
    assert abs(payload["answers"]["urgent"]["noul"] - want_yes) < READ_TOL
    diagnostics = payload["x_diagnostics"]
    for question, s in (("team", choice), ("urgent", noul)):
        report = diagnostics[question]["calibration"]
        if s["method"] == "none":
            assert report["id"] is None and result["id"] in report["reason"], report
        else:
            assert report == {"id": result["id"], "signature": s["signature"]}, report
    listed = http.get("/v1/calibrations").json()["calibrations"]
    assert any(c["id"] == result["id"] and c["n_signatures"] == 2 for c in listed), listed


def test_calibration_applies_after_debiasing_and_composes_with_it(http: httpx2.Client) -> None:
    body = calibration_set(f"rotated-{uuid.uuid4().hex[:8]}")
    body["x_debias"] = "rotate"
    result = fit(http, body)
    assert result["debias"] == "rotate"
    choice = next(s for s in result["signatures"] if s["kind"] == "choice")
    state = "The export button does nothing on Safari."
    rotated, _ = ok_answers(http, {"state": state, "x_debias": "rotate", "questions": {"team": team_question(), "urgent": URGENT}})
    both, _ = ok_answers(http, ask(state, result["id"], x_debias="rotate"))
    labels = sorted(TEAMS)
    want = calibrate([rotated["answers"]["team"]["probabilities"][k] for k in labels], choice["temperature"], None)
    for name, w in zip(labels, want):
        assert abs(both["answers"]["team"]["probabilities"][name] - w) < READ_TOL
    team = both["x_diagnostics"]["team"]
    applied = result["id"] if choice["method"] != "none" else None
    assert team["debias"] == "rotate" and team["orders"] == 3 and team["calibration"]["id"] == applied, team


def test_auto_matches_by_signature_and_says_when_nothing_matched(http: httpx2.Client) -> None:
    result = fit(http, calibration_set(f"auto-{uuid.uuid4().hex[:8]}"))
    choice = next(s for s in result["signatures"] if s["kind"] == "choice")
    other = {"type": "choice", "instructions": "Which language is the ticket in?", "criteria": {"english": None, "french": None}}
    body = {"state": "Bonjour, ma facture est fausse.", "x_calibration": "auto", "questions": {"team": team_question(), "lang": other}}
    payload, _ = ok_answers(http, body)
    # The newest fit holding the signature is this one: applied, or (kept 'none') named in the reason.
    team = payload["x_diagnostics"]["team"]["calibration"]
    if choice["method"] == "none":
        assert team["id"] is None and result["id"] in team["reason"], team
    else:
        assert team == {"id": result["id"], "signature": choice["signature"]}, team
    lang = payload["x_diagnostics"]["lang"]["calibration"]
    assert lang["id"] is None and "no calibration of this model and prompt format" in lang["reason"], lang
    # The unmatched answer is the plain read's.
    plain, _ = ok_answers(http, {"state": body["state"], "questions": {"lang": other}})
    for k, v in plain["answers"]["lang"]["probabilities"].items():
        assert abs(payload["answers"]["lang"]["probabilities"][k] - v) < READ_TOL


def test_a_fit_for_another_model_or_prompt_format_is_refused_naming_x_calibration(http: httpx2.Client) -> None:
    result = fit(http, calibration_set(f"foreign-{uuid.uuid4().hex[:8]}"))
    exported = http.get(f"/v1/calibrations/{result['id']}/export").json()
    for field, value in (("model_fingerprint", "ffffffffffffffff"), ("prompt_format", {"name": "sglang", "version": 1})):
        doc = copy.deepcopy(exported)
        doc["calibration"][field] = value
        doc["calibration"]["id"] = f"cal-foreign-{uuid.uuid4().hex[:8]}"
        r = http.post("/v1/calibrations/import", json=doc)
        assert r.status_code == 201, r.text
        body = ask("My invoice is wrong.", doc["calibration"]["id"])
        r = http.post("/v1/systemone", json=body)
        assert r.status_code == 400, exchange(body, r)
        assert r.json()["detail"]["message"].startswith("x_calibration: "), r.text
        openai = {"model": "m", "input": "x", "x_calibration": doc["calibration"]["id"], "questions": [{"type": "predicate", "instructions": "i"}]}
        r = http.post("/v1/decisions", json=openai)
        assert r.status_code == 400 and r.json()["error"]["param"] == "x_calibration", r.text
        assert http.delete(f"/v1/calibrations/{doc['calibration']['id']}").status_code == 204


@pytest.mark.parametrize(
    ("route", "body", "status", "field"),
    [
        ("/v1/calibrations", {"name": "x", "examples": []}, 422, "examples"),
        ("/v1/calibrations", {"name": "x", "examples": [example(0)] * 4, "holdout_fraction": 1}, 422, "holdout_fraction"),
        ("/v1/calibrations", {"name": "x", "examples": [example(0)] * 4, "seed": "a"}, 422, "seed"),
        ("/v1/calibrations", {"examples": [example(0)] * 4}, 422, "name"),
        ("/v1/calibrations", {"name": "x", "examples": [{**example(0), "answers": {"team": "legal", "urgent": True}}] * 4}, 422, "answers"),
        ("/v1/calibrations", {"name": "x", "examples": [example(0)] * 3}, 422, "examples"),
        ("/v1/calibrations/import", {"kind": "other", "version": 1}, 422, "kind"),
        ("/v1/systemone", ask("s", "bad id!"), 422, "x_calibration"),
        ("/v1/systemone", ask("s", "cal-none-here"), 400, "x_calibration"),
        ("/v1/decisions", {"model": "m", "input": "x", "x_calibration": 4, "questions": [{"type": "predicate", "instructions": "i"}]}, 400, "x_calibration"),
        ("/v1/decisions", {"input": "x", "x_calibration": [], "questions": [{"id": "u", "type": "yes_no", "question": "q"}]}, 400, "x_calibration"),
    ],
)
def test_every_new_field_is_refused_naming_it(http: httpx2.Client, route: str, body: dict[str, Any], status: int, field: str) -> None:
    r = http.post(route, json=body)
    assert r.status_code == status, exchange(body, r)
    assert field in r.text, r.text


def test_unknown_ids_are_404s(http: httpx2.Client) -> None:
    for r in (http.get("/v1/calibrations/cal-nothing"), http.get("/v1/calibrations/cal-nothing/export"), http.delete("/v1/calibrations/cal-nothing")):
        assert r.status_code == 404, r.text
        assert "cal-nothing" in r.json()["detail"]["message"]


@pytest.mark.local_only
def test_fits_survive_a_restart_and_an_export_answers_alike_on_a_second_server(
    launcher_factory: Callable[..., Launcher], http: httpx2.Client, tmp_path: Path
) -> None:
    """The issue's tests: persistence across a restart (--data-dir), and export -> import on a second server (the
    session server) giving identical answers."""
    args = ["--hostname", "127.0.0.1", "--dtype", "float32", "--matmul", "exact", "--data-dir", str(tmp_path / "data")]
    first = launcher_factory(args, name="calib")
    first.wait_healthy(timeout_s=300)
    state = "I was billed for a plan I cancelled."
    with httpx2.Client(base_url=first.url, timeout=120) as client:
        result = fit(client, calibration_set("kept", seed=5))
        before_restart, _ = ok_answers(client, ask(state, result["id"]))
    assert (tmp_path / "data" / "calibrations.sqlite3").is_file()
    assert first.stop(grace_s=20.0) == 0, first.output_tail()
    again = launcher_factory(args, name="calib")
    again.wait_healthy(timeout_s=300)
    with httpx2.Client(base_url=again.url, timeout=120) as client:
        assert client.get(f"/v1/calibrations/{result['id']}").json() == result
        after_restart, _ = ok_answers(client, ask(state, result["id"]))
        exported = client.get(f"/v1/calibrations/{result['id']}/export").json()
    # The same fit, bit for bit; the reads of two processes agree to float noise (about 1e-7 here), not to the bit,
    # so the answers are compared to READ_TOL (the router's suite holds export -> import to the bit on equal reads).
    assert_same_answers(after_restart, before_restart)
    r = http.post("/v1/calibrations/import", json=exported)
    assert r.status_code == 201, r.text
    assert r.json() == result
    elsewhere, _ = ok_answers(http, ask(state, result["id"]))
    assert_same_answers(elsewhere, after_restart)


def assert_same_answers(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["answers"]["team"]["choice"] == b["answers"]["team"]["choice"], (a, b)
    for name in TEAMS:
        assert abs(a["answers"]["team"]["probabilities"][name] - b["answers"]["team"]["probabilities"][name]) < READ_TOL, (a, b)
    assert abs(a["answers"]["urgent"]["noul"] - b["answers"]["urgent"]["noul"]) < READ_TOL, (a, b)
    for q in ("team", "urgent"):
        assert a["x_diagnostics"][q]["calibration"] == b["x_diagnostics"][q]["calibration"], (a, b)
