//! The read queue: an actor that owns pending reads, packs reads of concurrent requests into one
//! shard call under a token budget, and drops reads nobody waits for.
//!
//! A batch waits for company only while other requests are on their way (parsed, still being
//! rendered and tokenized), and never longer than the wait window: a lone request goes to the shard
//! at once. Requests that arrive while the shard is busy form the next batch, which is sent the
//! moment the shard answers, so the shard never waits for the router to gather one; a batch that
//! fills its budget first is sent at once, to wait at the shard behind the one it reads
//! (`QueueConfig::max_batches_at_shard`), so under load the shard starts it without waiting for
//! the router at all.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use decision_proto::v1 as pb;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::error::DecisionError;
use crate::limits::Budget;
use crate::read::PreparedRead;
pub use crate::read::ReadOutcome;
use crate::shard::ShardSet;

#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Unique prompt tokens per shard call (a larger single request still goes alone).
    pub max_batch_prefill_tokens: usize,
    /// How long the first read of a batch may wait for requests that are on their way.
    pub max_batch_wait: Duration,
    /// Reads that may wait at once; beyond it requests are refused as overloaded.
    pub max_queued_reads: usize,
    /// Shard calls outstanding at once (at least 1). With 2, a full batch is sent while the shard
    /// still reads the one before it and waits there, so the shard goes from one batch to the next
    /// without a round trip to the router; a batch that is not full still waits for the shard to
    /// answer, since requests may yet join it.
    pub max_batches_at_shard: usize,
}

/// The unique prompt tokens the router packs into one shard call, and where that number came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchBudget {
    pub tokens: usize,
    pub source: BudgetSource,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetSource {
    /// `--max-batch-prefill-tokens`, which the launcher also gives the shards.
    Flag,
    /// The budget the shard chose for its device (Info's `batch_token_budget`).
    Shard,
}

impl BudgetSource {
    /// How `/info` names it.
    pub fn name(self) -> &'static str {
        match self {
            BudgetSource::Flag => "--max-batch-prefill-tokens",
            BudgetSource::Shard => "shard",
        }
    }
}

/// Why the batches cannot be sized or sent as configured.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BudgetError {
    #[error("the shard reports no batch token budget; give the router --max-batch-prefill-tokens")]
    NoneReported,
    #[error("--max-batches-at-shard {asked} needs a shard of one rank: the {world_size} ranks of a tensor-parallel group must run batches in one order, and calls in flight side by side could reach them in different orders")]
    UnorderedRanks { asked: u64, world_size: usize },
}

/// Shard calls the queue keeps outstanding at once (`QueueConfig::max_batches_at_shard`): the
/// operator's value when given, else 2 on an accelerator shard of one rank and 1 otherwise. A
/// tensor-parallel group takes one at a time (its ranks must run batches in one order); so does a
/// CPU shard, whose device is the host's own cores: a batch waiting there gains nothing to overlap,
/// and the router's work between batches then runs beside the forward instead of in its gap
/// (served A/B on 2 cores: 0.94-1.00x, bench/results/2026-12-07-pipeline).
pub fn batches_at_shard(
    flag: Option<u64>,
    world_size: usize,
    device: &str,
) -> Result<usize, BudgetError> {
    match flag {
        Some(asked) if asked > 1 && world_size > 1 => {
            Err(BudgetError::UnorderedRanks { asked, world_size })
        }
        Some(asked) => Ok(usize::try_from(asked).unwrap_or(usize::MAX)),
        None if world_size > 1 || device == "cpu" => Ok(1),
        None => Ok(2),
    }
}

impl BatchBudget {
    /// The operator's value when given, else the shard's (`shard_tokens`, from its Info). A shard
    /// that reports none (0: one built before the field existed) leaves nothing to follow.
    pub fn choose(flag: Option<u64>, shard_tokens: u32) -> Result<Self, BudgetError> {
        match (flag, shard_tokens) {
            (Some(tokens), _) => Ok(BatchBudget {
                tokens: usize::try_from(tokens).unwrap_or(usize::MAX),
                source: BudgetSource::Flag,
            }),
            (None, 0) => Err(BudgetError::NoneReported),
            (None, tokens) => Ok(BatchBudget {
                tokens: tokens as usize,
                source: BudgetSource::Shard,
            }),
        }
    }
}

/// Where a request's reads spent their time after it was queued.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReadTiming {
    /// Queued → the shard call of its batch started (waiting for a busy shard or for company).
    pub queued: Duration,
    /// The shard call of its batch: gRPC send → every rank answered.
    pub shard: Duration,
}

/// Whatever answers a batch of reads: the shard ranks, or a stand-in in tests.
pub trait ReadBackend: Send + Sync + 'static {
    fn read(
        &self,
        reads: Vec<pb::Read>,
    ) -> impl Future<Output = Result<pb::ReadResponse, DecisionError>> + Send;
}

impl ReadBackend for ShardSet {
    fn read(
        &self,
        reads: Vec<pb::Read>,
    ) -> impl Future<Output = Result<pb::ReadResponse, DecisionError>> + Send {
        ShardSet::read(self, reads)
    }
}

type Answer = Result<(Vec<ReadOutcome>, ReadTiming), DecisionError>;

struct Entry {
    reads: Vec<PreparedRead>,
    cache_salt: String,
    /// Unique prompt tokens of this request: its share of the batch budget.
    tokens: usize,
    queued_at: Instant,
    reply: oneshot::Sender<Answer>,
    /// The request's span: its batch's span is a child of the first request's and links the others.
    span: tracing::Span,
}

/// Requests between parsing and queueing; a forming batch waits for them (within the window).
#[derive(Default)]
struct Arrivals {
    count: AtomicUsize,
    changed: Notify,
}

/// Held by a request while it is prepared; dropping it (queued or refused) ends its arrival.
pub struct Arrival {
    arrivals: Arc<Arrivals>,
}

impl Drop for Arrival {
    fn drop(&mut self) {
        self.arrivals.count.fetch_sub(1, Ordering::SeqCst);
        self.arrivals.changed.notify_one();
    }
}

