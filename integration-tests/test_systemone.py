"""POST /v1/systemone end to end on the embedded SmolLM2 (float32): response shape, derived numbers, and
probabilities equal to an independent transformers read of the same prompts (spec/PROMPTS.md §1, §3-4).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from launchers import LAUNCHER_BINARY, Launcher
from reference import Reference, messages_for
from wire import REQUEST_ID_HEADER, error_detail, exchange, label_probabilities, ok_answers, post_systemone

PROBABILITY_TOL = 1e-4  # server vs the transformers reference (different kernels, batched tree read)
INVARIANCE_TOL = 1e-5  # the same question read by the same server in different company

TICKET = (
    "Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised last week "
    "still hasn't arrived. Please fix this today or I will dispute the charge with my bank."
)

ALL_TYPES: dict[str, Any] = {
    "model": "jev-latest",
    "state": TICKET,
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this ticket?",
            "criteria": {
                "billing": "payments, invoices and refunds",
                "technical": "bugs, outages and integrations",
                "sales": None,
            },
        },
        "dispute": {
            "type": "noul",
            "instructions": "Is the customer threatening to dispute the charge?",
            "criteria": {"true": "they mention their bank or a chargeback"},
        },
        "anger": {
            "type": "score",
            "instructions": "How frustrated is the customer?",
            "criteria": ["calm", "annoyed", "frustrated", "furious"],
        },
    },
}

# spec/API.md §1, the request example as a client would send it with curl.
API_EXAMPLE: dict[str, Any] = {
    "model": "jev-latest",
    "state": "I was charged twice for March and nobody answers my emails!",
    "instructions": "You triage support tickets for an online shop.",
    "questions": {
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "payments", "tech": None}},
        "urgent": {
            "type": "noul",
            "instructions": "Needs a reply within the hour?",
            "criteria": {"true": "money is moving"},
        },
        "tone": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "furious"]},
    },
    "chat_template_kwargs": {"enable_thinking": False},
    "cache_salt": "integration-tests",
}


def assert_matches_reference(reference: Reference, request: dict[str, Any], payload: dict[str, Any]) -> None:
    """Every answer's label distribution and label mass equal the transformers read within PROBABILITY_TOL."""
    problems = []
    for qid, question in request["questions"].items():
        read = reference.read(request, question)
        got = label_probabilities(question, payload["answers"][qid])
        worst = max(abs(a - b) for a, b in zip(got, read.probabilities))
        if worst > PROBABILITY_TOL:
            problems.append(f"{qid}: server {got} vs reference {read.probabilities} (max diff {worst:.2e})")
        diag = payload["x_diagnostics"][qid]
        if abs(diag["label_mass"] - read.label_mass) > PROBABILITY_TOL:
            problems.append(f"{qid}: label_mass {diag['label_mass']} vs reference {read.label_mass}")
        if diag["argmax_is_label"] != read.argmax_is_label:
            problems.append(f"{qid}: argmax_is_label {diag['argmax_is_label']} vs reference {read.argmax_is_label}")
    assert not problems, (
        "answers differ from the transformers reference:\n  "
        + "\n  ".join(problems)
        + (
            "\nprompt of the first question as the reference renders it:\n"
            + repr(reference.render(messages_for(request, next(iter(request["questions"].values())))))
        )
    )


@pytest.fixture(scope="module")
def all_types(http: httpx2.Client) -> tuple[dict[str, Any], httpx2.Response]:
    return ok_answers(http, ALL_TYPES)


def test_all_three_types_have_the_contract_shape(all_types: tuple[dict[str, Any], httpx2.Response]) -> None:
    payload, response = all_types
    # ok_answers checked fields, JSON types, Σp = 1, choice = argmax, score = Σ i·p_i, both confidence formulas,
    # legend = levels, integer usage and x_diagnostics; here the specifics of this request.
    answers = payload["answers"]
    assert answers["team"]["choice"] == max(answers["team"]["probabilities"], key=answers["team"]["probabilities"].get)
    assert answers["anger"]["legend"] == {"0": "calm", "1": "annoyed", "2": "frustrated", "3": "furious"}
    assert "confidence" not in answers["dispute"]
    assert response.headers[REQUEST_ID_HEADER].strip()


