"""Reads of a client that went away are dropped before compute (the queue checks each request's reply
channel when it packs a batch), and the server keeps serving.

Every step waits on the server's own gauges rather than on wall-clock guesses: the impatient client closes
its connection only once its reads are seen queued behind the long request, so the test means the same on
a loaded 2-core CI machine and on a fast one."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx2
from launchers import Launcher

LONG_STATE = "The customer reports that the invoice total is wrong and the refund is late. " * 60


def metric(client: httpx2.Client, name: str) -> float:
    text = client.get("/metrics").text
    match = re.search(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def send_raw_post(url: str, path: str, body: dict) -> socket.socket:
    """Sends a whole HTTP/1.1 request and returns the open socket without reading the answer."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.sendall(head + payload)
    return sock


def test_reads_of_a_gone_client_are_not_computed(launcher_factory: Callable[..., Launcher]) -> None:
    # A small batch budget keeps the long request and the impatient one in separate shard calls.
    launcher = launcher_factory(
        [
            "--dtype",
            "float32",
            "--hostname",
            "127.0.0.1",
            "--max-batch-wait-ms",
            "0",
            "--max-batch-prefill-tokens",
            "256",
        ],
        name="drop",
    )
    launcher.wait_healthy(timeout_s=300)
    questions = {f"q{i}": {"type": "noul", "instructions": f"Is point {i} true?"} for i in range(12)}
    with httpx2.Client(base_url=launcher.url, timeout=300) as client:
        dropped_before = metric(client, "decision_reads_dropped_total")
        reads_before = metric(client, "decision_batch_reads_sum")
        answers: list[int] = []
        worker = threading.Thread(
            target=lambda: answers.append(
                client.post("/v1/systemone", json={"state": LONG_STATE, "questions": questions}).status_code
            )
        )
        worker.start()
        wait_for(lambda: metric(client, "decision_queued_reads") >= 12, "the long request's 12 reads to be queued")

        # Queued behind the long read, this client gives up long before its turn comes.
        impatient = send_raw_post(
            launcher.url,
            "/v1/systemone",
            {"state": "short", "questions": {"a": {"type": "noul", "instructions": "Now?"}}},
        )
        try:
            wait_for(lambda: metric(client, "decision_queued_reads") >= 13, "the impatient read to be queued")
        finally:
            impatient.close()

        worker.join(timeout=300)
        assert answers == [200]
        wait_for(
            lambda: metric(client, "decision_reads_dropped_total") >= dropped_before + 1,
            "the gone client's read to be dropped",
            30,
        )
        # Only the long request's reads reached the shard.
        assert metric(client, "decision_batch_reads_sum") == reads_before + 12
        ok = client.post(
            "/v1/systemone", json={"state": "x", "questions": {"a": {"type": "noul", "instructions": "Fine?"}}}
        )
        assert ok.status_code == 200
        # Given to the launcher, the budget reaches the router and the shard alike.
        assert client.get("/info").json()["batch_budget"] == {
            "max_batch_prefill_tokens": 256,
            "source": "--max-batch-prefill-tokens",
            "batch_token_budget": 256,
            "batch_budget_rule": "--max-batch-prefill-tokens 256",
        }
