//! The one opening every decision route runs behind: the body read under `--max-body-bytes` (the body
//! clock already wraps it), the in-flight count a drain waits for, the API key, JSON, and the 503 while
//! draining. A decision route is a `DecisionRoute` registered with `route`: it never sees the raw
//! request (its `parse` gets the JSON, its `answer` only what it parsed), so no route can skip or reorder
//! these steps.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodRouter};
use serde_json::Value;

use super::auth::authorize;
use super::budget;
use super::request_body;
use super::responses::{error_response, Answered};
use super::state::AppState;
use crate::error::{DecisionError, FieldError};
use crate::limits::Budget;
use crate::profile::Shape;

/// A route that answers decisions (reads on the shards): what it does once the prologue admitted a
/// request.
pub(super) trait DecisionRoute: Send + Sync + 'static {
    /// The shape refusals are written in until the body says otherwise.
    const SHAPE: Shape;

    /// The route's request, parsed from the body.
    type Request: Send;

    /// A refusal the headers alone decide, before the body is read as JSON.
    fn check_headers(_headers: &HeaderMap) -> Result<(), DecisionError> {
        Ok(())
    }

    /// The shape this body is in (`/v1/decisions` serves two); its errors are written in it.
    fn shape(_body: &Value) -> Result<Shape, DecisionError> {
        Ok(Self::SHAPE)
    }

    /// The request in `body`, checked against the served model and its limits. The JSON is dropped
    /// after: whatever the answer echoes must be in the request.
    fn parse(state: &AppState, body: &Value, shape: Shape) -> Result<Self::Request, DecisionError>;

    /// The request's state-affinity key (`affinity.rs`), answered as `x-decision-affinity` whatever
    /// the outcome (a client retrying a 429 elsewhere can send it too). None: the route has no state.
    fn affinity(_request: &Self::Request) -> Option<String> {
        None
    }

    /// The answer to an admitted request, within its `budget`: the caller holds the key and the
    /// server is not draining.
    fn answer(
        state: &AppState,
        request: Self::Request,
        budget: Option<Budget>,
    ) -> impl Future<Output = Result<Answered, DecisionError>> + Send;
}

/// `POST` to a decision route, behind the prologue.
pub(super) fn route<R: DecisionRoute>() -> MethodRouter<Arc<AppState>> {
    post(admit::<R>)
}

/// The prologue, in order: the in-flight count, held until the answer is ready; the body, so that
/// any refusal goes out after the whole upload was taken (one sent mid-upload can be lost with the
/// connection's reset: `request_body.rs`); the key; the route's header checks; the request's time
/// budget (`budget.rs`); JSON; the shape; the
/// refusal while draining, in that shape; the route's parse. Then the route answers, unless a drain
/// reaches its cut first: then the answer is 503 + Retry-After and the route's work (its reads
/// queued or at the shard) is dropped.
async fn admit<R: DecisionRoute>(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let _in_flight = state.in_flight.enter();
    let mut cut = state.cut.subscribe();
    let mut shape = R::SHAPE;
    let mut affinity = None;
    let work = async {
        let limit = state.decider.limits.max_body_bytes;
        let body = match request_body::refused_unsent(&headers, limit) {
            Some(refusal) => Err(refusal),
            None => request_body::read(body, limit).await,
        };
        authorize(&state, &headers)?;
        R::check_headers(&headers)?;
        let budget = budget::of(&headers, state.decider.request_timeout)?;
        let value = json_body(body)?;
        shape = R::shape(&value)?;
        refuse_when_draining(&state)?;
        let request = R::parse(&state, &value, shape)?;
        affinity = R::affinity(&request);
        // Before the reads wait: an 8 MiB body is not held for their whole time.
        drop(value);
        R::answer(&state, request, budget).await
    };
    let result = tokio::select! {
        result = work => result,
        _ = cut.wait_for(|cut| *cut) => Err(DecisionError::Draining),
    };
    let mut response = match result {
        Ok(answered) => answered.into_response(),
        Err(e) => error_response(&state, shape, e),
    };
    if let Some(value) = affinity.and_then(|key| HeaderValue::from_str(&key).ok()) {
        response
            .headers_mut()
            .insert(crate::affinity::HEADER, value);
    }
    response
}

