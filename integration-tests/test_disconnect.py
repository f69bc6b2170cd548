"""Reads of a client that went away are dropped before compute (the queue checks each request's reply
channel when it packs a batch), and the server keeps serving."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import httpx2
from launchers import Launcher

LONG_STATE = "The customer reports that the invoice total is wrong and the refund is late. " * 60


def dropped_reads(client: httpx2.Client) -> float:
    text = client.get("/metrics").text
    match = re.search(r"^decision_reads_dropped_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_reads_of_a_gone_client_are_not_computed(launcher_factory: Callable[..., Launcher]) -> None:
    # A small batch budget keeps the long request and the impatient one in separate shard calls.
    launcher = launcher_factory(
        ["--dtype", "float32", "--hostname", "127.0.0.1", "--max-batch-wait-ms", "0", "--max-batch-prefill-tokens", "256"], name="drop"
    )
    launcher.wait_healthy(timeout_s=300)
    questions = {f"q{i}": {"type": "noul", "instructions": f"Is point {i} true?"} for i in range(12)}
    with httpx2.Client(base_url=launcher.url, timeout=300) as client:
        before = dropped_reads(client)
        long_done = threading.Event()

        def long_request() -> None:
            client.post("/v1/systemone", json={"state": LONG_STATE, "questions": questions})
            long_done.set()

        worker = threading.Thread(target=long_request)
        worker.start()
        # Queued behind the long read, this client gives up long before its turn comes.
        with httpx2.Client(base_url=launcher.url, timeout=0.3) as impatient:
            try:
                impatient.post("/v1/systemone", json={"state": "short", "questions": {"a": {"type": "noul", "instructions": "Now?"}}})
            except httpx2.TimeoutException:
                pass
        worker.join(timeout=300)
        assert long_done.is_set()
        assert dropped_reads(client) >= before + 1, client.get("/metrics").text[-2000:]
        ok = client.post("/v1/systemone", json={"state": "x", "questions": {"a": {"type": "noul", "instructions": "Fine?"}}})
        assert ok.status_code == 200
