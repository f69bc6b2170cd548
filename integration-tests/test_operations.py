"""The server as an operator meets it under faults and hostile clients (issue 20), on one launcher with a short
request deadline: no filesystem paths in /info, metric series that stay flat under random paths, slow and idle
clients cut off, an 8 MiB state refused within a memory bound, a request past its deadline answered 504 naming the
limit (and its retry read from the prefix cache), work that cannot finish refused at once with 529 + Retry-After,
a frozen shard and a dead one answered 503 `shard_unavailable`, and the shard's debug lines in the launcher's output
when asked for. The last test kills the shard, so it ends the module's launcher."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import string
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from launchers import Launcher, start_launcher
from wire import error_detail, show

DEADLINE_S = 1
HEADER_TIMEOUT_S = 2
BODY_TIMEOUT_S = 2
KEEP_ALIVE_S = 3
ARGS = [
    "--dtype",
    "float32",
    "--hostname",
    "127.0.0.1",
    "--request-timeout-secs",
    str(DEADLINE_S),
    "--header-read-timeout-secs",
    str(HEADER_TIMEOUT_S),
    "--body-read-timeout-secs",
    str(BODY_TIMEOUT_S),
    "--keep-alive-timeout-secs",
    str(KEEP_ALIVE_S),
    "--shard-log-level",
    "debug",
]
RECOVERED_200S = 3  # in the 5 s after a stall (18 before the cap, 27 with it, on a busy 2-vCPU machine)
SMALL = {"state": "Refund not received.", "questions": {"refund": {"type": "noul", "instructions": "Money back?"}}}


def big_request(words: int = 150, questions: int = 16) -> dict[str, Any]:
    """A request that takes SmolLM2 on CPU far longer than the deadline (about 2,000 prompt tokens: seconds on 2 vCPUs).

    Each call opens with its own ticket number: a read that answered 504 may still have filled the prefix cache, and
    the same state sent again would then be read from it within the deadline."""
    return {
        "state": f"Ticket {uuid.uuid4().hex}. " + "The invoice total is wrong and the refund is late. " * words,
        "questions": {f"q{i}": {"type": "noul", "instructions": f"Is point {i} raised?"} for i in range(questions)},
    }


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = start_launcher(tmp_path_factory.mktemp("ops"), ARGS, name="ops")
    try:
        launcher.wait_healthy(300.0)
        yield launcher
    finally:
        launcher.stop(grace_s=30.0)


def pid_of(launcher: Launcher, needle: str) -> int:
    for pid in launcher.remember_tree():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            return pid
    raise AssertionError(f"no {needle} process under the launcher")


def shard_pid(launcher: Launcher) -> int:
    return pid_of(launcher, "decision_server") if _has(launcher, "decision_server") else pid_of(launcher, "decision-server")


def _has(launcher: Launcher, needle: str) -> bool:
    try:
        pid_of(launcher, needle)
        return True
    except AssertionError:
        return False


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def metric(url: str, name: str) -> float:
    text = httpx2.get(f"{url}/metrics", timeout=30.0).text
    match = re.search(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def settle(launcher: Launcher) -> None:
    """Waits until the shard has finished whatever an earlier test left it (a timed-out request's batch)."""
    wait_for(lambda: metric(launcher.url, "decision_queued_tokens") == 0, "an idle queue")


def post(url: str, body: Any, timeout: float = 120.0) -> httpx2.Response:
    content = body if isinstance(body, bytes) else json.dumps(body)
    return httpx2.post(f"{url}/v1/systemone", content=content, headers={"content-type": "application/json"}, timeout=timeout)


def test_info_shows_no_filesystem_path_without_a_key(ops: Launcher) -> None:
    info = httpx2.get(f"{ops.url}/info", timeout=30.0).json()
    assert "model_dir" not in info, info
    assert "/" not in json.dumps({k: v for k, v in info.items() if k != "refusals"}).replace("\\/", ""), info
    assert info["limits"]["request_timeout_secs"] == DEADLINE_S
    assert info["limits"]["header_read_timeout_secs"] == HEADER_TIMEOUT_S
    assert info["limits"]["body_read_timeout_secs"] == BODY_TIMEOUT_S
    # The prefix cache is on by default, sized by its rule from the model and the memory free.
    cache = info["prefix_cache"]
    assert cache["enabled"] and cache["budget_bytes"] > 0 and cache["rule"].startswith("auto: "), cache
    # No --max-batch-prefill-tokens: the shard chose its budget for the CPU and the router packs its calls to it.
    budget = info["batch_budget"]
    assert budget["source"] == "shard", budget
    assert budget["max_batch_prefill_tokens"] == budget["batch_token_budget"] == 8192, budget
    assert budget["batch_budget_rule"] == "auto on cpu: 8192 tokens, the CPU default", budget
    assert info["limits"]["max_batch_prefill_tokens"] == 8192


def test_shard_debug_lines_reach_the_launchers_output_when_asked_for(ops: Launcher) -> None:
    """--shard-log-level debug: the shard writes a line per batch of reads (its size and forward time) and the
    launcher lets it through its own info filter; torch's and other libraries' debug lines stay out."""
    settle(ops)

    def batch_lines() -> list[str]:
        return [line for line in ops.output().splitlines() if "read batch" in line]

    lines_before = len(batch_lines())
    passes_before = metric(ops.url, "decision_shard_forward_passes_total")
    body = {"state": f"Ticket {uuid.uuid4().hex}: refund not received.", "questions": SMALL["questions"]}
    assert post(ops.url, body).status_code == 200
    wait_for(lambda: len(batch_lines()) > lines_before, "the shard's read batch line", 10.0)
    line = batch_lines()[lines_before]
    assert "DEBUG" in line and "packed_tokens" in line and "forward_ms" in line, line
    # The router counts the forward passes each response reports: the ones the shard logged for this batch.
    passes = re.search(r"forward_passes=(\d+)", line)
    assert passes is not None and int(passes.group(1)) >= 1, line
    assert metric(ops.url, "decision_shard_forward_passes_total") - passes_before == int(passes.group(1))
    # The shard's own debug lines only: below info its libraries stay at info (tests/test_logs.py).
    debug = [line for line in ops.output().splitlines() if " DEBUG " in line]
    assert debug and all(re.search(r"shard\{rank=0\}: (read|canvas|pooled) batch ", line) for line in debug), debug[:5]


def test_5000_random_paths_leave_the_metric_series_and_the_router_memory_flat(ops: Launcher) -> None:
    router = pid_of(ops, "decision-router")
    scrape = httpx2.get(f"{ops.url}/metrics", timeout=30.0).text
    series_before = sum(1 for line in scrape.splitlines() if line and not line.startswith("#"))
    rss_before = memory_kib(router, "VmRSS")
    rng = random.Random(20)
    with httpx2.Client(base_url=ops.url, timeout=30.0) as client:
        for i in range(5000):
            path = "/" + "".join(rng.choices(string.ascii_letters + string.digits, k=rng.randint(1, 200)))
            assert client.get(path).status_code == 404, path
            if i % 1000 == 0:
                assert client.get("/v1/nope/" + "z" * 4000).status_code == 404
    started = time.monotonic()
    scrape = httpx2.get(f"{ops.url}/metrics", timeout=30.0).text
    scrape_s = time.monotonic() - started
    series_after = sum(1 for line in scrape.splitlines() if line and not line.startswith("#"))
    rss_after = memory_kib(router, "VmRSS")
    print(f"series {series_before} -> {series_after}, router RSS {rss_before} -> {rss_after} KiB, scrape {scrape_s:.3f} s")
    # The unmatched bucket adds its few series (a counter and a histogram's buckets) once.
    assert series_after - series_before <= 40, f"{series_before} -> {series_after} series"
    assert len(scrape) < 64 << 10
    assert rss_after - rss_before < 16 << 10, f"router RSS {rss_before} -> {rss_after} KiB"


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_a_client_sending_its_head_a_byte_at_a_time_is_cut_off(ops: Launcher) -> None:
    head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 200 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", ops.port)) as sock:
        started = time.monotonic()
        closed = False
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - started > HEADER_TIMEOUT_S + 5:
                break
        closed = closed or _closed_within(sock, 2.0)
        took = time.monotonic() - started
    print(f"slow-header client closed after {took:.1f} s")
    assert closed, f"a slow-header client still connected after {took:.1f} s"
    assert HEADER_TIMEOUT_S - 0.5 <= took <= HEADER_TIMEOUT_S + 2, f"closed after {took:.1f} s"


def test_a_client_trickling_its_body_gets_408_and_its_connection_closed(ops: Launcher) -> None:
    body = json.dumps(SMALL).encode()
    head = f"POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", ops.port)) as sock:
        sock.sendall(head.encode() + body[:10])
        started = time.monotonic()
        sock.settimeout(BODY_TIMEOUT_S + 10)
        answer = b""
        while chunk := sock.recv(65536):  # the server closes the connection after its answer
            answer += chunk
        took = time.monotonic() - started
    print(f"trickled body answered after {took:.1f} s: {answer[:200]!r}")
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"body_read_timeout_secs" in answer and b"connection: close" in answer.lower(), answer
    assert BODY_TIMEOUT_S - 0.5 <= took <= BODY_TIMEOUT_S + 2, f"answered after {took:.1f} s"


