//! The exact prompt texts of the reference servers (spec/PROMPTS.md §1): how a question becomes the
//! user message, and which label each option is answered with.

use crate::ir::{Question, QuestionKind};
use crate::json_text::{self, Separators};
use serde_json::Value;

pub const CHOICE_REPLY: &str = "Answer with the letter of one option only.";
pub const YES_NO_REPLY: &str = "Answer with yes or no only.";
pub const SCORE_REPLY: &str = "Answer with the number of one level only.";

/// Letters A..Z: the choice labels of the next-token wording.
pub const LETTERS: [&str; 26] =
    ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S", "T", "U", "V", "W", "X", "Y", "Z"];
pub const YES_NO: [&str; 2] = ["yes", "no"];
pub const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

/// Choices beyond 26 options are labelled A..Z, AA..AZ, BA.. and read as exact token sequences.
pub const MAX_OPTION_CODES: usize = 255;
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

/// vLLM's wording, used by the default and `vllm` profiles.
#[derive(Clone, Copy, Debug)]
pub struct VllmWording;

impl VllmWording {
    /// State text: a string as is, anything else as `json.dumps(x, ensure_ascii=False)`.
    pub fn state_text(&self, state: &Value) -> String {
        json_text::text_or_json(state, Separators::Default)
    }

    /// `"{state}\n\n{body}"`.
    pub fn user_message(&self, state_text: &str, question: &Question) -> String {
        format!("{state_text}\n\n{}", self.body(question))
    }

    pub fn body(&self, question: &Question) -> String {
        let mut lines: Vec<String> = Vec::new();
        if let Some(instructions) = question.instructions.as_deref().filter(|s| !s.is_empty()) {
            lines.push(format!("Question: {instructions}"));
        }
        match &question.kind {
            QuestionKind::Choice { options } if options.len() > LETTERS.len() => {
                for (i, option) in options.iter().enumerate() {
                    lines.push(described(&option_code(i), &option.name, option.description.as_deref()));
                }
                lines.push(CODE_REPLY.to_owned());
            }
            QuestionKind::Choice { options } => {
                for (label, option) in LETTERS.iter().zip(options) {
                    lines.push(described(label, &option.name, option.description.as_deref()));
                }
                lines.push(CHOICE_REPLY.to_owned());
            }
            QuestionKind::YesNo { yes, no } => {
                lines.push(side("yes", yes.as_deref()));
                lines.push(side("no", no.as_deref()));
                lines.push(YES_NO_REPLY.to_owned());
            }
            QuestionKind::Score { levels } => {
                for (i, level) in levels.iter().enumerate() {
                    lines.push(format!("{i}: {level}"));
                }
                lines.push(SCORE_REPLY.to_owned());
            }
        }
        lines.join("\n")
    }

    /// The label text of each answer, in option / level order (yes before no).
    pub fn labels(&self, kind: &QuestionKind) -> Vec<String> {
        match kind {
            QuestionKind::Choice { options } if options.len() > LETTERS.len() => (0..options.len()).map(option_code).collect(),
            QuestionKind::Choice { options } => LETTERS.iter().take(options.len()).map(|s| s.to_string()).collect(),
            QuestionKind::YesNo { .. } => YES_NO.iter().map(|s| s.to_string()).collect(),
            QuestionKind::Score { levels } => DIGITS.iter().take(levels.len()).map(|s| s.to_string()).collect(),
        }
    }

