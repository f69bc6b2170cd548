//! The router's life: connect to the shards, listen, serve, and on SIGTERM/SIGINT drain (refuse new
//! work, wait for the accepted requests) before the accept loop closes the connections.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::connections;
use super::routes::app;
use super::state::{build_state, AppState, StartupError};
use crate::config::Config;
use crate::shard::ShardSet;

/// Connects to the shards, checks the model's labels, and serves until SIGINT/SIGTERM.
pub async fn run(config: Config) -> Result<(), StartupError> {
    let shards = ShardSet::connect(&config.shard_uds_path).await?;
    shards.health().await.map_err(StartupError::Unhealthy)?;
    let info = shards.info.clone();
    tracing::info!(architecture = %info.architecture, dtype = %info.dtype, world_size = info.world_size, engine = %info.engine, implementation = %info.implementation, "connected to shards");
    let state = build_state(config, shards)?;
    let address = format!(
        "{}:{}",
        state.config.flags.hostname, state.config.flags.port
    );
    let addr: SocketAddr = address
        .parse()
        .map_err(|source| StartupError::Address { address, source })?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartupError::Listen {
            address: addr,
            source,
        })?;
    let limits = connections::connection_limits(&state.config);
    tracing::info!(%addr, model = %state.model_name, max_connections = limits.max_connections, "router ready");
    let state = Arc::new(state);
    let mut signals = Signals::install()?;
    let drain = {
        let state = state.clone();
        async move {
            let signal = signals.recv().await;
            drain(&state, signal, signals.recv()).await;
        }
    };
    let stats = state.connections.clone();
    connections::serve(listener, app(state), limits, stats, drain).await;
    tracing::info!("stopped");
    Ok(())
}

/// A graceful drain: `/ready` turns 503 at once (`/health`, liveness, stays 200) and new decision
/// requests get 503 + Retry-After
/// (the listener keeps accepting, so clients and load balancers hear it rather than a refused
/// connection) until every request accepted before the signal has been answered. Requests still in
/// flight at `Config::drain_cut` (the grace less 3 s) are answered 503 + Retry-After then, their reads
/// dropped: the launcher SIGKILLs at the grace, and a request cut by that hears no status line at all.
/// A second signal ends the wait.
pub(super) async fn drain(
    state: &AppState,
    signal: &'static str,
    again: impl Future<Output = &'static str>,
) {
    state.draining.store(true, Ordering::SeqCst);
    let cut = state.config.flags.drain_cut();
    tracing::info!(
        in_flight = state.in_flight.count(),
        cut_secs = cut.as_secs_f64(),
        "received {signal}: draining (new requests get 503)"
    );
    tokio::pin!(again);
    tokio::select! {
        () = state.in_flight.emptied() => {
            tracing::info!("every accepted request was answered");
            return;
        }
        () = tokio::time::sleep(cut) => {}
        signal = &mut again => {
            tracing::warn!("received {signal} again: stopping without waiting");
            return;
        }
    }
    tracing::warn!(
        in_flight = state.in_flight.count(),
        "the drain reached its cut ({} s of the {} s grace): answering the requests still in flight 503",
        cut.as_secs_f64(),
        state.config.flags.shutdown_grace_secs
    );
    state.cut.send_replace(true);
    tokio::select! {
        () = state.in_flight.emptied() => tracing::info!("every accepted request was answered"),
        signal = again => tracing::warn!("received {signal} again: stopping without waiting"),
    }
}

/// SIGINT and SIGTERM, installed once so that a second one is heard too.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self, StartupError> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).map_err(StartupError::Signals)?,
            terminate: signal(SignalKind::terminate()).map_err(StartupError::Signals)?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{header, StatusCode};
    use tower::ServiceExt as _;

    use super::super::testing::{
        call, get, post_json, state_reading_from_with, test_state, text, HeldShard, DECISION_BODIES,
    };
    use std::time::Duration;

    use super::*;

    /// At the cut (the grace less 3 s) a request whose reads are still at the shard is answered 503
    /// + Retry-After on every decision route, and the drain ends with it, well before the grace.
    #[tokio::test(start_paused = true)]
    async fn requests_still_in_flight_at_the_cut_are_answered_503_before_the_grace_ends() {
        for (grace, cut) in [(10, 7_000), (4, 2_000)] {
            for (path, body) in DECISION_BODIES {
                let shard = HeldShard::new();
                let grace = grace.to_string();
                let state =
                    state_reading_from_with(shard.clone(), &["--shutdown-grace-secs", &grace]);
                let answer = tokio::spawn(app(state.clone()).oneshot(post_json(path, body)));
                shard.arrived.notified().await;
                let started = tokio::time::Instant::now();
                drain(&state, "SIGTERM", std::future::pending()).await;
                assert_eq!(started.elapsed(), Duration::from_millis(cut), "{path}");
                let response = answer.await.unwrap().unwrap();
                assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
                assert_eq!(response.headers()[header::RETRY_AFTER], "1", "{path}");
                assert!(text(response).await.contains("shutting down"), "{path}");
                assert_eq!(state.in_flight.count(), 0);
            }
        }
    }

    /// The drain waits for requests already in flight, and a second signal cuts it short.
    #[tokio::test]
    async fn a_drain_refuses_new_work_and_ends_when_the_accepted_requests_are_answered() {
        let state = test_state();
        let first = state.in_flight.enter();
        let second = state.in_flight.enter();
        let draining = {
            let state = state.clone();
            tokio::spawn(async move { drain(&state, "SIGTERM", std::future::pending()).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(state.draining.load(Ordering::SeqCst));
        assert_eq!(
            call(&state, get("/ready")).await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        drop(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!draining.is_finished(), "one request is still in flight");
        drop(second);
        tokio::time::timeout(Duration::from_secs(1), draining)
            .await
            .expect("the drain ends with the last request")
            .unwrap();

        let state = test_state();
        let _stuck = state.in_flight.enter();
        tokio::time::timeout(
            Duration::from_secs(1),
            drain(&state, "SIGTERM", async { "SIGINT" }),
        )
        .await
        .expect("a second signal ends the wait");
    }
}
