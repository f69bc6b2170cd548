//! What the HTTP tests share: the app over no shards and no model, and one-line requests.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use axum::response::Response;
use clap::Parser;
use http_body_util::BodyExt;
use tower::ServiceExt;

use decision_proto::v1 as pb;

use super::routes::app;
use super::state::{build_state, AppState};
use crate::config::Config;
use crate::error::DecisionError;
use crate::ir::{DecisionRequest, QuestionKind};
use crate::prompt::wording::PromptFormat;
use crate::prompt::{LabelGroup, PreparedRead, ReadStrategy};
use crate::queue::{Queue, QueueConfig, ReadBackend};
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

pub(super) fn post_json(path: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// The app over a next-token model (`StandInStrategy`) whose reads `shard` answers.
pub(super) fn state_reading_from(shard: HeldShard) -> Arc<AppState> {
    state_reading_from_with(shard, &[])
}

/// `state_reading_from`, with router flags.
pub(super) fn state_reading_from_with(shard: HeldShard, flags: &[&str]) -> Arc<AppState> {
    let mut shards = ShardSet::detached();
    shards.info.engine = "tree".into();
    shards.info.vocab_size = 100;
    let mut args = vec!["decision-router", "--model-dir", "/m"];
    args.extend_from_slice(flags);
    let config = Config::parse_from(args);
    let mut state = build_state(config, shards).unwrap();
    state.decider.strategy = Ok(Arc::new(StandInStrategy));
    // The calibrations of a server that reads with the stand-in (build_state saw no strategy).
    let provenance = crate::calibration::Provenance::of_server(
        &state.model_name,
        &state.shards.info.architecture,
        state.shards.info.vocab_size,
        &state.config.model_dir(),
        StandInStrategy.prompt_format(),
    );
    state.decider.calibrations = Arc::new(
        crate::calibration::Book::open(state.config.flags.data_dir.as_deref(), Some(provenance))
            .unwrap(),
    );
    state.decider.queue = Queue::start(
        shard,
        QueueConfig {
            max_batch_prefill_tokens: 1000,
            max_batch_wait: Duration::ZERO,
            max_queued_reads: state.config.flags.max_queued_reads,
            max_batches_at_shard: 2,
        },
    );
    Arc::new(state)
}

/// One small valid request per decision route (both `/v1/decisions` shapes): the routes every
/// decision-prologue behaviour is tested on.
pub(super) const DECISION_BODIES: [(&str, &str); 4] = [
    (
        "/v1/score",
        r#"{"query": [1, 2], "items": [[3]], "label_token_ids": [7, 8]}"#,
    ),
    (
        "/v1/systemone",
        r#"{"state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}"#,
    ),
    (
        "/v1/decisions",
        r#"{"model": "m", "input": "s", "questions": [{"type": "predicate", "instructions": "?"}]}"#,
    ),
    (
        "/v1/decisions",
        r#"{"input": "s", "questions": [{"id": "q", "type": "yes_no", "question": "?"}]}"#,
    ),
];

/// A shard that holds every batch until the test lets it go, then gives each label log-probability -1.
#[derive(Clone)]
pub(super) struct HeldShard {
    /// Notified when a batch reaches the shard.
    pub arrived: Arc<tokio::sync::Notify>,
    /// One permit lets one batch go.
    pub released: Arc<tokio::sync::Semaphore>,
}

impl HeldShard {
    pub fn new() -> Self {
        HeldShard {
            arrived: Arc::default(),
            released: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }
}

impl ReadBackend for HeldShard {
    async fn read(&self, reads: Vec<pb::Read>) -> Result<pb::ReadResponse, DecisionError> {
        self.arrived.notify_one();
        let _go = self.released.acquire().await;
        let results = reads
            .into_iter()
            .map(|read| {
                let Some(pb::read::Kind::NextToken(r)) = read.kind else {
                    panic!("next-token reads only")
                };
                pb::ReadResult {
                    id: read.id,
                    tokens_computed: r.token_ids.len() as u32,
                    kind: Some(pb::read_result::Kind::NextToken(pb::NextTokenResult {
                        greedy_token_id: r.labels[0].variants[0].token_ids[0],
                        labels: r
                            .labels
                            .iter()
                            .map(|group| pb::LabelGroupLogprobs {
                                variant_logprobs: vec![-1.0; group.variants.len()],
                            })
                            .collect(),
                    })),
                    ..Default::default()
                }
            })
            .collect();
        Ok(pb::ReadResponse {
            results,
            ..Default::default()
        })
    }
}

/// One next-token read per question: three prompt tokens, one single-token label per answer.
pub(super) struct StandInStrategy;

impl ReadStrategy for StandInStrategy {
    fn name(&self) -> &'static str {
        "stand-in"
    }

    fn prompt_format(&self) -> PromptFormat {
        PromptFormat::VLLM
    }

    fn refusal(&self, _kind: &QuestionKind) -> Option<String> {
        None
    }

    fn prepare(
        &self,
        request: &DecisionRequest,
        _max_input_tokens: usize,
    ) -> Result<Vec<PreparedRead>, DecisionError> {
        Ok(request
            .questions
            .iter()
            .map(|q| {
                let labels = (0..q.kind.arity() as u32)
                    .map(|i| LabelGroup::single(vec![10 + i]))
                    .collect();
                PreparedRead::next_token(vec![1, 2, 3], labels)
            })
            .collect())
    }
}
