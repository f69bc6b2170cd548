"""Nothing accepted is lost (issue 48): at SIGTERM under the default grace every request in flight on every
decision route gets a status line (200, or 503 + Retry-After), never a bare close, before the launcher's SIGKILL
could reach the router. The long-grace case (all 200) is test_launcher.py's shutdown test."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from launchers import Launcher, start_launcher

DEFAULT_GRACE_S = 10  # the launcher's default --shutdown-grace-secs, which this launcher keeps
LONG_STATE = "The customer was charged twice for one order and the refund has not arrived. " * 20

# Five of each decision route and shape: /v1/systemone, /v1/decisions in OpenAI's and SGLang's shapes, /v1/score.
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/systemone", {"state": LONG_STATE, "questions": {f"q{i}": {"type": "noul", "instructions": f"Is point {i} raised?"} for i in range(4)}}),
    (
        "/v1/decisions",
        {"model": "SmolLM2-135M-Instruct", "input": LONG_STATE, "questions": [{"type": "predicate", "instructions": "Is a refund owed?"}]},
    ),
    ("/v1/decisions", {"input": LONG_STATE, "questions": [{"id": "q", "type": "yes_no", "question": "Is a refund owed?"}]}),
    ("/v1/score", {"query": list(range(10, 400)), "items": [[5]], "label_token_ids": [7, 8]}),
]


@pytest.fixture(scope="module")
def drained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = start_launcher(tmp_path_factory.mktemp("drain"), ["--dtype", "float32", "--hostname", "127.0.0.1"], name="drain")
    try:
        launcher.wait_healthy(300.0)
        yield launcher
    finally:
        launcher.stop(grace_s=30.0)


def _shard(launcher: Launcher) -> int:
    for pid in launcher.remember_tree():
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "decision_server" in cmd or "decision-server" in cmd:
            return pid
    raise AssertionError("no shard under the launcher")


def _in_flight(url: str) -> float:
    text = httpx2.get(f"{url}/metrics", timeout=30.0).text
    match = re.search(r"^decision_http_requests_in_flight ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_sigterm_at_the_default_grace_answers_every_request_in_flight_on_every_route(drained: Launcher) -> None:
    """Runs last in this module: it shuts the module's launcher down. The shard is frozen from before the requests
    are sent until they are answered, so all 20 are surely in flight at the signal and none can finish: each must be
    answered 503 + Retry-After at the drain's cut (the grace less 3 s), none closed without a status line."""
    for path, body in REQUESTS:  # every shape is served as sent (a 4xx here would make the test vacuous)
        r = httpx2.post(f"{drained.url}{path}", content=json.dumps(body), headers={"content-type": "application/json"}, timeout=120.0)
        assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:500]}"
    answers: list[tuple[str, int | str, str | None, float]] = []
    lock = threading.Lock()
    started = 0.0

    def send(path: str, body: dict[str, Any]) -> None:
        try:
            r = httpx2.post(f"{drained.url}{path}", content=json.dumps(body), headers={"content-type": "application/json"}, timeout=60.0)
            answer: tuple[str, int | str, str | None, float] = (path, r.status_code, r.headers.get("retry-after"), time.monotonic() - started)
        except httpx2.HTTPError as e:  # a bare close: what must not happen
            answer = (path, f"{type(e).__name__}: {e}", None, time.monotonic() - started)
        with lock:
            answers.append(answer)

    shard = _shard(drained)
    os.kill(shard, signal.SIGSTOP)
    try:
        senders = [threading.Thread(target=send, args=REQUESTS[i % len(REQUESTS)]) for i in range(20)]
        for sender in senders:
            sender.start()
        deadline = time.monotonic() + 60
        while _in_flight(drained.url) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _in_flight(drained.url) == 20
        started = time.monotonic()
        drained.proc.send_signal(signal.SIGTERM)
        for sender in senders:
            sender.join(DEFAULT_GRACE_S + 5)
    finally:
        os.kill(shard, signal.SIGCONT)
    code = drained.wait_exit(DEFAULT_GRACE_S + 10)
    print(f"drain at the default grace: {sorted(str(a[1]) for a in answers)}; last answer at {max(a[3] for a in answers):.1f} s")
    assert len(answers) == 20, answers
    bad = [a for a in answers if not (a[1] == 200 or (a[1] == 503 and a[2]))]
    assert not bad, f"answered without a status line or a Retry-After: {bad}\n{drained.output_tail()}"
    assert {a[0] for a in answers} == {"/v1/systemone", "/v1/decisions", "/v1/score"}
    late = [a for a in answers if a[3] >= DEFAULT_GRACE_S - 1]
    assert not late, f"answered too close to the SIGKILL at {DEFAULT_GRACE_S} s: {late}"
    assert code is not None, f"still running {DEFAULT_GRACE_S + 10} s after SIGTERM\n{drained.output_tail()}"
