//! The route table: the playground at `/` (unless `--no-playground`), the decision routes, the operator routes behind the key (unless `--public-ops`),
//! and the layers every request passes (request id and metrics, the body clock, decompression).

use std::sync::Arc;
use std::time::Duration;

use axum::middleware;
use axum::routing::get;
use axum::Router;
use tower_http::decompression::RequestDecompressionLayer;

use super::auth::ops_guard;
use super::body_clock;
use super::calibrations;
use super::decisions::{Decisions, Score, SystemOne};
use super::middleware::request_id;
use super::ops;
use super::playground;
use super::prologue;
use super::readiness;
use super::state::AppState;
use super::swagger;

pub fn app(state: Arc<AppState>) -> Router {
    let body_time = Duration::from_secs(state.config.flags.body_read_timeout_secs);
    let mut router = Router::new();
    if !state.config.flags.no_playground {
        // Open even with an API key: the page holds nothing secret and asks for the key itself.
        router = router.route("/", get(playground::playground_handler));
    }
    router
        .merge(decision_routes())
        .merge(calibrations::routes())
        .route("/v1/models", get(ops::models_handler))
        .route("/health", get(ops::health_handler))
        .route("/ready", get(readiness::ready_handler))
        .route("/info", get(ops::info_handler))
        .route(
            "/metrics",
            get(ops::metrics_handler)
                .route_layer(middleware::from_fn_with_state(state.clone(), ops_guard)),
        )
        .route(
            "/api-doc/openapi.json",
            get(ops::openapi_handler)
                .route_layer(middleware::from_fn_with_state(state.clone(), ops_guard)),
        )
        .route(
            "/docs",
            get(swagger::index_handler)
                .route_layer(middleware::from_fn_with_state(state.clone(), ops_guard)),
        )
        .route(
            "/docs/",
            get(swagger::index_handler)
                .route_layer(middleware::from_fn_with_state(state.clone(), ops_guard)),
        )
        .route(
            "/docs/{*file}",
            get(swagger::file_handler)
                .route_layer(middleware::from_fn_with_state(state.clone(), ops_guard)),
        )
        .layer(RequestDecompressionLayer::new())
        .layer(middleware::from_fn(move |request, next| {
            body_clock::limit_body(body_time, request, next)
        }))
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

/// The routes that read on the shards. Each is a `DecisionRoute` behind the one prologue
/// (`prologue::route`): auth, draining, the in-flight count, body limits and JSON cannot differ
/// between them.
fn decision_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/systemone", prologue::route::<SystemOne>())
        .route("/v1/decisions", prologue::route::<Decisions>())
        .route("/v1/score", prologue::route::<Score>())
}