/// The load an endpoint picker or an autoscaler reads (`/metrics`): requests waiting and at the shards,
/// and the prefix cache's bytes as the last shard call reported them.
#[derive(Default)]
pub struct Load {
    requests_queued: AtomicUsize,
    requests_running: AtomicUsize,
    prefix_cache_used_bytes: AtomicU64,
}

impl Load {
    /// Requests whose reads wait for a shard call.
    pub fn requests_queued(&self) -> usize {
        self.requests_queued.load(Ordering::SeqCst)
    }

    /// Requests whose reads are at the shards.
    pub fn requests_running(&self) -> usize {
        self.requests_running.load(Ordering::SeqCst)
    }

    /// Bytes the shards' prefix cache held after the last shard call (0 before the first, or without one).
    pub fn prefix_cache_used_bytes(&self) -> u64 {
        self.prefix_cache_used_bytes.load(Ordering::SeqCst)
    }
}

/// The work between the HTTP handlers and the shards, in the unit admission reasons in: unique
/// prompt tokens queued or being read, and the rate the shards have been reading them at.
#[derive(Default)]
struct Backlog {
    tokens: AtomicUsize,
    /// Tokens and seconds of recent batches, each decayed by a quarter per batch; their ratio is the
    /// rate. Summing before dividing weighs batches by their size, so a few small batches (whose
    /// time is mostly fixed cost) do not make a queue of large requests look slower than it is.
    recent: std::sync::Mutex<(f64, f64)>,
    /// `recent`'s ratio as f64 bits, for readers that must not wait (0 until a batch ran).
    rate_bits: AtomicU64,
}

impl Backlog {
    fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Relaxed))
    }

    /// One batch of `tokens` took `took` at the shard. A batch counts at most
    /// [`STALL_CAP`] times what the rate predicted for it (at least [`STALL_FLOOR`]): a shard frozen
    /// for 30 s under one batch is a stall, not its speed, and counted whole it kept the rate so low
    /// that admission refused nearly everything for 20 s after the shard resumed (22,180 529s, 2 200s).
    fn observe(&self, tokens: usize, took: Duration) {
        let mut secs = took.as_secs_f64();
        if tokens == 0 || secs <= 0.0 {
            return;
        }
        let rate = self.rate();
        if rate > 0.0 {
            let predicted = tokens as f64 / rate;
            secs = secs.min((STALL_CAP * predicted).max(STALL_FLOOR.as_secs_f64()));
        }
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.0 = 0.75 * recent.0 + tokens as f64;
        recent.1 = 0.75 * recent.1 + secs;
        self.rate_bits
            .store((recent.0 / recent.1).to_bits(), Ordering::Relaxed);
    }
}

/// The most a single batch counts in the read rate, as a multiple of its predicted time.
const STALL_CAP: f64 = 4.0;
/// ...and never less than this: a batch that is slow in absolute terms but short is still counted.
const STALL_FLOOR: Duration = Duration::from_secs(1);

/// The share of a request's remaining time the estimated wait may fill: the estimate counts shard
/// time only (not the router's own work, nor batches packing less well than the recent ones), and a
/// soak at concurrency 64 on 2 vCPUs still timed out a fifth of the admitted requests at 1.0.
const ADMISSION_MARGIN: f64 = 0.8;

/// How long the work already queued (plus `own` tokens) will take at the measured rate; `None`
/// before any batch was measured.
fn estimated_wait(ahead: usize, own: usize, rate: f64) -> Option<Duration> {
    (rate > 0.0).then(|| Duration::from_secs_f64((ahead + own) as f64 / rate))
}

#[derive(Clone)]
pub struct Queue {
    tx: mpsc::UnboundedSender<Entry>,
    queued: Arc<AtomicUsize>,
    arrivals: Arc<Arrivals>,
    backlog: Arc<Backlog>,
    load: Arc<Load>,
    max_queued_reads: usize,
    max_batches_at_shard: usize,
}

impl Queue {
    pub fn start<B: ReadBackend>(backend: B, config: QueueConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let arrivals = Arc::new(Arrivals::default());
        let backlog = Arc::new(Backlog::default());
        let load = Arc::new(Load::default());
        tokio::spawn(batcher(
            rx,
            backend,
            config.clone(),
            Counters {
                queued: queued.clone(),
                backlog: backlog.clone(),
                load: load.clone(),
            },
            arrivals.clone(),
        ));
        Queue {
            tx,
            queued,
            arrivals,
            backlog,
            load,
            max_queued_reads: config.max_queued_reads,
            max_batches_at_shard: config.max_batches_at_shard.max(1),
        }
    }

    /// Announces a request that will be queued soon; batches forming meanwhile wait for it.
    pub fn arrival(&self) -> Arrival {
        self.arrivals.count.fetch_add(1, Ordering::SeqCst);
        Arrival {
            arrivals: self.arrivals.clone(),
        }
    }

