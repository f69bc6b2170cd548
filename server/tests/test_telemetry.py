"""Shard spans join the trace the router sent in gRPC metadata; without an endpoint nothing is set up."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from decision_server.telemetry import NoTracing, OtlpTracing, tracing_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def test_without_an_endpoint_there_is_no_tracing() -> None:
    tracing = tracing_for(None, 0, 1)
    assert isinstance(tracing, NoTracing)
    with tracing.read_span([("traceparent", f"00-{TRACE_ID}-{PARENT}-01")], reads=3) as span:
        assert span is None
    assert isinstance(tracing_for("", 0, 1), NoTracing)


def test_a_read_span_continues_the_routers_trace() -> None:
    exported = InMemorySpanExporter()
    tracing = OtlpTracing("http://127.0.0.1:9", rank=1, world_size=2, exporter=exported)
    metadata = [("traceparent", f"00-{TRACE_ID}-{PARENT}-01"), ("tracestate", "vendor=x"), ("x-bin", b"raw")]
    with tracing.read_span(metadata, reads=5):
        pass
    (span,) = exported.get_finished_spans()
    assert span.name == "shard.read"
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT
    assert span.attributes is not None and span.attributes["decision.reads"] == 5
    assert span.attributes["decision.rank"] == 1
    assert span.resource.attributes["service.name"] == "decision-server"
    tracing.shutdown()
