//! `GET /ready`: whether this replica should be sent new decision requests (a Kubernetes readiness probe,
//! a load balancer's health check, an endpoint picker). `/health` (`ops.rs`) is liveness: the process and
//! its shards answer, draining or not, so an orchestrator never restarts a replica for being busy or
//! for finishing its work before it stops.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::state::AppState;
use crate::error::DecisionError;

/// Why a replica is not ready. Each names what an operator would look at.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum NotReady {
    /// A shutdown signal arrived: the requests accepted before it finish, new ones go elsewhere.
    #[error("{}", DecisionError::Draining)]
    Draining,
    /// The model's labels failed the startup check (or no read strategy serves it): every decision
    /// route answers 501, so sending it traffic only produces refusals.
    #[error("the decision routes answer 501: {0}")]
    NotServable(String),
    /// More reads wait than the high-water mark: new work would wait behind them, or soon be refused.
    #[error("{queued} reads are queued, over the high-water mark of {high_water} (--queue-high-water-percent of --max-queued-reads)")]
    QueueHigh { queued: usize, high_water: usize },
    /// A shard did not answer its Health RPC (it is still loading, restarting, or stuck).
    #[error("{0}")]
    Shards(String),
}

impl NotReady {
    /// The reason's name in the answer, for scripts and dashboards.
    fn name(&self) -> &'static str {
        match self {
            NotReady::Draining => "draining",
            NotReady::NotServable(_) => "not_servable",
            NotReady::QueueHigh { .. } => "queue_high",
            NotReady::Shards(_) => "shards",
        }
    }
}

/// Every reason this replica is not ready now; empty when it is. The shards' Health RPC is asked only
/// when nothing cheaper already says no.
pub(super) async fn not_ready(state: &AppState) -> Vec<NotReady> {
    let mut reasons = Vec::new();
    if state.draining.load(Ordering::SeqCst) {
        reasons.push(NotReady::Draining);
    }
    if let Err(reason) = &state.decider.strategy {
        reasons.push(NotReady::NotServable(reason.to_string()));
    }
    let queued = state.decider.queue.queued_reads();
    let high_water = state.config.flags.queue_high_water();
    if queued > high_water {
        reasons.push(NotReady::QueueHigh { queued, high_water });
    }
    if reasons.is_empty() {
        if let Err(e) = state
            .shards
            .health_within(crate::shard::HEALTH_ROUTE_TIMEOUT)
            .await
        {
            reasons.push(NotReady::Shards(e.to_string()));
        }
    }
    reasons
}