def test_answers_say_where_their_time_went(
    all_types: tuple[dict[str, Any], httpx2.Response], http: httpx2.Client
) -> None:
    _, response = all_types
    timing = {}
    for entry in response.headers["server-timing"].split(","):
        name, _, duration = entry.strip().partition(";dur=")
        timing[name] = float(duration)
    assert set(timing) == {"router", "queue", "shard"}
    assert timing["shard"] > 0 and timing["router"] >= 0 and timing["queue"] >= 0
    metrics = http.get("/metrics").text
    assert "decision_router_overhead_seconds_count" in metrics
    assert "decision_queue_wait_seconds_count" in metrics
    # Errors carry no timing: nothing was read.
    refused = post_systemone(http, {"state": "x", "questions": {}})
    assert refused.status_code == 422 and "server-timing" not in refused.headers


def test_all_three_types_match_the_reference(
    all_types: tuple[dict[str, Any], httpx2.Response], reference: Reference
) -> None:
    payload, _ = all_types
    assert_matches_reference(reference, ALL_TYPES, payload)


def test_usage_counts_the_prompt_tokens(
    all_types: tuple[dict[str, Any], httpx2.Response], reference: Reference
) -> None:
    payload, _ = all_types
    lengths = [reference.read(ALL_TYPES, q).prompt_tokens for q in ALL_TYPES["questions"].values()]
    used = payload["usage"]["input_tokens"]
    # Prefilled tokens: at least the longest prompt, at most every prompt in full (shared prefixes count once).
    assert max(lengths) <= used <= sum(lengths), f"usage {payload['usage']} for prompts of {lengths} tokens"


def test_request_ids_differ_between_requests(http: httpx2.Client) -> None:
    body = {"state": "x", "questions": {"q": {"type": "noul", "instructions": "Is it x?"}}}
    a = post_systemone(http, body)
    b = post_systemone(http, body)
    assert a.status_code == b.status_code == 200, exchange(body, a) + exchange(body, b)
    assert a.headers.get(REQUEST_ID_HEADER) and b.headers.get(REQUEST_ID_HEADER)
    assert a.headers[REQUEST_ID_HEADER] != b.headers[REQUEST_ID_HEADER]


