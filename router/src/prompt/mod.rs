//! From the decision IR to token sequences: the read strategy chosen by the model's architecture
//! renders each question with the chat template, tokenizes it, and attaches its label tokens.

pub mod encode;
pub mod labels;
pub mod template;
pub mod wording;

use std::path::Path;

use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use crate::error::DecisionError;
use crate::ir::{DecisionRequest, QuestionKind, Wording};
use encode::PromptEncoder;
use labels::LabelVocabulary;
use template::{ChatTemplate, Message};

/// One question ready for the shard: its whole prompt and the token sequence of every label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedRead {
    pub token_ids: Vec<u32>,
    pub labels: Vec<Vec<u32>>,
}

/// Turns a decision request into reads. One implementation per family of models.
pub trait ReadStrategy: Send + Sync {
    fn name(&self) -> &'static str;
    /// Why a question type cannot be served on this model, if it cannot.
    fn refusal(&self, kind: &QuestionKind) -> Option<String>;
    fn prepare(&self, request: &DecisionRequest) -> Result<Vec<PreparedRead>, DecisionError>;
}

/// Picks the read strategy for a model, by architecture (the registry).
pub fn strategy_for(
    architecture: &str,
    model_dir: &Path,
    max_positions: usize,
) -> Result<Box<dyn ReadStrategy>, String> {
    if architecture.ends_with("ForCausalLM") || architecture.ends_with("LMHeadModel") {
        return NextTokenStrategy::load(model_dir, max_positions)
            .map(|s| Box::new(s) as Box<dyn ReadStrategy>);
    }
    Err(format!("no read strategy for architecture '{architecture}': next-token reads need a causal language model"))
}

/// Next-token reads with vLLM's wording: one user message per question, thinking off,
/// labels checked to be single distinct tokens at the answer position.
pub struct NextTokenStrategy {
    encoder: PromptEncoder,
    template: ChatTemplate,
    labels: LabelVocabulary,
    max_positions: usize,
}

impl NextTokenStrategy {
    pub fn load(model_dir: &Path, max_positions: usize) -> Result<Self, String> {
        let tokenizer_path = model_dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| format!("cannot load {}: {e}", tokenizer_path.display()))?;
        let template = ChatTemplate::from_model_dir(model_dir).map_err(|e| e.to_string())?;
        let labels = LabelVocabulary::check(&tokenizer, &template, &thinking_off(&Map::new()))?;
        let encoder = PromptEncoder::new(tokenizer);
        if !encoder.shares_heads() {
            tracing::info!("this tokenizer is encoded in full per question (no shared-head cut is proven safe for it)");
        }
        if !encoder.encodes_pieces() {
            tracing::info!("prompts are encoded whole, not word by word (pieces are not proven independent for this tokenizer)");
        }
        Ok(NextTokenStrategy {
            encoder,
            template,
            labels,
            max_positions,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.encoder.tokenizer()
    }

    /// The rendered prompt text of each question (for tests and debugging).
    pub fn render(&self, request: &DecisionRequest) -> Result<Vec<String>, DecisionError> {
        let kwargs = checked_kwargs(&request.chat_template_kwargs)?;
        let wording = request.wording;
        let state = wording.state_text(&request.state);
        request
            .questions
            .iter()
            .map(|question| {
                let mut messages = Vec::with_capacity(2);
                let mut user = wording.user_message(&state, question);
                match &request.instructions {
                    Some(instructions) if wording.system_message() => messages.push(Message::new("system", instructions.clone())),
                    // SGLang's wording has no system message: the context leads the user message instead.
                    Some(instructions) => user = format!("{instructions}\n\n{user}"),
                    None => {}
                }
                messages.push(Message::new("user", user));
                let text = self.template.render(&messages, true, &kwargs).map_err(|e| DecisionError::BadRequest {
                    param: Some("chat_template_kwargs".into()),
                    message: e.to_string(),
                })?;
                if leaves_reasoning_open(&text) {
                    return Err(DecisionError::BadRequest {
                        param: Some("chat_template_kwargs".into()),
                        message: "the rendered prompt leaves a reasoning block open; a read is the reply's first token, so thinking must be off".into(),
                    });
                }
                Ok(text)
            })
            .collect()
    }
}

impl NextTokenStrategy {
    fn label_sequences(
        &self,
        kind: &QuestionKind,
        wording: Wording,
    ) -> Result<Vec<Vec<u32>>, String> {
        let n = kind.arity();
        self.labels
            .sequences(wording.scheme(kind, n), n)
            .map_err(|reason| {
                format!(
                    "this model cannot answer {} questions with {n} answers: {reason}",
                    kind_name(kind)
                )
            })
    }
}

impl ReadStrategy for NextTokenStrategy {
    fn name(&self) -> &'static str {
        "next_token"
    }

