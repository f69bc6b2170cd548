//! The shape-independent flow from a parsed request to its answers: prepare reads, enforce the token
//! limit, queue them for the shards, and turn label log-probabilities into answers.

use std::sync::Arc;
use std::time::Duration;

use crate::debias::{Debias, Expansion};
use crate::error::DecisionError;
use crate::ir::{Decision, DecisionRequest, Media, Modality, Usage};
use crate::label_prior::PriorBook;
use crate::limits::{Budget, Limits};
use crate::media::{self, Fetcher, MediaBlob, MediaPolicy, Position};
use crate::prompt::wording::PromptFormat;
use crate::prompt::{PreparedRead, ReadStrategy, RegistryError};
use crate::queue::{Queue, ReadTiming};
use crate::read::ReadMedia;
use crate::shard::ShardSet;

/// How long the shards get to answer a Health RPC when a request ran out of time: a shard that
/// cannot even answer that is frozen or gone (503), one that can is only busy (504).
pub const TIMEOUT_PROBE: Duration = Duration::from_secs(2);

/// A request's answers, and (when asked for) the reads that produced them.
pub struct Decided {
    pub decision: Decision,
    pub reads: Option<Vec<PreparedRead>>,
    pub timing: ReadTiming,
    /// The wording the prompts were rendered in.
    pub prompt_format: PromptFormat,
}

pub struct Decider {
    pub strategy: Result<Arc<dyn ReadStrategy>, Arc<RegistryError>>,
    pub queue: Queue,
    pub limits: Limits,
    /// Media limits and fetch rules (`--max-media-*`, `--media-allow-hosts`) and the client that
    /// fetches under them.
    pub media: MediaPolicy,
    pub fetcher: Fetcher,
    /// `--request-timeout-secs`: the longest budget of a decision request, from its parse to its
    /// answer (a client's budget header may ask for less: `http/budget.rs`).
    pub request_timeout: Option<Duration>,
    /// Probed when a request runs out of time, to tell a frozen shard from a busy one.
    pub shards: ShardSet,
    /// `--debias`: how a request without `x_debias` is read.
    pub debias: Debias,
    /// `--debias-max-orders`: rotations read per choice at most.
    pub max_orders: usize,
    /// The label priors estimated from this router's rotated reads (`x_debias: "prior"`).
    pub priors: PriorBook,
    /// The calibration fits (`x_calibration`), shared with the `/v1/calibrations` routes.
    pub calibrations: Arc<crate::calibration::Book>,
}

impl Decider {
    /// The wording this server renders in; `None` when the model has no strategy (routes answer 501).
    pub fn prompt_format(&self) -> Option<PromptFormat> {
        self.strategy.as_ref().ok().map(|s| s.prompt_format())
    }

    /// `temperature` divides the label log-probabilities before the softmax (label mass is unaffected);
    /// `keep_reads` returns the prompt and label token ids too. The request is shared, not taken: the
    /// prompt work off the async workers reads it while the caller keeps it to format the answer.
    /// Within a `budget` a request that runs out of time is dropped (its reads not yet sent are never
    /// computed) and answered 504, or 503 when the shards do not answer a health probe either; one
    /// the work queued ahead of it would keep past the budget is refused at once (529).
    pub async fn decide(
        &self,
        request: Arc<DecisionRequest>,
        temperature: f64,
        keep_reads: bool,
        budget: Option<Budget>,
    ) -> Result<Decided, DecisionError> {
        let Some(budget) = budget else {
            return self
                .decide_within(request, temperature, keep_reads, None)
                .await;
        };
        let deadline = tokio::time::Instant::now() + budget.limit;
        let work = self.decide_within(request, temperature, keep_reads, Some((deadline, budget)));
        match tokio::time::timeout_at(deadline, work).await {
            Ok(decided) => decided,
            Err(_) => {
                metrics::counter!("decision_requests_timed_out_total").increment(1);
                Err(self.timed_out(budget).await)
            }
        }
    }

    /// Why a request ran out of time: the shards stopped answering, or there was too much to do.
    async fn timed_out(&self, budget: Budget) -> DecisionError {
        match tokio::time::timeout(TIMEOUT_PROBE, self.shards.health()).await {
            Ok(Ok(())) => DecisionError::Timeout {
                limit_secs: budget.limit.as_secs_f64(),
                set_by: budget.source,
            },
            Ok(Err(e)) => e,
            Err(_) => DecisionError::ShardUnavailable(format!(
                "the request ran past its {} s deadline ({}) and the shards did not answer a health probe within {} s",
                budget.limit.as_secs_f64(),
                budget.source,
                TIMEOUT_PROBE.as_secs()
            )),
        }
    }

