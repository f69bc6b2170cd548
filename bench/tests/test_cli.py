"""The whole tool against an in-process stand-in server: rounds, A/B ratios, errors, tokens, metrics, Server-Timing,
the memory watch; no model."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from decision_bench.cli import main


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fail_every: int = 0, server_timing: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.fail_every = fail_every
        self.server_timing = server_timing
        self.retry_after: str | None = None  # sent with each 429
        self.seen = 0
        self.arrivals: list[float] = []  # time.monotonic() of each POST
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StandIn

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        with self.server.lock:
            seen = self.server.seen
        self._reply(
            200, f"decision_batch_reads_sum {seen * 8}\ndecision_batch_reads_count {seen}\n".encode(), "text/plain"
        )

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with self.server.lock:
            self.server.seen += 1
            self.server.arrivals.append(time.monotonic())
            seen = self.server.seen
        if self.server.fail_every and seen % self.server.fail_every == 0:
            extra = (("retry-after", self.server.retry_after),) if self.server.retry_after else ()
            self._reply(429, b'{"detail":{"error_type":"overloaded","message":"busy"}}', headers=extra)
            return
        answers = {qid: {"type": "noul", "noul": 0.5} for qid in body["questions"]}
        usage = {"input_tokens": len(body["state"]) // 4, "output_tokens": 0}
        payload = json.dumps({"model": "m", "answers": answers, "usage": usage, "x_cached_tokens": 0}).encode()
        if self.server.server_timing:
            # Like the decision router, with router time = the request's number; two header lines, one with a desc.
            timing = (f"router;dur={seen}.000, queue;dur=0.500", 'shard;desc="forward, batch";dur=40')
            self._reply(200, payload, timing=timing)
        else:
            self._reply(200, payload)

    def _reply(
        self,
        status: int,
        payload: bytes,
        kind: str = "application/json",
        timing: tuple[str, ...] = (),
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        for line in timing:
            self.send_header("server-timing", line)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def serve(fail_every: int = 0, server_timing: bool = False) -> Iterator[StandIn]:
    server = StandIn(fail_every, server_timing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def server_a() -> Iterator[StandIn]:
    yield from serve()


@pytest.fixture
def server_b() -> Iterator[StandIn]:
    yield from serve(fail_every=5)


@pytest.fixture
def router() -> Iterator[StandIn]:
    yield from serve(server_timing=True)


def test_single_server_report(server_a: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    code = main(
        [
            "--url",
            server_a.url,
            "--state-tokens",
            "64",
            "--questions",
            "3",
            "--concurrency",
            "2",
            "--duration",
            "5",
            "--requests",
            "12",
            "--warmup",
            "1",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == report
    a = report["servers"]["A"]
    assert a["requests_total"] == 12
    assert a["requests_ok"] == 12
    assert a["errors_by_status"] == {}
    assert a["questions_per_s"] == pytest.approx(a["requests_per_s"] * 3, rel=1e-3)
    assert a["latency_ms"]["p50"] > 0
    assert a["tokens"]["server_reported_requests"] == 12
    assert a["tokens"]["server_input_tokens"] > 0
    assert a["tokens"]["estimated_per_question_prompt_tokens"] > a["tokens"]["server_input_tokens"]
    assert a["server_metrics"]["batches"] == 12
    assert a["server_metrics"]["mean_reads_per_batch"] == 8.0
    assert server_a.seen == 13  # 12 measured + 1 warmup
    assert "ratios_b_over_a" not in report
    assert "server_timing_ms" not in a  # no Server-Timing header, no numbers
    assert "rss" not in report


def test_ab_rounds_alternate_and_count_errors(
    server_a: StandIn, server_b: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "--url",
            server_a.url,
            "--url-b",
            server_b.url,
            "--state-tokens",
            "32",
            "--questions",
            "2",
            "--duration",
            "4",
            "--requests",
            "20",
            "--rounds",
            "4",
            "--warmup",
            "0",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    a, b = report["servers"]["A"], report["servers"]["B"]
    assert len(a["rounds"]) == len(b["rounds"]) == 4
    assert a["requests_total"] == b["requests_total"] == 20
    assert b["errors_by_status"] == {"429": 4}
    assert b["requests_ok"] == 16
    assert set(report["ratios_b_over_a"]) >= {"median_round_questions_per_s", "latency_p50"}


def test_pause_leaves_each_server_idle_before_every_round(
    server_a: StandIn, server_b: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--url", server_a.url, "--url-b", server_b.url, "--state-tokens", "16", "--questions", "1"]
    args += ["--duration", "20", "--requests", "3", "--rounds", "3", "--warmup", "0", "--pause", "0.3"]
    started = time.monotonic()
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workload"]["pause_s"] == 0.3
    # One request per round, rounds A, B, A, B, A, B, each after a 0.3 s pause: no two requests closer than that.
    arrivals = sorted([*server_a.arrivals, *server_b.arrivals])
    assert len(arrivals) == 6
    assert min(later - earlier for earlier, later in zip([started, *arrivals], arrivals, strict=False)) >= 0.3
    # Without a pause the next round starts at once.
    server_a.arrivals.clear()
    server_b.arrivals.clear()
    assert main([*args[:-2]]) == 0
    capsys.readouterr()
    arrivals = sorted([*server_a.arrivals, *server_b.arrivals])
    assert max(later - earlier for earlier, later in itertools.pairwise(arrivals)) < 0.3


def test_unreachable_server_is_counted_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    with StandIn() as closed:
        url = closed.url
    code = main(
        [
            "--url",
            url,
            "--state-tokens",
            "16",
            "--questions",
            "1",
            "--duration",
            "1",
            "--requests",
            "3",
            "--warmup",
            "0",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["servers"]["A"]["errors_by_status"] == {"connection_error": 3}
    assert report["servers"]["A"]["latency_ms"]["p50"] is None


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", "http://127.0.0.1:1", "--mix", "choice,poll"]) == 2
    with pytest.raises(SystemExit):
        main(["--url", "http://127.0.0.1:1", "--concurrency", "0"])
    with pytest.raises(SystemExit):
        main(["--url", "http://127.0.0.1:1", "--pause", "-1"])


def test_table_row_from_report(server_a: StandIn, server_b: StandIn, tmp_path: Path) -> None:
    from decision_bench.table import main as table_main

    out = tmp_path / "cell.json"
    assert (
        main(
            [
                "--url",
                server_a.url,
                "--url-b",
                server_b.url,
                "--label",
                "A and B",
                "--state-tokens",
                "16",
                "--questions",
                "1",
                "--duration",
                "2",
                "--requests",
                "4",
                "--rounds",
                "2",
                "--warmup",
                "0",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert "--label 'A and B'" in report["command"]
    assert table_main([str(out)]) == 0


def test_server_timing_summarized_per_name(
    router: StandIn, server_a: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "--url",
            router.url,
            "--url-b",
            server_a.url,
            "--state-tokens",
            "16",
            "--questions",
            "2",
            "--concurrency",
            "3",
            "--duration",
            "5",
            "--requests",
            "12",
            "--warmup",
            "1",
            "--rounds",
            "1",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    timing = report["servers"]["A"]["server_timing_ms"]
    assert set(timing) == {"router", "queue", "shard", "router_plus_queue"}
    # Measured requests are the stand-in's 2nd to 13th: router 2..13 ms.
    assert timing["router"] == {"requests": 12, "p50": 7.5, "p95": 12.45, "p99": 12.89, "mean": 7.5}
    assert timing["queue"] == {"requests": 12, "p50": 0.5, "p95": 0.5, "p99": 0.5, "mean": 0.5}
    assert timing["shard"]["p50"] == 40.0
    assert timing["router_plus_queue"]["p50"] == 8.0
    assert timing["router_plus_queue"]["requests"] == 12
    assert "server_timing_ms" not in report["servers"]["B"]


def test_watch_pid_reports_resident_memory(server_a: StandIn, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--url",
            server_a.url,
            "--state-tokens",
            "16",
            "--questions",
            "1",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--watch-pid",
            str(os.getpid()),
            "--rss-interval",
            "0.1",
        ]
    )
    assert code == 0
    memory = json.loads(capsys.readouterr().out)["rss"]
    assert memory["pids"] == [os.getpid()]
    assert memory["interval_s"] == 0.1
    assert memory["settle_s"] == 60.0
    assert len(memory["samples"]) >= 4  # start, ticks over half a second, end
    assert memory["samples"][0]["seconds"] < 0.1
    assert all(sample["bytes"] > 0 and sample["processes"] >= 1 for sample in memory["samples"])
    assert memory["baseline_seconds"] == memory["samples"][0]["seconds"]  # shorter than the settling time
    assert memory["min_mib"] <= memory["first_mib"] <= memory["max_mib"]
    assert abs(memory["change_after_warmup"]) <= memory["max_deviation"] < 1.0


def test_watch_pid_must_exist(capsys: pytest.CaptureFixture[str]) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    with pytest.raises(SystemExit) as exit_info:
        main(["--url", "http://127.0.0.1:1", "--watch-pid", str(finished.pid)])
    assert exit_info.value.code == 2
    assert f"--watch-pid {finished.pid}: no such process" in capsys.readouterr().err


def test_a_refusal_with_retry_after_pauses_the_worker(capsys: pytest.CaptureFixture[str]) -> None:
    """A closed loop that ignored Retry-After would send hundreds of requests a second at a refusing server."""
    for server in serve(fail_every=1):
        server.retry_after = "1"
        code = main(
            ["--url", server.url, "--state-tokens", "16", "--questions", "1", "--duration", "2.5", "--warmup", "0"]
        )
        assert code == 0
        report = json.loads(capsys.readouterr().out)["servers"]["A"]
        assert report["errors_by_status"] == {"429": report["requests_total"]}
        assert 2 <= report["requests_total"] <= 4, report["requests_total"]
