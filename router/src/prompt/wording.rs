//! The exact prompt texts of the reference servers (spec/PROMPTS.md §1): how a question becomes the
//! user message, and which label each option is answered with.

use crate::ir::{Question, QuestionKind};
use crate::json_text::{self, Separators};
use crate::question_kind::{Kind, LETTERS};
use serde_json::Value;

/// The prompt wording of a reference server (spec/PROMPTS.md §1 and §2). The profile picks it
/// (`Compat::wording`) for every route alike; a strategy with its own wording (Liquid d1) ignores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wording {
    /// vLLM's: the default and `vllm` profiles.
    #[default]
    Vllm,
    /// SGLang's prompt_format_version 1: the `sglang` profile.
    Sglang,
}

/// The prompt wording a server renders in, as `/info` and SGLang's `prompt_format_version` name it.
/// Versions below 100 are SGLang's own numbers for the same texts SGLang serves under them; the
/// others are ours, one per wording, so a client that pins a version never gets another wording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptFormat {
    pub name: &'static str,
    pub version: u32,
}

impl PromptFormat {
    pub const SGLANG_V1: PromptFormat = PromptFormat {
        name: "sglang",
        version: 1,
    };
    pub const VLLM: PromptFormat = PromptFormat {
        name: "vllm",
        version: 101,
    };
    pub const LIQUID_D1: PromptFormat = PromptFormat {
        name: "liquid_d1",
        version: 201,
    };
    /// DiffusionGemma canvas reads: vLLM's per-question texts plus the joint canvas prompt (PROMPTS.md §7).
    pub const DIFFUSION_GEMMA_CANVAS: PromptFormat = PromptFormat {
        name: "diffusion_gemma_canvas",
        version: 301,
    };
    /// Clef's fixed joint-schema prompt (PROMPTS.md §6), whatever the profile.
    pub const JOINT_SCHEMA: PromptFormat = PromptFormat {
        name: "joint_schema",
        version: 401,
    };
}

pub const CODE_REPLY: &str = "Answer with the code of one option only.";

/// The spreadsheet-style code of option `i`: A..Z, AA..AZ, BA.. .
pub fn option_code(i: usize) -> String {
    let mut n = i + 1;
    let mut code = Vec::new();
    while n > 0 {
        let rem = (n - 1) % 26;
        code.push(b'A' + rem as u8);
        n = (n - 1) / 26;
    }
    code.reverse();
    String::from_utf8(code).unwrap_or_default()
}

/// SGLang's two-letter label of option `i` when a choice has more than 26 options: AA, AB, … .
pub fn two_letter_code(i: usize) -> String {
    let first = (b'A' + (i / 26) as u8) as char;
    let second = (b'A' + (i % 26) as u8) as char;
    format!("{first}{second}")
}

/// Which labels answer a question: its kind's single-token labels (`question_kind.rs`), or, for a
/// choice beyond the 26 letters, one of the two long-choice schemes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelScheme {
    /// The kind's own labels, one token each: A..Z, yes/no, 0..9 (vLLM and SGLang alike).
    Single(Kind),
    /// A.., AA.. scored as exact token sequences closed by the end-of-turn token (default profile).
    ExactCodes,
    /// SGLang's AA, AB, … kept only when each is one distinct token.
    TwoLetterTokens,
}

impl Wording {
    pub fn format(&self) -> PromptFormat {
        match self {
            Wording::Vllm => PromptFormat::VLLM,
            Wording::Sglang => PromptFormat::SGLANG_V1,
        }
    }

    /// State text. vLLM: a string as is, else `json.dumps(x, ensure_ascii=False)`;
    /// SGLang: null is empty, a string as is, else compact JSON.
    pub fn state_text(&self, state: &Value) -> String {
        match self {
            Wording::Vllm => json_text::text_or_json(state, Separators::Default),
            Wording::Sglang if state.is_null() => String::new(),
            Wording::Sglang => json_text::text_or_json(state, Separators::Compact),
        }
    }

    /// Whether request-level instructions become a system message (vLLM) or lead the user message (SGLang has none).
    pub fn system_message(&self) -> bool {
        matches!(self, Wording::Vllm)
    }

