"""Where rotate's extra prompt tokens come from: decision-bench's own requests (512-token state, 4-option choices,
seed 0) sent to a running server with `x_debias` off and rotate, 1 to 8 questions each, and the server's usage
(unique prompt tokens: what the shard computes) split into the state part and each question's and each extra order's
part. Deterministic (no timing), so it runs on a loaded machine as well as on a quiet one.

    .venv/bin/python bench/results/2026-12-07-quality/cost_tokens.py --url http://127.0.0.1:3000 \
        --tokenizer ~/.cache/decision-inference/models/SmolLM2-135M-Instruct"""

from __future__ import annotations

import argparse
import json
import urllib.request

from decision_bench.tokens import make_counter
from decision_bench.workload import Workload, WorkloadSpec


def usage(url: str, body: dict) -> int:
    request = urllib.request.Request(
        f"{url}/v1/systemone", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return int(json.load(response)["usage"]["input_tokens"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--questions", default="1,2,4,8")
    args = parser.parse_args()
    counter = make_counter(args.tokenizer)
    rows = []
    for q in (int(x) for x in args.questions.split(",")):
        workload = Workload(WorkloadSpec(state_tokens=512, questions=q, options=4, mix=("choice",)), counter)
        body = json.loads(workload.request(0).body)
        body["cache_salt"] = f"cost-tokens-{q}"
        plain = usage(args.url, {**body, "x_debias": "off"})
        rotate = usage(args.url, {**body, "x_debias": "rotate", "cache_salt": f"cost-tokens-{q}-r"})
        no_questions = usage(args.url, {**body, "questions": {"q0": body["questions"]["q0"]}, "x_debias": "off",
                                        "cache_salt": f"cost-tokens-{q}-one"})
        rows.append({"questions": q, "plain": plain, "rotate": rotate, "ratio": round(rotate / plain, 3),
                     "extra_per_extra_order": round((rotate - plain) / (3 * q), 1),
                     "per_question_plain": round((plain - no_questions) / (q - 1), 1) if q > 1 else None,
                     "one_question_plain": no_questions})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
