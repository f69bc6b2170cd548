//! The decision routes: System One, `/v1/decisions` (OpenAI's and SGLang's shapes, told apart by their
//! fields) and `/v1/score`. Each parses its wire shape, asks the `Decider`, and formats the answer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use serde_json::Value;

use super::auth::authorize;
use super::request_body;
use super::responses::{answered, error_response};
use super::state::AppState;
use crate::api::{self, openai, score, sglang, systemone};
use crate::error::{DecisionError, FieldError};
use crate::profile::Shape;

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

/// TypeSafe's SDK uploads images as multipart assets referenced from the state; this server reads the
/// seed's `images` field instead. Said plainly, rather than failing as a body that is not JSON.
fn refuse_multipart(headers: &HeaderMap) -> Result<(), DecisionError> {
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/")
        });
    if multipart {
        return Err(DecisionError::BadRequest {
            param: Some("images".into()),
            message: "multipart asset uploads (the TypeSafe SDK's Image assets) are not read by this server: send each image as a URL or data URL in the `images` field of a JSON body".into(),
        });
    }
    Ok(())
}

pub(super) async fn systemone_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = request_body::read(body, state.decider.limits.max_body_bytes).await;
    let _in_flight = state.in_flight.enter();
    let mut timing = None;
    let result = async {
        authorize(&state, &headers)?;
        refuse_when_draining(&state)?;
        refuse_multipart(&headers)?;
        let value = json_body(body)?;
        let compat = state.config.compat;
        let request = systemone::parse(&value, &state.decider.limits, compat)?;
        let decided = state.decider.decide(request, 1.0, false).await?;
        timing = Some(decided.timing);
        Ok::<_, DecisionError>(systemone::format(
            &decided.request,
            &value["questions"],
            &decided.decision,
            &state.model_name,
            compat,
        ))
    }
    .await;
    match result {
        Ok(v) => answered(v, timing),
        Err(e) => error_response(&state, Shape::SystemOne, e),
    }
}

/// `/v1/decisions` serves OpenAI's and SGLang's shapes, told apart by their fields.
pub(super) async fn decisions_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = request_body::read(body, state.decider.limits.max_body_bytes).await;
    let _in_flight = state.in_flight.enter();
    let mut shape = Shape::OpenAi;
    let mut timing = None;
    let result = async {
        authorize(&state, &headers)?;
        let value = json_body(body)?;
        shape = api::decisions_shape(&value)?;
        refuse_when_draining(&state)?;
        let limits = &state.decider.limits;
        if shape == Shape::Sglang {
            let limits = &state.config.compat.limits(Shape::Sglang, limits);
            let parsed = sglang::parse(&value, limits, state.decider.prompt_format())?;
            let (temperature, keep) = (parsed.temperature, parsed.return_prompt_token_ids);
            let decided = state
                .decider
                .decide(parsed.request, temperature, keep)
                .await?;
            timing = Some(decided.timing);
            let parsed = sglang::Parsed {
                request: decided.request,
                ..parsed
            };
            Ok::<_, DecisionError>(sglang::format(
                &parsed,
                &decided.decision,
                decided.reads.as_deref(),
                decided.prompt_format,
            ))
        } else {
            let parsed = openai::parse(&value, limits, state.config.compat)?;
            let decided = state.decider.decide(parsed.request, 1.0, false).await?;
            timing = Some(decided.timing);
            let parsed = openai::Parsed {
                request: decided.request,
                echo: parsed.echo,
            };
            Ok(openai::format(
                &parsed,
                &decided.decision,
                &state.model_name,
                state.config.compat,
            ))
        }
    }
    .await;
    match result {
        Ok(v) => answered(v, timing),
        Err(e) => error_response(&state, shape, e),
    }
}

/// `/v1/score` (SGLang's scoring route): token ids in, label probabilities out; for pinning and
/// replaying a decision's prompt. Only next-token engines can score ids this way.
pub(super) async fn score_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = request_body::read(body, state.decider.limits.max_body_bytes).await;
    let mut timing = None;
    let result = async {
        authorize(&state, &headers)?;
        refuse_when_draining(&state)?;
        let value = json_body(body)?;
        let info = &state.shards.info;
        if !matches!(info.engine.as_str(), "tree" | "fork" | "naive") {
            return Err(DecisionError::BadRequest {
                param: None,
                message: format!(
                    "/v1/score reads the next token after the ids sent; this model's reads are {} reads",
                    info.engine
                ),
            });
        }
        // The answer position must fit in the model's context.
        let context = match info.max_position_embeddings as usize {
            0 => usize::MAX,
            n => n - 1,
        };
        let max_tokens = context.min(state.decider.limits.max_input_tokens);
        let request = score::parse(&value, info.vocab_size, max_tokens)?;
        let (outcomes, read_timing) = state.decider.score(score::reads(&request)).await?;
        timing = Some(read_timing);
        Ok::<_, DecisionError>(score::format(&request, &outcomes, &state.model_name))
    }
    .await;
    match result {
        Ok(v) => answered(v, timing),
        Err(e) => error_response(&state, Shape::Sglang, e),
    }
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

    use axum::http::StatusCode;

    use super::super::testing::{call, get, state_with, test_state, text};
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

    #[tokio::test]
    async fn a_multipart_upload_is_refused_saying_what_to_send() {
        let state = test_state();
        let request = axum::http::Request::post("/v1/systemone")
            .header(header::CONTENT_TYPE, "multipart/form-data; boundary=x")
            .body(Body::from("--x\r\n\r\n{}\r\n--x--\r\n"))
            .unwrap();
        let response = call(&state, request).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = text(response).await;
        assert!(
            body.contains("multipart asset uploads") && body.contains("`images`"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_draining_server_refuses_new_work_with_503_and_retry_after() {
        let state = test_state();
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        state.draining.store(true, Ordering::SeqCst);
        let health = call(&state, get("/health")).await;
        assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE);
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
}