def test_api_md_example(http: httpx2.Client, reference: Reference) -> None:
    payload, _ = ok_answers(http, API_EXAMPLE)
    assert set(payload["answers"]["team"]["probabilities"]) == {"billing", "tech"}
    assert payload["answers"]["tone"]["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    assert_matches_reference(reference, API_EXAMPLE, payload)


def test_api_md_example_with_authorization_header_when_auth_is_off(http: httpx2.Client) -> None:
    payload, _ = ok_answers(http, API_EXAMPLE, headers={"authorization": "Bearer whatever-the-client-has"})
    assert set(payload["answers"]) == {"team", "urgent", "tone"}


# ---------------------------------------------------------------------------------------------------------------
# Invariance: a question's answer depends on the state and the question, not on its id or its company.


def _flat(question: dict[str, Any], answer: dict[str, Any]) -> list[float]:
    return label_probabilities(question, answer)


def _compare(base: dict[str, Any], other: dict[str, Any], pairs: list[tuple[str, str]], what: str) -> None:
    diffs = []
    for base_id, other_id in pairs:
        question = ALL_TYPES["questions"][base_id]
        a = _flat(question, base["answers"][base_id])
        b = _flat(question, other["answers"][other_id])
        worst = max(abs(x - y) for x, y in zip(a, b))
        if worst > INVARIANCE_TOL:
            diffs.append(f"{base_id} → {other_id}: {a} vs {b} (max diff {worst:.2e})")
    assert not diffs, f"answers moved when {what}:\n  " + "\n  ".join(diffs)


def test_invariant_to_question_id(http: httpx2.Client, all_types: tuple[dict[str, Any], httpx2.Response]) -> None:
    renamed = {"zz-renamed.1": "team", "Q 🙂": "dispute", "x_y_z": "anger"}
    body = copy.deepcopy(ALL_TYPES)
    body["questions"] = {new: ALL_TYPES["questions"][old] for new, old in renamed.items()}
    payload, _ = ok_answers(http, body)
    _compare(all_types[0], payload, [(old, new) for new, old in renamed.items()], "question ids were renamed")


def test_invariant_to_question_order(http: httpx2.Client, all_types: tuple[dict[str, Any], httpx2.Response]) -> None:
    body = copy.deepcopy(ALL_TYPES)
    body["questions"] = dict(reversed(list(ALL_TYPES["questions"].items())))
    payload, _ = ok_answers(http, body)
    _compare(all_types[0], payload, [(q, q) for q in ALL_TYPES["questions"]], "the question order was reversed")


def test_invariant_to_companion_questions(
    http: httpx2.Client, all_types: tuple[dict[str, Any], httpx2.Response]
) -> None:
    body = copy.deepcopy(ALL_TYPES)
    body["questions"] = {
        "lang": {
            "type": "choice",
            "instructions": "What language is the ticket in?",
            "criteria": {"English": None, "Other": None},
        },
        **ALL_TYPES["questions"],
        "polite": {
            "type": "score",
            "instructions": "How polite is the message?",
            "criteria": ["rude", "neutral", "polite"],
        },
        "today": {"type": "noul", "instructions": "Does the customer need an answer today?"},
    }
    payload, _ = ok_answers(http, body)
    _compare(all_types[0], payload, [(q, q) for q in ALL_TYPES["questions"]], "other questions were added")


def test_each_question_alone_gives_the_same_answer(
    http: httpx2.Client, all_types: tuple[dict[str, Any], httpx2.Response]
) -> None:
    for qid, question in ALL_TYPES["questions"].items():
        body = {"model": "jev-latest", "state": TICKET, "questions": {f"alone-{qid}": question}}
        payload, _ = ok_answers(http, body)
        _compare(all_types[0], payload, [(qid, f"alone-{qid}")], f"'{qid}' was asked alone")


def test_invariant_under_concurrent_requests(
    server_url: str, all_types: tuple[dict[str, Any], httpx2.Response]
) -> None:
    """Requests that arrive together are batched into one forward pass; the numbers must not notice."""
    from concurrent.futures import ThreadPoolExecutor

    def send(_: int) -> dict[str, Any]:
        with httpx2.Client(base_url=server_url, timeout=120.0) as client:
            return ok_answers(client, ALL_TYPES)[0]

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(send, range(4)))
    for payload in results:
        _compare(all_types[0], payload, [(q, q) for q in ALL_TYPES["questions"]], "requests were sent concurrently")


# ---------------------------------------------------------------------------------------------------------------
# Edges of the contract.


def test_255_option_choice(http: httpx2.Client) -> None:
    # Short names keep the prompt near 1,500 tokens: a CPU prefill of this size already takes a while.
    criteria = {f"q{i}": ("refunds" if i == 200 else None) for i in range(1, 256)}
    body = {
        "state": TICKET,
        "questions": {"queue": {"type": "choice", "instructions": "Which queue?", "criteria": criteria}},
    }
    payload, _ = ok_answers(http, body, timeout=300.0)
    probabilities = payload["answers"]["queue"]["probabilities"]
    assert len(probabilities) == 255
    assert list(probabilities) == list(criteria)
    assert abs(math.fsum(probabilities.values()) - 1) < 1e-5
    assert all(p > 0 for p in probabilities.values()), "every option must get a probability mass above zero"


def test_single_option_and_single_level(http: httpx2.Client) -> None:
    body = {
        "state": TICKET,
        "questions": {
            "only": {"type": "choice", "instructions": "Team?", "criteria": {"Billing": None}},
            "one-level": {"type": "score", "instructions": "Anger?", "criteria": ["Calm"]},
        },
    }
    payload, _ = ok_answers(http, body)
    only = payload["answers"]["only"]
    assert only["choice"] == "Billing" and abs(only["probabilities"]["Billing"] - 1) < 1e-6 and only["confidence"] == 1
    level = payload["answers"]["one-level"]
    assert abs(level["score"]) < 1e-6 and abs(level["probabilities"]["0"] - 1) < 1e-6 and level["confidence"] == 1


