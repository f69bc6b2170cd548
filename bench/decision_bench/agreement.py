"""Do two servers decide alike? Sends the same generated `/v1/systemone` requests to a reference (e.g. float32
`--matmul exact`) and a candidate (another dtype or `--matmul` mode), one at a time, and compares every question:
whether the chosen option (the argmax) is the same, and the largest |Δ probability| over its options.
This is the evidence a speed mode needs before a default may choose it (docs/benchmarks.md: "Defaults that win").

Run: python -m decision_bench.agreement --reference URL --candidate URL --tokenizer MODEL_DIR [--requests 50]"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from decision_bench.runner import SYSTEMONE_PATH, Endpoint
from decision_bench.tokens import make_counter
from decision_bench.workload import KINDS, Workload, WorkloadSpec


@dataclass(frozen=True)
class QuestionAgreement:
    request: int
    question: str
    agree: bool
    max_abs_dp: float
    # The reference's gap between its top two options: a disagreement inside a tiny gap is a near tie.
    reference_margin: float


def option_probabilities(answer: dict[str, Any]) -> dict[str, float]:
    """A `/v1/systemone` answer's probability per option: `probabilities` (choice, score), or `noul` = P(true)."""
    if "probabilities" in answer:
        return {str(name): float(p) for name, p in answer["probabilities"].items()}
    if answer.get("noul") is not None:
        return {"true": float(answer["noul"]), "false": 1.0 - float(answer["noul"])}
    return {}


def compare_answers(request: int, reference: dict[str, Any], candidate: dict[str, Any]) -> list[QuestionAgreement]:
    """One row per question of a `/v1/systemone` response pair (options in request order)."""
    rows = []
    for question, answer in (reference.get("answers") or {}).items():
        ref = option_probabilities(answer)
        cand = option_probabilities((candidate.get("answers") or {}).get(question) or {})
        if list(ref) != list(cand) or not ref:
            raise ValueError(f"request {request}, question {question!r}: options differ: {list(ref)} vs {list(cand)}")
        ref_p, cand_p = list(ref.values()), list(cand.values())
        top = sorted(ref_p, reverse=True)
        rows.append(
            QuestionAgreement(
                request=request,
                question=question,
                agree=max(ref, key=ref.__getitem__) == max(cand, key=cand.__getitem__),
                max_abs_dp=max(abs(a - b) for a, b in zip(ref_p, cand_p, strict=True)),
                reference_margin=top[0] - top[1] if len(top) > 1 else 1.0,
            )
        )
    return rows


def summarize(rows: list[QuestionAgreement]) -> dict[str, Any]:
    if not rows:
        raise ValueError("no questions were compared")
    deltas = sorted(row.max_abs_dp for row in rows)
    agreed = sum(row.agree for row in rows)
    return {
        "questions": len(rows),
        "agreeing": agreed,
        "agreement": agreed / len(rows),
        "max_abs_dp": deltas[-1],
        "p99_abs_dp": deltas[min(len(deltas) - 1, int(0.99 * len(deltas)))],
        "median_abs_dp": statistics.median(deltas),
        "disagreements": [asdict(row) for row in rows if not row.agree],
    }


def answer(endpoint: Endpoint, body: bytes) -> dict[str, Any]:
    """The server's `/v1/systemone` response to `body`; anything but a 200 stops the comparison."""
    reply = endpoint.request("POST", SYSTEMONE_PATH, body)
    if reply.status != 200:
        raise RuntimeError(f"HTTP {reply.status}: {reply.body[:300]!r}")
    parsed: dict[str, Any] = json.loads(reply.body)
    return parsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", required=True, help="URL of the reference server (float32 exact)")
    parser.add_argument("--candidate", required=True, help="URL of the server under test")
    parser.add_argument("--tokenizer", help="model folder, for states of the asked token length")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--state-tokens", type=int, default=256)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--options", type=int, default=4)
    parser.add_argument("--mix", default=",".join(KINDS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--min-agreement", type=float, default=0.0, help="exit 1 below this share of questions")
    parser.add_argument("--label", default="", help="free text stored in the report")
    parser.add_argument("--json", dest="json_out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)

    spec = WorkloadSpec(
        state_tokens=args.state_tokens,
        questions=args.questions,
        options=args.options,
        seed=args.seed,
        mix=tuple(args.mix.split(",")),
    )
    workload = Workload(spec, make_counter(args.tokenizer))
    reference, candidate = Endpoint(args.reference, args.timeout), Endpoint(args.candidate, args.timeout)
    rows: list[QuestionAgreement] = []
    for index in range(args.requests):
        body = workload.request(index).body
        rows.extend(compare_answers(index, answer(reference, body), answer(candidate, body)))
    reference.close()
    candidate.close()
    summary = summarize(rows)
    report = {"tool": "decision_bench.agreement", "label": args.label, "command": " ".join(sys.argv), **summary}
    print(
        f"{summary['agreeing']}/{summary['questions']} questions agree ({summary['agreement']:.2%}); "
        f"max |dp| {summary['max_abs_dp']:.2e}, p99 {summary['p99_abs_dp']:.2e}, median {summary['median_abs_dp']:.2e}"
    )
    for row in summary["disagreements"]:
        print(f"  differs: request {row['request']} {row['question']}: reference margin {row['reference_margin']:.2e}")
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if summary["agreement"] >= args.min_agreement else 1


if __name__ == "__main__":
    sys.exit(main())