    /// `"{state}\n\n{body}"`; in SGLang's wording an empty state leaves just the body.
    pub fn user_message(&self, state_text: &str, question: &Question) -> String {
        let body = self.body(question);
        if state_text.is_empty() && *self == Wording::Sglang {
            body
        } else {
            format!("{state_text}\n\n{body}")
        }
    }

    pub fn body(&self, question: &Question) -> String {
        let mut lines: Vec<String> = Vec::new();
        let instructions = question.instructions.as_deref().filter(|s| !s.is_empty());
        match (&question.kind, self) {
            (QuestionKind::YesNo { yes, no, no_first }, Wording::Sglang) => {
                lines.push(match instructions {
                    Some(i) => format!("Is the following true? {i}"),
                    None => "Is the following true?".to_owned(),
                });
                for (label, side) in yes_no_sides(yes, no, *no_first) {
                    if let Some(d) = side.as_deref().filter(|d| !d.is_empty()) {
                        lines.push(format!("{label}: {d}"));
                    }
                }
                lines.push(Kind::yes_no_reply(*no_first).to_owned());
                return lines.join("\n");
            }
            _ => {
                if let Some(i) = instructions {
                    lines.push(format!("Question: {i}"));
                }
            }
        }
        lines.push(self.answer_lines(question));
        lines.join("\n")
    }

    /// The option lines and the reply line, without the question heading (vLLM's `QuestionType.body`;
    /// the joint canvas prompt writes its own numbered heading before it).
    pub fn answer_lines(&self, question: &Question) -> String {
        let mut lines: Vec<String> = Vec::new();
        match &question.kind {
            QuestionKind::Choice { options } => {
                let codes = self.choice_labels(options.len());
                for (code, option) in codes.iter().zip(options) {
                    lines.push(described(code, &option.name, option.description.as_deref()));
                }
                let reply = if options.len() > LETTERS.len() && *self == Wording::Vllm {
                    CODE_REPLY
                } else {
                    Kind::Choice.reply()
                };
                lines.push(reply.to_owned());
            }
            QuestionKind::YesNo { yes, no, no_first } => {
                for (label, description) in yes_no_sides(yes, no, *no_first) {
                    lines.push(side(label, description.as_deref()));
                }
                lines.push(Kind::yes_no_reply(*no_first).to_owned());
            }
            QuestionKind::Score { levels, .. } => {
                for (i, level) in levels.iter().enumerate() {
                    lines.push(format!("{i}: {level}"));
                }
                lines.push(Kind::Score.reply().to_owned());
            }
        }
        lines.join("\n")
    }

    /// The label text of each option of an n-option choice.
    pub fn choice_labels(&self, n: usize) -> Vec<String> {
        match self.scheme(Kind::Choice, n) {
            LabelScheme::ExactCodes => (0..n).map(option_code).collect(),
            LabelScheme::TwoLetterTokens => (0..n).map(two_letter_code).collect(),
            LabelScheme::Single(_) => LETTERS.iter().take(n).map(|s| s.to_string()).collect(),
        }
    }

    /// Which label scheme answers a question of this kind with `arity` answers.
    pub fn scheme(&self, kind: Kind, arity: usize) -> LabelScheme {
        match (kind, self) {
            (Kind::Choice, _) if arity <= LETTERS.len() => LabelScheme::Single(Kind::Choice),
            (Kind::Choice, Wording::Vllm) => LabelScheme::ExactCodes,
            (Kind::Choice, Wording::Sglang) => LabelScheme::TwoLetterTokens,
            (kind, _) => LabelScheme::Single(kind),
        }
    }
}

/// A yes/no's sides in the order shown: yes first, or no first (a debiased read's second order).
fn yes_no_sides<'a>(
    yes: &'a Option<String>,
    no: &'a Option<String>,
    no_first: bool,
) -> [(&'static str, &'a Option<String>); 2] {
    if no_first {
        [("no", no), ("yes", yes)]
    } else {
        [("yes", yes), ("no", no)]
    }
}