def test_idle_connections_are_closed_and_a_flood_of_them_leaves_the_server_answering(ops: Launcher) -> None:
    started = time.monotonic()
    flood = [socket.create_connection(("127.0.0.1", ops.port)) for _ in range(300)]
    try:
        r = httpx2.get(f"{ops.url}/health", timeout=30.0)
        assert r.status_code == 200, show(r)
        assert _closed_within(flood[0], KEEP_ALIVE_S + 3), "an idle connection stayed open"
        took = time.monotonic() - started
        assert KEEP_ALIVE_S - 1 <= took <= KEEP_ALIVE_S + 3, f"closed after {took:.1f} s"
        assert all(_closed_within(s, 2.0) for s in flood[1:]), "some idle connections stayed open"
    finally:
        for s in flood:
            s.close()
    assert metric(ops.url, "decision_http_connections_closed_idle_total") >= 300


def test_an_8_mib_state_is_refused_within_a_memory_bound(ops: Launcher) -> None:
    """One word of 8 MiB (the body limit) is refused 413 by the token lower bound before tokenizing: the router's
    peak resident memory grows by less than 128 MiB for one such request and 384 MiB for six at once."""
    router = pid_of(ops, "decision-router")
    body = {"state": "x" * ((8 << 20) - 200), "questions": {"q": {"type": "noul", "instructions": "?"}}}
    peak_before = memory_kib(router, "VmHWM")
    started = time.monotonic()
    r = post(ops.url, body)
    took = time.monotonic() - started
    assert r.status_code == 413, show(r)
    assert error_detail(r)["error_type"] == "tokens_exceeded"
    one = memory_kib(router, "VmHWM") - peak_before
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(post(ops.url, body).status_code)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    six = memory_kib(router, "VmHWM") - peak_before
    print(f"8 MiB state: 413 in {took:.2f} s; router peak +{one // 1024} MiB for one, +{six // 1024} MiB for six")
    # Six at once on a small machine may take longer than this module's 1 s deadline to refuse: 504 then.
    assert sorted(set(results)) <= [413, 504] and len(results) == 6, results
    assert one < 128 << 10, f"one 8 MiB state raised the router's peak by {one // 1024} MiB"
    assert six < 384 << 10, f"six 8 MiB states raised the router's peak by {six // 1024} MiB"