def test_unicode_ids_and_option_names_are_echoed_byte_exact(http: httpx2.Client, reference: Reference) -> None:
    names = ["Café ☕", "日本語", " spaced name ", "e\u0301tude", "👩‍👩‍👧 family"]
    ids = ["Q 🙂", "e\u0301", "日本語の質問", "x.y/z ü", "\u200bzero-width"]
    questions: dict[str, Any] = {
        ids[0]: {"type": "choice", "instructions": "Which one is about a drink?", "criteria": {n: None for n in names}},
        ids[1]: {"type": "noul", "instructions": "Is the text about coffee?"},
        ids[2]: {"type": "score", "instructions": "¿Qué tan feliz?", "criteria": ["😞", "😐", "😀"]},
        ids[3]: {"type": "choice", "instructions": "Ünïcödé?", "criteria": {"ja": "ÿes", "nein": None}},
        ids[4]: {"type": "noul", "criteria": {"false": "nicht über Kaffee"}},
    }
    body = {"state": "Ich trinke gern Café ☕ am Morgen — 朝のコーヒー.", "questions": questions}
    payload, response = ok_answers(http, body)
    assert list(payload["answers"]) == ids
    assert [k.encode() for k in payload["answers"]] == [k.encode() for k in ids]
    echoed = list(payload["answers"][ids[0]]["probabilities"])
    assert [n.encode() for n in echoed] == [n.encode() for n in names]
    assert payload["answers"][ids[0]]["choice"].encode() in {n.encode() for n in names}
    assert payload["answers"][ids[2]]["legend"] == {"0": "😞", "1": "😐", "2": "😀"}
    assert_matches_reference(reference, body, payload)


def test_object_state_is_rendered_as_json(http: httpx2.Client, reference: Reference) -> None:
    state = {
        "ticket": "Remboursement non reçu — « urgent »",
        "days": 12,
        "amount": 49.5,
        "paid": True,
        "agent": None,
        "tags": ["billing", "refund"],
        "customer": {"zname": "Zoë", "aid": 7},
    }
    body = {
        "state": state,
        "questions": {
            "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
            "team": {"type": "choice", "instructions": "Team?", "criteria": {"billing": None, "tech": None}},
        },
    }
    payload, _ = ok_answers(http, body)
    assert_matches_reference(reference, body, payload)


def test_array_state_is_rendered_as_json(http: httpx2.Client, reference: Reference) -> None:
    body = {
        "state": [{"from": "customer", "text": "Where is my refund?"}, {"from": "agent", "text": "Checking."}, 3, None],
        "questions": {"refund": {"type": "noul", "instructions": "Is the customer asking for money back?"}},
    }
    payload, _ = ok_answers(http, body)
    assert_matches_reference(reference, body, payload)


def test_non_string_instructions_descriptions_and_levels(http: httpx2.Client, reference: Reference) -> None:
    body = {
        "state": TICKET,
        "instructions": {"role": "triage", "rules": ["be strict", "prefer billing"]},
        "questions": {
            "team": {
                "type": "choice",
                "instructions": ["Which team?", "Pick one."],
                "criteria": {"billing": {"covers": ["refunds", "invoices"]}, "tech": ["bugs"]},
            },
            "refund": {
                "type": "noul",
                "instructions": {"ask": "money back?"},
                "criteria": {"true": ["refund"], "false": None},
            },
            "anger": {"type": "score", "instructions": "Anger?", "criteria": [{"level": "low"}, ["mid"], "high"]},
        },
    }
    payload, _ = ok_answers(http, body)
    assert payload["answers"]["anger"]["legend"] == {"0": {"level": "low"}, "1": ["mid"], "2": "high"}
    assert_matches_reference(reference, body, payload)


def test_state_floats_are_rendered_like_python_json(http: httpx2.Client, reference: Reference) -> None:
    """Python writes 1e-07 and 1e+20 where Rust's default float printing writes 1e-7 and 1e20."""
    body = {
        "state": {"ratio": 1e-07, "volume": 1e20, "price": 0.1, "count": 3.0},
        "questions": {"small": {"type": "noul", "instructions": "Is the ratio tiny?"}},
    }
    payload, _ = ok_answers(http, body)
    assert_matches_reference(reference, body, payload)


def test_any_model_name_is_accepted_and_the_served_name_is_returned(
    http: httpx2.Client, server_info: dict[str, Any]
) -> None:
    base = {"state": "x", "questions": {"q": {"type": "noul", "instructions": "Is it x?"}}}
    names = []
    for model in ("jev-latest", "gpt-4o", "some/other-model", "", None):
        body = dict(base)
        if model is not None:
            body["model"] = model
        payload, _ = ok_answers(http, body)
        names.append(payload["model"])
    assert len(set(names)) == 1, f"the response's model followed the request's: {names}"
    assert names[0] == "SmolLM2-135M-Instruct", f"served name {names[0]!r} (info: {server_info.get('model_id')!r})"