/// 200 `{"status": "ready", …}`, or 503 + Retry-After with every reason.
pub(super) async fn ready_handler(State(state): State<Arc<AppState>>) -> Response {
    let reasons = not_ready(&state).await;
    let queued_reads = state.decider.queue.queued_reads();
    let high_water = state.config.flags.queue_high_water();
    if reasons.is_empty() {
        return Json(json!({
            "status": "ready",
            "queued_reads": queued_reads,
            "queue_high_water": high_water,
        }))
        .into_response();
    }
    let listed: Vec<_> = reasons
        .iter()
        .map(|r| json!({"reason": r.name(), "message": r.to_string()}))
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, HeaderValue::from(1))],
        Json(json!({
            "status": "not_ready",
            "reasons": listed,
            "queued_reads": queued_reads,
            "queue_high_water": high_water,
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::http::StatusCode;
    use serde_json::Value;
    use tower::ServiceExt as _;

    use super::super::routes::app;
    use super::super::testing::{
        call, get, post_json, state_reading_from, state_reading_from_with, state_with, test_state,
        text, HeldShard,
    };
    use super::*;

    async fn ready(state: &Arc<AppState>) -> (StatusCode, Value) {
        let response = call(state, get("/ready")).await;
        let status = response.status();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        }
        (status, serde_json::from_str(&text(response).await).unwrap())
    }

    fn reasons(body: &Value) -> Vec<&str> {
        body["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["reason"].as_str().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn a_replica_with_a_served_model_and_an_idle_queue_is_ready() {
        let state = state_reading_from(HeldShard::new());
        let (status, body) = ready(&state).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "ready");
        assert_eq!(body["queued_reads"], 0);
        // 80 % of the default 4096.
        assert_eq!(body["queue_high_water"], 3276);
    }

    /// Draining: /ready says no (the balancer stops sending), /health stays 200 (the orchestrator does
    /// not kill the replica while it finishes its accepted requests).
    #[tokio::test]
    async fn a_draining_replica_is_live_but_not_ready() {
        let state = state_reading_from(HeldShard::new());
        state.draining.store(true, Ordering::SeqCst);
        let (status, body) = ready(&state).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reasons(&body), ["draining"]);
        assert!(body["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"));
        let health = call(&state, get("/health")).await;
        assert_eq!(health.status(), StatusCode::OK);
        let health: Value = serde_json::from_str(&text(health).await).unwrap();
        assert_eq!(health["status"], "draining");
    }

    /// A model whose labels failed the startup check answers 501 on every decision route: not ready,
    /// saying why, and still live (restarting it would not help).
    #[tokio::test]
    async fn a_model_the_routes_cannot_serve_is_not_ready_and_says_why() {
        let state = test_state();
        assert!(state.decider.strategy.is_err());
        let (status, body) = ready(&state).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reasons(&body), ["not_servable"]);
        assert!(
            body["reasons"][0]["message"]
                .as_str()
                .unwrap()
                .starts_with("the decision routes answer 501: "),
            "{body}"
        );
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
    }

    /// Over the high-water mark /ready turns 503 naming both numbers, before the queue is full; it is
    /// ready again once the reads are answered.
    #[tokio::test]
    async fn a_queue_over_its_high_water_mark_is_not_ready_until_it_drains() {
        let shard = HeldShard::new();
        // 50 % of 4 reads: ready with 2 queued, not with 3.
        let state = state_reading_from_with(
            shard.clone(),
            &[
                "--max-queued-reads",
                "4",
                "--queue-high-water-percent",
                "50",
            ],
        );
        let body = r#"{"state": "s", "questions": {"a": {"type": "noul", "instructions": "?"}, "b": {"type": "noul", "instructions": "?"}, "c": {"type": "noul", "instructions": "?"}}}"#;
        let answer = tokio::spawn(app(state.clone()).oneshot(post_json("/v1/systemone", body)));
        tokio::time::timeout(Duration::from_secs(5), shard.arrived.notified())
            .await
            .expect("the reads reached the shard");
        assert_eq!(state.decider.queue.queued_reads(), 3);
        let (status, shown) = ready(&state).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{shown}");
        assert_eq!(reasons(&shown), ["queue_high"]);
        assert_eq!(
            shown["reasons"][0]["message"],
            "3 reads are queued, over the high-water mark of 2 (--queue-high-water-percent of --max-queued-reads)"
        );
        assert_eq!(
            (
                shown["queued_reads"].as_u64(),
                shown["queue_high_water"].as_u64()
            ),
            (Some(3), Some(2))
        );
        shard.released.add_permits(1);
        assert_eq!(answer.await.unwrap().unwrap().status(), StatusCode::OK);
        assert_eq!(ready(&state).await.0, StatusCode::OK);
    }

    /// Reasons add up: a draining replica whose model cannot be served names both.
    #[tokio::test]
    async fn every_reason_is_listed() {
        let state = state_with(&["--max-queued-reads", "1"]);
        state.draining.store(true, Ordering::SeqCst);
        let (_, body) = ready(&state).await;
        assert_eq!(reasons(&body), ["draining", "not_servable"]);
    }

    #[test]
    fn the_high_water_mark_is_a_percentage_of_the_queue_limit_and_at_least_one() {
        use crate::config::Config;
        use clap::Parser;
        let mark = |flags: &[&str]| {
            let mut args = vec!["decision-router", "--model-dir", "/m"];
            args.extend_from_slice(flags);
            Config::parse_from(args).flags.queue_high_water()
        };
        assert_eq!(mark(&[]), 3276);
        assert_eq!(
            mark(&[
                "--max-queued-reads",
                "10",
                "--queue-high-water-percent",
                "100"
            ]),
            10
        );
        assert_eq!(
            mark(&[
                "--max-queued-reads",
                "1",
                "--queue-high-water-percent",
                "50"
            ]),
            1
        );
        for bad in ["0", "101", "-5"] {
            let error = Config::try_parse_from([
                "decision-router",
                "--model-dir",
                "/m",
                &format!("--queue-high-water-percent={bad}"),
            ])
            .unwrap_err()
            .to_string();
            assert!(
                error.contains("--queue-high-water-percent"),
                "{bad}: {error}"
            );
        }
    }
}
