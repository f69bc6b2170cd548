//! The decision routes: System One, `/v1/decisions` (OpenAI's and SGLang's shapes, told apart by their
//! fields) and `/v1/score`. Each parses its wire shape, asks the `Decider`, and formats the answer; the
//! prologue (`prologue.rs`) runs before each.

use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};
use serde_json::Value;

use super::prologue::DecisionRoute;
use super::responses::Answered;
use super::state::AppState;
use crate::affinity;
use crate::api::score::{self, ScoreRequest};
use crate::api::{self, openai, sglang, systemone};
use crate::error::DecisionError;
use crate::ir::DecisionRequest;
use crate::limits::Budget;
use crate::profile::Shape;

/// `POST /v1/systemone`.
pub(super) struct SystemOne;

impl DecisionRoute for SystemOne {
    const SHAPE: Shape = Shape::SystemOne;
    type Request = Arc<DecisionRequest>;

    fn check_headers(headers: &HeaderMap) -> Result<(), DecisionError> {
        refuse_multipart(headers)
    }

    fn parse(state: &AppState, body: &Value, _: Shape) -> Result<Self::Request, DecisionError> {
        let parsed = systemone::parse(body, &state.decider.limits, state.config.flags.compat)?;
        Ok(Arc::new(parsed))
    }

    fn affinity(request: &Self::Request) -> Option<String> {
        Some(affinity::key(request))
    }

    async fn answer(
        state: &AppState,
        request: Self::Request,
        budget: Option<Budget>,
    ) -> Result<Answered, DecisionError> {
        let decided = state
            .decider
            .decide(request.clone(), 1.0, false, budget)
            .await?;
        Ok(Answered {
            body: systemone::format(
                &request,
                &decided.decision,
                &state.model_name,
                state.config.flags.compat,
            ),
            timing: decided.timing,
            status: StatusCode::OK,
        })
    }
}

/// `POST /v1/decisions`: OpenAI's and SGLang's shapes, told apart by their fields.
pub(super) struct Decisions;

pub(super) enum DecisionsRequest {
    OpenAi(openai::Parsed),
    Sglang(sglang::Parsed),
}

impl DecisionRoute for Decisions {
    const SHAPE: Shape = Shape::OpenAi;
    type Request = DecisionsRequest;

    fn shape(body: &Value) -> Result<Shape, DecisionError> {
        api::decisions_shape(body)
    }

    fn parse(state: &AppState, body: &Value, shape: Shape) -> Result<Self::Request, DecisionError> {
        let limits = &state.decider.limits;
        if shape == Shape::Sglang {
            let limits = &state.config.flags.compat.limits(Shape::Sglang, limits);
            let parsed = sglang::parse_in(
                body,
                limits,
                state.decider.prompt_format(),
                state.config.flags.compat,
            )?;
            Ok(DecisionsRequest::Sglang(parsed))
        } else {
            let parsed = openai::parse(body, limits, state.config.flags.compat)?;
            Ok(DecisionsRequest::OpenAi(parsed))
        }
    }

    fn affinity(request: &Self::Request) -> Option<String> {
        Some(affinity::key(match request {
            DecisionsRequest::Sglang(parsed) => &parsed.request,
            DecisionsRequest::OpenAi(parsed) => &parsed.request,
        }))
    }

    async fn answer(
        state: &AppState,
        request: Self::Request,
        budget: Option<Budget>,
    ) -> Result<Answered, DecisionError> {
        match request {
            DecisionsRequest::Sglang(parsed) => {
                let (temperature, keep) = (parsed.temperature, parsed.return_prompt_token_ids);
                let decided = state
                    .decider
                    .decide(parsed.request.clone(), temperature, keep, budget)
                    .await?;
                Ok(Answered {
                    body: sglang::format(
                        &parsed,
                        &decided.decision,
                        decided.reads.as_deref(),
                        decided.prompt_format,
                    ),
                    timing: decided.timing,
                    status: StatusCode::OK,
                })
            }
            DecisionsRequest::OpenAi(parsed) => {
                let decided = state
                    .decider
                    .decide(parsed.request.clone(), 1.0, false, budget)
                    .await?;
                Ok(Answered {
                    body: openai::format(
                        &parsed,
                        &decided.decision,
                        &state.model_name,
                        state.config.flags.compat,
                    ),
                    timing: decided.timing,
                    status: StatusCode::OK,
                })
            }
        }
    }
}

/// `POST /v1/score` (SGLang's scoring route): token ids in, label probabilities out; for pinning and
/// replaying a decision's prompt. Only next-token engines can score ids this way.
pub(super) struct Score;

impl DecisionRoute for Score {
    const SHAPE: Shape = Shape::Sglang;
    type Request = ScoreRequest;

    fn parse(state: &AppState, body: &Value, _: Shape) -> Result<Self::Request, DecisionError> {
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
        score::parse(body, info.vocab_size, max_tokens)
    }

    async fn answer(
        state: &AppState,
        request: Self::Request,
        budget: Option<Budget>,
    ) -> Result<Answered, DecisionError> {
        let (outcomes, timing) = state.decider.score(score::reads(&request), budget).await?;
        Ok(Answered {
            body: score::format(&request, &outcomes, &state.model_name),
            timing,
            status: StatusCode::OK,
        })
    }
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

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{header, StatusCode};

    use super::super::testing::{call, test_state, text};

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
}
