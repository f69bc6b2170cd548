"""The open loop against a slow in-process stand-in: arrivals keep the rate while answers lag, the bound on requests in
flight drops the excess and says so, latency counts from the scheduled arrival; no model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from decision_bench.cli import main
from decision_bench.runner import arrival_offsets, run_open_round
from decision_bench.tokens import make_counter
from decision_bench.workload import Workload, WorkloadSpec


class SlowServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, delay: float) -> None:
        super().__init__(("127.0.0.1", 0), SlowHandler)
        self.delay = delay
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class SlowHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SlowServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._reply(b"")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with self.server.lock:
            self.server.arrivals.append(time.perf_counter())
        time.sleep(self.server.delay)
        answers = {qid: {"type": "noul", "noul": 0.5} for qid in body["questions"]}
        self._reply(json.dumps({"answers": answers, "usage": {"input_tokens": 10, "output_tokens": 0}}).encode())

    def _reply(self, payload: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def slow() -> Iterator[SlowServer]:
    server = SlowServer(delay=0.4)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def workload() -> Workload:
    return Workload(WorkloadSpec(state_tokens=16, questions=1, options=2), make_counter(None))


def test_arrival_offsets_follow_the_rate() -> None:
    assert arrival_offsets(4.0, 3, poisson=False, seed=0) == [0.0, 0.25, 0.5]
    poisson = arrival_offsets(100.0, 5000, poisson=True, seed=1)
    assert poisson == sorted(poisson)
    assert poisson[-1] / 5000 == pytest.approx(1 / 100, rel=0.05)  # mean gap 1/rate
    with pytest.raises(ValueError, match="rate"):
        arrival_offsets(0.0, 1, poisson=False, seed=0)


def test_arrivals_keep_the_rate_while_the_server_is_slow(slow: SlowServer) -> None:
    # 40 requests/s for 0.5 s against a server taking 0.4 s each: a closed loop of 1 would send 2; the open loop sends
    # all 20, spread over the half second, none waiting for an answer.
    result = run_open_round(
        slow.url,
        workload(),
        rate=40.0,
        seconds=0.5,
        max_requests=None,
        max_outstanding=64,
        first_index=0,
        poisson=False,
    )
    assert len(result.outcomes) == 20
    assert all(outcome.status == "200" for outcome in result.outcomes)
    gaps = [b - a for a, b in zip(slow.arrivals, slow.arrivals[1:], strict=False)]
    assert slow.arrivals[-1] - slow.arrivals[0] == pytest.approx(19 / 40, abs=0.1)
    assert max(gaps) < 0.2  # never a wait for an answer (0.4 s)
    assert min(outcome.seconds for outcome in result.outcomes) >= 0.4
    assert result.offered_rate == 40.0


def test_the_bound_drops_arrivals_and_says_so(slow: SlowServer, tmp_path: Path) -> None:
    out = tmp_path / "open.json"
    args = ["--url", slow.url, "--state-tokens", "16", "--questions", "1", "--rate", "40", "--arrivals", "fixed"]
    args += ["--max-outstanding", "3", "--duration", "0.3", "--warmup", "0", "--json", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["workload"]["rate"] == 40.0 and report["workload"]["max_outstanding"] == 3
    a = report["servers"]["A"]
    loop = a["open_loop"]
    assert loop["arrived"] == 12
    assert loop["sent"] == len(slow.arrivals) == 3  # 3 in flight for 0.4 s; the next 9 arrivals found no room
    assert loop["dropped"] == 9 and a["errors_by_status"] == {"dropped": 9}
    assert loop["answered_ok"] == a["requests_ok"] == 3
    assert loop["dropped_or_failed_fraction"] == 0.75
