//! `/v1/calibrations`: fit a calibration set (read on the shards, so behind the decision prologue),
//! import an exported fit, list, get, export and delete fits. The fits themselves are
//! `calibration/`'s; errors are written in System One's shape.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::auth::authorize;
use super::prologue::{self, DecisionRoute};
use super::responses::{error_response, Answered};
use super::state::AppState;
use crate::calibration::{Fit, DOCUMENT_KIND, DOCUMENT_VERSION};
use crate::error::{DecisionError, FieldError, Loc};
use crate::limits::Budget;
use crate::profile::Shape;
use crate::queue::ReadTiming;
use set::CalibrationSet;

pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/v1/calibrations",
            prologue::route::<Fitting>().get(list_handler),
        )
        .route("/v1/calibrations/import", prologue::route::<Import>())
        .route(
            "/v1/calibrations/{id}",
            get(get_handler).delete(delete_handler),
        )
        .route("/v1/calibrations/{id}/export", get(export_handler))
}

/// `POST /v1/calibrations`: reads the set's examples and stores their fit.
pub(super) struct Fitting;

impl DecisionRoute for Fitting {
    const SHAPE: Shape = Shape::SystemOne;
    type Request = CalibrationSet;

    fn parse(state: &AppState, body: &Value, _: Shape) -> Result<Self::Request, DecisionError> {
        CalibrationSet::parse(body, &state.decider.limits, state.config.flags.compat)
    }

    async fn answer(
        state: &AppState,
        set: Self::Request,
        budget: Option<Budget>,
    ) -> Result<Answered, DecisionError> {
        let calibrations = &state.decider.calibrations;
        let Some(server) = calibrations.server.as_ref() else {
            return Err(DecisionError::NotServable(
                "this model has no read strategy, so nothing can be read to fit a calibration"
                    .into(),
            ));
        };
        let fit = set.fit(&state.decider, server, budget).await?;
        let (stored, _) = calibrations.insert(&fit)?;
        tracing::info!(id = %stored.id, name = %stored.name, n = stored.n, signatures = stored.signatures.len(), "calibration fitted");
        Ok(Answered {
            body: stored.to_json(),
            timing: ReadTiming::default(),
            status: StatusCode::CREATED,
        })
    }
}

/// `POST /v1/calibrations/import`: an exported document, stored under its own id (201; the same
/// document again is answered 200, another under that id is a 409).
pub(super) struct Import;

impl DecisionRoute for Import {
    const SHAPE: Shape = Shape::SystemOne;
    type Request = Fit;

    fn parse(_: &AppState, body: &Value, _: Shape) -> Result<Self::Request, DecisionError> {
        parse_document(body)
    }

    async fn answer(
        state: &AppState,
        fit: Self::Request,
        _: Option<Budget>,
    ) -> Result<Answered, DecisionError> {
        let (stored, written) = state.decider.calibrations.insert(&fit)?;
        Ok(Answered {
            body: stored.to_json(),
            timing: ReadTiming::default(),
            status: if written {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
        })
    }
}

/// An export document: its kind and version, and a fit a server could have written.
fn parse_document(body: &Value) -> Result<Fit, DecisionError> {
    let invalid = |path: &[&str], kind: &'static str, msg: String| {
        let path: Vec<Loc> = path.iter().map(|p| Loc::from(*p)).collect();
        DecisionError::Invalid(vec![FieldError::new(
            crate::api::fields::body_loc(&path),
            kind,
            msg,
        )])
    };
    let obj = crate::api::fields::body_object(body, "model_attributes_type")?;
    if obj.get("kind").and_then(Value::as_str) != Some(DOCUMENT_KIND) {
        return Err(invalid(
            &["kind"],
            "literal_error",
            format!("an import takes the document GET /v1/calibrations/{{id}}/export answers (kind '{DOCUMENT_KIND}')"),
        ));
    }
    if obj.get("version").and_then(Value::as_u64) != Some(u64::from(DOCUMENT_VERSION)) {
        return Err(invalid(
            &["version"],
            "literal_error",
            format!(
                "this server reads calibration documents of version {DOCUMENT_VERSION}, got {}",
                obj.get("version").unwrap_or(&Value::Null)
            ),
        ));
    }
    let Some(document) = obj.get("calibration") else {
        return Err(invalid(
            &["calibration"],
            "missing",
            "calibration is required".into(),
        ));
    };
    let fit: Fit = serde_json::from_value(document.clone())
        .map_err(|e| invalid(&["calibration"], "value_error", format!("calibration: {e}")))?;
    let problems = fit.problems();
    if !problems.is_empty() {
        return Err(DecisionError::Invalid(
            problems
                .into_iter()
                .map(|(path, msg)| {
                    let path: Vec<Loc> = path
                        .split('.')
                        .map(|p| match p.parse::<usize>() {
                            Ok(i) => Loc::Index(i),
                            Err(_) => Loc::from(p),
                        })
                        .collect();
                    FieldError::new(crate::api::fields::body_loc(&path), "value_error", msg)
                })
                .collect(),
        ));
    }
    Ok(fit)
}

fn refused(state: &AppState, error: DecisionError) -> Response {
    error_response(state, Shape::SystemOne, error)
}

fn found(state: &AppState, id: &str) -> Result<Arc<Fit>, DecisionError> {
    state.decider.calibrations.get(id).ok_or_else(|| {
        DecisionError::NotFound(format!(
            "no calibration '{id}' on this server (GET /v1/calibrations lists them)"
        ))
    })
}

/// `GET /v1/calibrations`: every fit's summary, oldest first.
async fn list_handler(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return refused(&state, e);
    }
    let summaries: Vec<Value> = state
        .decider
        .calibrations
        .list()
        .iter()
        .map(|f| f.summary())
        .collect();
    Json(json!({"calibrations": summaries})).into_response()
}

/// `GET /v1/calibrations/{id}`: the fit.
async fn get_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    match authorize(&state, &headers).and_then(|_| found(&state, &id)) {
        Ok(fit) => Json(fit.to_json()).into_response(),
        Err(e) => refused(&state, e),
    }
}

/// `GET /v1/calibrations/{id}/export`: the self-contained document an import takes.
async fn export_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    match authorize(&state, &headers).and_then(|_| found(&state, &id)) {
        Ok(fit) => Json(fit.export()).into_response(),
        Err(e) => refused(&state, e),
    }
}

/// `DELETE /v1/calibrations/{id}`: 204, or 404 when there was none.
async fn delete_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let deleted = authorize(&state, &headers).and_then(|_| {
        if state.decider.calibrations.delete(&id)? {
            Ok(())
        } else {
            Err(DecisionError::NotFound(format!(
                "no calibration '{id}' on this server (GET /v1/calibrations lists them)"
            )))
        }
    });
    match deleted {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refused(&state, e),
    }
}

pub(crate) mod set;

#[cfg(test)]
mod tests;