def test_router_memory_returns_after_a_burst_of_refused_big_bodies(ops: Launcher) -> None:
    """24 bodies just over --max-body-bytes (8 MiB, Content-Length declared) at once, each refused 413: they are read
    and dropped, never kept, and the router's RSS is back within 20 % of its level before the burst (main at c51abd6
    kept a buffer of the whole limit per body: 97 -> 184 MiB; now 100 -> 64 MiB)."""
    router = pid_of(ops, "decision-router")
    body = b'{"state": "' + b"x" * ((8 << 20) + 1024) + b'", "questions": {}}'
    before = memory_kib(router, "VmRSS")
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(post(ops.url, body).status_code)) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(3.0)
    after = memory_kib(router, "VmRSS")
    print(f"24 refused 8 MiB bodies: router RSS {before // 1024} -> {after // 1024} MiB")
    # This module's 2 s body clock may cut an upload short on a busy machine: 408, refused all the same.
    assert len(codes) == 24 and set(codes) <= {413, 408} and 413 in codes, codes
    assert after <= before * 1.2, f"router RSS {before // 1024} -> {after // 1024} MiB after the burst"


def test_a_request_past_its_deadline_is_504_naming_the_limit(ops: Launcher) -> None:
    settle(ops)
    assert post(ops.url, SMALL).status_code == 200  # the read rate is known from here on
    started = time.monotonic()
    r = post(ops.url, big_request())
    took = time.monotonic() - started
    assert r.status_code == 504, show(r)
    detail = error_detail(r)
    assert detail["error_type"] == "timeout", detail
    assert f"{DEADLINE_S} s (request_timeout_secs)" in detail["message"], detail
    assert took < DEADLINE_S + 2, f"answered after {took:.1f} s"
    assert metric(ops.url, "decision_requests_timed_out_total") >= 1


