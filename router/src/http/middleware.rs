//! What wraps every request: its id (echoed in `x-typesafe-request-id`), its span, the request
//! metrics labelled by route template, and a decision's `Server-Timing` split.

use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

use crate::queue::ReadTiming;

pub const REQUEST_ID_HEADER: &str = "x-typesafe-request-id";

/// Every response carries a request id: the caller's (when it is a sane token) or a fresh one.
pub(super) async fn request_id(request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .unwrap_or_else(|| format!("req_{}", uuid::Uuid::new_v4().simple()));
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    // Metric series are labelled by route template, so arbitrary paths cannot grow them.
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let span = tracing::info_span!("request", request_id = %id, %method, %path);
    crate::telemetry::continue_trace(&span, request.headers());
    let started = Instant::now();
    let mut response = {
        let _entered = span.enter();
        drop(_entered);
        tracing::Instrument::instrument(next.run(request), span.clone()).await
    };
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    metrics::counter!("decision_http_requests_total", "path" => route.clone(), "status" => status.to_string()).increment(1);
    metrics::histogram!("decision_http_request_duration_seconds", "path" => route)
        .record(elapsed.as_secs_f64());
    if let Some(timing) = response.extensions().get::<ReadTiming>().copied() {
        let breakdown = TimeBreakdown::of(elapsed, timing);
        metrics::histogram!("decision_router_overhead_seconds")
            .record(breakdown.router.as_secs_f64());
        metrics::histogram!("decision_queue_wait_seconds").record(breakdown.queued.as_secs_f64());
        if let Ok(value) = HeaderValue::from_str(&breakdown.server_timing()) {
            response.headers_mut().insert("server-timing", value);
        }
    }
    span.in_scope(|| {
        tracing::info!(
            status,
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "done"
        )
    });
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// A decision request's wall time, split into what the router itself spent (parsing, rendering,
/// tokenizing, gRPC encoding and decoding, probabilities, the response), the wait in the read queue
/// and the shard call.
#[derive(Clone, Copy, Debug, PartialEq)]
struct TimeBreakdown {
    router: Duration,
    queued: Duration,
    shard: Duration,
}

impl TimeBreakdown {
    fn of(total: Duration, timing: ReadTiming) -> Self {
        TimeBreakdown {
            router: total.saturating_sub(timing.queued + timing.shard),
            queued: timing.queued,
            shard: timing.shard,
        }
    }

    /// The standard `Server-Timing` header (W3C), durations in milliseconds.
    fn server_timing(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        format!(
            "router;dur={:.3}, queue;dur={:.3}, shard;dur={:.3}",
            ms(self.router),
            ms(self.queued),
            ms(self.shard)
        )
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::super::testing::{call, get, test_state, text};
    use super::*;

    #[tokio::test]
    async fn random_paths_share_one_metric_series() {
        let state = test_state();
        for i in 0..500 {
            let path = format!("/no/such/route-{i}-{}", "y".repeat(i % 200));
            assert_eq!(
                call(&state, get(&path)).await.status(),
                StatusCode::NOT_FOUND
            );
        }
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        let scrape = text(call(&state, get("/metrics")).await).await;
        assert!(
            !scrape.contains("/no/such/route"),
            "raw paths leak into labels"
        );
        let unmatched = scrape
            .lines()
            .filter(|l| {
                l.starts_with("decision_http_requests_total{") && l.contains("path=\"unmatched\"")
            })
            .count();
        assert_eq!(unmatched, 1, "{scrape}");
        assert!(scrape.contains("path=\"/health\""), "{scrape}");
        assert!(scrape.len() < 32 << 10, "{} bytes", scrape.len());
    }

    #[test]
    fn router_time_is_what_the_queue_and_the_shard_did_not_take() {
        let timing = ReadTiming {
            queued: Duration::from_micros(250),
            shard: Duration::from_millis(40),
        };
        let breakdown = TimeBreakdown::of(Duration::from_micros(41_500), timing);
        assert_eq!(breakdown.router, Duration::from_micros(1_250));
        assert_eq!(
            breakdown.server_timing(),
            "router;dur=1.250, queue;dur=0.250, shard;dur=40.000"
        );
        // Clocks read at different places never make the router's share negative.
        assert_eq!(
            TimeBreakdown::of(Duration::from_millis(1), timing).router,
            Duration::ZERO
        );
    }
}