/// The body as JSON, or the error each shape reports for a body it cannot read.
fn json_body(body: Result<Bytes, DecisionError>) -> Result<Value, DecisionError> {
    let bytes = body?;
    serde_json::from_slice(&bytes).map_err(|e| {
        DecisionError::Invalid(vec![FieldError::new(
            vec!["body".into(), e.column().into()],
            "json_invalid",
            format!("the body is not valid JSON: {e}"),
        )])
    })
}

/// Requests that arrive after a shutdown signal (on connections already open) go elsewhere.
fn refuse_when_draining(state: &AppState) -> Result<(), DecisionError> {
    if state.draining.load(Ordering::SeqCst) {
        Err(DecisionError::Draining)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::http::{header, StatusCode};
    use tower::ServiceExt as _;

    use super::super::lifecycle::drain;
    use super::super::routes::app;
    use super::super::testing::{
        call, get, post_json, state_reading_from, state_reading_from_with, state_with, test_state,
        text, HeldShard, DECISION_BODIES,
    };
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_body_that_trickles_past_its_limit_is_408_and_closes_the_connection() {
        use futures::StreamExt as _;
        let state = state_with(&["--body-read-timeout-secs", "2"]);
        let first = Bytes::from_static(br#"{"state": "Refund"#);
        let stalled = futures::stream::iter([Ok::<_, std::io::Error>(first)])
            .chain(futures::stream::pending());
        let request = axum::http::Request::post("/v1/systemone")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(stalled))
            .unwrap();
        let started = tokio::time::Instant::now();
        let response = call(&state, request).await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        let body: Value = serde_json::from_str(&text(response).await).unwrap();
        assert_eq!(body["detail"]["error_type"], "timeout", "{body}");
        assert!(
            body["detail"]["message"]
                .as_str()
                .unwrap()
                .contains("within 2 s (body_read_timeout_secs)"),
            "{body}"
        );
        let info: Value =
            serde_json::from_str(&text(call(&state, get("/info")).await).await).unwrap();
        assert_eq!(info["limits"]["body_read_timeout_secs"], 2);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_read_to_its_end_before_its_413_on_every_route() {
        // Refused unread, the rest of the upload met the connection's reset, and a proxy could drop the 413 with
        // it (docker's port proxy did, 1 run in 4). axum's `Bytes` extractor stopped reading at the limit.
        use futures::StreamExt as _;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let state = state_with(&["--max-body-bytes", "1000"]);
        for route in ["/v1/systemone", "/v1/decisions", "/v1/score"] {
            let taken = Arc::new(AtomicUsize::new(0));
            let counted = taken.clone();
            let chunks = futures::stream::iter(0..30).map(move |_| {
                counted.fetch_add(100, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 100]))
            });
            let request = axum::http::Request::post(route)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(chunks))
                .unwrap();
            let response = call(&state, request).await;
            assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE, "{route}");
            assert_eq!(response.headers()[header::CONNECTION], "close", "{route}");
            assert_eq!(
                taken.load(Ordering::SeqCst),
                3000,
                "{route}: the rest of the body was left unread"
            );
            let body = text(response).await;
            assert!(
                body.contains("larger than the limit of 1000 bytes"),
                "{route}: {body}"
            );
        }
    }

    /// A client that waits for `100 Continue` and declares a body over the limit hears 413 at once: its body is
    /// never read (it was not sent).
    #[tokio::test]
    async fn a_body_declared_over_the_limit_behind_expect_100_continue_is_refused_unread() {
        struct Unsent;
        impl http_body::Body for Unsent {
            type Data = Bytes;
            type Error = std::io::Error;
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>>
            {
                panic!("a body the client had not sent was read")
            }
        }
        let state = state_with(&["--max-body-bytes", "1000"]);
        for route in ["/v1/systemone", "/v1/decisions", "/v1/score"] {
            let request = axum::http::Request::post(route)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::CONTENT_LENGTH, "5000")
                .header(header::EXPECT, "100-continue")
                .body(Body::new(Unsent))
                .unwrap();
            let response = call(&state, request).await;
            assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE, "{route}");
            assert_eq!(response.headers()[header::CONNECTION], "close", "{route}");
        }
    }

    #[tokio::test]
    async fn a_draining_server_refuses_new_work_with_503_and_retry_after() {
        let state = test_state();
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        state.draining.store(true, Ordering::SeqCst);
        // Readiness turns 503 (balancers stop sending), liveness stays 200 (`readiness.rs`).
        let ready = call(&state, get("/ready")).await;
        assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(ready.headers()[header::RETRY_AFTER], "1");
        assert!(text(ready).await.contains("shutting down"));
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        let post = |path: &str, body: &str| {
            axum::http::Request::post(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_owned()))
                .unwrap()
        };
        for (path, body, error_field) in [
            (
                "/v1/systemone",
                r#"{"state": {}, "questions": {}}"#,
                "error_type",
            ),
            (
                "/v1/decisions",
                r#"{"model": "m", "state": {}, "questions": []}"#,
                "error",
            ),
        ] {
            let response = call(&state, post(path, body)).await;
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
            assert_eq!(response.headers()[header::RETRY_AFTER], "1", "{path}");
            let body = text(response).await;
            assert!(
                body.contains(error_field) && body.contains("shutting down"),
                "{path}: {body}"
            );
        }
    }

    /// Backpressure a balancer understands, on every decision route and wire shape: a full queue
    /// (`--max-queued-reads`) answers 529 on System One under the default profile (TypeSafe's SDK backs
    /// off on it), 429 everywhere else, each with Retry-After and the error in the route's shape.
    #[tokio::test]
    async fn a_full_queue_answers_429_or_529_with_retry_after_on_every_shape() {
        for compat in ["typesafe", "vllm", "sglang"] {
            for (path, body) in DECISION_BODIES {
                let shard = HeldShard::new();
                let state = state_reading_from_with(
                    shard.clone(),
                    &["--max-queued-reads", "1", "--compat", compat],
                );
                // One read at the shard fills the queue.
                let held = tokio::spawn(app(state.clone()).oneshot(post_json(path, body)));
                tokio::time::timeout(Duration::from_secs(5), shard.arrived.notified())
                    .await
                    .unwrap_or_else(|_| panic!("{path}: the reads never reached the shard"));
                let refused = call(&state, post_json(path, body)).await;
                let what = format!("{compat} {path} {body}");
                let expected = if compat == "typesafe" && path == "/v1/systemone" {
                    529
                } else {
                    429
                };
                assert_eq!(refused.status().as_u16(), expected, "{what}");
                assert_eq!(refused.headers()[header::RETRY_AFTER], "1", "{what}");
                let shown: Value = serde_json::from_str(&text(refused).await).unwrap();
                let message = if path == "/v1/systemone" {
                    assert_eq!(
                        shown["detail"]["error_type"], "overloaded",
                        "{what}: {shown}"
                    );
                    &shown["detail"]["message"]
                } else if body.contains("\"model\"") {
                    assert_eq!(
                        shown["error"]["type"], "rate_limit_error",
                        "{what}: {shown}"
                    );
                    &shown["error"]["message"]
                } else {
                    assert_eq!(shown["type"], "RateLimitError", "{what}: {shown}");
                    &shown["message"]
                };
                assert!(
                    message
                        .as_str()
                        .unwrap()
                        .starts_with("the server is at capacity (1 reads queued, limit 1)"),
                    "{what}: {shown}"
                );
                shard.released.add_permits(1);
                assert_eq!(
                    held.await.unwrap().unwrap().status(),
                    StatusCode::OK,
                    "{what}"
                );
                // Nothing stays counted: the next request is served.
                shard.released.add_permits(1);
                let again = call(&state, post_json(path, body)).await;
                assert_eq!(again.status(), StatusCode::OK, "{what}");
            }
        }
    }

    /// Every decision shape answers `x-decision-affinity`: equal for the questions of one state, other
    /// for another state or salt; `/v1/score` (token ids, no state) answers none.
    #[tokio::test]
    async fn every_decision_shape_answers_the_state_affinity_key() {
        let shard = HeldShard::new();
        shard.released.add_permits(100);
        let state = state_reading_from(shard);
        let key = |response: Response| async move {
            let status = response.status();
            let key = response
                .headers()
                .get(crate::affinity::HEADER)
                .map(|v| v.to_str().unwrap().to_owned());
            assert_eq!(status, StatusCode::OK, "{}", text(response).await);
            key
        };
        let systemone = |state_text: &str, question: &str, salt: &str| {
            format!(
                r#"{{"state": "{state_text}", "cache_salt": "{salt}", "questions": {{"{question}": {{"type": "noul", "instructions": "?"}}}}}}"#
            )
        };
        let openai = |input: &str, question: &str, _salt: &str| {
            format!(
                r#"{{"model": "m", "input": "{input}", "questions": [{{"type": "predicate", "name": "{question}", "instructions": "?"}}]}}"#
            )
        };
        let sglang = |input: &str, question: &str, _salt: &str| {
            format!(
                r#"{{"input": "{input}", "questions": [{{"id": "{question}", "type": "yes_no", "question": "{question}?"}}]}}"#
            )
        };
        type Body = Box<dyn Fn(&str, &str, &str) -> String>;
        let shapes: [(&str, &str, Body); 3] = [
            ("/v1/systemone", "systemone", Box::new(systemone)),
            ("/v1/decisions", "openai", Box::new(openai)),
            ("/v1/decisions", "sglang", Box::new(sglang)),
        ];
        for (path, name, body) in &shapes {
            let first = key(call(&state, post_json(path, &body("Refund", "urgent", ""))).await)
                .await
                .unwrap_or_else(|| panic!("{name}: no key"));
            let second =
                key(call(&state, post_json(path, &body("Refund", "angry", ""))).await).await;
            assert_eq!(second.as_deref(), Some(first.as_str()), "{name}");
            let other =
                key(call(&state, post_json(path, &body("Invoice", "urgent", ""))).await).await;
            assert_ne!(other.as_deref(), Some(first.as_str()), "{name}");
            // The salt is System One's field.
            if *name == "systemone" {
                let salted =
                    key(call(&state, post_json(path, &body("Refund", "urgent", "t"))).await).await;
                assert_ne!(salted.as_deref(), Some(first.as_str()), "{name}");
            }
        }
        let (path, body) = DECISION_BODIES[0];
        assert_eq!(key(call(&state, post_json(path, body)).await).await, None);
    }

    /// A client's budget header shortens the request's deadline: past it the answer is 504 naming
    /// the header, on a decision route and on `/v1/score`.
    #[tokio::test(start_paused = true)]
    async fn a_budget_header_shortens_the_deadline_and_is_named_in_the_504() {
        for (path, body, header_name) in [
            (
                "/v1/systemone",
                r#"{"state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}"#,
                "x-request-timeout",
            ),
            (
                "/v1/score",
                r#"{"query": [1, 2], "items": [[3]], "label_token_ids": [7, 8]}"#,
                "x-stainless-timeout",
            ),
        ] {
            let shard = HeldShard::new();
            let state = state_reading_from(shard.clone());
            let mut request = post_json(path, body);
            request
                .headers_mut()
                .insert(header_name, axum::http::HeaderValue::from_static("1.5"));
            let started = tokio::time::Instant::now();
            let response = call(&state, request).await;
            assert_eq!(started.elapsed(), Duration::from_millis(1500), "{path}");
            assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT, "{path}");
            let body = text(response).await;
            assert!(
                body.contains(&format!("1.5 s ({header_name} header)")),
                "{path}: {body}"
            );
        }
    }

    /// Every decision route joins the in-flight count: a drain waits for a request whose reads are
    /// still at the shard, refuses the next one with 503 + Retry-After, and ends once the first is
    /// answered.
    #[tokio::test]
    async fn a_drain_waits_for_a_slow_request_on_every_decision_route() {
        for (path, body) in DECISION_BODIES {
            let shard = HeldShard::new();
            let state = state_reading_from(shard.clone());
            let answer = tokio::spawn(app(state.clone()).oneshot(post_json(path, body)));
            tokio::time::timeout(Duration::from_secs(5), shard.arrived.notified())
                .await
                .unwrap_or_else(|_| panic!("{path}: the reads never reached the shard"));
            let draining = {
                let state = state.clone();
                tokio::spawn(async move { drain(&state, "SIGTERM", std::future::pending()).await })
            };
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(
                !draining.is_finished(),
                "{path}: the drain ended with a request in flight"
            );
            let refused = call(&state, post_json(path, body)).await;
            assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
            assert_eq!(refused.headers()[header::RETRY_AFTER], "1", "{path}");
            shard.released.add_permits(1);
            let response = answer.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            tokio::time::timeout(Duration::from_secs(1), draining)
                .await
                .unwrap_or_else(|_| panic!("{path}: the drain outlived the last request"))
                .unwrap();
        }
    }
}