def test_a_retry_after_a_504_is_read_from_the_prefix_cache(ops: Launcher) -> None:
    """A batch already at the shard when its request's deadline passes finishes there, and its prompts enter the
    prefix cache: the client's retry of the same state computes only what is not cached, within the deadline."""
    settle(ops)
    assert post(ops.url, SMALL).status_code == 200
    body = big_request(questions=4)  # the state is seconds of work; the retry computes four questions' tokens
    assert post(ops.url, body).status_code == 504
    # A small request is refused (529) while the timed-out batch would keep it past the deadline, and answered once
    # that batch has finished.
    wait_for(lambda: post(ops.url, SMALL).status_code == 200, "the timed-out batch finished", 30.0)
    started = time.monotonic()
    retry = post(ops.url, body)
    took = time.monotonic() - started
    assert retry.status_code == 200, show(retry)
    payload = retry.json()
    assert payload["x_cached_tokens"] >= 0.9 * payload["usage"]["input_tokens"], payload["usage"]
    assert took < DEADLINE_S, f"the retry took {took:.2f} s"


def test_work_that_cannot_finish_by_the_deadline_is_refused_at_once(ops: Launcher) -> None:
    settle(ops)
    assert post(ops.url, SMALL).status_code == 200
    first: list[httpx2.Response] = []
    worker = threading.Thread(target=lambda: first.append(post(ops.url, big_request())))
    worker.start()
    try:
        wait_for(lambda: metric(ops.url, "decision_queued_tokens") > 0, "the first request queued", 30.0)
        started = time.monotonic()
        r = post(ops.url, big_request())
        took = time.monotonic() - started
    finally:
        worker.join()
    assert r.status_code == 529, show(r)
    assert error_detail(r)["error_type"] == "overloaded"
    assert "request_timeout_secs" in error_detail(r)["message"]
    assert int(r.headers["retry-after"]) >= 1
    assert took < 0.5, f"the refusal took {took:.2f} s"
    assert first and first[0].status_code == 504, show(first[0]) if first else "no answer"


def test_a_budget_header_shorter_than_the_work_ahead_is_refused_at_once_naming_it(ops: Launcher) -> None:
    settle(ops)
    wait_for(lambda: post(ops.url, SMALL).status_code == 200, "a warm shard (the read rate is known from here on)", 60.0)
    first: list[httpx2.Response] = []
    worker = threading.Thread(target=lambda: first.append(post(ops.url, big_request())))
    worker.start()
    try:
        wait_for(lambda: metric(ops.url, "decision_queued_tokens") > 0, "the first request queued", 30.0)
        started = time.monotonic()
        r = httpx2.post(
            f"{ops.url}/v1/systemone",
            content=json.dumps(big_request()),
            headers={"content-type": "application/json", "x-request-timeout": "0.5"},
            timeout=30.0,
        )
        took = time.monotonic() - started
    finally:
        worker.join()
    assert r.status_code == 529, show(r)
    assert "0.5 s deadline (x-request-timeout header)" in error_detail(r)["message"], show(r)
    assert int(r.headers["retry-after"]) >= 1
    assert took < 0.5, f"the refusal took {took:.2f} s"


