"""`decision-batch`: a JSONL file of decision requests through a running server, one answer line per request line.

Each input line is `{"id": ..., "body": {...}, "route": "/v1/decisions"}` (route optional, default /v1/systemone).
Each output line is `{"id", "line", "status", "body"}` for an answer (any HTTP status, once retries are spent) or
`{"id", "line", "error"}` for a line that was never answered: not JSON, no usable id, a duplicate id, over
--max-line-bytes, an unknown route, or a server that could not be reached. Lines are written as answers arrive
(`line` is the input line number), each flushed whole, so a run that is stopped resumes where it was: ids already in
OUT (and id-less lines already reported) are skipped. Blank input lines are ignored. With --launch instead of --url
it starts decision-launcher for the run and stops it at the end (`launched.py`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import random
import shlex
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from decision_bench.launched import LaunchError, launched
from decision_bench.runner import Endpoint, Reply

DEFAULT_ROUTE = "/v1/systemone"
# The decision routes: System One's shape, the OpenAI and SGLang shapes (both on /v1/decisions), token-id scoring.
ROUTES = ("/v1/systemone", "/v1/decisions", "/v1/score")
# Refusals that mean "later" (queue full, draining, overloaded): retried after the server's Retry-After.
RETRY_STATUSES = frozenset({429, 503, 529})
# The router's default --max-body-bytes: a longer line could not be accepted anyway.
DEFAULT_MAX_LINE_BYTES = 8 << 20
# The router's x-request-id rule: 1-128 visible ASCII characters (a longer or odd id would be replaced, not echoed).
MAX_REQUEST_ID_BYTES = 128


@dataclass(frozen=True)
class Job:
    line: int
    id: str | int
    route: str
    body: bytes


@dataclass(frozen=True)
class LineError:
    line: int
    id: str | int | None
    kind: str  # for the summary: not_json, no_id, duplicate_id, oversized, bad_line, unreachable
    message: str

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "line": self.line, "error": self.message}


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 5  # tries after the first
    max_wait: float = 60.0  # seconds, the most one Retry-After (or back-off) is honoured for
    base_backoff: float = 0.5  # seconds, doubled per try when the server gives no Retry-After


def id_key(value: str | int) -> str:
    """Ids compare as JSON (so 7 and "7" are different ids, as they are different values)."""
    return json.dumps(value)


def parse_line(line: int, raw: bytes, seen: dict[str, int]) -> Job | LineError:
    """One input line → a job, or the reason it cannot be sent. `seen` maps the ids met so far to their lines."""
    try:
        item = json.loads(raw)
    except ValueError as e:
        return LineError(line, None, "not_json", f"not JSON: {e}")
    if not isinstance(item, dict):
        return LineError(line, None, "bad_line", f"a line must be a JSON object, got {type(item).__name__}")
    ident = item.get("id")
    if isinstance(ident, bool) or not isinstance(ident, (str, int)) or ident == "":
        return LineError(line, None, "no_id", 'no "id": each line needs a non-empty string or integer id')
    key = id_key(ident)
    if key in seen:
        return LineError(line, ident, "duplicate_id", f"duplicate id: already on line {seen[key]}")
    seen[key] = line
    unknown = sorted(set(item) - {"id", "body", "route"})
    if unknown:
        return LineError(line, ident, "bad_line", f"unknown keys {unknown}: a line holds id, body and route")
    body = item.get("body")
    if not isinstance(body, dict):
        return LineError(line, ident, "bad_line", '"body" must be a JSON object (the request of its route)')
    route = item.get("route", DEFAULT_ROUTE)
    if route not in ROUTES:
        return LineError(line, ident, "bad_line", f'"route" must be one of {", ".join(ROUTES)}, got {route!r}')
    return Job(line, ident, route, json.dumps(body, ensure_ascii=False).encode())


def read_lines(stream: IO[bytes], max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) per line; None for a line over `max_bytes`, which is never held whole in memory."""
    number = 0
    while True:
        raw = stream.readline(max_bytes + 1)
        if not raw:
            return
        number += 1
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # the rest of the oversized line, a piece at a time
                raw = stream.readline(1 << 20)
            yield number, None
        else:
            yield number, raw


def count_lines(path: Path) -> int:
    count, last = 0, b"\n"
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


@dataclass
class Done:
    """What an earlier run already wrote to OUT."""

    ids: set[str] = field(default_factory=set)
    lines: set[int] = field(default_factory=set)  # lines reported without an id


def load_done(path: Path) -> Done:
    """The ids (and id-less lines) OUT holds. A last line cut off mid-write (the run was killed) is removed."""
    done = Done()
    if not path.exists():
        return done
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    if complete < len(data):
        with path.open("r+b") as stream:
            stream.truncate(complete)
    for raw in data[:complete].splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        ident = record.get("id")
        if isinstance(ident, (str, int)) and not isinstance(ident, bool):
            done.ids.add(id_key(ident))
        elif isinstance(record.get("line"), int):
            done.lines.add(record["line"])
    return done


