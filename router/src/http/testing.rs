//! What the HTTP tests share: the app over no shards and no model, and one-line requests.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request};
use axum::response::Response;
use clap::Parser;
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::routes::app;
use super::state::{build_state, AppState};
use crate::config::Config;
use crate::shard::ShardSet;

/// The app over no shards and no model: enough for routes, metrics and drain.
pub(super) fn test_state() -> Arc<AppState> {
    state_with(&[])
}

pub(super) fn state_with(flags: &[&str]) -> Arc<AppState> {
    let mut args = vec![
        "decision-router",
        "--model-dir",
        "/srv/private-tree/secret-place",
    ];
    args.extend_from_slice(flags);
    let config = Config::parse_from(args);
    Arc::new(build_state(config, ShardSet::detached()).unwrap())
}

pub(super) async fn call(state: &Arc<AppState>, request: Request<Body>) -> Response {
    app(state.clone()).oneshot(request).await.unwrap()
}

pub(super) async fn text(response: Response) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(super) fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

pub(super) fn get_with_key(path: &str, key: &str) -> Request<Body> {
    Request::get(path)
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .body(Body::empty())
        .unwrap()
}
