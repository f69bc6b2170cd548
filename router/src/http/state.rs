//! What every handler shares: the flags, the decider (strategy, queue, limits, media), the shards, the
//! metrics recorder, and the drain's flag and in-flight count. Built once at startup.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

use super::connections::ConnectionStats;
use crate::config::Config;
use crate::decide::Decider;
use crate::error::DecisionError;
use crate::ir::{Modality, QuestionKind};
use crate::limits::Limits;

use crate::media::{Fetcher, MediaPolicy, PolicyError};
use crate::prompt::{self, RegistryError};
use crate::question_kind::Kind;
use crate::queue::{self, BatchBudget, BudgetError, BudgetSource, Queue, QueueConfig};
use crate::shard::{ShardConnectError, ShardSet};

pub struct AppState {
    pub config: Config,
    pub model_name: String,
    pub decider: Decider,
    pub shards: ShardSet,
    /// The tokens the queue packs into one shard call, and where that number came from.
    pub batch_budget: BatchBudget,
    pub metrics: Option<PrometheusHandle>,
    /// Set when a shutdown signal arrives: `/ready` answers 503 and new decision requests are
    /// refused with 503 + Retry-After while the ones already accepted finish.
    pub draining: AtomicBool,
    /// Decision requests being answered: a drain waits for it to reach zero.
    pub in_flight: InFlight,
    /// Set by a drain at `Config::drain_cut`: every request still in flight is answered 503 +
    /// Retry-After at once (its reads dropped), so none is cut off without a status line.
    pub cut: tokio::sync::watch::Sender<bool>,
    pub connections: Arc<ConnectionStats>,
}

/// A count of decision requests in flight, with a wake-up for whoever waits for it to empty.
#[derive(Default)]
pub struct InFlight {
    count: AtomicUsize,
    emptied: tokio::sync::Notify,
}

/// Held by a decision request from its first byte of handling to its answer.
pub struct InFlightGuard<'a>(&'a InFlight);

impl InFlight {
    pub fn enter(&self) -> InFlightGuard<'_> {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self)
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Resolves once no decision request is in flight.
    pub async fn emptied(&self) {
        loop {
            let notified = self.emptied.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.emptied.notify_waiters();
        }
    }
}

fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE.get_or_init(crate::series::install).clone()
}

/// The media kinds the shard's model folder can process, as its Info reports them.
fn shard_modalities(info: &decision_proto::v1::InfoResponse) -> Vec<Modality> {
    use decision_proto::v1::Modality as Pb;
    info.modalities()
        .filter_map(|m| match m {
            Pb::Image => Some(Modality::Image),
            Pb::Audio => Some(Modality::Audio),
            Pb::Video => Some(Modality::Video),
            Pb::Unspecified => None,
        })
        .collect()
}

