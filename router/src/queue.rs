//! The read queue: an actor that owns pending reads, packs reads of concurrent requests into one
//! shard call under a token budget and a short wait window, and drops reads nobody waits for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use decision_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::DecisionError;
use crate::prompt::PreparedRead;
use crate::shard::ShardSet;

#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Unique prompt tokens per shard call (a larger single request still goes alone).
    pub max_batch_prefill_tokens: usize,
    /// How long the first read of a batch waits for company.
    pub max_batch_wait: Duration,
    /// Reads that may wait at once; beyond it requests are refused as overloaded.
    pub max_queued_reads: usize,
}

/// What the shard said about one read.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadOutcome {
    pub label_logprobs: Vec<f64>,
    pub greedy_token_id: u32,
    pub tokens_computed: u32,
    pub tokens_cached: u32,
}

type Reply = oneshot::Sender<Result<Vec<ReadOutcome>, DecisionError>>;

struct Entry {
    reads: Vec<PreparedRead>,
    cache_salt: String,
    /// Unique prompt tokens of this request: its share of the batch budget.
    tokens: usize,
    reply: Reply,
}

#[derive(Clone)]
pub struct Queue {
    tx: mpsc::UnboundedSender<Entry>,
    queued: Arc<AtomicUsize>,
    max_queued_reads: usize,
}

impl Queue {
    pub fn start(shards: ShardSet, config: QueueConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        tokio::spawn(batcher(rx, shards, config.clone(), queued.clone()));
        Queue {
            tx,
            queued,
            max_queued_reads: config.max_queued_reads,
        }
    }

    /// Enqueues a request's reads; resolves when the shard has answered them all.
    pub async fn read(
        &self,
        reads: Vec<PreparedRead>,
        tokens: usize,
        cache_salt: String,
    ) -> Result<Vec<ReadOutcome>, DecisionError> {
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
        let (reply, rx) = oneshot::channel();
        if self
            .tx
            .send(Entry {
                reads,
                cache_salt,
                tokens,
                reply,
            })
            .is_err()
        {
            self.queued.fetch_sub(n, Ordering::SeqCst);
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
}

async fn batcher(
    mut rx: mpsc::UnboundedReceiver<Entry>,
    shards: ShardSet,
    config: QueueConfig,
    queued: Arc<AtomicUsize>,
) {
    let mut carry: Option<Entry> = None;
    loop {
        let first = match carry.take() {
            Some(e) => e,
            None => match rx.recv().await {
                Some(e) => e,
                None => return,
            },
        };
        let mut tokens = first.tokens;
        let mut batch = vec![first];
        let deadline = Instant::now() + config.max_batch_wait;
        while tokens < config.max_batch_prefill_tokens {
            let next = tokio::select! {
                e = rx.recv() => e,
                _ = tokio::time::sleep_until(deadline) => None,
            };
            let Some(entry) = next else { break };
            if tokens + entry.tokens > config.max_batch_prefill_tokens {
                carry = Some(entry);
                break;
            }
            tokens += entry.tokens;
            batch.push(entry);
        }
        // A client that went away has dropped its receiver: its reads are not computed.
        let (live, gone): (Vec<Entry>, Vec<Entry>) =
            batch.into_iter().partition(|e| !e.reply.is_closed());
        let dropped: usize = gone.iter().map(|e| e.reads.len()).sum();
        if dropped > 0 {
            metrics::counter!("decision_reads_dropped_total").increment(dropped as u64);
        }
        queued.fetch_sub(dropped, Ordering::SeqCst);
        if live.is_empty() {
            continue;
        }
        run_batch(&shards, live, &queued).await;
    }
}

async fn run_batch(shards: &ShardSet, batch: Vec<Entry>, queued: &AtomicUsize) {
    let mut reads = Vec::new();
    for entry in &batch {
        for read in &entry.reads {
            reads.push(pb::Read {
                id: reads.len() as u64,
                token_ids: read.token_ids.clone(),
                labels: read
                    .labels
                    .iter()
                    .map(|l| pb::LabelSequence {
                        token_ids: l.clone(),
                    })
                    .collect(),
                cache_salt: entry.cache_salt.clone(),
            });
        }
    }
    let n = reads.len();
    metrics::histogram!("decision_batch_reads").record(n as f64);
    metrics::histogram!("decision_batch_requests").record(batch.len() as f64);
    let started = std::time::Instant::now();
    let result = shards.read(reads).await;
    metrics::histogram!("decision_batch_duration_seconds").record(started.elapsed().as_secs_f64());
    queued.fetch_sub(n, Ordering::SeqCst);
    match result {
        Ok(response) => {
            metrics::histogram!("decision_shard_forward_seconds")
                .record(response.forward_micros as f64 / 1e6);
            let mut results: Vec<Option<pb::ReadResult>> = vec![None; n];
            for r in response.results {
                if let Some(slot) = results.get_mut(r.id as usize) {
                    *slot = Some(r);
                }
            }
            let mut results = results.into_iter();
            for entry in batch {
                let mine: Option<Vec<ReadOutcome>> = results
                    .by_ref()
                    .take(entry.reads.len())
                    .map(|r| {
                        r.map(|r| ReadOutcome {
                            label_logprobs: r.label_logprobs,
                            greedy_token_id: r.greedy_token_id,
                            tokens_computed: r.tokens_computed,
                            tokens_cached: r.tokens_cached,
                        })
                    })
                    .collect();
                let answer = mine
                    .ok_or_else(|| DecisionError::Shard("the shard left a read unanswered".into()));
                let _ = entry.reply.send(answer);
            }
        }
        Err(e) => {
            for entry in batch {
                let _ = entry.reply.send(Err(clone_error(&e)));
            }
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
