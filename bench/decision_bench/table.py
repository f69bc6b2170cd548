"""`python -m decision_bench.table REPORT.json...`: one Markdown row per report, for docs/benchmarks.md.

Columns are medians over rounds (each round runs A then B back to back), so a row's B/A is read under one noise."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADER = (
    "| cell | C | rounds x req/round (A; B) | A q/s | B q/s | B/A q/s | A p50 ms | B p50 ms "
    "| tokens/req: server (B) . sum per-question | errors |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)
MISSING = "-"


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return MISSING
    return f"{value:.0f}" if value >= 1000 else f"{value:.{digits}g}"


def _per_round(server: dict[str, Any]) -> str:
    counts = [entry["requests"] for entry in server["rounds"]]
    spread = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
    return f"{len(counts)}x{spread}"


def row(report: dict[str, Any], name: str) -> str:
    workload = report["workload"]
    a = report["servers"]["A"]
    b = report["servers"].get("B")
    tokens = (b or a)["tokens"]
    errors = {key: value for server in report["servers"].values() for key, value in server["errors_by_status"].items()}
    cells = [
        f"{workload['questions']} q x {workload['state_tokens']} tok ({name})",
        str(workload["concurrency"]),
        _per_round(a) + (f"; {_per_round(b)}" if b else ""),
        _number(a["median_of_rounds"]["questions_per_s"]),
        _number(b["median_of_rounds"]["questions_per_s"]) if b else MISSING,
        _number(report["ratios_b_over_a"]["median_round_questions_per_s"]) if b else MISSING,
        _number(a["median_of_rounds"]["latency_p50_ms"]),
        _number(b["median_of_rounds"]["latency_p50_ms"]) if b else MISSING,
        f"{_number(tokens['server_input_tokens_per_request'], 4)} . "
        f"{_number(tokens['estimated_per_question_prompt_tokens_per_request'], 4)}",
        str(errors) if errors else "none",
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    paths = [Path(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    reports = [(path.stem, json.loads(path.read_text())) for path in paths]
    print(HEADER)
    for name, report in reports:
        print(row(report, name))
    for name, report in reports:
        print(f"- `{name}`: `{report['command']}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
