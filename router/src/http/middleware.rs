//! What wraps every request: its id (taken from `x-request-id` or `x-typesafe-request-id`, echoed in
//! both), its span, the request metrics labelled by route template, and a decision's `Server-Timing` split.

use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

use crate::queue::ReadTiming;

/// TypeSafe's name for the request id; its SDKs read it from every response.
pub const REQUEST_ID_HEADER: &str = "x-typesafe-request-id";
/// The name proxies, load balancers and most clients use (nginx's `$request_id`, Envoy, Heroku).
pub const X_REQUEST_ID_HEADER: &str = "x-request-id";
/// Longest caller id kept: enough for a UUID with a prefix or a trace id pair, short enough for a log line.
const MAX_REQUEST_ID_BYTES: usize = 128;

/// Why a caller's request id was not used (a fresh one is answered instead, so a mangled id is never echoed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum RequestIdRefusal {
    #[error("{header}: empty")]
    Empty { header: &'static str },
    #[error("{header}: at most {MAX_REQUEST_ID_BYTES} bytes, got {len}")]
    TooLong { header: &'static str, len: usize },
    #[error("{header}: only visible ASCII characters (0x21-0x7e) are kept")]
    NotVisibleAscii { header: &'static str },
}

/// The request's id: the caller's `x-request-id`, else its `x-typesafe-request-id`, when it is a sane
/// token (1-128 visible ASCII characters); otherwise a fresh `req_<uuid>`, with the reason the caller's
/// was refused.
fn request_id_of(headers: &HeaderMap) -> (String, Option<RequestIdRefusal>) {
    let given = [X_REQUEST_ID_HEADER, REQUEST_ID_HEADER]
        .into_iter()
        .find_map(|header| headers.get(header).map(|value| (header, value)));
    let fresh = || format!("req_{}", uuid::Uuid::new_v4().simple());
    let Some((header, value)) = given else {
        return (fresh(), None);
    };
    let bytes = value.as_bytes();
    let refusal = if bytes.is_empty() {
        RequestIdRefusal::Empty { header }
    } else if bytes.len() > MAX_REQUEST_ID_BYTES {
        RequestIdRefusal::TooLong {
            header,
            len: bytes.len(),
        }
    } else if !bytes.iter().all(u8::is_ascii_graphic) {
        RequestIdRefusal::NotVisibleAscii { header }
    } else {
        // Visible ASCII only, so the bytes are UTF-8.
        return (String::from_utf8_lossy(bytes).into_owned(), None);
    };
    (fresh(), Some(refusal))
}

/// Every response carries the request's id under both names, and the request's span and log lines carry it.
pub(super) async fn request_id(request: Request, next: Next) -> Response {
    let (id, refused) = request_id_of(request.headers());
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
    if let Some(refused) = refused {
        span.in_scope(|| tracing::debug!(%refused, "the caller's request id was replaced"));
    }
    let started = Instant::now();
    let mut response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
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
        response
            .headers_mut()
            .insert(X_REQUEST_ID_HEADER, value.clone());
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

    use std::sync::{Arc, Mutex};

    use axum::body::Body;
    use axum::http::header;

    use super::super::testing::{
        call, get, post_json, state_with, test_state, text, DECISION_BODIES,
    };
    use super::*;

    /// The id a response carries, after checking that both names carry the same one.
    fn answered_id(response: &Response) -> String {
        let typesafe = response.headers().get(REQUEST_ID_HEADER);
        let common = response.headers().get(X_REQUEST_ID_HEADER);
        assert!(
            typesafe.is_some(),
            "no {REQUEST_ID_HEADER}: {:?}",
            response.headers()
        );
        assert_eq!(typesafe, common, "{:?}", response.headers());
        typesafe.unwrap().to_str().unwrap().to_owned()
    }

    fn is_generated(id: &str) -> bool {
        id.strip_prefix("req_")
            .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    }

    fn with_header(
        mut request: axum::http::Request<Body>,
        name: &str,
        value: &[u8],
    ) -> axum::http::Request<Body> {
        request.headers_mut().insert(
            name.parse::<header::HeaderName>().unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
        request
    }

    /// Operator routes, the docs, unknown paths and methods, every decision route (answered or refused), a
    /// body over the limit and a missing key: every response has an id, fresh when the caller sent none.
    #[tokio::test]
    async fn every_route_and_every_refusal_answers_a_request_id() {
        let open = test_state();
        let mut requests = vec![
            get("/health"),
            get("/info"),
            get("/metrics"),
            get("/v1/models"),
            get("/docs"),
            get("/api-doc/openapi.json"),
            get("/no/such/route"),
            get("/v1/systemone"),
            post_json("/v1/systemone", "{not json"),
        ];
        requests.extend(
            DECISION_BODIES
                .iter()
                .map(|(path, body)| post_json(path, body)),
        );
        let mut seen = std::collections::HashSet::new();
        for request in requests {
            let what = format!("{} {}", request.method(), request.uri());
            let response = call(&open, request).await;
            let id = answered_id(&response);
            assert!(is_generated(&id), "{what} ({}): {id}", response.status());
            assert!(seen.insert(id), "{what}: an id answered twice");
        }
        let small = state_with(&["--max-body-bytes", "1000"]);
        let oversized = format!(r#"{{"state": "{}"}}"#, "x".repeat(2000));
        for (path, _) in DECISION_BODIES {
            let response = call(&small, post_json(path, &oversized)).await;
            assert_eq!(
                response.status(),
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "{path}"
            );
            assert!(is_generated(&answered_id(&response)), "{path}");
        }
        let keyed = state_with(&["--api-key", "sesame"]);
        for (path, body) in DECISION_BODIES {
            let response = call(
                &keyed,
                with_header(post_json(path, body), "x-request-id", b"job-7"),
            )
            .await;
            assert_eq!(
                response.status(),
                axum::http::StatusCode::UNAUTHORIZED,
                "{path}"
            );
            assert_eq!(answered_id(&response), "job-7", "{path}");
        }
        let response = call(
            &keyed,
            with_header(get("/metrics"), "x-request-id", b"job-8"),
        )
        .await;
        assert_eq!(response.status(), axum::http::StatusCode::UNAUTHORIZED);
        assert_eq!(answered_id(&response), "job-8");
    }

    #[tokio::test]
    async fn the_callers_id_is_echoed_under_both_names() {
        let state = test_state();
        for (path, body) in DECISION_BODIES {
            for name in [X_REQUEST_ID_HEADER, REQUEST_ID_HEADER] {
                let id = format!("{name}:{path}:0123-abcd");
                let response = call(
                    &state,
                    with_header(post_json(path, body), name, id.as_bytes()),
                )
                .await;
                assert_eq!(answered_id(&response), id);
            }
        }
        let response = call(
            &state,
            with_header(get("/health"), "X-Request-ID", b"Mixed-Case_ok.~!"),
        )
        .await;
        assert_eq!(answered_id(&response), "Mixed-Case_ok.~!");
        // Both sent: the common name wins.
        let both = with_header(
            with_header(get("/health"), REQUEST_ID_HEADER, b"typesafe"),
            X_REQUEST_ID_HEADER,
            b"common",
        );
        assert_eq!(answered_id(&call(&state, both).await), "common");
    }

    #[tokio::test]
    async fn an_id_too_long_or_not_visible_ascii_is_replaced_never_echoed() {
        let state = test_state();
        let longest = "a".repeat(MAX_REQUEST_ID_BYTES);
        let response = call(
            &state,
            with_header(get("/health"), X_REQUEST_ID_HEADER, longest.as_bytes()),
        )
        .await;
        assert_eq!(answered_id(&response), longest);
        let too_long = "a".repeat(MAX_REQUEST_ID_BYTES + 1);
        let refused: [&[u8]; 6] = [
            too_long.as_bytes(),
            b"",
            b"two words",
            b"tab\there",
            "caf\u{e9}".as_bytes(),
            b"obs-text\x80\xff",
        ];
        for value in refused {
            for name in [X_REQUEST_ID_HEADER, REQUEST_ID_HEADER] {
                let response = call(&state, with_header(get("/health"), name, value)).await;
                let id = answered_id(&response);
                assert!(is_generated(&id), "{name}: {value:?} answered as {id}");
            }
        }
    }

    #[test]
    fn a_refused_id_says_why() {
        let refusal = |value: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(X_REQUEST_ID_HEADER, HeaderValue::from_bytes(value).unwrap());
            request_id_of(&headers).1.map(|r| r.to_string())
        };
        assert_eq!(refusal(b"ok-1"), None);
        assert_eq!(refusal(b"").as_deref(), Some("x-request-id: empty"));
        assert_eq!(
            refusal("b".repeat(300).as_bytes()).as_deref(),
            Some("x-request-id: at most 128 bytes, got 300")
        );
        assert_eq!(
            refusal(b"a b").as_deref(),
            Some("x-request-id: only visible ASCII characters (0x21-0x7e) are kept")
        );
    }

    /// Log lines written to a buffer the test reads.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The router's JSON log line for a request carries its id in the request span, the caller's or a fresh one.
    #[tokio::test]
    async fn the_request_span_and_its_log_lines_carry_the_id() {
        let state = test_state();
        let requests = || async {
            call(
                &state,
                with_header(get("/health"), X_REQUEST_ID_HEADER, b"trace-me-42"),
            )
            .await;
            let fresh = answered_id(&call(&state, get("/info")).await);
            call(
                &state,
                with_header(get("/health"), X_REQUEST_ID_HEADER, b"not ok"),
            )
            .await;
            fresh
        };
        // The same requests once before the subscriber is set, so every log line's callsite is
        // registered here first. Otherwise a callsite that another test's thread is registering while
        // this thread sets its subscriber can keep the interest it computed without it ("never"), and
        // the line is lost: under load this test failed 2 runs in 3 that way.
        requests().await;
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
        let fresh = requests().await;
        let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = logs
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        let done_with = |id: &str| {
            lines.iter().any(|line| {
                line["fields"]["message"] == "done"
                    && line["span"]["name"] == "request"
                    && line["span"]["request_id"] == id
            })
        };
        assert!(done_with("trace-me-42"), "{logs}");
        assert!(done_with(&fresh), "{logs}");
        assert!(
            lines.iter().any(|line| {
                line["fields"]["message"] == "the caller's request id was replaced"
                    && line["fields"]["refused"]
                        == "x-request-id: only visible ASCII characters (0x21-0x7e) are kept"
                    && line["span"]["request_id"]
                        .as_str()
                        .is_some_and(is_generated)
            }),
            "{logs}"
        );
        assert!(
            !logs.contains("not ok"),
            "a refused id is never logged as given"
        );
    }

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
        // Every series this test process recorded comes to about 33 KiB (2026-12-07); 500 leaked
        // paths would add over 40 KiB more.
        assert!(scrape.len() < 40 << 10, "{} bytes", scrape.len());
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