fn described(label: &str, name: &str, description: Option<&str>) -> String {
    match description.filter(|d| !d.is_empty()) {
        Some(d) => format!("{label}: {name} - {d}"),
        None => format!("{label}: {name}"),
    }
}

fn side(label: &str, description: Option<&str>) -> String {
    match description.filter(|d| !d.is_empty()) {
        Some(d) => format!("{label}: {d}"),
        None => label.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ChoiceOption;
    use crate::question_kind::MAX_OPTION_CODES;
    use serde_json::json;

    fn q(instructions: Option<&str>, kind: QuestionKind) -> Question {
        Question {
            id: "q".into(),
            instructions: instructions.map(str::to_owned),
            kind,
        }
    }

    fn opt(name: &str, description: Option<&str>) -> ChoiceOption {
        ChoiceOption {
            name: name.into(),
            description: description.map(str::to_owned),
        }
    }

    #[test]
    fn spec_example_choice_with_json_state() {
        let w = Wording::Vllm;
        let state = w.state_text(
            &serde_json::from_str(r#"{"ticket": "Refund not received", "days": 12}"#).unwrap(),
        );
        let question = q(
            Some("What does the customer want?"),
            QuestionKind::Choice {
                options: vec![opt("refund", Some("money back")), opt("status", None)],
            },
        );
        assert_eq!(
            w.user_message(&state, &question),
            "{\"ticket\": \"Refund not received\", \"days\": 12}\n\nQuestion: What does the customer want?\nA: refund - money back\nB: status\nAnswer with the letter of one option only."
        );
    }

    #[test]
    fn choice_without_instructions_and_empty_description() {
        let question = q(
            None,
            QuestionKind::Choice {
                options: vec![opt("x", Some("")), opt("y", Some("why"))],
            },
        );
        assert_eq!(
            Wording::Vllm.user_message("S", &question),
            "S\n\nA: x\nB: y - why\nAnswer with the letter of one option only."
        );
    }

    #[test]
    fn yes_no_always_has_both_sides_yes_first() {
        let bare = q(
            Some("Urgent?"),
            QuestionKind::YesNo {
                yes: None,
                no: None,
                no_first: false,
            },
        );
        assert_eq!(
            Wording::Vllm.user_message("S", &bare),
            "S\n\nQuestion: Urgent?\nyes\nno\nAnswer with yes or no only."
        );
        let described = q(
            None,
            QuestionKind::YesNo {
                yes: None,
                no: Some("all calm".into()),
                no_first: false,
            },
        );
        assert_eq!(
            Wording::Vllm.user_message("S", &described),
            "S\n\nyes\nno: all calm\nAnswer with yes or no only."
        );
        let both = q(
            Some("Urgent?"),
            QuestionKind::YesNo {
                yes: Some("money is moving".into()),
                no: Some("n".into()),
                no_first: false,
            },
        );
        assert_eq!(
            Wording::Vllm.user_message("S", &both),
            "S\n\nQuestion: Urgent?\nyes: money is moving\nno: n\nAnswer with yes or no only."
        );
    }

    /// A debiased read's second label order: the sides and the reply line list no first; the labels
    /// (and so the answer's order) stay yes, no.
    #[test]
    fn yes_no_no_first_lists_no_first_in_both_wordings() {
        let both = q(
            Some("Urgent?"),
            QuestionKind::YesNo {
                yes: Some("money is moving".into()),
                no: Some("n".into()),
                no_first: true,
            },
        );
        assert_eq!(
            Wording::Vllm.user_message("S", &both),
            "S\n\nQuestion: Urgent?\nno: n\nyes: money is moving\nAnswer with no or yes only."
        );
        assert_eq!(
            Wording::Sglang.user_message("S", &both),
            "S\n\nIs the following true? Urgent?\nno: n\nyes: money is moving\nAnswer with no or yes only."
        );
        let bare = q(
            Some("Urgent?"),
            QuestionKind::YesNo {
                yes: None,
                no: None,
                no_first: true,
            },
        );
        assert_eq!(
            Wording::Vllm.user_message("S", &bare),
            "S\n\nQuestion: Urgent?\nno\nyes\nAnswer with no or yes only."
        );
    }

    #[test]
    fn score_levels_are_numbered() {
        let question = q(
            Some("How upset?"),
            QuestionKind::score(vec!["calm".into(), "annoyed".into(), "furious".into()]),
        );
        assert_eq!(
            Wording::Vllm.user_message("S", &question),
            "S\n\nQuestion: How upset?\n0: calm\n1: annoyed\n2: furious\nAnswer with the number of one level only."
        );
    }

    #[test]
    fn state_rendering() {
        let w = Wording::Vllm;
        assert_eq!(w.state_text(&json!("plain text")), "plain text");
        assert_eq!(
            w.state_text(&json!([1, "two", {"k": null}])),
            "[1, \"two\", {\"k\": null}]"
        );
        assert_eq!(w.state_text(&json!(null)), "null");
    }

    #[test]
    fn option_codes_are_spreadsheet_style() {
        assert_eq!(option_code(0), "A");
        assert_eq!(option_code(25), "Z");
        assert_eq!(option_code(26), "AA");
        assert_eq!(option_code(51), "AZ");
        assert_eq!(option_code(52), "BA");
        assert_eq!(option_code(254), "IU");
        let codes: std::collections::HashSet<String> =
            (0..MAX_OPTION_CODES).map(option_code).collect();
        assert_eq!(codes.len(), MAX_OPTION_CODES);
    }

    #[test]
    fn more_than_26_options_use_codes() {
        let options: Vec<ChoiceOption> = (0..30).map(|i| opt(&format!("o{i}"), None)).collect();
        let question = q(Some("Pick"), QuestionKind::Choice { options });
        let text = Wording::Vllm.user_message("S", &question);
        assert!(text.starts_with("S\n\nQuestion: Pick\nA: o0\nB: o1\n"));
        assert!(text.contains("\nZ: o25\nAA: o26\nAB: o27\n"));
        assert!(text.ends_with("AD: o29\nAnswer with the code of one option only."));
        assert_eq!(Wording::Vllm.choice_labels(30)[26], "AA");
    }

    #[test]
    fn labels_follow_request_order() {
        assert_eq!(Wording::Vllm.choice_labels(3), vec!["A", "B", "C"]);
        assert_eq!(Wording::Sglang.choice_labels(27)[..3], ["AA", "AB", "AC"]);
        assert_eq!(Wording::Sglang.choice_labels(255)[254], "JU");
    }

    #[test]
    fn sglang_wording() {
        let w = Wording::Sglang;
        let state = w.state_text(
            &serde_json::from_str(r#"{"ticket": "Refund not received", "days": 12}"#).unwrap(),
        );
        assert_eq!(state, r#"{"ticket":"Refund not received","days":12}"#);
        assert_eq!(w.state_text(&json!(null)), "");
        let yes_no = q(
            Some("Urgent?"),
            QuestionKind::YesNo {
                yes: None,
                no: Some("calm".into()),
                no_first: false,
            },
        );
        assert_eq!(
            w.user_message(&state, &yes_no),
            format!(
                "{state}\n\nIs the following true? Urgent?\nno: calm\nAnswer with yes or no only."
            )
        );
        let bare = q(
            None,
            QuestionKind::YesNo {
                yes: None,
                no: None,
                no_first: false,
            },
        );
        assert_eq!(
            w.user_message("", &bare),
            "Is the following true?\nAnswer with yes or no only."
        );
        let choice = q(
            Some("Which?"),
            QuestionKind::Choice {
                options: vec![opt("a", Some("x")), opt("b", None)],
            },
        );
        assert_eq!(
            w.user_message("S", &choice),
            "S\n\nQuestion: Which?\nA: a - x\nB: b\nAnswer with the letter of one option only."
        );
        let many = q(
            None,
            QuestionKind::Choice {
                options: (0..27).map(|i| opt(&format!("o{i}"), None)).collect(),
            },
        );
        assert!(w
            .user_message("S", &many)
            .starts_with("S\n\nAA: o0\nAB: o1\n"));
    }
}
