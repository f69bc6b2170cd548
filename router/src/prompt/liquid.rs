//! Liquid d1 reads (LFM2-VL decision models, spec/PROMPTS.md §5): the state as indented JSON, a
//! `QUESTION:` block per question, option codes, and label groups of every single-token spelling.

use std::path::Path;

use serde_json::Value;

use super::chat::{checked_kwargs, ChatPrompts};
use super::load_error::LoadError;
use super::wording::PromptFormat;
use super::{ReadStrategy, StrategyOptions};
use crate::error::DecisionError;
use crate::ir::{ChoiceOption, DecisionRequest, Modality, Question, QuestionKind};
use crate::json_text;
use crate::question_kind::{Kind, DIGITS, LETTERS};
use crate::read::{LabelGroup, PreparedRead};

pub const CHOICE_REPLY: &str = "Reply with the option code only.";
pub const YES_NO_REPLY: &str = "Reply with yes or no only.";
/// Its reply shown no side first (a debiased read's second label order).
pub const NO_YES_REPLY: &str = "Reply with no or yes only.";

pub struct LiquidStrategy {
    chat: ChatPrompts,
    /// Images, when the folder has the model's processor.
    modalities: Vec<Modality>,
}

impl LiquidStrategy {
    /// Liquid's templates must pass the same startup label check as every next-token model.
    pub fn load(model_dir: &Path, max_positions: usize) -> Result<Self, LoadError> {
        let chat = ChatPrompts::load(model_dir, max_positions)?;
        for kind in Kind::ALL {
            if let Err(reason) = chat.labels.single(kind) {
                return Err(LoadError::LiquidLabels {
                    set: kind.labels_name(),
                    reason: reason.clone(),
                });
            }
        }
        Ok(LiquidStrategy {
            chat,
            modalities: Vec::new(),
        })
    }

    /// Liquid d1 owns its wording: the profile's is not used.
    pub fn boxed(
        model_dir: &Path,
        options: &StrategyOptions,
    ) -> Result<Box<dyn ReadStrategy>, LoadError> {
        let mut strategy = Self::load(model_dir, options.max_positions)?;
        strategy.modalities = options.modalities.clone();
        Ok(Box::new(strategy))
    }

    /// The rendered prompt text of each question (for tests and debugging).
    pub fn render(&self, request: &DecisionRequest) -> Result<Vec<String>, DecisionError> {
        let kwargs = checked_kwargs(&request.chat_template_kwargs)?;
        let state = state_text(&request.state);
        let instructions = request.instructions.as_deref().filter(|i| !i.is_empty());
        let media = ChatPrompts::media_parts(&request.media);
        request
            .questions
            .iter()
            .map(|question| {
                let messages =
                    ChatPrompts::messages(instructions, true, &media, content(&state, question));
                self.chat.render(&messages, &kwargs)
            })
            .collect()
    }

    /// Each label's spellings that are one token on their own (the first must be), none shared with
    /// an earlier label: `yes|Yes|YES`, `code|" "+code`, a digit.
    fn label_groups(&self, question: &Question) -> Result<Vec<LabelGroup>, DecisionError> {
        let forms: Vec<Vec<String>> = match &question.kind {
            QuestionKind::YesNo { .. } => vec![
                vec!["yes".into(), "Yes".into(), "YES".into()],
                vec!["no".into(), "No".into(), "NO".into()],
            ],
            QuestionKind::Choice { options } => codes(options)
                .into_iter()
                .map(|code| vec![code.clone(), format!(" {code}")])
                .collect(),
            QuestionKind::Score { levels, .. } => DIGITS[..levels.len()]
                .iter()
                .map(|d| vec![(*d).to_owned()])
                .collect(),
        };
        let mut taken: Vec<u32> = Vec::new();
        let mut groups = Vec::with_capacity(forms.len());
        for label_forms in forms {
            let mut variants: Vec<Vec<u32>> = Vec::new();
            for form in &label_forms {
                if let Some(id) = self.single_token(form) {
                    if !variants.iter().any(|v| v[0] == id) {
                        variants.push(vec![id]);
                    }
                }
            }
            let canonical = self.single_token(&label_forms[0]);
            let distinct = variants.iter().all(|v| !taken.contains(&v[0]));
            if variants.is_empty() || canonical != Some(variants[0][0]) || !distinct {
                return Err(DecisionError::BadRequest {
                    param: Some(format!("questions.{}", question.id)),
                    message: format!(
                        "question '{}': label '{}' is not one distinct token for this model",
                        question.id, label_forms[0]
                    ),
                });
            }
            taken.extend(variants.iter().map(|v| v[0]));
            groups.push(LabelGroup { variants });
        }
        Ok(groups)
    }

