"""decision-batch against a stand-in server in the test: one output line per input line whatever the line holds,
retries that wait the server's Retry-After, resuming from an output file (a cut last line included); no model."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from decision_bench import batch


class StandIn(ThreadingHTTPServer):
    """Answers every POST with what it got; `refusals[id]` 503s (with `retry_after`) precede an id's answer."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), StandInHandler)
        self.lock = threading.Lock()
        self.received: list[dict[str, Any]] = []
        self.refusals: dict[str, int] = {}
        self.retry_after = "1"
        self.statuses: dict[str, int] = {}  # a fixed non-retried status per id

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class StandInHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StandIn

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        ident = self.headers.get("x-request-id") or ""
        with self.server.lock:
            self.server.received.append(
                {
                    "path": self.path,
                    "body": body,
                    "request_id": ident,
                    "authorization": self.headers.get("authorization"),
                    "at": time.monotonic(),
                }
            )
            refuse = self.server.refusals.get(ident, 0)
            if refuse:
                self.server.refusals[ident] = refuse - 1
        if refuse:
            self._reply(503, b'{"error": "draining"}', {"retry-after": self.server.retry_after})
            return
        status = self.server.statuses.get(ident, 200)
        payload = json.dumps({"route": self.path, "echo": body}).encode()
        self._reply(status, payload, {"x-request-id": ident or "req_generated"})

    def _reply(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def server() -> Iterator[StandIn]:
    server = StandIn()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def run(server: StandIn, tmp_path: Path, lines: list[bytes], *flags: str) -> tuple[int, list[dict[str, Any]], str]:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as stream, contextlib.redirect_stderr(stream):
        code = batch.main([str(source), "-o", str(out), "--url", server.url, "--progress-every", "0.05", *flags])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return code, records, errors.read_text()


def request(ident: Any, route: str | None = None, **body: Any) -> bytes:
    line: dict[str, Any] = {"id": ident, "body": body or {"state": f"s{ident}", "questions": {}}}
    if route is not None:
        line["route"] = route
    return json.dumps(line).encode()


def by_line(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    lines = {record["line"]: record for record in records}
    assert len(lines) == len(records), f"a line answered twice: {records}"
    return lines


def test_every_line_gets_one_output_line_good_or_bad(server: StandIn, tmp_path: Path) -> None:
    lines = [
        request("a"),  # 1
        b"{not json",  # 2
        json.dumps({"body": {"state": "no id"}}).encode(),  # 3
        request("a"),  # 4: duplicate
        b"x" * 5000,  # 5: oversized
        request(7, "/v1/decisions", input="s", questions=[]),  # 6
        request("b", "/v1/score", query=[1], items=[[2]], label_token_ids=[3]),  # 7
        request("c", "/health"),  # 8: not a decision route
        json.dumps({"id": "d", "body": "a string"}).encode(),  # 9
        json.dumps({"id": True, "body": {}}).encode(),  # 10
        b"[1, 2]",  # 11
        b"   ",  # 12: blank, ignored
        json.dumps({"id": "e", "body": {}, "extra": 1}).encode(),  # 13
        json.dumps({"id": "f" * 200, "body": {}}).encode(),  # 14: too long for an x-request-id, sent without one
        request("7"),  # 15: a string "7" is not the integer 7
    ]
    code, records, stderr = run(server, tmp_path, lines, "--max-line-bytes", "4096", "--concurrency", "3")
    assert code == 0, stderr
    out = by_line(records)
    assert sorted(out) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15]
    assert out[1]["status"] == 200 and out[1]["id"] == "a"
    assert out[1]["body"]["route"] == "/v1/systemone" and out[1]["body"]["echo"]["state"] == "sa"
    assert out[1]["request_id"] == "a"
    assert out[2]["id"] is None and out[2]["error"].startswith("not JSON")
    assert out[3]["id"] is None and 'no "id"' in out[3]["error"]
    assert out[4] == {"id": "a", "line": 4, "error": "duplicate id: already on line 1"}
    assert out[5]["id"] is None and out[5]["error"] == "line longer than --max-line-bytes (4096 bytes)"
    assert out[6]["status"] == 200 and out[6]["id"] == 7 and out[6]["body"]["route"] == "/v1/decisions"
    assert out[7]["body"]["route"] == "/v1/score"
    assert "/health" in out[8]["error"] and out[8]["id"] == "c"
    assert "body" in out[9]["error"]
    assert out[10]["id"] is None and "id" in out[10]["error"]
    assert "JSON object" in out[11]["error"]
    assert "extra" in out[13]["error"]
    assert out[14]["status"] == 200 and out[14]["request_id"] == "req_generated"
    assert out[15]["status"] == 200 and out[15]["id"] == "7"
    sent = sorted(r["request_id"] for r in server.received)
    assert sent == ["", "7", "7", "a", "b"], "only good lines are sent, each once"
    assert "decision-batch: 14 lines written" in stderr
    assert "answers: 5 (5 x 200)" in stderr and "errors: 9" in stderr and "1 duplicate_id" in stderr
    assert "1 oversized" in stderr
    assert "15/15 lines (100 %)" in stderr and "ETA" in stderr and "/s" in stderr


def test_a_503_is_retried_after_its_retry_after_then_answered(server: StandIn, tmp_path: Path) -> None:
    server.refusals["slow"] = 1
    server.statuses["bad"] = 400
    started = time.monotonic()
    code, records, stderr = run(server, tmp_path, [request("slow"), request("bad")], "--api-key", "sesame")
    assert code == 0
    out = {r["id"]: r for r in records}
    assert out["slow"]["status"] == 200
    assert out["bad"]["status"] == 400, "a client error is an answer, not retried"
    tries = [r["at"] for r in server.received if r["request_id"] == "slow"]
    assert len(tries) == 2 and tries[1] - tries[0] >= 1.0, f"Retry-After: 1 not waited: {tries}"
    assert time.monotonic() - started < 10
    assert len([r for r in server.received if r["request_id"] == "bad"]) == 1
    assert {r["authorization"] for r in server.received} == {"Bearer sesame"}
    assert "1 retries" in stderr


def test_retries_spent_keep_the_last_answer_and_an_unreachable_server_is_an_error_line(
    server: StandIn, tmp_path: Path
) -> None:
    server.refusals["busy"] = 10
    server.retry_after = "0"
    code, records, _ = run(server, tmp_path, [request("busy")], "--retries", "2")
    assert code == 0 and records[0]["status"] == 503 and records[0]["body"] == {"error": "draining"}
    assert len(server.received) == 3
    gone = StandIn()
    url = gone.url
    gone.server_close()  # nothing listens there now
    source, out = tmp_path / "in2.jsonl", tmp_path / "out2.jsonl"
    source.write_bytes(request("x") + b"\n")
    assert batch.main([str(source), "-o", str(out), "--url", url, "--retries", "1", "--progress-every", "0"]) == 0
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["id"] == "x" and record["error"].startswith("no answer after 2 tries: ConnectionRefusedError")


def test_a_rerun_skips_what_the_output_holds_and_drops_a_cut_last_line(server: StandIn, tmp_path: Path) -> None:
    lines = [request("a"), request("b"), b"{bad", request("c"), request("d")]
    out = tmp_path / "out.jsonl"
    # An earlier run answered a, reported the bad line 3, and was killed while writing c's line.
    out.write_text(
        json.dumps({"id": "a", "line": 1, "status": 200, "body": {}})
        + "\n"
        + json.dumps({"id": None, "line": 3, "error": "not JSON"})
        + "\n"
        + '{"id": "c", "line": 4, "sta'
    )
    code, records, stderr = run(server, tmp_path, lines)
    assert code == 0
    assert sorted(r["request_id"] for r in server.received) == ["b", "c", "d"]
    assert [r["line"] for r in records[:2]] == [1, 3], "the earlier lines are kept as they were"
    assert sorted(r["line"] for r in records) == [1, 2, 3, 4, 5]
    assert "2 skipped" in stderr
    # Everything done: a third run sends nothing and writes nothing.
    server.received.clear()
    code, again, stderr = run(server, tmp_path, lines)
    assert code == 0 and server.received == [] and again == records
    assert "0 lines written" in stderr and "5 skipped" in stderr


def test_an_unusable_url_or_input_stops_before_anything_is_written(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(request("a") + b"\n")
    out = tmp_path / "out.jsonl"
    assert batch.main([str(source), "-o", str(out), "--url", "ftp://nowhere"]) == 2
    assert batch.main([str(tmp_path / "missing.jsonl"), "-o", str(out), "--url", "http://127.0.0.1:9"]) == 2
    assert not out.exists()
    with pytest.raises(SystemExit):
        batch.parse_args([str(source), "-o", str(out), "--url", "http://x", "--concurrency", "0"])


FAKE_LAUNCHER = """#!{python}
import json, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

argv = sys.argv[1:]
marker = argv[argv.index("--marker") + 1]
with open(marker, "w") as f:
    json.dump(argv, f)
if "--die" in argv:
    print("cannot load the model: no config.json")
    sys.exit(1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _reply(self, payload):
        self.send_response(200)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        self._reply(b"ok")

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self._reply(b'{{"answers": {{}}}}')


def stop(*_):
    with open(marker + ".stopped", "w") as f:
        f.write("SIGTERM")
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Handler).serve_forever()
"""


def fake_launcher(tmp_path: Path) -> Path:
    program = tmp_path / "decision-launcher"
    program.write_text(FAKE_LAUNCHER.format(python=sys.executable))
    program.chmod(0o755)
    return program


def test_launch_starts_a_server_for_the_run_and_stops_it(tmp_path: Path) -> None:
    source, out, marker = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "argv.json"
    source.write_bytes(request("a") + b"\n" + request("b") + b"\n")
    launch = f"--launch=--model-id org/x --marker {marker}"
    code = batch.main([str(source), "-o", str(out), launch, "--launcher", str(fake_launcher(tmp_path))])
    assert code == 0
    assert sorted((r["id"], r["status"]) for r in map(json.loads, out.read_text().splitlines())) == [
        ("a", 200),
        ("b", 200),
    ]
    argv = json.loads(marker.read_text())
    assert argv[:4] == ["--model-id", "org/x", "--marker", str(marker)]
    assert argv[4:6] == ["--hostname", "127.0.0.1"] and argv[6] == "--port"
    assert argv[8] == "--uds-path" and "decision-batch-" in argv[9], "its own shard sockets"
    assert not Path(argv[9]).parent.exists(), "the socket folder is removed at the end"
    assert (tmp_path / "argv.json.stopped").read_text() == "SIGTERM", "the server is stopped at the end"


def test_a_launched_server_that_dies_stops_the_run_with_its_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out, marker = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "argv.json"
    source.write_bytes(request("a") + b"\n")
    launch = f"--launch=--die --marker {marker}"
    code = batch.main([str(source), "-o", str(out), launch, "--launcher", str(fake_launcher(tmp_path))])
    assert code == 2
    err = capsys.readouterr().err
    assert "exited with status 1" in err and "cannot load the model: no config.json" in err, err
    assert not out.exists(), "nothing is written when no server came up"
    missing = batch.main([str(tmp_path / "absent.jsonl"), "-o", str(out), launch, "--launcher", "/nonexistent"])
    assert missing == 2 and "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        batch.parse_args([str(source), "-o", str(out)])  # neither --url nor --launch
    with pytest.raises(SystemExit):
        batch.parse_args([str(source), "-o", str(out), "--url", "http://x", "--launch"])
