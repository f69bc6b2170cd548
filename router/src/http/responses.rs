//! Responses of the decision routes: an answer (its read timing riding along for the request
//! middleware), or an error in the wire shape of the request with the status its profile gives it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use super::state::AppState;
use crate::api::{openai, sglang, systemone};
use crate::error::DecisionError;
use crate::profile::Shape;
use crate::queue::ReadTiming;

/// Renders an error in a shape, with the status the profile gives it there.
pub(super) fn error_response(state: &AppState, shape: Shape, error: DecisionError) -> Response {
    let status = state.config.flags.compat.status(&error, shape);
    if status.is_server_error() {
        tracing::error!(%status, "{error}");
    } else {
        tracing::info!(%status, "{error}");
    }
    let body = match shape {
        Shape::SystemOne => {
            systemone::error_body(&error, state.config.flags.compat.error_type(&error, shape))
        }
        Shape::OpenAi => openai::error_body(&error),
        Shape::Sglang => sglang::error_body(&error, status.as_u16()),
    };
    let mut response = (status, Json(body)).into_response();
    if let Some(secs) = error.retry_after_secs() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if matches!(
        error,
        DecisionError::BodyTooSlow { .. } | DecisionError::BodyTooLarge { .. }
    ) {
        // The rest of the body may still be on its way (`request_body` reads a refused one only so far):
        // this connection carries no further request.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A decision answer; its read timing rides along for the request middleware to report.
pub(super) struct Answered {
    pub body: Value,
    pub timing: ReadTiming,
    /// 200, or 201 for a route that stored what it answers (`POST /v1/calibrations`).
    pub status: StatusCode,
}

impl IntoResponse for Answered {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        response.extensions_mut().insert(self.timing);
        response
    }
}
