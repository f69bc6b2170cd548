"""Shard spans over OTLP, only when an endpoint is configured (`serve --otlp-endpoint`): each Read joins the trace
whose W3C context the router sent in the call's gRPC metadata, so one trace spans router and shards.

Nothing here is imported, and no connection is made, unless tracing is asked for."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol


class ReadTracer(Protocol):
    def read_span(self, metadata: Sequence[tuple[str, str | bytes]], reads: int) -> AbstractContextManager[Any]: ...

    def shutdown(self) -> None: ...


class NoTracing:
    """The default: a span costs nothing and goes nowhere."""

    def read_span(self, metadata: Sequence[tuple[str, str | bytes]], reads: int) -> AbstractContextManager[Any]:
        return nullcontext()

    def shutdown(self) -> None:
        return None


class OtlpTracing:
    """Batched export to an OTLP/gRPC collector under service.name `decision-server`, one resource per rank."""

    def __init__(self, endpoint: str, rank: int, world_size: int, exporter: Any = None) -> None:
        """`exporter` replaces the OTLP one (tests: an in-memory exporter, spans handed over at once)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create({"service.name": "decision-server", "decision.rank": rank})
        self._provider = TracerProvider(resource=resource)
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            insecure = not endpoint.startswith("https://")
            processor: Any = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure))
        else:
            processor = SimpleSpanProcessor(exporter)
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("decision-server")
        self._propagator = TraceContextTextMapPropagator()
        self._rank = rank
        self._world_size = world_size

    @contextmanager
    def _span(self, metadata: Sequence[tuple[str, str | bytes]], reads: int) -> Iterator[Any]:
        carrier = {key: value if isinstance(value, str) else value.decode() for key, value in metadata}
        parent = self._propagator.extract(carrier)
        attributes = {"decision.reads": reads, "decision.rank": self._rank, "decision.world_size": self._world_size}
        with self._tracer.start_as_current_span("shard.read", context=parent, attributes=attributes) as span:
            yield span

    def read_span(self, metadata: Sequence[tuple[str, str | bytes]], reads: int) -> AbstractContextManager[Any]:
        return self._span(metadata, reads)

    def shutdown(self) -> None:
        # Flushes what is still buffered.
        self._provider.shutdown()


def tracing_for(endpoint: str | None, rank: int, world_size: int) -> ReadTracer:
    if not endpoint:
        return NoTracing()
    return OtlpTracing(endpoint, rank, world_size)