def request_id_header(ident: str | int) -> dict[str, str]:
    """The line's id as the request's x-request-id, so the router's logs name it, when the router would keep it."""
    text = str(ident)
    if 0 < len(text) <= MAX_REQUEST_ID_BYTES and all("!" <= c <= "~" for c in text):
        return {"x-request-id": text}
    return {}


def send(
    endpoint: Endpoint,
    job: Job,
    policy: RetryPolicy,
    headers: dict[str, str],
    on_retry: Callable[[], None],
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any] | LineError:
    """One job to its answer: 429/503/529 and transport failures are retried, waiting the server's Retry-After."""
    headers = {**headers, **request_id_header(job.id)}
    failure = ""
    for attempt in range(policy.retries + 1):
        wait: float | None = None
        try:
            reply: Reply | None = endpoint.request("POST", job.route, job.body, headers)
        except (OSError, http.client.HTTPException) as e:
            reply, failure = None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if reply is not None:
            if reply.status not in RETRY_STATUSES or attempt == policy.retries:
                return answer(job, reply)
            wait = reply.retry_after
        if attempt < policy.retries:
            on_retry()
            backoff = policy.base_backoff * 2**attempt * (0.5 + random.random())
            sleep(min(policy.max_wait, wait if wait is not None else backoff))
    return LineError(job.line, job.id, "unreachable", f"no answer after {policy.retries + 1} tries: {failure}")