def test_admission_recovers_within_seconds_after_a_frozen_shard_resumes(ops: Launcher) -> None:
    """Eight clients keep sending while the shard is frozen for 8 s; after SIGCONT the first 200 must come within 5 s
    and more follow. The batch held through the stall counts at most 4x its predicted time in the read rate (the
    unit tests `queue::a_stalled_batch_does_not_poison_the_read_rate` and `admission_recovers_at_once_after_a_stall`
    fail without that cap); here main already recovered too (first 200 after 0.34 s, 18 x 200 in 5 s; 27 with it),
    since a request with nothing ahead of it always runs."""
    settle(ops)
    wait_for(lambda: post(ops.url, SMALL).status_code == 200, "a warm shard (the read rate is known from here on)", 60.0)
    shard = shard_pid(ops)
    stop = threading.Event()
    results: list[tuple[float, int]] = []

    def load() -> None:
        while not stop.is_set():
            try:
                results.append((time.monotonic(), post(ops.url, SMALL, timeout=30.0).status_code))
            except httpx2.HTTPError:
                pass

    clients = [threading.Thread(target=load) for _ in range(8)]
    os.kill(shard, signal.SIGSTOP)
    try:
        for client in clients:
            client.start()
        time.sleep(8.0)
    finally:
        resumed = time.monotonic()
        os.kill(shard, signal.SIGCONT)
    time.sleep(5.0)
    stop.set()
    for client in clients:
        client.join(60)
    after = [code for t, code in results if resumed < t <= resumed + 5.0]
    ok = [t - resumed for t, code in results if t > resumed and code == 200]
    print(f"5 s after SIGCONT: {after.count(200)} x 200, {after.count(529)} x 529, {len(after)} answers; first 200 after {min(ok, default=-1):.2f} s")
    assert ok and min(ok) < 5.0, f"no 200 within 5 s of the shard resuming: {after.count(529)} x 529"
    assert after.count(200) >= RECOVERED_200S, f"5 s after SIGCONT: {after.count(200)} x 200, {after.count(529)} x 529"


def test_a_frozen_shard_is_503_shard_unavailable_and_health_says_so(ops: Launcher) -> None:
    settle(ops)
    shard = shard_pid(ops)
    os.kill(shard, signal.SIGSTOP)
    try:
        started = time.monotonic()
        r = post(ops.url, SMALL, timeout=60.0)
        took = time.monotonic() - started
        assert r.status_code == 503, show(r)
        assert error_detail(r)["error_type"] == "shard_unavailable", show(r)
        assert r.headers.get("retry-after")
        assert took < DEADLINE_S + 4, f"answered after {took:.1f} s"
        started = time.monotonic()
        health = httpx2.get(f"{ops.url}/health", timeout=60.0)
        took = time.monotonic() - started
        assert health.status_code == 503, show(health)
        # Within 1 s, whatever the shards do: a monitor with a short timeout hears 503, not a timeout (was 5 s).
        print(f"/health under a frozen shard: 503 after {took:.2f} s")
        assert took < 1.0, f"/health answered after {took:.2f} s"
    finally:
        os.kill(shard, signal.SIGCONT)
    wait_for(lambda: httpx2.get(f"{ops.url}/health", timeout=30.0).status_code == 200, "health back after SIGCONT", 60.0)
    settle(ops)
    assert post(ops.url, SMALL).status_code == 200


def test_a_shard_that_dies_mid_request_is_503_shard_unavailable(ops: Launcher) -> None:
    """Runs last: it kills the module's shard (the launcher then stops). The request is at the shard, computing,
    when the shard dies: its connection breaks under the call, which is a shard gone (503), not a failed read."""
    settle(ops)
    assert post(ops.url, SMALL).status_code == 200
    shard = shard_pid(ops)
    answer: list[httpx2.Response] = []
    worker = threading.Thread(target=lambda: answer.append(post(ops.url, big_request(), timeout=60.0)))
    worker.start()
    wait_for(lambda: metric(ops.url, "decision_queued_tokens") > 0, "the request at the shard", 30.0)
    time.sleep(0.2)
    started = time.monotonic()
    os.kill(shard, signal.SIGKILL)
    worker.join()
    took = time.monotonic() - started
    assert answer, "no answer"
    r = answer[0]
    assert r.status_code == 503, show(r)
    assert error_detail(r)["error_type"] == "shard_unavailable", show(r)
    assert r.headers.get("retry-after")
    assert took < DEADLINE_S + 4, f"answered {took:.1f} s after the kill"
    code = ops.wait_exit(60)
    assert code not in (None, 0), f"launcher exit {code} after its shard died"
