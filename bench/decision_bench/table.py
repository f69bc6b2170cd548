"""`python -m decision_bench.table REPORT.json…`: one Markdown row per report, for docs/benchmarks.md.

Columns are the medians over rounds (each round is A then B, back to back), so each row reads as "B/A under the same noise"."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADER = (
    "| cell | C | rounds × req/round (A; B) | A q/s | B q/s | B/A q/s | A p50 ms | B p50 ms "
    "| tokens/req: server (B) · Σ per-question | errors |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def row(report: dict[str, Any], name: str) -> str:
    workload = report["workload"]
    servers = report["servers"]
    a = servers["A"]
    b = servers.get("B")
    cell = f"{workload['questions']} q × {workload['state_tokens']} tok"

    def per_round(server: dict[str, Any]) -> str:
        counts = [r["requests"] for r in server["rounds"]]
        return f"{len(counts)}×{min(counts)}" + (f"–{max(counts)}" if max(counts) != min(counts) else "")

    def fmt(value: float | None, digits: int = 3) -> str:
        return "–" if value is None else f"{value:.{digits}g}" if value < 1000 else f"{value:.0f}"

    last = b or a
    tokens = last["tokens"]
    errors = {key: value for server in servers.values() for key, value in server["errors_by_status"].items()}
    return (
        f"| {cell} ({name}) | {workload['concurrency']} | {per_round(a)}" + (f"; {per_round(b)}" if b else "") + " "
        f"| {fmt(a['median_of_rounds']['questions_per_s'])} | {fmt(b['median_of_rounds']['questions_per_s']) if b else '–'} "
        f"| {fmt(report['ratios_b_over_a']['median_round_questions_per_s']) if b else '–'} "
        f"| {fmt(a['median_of_rounds']['latency_p50_ms'])} | {fmt(b['median_of_rounds']['latency_p50_ms']) if b else '–'} "
        f"| {fmt(tokens['server_input_tokens_per_request'], 4)} · {fmt(tokens['estimated_per_question_prompt_tokens_per_request'], 4)} "
        f"| {errors or 'none'} |"
    )


def main(argv: list[str] | None = None) -> int:
    paths = [Path(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    print(HEADER)
    for path in paths:
        print(row(json.loads(path.read_text()), path.stem))
    for path in paths:
        print(f"- `{path.stem}`: `{json.loads(path.read_text())['command']}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
