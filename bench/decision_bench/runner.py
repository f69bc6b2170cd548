"""Closed-loop load (C workers, each sending its next request as soon as its previous one is answered) and open-loop
load (requests arriving at a rate, answered or not).

A round stops by itself: no request starts after its deadline or past its count; requests in flight are awaited.
Each outcome keeps the answer's Server-Timing (router, queue, shard ms) when the server sends one."""

from __future__ import annotations

import http.client
import json
import math
import queue
import random
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from decision_bench import server_timing
from decision_bench.workload import Request, Workload

SYSTEMONE_PATH = "/v1/systemone"
# Refusals a client backs off from for the server's Retry-After before its next request, as the SDKs do
# (a closed loop without the pause would turn every refusal into another request at once).
RETRY_STATUSES = (429, 503, 529)


@dataclass
class Outcome:
    index: int
    status: str  # HTTP status as text, or an error class ("connection_error", "incomplete_answers", …)
    seconds: float
    input_tokens: int | None = None
    cached_tokens: int | None = None
    state_tokens: int = 0
    naive_prompt_tokens: int = 0
    server_timing: dict[str, float] = field(default_factory=dict)  # name → ms, from the Server-Timing header
    bad: str | None = None  # the kind of a deliberately bad request; its status is reported apart
    retry_after: float | None = None  # the server's Retry-After on a refusal


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    server_timing: dict[str, float]  # {} when the server sends no Server-Timing header
    retry_after: float | None = None  # seconds, from a Retry-After header in delta-seconds form
    request_id: str | None = None  # the server's x-request-id (or x-typesafe-request-id)


@dataclass
class RoundResult:
    wall_seconds: float
    outcomes: list[Outcome] = field(default_factory=list)
    offered_rate: float | None = None  # requests/s of an open-loop round; None for a closed loop

    @property
    def ok(self) -> list[Outcome]:
        return [outcome for outcome in self.outcomes if outcome.status == "200" and outcome.bad is None]


class Endpoint:
    """One keep-alive HTTP connection to a server (one per worker: http.client is not thread-safe)."""

    def __init__(self, url: str, timeout: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"--url must look like http://HOST:PORT, got {url!r}")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port
        self._base = parsed.path.rstrip("/")
        self._timeout = timeout
        self._connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            factory = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            self._connection = factory(self._host, self._port, timeout=self._timeout)
        return self._connection

    def request(
        self, method: str, path: str, body: bytes | None = None, extra_headers: dict[str, str] | None = None
    ) -> Reply:
        headers = {"content-type": "application/json"} if body is not None else {}
        headers.update(extra_headers or {})
        for attempt in (0, 1):
            connection = self._connect()
            try:
                connection.request(method, self._base + path, body=body, headers=headers)
                response = connection.getresponse()
                # Several Server-Timing lines are one comma-separated list (RFC 9110 field combination).
                timing = ", ".join(response.headers.get_all("server-timing") or [])
                retry_after = response.headers.get("retry-after")
                return Reply(
                    response.status,
                    response.read(),
                    server_timing.parse(timing),
                    float(retry_after) if retry_after and retry_after.strip().isdigit() else None,
                    response.headers.get("x-request-id") or response.headers.get("x-typesafe-request-id"),
                )
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection the server closed while idle: reconnect once, then give up.
                self.close()
                if attempt == 1:
                    raise
            except Exception:
                self.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def send(endpoint: Endpoint, request: Request, questions: int) -> Outcome:
    started = time.perf_counter()
    try:
        reply = endpoint.request("POST", SYSTEMONE_PATH, request.body)
    except TimeoutError:
        return Outcome(request.index, "timeout", time.perf_counter() - started, bad=request.bad)
    except OSError:
        return Outcome(request.index, "connection_error", time.perf_counter() - started, bad=request.bad)
    except http.client.HTTPException:
        return Outcome(request.index, "http_error", time.perf_counter() - started, bad=request.bad)
    seconds = time.perf_counter() - started
    if request.bad is not None:
        return Outcome(request.index, str(reply.status), seconds, bad=request.bad)
    if reply.status in RETRY_STATUSES:
        return Outcome(request.index, str(reply.status), seconds, retry_after=reply.retry_after)
    outcome = Outcome(
        request.index,
        str(reply.status),
        seconds,
        state_tokens=request.state_tokens,
        naive_prompt_tokens=request.naive_prompt_tokens,
        server_timing=reply.server_timing,
    )
    if reply.status == 200:
        try:
            answer = json.loads(reply.body)
        except ValueError:
            outcome.status = "invalid_json"
            return outcome
        if len(answer.get("answers") or {}) != questions:
            outcome.status = "incomplete_answers"
            return outcome
        usage = answer.get("usage") or {}
        if isinstance(usage.get("input_tokens"), int):
            outcome.input_tokens = usage["input_tokens"]
        cached = answer.get("x_cached_tokens")
        if isinstance(cached, int):
            outcome.cached_tokens = cached
    return outcome