/// Why the router cannot start serving: each names what failed and where.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Shards(#[from] ShardConnectError),
    #[error("the shards are not healthy: {0}")]
    Unhealthy(DecisionError),
    #[error(transparent)]
    MediaPolicy(#[from] PolicyError),
    #[error("cannot build the media HTTP client: {0}")]
    MediaClient(#[from] reqwest::Error),
    #[error(transparent)]
    BatchBudget(#[from] BudgetError),
    #[error("invalid listen address {address}: {source}")]
    Address {
        address: String,
        source: std::net::AddrParseError,
    },
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install the SIGINT/SIGTERM handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Calibrations(#[from] crate::calibration::BookError),
}

pub fn build_state(config: Config, shards: ShardSet) -> Result<AppState, StartupError> {
    let model_name = config.flags.served_model_name.clone().unwrap_or_else(|| {
        config
            .model_dir()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let max_positions = shards.info.max_position_embeddings as usize;
    let strategy: Result<Arc<dyn prompt::ReadStrategy>, Arc<RegistryError>> = prompt::strategy_for(
        &shards.info.architecture,
        &shards.info.read_kind,
        &config.model_dir(),
        &prompt::StrategyOptions {
            max_positions: max_positions.max(1),
            wording: config.flags.compat.wording(),
            modalities: shard_modalities(&shards.info),
        },
    )
    .map(Arc::from)
    .map_err(Arc::new);
    match &strategy {
        Ok(s) => {
            for kind in probe_kinds() {
                if let Some(reason) = s.refusal(&kind) {
                    tracing::warn!("{reason}");
                }
            }
        }
        Err(reason) => tracing::warn!("decision routes will answer 501: {reason}"),
    }
    let limits = Limits {
        max_input_tokens: config.flags.max_input_tokens,
        max_body_bytes: config.flags.max_body_bytes,
        ..Limits::default()
    };
    let media = MediaPolicy::from_config(&config)?;
    let fetcher = Fetcher::new(&media)?;
    if !media.allow_hosts.is_empty() {
        tracing::info!(hosts = %config.flags.media_allow_hosts.join(","), "media URLs are fetched from these hosts");
    }
    let batch_budget = BatchBudget::choose(
        config.flags.max_batch_prefill_tokens,
        shards.info.batch_token_budget,
    )?;
    if batch_budget.source == BudgetSource::Flag
        && batch_budget.tokens != shards.info.batch_token_budget as usize
    {
        // Batches the shard then cuts into several forwards, or forwards the router never fills.
        tracing::warn!(
            max_batch_prefill_tokens = batch_budget.tokens,
            shard_batch_token_budget = shards.info.batch_token_budget,
            shard_rule = %shards.info.batch_budget_rule,
            "the router packs its shard calls to another budget than the shard's forward passes; give both the same --max-batch-prefill-tokens (the launcher does)"
        );
    }
    tracing::info!(
        max_batch_prefill_tokens = batch_budget.tokens,
        source = batch_budget.source.name(),
        shard_rule = %shards.info.batch_budget_rule,
        "batch budget"
    );
    let max_batches_at_shard = queue::batches_at_shard(
        config.flags.max_batches_at_shard,
        shards.world_size(),
        &shards.info.device,
    )?;
    let queue = Queue::start(
        shards.clone(),
        QueueConfig {
            max_batch_prefill_tokens: batch_budget.tokens,
            max_batch_wait: Duration::from_millis(config.flags.max_batch_wait_ms),
            max_queued_reads: config.flags.max_queued_reads,
            max_batches_at_shard,
        },
    );
    let provenance = strategy.as_ref().ok().map(|s| {
        crate::calibration::Provenance::of_server(
            &model_name,
            &shards.info.architecture,
            shards.info.vocab_size,
            &config.model_dir(),
            s.prompt_format(),
        )
    });
    let calibrations =
        crate::calibration::Book::open(config.flags.data_dir.as_deref(), provenance)?;
    match calibrations.location() {
        Some(path) => {
            tracing::info!(path = %path.display(), fits = calibrations.list().len(), "calibrations")
        }
        None => {
            tracing::info!("calibrations are kept in memory (no --data-dir): a restart loses them")
        }
    }
    Ok(AppState {
        model_name,
        decider: Decider {
            strategy,
            queue,
            limits,
            media,
            fetcher,
            request_timeout: config.flags.request_timeout(),
            shards: shards.clone(),
            debias: config.flags.debias,
            max_orders: config.flags.debias_max_orders as usize,
            priors: crate::label_prior::PriorBook::new(crate::label_prior::DEFAULT_MIN_SAMPLES),
            calibrations: Arc::new(calibrations),
        },
        shards,
        batch_budget,
        metrics: metrics_handle(),
        draining: AtomicBool::new(false),
        in_flight: InFlight::default(),
        cut: tokio::sync::watch::channel(false).0,
        connections: Arc::new(ConnectionStats::default()),
        config,
    })
}

/// One question of each kind: what a strategy is asked about at startup and in `/info`'s `refusals`.
pub(super) fn probe_kinds() -> Vec<QuestionKind> {
    Kind::ALL.into_iter().map(QuestionKind::probe).collect()
}
