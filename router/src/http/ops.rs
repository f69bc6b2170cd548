//! The operator routes: `/health` (liveness: the shards' real Health RPC; readiness is `/ready`,
//! `readiness.rs`), `/info` (what is
//! served and under which limits), `/metrics`, `/v1/models`, and the OpenAPI document (browsed at
//! `/docs`: `swagger.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::auth::authorize;
use super::connections::connection_limits;
use super::responses::error_response;
use super::state::{probe_kinds, AppState};
use crate::api;
use crate::error::DecisionError;
use crate::profile::Shape;

pub(super) async fn models_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return error_response(&state, Shape::SystemOne, e);
    }
    let name = &state.model_name;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Json(json!({
        "models": [{
            "name": name,
            "description": format!("{name} ({}) served as a decision model by decision-inference", state.shards.info.architecture),
            "release_date": chrono::Local::now().format("%Y-%m-%d").to_string(),
        }],
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": "decision-inference"}],
    }))
    .into_response()
}

/// Liveness: 200 while every shard answers its Health RPC, draining or not (`"status": "draining"`
/// then): an orchestrator must not restart a replica that is finishing its accepted requests. Whether
/// to send it work is `/ready`'s (`readiness.rs`).
pub(super) async fn health_handler(State(state): State<Arc<AppState>>) -> Response {
    match state
        .shards
        .health_within(crate::shard::HEALTH_ROUTE_TIMEOUT)
        .await
    {
        Ok(()) if state.draining.load(Ordering::SeqCst) => Json(json!({
            "status": "draining",
            "message": DecisionError::Draining.to_string(),
        }))
        .into_response(),
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "message": e.to_string()})),
        )
            .into_response(),
    }
}