    /// Enqueues a request's reads; resolves when the shard has answered them all. With a
    /// `deadline`, a request that the work queued ahead of it would keep past the deadline is refused
    /// at once (it would only time out later, after costing shard time); a request with nothing
    /// ahead of it always runs.
    pub async fn read(
        &self,
        reads: Vec<PreparedRead>,
        tokens: usize,
        cache_salt: String,
        arrival: Arrival,
        deadline: Option<(Instant, Budget)>,
    ) -> Result<(Vec<ReadOutcome>, ReadTiming), DecisionError> {
        let n = reads.len();
        let queued = self.queued.fetch_add(n, Ordering::SeqCst);
        if queued + n > self.max_queued_reads && queued > 0 {
            self.queued.fetch_sub(n, Ordering::SeqCst);
            return Err(DecisionError::Overloaded {
                queued,
                limit: self.max_queued_reads,
                retry_after_secs: 1,
            });
        }
        let ahead = self.backlog.tokens.fetch_add(tokens, Ordering::SeqCst);
        if let (Some((deadline, budget)), true) = (deadline, ahead > 0) {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Some(wait) = estimated_wait(ahead, tokens, self.backlog.rate()) {
                if wait.as_secs_f64() > left.as_secs_f64() * ADMISSION_MARGIN {
                    self.queued.fetch_sub(n, Ordering::SeqCst);
                    self.backlog.tokens.fetch_sub(tokens, Ordering::SeqCst);
                    metrics::counter!("decision_requests_backlogged_total").increment(1);
                    let retry =
                        (wait.as_secs_f64() - left.as_secs_f64() * ADMISSION_MARGIN).ceil() as u64;
                    return Err(DecisionError::Backlogged {
                        wait_secs: wait.as_secs_f64().ceil() as u64,
                        deadline_secs: budget.limit.as_secs_f64(),
                        set_by: budget.source,
                        retry_after_secs: retry.clamp(1, 60),
                    });
                }
            }
        }
        let (reply, rx) = oneshot::channel();
        // Before the send: the batcher may take the request at once.
        self.load.requests_queued.fetch_add(1, Ordering::SeqCst);
        let sent = self.tx.send(Entry {
            reads,
            cache_salt,
            tokens,
            queued_at: Instant::now(),
            reply,
            span: tracing::Span::current(),
        });
        // Only now: a batch that waited for this request finds it in the channel.
        drop(arrival);
        if sent.is_err() {
            self.load.requests_queued.fetch_sub(1, Ordering::SeqCst);
            self.queued.fetch_sub(n, Ordering::SeqCst);
            self.backlog.tokens.fetch_sub(tokens, Ordering::SeqCst);
            return Err(DecisionError::ShardUnavailable(
                "the read queue has stopped".into(),
            ));
        }
        rx.await
            .map_err(|_| DecisionError::Internal("the read queue dropped a request".into()))?
    }

