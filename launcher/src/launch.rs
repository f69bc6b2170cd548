//! The launch sequence: resolve the model, start the shards and wait for real health, start the
//! router, then supervise until a child dies or a signal asks us to stop; always clean up after.

use std::path::PathBuf;

use decision_proto::rank_socket;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::allocator::{self, TcmallocMissing};
use crate::binaries::{self, MissingBinary, ROUTER_BINARY, SHARD_BINARY};
use crate::child::{ChildExit, Children, SpawnError};
use crate::config::{Config, ConfigError};
use crate::download::{self, DownloadError};
use crate::export::{self, ExportError};
use crate::mkl_dispatch::{self, LibraryMissing};
use crate::model::{self, ModelError, Resolution};
use crate::router;
use crate::shard::{self, remove_socket, Rendezvous, ShardError};

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    MissingBinary(#[from] MissingBinary),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error(transparent)]
    Download(#[from] DownloadError),
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Allocator(#[from] TcmallocMissing),
    #[error(transparent)]
    MklDispatch(#[from] LibraryMissing),
    #[error("{0}")]
    ChildDied(ChildExit),
    #[error("cannot install the SIGINT/SIGTERM/SIGHUP handlers: {0}")]
    Signals(std::io::Error),
}

/// How a launch that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// SIGINT, SIGTERM or SIGHUP asked us to stop.
    BySignal(&'static str),
}

/// SIGINT, SIGTERM and SIGHUP (the terminal went away), installed before anything starts so that
/// none arriving during startup is lost.
pub struct ShutdownSignals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl ShutdownSignals {
    pub fn install() -> std::io::Result<Self> {
        Ok(ShutdownSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

/// Runs the whole deployment until it stops; children are terminated and sockets removed on every
/// path. A failure is logged here, before the shutdown it causes, so the cause comes first in the log.
pub async fn run(config: &Config) -> Result<Stopped, LaunchError> {
    let mut signals = match ShutdownSignals::install() {
        Ok(signals) => signals,
        Err(err) => {
            let err = LaunchError::Signals(err);
            tracing::error!("{err}");
            return Err(err);
        }
    };
    let mut children = Children::new();
    let mut sockets = Vec::new();
    let outcome = start_and_supervise(config, &mut children, &mut signals, &mut sockets).await;
    if let Err(err) = &outcome {
        tracing::error!("{err}");
    }
    let hurry = async {
        signals.recv().await;
    };
    children.terminate_all(config.shutdown_grace(), hurry).await;
    for socket in &sockets {
        remove_socket(socket);
    }
    if outcome.is_ok() {
        tracing::info!("all children stopped");
    }
    outcome
}

async fn start_and_supervise(
    config: &Config,
    children: &mut Children,
    signals: &mut ShutdownSignals,
    sockets: &mut Vec<PathBuf>,
) -> Result<Stopped, LaunchError> {
    tracing::info!(?config, "starting");
    // Both are looked up first: a missing router should not surface after a ten-minute model load.
    let server_bin = binaries::locate(SHARD_BINARY, "install the Python package (`make install`)")?;
    let router_bin = binaries::locate(ROUTER_BINARY, "build it with `make rust`")?;

    let cache_dir = config.cache_dir()?;
    let hub_cache = model::hub_cache_dir(|name| std::env::var_os(name));
    let resolve = || {
        model::resolve(
            config.model_id.as_deref(),
            config.revision.as_deref(),
            &cache_dir,
            hub_cache.as_deref(),
        )
    };
    let model = match resolve()? {
        Resolution::Ready(model) => model,
        Resolution::NeedsExport(model) => {
            tokio::select! {
                result = export::run(children, &server_bin, &model.dir) => result?,
                signal = signals.recv() => return Ok(stopping(signal)),
            }
            model
        }
        Resolution::NeedsDownload(hub) => {
            let offline = model::hub_offline(|name| std::env::var_os(name));
            tokio::select! {
                result = download::run(children, &server_bin, &hub, offline) => result?,
                signal = signals.recv() => return Ok(stopping(signal)),
            }
            match resolve()? {
                Resolution::Ready(model) => model,
                _ => {
                    return Err(DownloadError::NotInCache {
                        model: hub.display(),
                        cache_repo: hub.cache_repo,
                    }
                    .into())
                }
            }
        }
    };
    let served_model_name = config
        .router
        .served_model_name
        .clone()
        .unwrap_or_else(|| model.served_name.clone());
    tracing::info!(model_dir = %model.dir.display(), served_model_name, "model resolved");

    // Every rank starts before any is awaited: tensor-parallel ranks only become healthy together.
    // Each is its own named child ("shard R"), so the one that dies is the one reported.
    let rendezvous = Rendezvous::resolve(config)?;
    if let Some(rendezvous) = &rendezvous {
        tracing::info!(
            num_shard = config.num_shard,
            master = %format!("{}:{}", rendezvous.addr, rendezvous.port),
            "starting {} tensor-parallel shards",
            config.num_shard
        );
    }
    let shard_allocator = allocator::resolve(config.allocator, allocator::SEARCH_DIRS, |name| {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    })?;
    tracing::info!(allocator = %shard_allocator.description, "shard memory allocator");
    let mkl = mkl_dispatch::resolve(
        config.mkl_dispatch,
        &mkl_dispatch::Cpu::read(),
        &binaries::own_dir(),
    )?;
    tracing::info!(mkl = %mkl.description, "shard MKL kernels");
    let mut shard_env = shard_allocator.env.clone();
    mkl.apply(&mut shard_env, std::env::var("LD_PRELOAD").ok());
    let mut starting = Vec::new();
    for rank in 0..config.num_shard {
        let socket = rank_socket(&config.uds_path, rank);
        shard::prepare_socket(&socket)?;
        sockets.push(socket.clone());
        let spec = shard::spec(
            &server_bin,
            config,
            &model,
            rank,
            &socket,
            rendezvous.as_ref(),
            &shard_env,
        );
        let exited = children.spawn(spec)?.exited();
        starting.push((rank, socket, exited));
    }
    for (rank, socket, exited) in starting {
        tokio::select! {
            // Biased: when the awaited shard dies, its own report (naming the startup) wins.
            biased;
            ready = shard::wait_ready(exited, rank, &socket, config.shard_startup_timeout()) => ready?,
            // Another rank dying while this one loads ends the startup just the same.
            exit = children.next_exit() => return Err(LaunchError::ChildDied(exit)),
            signal = signals.recv() => return Ok(stopping(signal)),
        }
    }

    children.spawn(router::spec(
        &router_bin,
        config,
        &model.dir,
        &served_model_name,
    ))?;
    // The router logs its own "router ready" once it has met the shards and bound the port.
    tracing::info!(
        "shards ready; router starting to serve {served_model_name} on http://{}:{}",
        config.router.hostname,
        config.router.port
    );

    tokio::select! {
        exit = children.next_exit() => Err(LaunchError::ChildDied(exit)),
        signal = signals.recv() => Ok(stopping(signal)),
    }
}

fn stopping(signal: &'static str) -> Stopped {
    tracing::info!("received {signal}: shutting down");
    Stopped::BySignal(signal)
}
