"""One replica as a fleet's balancer, endpoint picker and autoscaler see it (issue 46): /ready apart from /health,
readiness off over the queue's high-water mark and while draining (liveness on), the state-affinity key (the
documented recipe, and a state's second question read from the prefix cache), and /metrics with # HELP on every
series and real histograms. The last test drains the module's launcher."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from launchers import Launcher, start_launcher
from wire import affinity_key, show

MAX_QUEUED = 8
HIGH_WATER = 4  # 50 % of MAX_QUEUED
GRACE_S = 30
ARGS = [
    "--dtype",
    "float32",
    "--hostname",
    "127.0.0.1",
    "--max-queued-reads",
    str(MAX_QUEUED),
    "--queue-high-water-percent",
    "50",
    "--max-batch-wait-ms",
    "0",
    "--shutdown-grace-secs",
    str(GRACE_S),
]
STATE = {"ticket": "I was charged twice for my subscription and the refund has not arrived.", "days": 12}


def noul(n: int, prefix: str = "q") -> dict[str, Any]:
    return {f"{prefix}{i}": {"type": "noul", "instructions": f"Is point {i} raised?"} for i in range(n)}


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = start_launcher(tmp_path_factory.mktemp("fleet"), ARGS, name="fleet")
    try:
        launcher.wait_healthy(300.0)
        yield launcher
    finally:
        launcher.stop(grace_s=30.0)


def shard_pid(launcher: Launcher) -> int:
    for pid in launcher.remember_tree():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "decision_server" in cmd or "decision-server" in cmd:
            return pid
    raise AssertionError("no shard under the launcher")


def wait_for(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_serving_replica_is_live_and_ready(replica: Launcher) -> None:
    health = httpx2.get(f"{replica.url}/health", timeout=30.0)
    assert health.status_code == 200 and health.json() == {"status": "ok"}, show(health)
    ready = httpx2.get(f"{replica.url}/ready", timeout=30.0)
    assert ready.status_code == 200, show(ready)
    assert ready.json() == {"status": "ready", "queued_reads": 0, "queue_high_water": HIGH_WATER}


def test_the_questions_of_one_state_share_an_affinity_key_and_its_prefix(replica: Launcher) -> None:
    with httpx2.Client(base_url=replica.url, timeout=120.0) as client:
        first = client.post("/v1/systemone", json={"state": STATE, "questions": noul(1, "urgent")})
        second = client.post("/v1/systemone", json={"state": STATE, "questions": noul(1, "angry")})
        salted = client.post("/v1/systemone", json={"state": STATE, "cache_salt": "t", "questions": noul(1, "angry")})
    for r in (first, second, salted):
        assert r.status_code == 200, show(r)
    key = first.headers["x-decision-affinity"]
    # The documented recipe gives the router's key: a client can compute it before its first request.
    assert key == affinity_key(STATE)
    assert second.headers["x-decision-affinity"] == key
    assert salted.headers["x-decision-affinity"] == affinity_key(STATE, "t") != key
    # What the key names is what the replica kept: the second question read the state from the prefix cache.
    assert second.json()["x_cached_tokens"] > 0, second.json()["usage"]


def test_every_series_has_help_and_the_pickers_gauges_are_there(replica: Launcher) -> None:
    httpx2.post(f"{replica.url}/v1/systemone", json={"state": "x", "questions": noul(2)}, timeout=120.0)
    page = httpx2.get(f"{replica.url}/metrics", timeout=30.0).text
    typed = dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, re.MULTILINE))
    helped = set(re.findall(r"^# HELP (\S+) ", page, re.MULTILINE))
    assert typed and set(typed) == helped, set(typed) ^ helped
    assert "summary" not in typed.values()
    for name in ("decision_http_request_duration_seconds", "decision_queue_wait_seconds", "decision_batch_duration_seconds", "decision_shard_forward_seconds"):
        assert typed[name] == "histogram"
        assert re.search(rf'^{name}_bucket\{{.*le="\+Inf"', page, re.MULTILINE), name
    for name in ("decision_requests_queued", "decision_requests_running", "decision_prefix_cache_usage_ratio", "decision_cache_config_info"):
        assert typed[name] == "gauge", name
    usage = float(re.search(r"^decision_prefix_cache_usage_ratio (\S+)$", page, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert 0 < usage <= 1, usage
    info = re.search(r"^decision_cache_config_info\{(.*)\} 1$", page, re.MULTILINE)
    assert info and 'enabled="true"' in info.group(1), page
    budget = httpx2.get(f"{replica.url}/info", timeout=30.0).json()["prefix_cache"]["budget_bytes"]
    assert f'budget_bytes="{budget}"' in info.group(1)
    assert typed["decision_http_connections_closed_idle_total"] == "counter"


def test_a_queue_over_its_high_water_mark_is_not_ready_and_a_full_one_refuses(replica: Launcher) -> None:
    shard = shard_pid(replica)
    answers: list[httpx2.Response] = []

    def send(n: int) -> None:
        body = {"state": f"Ticket {time.monotonic_ns()}: the invoice total is wrong.", "questions": noul(n)}
        answers.append(httpx2.post(f"{replica.url}/v1/systemone", json=body, timeout=120.0))

    os.kill(shard, signal.SIGSTOP)
    try:
        held = threading.Thread(target=send, args=(HIGH_WATER + 2,))
        held.start()
        # (Before the reads are queued /ready is 503 too, for the frozen shard's Health RPC: wait for the queue's.)
        wait_for(lambda: "queue_high" in httpx2.get(f"{replica.url}/ready", timeout=30.0).text, "/ready: queue_high")
        ready = httpx2.get(f"{replica.url}/ready", timeout=30.0)
        assert ready.status_code == 503 and ready.headers["retry-after"] == "1", show(ready)
        body = ready.json()
        assert [r["reason"] for r in body["reasons"]] == ["queue_high"], body
        assert (body["queued_reads"], body["queue_high_water"]) == (HIGH_WATER + 2, HIGH_WATER)
        # Over the queue's limit: refused at once, 529 + Retry-After (the default profile's System One).
        refused = httpx2.post(f"{replica.url}/v1/systemone", json={"state": "y", "questions": noul(3)}, timeout=30.0)
        assert refused.status_code == 529 and int(refused.headers["retry-after"]) >= 1, show(refused)
        assert refused.headers["x-decision-affinity"] == affinity_key("y")
    finally:
        os.kill(shard, signal.SIGCONT)
    held.join(120.0)
    assert [r.status_code for r in answers] == [200], [show(r) for r in answers]
    wait_for(lambda: httpx2.get(f"{replica.url}/ready", timeout=30.0).status_code == 200, "/ready back to 200")


def test_a_draining_replica_is_live_but_not_ready(replica: Launcher) -> None:
    """Runs last: it drains the module's launcher."""
    big = {"state": "The refund is late and the invoice total is wrong. " * 100, "questions": noul(16)}
    answers: list[httpx2.Response] = []
    sender = threading.Thread(
        target=lambda: answers.append(httpx2.post(f"{replica.url}/v1/systemone", json=big, timeout=120.0))
    )
    sender.start()
    wait_for(lambda: "decision_requests_running 1" in httpx2.get(f"{replica.url}/metrics", timeout=30.0).text, "the request at the shard", 30.0)
    replica.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "draining" in httpx2.get(f"{replica.url}/ready", timeout=30.0).text, "/ready: draining", 5.0)
    ready = httpx2.get(f"{replica.url}/ready", timeout=30.0)
    health = httpx2.get(f"{replica.url}/health", timeout=30.0)
    sender.join(GRACE_S + 15)
    code = replica.wait_exit(GRACE_S + 15)
    # The big request's 16 reads are over the mark of 4 too: every reason is listed.
    reasons = [r["reason"] for r in ready.json()["reasons"]]
    assert ready.status_code == 503 and reasons == ["draining", "queue_high"], show(ready)
    assert health.status_code == 200 and health.json()["status"] == "draining", show(health)
    assert [r.status_code for r in answers] == [200], [show(r) for r in answers]
    assert code == 0, replica.output_tail()