    fn single_token(&self, form: &str) -> Option<u32> {
        let encoding = self.chat.tokenizer().encode(form, false).ok()?;
        match encoding.get_ids() {
            [id] => Some(*id),
            _ => None,
        }
    }
}

impl ReadStrategy for LiquidStrategy {
    fn name(&self) -> &'static str {
        "liquid"
    }

    fn prompt_format(&self) -> PromptFormat {
        PromptFormat::LIQUID_D1
    }

    fn modalities(&self) -> &[Modality] {
        &self.modalities
    }

    fn refusal(&self, _kind: &QuestionKind) -> Option<String> {
        None
    }

    fn prepare(
        &self,
        request: &DecisionRequest,
        max_input_tokens: usize,
    ) -> Result<Vec<PreparedRead>, DecisionError> {
        for question in &request.questions {
            let (n, max) = (question.kind.arity(), question.kind.kind().labels().len());
            if n > max {
                return Err(DecisionError::BadRequest {
                    param: Some(format!("questions.{}", question.id)),
                    message: format!(
                        "question '{}': at most {max} options for this model, got {n}",
                        question.id
                    ),
                });
            }
        }
        let groups = request
            .questions
            .iter()
            .map(|q| self.label_groups(q))
            .collect::<Result<Vec<_>, _>>()?;
        let texts = self.render(request)?;
        let encoded = self.chat.encode_all(&texts, max_input_tokens)?;
        let mut reads = Vec::with_capacity(texts.len());
        for ((question, token_ids), labels) in request.questions.iter().zip(encoded).zip(groups) {
            self.chat.check_prompt(&question.id, &token_ids, &labels)?;
            reads.push(PreparedRead::next_token(token_ids, labels));
        }
        Ok(reads)
    }
}

/// null → nothing, a string as is, anything else `json.dumps(x, ensure_ascii=False, indent=2)`.
pub fn state_text(state: &Value) -> String {
    match state {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => json_text::dumps_indented(other),
    }
}

/// The user message: `"{state}\n\n\nQUESTION:\n{ask}"`, or the ask alone when the state is empty.
pub fn content(state: &str, question: &Question) -> String {
    let ask = ask(question);
    if state.is_empty() {
        ask
    } else {
        format!("{state}\n\n\nQUESTION:\n{ask}")
    }
}

fn ask(question: &Question) -> String {
    let instructions = question.instructions.as_deref().unwrap_or("");
    match &question.kind {
        QuestionKind::Choice { options } => {
            let lines: Vec<String> = codes(options)
                .iter()
                .zip(options)
                .map(|(code, option)| {
                    // A description replaces the name; a bare name shows with spaces for underscores.
                    let text = match option.description.as_deref().filter(|d| !d.is_empty()) {
                        Some(description) => description.to_owned(),
                        None => option.name.replace('_', " "),
                    };
                    format!("{code} {text}")
                })
                .collect();
            format!(
                "{instructions}\n\nOptions:\n{}\n\n{CHOICE_REPLY}",
                lines.join("\n")
            )
        }
        QuestionKind::YesNo { yes, no, no_first } => {
            let truthy = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
            // A side that was not given prints as Python's `None`, as the reference's f-string does.
            let side = |s: &Option<String>| s.clone().unwrap_or_else(|| "None".into());
            let (sides, reply) = match (truthy(yes) || truthy(no), *no_first) {
                (false, false) => (String::new(), YES_NO_REPLY),
                (false, true) => (String::new(), NO_YES_REPLY),
                (true, false) => (
                    format!("\nYes: {}\nNo: {}", side(yes), side(no)),
                    YES_NO_REPLY,
                ),
                (true, true) => (
                    format!("\nNo: {}\nYes: {}", side(no), side(yes)),
                    NO_YES_REPLY,
                ),
            };
            format!("{instructions}{sides}\n\n{reply}")
        }
        QuestionKind::Score { levels, .. } => {
            let legend: Vec<String> = levels
                .iter()
                .enumerate()
                .map(|(i, level)| format!("{i} {level}"))
                .collect();
            format!(
                "{instructions}\n\n{}\n\nReply with a single digit 0-{} only.",
                legend.join("\n"),
                levels.len().saturating_sub(1)
            )
        }
    }
}