    fn refusal(&self, kind: &QuestionKind) -> Option<String> {
        self.label_sequences(kind, Wording::Vllm).err()
    }

    fn prepare(&self, request: &DecisionRequest) -> Result<Vec<PreparedRead>, DecisionError> {
        for question in &request.questions {
            self.label_sequences(&question.kind, request.wording)
                .map_err(DecisionError::NotServable)?;
            let max = request.wording.max_arity(&question.kind);
            if question.kind.arity() > max {
                return Err(DecisionError::NotServable(format!(
                    "question '{}': {} answers, but this read strategy labels at most {max}",
                    question.id,
                    question.kind.arity()
                )));
            }
        }
        let texts = self.render(request)?;
        let encoded = self
            .encoder
            .encode_all(&texts)
            .map_err(|e| DecisionError::Internal(format!("tokenizer: {e}")))?;
        let mut reads = Vec::with_capacity(texts.len());
        for (question, token_ids) in request.questions.iter().zip(encoded) {
            let labels = self
                .label_sequences(&question.kind, request.wording)
                .map_err(DecisionError::NotServable)?;
            // The label check holds only if the prompt ends with the probed reply prefix.
            if !token_ids.ends_with(&self.labels.tail) {
                return Err(DecisionError::Internal(format!(
                    "question '{}': the rendered prompt does not end with the chat template's reply prefix",
                    question.id
                )));
            }
            let longest_label = labels.iter().map(Vec::len).max().unwrap_or(1);
            if token_ids.len() + longest_label > self.max_positions {
                return Err(DecisionError::PromptTooLong {
                    question: question.id.clone(),
                    got: token_ids.len(),
                    limit: self.max_positions,
                });
            }
            reads.push(PreparedRead { token_ids, labels });
        }
        Ok(reads)
    }
}

pub fn kind_name(kind: &QuestionKind) -> &'static str {
    match kind {
        QuestionKind::Choice { .. } => "choice",
        QuestionKind::YesNo { .. } => "yes/no",
        QuestionKind::Score { .. } => "score",
    }
}

/// The caller's template variables with thinking forced off; thinking on is refused.
fn checked_kwargs(kwargs: &Map<String, Value>) -> Result<Map<String, Value>, DecisionError> {
    match kwargs.get("enable_thinking") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(thinking_off(kwargs)),
        Some(_) => Err(DecisionError::ThinkingOn),
    }
}

fn thinking_off(kwargs: &Map<String, Value>) -> Map<String, Value> {
    let mut kwargs = kwargs.clone();
    kwargs.insert("enable_thinking".into(), Value::Bool(false));
    kwargs
}

