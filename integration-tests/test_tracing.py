"""Tracing as an operator turns it on: `--otlp-endpoint` to a real OTLP/gRPC collector (started here). A request
carrying a W3C traceparent yields one trace holding the router's request and batch spans and the shard's read
span, the shard's span a child of the router's batch span."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from launchers import Launcher, start_launcher
from otlp_collector import Collector, ReceivedSpan

BODY = {"state": "Refund not received.", "questions": {"refund": {"type": "noul", "instructions": "Money back?"}}}


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    collector = Collector()
    collector.start()
    yield collector
    collector.stop()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, collector: Collector) -> Iterator[Launcher]:
    endpoint = f"http://127.0.0.1:{collector.port}"
    launcher = start_launcher(
        tmp_path_factory.mktemp("traced"),
        ["--dtype", "float32", "--hostname", "127.0.0.1", "--otlp-endpoint", endpoint],
        name="traced",
    )
    try:
        launcher.wait_healthy(300.0)
        yield launcher
    finally:
        launcher.stop(grace_s=30.0)


def test_one_trace_spans_the_caller_the_router_and_the_shard(traced: Launcher, collector: Collector) -> None:
    trace_id = secrets.token_hex(16)
    caller_span = secrets.token_hex(8)
    r = httpx2.post(
        f"{traced.url}/v1/systemone",
        content=json.dumps(BODY),
        headers={"content-type": "application/json", "traceparent": f"00-{trace_id}-{caller_span}-01"},
        timeout=120.0,
    )
    assert r.status_code == 200, r.text

    def joined(spans: list[ReceivedSpan]) -> bool:
        ours = [s for s in spans if s.trace_id == trace_id]
        return {"decision-router", "decision-server"} <= {s.service for s in ours}

    spans = collector.wait_for(joined, timeout_s=30.0)
    ours = [s for s in spans if s.trace_id == trace_id]
    assert joined(spans), f"spans of trace {trace_id}: {ours}; all services seen: {sorted({s.service for s in spans})}"
    by_id = {s.span_id: s for s in ours}
    request = next(s for s in ours if s.service == "decision-router" and s.name == "request")
    assert request.parent_span_id == caller_span, "the router's span does not continue the caller's traceparent"
    shard = next(s for s in ours if s.service == "decision-server")
    assert shard.name == "shard.read"
    batch = by_id.get(shard.parent_span_id)
    assert batch is not None and batch.service == "decision-router" and batch.name == "batch", (
        f"the shard's span is not a child of the router's batch span: {ours}"
    )
    assert batch.parent_span_id == request.span_id


def test_a_request_without_traceparent_starts_its_own_trace(traced: Launcher, collector: Collector) -> None:
    before = {s.trace_id for s in collector.spans()}
    r = httpx2.post(f"{traced.url}/v1/systemone", json=BODY, timeout=120.0)
    assert r.status_code == 200, r.text

    def new_trace(spans: list[ReceivedSpan]) -> bool:
        fresh = [s for s in spans if s.trace_id not in before]
        return {"decision-router", "decision-server"} <= {s.service for s in fresh}

    spans = collector.wait_for(new_trace, timeout_s=30.0)
    assert new_trace(spans), f"no new trace joined router and shard: {spans[-10:]}"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _connections(inodes: set[str]) -> list[tuple[int, int]]:
    """(local port, remote port) of this namespace's TCP sockets (IPv4 and IPv6) among `inodes`, listeners left out."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if inode in inodes and state != "0A":  # 0A: LISTEN
                found.append((int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)))
    return found


def test_without_an_endpoint_no_process_connects_anywhere(session_launcher: Launcher) -> None:
    """Off by default: the session's router and shard open no outbound TCP connection (the shard talks over a unix
    socket; every TCP connection the router holds is a client's, to its own port)."""
    r = httpx2.post(f"{session_launcher.url}/v1/systemone", json=BODY, timeout=120.0)
    assert r.status_code == 200, r.text
    tree = session_launcher.remember_tree()
    assert tree
    outbound = []
    for pid in tree:
        try:
            connections = _connections(_socket_inodes(pid))
        except OSError:
            continue
        outbound += [(pid, local, remote) for local, remote in connections if local != session_launcher.port]
    assert not outbound, f"outbound TCP connections (pid, local port, remote port): {outbound}"