    async fn decide_within(
        &self,
        request: Arc<DecisionRequest>,
        temperature: f64,
        keep_reads: bool,
        deadline: Option<(tokio::time::Instant, Budget)>,
    ) -> Result<Decided, DecisionError> {
        let strategy = self
            .strategy
            .as_ref()
            .map_err(|reason| DecisionError::NotServable(reason.to_string()))?
            .clone();
        crate::prompt::check_media(strategy.as_ref(), &request)?;
        // A fit that cannot apply is refused before anything is read.
        let calibration = request
            .calibration
            .as_ref()
            .map(|c| self.calibrations.resolve(c))
            .transpose()?;
        if request.joint && !strategy.supports_joint() {
            return Err(DecisionError::BadRequest {
                param: Some("joint".into()),
                message: format!(
                    "joint: this model ({} reads) reads each question on its own; joint reads need a block-diffusion model (DiffusionGemma)",
                    strategy.name()
                ),
            });
        }
        // Fetched (and every limit checked) before any prompt work; shared by every read of the request.
        let fetched: Arc<[ReadMedia]> = media::resolve(&request.media, &self.media, &self.fetcher)
            .await?
            .into_iter()
            .map(|blob| read_media(blob, &request.media, &self.media))
            .collect();
        let strategy_ref = strategy.clone();
        // A debiased request reads every question in each of its orders: one request of more
        // questions, sharing its state, whose answers are combined by name below.
        let mode = request.debias.unwrap_or(self.debias);
        let expansion = (mode != Debias::Off)
            .then(|| Expansion::new(&request, mode, self.max_orders, &self.priors));
        let read_request = match &expansion {
            Some(e) => Arc::new(e.request.clone()),
            None => request.clone(),
        };
        // From here until its reads are queued, a forming batch may wait for this request.
        let arrival = self.queue.arrival();
        // Rendering and tokenizing are CPU work: keep them off the async workers.
        let max_input_tokens = self.limits.max_input_tokens;
        let shared = read_request.clone();
        let prepared =
            tokio::task::spawn_blocking(move || strategy.prepare(&shared, max_input_tokens));
        let mut reads = prepared
            .await
            .map_err(|e| DecisionError::Internal(format!("prompt preparation panicked: {e}")))??;
        for read in &mut reads {
            read.media = fetched.clone();
        }
        let input_tokens = unique_prompt_tokens(&reads);
        if input_tokens > self.limits.max_input_tokens {
            return Err(DecisionError::TokensExceeded {
                got: input_tokens,
                limit: self.limits.max_input_tokens,
            });
        }
        let per_question_prompt_tokens: u64 = reads.iter().map(|r| r.token_ids.len() as u64).sum();
        // The queue and this request hold the same reads (a clone shares each one).
        let (outcomes, timing) = self
            .queue
            .read(
                reads.clone(),
                input_tokens,
                request.cache_salt.clone(),
                arrival,
                deadline,
            )
            .await?;
        let cached_tokens = outcomes
            .iter()
            .map(|o| o.tokens_cached as u64)
            .sum::<u64>()
            .min(input_tokens as u64);
        let computed_tokens: u64 = outcomes.iter().map(|o| o.tokens_computed as u64).sum();
        // Every read of a request carries the same media: their tokens count once in the request's
        // prompt, and in each question's prompt.
        let media_tokens = outcomes
            .iter()
            .map(|o| o.media_tokens as u64)
            .max()
            .unwrap_or(0);
        let per_question_media: u64 = outcomes.iter().map(|o| o.media_tokens as u64).sum();
        metrics::counter!("decision_prompt_tokens_total").increment(input_tokens as u64);
        metrics::counter!("decision_cached_tokens_total").increment(cached_tokens);
        metrics::counter!("decision_computed_tokens_total").increment(computed_tokens);
        let answers: Vec<_> = reads
            .iter()
            .zip(&outcomes)
            .flat_map(|(read, outcome)| strategy_ref.answers(read, outcome, temperature))
            .collect();
        if answers.len() != read_request.questions.len() {
            return Err(DecisionError::Internal(format!(
                "{} reads answered {} questions of {}",
                reads.len(),
                answers.len(),
                read_request.questions.len()
            )));
        }
        let (mut answers, orders) = match &expansion {
            Some(e) => {
                let (answers, reports) = e.combine(answers, &self.priors);
                (answers, Some(reports))
            }
            None => (answers, None),
        };
        // Calibration applies to the final probabilities: after the orders are combined.
        let calibration = calibration.map(|c| c.apply(&request.questions, &mut answers));
        metrics::counter!("decision_questions_total").increment(answers.len() as u64);
        let kept = keep_reads.then_some(reads);
        let usage = Usage {
            input_tokens: input_tokens as u64 + media_tokens,
            cached_tokens,
            per_question_prompt_tokens: per_question_prompt_tokens + per_question_media,
            pooled: !answers.is_empty() && answers.iter().all(|a| a.pooled),
        };
        Ok(Decided {
            decision: Decision {
                answers,
                usage,
                orders,
                calibration,
            },
            reads: kept,
            timing,
            prompt_format: strategy_ref.prompt_format(),
        })
    }
}