/// True when the last `<think>` comes after the last `</think>`.
fn leaves_reasoning_open(text: &str) -> bool {
    match (text.rfind("<think>"), text.rfind("</think>")) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_block_detection() {
        assert!(!leaves_reasoning_open(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(leaves_reasoning_open("<|im_start|>assistant\n<think>\n"));
        assert!(!leaves_reasoning_open("plain"));
    }

    #[test]
    fn thinking_on_is_refused_and_off_is_forced() {
        let mut on = Map::new();
        on.insert("enable_thinking".into(), Value::Bool(true));
        assert!(matches!(
            checked_kwargs(&on),
            Err(DecisionError::ThinkingOn)
        ));
        let mut text = Map::new();
        text.insert("enable_thinking".into(), Value::String("yes".into()));
        assert!(matches!(
            checked_kwargs(&text),
            Err(DecisionError::ThinkingOn)
        ));
        let off = checked_kwargs(&Map::new()).unwrap();
        assert_eq!(off.get("enable_thinking"), Some(&Value::Bool(false)));
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

#[cfg(test)]
mod model_tests {
    //! Label checks and prepared reads on the real tokenizers and chat templates of the fixtures.
    use super::*;
    use crate::ir::{ChoiceOption, Question};

    fn request(questions: Vec<Question>) -> DecisionRequest {
        DecisionRequest {
            state: serde_json::json!({"ticket": "Refund not received", "days": 12}),
            instructions: Some("You route tickets.".into()),
            questions,
            chat_template_kwargs: Map::new(),
            cache_salt: String::new(),
            wording: Wording::Vllm,
        }
    }

    fn all_kinds(n_options: usize) -> Vec<Question> {
        vec![
            Question {
                id: "team".into(),
                instructions: Some("Which team?".into()),
                kind: QuestionKind::Choice {
                    options: (0..n_options)
                        .map(|i| ChoiceOption {
                            name: format!("team {i}"),
                            description: None,
                        })
                        .collect(),
                },
            },
            Question {
                id: "urgent".into(),
                instructions: Some("Urgent?".into()),
                kind: QuestionKind::YesNo {
                    yes: None,
                    no: None,
                },
            },
            Question {
                id: "tone".into(),
                instructions: None,
                kind: QuestionKind::Score {
                    levels: vec!["calm".into(), "angry".into()],
                },
            },
        ]
    }

    #[test]
    fn every_label_set_passes_on_both_fixtures() {
        for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"] {
            let s = NextTokenStrategy::load(&fixture_dir(name), 4096).unwrap();
            assert!(s.labels.letters.is_ok(), "{name}: {:?}", s.labels.letters);
            assert!(s.labels.yes_no.is_ok(), "{name}: {:?}", s.labels.yes_no);
            assert!(s.labels.digits.is_ok(), "{name}: {:?}", s.labels.digits);
            let codes = s.labels.codes.as_ref().unwrap();
            assert_eq!(codes.len(), wording::MAX_OPTION_CODES);
            let distinct: std::collections::HashSet<&Vec<u32>> = codes.iter().collect();
            assert_eq!(distinct.len(), codes.len(), "{name}: option codes collide");
        }
    }

    #[test]
    fn qwen3_reply_prefix_is_after_the_empty_think_block() {
        let s = NextTokenStrategy::load(&fixture_dir("tiny-qwen3"), 4096).unwrap();
        let reads = s.prepare(&request(all_kinds(3))).unwrap();
        let text = s.render(&request(all_kinds(3))).unwrap();
        assert!(
            text[0].ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            "{:?}",
            text[0]
        );
        assert_eq!(s.tokenizer().decode(&s.labels.tail, false).unwrap(), "\n\n");
        assert_eq!(reads.len(), 3);
        assert_eq!(reads[0].labels.len(), 3);
        assert_eq!(reads[1].labels.len(), 2);
        assert!(reads.iter().all(|r| r.labels.iter().all(|l| l.len() == 1)));
    }

    #[test]
    fn smollm2_prompt_is_the_chat_template_of_the_vllm_wording() {
        let s = NextTokenStrategy::load(&fixture_dir("SmolLM2-135M-Instruct"), 8192).unwrap();
        let text = s.render(&request(all_kinds(2))).unwrap();
        assert_eq!(
            text[0],
            "<|im_start|>system\nYou route tickets.<|im_end|>\n<|im_start|>user\n{\"ticket\": \"Refund not received\", \"days\": 12}\n\nQuestion: Which team?\nA: team 0\nB: team 1\nAnswer with the letter of one option only.<|im_end|>\n<|im_start|>assistant\n"
        );
        let reads = s.prepare(&request(all_kinds(2))).unwrap();
        let letters: Vec<String> = reads[0]
            .labels
            .iter()
            .map(|l| s.tokenizer().decode(l, false).unwrap())
            .collect();
        assert_eq!(letters, vec!["A", "B"]);
        let yes_no: Vec<String> = reads[1]
            .labels
            .iter()
            .map(|l| s.tokenizer().decode(l, false).unwrap())
            .collect();
        assert_eq!(yes_no, vec!["yes", "no"]);
    }

    #[test]
    fn many_options_are_exact_sequences_closed_by_end_of_turn() {
        let s = NextTokenStrategy::load(&fixture_dir("SmolLM2-135M-Instruct"), 8192).unwrap();
        let reads = s.prepare(&request(all_kinds(255))).unwrap();
        let labels = &reads[0].labels;
        assert_eq!(labels.len(), 255);
        let eot = s.tokenizer().token_to_id("<|im_end|>").unwrap();
        assert!(labels
            .iter()
            .all(|l| l.len() >= 2 && *l.last().unwrap() == eot));
        assert_eq!(
            s.tokenizer()
                .decode(&labels[27][..labels[27].len() - 1], false)
                .unwrap(),
            "AB"
        );
    }

    #[test]
    fn thinking_on_and_prompts_too_long_are_refused() {
        let s = NextTokenStrategy::load(&fixture_dir("tiny-qwen3"), 24).unwrap();
        let mut r = request(all_kinds(2));
        r.chat_template_kwargs
            .insert("enable_thinking".into(), Value::Bool(true));
        assert!(matches!(s.prepare(&r), Err(DecisionError::ThinkingOn)));
        let long = request(all_kinds(2));
        assert!(matches!(
            s.prepare(&long),
            Err(DecisionError::PromptTooLong { .. })
        ));
    }

    #[test]
    fn a_template_that_splits_labels_refuses_them() {
        let dir = fixture_dir("tiny-qwen3");
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        // A reply prefix ending in a space: " A" is one token that swallows the space, so the prefix changes.
        let template =
            ChatTemplate::new("<|im_start|>user\n{{ messages[0].content }}<|im_end|>\n<|im_start|>assistant\nAnswer: ".into(), Map::new()).unwrap();
        let labels = LabelVocabulary::check(&tokenizer, &template, &Map::new()).unwrap();
        let reason = labels.letters.unwrap_err();
        assert!(
            reason.contains("label 'A' is not a single token"),
            "{reason}"
        );
    }
}
