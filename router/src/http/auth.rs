//! The API key (`--api-key`, `--api-key-file`): every decision route and `/v1/models` need it, the
//! operator routes too unless `--public-ops`, `/health` and `/ready` never (probes carry no key), nor the playground page (it asks for the key
//! and sends it; `playground.rs`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::Response;

use super::responses::error_response;
use super::state::AppState;
use crate::config::Secret;
use crate::error::DecisionError;
use crate::profile::Shape;

/// `Authorization: Bearer <key>` when an API key is configured; any header is fine otherwise.
pub(super) fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), DecisionError> {
    let Some(expected) = state.config.flags.api_key.as_ref().map(Secret::expose) else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    match given {
        Some(key) if constant_time_eq(key.as_bytes(), expected.as_bytes()) => Ok(()),
        _ => Err(DecisionError::Unauthorized),
    }
}

/// The credentials of an `Authorization` value in the `Bearer` scheme. Auth schemes are
/// case-insensitive (RFC 9110 §11.1), and one or more spaces separate the scheme from the token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// With an API key and without `--public-ops`, the operator routes need the key too.
pub(super) async fn ops_guard(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if !state.config.flags.public_ops {
        if let Err(e) = authorize(&state, request.headers()) {
            return error_response(&state, Shape::SystemOne, e);
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{header, StatusCode};
    use clap::Parser;
    use serde_json::Value;

    use super::super::testing::{call, get, get_with_key, state_with, text};
    use crate::config::{Config, Secret};

    const OPS_ROUTES: [&str; 4] = ["/metrics", "/info", "/docs", "/api-doc/openapi.json"];

    #[tokio::test]
    async fn with_an_api_key_the_operator_routes_need_it_and_health_does_not() {
        let state = state_with(&["--api-key", "k3y"]);
        for path in OPS_ROUTES {
            let response = call(&state, get(path)).await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
            assert!(
                text(response).await.contains("authentication_error"),
                "{path}"
            );
            let wrong = call(&state, get_with_key(path, "k3yx")).await;
            assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{path}");
            let right = call(&state, get_with_key(path, "k3y")).await;
            assert_eq!(right.status(), StatusCode::OK, "{path}");
        }
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        // /ready asks no key either: its one reason here is this test's missing model, not a 401.
        let ready = text(call(&state, get("/ready")).await).await;
        assert!(
            ready.contains("not_servable") && !ready.contains("authentication_error"),
            "{ready}"
        );
        // The key holder sees where the model lives.
        let info: Value =
            serde_json::from_str(&text(call(&state, get_with_key("/info", "k3y")).await).await)
                .unwrap();
        assert_eq!(info["model_dir"], "/srv/private-tree/secret-place");
    }

    #[tokio::test]
    async fn public_ops_opens_the_operator_routes_but_info_shows_paths_only_to_the_key() {
        let state = state_with(&["--api-key", "k3y", "--public-ops"]);
        for path in OPS_ROUTES {
            assert_eq!(
                call(&state, get(path)).await.status(),
                StatusCode::OK,
                "{path}"
            );
        }
        let anonymous = text(call(&state, get("/info")).await).await;
        assert!(!anonymous.contains("private-tree"), "{anonymous}");
        let keyed = text(call(&state, get_with_key("/info", "k3y")).await).await;
        assert!(keyed.contains("private-tree"), "{keyed}");
        // The decision routes still need the key.
        let request = axum::http::Request::post("/v1/systemone")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"state": {}, "questions": {}}"#))
            .unwrap();
        assert_eq!(
            call(&state, request).await.status(),
            StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn the_bearer_scheme_is_matched_case_insensitively() {
        for value in [
            "Bearer k1",
            "bearer k1",
            "BEARER k1",
            "BeArEr   k1 ",
            " Bearer k1",
        ] {
            assert_eq!(super::bearer_token(value), Some("k1"), "{value:?}");
        }
        for value in ["Basic k1", "Bearerk1", "Bearer ", "Bearer", "k1", ""] {
            assert_eq!(super::bearer_token(value), None, "{value:?}");
        }
    }

    #[test]
    fn the_api_key_can_come_from_a_file() {
        let path = std::env::temp_dir().join(format!("di-key-{}", std::process::id()));
        std::fs::write(&path, "  from-a-file\n").unwrap();
        let mut config = Config::parse_from([
            "decision-router",
            "--model-dir",
            "/m",
            "--api-key-file",
            path.to_str().unwrap(),
        ]);
        config.flags.load_api_key_file().unwrap();
        assert_eq!(
            config.flags.api_key.as_ref().map(Secret::expose),
            Some("from-a-file")
        );
        std::fs::write(&path, "\n").unwrap();
        let error = config.flags.load_api_key_file().unwrap_err();
        assert!(error.to_string().contains("is empty"), "{error}");
        std::fs::remove_file(&path).ok();
        assert!(Config::try_parse_from([
            "decision-router",
            "--model-dir",
            "/m",
            "--api-key",
            "a",
            "--api-key-file",
            "/f",
        ])
        .is_err());
    }
}