    /// The most options / levels this wording can label.
    pub fn max_arity(&self, kind: &QuestionKind) -> usize {
        match kind {
            QuestionKind::Choice { .. } => MAX_OPTION_CODES,
            QuestionKind::YesNo { .. } => 2,
            QuestionKind::Score { .. } => DIGITS.len(),
        }
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
    use serde_json::json;

    fn q(instructions: Option<&str>, kind: QuestionKind) -> Question {
        Question { id: "q".into(), instructions: instructions.map(str::to_owned), kind }
    }

    fn opt(name: &str, description: Option<&str>) -> ChoiceOption {
        ChoiceOption { name: name.into(), description: description.map(str::to_owned) }
    }

    #[test]
    fn spec_example_choice_with_json_state() {
        let w = VllmWording;
        let state = w.state_text(&serde_json::from_str(r#"{"ticket": "Refund not received", "days": 12}"#).unwrap());
        let question = q(
            Some("What does the customer want?"),
            QuestionKind::Choice { options: vec![opt("refund", Some("money back")), opt("status", None)] },
        );
        assert_eq!(
            w.user_message(&state, &question),
            "{\"ticket\": \"Refund not received\", \"days\": 12}\n\nQuestion: What does the customer want?\nA: refund - money back\nB: status\nAnswer with the letter of one option only."
        );
    }

    #[test]
    fn choice_without_instructions_and_empty_description() {
        let question = q(None, QuestionKind::Choice { options: vec![opt("x", Some("")), opt("y", Some("why"))] });
        assert_eq!(VllmWording.user_message("S", &question), "S\n\nA: x\nB: y - why\nAnswer with the letter of one option only.");
    }

    #[test]
    fn yes_no_always_has_both_sides_yes_first() {
        let bare = q(Some("Urgent?"), QuestionKind::YesNo { yes: None, no: None });
        assert_eq!(VllmWording.user_message("S", &bare), "S\n\nQuestion: Urgent?\nyes\nno\nAnswer with yes or no only.");
        let described = q(None, QuestionKind::YesNo { yes: None, no: Some("all calm".into()) });
        assert_eq!(VllmWording.user_message("S", &described), "S\n\nyes\nno: all calm\nAnswer with yes or no only.");
        let both = q(Some("Urgent?"), QuestionKind::YesNo { yes: Some("money is moving".into()), no: Some("n".into()) });
        assert_eq!(
            VllmWording.user_message("S", &both),
            "S\n\nQuestion: Urgent?\nyes: money is moving\nno: n\nAnswer with yes or no only."
        );
    }

    #[test]
    fn score_levels_are_numbered() {
        let question = q(Some("How upset?"), QuestionKind::Score { levels: vec!["calm".into(), "annoyed".into(), "furious".into()] });
        assert_eq!(
            VllmWording.user_message("S", &question),
            "S\n\nQuestion: How upset?\n0: calm\n1: annoyed\n2: furious\nAnswer with the number of one level only."
        );
        assert_eq!(VllmWording.labels(&question.kind), vec!["0", "1", "2"]);
    }

    #[test]
    fn state_rendering() {
        let w = VllmWording;
        assert_eq!(w.state_text(&json!("plain text")), "plain text");
        assert_eq!(w.state_text(&json!([1, "two", {"k": null}])), "[1, \"two\", {\"k\": null}]");
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
        let codes: std::collections::HashSet<String> = (0..MAX_OPTION_CODES).map(option_code).collect();
        assert_eq!(codes.len(), MAX_OPTION_CODES);
    }

    #[test]
    fn more_than_26_options_use_codes() {
        let options: Vec<ChoiceOption> = (0..30).map(|i| opt(&format!("o{i}"), None)).collect();
        let question = q(Some("Pick"), QuestionKind::Choice { options });
        let text = VllmWording.user_message("S", &question);
        assert!(text.starts_with("S\n\nQuestion: Pick\nA: o0\nB: o1\n"));
        assert!(text.contains("\nZ: o25\nAA: o26\nAB: o27\n"));
        assert!(text.ends_with("AD: o29\nAnswer with the code of one option only."));
        assert_eq!(VllmWording.labels(&question.kind)[26], "AA");
    }

    #[test]
    fn labels_follow_request_order() {
        let kind = QuestionKind::Choice { options: vec![opt("b", None), opt("a", None), opt("c", None)] };
        assert_eq!(VllmWording.labels(&kind), vec!["A", "B", "C"]);
        assert_eq!(VllmWording.labels(&QuestionKind::YesNo { yes: None, no: None }), vec!["yes", "no"]);
    }
}
