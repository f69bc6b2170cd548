"""Writes router/src/api/openapi_examples.json: a request and the answers of every route and status in the OpenAPI
document, taken from a running server of the embedded default model started with `--api-key example-key` (so its
401s are real). Statuses the suite's model cannot be driven to (overload, a model that cannot be served, a shard that
is down) are written here from the router's own messages (router/src/error.rs).

    .venv/bin/decision-launcher --api-key example-key --port 3999 &
    .venv/bin/python scripts/openapi_examples.py --url http://127.0.0.1:3999
    make install && .venv/bin/decision-router --print-openapi > docs/openapi.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx2

KEY = "example-key"
OUT = Path(__file__).resolve().parent.parent / "router/src/api/openapi_examples.json"
JSON = "application/json"

SYSTEMONE = {
    "state": "Hi, I was charged twice for my subscription this month. Please refund one of the payments.",
    "instructions": "You route a support inbox.",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this message?",
            "criteria": {"billing": "payments and refunds", "technical": None, "account": "logins and profiles"},
        },
        "urgent": {
            "type": "noul",
            "instructions": "Does it need a reply within the hour?",
            "criteria": {"true": "money is moving"},
        },
        "tone": {
            "type": "score",
            "instructions": "How upset is the writer?",
            "criteria": ["calm", "annoyed", "furious"],
        },
    },
}
OPENAI = {
    "model": "SmolLM2-135M-Instruct",
    "input": "I was charged twice and the refund has not arrived.",
    "questions": [
        {
            "type": "choice",
            "name": "team",
            "instructions": "Which team should handle this?",
            "choices": [{"value": "billing", "description": "payments and refunds"}, {"value": "technical"}],
        },
        {"type": "predicate", "name": "urgent", "instructions": "Does it need a reply within the hour?"},
        {
            "type": "score",
            "name": "tone",
            "instructions": "How upset is the writer?",
            "levels": [{"label": "calm"}, {"label": "annoyed"}, {"label": "furious"}],
        },
    ],
}
SGLANG = {
    "input": "I was charged twice and the refund has not arrived.",
    "questions": [
        {
            "id": "team",
            "type": "choice",
            "question": "Which team should handle this?",
            "options": [{"name": "billing", "description": "payments and refunds"}, {"name": "technical"}],
        },
        {"id": "urgent", "type": "yes_no", "question": "Does it need a reply within the hour?"},
    ],
    "temperature": 1.0,
    "return_prompt_token_ids": False,
}
# Over the default 65536 prompt tokens: refused before any read.
LONG_STATE = "refund " * 70_000

OVERLOADED = "the server is at capacity (4096 reads queued, limit 4096); retry after 1 s"
NOT_SERVABLE = "no read strategy for architecture 'BertForMaskedLM'; known: LlamaForCausalLM, Qwen3ForCausalLM, …, and other causal language models (…ForCausalLM)"


def example(summary: str, value: Any) -> dict[str, Any]:
    return {"summary": summary, "value": value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3999")
    args = parser.parse_args()
    keyed = {"Authorization": f"Bearer {KEY}"}
    client = httpx2.Client(base_url=args.url, timeout=120)

    def post(path: str, body: Any, status: int, key: bool = True) -> Any:
        r = client.post(path, json=body, headers=keyed if key else {})
        assert r.status_code == status, (path, status, r.status_code, r.text)
        return r.json()

    s1_error = {"detail": {"error_type": "overloaded", "message": OVERLOADED}}
    systemone = {
        "request": {JSON: {"three_types": example("a choice, a yes/no (noul) and a score on one state", SYSTEMONE)}},
        "responses": {
            "200": {
                JSON: {
                    "answers": example(
                        "per question; label mass in x_diagnostics", post("/v1/systemone", SYSTEMONE, 200)
                    )
                }
            },
            "422": {
                JSON: {
                    "validation": example(
                        "a score's levels given as a map",
                        post(
                            "/v1/systemone",
                            {**SYSTEMONE, "questions": {"tone": {"type": "score", "criteria": {"calm": 0}}}},
                            422,
                        ),
                    )
                }
            },
            "400": {
                JSON: {
                    "adapter": example(
                        "a `base:adapter` model name",
                        post("/v1/systemone", {**SYSTEMONE, "model": "base:adapter"}, 400),
                    )
                }
            },
            "401": {
                JSON: {
                    "no_key": example(
                        "--api-key is set and the request has no Bearer key",
                        post("/v1/systemone", SYSTEMONE, 401, key=False),
                    )
                }
            },
            "413": {
                JSON: {
                    "tokens": example(
                        "a prompt longer than the model reads (max_position_embeddings; --max-input-tokens likewise)",
                        post("/v1/systemone", {**SYSTEMONE, "state": LONG_STATE}, 413),
                    )
                }
            },
            "429": {JSON: {"overloaded": example("the queue is full (outside the default profile)", s1_error)}},
            "529": {JSON: {"overloaded": example("the queue is full; retry after Retry-After", s1_error)}},
            "501": {
                JSON: {
                    "not_servable": example(
                        "the model cannot be read as a decision model",
                        {"detail": {"error_type": "not_implemented", "message": NOT_SERVABLE}},
                    )
                }
            },
        },
    }

    def openai_error(kind: str, code: str | None, param: str | None, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}

    decisions = {
        "request": {
            JSON: {
                "openai": example("OpenAI's shape (decisions.create)", OPENAI),
                "sglang": example("SGLang's shape", SGLANG),
            }
        },
        "responses": {
            "200": {
                JSON: {
                    "openai": example("answers in question order", post("/v1/decisions", OPENAI, 200)),
                    "sglang": example("answers by id, with label_mass", post("/v1/decisions", SGLANG, 200)),
                }
            },
            "400": {
                JSON: {
                    "openai": example(
                        "too few choices",
                        post(
                            "/v1/decisions",
                            {
                                **OPENAI,
                                "questions": [
                                    {"type": "choice", "instructions": "Which?", "choices": [{"value": "only"}]}
                                ],
                            },
                            400,
                        ),
                    ),
                    "sglang": example(
                        "a level list that is too short",
                        post(
                            "/v1/decisions",
                            {
                                **SGLANG,
                                "questions": [
                                    {"id": "tone", "type": "score", "question": "How upset?", "levels": ["calm"]}
                                ],
                            },
                            400,
                        ),
                    ),
                }
            },
            "401": {
                JSON: {
                    "openai": example(
                        "--api-key is set and the request has no Bearer key",
                        post("/v1/decisions", OPENAI, 401, key=False),
                    )
                }
            },
            "413": {
                JSON: {
                    "openai": example(
                        "a prompt longer than the model reads (max_position_embeddings; --max-input-tokens likewise)",
                        post("/v1/decisions", {**OPENAI, "input": LONG_STATE}, 413),
                    )
                }
            },
            "429": {
                JSON: {
                    "openai": example(
                        "the queue is full; retry after Retry-After",
                        openai_error("rate_limit_error", "rate_limit_exceeded", None, OVERLOADED),
                    )
                }
            },
            "501": {
                JSON: {
                    "openai": example(
                        "the model cannot be read as a decision model",
                        openai_error("invalid_request_error", "model_not_supported", "model", NOT_SERVABLE),
                    )
                }
            },
        },
    }

    decided = post(
        "/v1/decisions", {**SGLANG, "questions": SGLANG["questions"][1:], "return_prompt_token_ids": True}, 200
    )
    urgent = decided["answers"]["urgent"]
    score_request = {
        "query": urgent["prompt_token_ids"][:-4],
        "items": [urgent["prompt_token_ids"][-4:]],
        "label_token_ids": [urgent["label_token_ids"]],
        "apply_softmax": True,
    }
    score = {
        "request": {
            JSON: {
                "replay": example("a decision's prompt and labels replayed (return_prompt_token_ids)", score_request)
            }
        },
        "responses": {
            "200": {
                JSON: {
                    "scores": example(
                        "one score per label, as the decision answered", post("/v1/score", score_request, 200)
                    )
                }
            },
            "400": {JSON: {"no_items": example("no items", post("/v1/score", {**score_request, "items": []}, 400))}},
            "401": {
                JSON: {
                    "no_key": example(
                        "--api-key is set and the request has no Bearer key",
                        post("/v1/score", score_request, 401, key=False),
                    )
                }
            },
            "413": {
                JSON: {
                    "body": example(
                        "a body over --max-body-bytes",
                        post("/v1/score", {**score_request, "query": [1] * 5_000_000}, 413),
                    )
                }
            },
            "501": {
                JSON: {
                    "not_servable": example(
                        "the model cannot be read",
                        # SGLang's error shape, as /v1/score answers every error (router/src/api/sglang.rs).
                        {
                            "object": "error",
                            "message": NOT_SERVABLE,
                            "type": "NotImplementedError",
                            "param": None,
                            "code": 501,
                        },
                    )
                }
            },
        },
    }

    def get(path: str) -> Any:
        r = client.get(path, headers=keyed)
        assert r.status_code == 200, (path, r.text)
        return r

    info = get("/info").json()
    info.pop("model_dir", None)  # only the key holder sees it, and it is this machine's path
    models = get("/v1/models").json()
    for entry in models["models"]:
        entry["release_date"] = "2026-12-06"
    for entry in models["data"]:
        entry["created"] = 1796515200
    metrics = (
        "\n".join(
            line
            for line in get("/metrics").text.splitlines()
            if line.startswith(("# HELP decision_queued", "# TYPE decision_queued", "decision_queued"))
        )
        + "\n"
    )
    examples = {
        "/v1/systemone": systemone,
        "/v1/decisions": decisions,
        "/v1/score": score,
        "/v1/models": {"responses": {"200": {JSON: {"models": example("the served model", models)}}}},
        "/health": {
            "responses": {
                "200": {
                    JSON: {
                        "ok": example("every shard answered", client.get("/health").json()),
                        "draining": example(
                            "shutting down: still live, no longer ready",
                            {"status": "draining", "message": "the server is shutting down; retry on another instance"},
                        ),
                    }
                },
                "503": {
                    JSON: {
                        "unavailable": example(
                            "a shard did not answer",
                            {
                                "status": "unavailable",
                                "message": "model shard is unavailable: rank 0 did not answer a health probe within 0.8 s",
                            },
                        ),
                    }
                },
            }
        },
        "/ready": {
            "responses": {
                "200": {JSON: {"ready": example("serving, queue under its high-water mark", client.get("/ready").json())}},
                "503": {
                    JSON: {
                        "draining": example(
                            "shutting down",
                            {
                                "status": "not_ready",
                                "reasons": [
                                    {
                                        "reason": "draining",
                                        "message": "the server is shutting down; retry on another instance",
                                    }
                                ],
                                "queued_reads": 0,
                                "queue_high_water": 3276,
                            },
                        ),
                        "queue_high": example(
                            "more reads queued than the high-water mark",
                            {
                                "status": "not_ready",
                                "reasons": [
                                    {
                                        "reason": "queue_high",
                                        "message": "3300 reads are queued, over the high-water mark of 3276"
                                        " (--queue-high-water-percent of --max-queued-reads)",
                                    }
                                ],
                                "queued_reads": 3300,
                                "queue_high_water": 3276,
                            },
                        ),
                    }
                },
            }
        },
        "/info": {"responses": {"200": {JSON: {"info": example("the embedded default model on CPU", info)}}}},
        "/metrics": {
            "responses": {"200": {"text/plain": {"metrics": example("Prometheus text (a few of its lines)", metrics)}}}
        },
    }
    OUT.write_text(json.dumps(examples, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