def answer(job: Job, reply: Reply) -> dict[str, Any]:
    body: Any
    try:
        body = json.loads(reply.body)
    except ValueError:
        body = reply.body.decode("utf-8", errors="replace")
    record: dict[str, Any] = {"id": job.id, "line": job.line, "status": reply.status, "body": body}
    if reply.request_id:
        record["request_id"] = reply.request_id
    return record


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Tally:
    """What the run did so far, shared by the workers, the progress line and the summary."""

    def __init__(self, total_lines: int) -> None:
        self.total = total_lines
        self.started = time.monotonic()
        self.finished: float | None = None  # when the last line was written (a launched server's stop is not counted)
        self.lock = threading.Lock()
        self.written = 0  # lines this run wrote
        self.skipped = 0  # lines an earlier run wrote
        self.blank = 0
        self.retries = 0
        self.statuses: Counter[int] = Counter()
        self.errors: Counter[str] = Counter()

    def record(self, result: dict[str, Any] | LineError) -> None:
        with self.lock:
            self.written += 1
            if isinstance(result, LineError):
                self.errors[result.kind] += 1
            else:
                self.statuses[result["status"]] += 1

    def retried(self) -> None:
        with self.lock:
            self.retries += 1

    def progress(self) -> str:
        with self.lock:
            elapsed = time.monotonic() - self.started
            handled = self.written + self.skipped + self.blank
            rate = self.written / elapsed if elapsed > 0 else 0.0
            left = max(0, self.total - handled)
            eta = duration(left / rate) if rate > 0 else "?"
            share = 100 * handled / self.total if self.total else 100.0
            return (
                f"decision-batch: {handled}/{self.total} lines ({share:.0f} %), {rate:.1f}/s, ETA {eta}, "
                f"{sum(self.errors.values())} errors, {self.retries} retries"
            )

    def summary(self) -> str:
        with self.lock:
            elapsed = (self.finished or time.monotonic()) - self.started
            statuses = ", ".join(f"{count} x {status}" for status, count in sorted(self.statuses.items()))
            errors = ", ".join(f"{count} {kind}" for kind, count in sorted(self.errors.items()))
            return (
                f"decision-batch: {self.written} lines written in {duration(elapsed)} "
                f"({self.written / elapsed if elapsed > 0 else 0.0:.1f}/s); "
                f"answers: {sum(self.statuses.values())} ({statuses or 'none'}); "
                f"errors: {sum(self.errors.values())} ({errors or 'none'}); "
                f"{self.skipped} skipped (already in the output); {self.retries} retries"
            )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="decision-batch",
        description="Send a JSONL file of decision requests to a running decision-inference server and write one "
        'JSONL answer line per request line. Input lines: {"id": ..., "body": {...}, "route": ...} with route one of '
        f"{', '.join(ROUTES)} (default {DEFAULT_ROUTE}).",
        epilog='Output lines: {"id", "line", "status", "body", "request_id"} for an answer, {"id", "line", "error"} '
        "for a line that was not answered. Rerunning with the same OUT skips the ids it already holds. Exit status: "
        "0 when every line has its output line (answers with any status and error lines included), 2 when the run "
        "could not start.",
    )
    parser.add_argument("input", type=Path, metavar="IN.jsonl", help="Requests, one JSON object a line")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="OUT.jsonl", help="Answers (appended)")
    server = parser.add_mutually_exclusive_group(required=True)
    server.add_argument("--url", help="A running server, e.g. http://127.0.0.1:3000")
    server.add_argument(
        "--launch",
        nargs="?",
        const="",
        metavar="'LAUNCHER ARGS'",
        help="Start decision-launcher for this run instead (on a free loopback port, stopped at the end; its output "
        "goes to OUT.jsonl.launcher.log), with these arguments: --launch alone serves the embedded default model, "
        "--launch='--model-id Qwen/Qwen3-0.6B' another",
    )
    parser.add_argument(
        "--launch-timeout", type=float, default=900.0, help="Seconds the launched server may take to be healthy"
    )
    parser.add_argument("--launcher", help=argparse.SUPPRESS)  # the program --launch starts (tests)
    parser.add_argument("--concurrency", type=int, default=8, help="Requests in flight (default 8)")
    parser.add_argument("--retries", type=int, default=5, help="Tries after the first on 429/503/529 or no answer")
    parser.add_argument(
        "--max-retry-wait", type=float, default=60.0, help="Longest wait before one retry, in seconds (default 60)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds per request (default 300)")
    parser.add_argument(
        "--max-line-bytes",
        type=int,
        default=DEFAULT_MAX_LINE_BYTES,
        help="Longer lines are error lines, never read whole "
        f"(default {DEFAULT_MAX_LINE_BYTES}, the router's default body limit)",
    )
    parser.add_argument(
        "--api-key", default=os.environ.get("API_KEY"), help="Sent as a bearer token (default: $API_KEY, if set)"
    )
    parser.add_argument(
        "--progress-every",
        type=float,
        help="Seconds between progress lines on stderr (default 1 on a terminal, 10 otherwise; 0 for none)",
    )
    args = parser.parse_args(argv)
    for name in ("concurrency", "max_line_bytes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.retries < 0:
        parser.error("--retries must be 0 or more")
    return args


def run(args: argparse.Namespace, stderr: IO[str]) -> Tally:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    policy = RetryPolicy(args.retries, args.max_retry_wait)
    Endpoint(args.url, args.timeout)  # checks the URL before anything is read or written
    done = load_done(args.output)
    tally = Tally(count_lines(args.input))
    jobs: queue.Queue[Job | None] = queue.Queue(maxsize=2 * args.concurrency)
    write_lock = threading.Lock()
    with args.input.open("rb") as source, args.output.open("a", encoding="utf-8") as out:

        def write(result: dict[str, Any] | LineError) -> None:
            record = result.record() if isinstance(result, LineError) else result
            text = json.dumps(record, ensure_ascii=False) + "\n"
            with write_lock:
                out.write(text)
                out.flush()
            tally.record(result)

        def worker() -> None:
            endpoint = Endpoint(args.url, args.timeout)
            try:
                while (job := jobs.get()) is not None:
                    try:
                        write(send(endpoint, job, policy, headers, tally.retried))
                    except Exception as e:  # a bug or a full disk must not lose the line silently
                        write(LineError(job.line, job.id, "unreachable", f"{type(e).__name__}: {e}"))
            finally:
                endpoint.close()

        every = args.progress_every if args.progress_every is not None else (1.0 if stderr.isatty() else 10.0)
        stop = threading.Event()

        def report() -> None:
            end = "\r" if stderr.isatty() else "\n"
            while not stop.wait(every):
                stderr.write(tally.progress() + end)
                stderr.flush()

        workers = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
        reporter = threading.Thread(target=report, daemon=True)
        for thread in workers:
            thread.start()
        if every > 0:
            reporter.start()
        seen: dict[str, int] = {}
        try:
            for number, raw in read_lines(source, args.max_line_bytes):
                if raw is None:
                    item: Job | LineError = LineError(
                        number, None, "oversized", f"line longer than --max-line-bytes ({args.max_line_bytes} bytes)"
                    )
                elif not raw.strip():
                    with tally.lock:
                        tally.blank += 1
                    continue
                else:
                    item = parse_line(number, raw, seen)
                if (item.id is not None and id_key(item.id) in done.ids) or (item.id is None and number in done.lines):
                    with tally.lock:
                        tally.skipped += 1
                elif isinstance(item, LineError):
                    write(item)
                else:
                    jobs.put(item)
        finally:
            for _ in workers:
                jobs.put(None)
            for thread in workers:
                thread.join()
            tally.finished = time.monotonic()
            stop.set()
            if reporter.is_alive():
                reporter.join()
                stderr.write(tally.progress() + "\n")
    return tally


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.launch is None:
            tally = run(args, sys.stderr)
        else:
            if not args.input.is_file():  # before a server takes minutes to start
                raise FileNotFoundError(f"no such file: {args.input}")
            log = args.output.with_name(args.output.name + ".launcher.log")
            print(f"decision-batch: starting decision-launcher {args.launch} (output in {log})", file=sys.stderr)
            with launched(shlex.split(args.launch), log, args.launch_timeout, args.launcher) as url:
                args.url = url
                tally = run(args, sys.stderr)
    except (OSError, ValueError, LaunchError) as e:
        print(f"decision-batch: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"decision-batch: interrupted; run the same command again to resume from {args.output}", file=sys.stderr)
        return 130
    print(tally.summary(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