impl Decider {
    /// Scores reads built by the client (`/v1/score`): no rendering, the same queue and batching as the
    /// decision routes, the request token limit over their union.
    pub async fn score(
        &self,
        reads: Vec<PreparedRead>,
        budget: Option<Budget>,
    ) -> Result<(Vec<crate::read::ReadOutcome>, ReadTiming), DecisionError> {
        self.strategy
            .as_ref()
            .map_err(|reason| DecisionError::NotServable(reason.to_string()))?;
        let arrival = self.queue.arrival();
        let tokens = unique_prompt_tokens(&reads);
        if tokens > self.limits.max_input_tokens {
            return Err(DecisionError::TokensExceeded {
                got: tokens,
                limit: self.limits.max_input_tokens,
            });
        }
        metrics::counter!("decision_prompt_tokens_total").increment(tokens as u64);
        let Some(budget) = budget else {
            return self
                .queue
                .read(reads, tokens, String::new(), arrival, None)
                .await;
        };
        // The same deadline as a decision: 504 (or 503 for silent shards), its reads dropped.
        let deadline = tokio::time::Instant::now() + budget.limit;
        let work = self.queue.read(
            reads,
            tokens,
            String::new(),
            arrival,
            Some((deadline, budget)),
        );
        match tokio::time::timeout_at(deadline, work).await {
            Ok(read) => read,
            Err(_) => {
                metrics::counter!("decision_requests_timed_out_total").increment(1);
                Err(self.timed_out(budget).await)
            }
        }
    }
}

fn read_media(blob: MediaBlob, request: &Media, policy: &MediaPolicy) -> ReadMedia {
    let (max_seconds, max_frames) = match blob.modality {
        Modality::Image => (0.0, 0),
        Modality::Video => (policy.max_video_seconds, policy.max_video_frames),
        Modality::Audio => (policy.max_audio_seconds, 0),
    };
    ReadMedia {
        modality: blob.modality,
        // Shard errors about the item name where the request sent it (`images.0`, `input[0].content[1]`).
        name: Position::of(request, blob.modality, blob.index).to_string(),
        data: Arc::from(blob.bytes.as_ref()),
        sha256: blob.sha256.iter().map(|b| format!("{b:02x}")).collect(),
        max_seconds,
        max_frames,
    }
}

/// Tokens in the union of the reads' prompts when shared prefixes count once — what a one-pass
/// read of this request computes, independent of how it was batched with other requests.
pub fn unique_prompt_tokens(reads: &[PreparedRead]) -> usize {
    let mut prompts: Vec<&[u32]> = reads.iter().map(|r| r.token_ids.as_slice()).collect();
    prompts.sort_unstable();
    let mut total = 0;
    let mut previous: &[u32] = &[];
    for p in prompts {
        let shared = p.iter().zip(previous).take_while(|(a, b)| a == b).count();
        total += p.len() - shared;
        previous = p;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(ids: &[u32]) -> PreparedRead {
        PreparedRead::next_token(ids.to_vec(), vec![])
    }

    #[test]
    fn shared_prefixes_count_once() {
        assert_eq!(
            unique_prompt_tokens(&[read(&[1, 2, 3, 4]), read(&[1, 2, 5]), read(&[1, 2, 3, 6])]),
            4 + 1 + 1
        );
        assert_eq!(unique_prompt_tokens(&[read(&[1, 2]), read(&[1, 2])]), 2);
        assert_eq!(unique_prompt_tokens(&[read(&[7]), read(&[8, 9])]), 3);
        assert_eq!(unique_prompt_tokens(&[]), 0);
    }
}