def test_models_endpoint_lists_the_served_model(http: httpx2.Client) -> None:
    r = http.get("/v1/models")
    assert r.status_code == 200, r.text
    assert r.headers.get(REQUEST_ID_HEADER)
    models = r.json()["models"]
    assert isinstance(models, list) and models
    for m in models:
        assert isinstance(m["name"], str) and isinstance(m["description"], str) and isinstance(m["release_date"], str)
        assert len(m["release_date"]) == 10 and m["release_date"][4] == "-" and m["release_date"][7] == "-", m
    assert "SmolLM2-135M-Instruct" in [m["name"] for m in models]


def test_operations_endpoints(
    http: httpx2.Client, server_info: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    health = http.get("/health")
    assert health.status_code == 200 and health.headers.get(REQUEST_ID_HEADER)
    assert server_info["dtype"] in ("float32", "torch.float32"), server_info
    # The suites pin --matmul exact (conftest); test_matmul_auto_* below runs the default.
    assert server_info["read_mode"] == "tree" and server_info["matmul"] == "exact", server_info
    assert server_info["compiled_chains"] is False, server_info  # float32 has no compiled chains
    # The local suite runs eagerly (launchers.launcher_env: each shard start would compile); the image runs the
    # serving default, so the whole container suite reads through the compiled layers (`--compile auto`).
    container = request.node.callspec.params["server_url"] == "container"
    assert server_info["compiled_layers"] is container, server_info
    # On CPU packed passes attend with the split kernels (FlexAttention and per-segment SDPA are the off-CPU forms).
    assert server_info["segment_attention"] == "split", server_info
    metrics = http.get("/metrics")
    assert metrics.status_code == 200, metrics.text[:500]
    assert "# TYPE" in metrics.text, metrics.text[:500]


def test_matmul_auto_runs_the_mode_it_measured_and_decides_like_exact(
    launcher_factory: Callable[..., Launcher], session_launcher: Launcher
) -> None:
    """The serving defaults, --matmul auto and --compile auto: the shard times the float32 GEMMs at load and runs the
    fastest mode that pays (on AMX CPUs the bfloat16 split GEMM, elsewhere oneDNN or MKL), its layers compiled
    between attentions (`layer_graph`, the mode's weights held for the graph): every answer is the exact eager
    server's argmax, and every probability within 1e-4 of it (320 of 320 questions agreed, max |dp| 1.8e-5,
    docs/benchmarks.md)."""
    launcher = launcher_factory(["--dtype", "float32", "--compile", "auto", "--hostname", "127.0.0.1"], name="auto")
    launcher.wait_healthy(timeout_s=300)
    with httpx2.Client(base_url=launcher.url, timeout=120) as auto:
        info = auto.get("/info").json()
        # It reports the mode it measured fastest on this CPU, never "auto".
        assert info["matmul"] in ("exact", "fast", "split"), info
        assert info["compiled_layers"] is True, info
        got, _ = ok_answers(auto, ALL_TYPES)
    with httpx2.Client(base_url=session_launcher.url, timeout=120) as exact:
        want, _ = ok_answers(exact, ALL_TYPES)
    for qid, question in ALL_TYPES["questions"].items():
        ours = label_probabilities(question, got["answers"][qid])
        exact = label_probabilities(question, want["answers"][qid])
        assert ours.index(max(ours)) == exact.index(max(exact)), (info["matmul"], qid, ours, exact)
        assert max(abs(a - b) for a, b in zip(ours, exact, strict=True)) < 1e-4, (info["matmul"], qid, ours, exact)


def test_mkl_dispatch_features_preloads_its_library_and_reads_like_the_reference(
    launcher_factory: Callable[..., Launcher], reference: Reference
) -> None:
    """--mkl-dispatch features preloads libdecision_mkl_dispatch.so (built next to the launcher) into the shard on any
    CPU, so MKL picks its kernels by instruction sets (`auto` does it on AMD CPUs with AVX-512, where MKL's generic
    kernels ran float32 GEMMs at half the speed). The float32 `exact` read through those kernels still equals the
    transformers reference within PROBABILITY_TOL, and the launcher and the shard both say what they did."""
    launcher = launcher_factory(
        ["--dtype", "float32", "--matmul", "exact", "--mkl-dispatch", "features", "--hostname", "127.0.0.1"],
        name="mkl",
    )
    launcher.wait_healthy(timeout_s=300)
    library = LAUNCHER_BINARY.parent / "libdecision_mkl_dispatch.so"
    shards = [
        pid
        for pid in launcher.remember_tree()
        if b"decision-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert shards, launcher.output_tail()
    environ = Path(f"/proc/{shards[0]}/environ").read_bytes().split(b"\0")
    preload = next((entry for entry in environ if entry.startswith(b"LD_PRELOAD=")), b"")
    assert preload.startswith(f"LD_PRELOAD={library}".encode()), preload
    output = launcher.output()
    assert "MKL kernels chosen by instruction sets" in output, launcher.output_tail()
    # The launcher re-logs the shard's load line as text (`key=value`), or as JSON with --json-output.
    assert any(
        line in output for line in ("mkl_kernels=instruction sets", '"mkl_kernels":"instruction sets"')
    ), launcher.output_tail()
    with httpx2.Client(base_url=launcher.url, timeout=120) as client:
        payload, _ = ok_answers(client, ALL_TYPES)
    assert_matches_reference(reference, ALL_TYPES, payload)


@pytest.mark.parametrize(
    ("matmul", "modes"),
    [(None, ("exact", "widen")), ("widen", ("widen",))],
    ids=["matmul-auto", "matmul-widen"],
)
def test_bfloat16_runs_its_chains_compiled_and_info_says_so(
    launcher_factory: Callable[..., Launcher], matmul: str | None, modes: tuple[str, ...]
) -> None:
    """--dtype bfloat16 with the default --compile auto: the shard builds the elementwise chains (and its layers) with
    torch.compile
    at warm-up, `GET /info` reports `compiled_chains: true` and a half-precision GEMM mode (`--matmul auto` picks
    `exact` or `widen` by timing them on this CPU; `--matmul widen` is kept as asked), and decisions answer through
    them."""
    flags = ["--dtype", "bfloat16", "--compile", "auto", "--hostname", "127.0.0.1"]
    flags += ["--matmul", matmul] if matmul else []
    launcher = launcher_factory(flags, name=f"bf16-{matmul or 'auto'}")
    launcher.wait_healthy(timeout_s=300)
    with httpx2.Client(base_url=launcher.url, timeout=120) as client:
        info = client.get("/info").json()
        assert (info["dtype"], info["compiled_chains"]) == ("bfloat16", True), info
        assert info["matmul"] in modes, info
        answers, _ = ok_answers(client, ALL_TYPES)
    for qid, question in ALL_TYPES["questions"].items():
        probabilities = label_probabilities(question, answers["answers"][qid])
        assert abs(sum(probabilities) - 1) < 1e-3 and min(probabilities) >= 0, (qid, probabilities)


# ---------------------------------------------------------------------------------------------------------------
# Refusals that are not validation errors.


def test_thinking_on_is_refused(http: httpx2.Client) -> None:
    body = copy.deepcopy(API_EXAMPLE)
    body["chat_template_kwargs"] = {"enable_thinking": True}
    r = post_systemone(http, body)
    assert r.status_code == 400, f"thinking on must be refused with 400{exchange(body, r)}"
    assert r.headers.get(REQUEST_ID_HEADER)
    assert error_detail(r)["error_type"] == "invalid_request", exchange(body, r)


@pytest.mark.parametrize("model", ["base:adapter", "SmolLM2-135M-Instruct:my-lora"])
def test_adapter_model_names_are_refused(http: httpx2.Client, model: str) -> None:
    body = {"model": model, "state": "x", "questions": {"q": {"type": "noul", "instructions": "Is it x?"}}}
    r = post_systemone(http, body)
    assert r.status_code == 400, f"an adapter name must be refused with 400{exchange(body, r)}"
    assert r.headers.get(REQUEST_ID_HEADER)
    assert error_detail(r)["error_type"] == "invalid_request", exchange(body, r)
