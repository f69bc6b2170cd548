//! Swagger UI at `/docs`, from files compiled into the binary (`utoipa-swagger-ui`'s vendored bundle):
//! the OpenAPI document browsed and tried out with no CDN, for deployments that are often offline.

use std::sync::{Arc, LazyLock};

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use utoipa_swagger_ui::Config;

/// Where the page reads the document: the route `decision-router --print-openapi` describes.
const DOCUMENT: &str = "/api-doc/openapi.json";

/// Swagger UI's files from this server only; `validatorUrl: none` keeps it from asking
/// validator.swagger.io for a badge, an outbound call nobody asked for.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data:; \
     style-src 'self' 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

static CONFIG: LazyLock<Arc<Config<'static>>> = LazyLock::new(|| {
    Arc::new(
        Config::new([DOCUMENT])
            .validator_url("none")
            .display_request_duration(true)
            .persist_authorization(true),
    )
});

/// `/docs` and `/docs/`: the page, its files addressed from `/docs/` so both paths work.
pub(super) async fn index_handler() -> Response {
    file_response("index.html")
}

/// `/docs/{file}`: the bundle's scripts and styles, and the initializer that names the document.
pub(super) async fn file_handler(Path(file): Path<String>) -> Response {
    file_response(&file)
}

fn file_response(file: &str) -> Response {
    match utoipa_swagger_ui::serve(file, CONFIG.clone()) {
        Ok(Some(found)) => {
            let body = if file == "index.html" {
                // The bundle's page names its files relative to itself (`./swagger-ui.css`), which
                // from `/docs` (no slash) would be `/swagger-ui.css`.
                String::from_utf8_lossy(&found.bytes)
                    .replace("\"./", "\"/docs/")
                    .into_bytes()
            } else {
                found.bytes.into_owned()
            };
            let content_type = HeaderValue::from_str(&found.content_type)
                .unwrap_or(HeaderValue::from_static("application/octet-stream"));
            (
                [
                    (header::CONTENT_TYPE, content_type),
                    (
                        header::CONTENT_SECURITY_POLICY,
                        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
                    ),
                    (
                        header::X_CONTENT_TYPE_OPTIONS,
                        HeaderValue::from_static("nosniff"),
                    ),
                ],
                body,
            )
                .into_response()
        }
        Ok(None) => (
            StatusCode::NOT_FOUND,
            format!("/docs/{file}: no such file in the Swagger UI bundle"),
        )
            .into_response(),
        Err(e) => {
            tracing::error!(file, error = %e, "Swagger UI file could not be rendered");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("/docs/{file}: {e}"),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{header, StatusCode};

    use super::super::testing::{call, get, get_with_key, state_with, test_state, text};

    #[tokio::test]
    async fn the_page_and_its_files_are_served_from_the_binary() {
        let state = test_state();
        for path in ["/docs", "/docs/"] {
            let response = call(&state, get(path)).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(
                response.headers()[header::CONTENT_TYPE],
                "text/html",
                "{path}"
            );
            let page = text(response).await;
            assert!(page.contains("swagger-ui"), "{page}");
            // Every file the page names is served here, none from another origin.
            assert!(!page.contains("\"./") && !page.contains("http"), "{page}");
            for file in [
                "swagger-ui.css",
                "swagger-ui-bundle.js",
                "swagger-initializer.js",
            ] {
                assert!(page.contains(&format!("/docs/{file}")), "{file}: {page}");
                let asset = call(&state, get(&format!("/docs/{file}"))).await;
                assert_eq!(asset.status(), StatusCode::OK, "{file}");
            }
        }
        let initializer = text(call(&state, get("/docs/swagger-initializer.js")).await).await;
        assert!(
            initializer.contains("/api-doc/openapi.json"),
            "{initializer}"
        );
        assert!(
            initializer.contains("\"validatorUrl\": \"none\""),
            "{initializer}"
        );
    }

    #[tokio::test]
    async fn a_file_not_in_the_bundle_is_a_404_naming_it() {
        let response = call(&test_state(), get("/docs/nope.js")).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert!(text(response).await.contains("/docs/nope.js"));
    }

    #[tokio::test]
    async fn with_an_api_key_the_page_and_its_files_need_it_unless_public_ops() {
        let state = state_with(&["--api-key", "k3y"]);
        for path in ["/docs", "/docs/", "/docs/swagger-ui-bundle.js"] {
            assert_eq!(
                call(&state, get(path)).await.status(),
                StatusCode::UNAUTHORIZED,
                "{path}"
            );
            assert_eq!(
                call(&state, get_with_key(path, "k3y")).await.status(),
                StatusCode::OK,
                "{path}"
            );
        }
        let open = state_with(&["--api-key", "k3y", "--public-ops"]);
        assert_eq!(
            call(&open, get("/docs/swagger-ui-bundle.js"))
                .await
                .status(),
            StatusCode::OK
        );
    }
}