    pub fn queued_reads(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Unique prompt tokens queued or being read.
    pub fn queued_tokens(&self) -> usize {
        self.backlog.tokens.load(Ordering::SeqCst)
    }

    /// Prompt tokens per second the shards have been reading (0 before the first batch).
    pub fn read_rate(&self) -> f64 {
        self.backlog.rate()
    }

    /// Shard calls it keeps outstanding at once.
    pub fn max_batches_at_shard(&self) -> usize {
        self.max_batches_at_shard
    }

    /// Requests queued and running, and the prefix cache's use.
    pub fn load(&self) -> &Load {
        &self.load
    }
}

/// What the batcher keeps up to date for the admission checks of `Queue::read`.
struct Counters {
    queued: Arc<AtomicUsize>,
    backlog: Arc<Backlog>,
    load: Arc<Load>,
}

/// A batch being gathered: its requests and their unique prompt tokens.
#[derive(Default)]
struct Forming {
    entries: Vec<Entry>,
    tokens: usize,
}

impl Forming {
    /// Takes `entry` if the budget has room for it, and hands it back otherwise. An empty batch takes
    /// any request: one larger than the budget goes alone.
    fn offer(&mut self, entry: Entry, budget: usize) -> Result<(), Entry> {
        if !self.entries.is_empty() && self.tokens + entry.tokens > budget {
            return Err(entry);
        }
        self.tokens += entry.tokens;
        self.entries.push(entry);
        Ok(())
    }
}

/// Keeps the shard busy: while a batch is at the shard, the next one forms from the requests that
/// arrive. It is sent the moment the shard answers, or at once when it is full and the shard holds
/// fewer than `max_batches_at_shard` calls (the shard reads them one after another, in the order
/// they came). More than one call at a time only on a shard of one rank: the ranks of a
/// tensor-parallel group must run batches in the same order, and two calls in flight could reach
/// them in different orders (`http::state` chooses).
async fn batcher<B: ReadBackend>(
    mut rx: mpsc::UnboundedReceiver<Entry>,
    backend: B,
    config: QueueConfig,
    counters: Counters,
    arrivals: Arc<Arrivals>,
) {
    let budget = config.max_batch_prefill_tokens;
    let most_at_shard = config.max_batches_at_shard.max(1);
    // A request that did not fit the batch before it: it starts the next one.
    let mut carry: Option<Entry> = None;
    // The batch formed while earlier ones were at the shard.
    let mut formed = Forming::default();
    let mut at_shard = FuturesUnordered::new();
    // When the shard last answered: a call that waited there behind another is timed from then.
    let mut last_answer: Option<Instant> = None;
    let mut open = true;
    loop {
        // An idle shard takes whatever formed; a busy one (below the limit) only a full batch.
        while at_shard.len() < most_at_shard
            && !formed.entries.is_empty()
            && (at_shard.is_empty() || carry.is_some() || formed.tokens >= budget)
        {
            let batch = std::mem::take(&mut formed);
            if let Some(entry) = carry.take() {
                // An empty batch takes any request.
                let _ = formed.offer(entry, budget);
            }
            if let Some(live) = without_gone_clients(batch, &counters) {
                at_shard.push(dispatch(&backend, live, &counters));
            }
        }
        if at_shard.is_empty() {
            // The shard is idle: gather a batch, waiting (within the window) for requests on their way.
            match gather(&mut rx, &mut carry, &config, &arrivals).await {
                Some(batch) => formed = batch,
                None => return,
            }
            continue;
        }
        // No wait window here: a batch that is not full leaves when the shard answers anyway.
        tokio::select! {
            biased;
            Some(done) = at_shard.next() => {
                counters.backlog.tokens.fetch_sub(done.tokens, Ordering::SeqCst);
                if done.answered {
                    let from = last_answer.map_or(done.sent, |t| t.max(done.sent));
                    counters.backlog.observe(done.tokens, done.at.saturating_duration_since(from));
                }
                last_answer = Some(done.at);
            }
            entry = rx.recv(), if open && carry.is_none() && formed.tokens < budget => match entry {
                Some(entry) => carry = formed.offer(entry, budget).err(),
                None => open = false,
            },
        }
    }
}

/// A shard call that returned: its batch's tokens, when it was sent and when it returned, and
/// whether the shard answered it.
struct Returned {
    tokens: usize,
    sent: Instant,
    at: Instant,
    answered: bool,
}

async fn dispatch<B: ReadBackend>(backend: &B, batch: Forming, counters: &Counters) -> Returned {
    let sent = Instant::now();
    let answered = run_batch(backend, batch.entries, counters).await;
    Returned {
        tokens: batch.tokens,
        sent,
        at: Instant::now(),
        answered,
    }
}

/// A batch for an idle shard: the next request (or the one carried over), then whatever is queued
/// within the budget, waiting for requests on their way until the window closes. None once the
/// queue has stopped and nothing is left.
async fn gather(
    rx: &mut mpsc::UnboundedReceiver<Entry>,
    carry: &mut Option<Entry>,
    config: &QueueConfig,
    arrivals: &Arrivals,
) -> Option<Forming> {
    let budget = config.max_batch_prefill_tokens;
    let first = match carry.take() {
        Some(entry) => entry,
        None => rx.recv().await?,
    };
    let mut batch = Forming::default();
    let _ = batch.offer(first, budget);
    let deadline = Instant::now() + config.max_batch_wait;
    while batch.tokens < budget {
        let next = match rx.try_recv() {
            Ok(entry) => Some(entry),
            Err(mpsc::error::TryRecvError::Disconnected) => None,
            Err(mpsc::error::TryRecvError::Empty) => {
                if arrivals.count.load(Ordering::SeqCst) == 0 {
                    None
                } else {
                    tokio::select! {
                        e = rx.recv() => e,
                        // An arrival was queued or refused: look again.
                        _ = arrivals.changed.notified() => continue,
                        _ = tokio::time::sleep_until(deadline) => None,
                    }
                }
            }
        };
        let Some(entry) = next else { break };
        if let Err(entry) = batch.offer(entry, budget) {
            *carry = Some(entry);
            break;
        }
    }
    Some(batch)
}

/// `batch` less the requests whose client went away (it dropped its receiver): their reads are not
/// computed, and leave the admission counters now. None when no request is left.
fn without_gone_clients(batch: Forming, counters: &Counters) -> Option<Forming> {
    let (live, gone): (Vec<Entry>, Vec<Entry>) = batch
        .entries
        .into_iter()
        .partition(|e| !e.reply.is_closed());
    let dropped: usize = gone.iter().map(|e| e.reads.len()).sum();
    if dropped > 0 {
        metrics::counter!("decision_reads_dropped_total").increment(dropped as u64);
    }
    counters.queued.fetch_sub(dropped, Ordering::SeqCst);
    counters
        .load
        .requests_queued
        .fetch_sub(gone.len(), Ordering::SeqCst);
    let dropped_tokens: usize = gone.iter().map(|e| e.tokens).sum();
    counters
        .backlog
        .tokens
        .fetch_sub(dropped_tokens, Ordering::SeqCst);
    if live.is_empty() {
        return None;
    }
    Some(Forming {
        tokens: live.iter().map(|e| e.tokens).sum(),
        entries: live,
    })
}

/// Runs one batch and answers its requests; returns whether the shard answered.
async fn run_batch<B: ReadBackend>(backend: &B, batch: Vec<Entry>, counters: &Counters) -> bool {
    let requests = batch.len();
    let load = &counters.load;
    load.requests_queued.fetch_sub(requests, Ordering::SeqCst);
    load.requests_running.fetch_add(requests, Ordering::SeqCst);
    let mut reads = Vec::new();
    for entry in &batch {
        for read in &entry.reads {
            reads.push(read.to_pb(reads.len() as u64, &entry.cache_salt));
        }
    }
    let n = reads.len();
    metrics::histogram!("decision_batch_reads").record(n as f64);
    metrics::histogram!("decision_batch_requests").record(batch.len() as f64);
    let span =
        tracing::info_span!(parent: &batch[0].span, "batch", reads = n, requests = batch.len());
    for entry in &batch[1..] {
        span.follows_from(&entry.span);
    }
    let started = Instant::now();
    let result = tracing::Instrument::instrument(backend.read(reads), span).await;
    let shard = started.elapsed();
    metrics::histogram!("decision_batch_duration_seconds").record(shard.as_secs_f64());
    counters.queued.fetch_sub(n, Ordering::SeqCst);
    load.requests_running.fetch_sub(requests, Ordering::SeqCst);
    match result {
        Ok(response) => {
            load.prefix_cache_used_bytes
                .store(response.prefix_cache_used_bytes, Ordering::SeqCst);
            metrics::histogram!("decision_shard_forward_seconds")
                .record(response.forward_micros as f64 / 1e6);
            // The shard's model thread idle before this batch: under load, the device waiting for
            // the router (about 0 when the batch was already waiting at the shard).
            metrics::histogram!("decision_shard_idle_seconds")
                .record(response.idle_micros as f64 / 1e6);
            // Walks over the layers, as rank 0 counted them; over decision_batch_reads_count, the
            // forward passes per batch.
            metrics::counter!("decision_shard_forward_passes_total")
                .increment(u64::from(response.forward_passes));
            if response.head_micros > 0 {
                // Pooled reads: the part of the forward time the joint-schema head took.
                metrics::histogram!("decision_shard_head_seconds")
                    .record(response.head_micros as f64 / 1e6);
            }
            let mut results: Vec<Option<pb::ReadResult>> = vec![None; n];
            for r in response.results {
                if let Some(slot) = results.get_mut(r.id as usize) {
                    *slot = Some(r);
                }
            }
            let mut results = results.into_iter();
            for entry in batch {
                let mine: Result<Vec<ReadOutcome>, DecisionError> = entry
                    .reads
                    .iter()
                    .zip(results.by_ref().take(entry.reads.len()))
                    .map(|(read, result)| {
                        let result = result.ok_or_else(|| {
                            DecisionError::Shard("the shard left a read unanswered".into())
                        })?;
                        if !result.media_error.is_empty() {
                            if read.media.is_empty() {
                                return Err(DecisionError::Internal(format!(
                                    "malformed shard result: a media error for a read without media: {}",
                                    result.media_error
                                )));
                            }
                            return Err(crate::read::media_error(&result.media_error));
                        }
                        ReadOutcome::check(read, result).map_err(|e| {
                            DecisionError::Internal(format!("malformed shard result: {e}"))
                        })
                    })
                    .collect();
                let timing = ReadTiming {
                    queued: started.saturating_duration_since(entry.queued_at),
                    shard,
                };
                let _ = entry.reply.send(mine.map(|outcomes| (outcomes, timing)));
            }
            true
        }
        Err(e) => {
            for entry in batch {
                let _ = entry.reply.send(Err(clone_error(&e)));
            }
            false
        }
    }
}

fn clone_error(e: &DecisionError) -> DecisionError {
    match e {
        DecisionError::ShardUnavailable(m) => DecisionError::ShardUnavailable(m.clone()),
        DecisionError::Shard(m) => DecisionError::Shard(m.clone()),
        other => DecisionError::Internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::read::LabelGroup;

    /// Answers every read with its own first token id as the label log-probability, after `delay`,
    /// and records the size and start of each call it was sent, and the most calls it held at once.
    ///
    /// Like a shard's one model thread, it reads one call at a time, in the order they came; a call
    /// that arrives while another is read waits (its start is when it arrived).
    #[derive(Clone)]
    struct FakeShard {
        delay: Duration,
        calls: Arc<Mutex<Vec<(usize, Instant)>>>,
        outstanding: Arc<AtomicUsize>,
        most_outstanding: Arc<AtomicUsize>,
        model_thread: Arc<tokio::sync::Mutex<()>>,
    }

    impl FakeShard {
        fn new(delay: Duration) -> Self {
            FakeShard {
                delay,
                calls: Arc::new(Mutex::new(Vec::new())),
                outstanding: Arc::new(AtomicUsize::new(0)),
                most_outstanding: Arc::new(AtomicUsize::new(0)),
                model_thread: Arc::default(),
            }
        }

        fn batches(&self) -> Vec<usize> {
            self.calls.lock().unwrap().iter().map(|c| c.0).collect()
        }

        fn starts(&self) -> Vec<Instant> {
            self.calls.lock().unwrap().iter().map(|c| c.1).collect()
        }
    }

    impl ReadBackend for FakeShard {
        async fn read(&self, reads: Vec<pb::Read>) -> Result<pb::ReadResponse, DecisionError> {
            self.calls
                .lock()
                .unwrap()
                .push((reads.len(), Instant::now()));
            let now = self.outstanding.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_outstanding.fetch_max(now, Ordering::SeqCst);
            {
                let _reading = self.model_thread.lock().await;
                tokio::time::sleep(self.delay).await;
            }
            self.outstanding.fetch_sub(1, Ordering::SeqCst);
            Ok(pb::ReadResponse {
                results: reads
                    .iter()
                    .map(|r| {
                        let Some(pb::read::Kind::NextToken(read)) = &r.kind else {
                            panic!("next-token reads only")
                        };
                        // A read with media stands for one whose image the shard cannot decode.
                        if let Some(item) = r.media.first() {
                            return pb::ReadResult {
                                id: r.id,
                                media_error: format!("{}: cannot decode the image", item.name),
                                ..Default::default()
                            };
                        }
                        pb::ReadResult {
                            id: r.id,
                            tokens_computed: read.token_ids.len() as u32,
                            tokens_cached: 0,
                            media_tokens: 0,
                            media_error: String::new(),
                            kind: Some(pb::read_result::Kind::NextToken(pb::NextTokenResult {
                                labels: vec![pb::LabelGroupLogprobs {
                                    variant_logprobs: vec![-(read.token_ids[0] as f64)],
                                }],
                                greedy_token_id: read.token_ids[0],
                            })),
                        }
                    })
                    .collect(),
                ..Default::default()
            })
        }
    }

    fn reads(first_tokens: &[u32]) -> Vec<PreparedRead> {
        first_tokens
            .iter()
            .map(|&t| PreparedRead::next_token(vec![t, 1, 2], vec![LabelGroup::single(vec![7])]))
            .collect()
    }

    /// A request of one read per first token, queued from its own task (announced as it is sent).
    fn spawn_read(
        queue: &Queue,
        first_tokens: &[u32],
        tokens: usize,
    ) -> tokio::task::JoinHandle<Result<(Vec<ReadOutcome>, ReadTiming), DecisionError>> {
        let queue = queue.clone();
        let reads = reads(first_tokens);
        tokio::spawn(async move {
            queue
                .read(reads, tokens, String::new(), queue.arrival(), None)
                .await
        })
    }

    fn config(wait: Duration) -> QueueConfig {
        QueueConfig {
            max_batch_prefill_tokens: 1000,
            max_batch_wait: wait,
            max_queued_reads: 100,
            max_batches_at_shard: 2,
        }
    }

    /// Batches of at most 10 tokens, no wait window, `at_shard` calls at the shard at once.
    fn ten_token_batches(at_shard: usize) -> QueueConfig {
        QueueConfig {
            max_batch_prefill_tokens: 10,
            max_batches_at_shard: at_shard,
            ..config(Duration::ZERO)
        }
    }

    /// One request's undecodable image fails that request alone (a 400 naming it), never the other
    /// requests batched with it.
    #[tokio::test(start_paused = true)]
    async fn a_bad_medium_fails_only_its_own_request_in_a_batch() {
        let shard = FakeShard::new(Duration::from_millis(40));
        let queue = Queue::start(shard.clone(), config(Duration::from_millis(50)));
        let late = queue.arrival();
        let good = spawn_read(&queue, &[1], 3);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut bad_reads = reads(&[2]);
        bad_reads[0].media = Arc::from(vec![crate::read::ReadMedia {
            modality: crate::ir::Modality::Image,
            name: "images.0".into(),
            data: Arc::from(&b"png?"[..]),
            sha256: String::new(),
            max_seconds: 0.0,
            max_frames: 0,
        }]);
        let bad = queue.read(bad_reads, 3, String::new(), late, None).await;
        match bad {
            Err(DecisionError::BadRequest { param, message }) => {
                assert_eq!(param.as_deref(), Some("images.0"));
                assert!(message.contains("cannot decode"), "{message}");
            }
            other => panic!("{:?}", other.map(|(o, _)| o)),
        }
        let (outcomes, _) = good.await.unwrap().unwrap();
        assert_eq!(outcomes[0].row().greedy_token_id, 1);
        assert_eq!(
            shard.batches(),
            vec![2],
            "the two requests shared one batch"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_request_is_sent_at_once_even_with_a_long_wait_window() {
        let shard = FakeShard::new(Duration::from_millis(40));
        let queue = Queue::start(shard.clone(), config(Duration::from_secs(10)));
        let started = Instant::now();
        let (outcomes, timing) = queue
            .read(reads(&[5, 6]), 6, String::new(), queue.arrival(), None)
            .await
            .unwrap();
        assert_eq!(timing.queued, Duration::ZERO);
        assert_eq!(timing.shard, Duration::from_millis(40));
        assert_eq!(started.elapsed(), Duration::from_millis(40));
        assert_eq!(
            outcomes
                .iter()
                .map(|o| o.rows[0].greedy_token_id)
                .collect::<Vec<_>>(),
            vec![5, 6]
        );
        assert_eq!(shard.batches(), vec![2]);
        assert_eq!(queue.queued_reads(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_forming_batch_waits_for_a_request_on_its_way() {
        let shard = FakeShard::new(Duration::from_millis(40));
        let queue = Queue::start(shard.clone(), config(Duration::from_millis(50)));
        let late = queue.arrival();
        let first = spawn_read(&queue, &[1], 3);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (second, _) = queue
            .read(reads(&[2]), 3, String::new(), late, None)
            .await
            .unwrap();
        let (first, timing) = first.await.unwrap().unwrap();
        assert_eq!(shard.batches(), vec![2], "one shard call for both requests");
        assert_eq!(timing.queued, Duration::from_millis(10));
        assert_eq!(
            (
                first[0].rows[0].greedy_token_id,
                second[0].rows[0].greedy_token_id
            ),
            (1, 2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_when_the_request_on_its_way_is_refused_or_the_window_closes() {
        let shard = FakeShard::new(Duration::from_millis(40));
        let queue = Queue::start(shard.clone(), config(Duration::from_millis(50)));
        // Refused while being prepared (say, over the token limit): the batch leaves at once.
        let refused = queue.arrival();
        let waiting = spawn_read(&queue, &[1], 3);
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(refused);
        let (_, timing) = waiting.await.unwrap().unwrap();
        assert_eq!(timing.queued, Duration::from_millis(5));

        // Never arriving: the batch leaves when the window closes.
        let _slow = queue.arrival();
        let (_, timing) = queue
            .read(reads(&[2]), 3, String::new(), queue.arrival(), None)
            .await
            .unwrap();
        assert_eq!(timing.queued, Duration::from_millis(50));
        assert_eq!(shard.batches(), vec![1, 1]);
    }

    /// Requests that arrive while the shard reads one batch form the next, up to the budget. With one
    /// call at the shard the full batch leaves when the shard answers; with two it leaves at once and
    /// waits at the shard, which reads it straight after the first. The request that did not fit
    /// waits for a shard call to return either way (its batch is not full).
    #[tokio::test(start_paused = true)]
    async fn requests_queued_behind_a_busy_shard_ride_the_next_batch_within_the_budget() {
        for (at_shard, second_queued, second_sent) in [(1, 99, 100), (2, 2, 3)] {
            let shard = FakeShard::new(Duration::from_millis(100));
            let queue = Queue::start(shard.clone(), ten_token_batches(at_shard));
            let t0 = Instant::now();
            let mut handles = Vec::new();
            for (i, tokens) in [4, 4, 4, 4].into_iter().enumerate() {
                handles.push(spawn_read(&queue, &[i as u32], tokens));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let mut timings = Vec::new();
            for (i, handle) in handles.into_iter().enumerate() {
                let (outcomes, timing) = handle.await.unwrap().unwrap();
                assert_eq!(outcomes[0].rows[0].greedy_token_id, i as u32);
                timings.push(timing);
            }
            // The first goes alone; the next two fill the 10-token budget; the last waits for a third call.
            assert_eq!(shard.batches(), vec![1, 2, 1], "{at_shard} at the shard");
            let sent: Vec<u64> = shard
                .starts()
                .iter()
                .map(|s| s.duration_since(t0).as_millis() as u64)
                .collect();
            assert_eq!(sent, vec![0, second_sent, 200], "{at_shard} at the shard");
            assert_eq!(timings[0].queued, Duration::ZERO);
            assert_eq!(
                timings[1].queued,
                Duration::from_millis(second_queued),
                "{at_shard} at the shard"
            );
            // Read from 100 to 200 ms whenever it was sent: the shard reads one call at a time.
            assert_eq!(
                timings[1].queued + timings[1].shard,
                Duration::from_millis(199)
            );
            assert_eq!(timings[3].queued, Duration::from_millis(197));
            assert_eq!(
                shard.most_outstanding.load(Ordering::SeqCst),
                at_shard,
                "calls at the shard at once"
            );
            assert_eq!((queue.queued_reads(), queue.queued_tokens()), (0, 0));
        }
    }

    /// Under a flood of full batches the shard never holds more calls than allowed, every request is
    /// answered, and the read rate admission reasons with is the shard's own speed: a call that waited
    /// at the shard behind another is timed from when the shard answered that one, not from when it
    /// was sent (which would halve the rate and refuse requests that fit).
    #[tokio::test(start_paused = true)]
    async fn full_batches_wait_at_the_shard_within_the_limit_and_the_rate_counts_reading_only() {
        for at_shard in [1, 2] {
            let shard = FakeShard::new(Duration::from_millis(100));
            let queue = Queue::start(shard.clone(), ten_token_batches(at_shard));
            let handles: Vec<_> = (0..6).map(|i| spawn_read(&queue, &[i], 10)).collect();
            for (i, handle) in handles.into_iter().enumerate() {
                let (outcomes, _) = handle.await.unwrap().unwrap();
                assert_eq!(outcomes[0].rows[0].greedy_token_id, i as u32);
            }
            assert_eq!(shard.batches(), vec![1; 6]);
            assert_eq!(
                shard.most_outstanding.load(Ordering::SeqCst),
                at_shard,
                "calls at the shard at once"
            );
            // 10 tokens per 100 ms of reading.
            assert!(
                (queue.read_rate() - 100.0).abs() < 1e-6,
                "{at_shard} at the shard: {}",
                queue.read_rate()
            );
            assert_eq!((queue.queued_reads(), queue.queued_tokens()), (0, 0));
        }
    }

    #[test]
    fn two_batches_at_the_shard_by_default_on_one_accelerator_and_never_on_a_tensor_parallel_group()
    {
        assert_eq!(batches_at_shard(None, 1, "cuda:0"), Ok(2));
        assert_eq!(batches_at_shard(None, 1, "cpu"), Ok(1));
        assert_eq!(batches_at_shard(None, 2, "cuda:0"), Ok(1));
        assert_eq!(batches_at_shard(Some(1), 1, "cuda:0"), Ok(1));
        assert_eq!(batches_at_shard(Some(1), 4, "cpu"), Ok(1));
        assert_eq!(batches_at_shard(Some(2), 1, "cpu"), Ok(2));
        let refused = batches_at_shard(Some(2), 2, "cuda:0").unwrap_err();
        assert_eq!(
            refused,
            BudgetError::UnorderedRanks {
                asked: 2,
                world_size: 2
            }
        );
        assert!(
            refused.to_string().contains("--max-batches-at-shard 2"),
            "{refused}"
        );
    }

    /// The next batch forms while the shard reads the current one and leaves the moment the shard
    /// answers: it does not wait for the window, even with a request still on its way (an idle
    /// shard's batch would), and the shard never holds more than the one call it is reading.
    #[tokio::test(start_paused = true)]
    async fn the_next_batch_forms_while_the_shard_reads_and_leaves_when_it_answers() {
        let shard = FakeShard::new(Duration::from_millis(100));
        let queue = Queue::start(shard.clone(), config(Duration::from_millis(50)));
        let t0 = Instant::now();
        let first = spawn_read(&queue, &[1], 3);
        tokio::time::sleep(Duration::from_millis(10)).await;
        // On its way for the whole test: an idle shard's batch would wait the 50 ms window for it.
        let on_its_way = queue.arrival();
        let second = spawn_read(&queue, &[2], 3);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let third = spawn_read(&queue, &[3], 3);
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            shard.batches(),
            vec![1],
            "the second batch waits for the first call"
        );
        assert_eq!(queue.queued_reads(), 3);
        let (_, first) = first.await.unwrap().unwrap();
        let (second_outcomes, second) = second.await.unwrap().unwrap();
        let (_, third) = third.await.unwrap().unwrap();
        assert_eq!(second_outcomes[0].rows[0].greedy_token_id, 2);
        assert_eq!(
            shard.batches(),
            vec![1, 2],
            "both later requests rode one batch"
        );
        assert_eq!(
            shard
                .starts()
                .iter()
                .map(|s| s.duration_since(t0))
                .collect::<Vec<_>>(),
            vec![Duration::ZERO, Duration::from_millis(100)],
            "sent the moment the first call returned"
        );
        assert_eq!(first.queued, Duration::ZERO);
        assert_eq!(
            (second.queued, third.queued),
            (Duration::from_millis(90), Duration::from_millis(80))
        );
        assert_eq!(shard.most_outstanding.load(Ordering::SeqCst), 1);
        assert_eq!((queue.queued_reads(), queue.queued_tokens()), (0, 0));
        drop(on_its_way);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_of_a_gone_client_are_not_sent() {
        let shard = FakeShard::new(Duration::from_millis(100));
        let queue = Queue::start(shard.clone(), config(Duration::ZERO));
        let busy = spawn_read(&queue, &[1], 3);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let gone = spawn_read(&queue, &[2, 3], 3);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(queue.queued_reads(), 3);
        gone.abort();
        busy.await.unwrap().unwrap();
        let (after, _) = queue
            .read(reads(&[4]), 3, String::new(), queue.arrival(), None)
            .await
            .unwrap();
        assert_eq!(after[0].rows[0].greedy_token_id, 4);
        assert_eq!(
            shard.batches(),
            vec![1, 1],
            "the gone client's two reads never reached the shard"
        );
        assert_eq!(queue.queued_reads(), 0);
    }

    /// Admission by work: once the shard's rate is known (here 1,000 tokens/s: 100 tokens in
    /// 100 ms), a request that the tokens queued ahead of it would keep past its deadline (less the
    /// margin) is refused at once, with a Retry-After of when it would fit; one that fits is admitted, and a
    /// request with nothing ahead of it always runs.
    #[tokio::test(start_paused = true)]
    async fn a_request_that_cannot_finish_by_its_deadline_is_refused_at_once() {
        let shard = FakeShard::new(Duration::from_millis(100));
        let queue = Queue::start(shard.clone(), config(Duration::ZERO));
        let within = |secs: f64| {
            let limit = Duration::from_secs_f64(secs);
            Some((
                Instant::now() + limit,
                Budget {
                    limit,
                    source: Budget::FLAG,
                },
            ))
        };
        // Nothing ahead: runs even though 100 tokens at an unknown rate might take any time.
        queue
            .read(
                reads(&[1]),
                100,
                String::new(),
                queue.arrival(),
                within(0.01),
            )
            .await
            .unwrap();
        assert_eq!(queue.read_rate(), 1000.0);
        let busy = spawn_read(&queue, &[2], 500);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(queue.queued_tokens(), 500);
        // 500 ahead + 600 own = 1.1 s of reads, deadline 1 s.
        let refused = queue
            .read(
                reads(&[3]),
                600,
                String::new(),
                queue.arrival(),
                within(1.0),
            )
            .await;
        match refused {
            Err(DecisionError::Backlogged {
                wait_secs,
                deadline_secs,
                set_by,
                retry_after_secs,
            }) => assert_eq!(
                (wait_secs, deadline_secs, set_by, retry_after_secs),
                (2, 1.0, "request_timeout_secs", 1)
            ),
            other => panic!("{:?}", other.map(|(o, _)| o.len())),
        }
        assert_eq!(
            queue.queued_tokens(),
            500,
            "the refused request left no trace"
        );
        assert_eq!(queue.queued_reads(), 1);
        // 500 ahead + 300 own = 0.8 s: fits.
        let (fits, _) = queue
            .read(
                reads(&[4]),
                300,
                String::new(),
                queue.arrival(),
                within(1.0),
            )
            .await
            .unwrap();
        assert_eq!(fits[0].rows[0].greedy_token_id, 4);
        busy.await.unwrap().unwrap();
        assert_eq!(
            shard.batches(),
            vec![1, 1, 1],
            "the refused read never reached the shard"
        );
        assert_eq!(queue.queued_tokens(), 0);
        // Without a deadline nothing is refused for its size.
        let busy = spawn_read(&queue, &[5], 500);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(queue
            .read(reads(&[6]), 100_000, String::new(), queue.arrival(), None)
            .await
            .is_ok());
        busy.await.unwrap().unwrap();
    }

    #[test]
    fn the_read_rate_follows_recent_batches() {
        let backlog = Backlog::default();
        assert_eq!(estimated_wait(10, 10, backlog.rate()), None);
        backlog.observe(1000, Duration::from_secs(1));
        assert_eq!(backlog.rate(), 1000.0);
        // A small batch, mostly fixed cost, moves the rate by its share of the work only:
        // (750 + 10) tokens over (0.75 + 0.1) s.
        backlog.observe(10, Duration::from_millis(100));
        assert!(
            (backlog.rate() - 760.0 / 0.85).abs() < 1e-9,
            "{}",
            backlog.rate()
        );
        backlog.observe(0, Duration::ZERO);
        assert!((backlog.rate() - 760.0 / 0.85).abs() < 1e-9);
        let backlog = Backlog::default();
        backlog.observe(800, Duration::from_secs(1));
        assert_eq!(
            estimated_wait(600, 200, backlog.rate()),
            Some(Duration::from_secs(1))
        );
    }

    /// A batch the shard held for 30 s (frozen, then resumed) moves the rate as a batch 4x slower
    /// than predicted would, not as 30 s of work: the next requests are admitted at once.
    #[test]
    fn a_stalled_batch_does_not_poison_the_read_rate() {
        let backlog = Backlog::default();
        backlog.observe(1000, Duration::from_secs(1));
        // 1,000 tokens predicted at 1 s, held 30 s: counted as 4 s. (750 + 1000) / (0.75 + 4).
        backlog.observe(1000, Duration::from_secs(30));
        assert!(
            (backlog.rate() - 1750.0 / 4.75).abs() < 1e-9,
            "{}",
            backlog.rate()
        );
        // A small batch predicted at 10 ms counts up to the 1 s floor, not 40 ms.
        let backlog = Backlog::default();
        backlog.observe(1000, Duration::from_secs(1));
        backlog.observe(10, Duration::from_millis(900));
        assert!((backlog.rate() - 760.0 / 1.65).abs() < 1e-9);
        // Uncapped before the first measurement: there is no prediction to hold it to.
        let backlog = Backlog::default();
        backlog.observe(1000, Duration::from_secs(30));
        assert!((backlog.rate() - 1000.0 / 30.0).abs() < 1e-9);
    }

    /// After a stall, a request that fits its deadline at the shard's real rate is admitted at
    /// once (it was refused with 529 while the stalled batch dominated the rate).
    #[tokio::test(start_paused = true)]
    async fn admission_recovers_at_once_after_a_stall() {
        let shard = StallingShard::new(Duration::from_millis(100));
        let queue = Queue::start(shard.clone(), config(Duration::ZERO));
        let within = |secs: f64| {
            let limit = Duration::from_secs_f64(secs);
            Some((
                Instant::now() + limit,
                Budget {
                    limit,
                    source: Budget::FLAG,
                },
            ))
        };
        // 10,000 tokens/s.
        queue
            .read(reads(&[1]), 1000, String::new(), queue.arrival(), None)
            .await
            .unwrap();
        // The shard freezes for 30 s under one 1,000-token batch: counted as 1 s, not 30.1 s
        // (1,750 tokens over 1.075 s; uncapped, 58 tokens/s would refuse what follows).
        shard.stall.store(true, Ordering::SeqCst);
        queue
            .read(reads(&[2]), 1000, String::new(), queue.arrival(), None)
            .await
            .unwrap();
        assert!(queue.read_rate() > 1600.0, "{}", queue.read_rate());
        // With 500 tokens ahead, 300 more fit a 2 s deadline (about 0.5 s at the rate now).
        let busy = {
            let queue = queue.clone();
            tokio::spawn(async move {
                queue
                    .read(reads(&[3]), 500, String::new(), queue.arrival(), None)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let admitted = queue
            .read(
                reads(&[4]),
                300,
                String::new(),
                queue.arrival(),
                within(2.0),
            )
            .await;
        assert!(admitted.is_ok(), "{:?}", admitted.map(|(o, _)| o.len()));
        busy.await.unwrap().unwrap();
    }

    /// `FakeShard`, which once `stall` is set holds its next call 30 s first (a frozen process).
    #[derive(Clone)]
    struct StallingShard {
        inner: FakeShard,
        stall: Arc<std::sync::atomic::AtomicBool>,
    }

    impl StallingShard {
        fn new(delay: Duration) -> Self {
            StallingShard {
                inner: FakeShard::new(delay),
                stall: Arc::default(),
            }
        }
    }

    impl ReadBackend for StallingShard {
        async fn read(&self, reads: Vec<pb::Read>) -> Result<pb::ReadResponse, DecisionError> {
            if self.stall.swap(false, Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            self.inner.read(reads).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_with_the_limit_and_keeps_no_count_of_the_refused() {
        let shard = FakeShard::new(Duration::from_millis(100));
        let queue = Queue::start(
            shard,
            QueueConfig {
                max_queued_reads: 2,
                ..config(Duration::ZERO)
            },
        );
        let busy = spawn_read(&queue, &[1, 2], 3);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let refused = queue
            .read(reads(&[3]), 3, String::new(), queue.arrival(), None)
            .await;
        assert!(matches!(
            refused,
            Err(DecisionError::Overloaded {
                queued: 2,
                limit: 2,
                ..
            })
        ));
        busy.await.unwrap().unwrap();
        assert_eq!(queue.queued_reads(), 0);
        // A single request larger than the limit still runs when nothing else is queued.
        assert!(queue
            .read(reads(&[4, 5, 6]), 3, String::new(), queue.arrival(), None)
            .await
            .is_ok());
    }
}
