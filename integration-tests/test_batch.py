"""`decision-batch` (the console script `make install` puts in .venv/bin) against the suite's server: every decision
route and shape in one file with bad lines among them, each answer equal to the same request sent alone, the line's
id echoed as the request id, and a rerun that sends nothing."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from wordings import SGLANG_QUESTIONS, TICKET

pytestmark = pytest.mark.local_only

BATCH = Path(sys.executable).parent / "decision-batch"

SYSTEMONE = {
    "state": TICKET,
    "questions": {
        "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "payments", "tech": None}},
    },
}
OPENAI = {
    "model": "m",
    "input": TICKET,
    "questions": [{"type": "predicate", "instructions": "Is the customer asking for money back?"}],
}
SGLANG = {"input": {"ticket": TICKET}, "questions": SGLANG_QUESTIONS}
SCORE = {"query": [1, 2, 3], "items": [[4, 5]], "label_token_ids": [6, 7]}


def numbers(value: Any) -> list[float]:
    """Every float in an answer, in order: what must match between the batch and a lone request."""
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [n for key in sorted(value) if key not in ("id", "created") for n in numbers(value[key])]
    if isinstance(value, list):
        return [n for item in value for n in numbers(item)]
    return []


def test_a_file_of_every_route_and_bad_lines_runs_through_the_server(
    server_url: str, http: httpx2.Client, tmp_path: Path
) -> None:
    assert BATCH.exists(), f"{BATCH} is missing: `make install` installs decision-batch"
    requests = {
        "s1": ("/v1/systemone", SYSTEMONE),
        "oa": ("/v1/decisions", OPENAI),
        "sg": ("/v1/decisions", SGLANG),
        "sc": ("/v1/score", SCORE),
        "refused": ("/v1/systemone", {"state": TICKET, "questions": {}}),
    }
    lines = [json.dumps({"id": ident, "route": route, "body": body}) for ident, (route, body) in requests.items()]
    lines[0] = json.dumps({"id": "s1", "body": SYSTEMONE})  # the default route
    lines += ["{not json", json.dumps({"id": "s1", "body": SYSTEMONE}), json.dumps({"id": "big", "body": {"state": "x" * 5000}})]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    command = [str(BATCH), str(source), "-o", str(out), "--url", server_url, "--concurrency", "4", "--max-line-bytes", "4096"]
    started = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["line"] for r in records) == list(range(1, 9)), records
    answers = {r["id"]: r for r in records if "status" in r}
    assert sorted(answers) == sorted(requests)
    for ident, (route, body) in requests.items():
        alone = http.post(route, json=body)
        got = answers[ident]
        assert got["status"] == alone.status_code, (ident, got, alone.text)
        assert got["request_id"] == ident, "the line's id goes to the server as x-request-id and comes back"
        if alone.status_code == 200:
            batched, single = numbers(got["body"]), numbers(alone.json())
            assert batched and len(batched) == len(single), (ident, got["body"], alone.text)
            assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(batched, single)), (ident, batched, single)
    assert 400 <= answers["refused"]["status"] < 500 and "questions" in json.dumps(answers["refused"]["body"])
    errors = {r["line"]: r for r in records if "error" in r}
    assert errors[6]["id"] is None and errors[6]["error"].startswith("not JSON")
    assert errors[7] == {"id": "s1", "line": 7, "error": "duplicate id: already on line 1"}
    assert errors[8]["error"] == "line longer than --max-line-bytes (4096 bytes)"
    assert "decision-batch: 8 lines written" in run.stderr and "answers: 5 (4 x 200, 1 x 4" in run.stderr
    print(f"decision-batch: 8 lines in {time.monotonic() - started:.1f} s")

    # A rerun finds every line in OUT and sends nothing.
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "0 lines written" in again.stderr and "8 skipped" in again.stderr, again.stderr
    assert len(out.read_text().splitlines()) == 8
