//! The playground at `/`: one static page, compiled into the binary, where a person types a state and
//! questions and sees the probabilities. It calls `/info` and `/v1/systemone` like any client.
//!
//! The page itself holds nothing secret, so it loads without the API key (a browser cannot send a
//! Bearer header when navigating); with a key set, the page asks for it and sends it on every call,
//! and the server refuses those calls without it. `--no-playground` removes the route (404).

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("playground.html");

/// No script, style, image or connection from anywhere but this page and this server: the page works
/// offline and a pasted state cannot pull anything in.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub(super) async fn playground_handler() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        PAGE,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use axum::http::{header, StatusCode};

    use super::super::testing::{call, get, post_json, state_with, test_state, text};

    #[tokio::test]
    async fn the_page_is_served_at_the_root_with_a_policy_that_allows_only_this_server() {
        let response = call(&test_state(), get("/")).await;
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers().clone();
        assert_eq!(headers[header::CONTENT_TYPE], "text/html; charset=utf-8");
        let policy = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(policy.contains("default-src 'none'"), "{policy}");
        assert!(policy.contains("connect-src 'self'"), "{policy}");
        assert!(headers.contains_key("x-request-id"));
        let page = text(response).await;
        assert!(page.contains("/v1/systemone") && page.contains("/info"));
        // No CDN: nothing is loaded from another origin.
        for needle in ["src=\"http", "href=\"http", "@import", "url(http"] {
            assert!(!page.contains(needle), "the page loads {needle}");
        }
    }

    #[tokio::test]
    async fn no_playground_removes_the_route_and_nothing_else() {
        let state = state_with(&["--no-playground"]);
        let response = call(&state, get("/")).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        assert_eq!(call(&state, get("/docs")).await.status(), StatusCode::OK);
    }

    /// With a key the page loads (it holds nothing secret and a browser cannot send a header when
    /// navigating), but what it calls refuses a caller without the key, and the page asks for it.
    #[tokio::test]
    async fn with_an_api_key_the_page_loads_and_its_calls_need_the_key() {
        let state = state_with(&["--api-key", "k3y"]);
        let response = call(&state, get("/")).await;
        assert_eq!(response.status(), StatusCode::OK);
        let page = text(response).await;
        assert!(page.contains("id=\"api-key\"") && page.contains("Authorization"));
        assert!(!page.contains("k3y"));
        assert_eq!(
            call(&state, get("/info")).await.status(),
            StatusCode::UNAUTHORIZED
        );
        let body = r#"{"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}}}"#;
        assert_eq!(
            call(&state, post_json("/v1/systemone", body))
                .await
                .status(),
            StatusCode::UNAUTHORIZED
        );
    }

    #[tokio::test]
    async fn the_page_answers_only_get() {
        let state = test_state();
        let response = call(&state, post_json("/", "{}")).await;
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
}
