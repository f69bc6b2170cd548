"""`decision-launcher --num-shard 2` on the embedded SmolLM2 (float32, gloo on CPU): the same answers as the one-shard
session server, and a rank killed during a request turns it into a 5xx JSON error (not a hang) and stops the
whole deployment with a non-zero exit that names the rank.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from launchers import Launcher
from wire import error_detail, label_probabilities, ok_answers, post_systemone

pytestmark = pytest.mark.local_only

HEALTH_TIMEOUT_S = 300.0
ANSWER_TOL = 1e-4  # one shard vs two: the same model, sums taken in a different order
ERROR_WITHIN_S = 60.0  # the shards' collectives give up after 60 s at most; a dead peer is noticed at once
ARGS = [
    "--num-shard",
    "2",
    "--dtype",
    "float32",
    # Compared with the session server, which runs exact (conftest): auto could run split here on an AMX CPU.
    "--matmul",
    "exact",
    "--hostname",
    "127.0.0.1",
    "--threads",
    "1",
    "--shutdown-grace-secs",
    "10",
]

QUESTIONS: dict[str, Any] = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {"billing": "payments, invoices and refunds", "technical": "bugs and outages", "sales": None},
    },
    "dispute": {"type": "noul", "instructions": "Is the customer threatening to dispute the charge?"},
    "anger": {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["calm", "annoyed", "furious"],
    },
}
BODY: dict[str, Any] = {
    "state": "I was charged twice for my March invoice and the refund still hasn't arrived. I will call my bank.",
    "questions": QUESTIONS,
}


def _rank_pid(launcher: Launcher, rank: int) -> int:
    """The pid of `decision-server serve … --rank R` among the launcher's children."""
    for pid in launcher.remember_tree():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and b"--rank" in argv and argv[argv.index(b"--rank") + 1] == str(rank).encode():
            return pid
    raise AssertionError(f"no shard with --rank {rank} under the launcher:\n{launcher.output_tail()}")


def _queued_reads(client: httpx2.Client) -> float:
    metrics = client.get("/metrics").text
    found = re.search(r"^decision_queued_reads (\S+)$", metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.fixture
def two_shards(launcher_factory: Callable[..., Launcher]) -> Launcher:
    launcher: Launcher = launcher_factory(ARGS, name="tp")
    launcher.wait_healthy(HEALTH_TIMEOUT_S)
    return launcher


def test_two_shards_answer_like_one_then_a_killed_rank_stops_everything(
    two_shards: Launcher, http: httpx2.Client
) -> None:
    one_payload, _ = ok_answers(http, BODY)
    with httpx2.Client(base_url=two_shards.url, timeout=120.0) as client:
        info = client.get("/info").json()
        assert info["shards"] == 2
        # The ranks must run batches in one order: one call at a time (`--max-batches-at-shard` auto).
        assert info["limits"]["max_batches_at_shard"] == 1, info["limits"]
        two_payload, _ = ok_answers(client, BODY)
        worst = 0.0
        for qid, question in QUESTIONS.items():
            one = label_probabilities(question, one_payload["answers"][qid])
            two = label_probabilities(question, two_payload["answers"][qid])
            one_mass = one_payload["x_diagnostics"][qid]["label_mass"]
            two_mass = two_payload["x_diagnostics"][qid]["label_mass"]
            worst = max([worst, abs(one_mass - two_mass), *(abs(a - b) for a, b in zip(one, two, strict=True))])
            assert worst < ANSWER_TOL, (qid, one, two, one_mass, two_mass)
        print(f"max |1 shard - 2 shards| over probabilities and label masses: {worst:.3g}")

        # A heavy request (about 3,000 unique tokens: seconds of compute even on a fast CPU), so that it is still at
        # the shards when rank 1 dies; the kill makes it fail at once, so its size costs no test time.
        heavy = {
            "state": " ".join(f"Order {i} was charged twice and the refund for it never arrived." for i in range(200)),
            "questions": {f"q{i}": {"type": "noul", "instructions": f"Is order {i} mentioned?"} for i in range(12)},
        }
        outcome: dict[str, Any] = {}

        def send() -> None:
            started = time.monotonic()
            try:
                outcome["response"] = post_systemone(client, heavy, timeout=ERROR_WITHIN_S + 60)
            except httpx2.HTTPError as err:
                outcome["error"] = err
            outcome["seconds"] = time.monotonic() - started

        rank1 = _rank_pid(two_shards, 1)
        sender = threading.Thread(target=send)
        sender.start()
        # Queued reads count until the shards answer: once non-zero, the router has the request in hand.
        deadline = time.monotonic() + 30
        while _queued_reads(client) == 0 and "seconds" not in outcome and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(rank1, signal.SIGKILL)
        sender.join(timeout=ERROR_WITHIN_S + 90)

    assert not sender.is_alive(), "the request hung after a rank died"
    assert "error" not in outcome, f"no HTTP answer: {outcome.get('error')!r}\n{two_shards.output_tail()}"
    response = outcome["response"]
    assert 500 <= response.status_code < 600, f"{response.status_code} {response.text[:1000]}"
    assert response.headers.get("content-type", "").startswith("application/json")
    assert "rank" in error_detail(response)["message"], response.text
    # A rank gone is a shard unavailable (503), whichever rank's call failed first (rank 0's read fails too,
    # its collective broken), never a failed read or an unknown error.
    assert response.status_code == 503, response.text
    assert error_detail(response)["error_type"] == "shard_unavailable", response.text
    assert outcome["seconds"] < ERROR_WITHIN_S, outcome["seconds"]

    code = two_shards.wait_exit(60)
    output = two_shards.output()
    assert code is not None and code != 0, f"launcher exit {code}\n{two_shards.output_tail()}"
    assert "shard 1 exited (killed by signal 9 (SIGKILL))" in output, two_shards.output_tail()