/// The option names themselves when every trimmed name is one letter (case kept), else A, B, … .
pub fn codes(options: &[ChoiceOption]) -> Vec<String> {
    let one_letter = |name: &str| {
        let mut chars = name.trim().chars();
        matches!((chars.next(), chars.next()), (Some(c), None) if c.is_alphabetic())
    };
    if !options.is_empty() && options.iter().all(|o| one_letter(&o.name)) {
        options.iter().map(|o| o.name.trim().to_owned()).collect()
    } else {
        LETTERS[..options.len().min(LETTERS.len())]
            .iter()
            .map(|l| (*l).to_owned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn question(id: &str, instructions: Option<&str>, kind: QuestionKind) -> Question {
        Question {
            id: id.into(),
            instructions: instructions.map(Into::into),
            kind,
        }
    }

    fn choice(options: &[(&str, Option<&str>)]) -> QuestionKind {
        QuestionKind::Choice {
            options: options
                .iter()
                .map(|(name, description)| ChoiceOption {
                    name: (*name).into(),
                    description: description.map(Into::into),
                })
                .collect(),
        }
    }

    fn noul(yes: Option<&str>, no: Option<&str>) -> QuestionKind {
        QuestionKind::YesNo {
            yes: yes.map(Into::into),
            no: no.map(Into::into),
            no_first: false,
        }
    }

    // The goldens below are the reference's own outputs (vLLM 0.32 LiquidStrategy) for the same inputs.

    #[test]
    fn choice_with_an_indented_json_state() {
        let state = state_text(&json!({"ticket": "Refund not received", "days": 12}));
        let q = question(
            "intent",
            Some("What does the customer want?"),
            choice(&[("refund", Some("money back")), ("order_status", None)]),
        );
        assert_eq!(
            content(&state, &q),
            "{\n  \"ticket\": \"Refund not received\",\n  \"days\": 12\n}\n\n\nQUESTION:\nWhat does the customer want?\n\nOptions:\nA money back\nB order status\n\nReply with the option code only."
        );
    }

    #[test]
    fn null_state_and_a_missing_side_printed_as_none() {
        let state = state_text(&Value::Null);
        assert_eq!(state, "");
        let q = question(
            "urgent",
            Some("Is it urgent?"),
            noul(Some("locked account"), None),
        );
        assert_eq!(
            content(&state, &q),
            "Is it urgent?\nYes: locked account\nNo: None\n\nReply with yes or no only."
        );
        let empty_side = question(
            "urgent",
            Some("Is it urgent?"),
            noul(Some(""), Some("fine")),
        );
        assert_eq!(
            content("", &empty_side),
            "Is it urgent?\nYes: \nNo: fine\n\nReply with yes or no only."
        );
    }

    #[test]
    fn plain_state_with_no_instructions_or_sides() {
        let q = question("urgent", None, noul(None, None));
        assert_eq!(
            content(&state_text(&json!("plain")), &q),
            "plain\n\n\nQUESTION:\n\n\nReply with yes or no only."
        );
    }

    #[test]
    fn score_levels_are_raw_and_digits_count_from_zero() {
        let q = question(
            "tone",
            Some("How upset?"),
            QuestionKind::score(vec!["calm".into(), "very_angry".into()]),
        );
        assert_eq!(
            content("plain", &q),
            "plain\n\n\nQUESTION:\nHow upset?\n\n0 calm\n1 very_angry\n\nReply with a single digit 0-1 only."
        );
    }

    #[test]
    fn single_letter_names_are_their_own_codes() {
        let kind = choice(&[("a", None), (" B ", Some("bee"))]);
        let QuestionKind::Choice { options } = &kind else {
            unreachable!()
        };
        assert_eq!(codes(options), vec!["a", "B"]);
        assert!(content("", &question("q", Some("Pick"), kind.clone()))
            .contains("Options:\na a\nB bee\n"));
        let mixed = choice(&[("a", None), ("bb", None)]);
        let QuestionKind::Choice { options } = &mixed else {
            unreachable!()
        };
        assert_eq!(codes(options), vec!["A", "B"]);
        let digit = choice(&[("1", None), ("2", None)]);
        let QuestionKind::Choice { options } = &digit else {
            unreachable!()
        };
        assert_eq!(codes(options), vec!["A", "B"], "digits are not letters");
    }

    #[test]
    fn state_strings_pass_through_and_nested_json_indents() {
        assert_eq!(state_text(&json!("as is")), "as is");
        assert_eq!(
            state_text(&json!({"a": [1, {"b": null}]})),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ]\n}"
        );
    }

    /// The label groups on the tiny LFM2-VL fixture's tokenizer (ids from `tokenizers` in Python).
    #[test]
    fn label_groups_on_the_fixture_tokenizer() {
        let s =
            LiquidStrategy::load(&crate::prompt::fixture_dir("tiny-lfm2-vl"), 4096).expect("loads");
        let request = DecisionRequest {
            state: json!({"ticket": "late"}),
            instructions: Some("You route tickets.".into()),
            questions: vec![
                question("urgent", Some("Urgent?"), noul(None, None)),
                question(
                    "team",
                    Some("Team?"),
                    choice(&[("billing", None), ("tech", None)]),
                ),
                question("case", Some("Case?"), choice(&[("a", None), ("B", None)])),
                question(
                    "tone",
                    Some("Tone?"),
                    QuestionKind::score((0..10).map(|i| format!("level {i}")).collect()),
                ),
            ],
            chat_template_kwargs: Default::default(),
            cache_salt: String::new(),
            media: Default::default(),
            joint: false,
            debias: None,
            calibration: None,
        };
        let reads = s.prepare(&request, usize::MAX).expect("prepares");
        let ids = |r: &PreparedRead| -> Vec<Vec<Vec<u32>>> {
            r.question_labels()[0]
                .iter()
                .map(|g| g.variants.clone())
                .collect()
        };
        assert_eq!(
            ids(&reads[0]),
            vec![
                vec![vec![757], vec![759], vec![761]],
                vec![vec![762], vec![763], vec![764]]
            ]
        );
        assert_eq!(
            ids(&reads[1]),
            vec![vec![vec![565], vec![914]], vec![vec![566], vec![915]]]
        );
        assert_eq!(
            ids(&reads[2]),
            vec![vec![vec![597], vec![955]], vec![vec![566], vec![915]]]
        );
        assert_eq!(ids(&reads[3])[0], vec![vec![548]]);
        assert_eq!(ids(&reads[3])[9], vec![vec![557]]);
        // Rendered through the checkpoint's template: instructions as the system message, thinking off.
        let texts = s.render(&request).expect("renders");
        assert!(texts[0].contains("You route tickets."), "{}", texts[0]);
        assert!(texts[0].contains("{\n  \"ticket\": \"late\"\n}\n\n\nQUESTION:\nUrgent?\n\nReply with yes or no only."), "{}", texts[0]);
    }

    #[test]
    fn a_code_that_is_not_one_token_is_refused_naming_it() {
        let s =
            LiquidStrategy::load(&crate::prompt::fixture_dir("tiny-lfm2-vl"), 4096).expect("loads");
        let request = DecisionRequest {
            state: json!("x"),
            instructions: None,
            questions: vec![question(
                "accent",
                Some("Which?"),
                choice(&[("é", None), ("ü", None)]),
            )],
            chat_template_kwargs: Default::default(),
            cache_salt: String::new(),
            media: Default::default(),
            joint: false,
            debias: None,
            calibration: None,
        };
        let err = s.prepare(&request, usize::MAX).expect_err("refused");
        assert!(
            err.to_string()
                .contains("question 'accent': label 'é' is not one distinct token for this model"),
            "{err}"
        );
        let too_many = DecisionRequest {
            questions: vec![question(
                "many",
                None,
                QuestionKind::Choice {
                    options: (0..27)
                        .map(|i| ChoiceOption {
                            name: format!("option {i}"),
                            description: None,
                        })
                        .collect(),
                },
            )],
            ..request
        };
        let err = s.prepare(&too_many, usize::MAX).expect_err("refused");
        assert!(err.to_string().contains("at most 26 options"), "{err}");
    }
}