pub(super) async fn info_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Response {
    // Only a caller that presented the key learns where the model lives on disk.
    let keyed = state.config.flags.api_key.is_some() && authorize(&state, &headers).is_ok();
    if !keyed && !state.config.flags.public_ops {
        if let Err(e) = authorize(&state, &headers) {
            return error_response(&state, Shape::SystemOne, e);
        }
    }
    let info = &state.shards.info;
    let limits = &state.decider.limits;
    let refusals: Vec<String> = match &state.decider.strategy {
        Ok(s) => probe_kinds().iter().filter_map(|k| s.refusal(k)).collect(),
        Err(reason) => vec![reason.to_string()],
    };
    let mut body = json!({
        "model_id": state.model_name,
        "architecture": info.architecture,
        "dtype": info.dtype,
        "device": info.device,
        "shards": state.shards.world_size(),
        // `read_mode` is the engine's older name, kept for clients that read it.
        "read_mode": info.engine,
        "engine": info.engine,
        "implementation": info.implementation,
        "matmul": info.matmul,
        "compiled_chains": info.compiled_chains,
        "compiled_layers": info.compiled_layers,
        "segment_attention": info.segment_attention,
        "cuda_graph_buckets": info.cuda_graph_buckets,
        "read_strategy": state.decider.strategy.as_ref().map(|s| s.name()).unwrap_or("none"),
        "modalities": state.decider.strategy.as_ref().map(|s| s.modalities().iter().map(|m| m.field()).collect::<Vec<_>>()).unwrap_or_default(),
        "prompt_format": state.decider.prompt_format().map(|f| json!({"name": f.name, "version": f.version})),
        "refusals": refusals,
        // Where fits live (no path: /info shows none) and what a fit must have been fitted on to
        // apply here (`calibration/`).
        "calibrations": {
            "store": if state.decider.calibrations.location().is_some() { "data_dir" } else { "memory" },
            "fits": state.decider.calibrations.list().len(),
            "model_fingerprint": state.decider.calibrations.server.as_ref().map(|s| s.model_fingerprint.clone()),
        },
        "max_position_embeddings": info.max_position_embeddings,
        "prefix_cache": {
            "enabled": info.prefix_cache_bytes > 0,
            "budget_bytes": info.prefix_cache_bytes,
            "rule": info.prefix_cache_rule,
        },
        // The router's tokens per shard call and where they came from, beside the shard's budget for
        // one forward pass and its rule (equal unless the two were started with different values).
        "batch_budget": {
            "max_batch_prefill_tokens": state.batch_budget.tokens,
            "source": state.batch_budget.source.name(),
            "batch_token_budget": info.batch_token_budget,
            "batch_budget_rule": info.batch_budget_rule,
        },
        "limits": {
            "max_questions": limits.max_questions,
            "max_choices": limits.max_choices,
            "max_levels": limits.max_levels,
            "max_input_tokens": limits.max_input_tokens,
            "max_body_bytes": limits.max_body_bytes,
            "max_batch_prefill_tokens": state.batch_budget.tokens,
            "max_batch_wait_ms": state.config.flags.max_batch_wait_ms,
            "max_batches_at_shard": state.decider.queue.max_batches_at_shard(),
            "max_queued_reads": state.config.flags.max_queued_reads,
            "request_timeout_secs": state.config.flags.request_timeout_secs,
            "header_read_timeout_secs": state.config.flags.header_read_timeout_secs,
            "body_read_timeout_secs": state.config.flags.body_read_timeout_secs,
            "keep_alive_timeout_secs": state.config.flags.keep_alive_timeout_secs,
            "max_connections": connection_limits(&state.config).max_connections,
        },
        "compat": state.config.flags.compat.name(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    if keyed {
        body["model_dir"] = json!(state.config.model_dir());
    }
    Json(body).into_response()
}

/// The Prometheus text: the series of `series.rs`, the load gauges read at scrape time.
pub(super) async fn metrics_handler(State(state): State<Arc<AppState>>) -> Response {
    let Some(handle) = &state.metrics else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder unavailable",
        )
            .into_response();
    };
    let queue = &state.decider.queue;
    let load = queue.load();
    metrics::gauge!("decision_queued_reads").set(queue.queued_reads() as f64);
    metrics::gauge!("decision_queued_tokens").set(queue.queued_tokens() as f64);
    metrics::gauge!("decision_queue_high_water_reads")
        .set(state.config.flags.queue_high_water() as f64);
    metrics::gauge!("decision_read_rate_tokens_per_second").set(queue.read_rate());
    metrics::gauge!("decision_requests_queued").set(load.requests_queued() as f64);
    metrics::gauge!("decision_requests_running").set(load.requests_running() as f64);
    let info = &state.shards.info;
    let budget = info.prefix_cache_bytes;
    metrics::gauge!("decision_prefix_cache_usage_ratio").set(if budget > 0 {
        load.prefix_cache_used_bytes() as f64 / budget as f64
    } else {
        0.0
    });
    metrics::gauge!(
        "decision_cache_config_info",
        "enabled" => (budget > 0).to_string(),
        "budget_bytes" => budget.to_string(),
        "rule" => info.prefix_cache_rule.clone(),
        "engine" => info.engine.clone(),
    )
    .set(1.0);
    metrics::gauge!("decision_http_requests_in_flight").set(state.in_flight.count() as f64);
    let connections = &state.connections;
    metrics::gauge!("decision_http_connections_open")
        .set(connections.open.load(Ordering::Relaxed) as f64);
    metrics::counter!("decision_http_connections_closed_idle_total")
        .absolute(connections.closed_idle.load(Ordering::Relaxed));
    metrics::counter!("decision_http_connections_closed_slow_total")
        .absolute(connections.closed_slow.load(Ordering::Relaxed));
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}

/// The OpenAPI document, as `decision-router --print-openapi` prints it.
pub(super) async fn openapi_handler() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        api::schema::openapi_json(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::super::state::{build_state, StartupError};
    use super::super::testing::{
        call, get, post_json, state_reading_from, state_with, test_state, text, HeldShard,
        DECISION_BODIES,
    };
    use super::*;
    use crate::config::Config;
    use crate::queue::{BatchBudget, BudgetError, BudgetSource};
    use crate::shard::ShardSet;
    use clap::Parser;
    use serde_json::Value;

    /// Every family /metrics writes is a series of `series.rs`, with its `# HELP` and its kind; the
    /// histograms are real histograms (buckets, not quantiles); the picker's gauges are there.
    #[tokio::test]
    async fn every_series_has_help_and_its_declared_kind_and_histograms_have_buckets() {
        use crate::series::{Kind, SERIES};
        let shard = HeldShard::new();
        let state = state_reading_from(shard.clone());
        shard.released.add_permits(1);
        let (path, body) = DECISION_BODIES[1];
        assert_eq!(
            call(&state, post_json(path, body)).await.status(),
            StatusCode::OK
        );
        let page = text(call(&state, get("/metrics")).await).await;
        let mut typed = std::collections::BTreeMap::new();
        let mut helped = std::collections::BTreeSet::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                typed.insert(name.to_owned(), kind.to_owned());
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                helped.insert(rest.split_once(' ').unwrap().0.to_owned());
            } else if !line.is_empty() {
                let sample = line.split(['{', ' ']).next().unwrap();
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| {
                        sample
                            .strip_suffix(suffix)
                            .filter(|f| typed.get(*f).is_some_and(|k| k == "histogram"))
                    })
                    .unwrap_or(sample);
                assert!(typed.contains_key(family), "{line}: no # TYPE before it");
                assert!(!line.contains("quantile="), "{line}: a summary");
            }
        }
        for (name, kind) in &typed {
            assert!(helped.contains(name), "{name} has no # HELP");
            let series = SERIES
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("{name} is not in series.rs"));
            assert_eq!(kind, series.kind.type_name(), "{name}");
        }
        for name in [
            "decision_requests_queued",
            "decision_requests_running",
            "decision_prefix_cache_usage_ratio",
            "decision_cache_config_info",
            "decision_queue_high_water_reads",
            "decision_http_connections_closed_idle_total",
            "decision_http_request_duration_seconds",
            "decision_queue_wait_seconds",
            "decision_batch_duration_seconds",
            "decision_shard_forward_seconds",
            "decision_shard_idle_seconds",
        ] {
            assert!(typed.contains_key(name), "{name} missing from\n{page}");
        }
        for series in SERIES {
            if let (Kind::Histogram(buckets), true) = (series.kind, typed.contains_key(series.name))
            {
                let prefix = format!("{}_bucket{{", series.name);
                let lines: Vec<&str> = page.lines().filter(|l| l.starts_with(&prefix)).collect();
                assert!(
                    lines.len() > buckets.len() && lines.iter().any(|l| l.contains("le=\"+Inf\"")),
                    "{}: {} buckets declared, written {lines:?}",
                    series.name,
                    buckets.len()
                );
            }
        }
        let info = page
            .lines()
            .find(|l| l.starts_with("decision_cache_config_info{"))
            .unwrap();
        assert!(
            info.contains("enabled=\"")
                && info.contains("budget_bytes=\"")
                && info.ends_with("} 1"),
            "{info}"
        );
    }

    /// The gauges an endpoint picker reads: a request whose reads are at the shard is running, one
    /// that waits behind it is queued, and both return to 0 once answered.
    #[tokio::test]
    async fn requests_queued_and_running_follow_the_queue() {
        use tower::ServiceExt as _;
        let shard = HeldShard::new();
        let state = state_reading_from(shard.clone());
        let load = || {
            let load = state.decider.queue.load();
            (load.requests_queued(), load.requests_running())
        };
        let (path, body) = DECISION_BODIES[1];
        let first =
            tokio::spawn(super::super::routes::app(state.clone()).oneshot(post_json(path, body)));
        shard.arrived.notified().await;
        assert_eq!(load(), (0, 1));
        let second =
            tokio::spawn(super::super::routes::app(state.clone()).oneshot(post_json(path, body)));
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while load() != (1, 1) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the second request waits behind the first");
        shard.released.add_permits(2);
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
        assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::OK);
        assert_eq!(load(), (0, 0));
    }

    #[tokio::test]
    async fn without_an_api_key_info_shows_no_filesystem_path() {
        let state = test_state();
        let info = text(call(&state, get("/info")).await).await;
        assert!(
            !info.contains("private-tree") && !info.contains("model_dir"),
            "{info}"
        );
        let info: Value = serde_json::from_str(&info).unwrap();
        assert_eq!(info["limits"]["request_timeout_secs"], 120);
        assert_eq!(info["limits"]["header_read_timeout_secs"], 10);
        assert_eq!(info["limits"]["keep_alive_timeout_secs"], 20);
    }

    /// Without --max-batch-prefill-tokens the router packs its calls to the shard's budget; with it,
    /// to the flag's. /info shows the one in use, where it came from, and the shard's with its rule.
    #[tokio::test]
    async fn info_shows_the_batch_budget_in_use_and_where_it_came_from() {
        let info = |state: Arc<AppState>| async move {
            serde_json::from_str::<Value>(&text(call(&state, get("/info")).await).await).unwrap()
        };
        let auto = test_state();
        assert_eq!(
            auto.batch_budget,
            BatchBudget {
                tokens: 4096,
                source: BudgetSource::Shard
            }
        );
        let shown = info(auto).await;
        assert_eq!(
            shown["batch_budget"],
            json!({
                "max_batch_prefill_tokens": 4096,
                "source": "shard",
                "batch_token_budget": 4096,
                "batch_budget_rule": "detached: no shards",
            })
        );
        assert_eq!(shown["limits"]["max_batch_prefill_tokens"], 4096);

        let given = state_with(&["--max-batch-prefill-tokens", "2048"]);
        assert_eq!(given.batch_budget.tokens, 2048);
        let shown = info(given).await;
        assert_eq!(
            shown["batch_budget"]["source"],
            "--max-batch-prefill-tokens"
        );
        assert_eq!(shown["batch_budget"]["max_batch_prefill_tokens"], 2048);
        assert_eq!(shown["batch_budget"]["batch_token_budget"], 4096);
        assert_eq!(shown["limits"]["max_batch_prefill_tokens"], 2048);

        // A shard that reports no budget leaves the router nothing to follow but the flag.
        let mut silent = ShardSet::detached();
        silent.info.batch_token_budget = 0;
        let config = Config::parse_from(["decision-router", "--model-dir", "/m"]);
        let error = build_state(config, silent.clone())
            .err()
            .expect("no budget");
        assert!(
            matches!(error, StartupError::BatchBudget(BudgetError::NoneReported)),
            "{error}"
        );
        assert!(error.to_string().contains("--max-batch-prefill-tokens"));
        let config = Config::parse_from([
            "decision-router",
            "--model-dir",
            "/m",
            "--max-batch-prefill-tokens",
            "1024",
        ]);
        assert_eq!(
            build_state(config, silent).unwrap().batch_budget.tokens,
            1024
        );
        assert!(Config::try_parse_from([
            "decision-router",
            "--model-dir",
            "/m",
            "--max-batch-prefill-tokens",
            "0"
        ])
        .is_err());
    }
}
