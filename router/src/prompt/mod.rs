//! From the decision IR to reads and back: the read strategy chosen by the model's architecture
//! (`registry`) renders and tokenizes each request, attaches its labels, and turns read results into answers.

pub mod canvas;
pub mod chat;
pub mod encode;
pub mod joint_schema;
pub mod labels;
pub mod liquid;
pub mod load_error;
pub mod next_token;
pub mod registry;
pub mod template;
pub mod token_bound;
pub mod wording;

use crate::error::DecisionError;
use crate::ir::{Answer, DecisionRequest, Modality, QuestionKind};
use crate::probability;
use crate::read::{first_tokens, ReadOutcome, RowOutcome};
pub use crate::read::{LabelGroup, PreparedRead};
pub use next_token::NextTokenStrategy;
pub use registry::{strategy_for, RegistryError, ShardReadKind};
use wording::{PromptFormat, Wording};

/// What the registry loads a strategy with, besides the model folder.
#[derive(Clone, Debug)]
pub struct StrategyOptions {
    /// The model's context length: prompts beyond it are refused.
    pub max_positions: usize,
    /// The profile's wording; a strategy that owns its wording (Liquid d1) ignores it.
    pub wording: Wording,
    /// The media kinds the strategy reads: the shard's Info `modalities`, which its registry decides
    /// (what the architecture reads, narrowed to what the folder's processor takes).
    pub modalities: Vec<Modality>,
}

/// Turns a decision request into reads, and their results into answers. One implementation per
/// family of models, chosen by the registry (`strategy_for`).
pub trait ReadStrategy: Send + Sync {
    fn name(&self) -> &'static str;
    /// The wording this strategy renders in (`/info`, SGLang's `prompt_format_version`).
    fn prompt_format(&self) -> PromptFormat;
    /// Why a question type cannot be served on this model, if it cannot.
    fn refusal(&self, kind: &QuestionKind) -> Option<String>;
    /// The media kinds this strategy reads; a request carrying any other kind is refused naming it.
    fn modalities(&self) -> &[Modality] {
        &[]
    }
    /// Why this strategy refuses a medium, when there is more to say than that the model does not take
    /// it (appended to the 400).
    fn media_refusal(&self, _modality: Modality) -> Option<&'static str> {
        None
    }
    /// One read per question, in question order. A prompt that certainly needs more than
    /// `max_input_tokens` is refused before it is tokenized.
    fn prepare(
        &self,
        request: &DecisionRequest,
        max_input_tokens: usize,
    ) -> Result<Vec<PreparedRead>, DecisionError>;
    /// Whether `joint: true` (several questions read together) is served; strategies that read each
    /// question on its own refuse it (400 naming the field).
    fn supports_joint(&self) -> bool {
        false
    }
    /// The answers one read's (shape-checked) outcome gives, one per question it holds, in question
    /// order. `temperature` divides the label log-probabilities before the softmax; label mass is
    /// unaffected. The default is the next-token rule on every answer position (one for a next-token
    /// read, one per row of a canvas).
    fn answers(&self, read: &PreparedRead, outcome: &ReadOutcome, temperature: f64) -> Vec<Answer> {
        read.question_labels()
            .into_iter()
            .zip(&outcome.rows)
            .map(|(labels, row)| label_answer(labels, row, temperature))
            .collect()
    }
}

/// A next-token answer: softmax over each label's best variant, mass over every variant, and whether
/// the model's own top token starts a label.
pub fn label_answer(labels: &[LabelGroup], row: &RowOutcome, temperature: f64) -> Answer {
    let argmax_is_label = first_tokens(labels).any(|t| t == row.greedy_token_id);
    probability::answer(
        row.label_logprobs(),
        row.label_mass(),
        argmax_is_label,
        temperature,
    )
}

/// Refuses media the strategy does not read (never ignored: an ignored image is a wrong answer with a 200).
pub fn check_media(
    strategy: &dyn ReadStrategy,
    request: &DecisionRequest,
) -> Result<(), DecisionError> {
    let taken = strategy.modalities();
    match request
        .media
        .present()
        .into_iter()
        .find(|m| !taken.contains(m))
    {
        None => Ok(()),
        Some(modality) => Err(DecisionError::BadRequest {
            param: Some(modality.field().into()),
            message: format!(
                "{}: this model ({} reads) does not take {} inputs{}",
                modality.field(),
                strategy.name(),
                modality.noun(),
                strategy
                    .media_refusal(modality)
                    .map(|why| format!(": {why}"))
                    .unwrap_or_default()
            ),
        }),
    }
}

/// Model folders built by `make fixtures` (the embedded SmolLM2 export and the tiny Qwen3).
#[cfg(test)]
pub(crate) fn fixture_dir(name: &str) -> std::path::PathBuf {
    let cache = std::env::var_os("DECISION_CACHE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/decision-inference")
        });
    let dir = cache.join("models").join(name);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "fixture {} is missing: run `make fixtures` first",
        dir.display()
    );
    dir
}
