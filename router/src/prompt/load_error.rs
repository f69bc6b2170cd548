//! Why a read strategy cannot load for a model folder: each variant names the file, token or setting and,
//! where there is one, the limit. The registry wraps it with the architecture (`RegistryError::Load`).

use std::path::PathBuf;

use super::labels::LabelError;
use super::template::TemplateError;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load {}: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The startup label check of every chat-template strategy.
    #[error(transparent)]
    Labels(#[from] LabelError),
    /// Liquid d1 reads every label set; one that is not single tokens refuses the model.
    #[error("Liquid reads need the {set} as single tokens: {reason}")]
    LiquidLabels {
        set: &'static str,
        reason: LabelError,
    },
    #[error("tokenizing {text:?} failed: {message}")]
    Tokenize { text: String, message: String },
    /// The joint-schema prompt's own tokenizer errors (Clef).
    #[error("tokenizer: {0}")]
    SchemaTokenizer(String),
    #[error("the tokenizer has no '{token}' token, which the joint-schema prompt needs")]
    SchemaToken { token: &'static str },
    /// `end_of_turn` the canvas's end-of-turn marker (`canvas::END_OF_TURN`).
    #[error(
        "DiffusionGemma canvas reads need the model's '{}' and pad tokens: {}",
        .end_of_turn,
        canvas_tokens_missing(.end_of_turn, *.end_of_turn_missing, *.pad_missing)
    )]
    CanvasTokens {
        end_of_turn: &'static str,
        end_of_turn_missing: bool,
        pad_missing: bool,
    },
    #[error("decoding the thought block failed: {0}")]
    DecodeThought(String),
    /// `thought` the thought block the labels follow (`canvas::THOUGHT`).
    #[error(
        "canvas reads need every label as one token after the thought block {thought:?}: {reason}"
    )]
    LabelsAfterThought {
        thought: &'static str,
        reason: LabelError,
    },
    #[error("cannot read {}: {message}", path.display())]
    ReadConfig { path: PathBuf, message: String },
    #[error("{}: {message}", path.display())]
    ParseConfig { path: PathBuf, message: String },
    #[error("config.json has no vocab_size")]
    NoVocabSize,
    #[error("config.json canvas_length is not a number")]
    CanvasLengthNotNumber,
    /// `step` the shortest canvas (`canvas::CANVAS_STEP`).
    #[error("canvas reads need a canvas of {step}, and the served canvas is {served} (config.json canvas_length)")]
    CanvasTooShort { step: usize, served: usize },
}

/// What a DiffusionGemma tokenizer lacks, in the order the reference checks it.
fn canvas_tokens_missing(
    end_of_turn: &str,
    end_of_turn_missing: bool,
    pad_missing: bool,
) -> String {
    [
        end_of_turn_missing.then(|| format!("'{end_of_turn}' is not one token of this tokenizer")),
        pad_missing
            .then(|| "the tokenizer has no pad token (tokenizer_config.json pad_token)".to_owned()),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join("; ")
}

/// Why joint canvases cannot be written for a tokenizer (joint reads are then refused, naming it).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum JointLinesError {
    #[error("tokenizing {text:?} failed: {message}")]
    Tokenize { text: String, message: String },
    #[error("a newline is not one token")]
    NewlineNotOneToken,
    #[error("the answer line {line:?} encodes to nothing")]
    EmptyLine { line: String },
    #[error("the answer line {line:?} does not tokenize as a prefix and one label token")]
    NotPrefixAndLabel { line: String },
}