def run_round(
    url: str,
    workload: Workload,
    *,
    concurrency: int,
    seconds: float,
    max_requests: int | None,
    first_index: int,
    stream: str = "run",
    timeout: float = 300.0,
) -> RoundResult:
    """Send requests first_index, first_index+1, … of `stream` with C workers until the time or count runs out."""
    lock = threading.Lock()
    next_index = first_index
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    deadline = started + seconds
    last_done = started

    def claim() -> int | None:
        nonlocal next_index
        with lock:
            if time.perf_counter() >= deadline:
                return None
            if max_requests is not None and next_index - first_index >= max_requests:
                return None
            index = next_index
            next_index += 1
            return index

    def worker() -> None:
        nonlocal last_done
        endpoint = Endpoint(url, timeout)
        try:
            while (index := claim()) is not None:
                outcome = send(endpoint, workload.request(index, stream), workload.spec.questions)
                with lock:
                    outcomes.append(outcome)
                    last_done = time.perf_counter()
                if outcome.retry_after:
                    time.sleep(min(outcome.retry_after, max(deadline - time.perf_counter(), 0.0)))
        finally:
            endpoint.close()

    threads = [threading.Thread(target=worker, name=f"bench-worker-{i}", daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcomes.sort(key=lambda outcome: outcome.index)
    # Throughput is over the time the round was actually busy: from start to the last answer, in-flight tail included.
    return RoundResult(wall_seconds=max(last_done - started, 1e-9), outcomes=outcomes)


def fetch_metrics(url: str, timeout: float = 10.0) -> str | None:
    endpoint = Endpoint(url, timeout)
    try:
        reply = endpoint.request("GET", "/metrics")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        endpoint.close()
    return reply.body.decode(errors="replace") if reply.status == 200 else None


def arrival_offsets(rate: float, count: int, *, poisson: bool, seed: int) -> list[float]:
    """Seconds from the round's start at which each of `count` requests arrives: every 1/rate s, or Poisson at rate."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    if not poisson:
        return [index / rate for index in range(count)]
    rng = random.Random(f"{seed}:arrivals")
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.expovariate(rate)
    return offsets


def run_open_round(
    url: str,
    workload: Workload,
    *,
    rate: float,
    seconds: float,
    max_requests: int | None,
    max_outstanding: int,
    first_index: int,
    poisson: bool = True,
    timeout: float = 300.0,
) -> RoundResult:
    """Open loop: requests arrive at `rate` per second whether or not earlier ones were answered.

    At most `max_outstanding` are in flight (one sender thread each); an arrival that finds them all busy is not sent
    and counts as "dropped". Latency runs from the scheduled arrival, so a sender that starts late (the client's own
    lag) is charged to the request, not hidden (no coordinated omission). Bodies are built before the clock starts."""
    count = math.floor(rate * seconds) if max_requests is None else min(math.floor(rate * seconds), max_requests)
    count = max(count, 1)
    requests = [workload.request(first_index + number) for number in range(count)]
    offsets = arrival_offsets(rate, count, poisson=poisson, seed=workload.spec.seed + first_index)
    jobs: queue.Queue[tuple[Request, float] | None] = queue.Queue()
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    busy = 0
    started = time.perf_counter()
    last_done = started

    def sender() -> None:
        nonlocal busy, last_done
        endpoint = Endpoint(url, timeout)
        try:
            while (job := jobs.get()) is not None:
                request, due = job
                outcome = send(endpoint, request, workload.spec.questions)
                outcome.seconds = time.perf_counter() - due
                with lock:
                    outcomes.append(outcome)
                    busy -= 1
                    last_done = time.perf_counter()
        finally:
            endpoint.close()

    threads = [threading.Thread(target=sender, name=f"bench-open-{i}", daemon=True) for i in range(max_outstanding)]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    last_done = started
    for request, offset in zip(requests, offsets, strict=True):
        due = started + offset
        if (wait := due - time.perf_counter()) > 0:
            time.sleep(wait)
        with lock:
            if busy >= max_outstanding:
                outcomes.append(Outcome(request.index, "dropped", 0.0))
                continue
            busy += 1
        jobs.put((request, due))
    for _ in threads:
        jobs.put(None)
    for thread in threads:
        thread.join()
    outcomes.sort(key=lambda outcome: outcome.index)
    return RoundResult(wall_seconds=max(last_done - started, 1e-9), outcomes=outcomes, offered_rate=rate)
