//! Logs and traces: JSON or text logs always; OTLP span export only when an endpoint is configured
//! (`--otlp-endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT`), and then W3C trace context is continued from
//! callers and carried to the shards in gRPC metadata, so one trace spans router and shards.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// Keeps the exporter alive; dropping it (at exit) flushes the spans still buffered.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown() {
                eprintln!("cannot flush the last spans: {e}");
            }
        }
    }
}

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot set up the OTLP exporter for {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// Installs the global subscriber. With an OTLP endpoint spans are also exported (batched, from a
/// background thread) under `service_name`. Must run inside the Tokio runtime (the gRPC exporter's
/// connection lives there).
pub fn init(json: bool, otlp: Option<(&str, &str)>) -> Result<Telemetry, TelemetryError> {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = if json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let Some((endpoint, service_name)) = otlp else {
        tracing_subscriber::registry()
            .with(fmt.with_filter(filter))
            .init();
        return Ok(Telemetry { provider: None });
    };
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|source| TelemetryError::Exporter {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    let provider = SdkTracerProvider::builder()
        .with_resource(
            Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .with_batch_exporter(exporter)
        .build();
    let tracer = provider.tracer("decision-router");
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    // Spans go to OTLP at `info` and above whatever RUST_LOG says about logs.
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(spans)
        .init();
    tracing::info!(endpoint, service_name, "exporting traces over OTLP/gRPC");
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// Continues the caller's W3C trace (`traceparent`, `tracestate`) in `span`. Without an exporter
/// there is nothing to continue into and this does nothing.
pub fn continue_trace(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let _ = span.set_parent(parent);
}

/// Writes `span`'s trace context into gRPC metadata for the shard (nothing when not exporting: the
/// span then has no valid context).
pub fn inject(span: &tracing::Span, metadata: &mut tonic::metadata::MetadataMap) {
    let context = span.context();
    TraceContextPropagator::new().inject_context(&context, &mut MetadataInjector(metadata));
}

struct HeaderExtractor<'a>(&'a axum::http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt as _;

    /// The propagation round trip the router relies on: a caller's traceparent read from HTTP
    /// headers is written back out, same trace id, into gRPC metadata.
    #[test]
    fn a_traceparent_read_from_headers_is_written_to_grpc_metadata() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        headers.insert("tracestate", "vendor=x".parse().unwrap());
        let context = TraceContextPropagator::new().extract(&HeaderExtractor(&headers));
        assert_eq!(
            context.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let mut metadata = tonic::metadata::MetadataMap::new();
        TraceContextPropagator::new()
            .inject_context(&context, &mut MetadataInjector(&mut metadata));
        assert_eq!(
            metadata.get("traceparent").unwrap(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(metadata.get("tracestate").unwrap(), "vendor=x");
    }

    #[test]
    fn without_an_exporter_nothing_is_injected() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        inject(&tracing::info_span!("batch"), &mut metadata);
        assert!(metadata.is_empty());
    }
}
