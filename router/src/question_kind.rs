//! One row per question kind: its name in messages, its single-token labels, the reply line of the
//! next-token wordings, how many answers it can hold, and its confidence formula.
//!
//! A new kind is a `QuestionKind` variant (`ir.rs`, with its `kind()`), a row here, its parse and its
//! answer fields in each wire shape that sends it (`api/`), and its layout in each strategy that writes
//! its own (`prompt/wording.rs`, `prompt/liquid.rs`, `prompt/joint_schema.rs`). The label checks
//! (`prompt/labels.rs`), the canvas lines (`prompt/canvas.rs`), the refusals `/info` lists and the
//! profiles' confidence read the row.

use crate::limits::{DIGIT_LABELS, LETTER_LABELS};
use crate::probability;

/// Letters A..Z: the choice labels of the next-token wording.
pub const LETTERS: [&str; LETTER_LABELS] = [
    "A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S",
    "T", "U", "V", "W", "X", "Y", "Z",
];
pub const YES_NO: [&str; 2] = ["yes", "no"];
pub const DIGITS: [&str; DIGIT_LABELS] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

pub const CHOICE_REPLY: &str = "Answer with the letter of one option only.";
pub const YES_NO_REPLY: &str = "Answer with yes or no only.";
/// The reply line of a yes/no shown no side first (a debiased read's second label order).
pub const NO_YES_REPLY: &str = "Answer with no or yes only.";
pub const SCORE_REPLY: &str = "Answer with the number of one level only.";

/// Choices beyond 26 options are labelled A..Z, AA..AZ, BA.. and read as exact token sequences.
pub const MAX_OPTION_CODES: usize = 255;

/// A question's kind without its payload: the key of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Choice,
    YesNo,
    Score,
}

impl Kind {
    /// Every kind, in the order label sets are checked and listed.
    pub const ALL: [Kind; 3] = [Kind::Choice, Kind::YesNo, Kind::Score];

    /// Its place in `ALL` (tables keyed by kind are arrays in that order).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The kind as messages name it ("this model cannot answer yes/no questions …").
    pub fn name(self) -> &'static str {
        match self {
            Kind::Choice => "choice",
            Kind::YesNo => "yes/no",
            Kind::Score => "score",
        }
    }

    /// The single-token labels answers are read at, in answer order (a choice's first 26 options,
    /// yes then no, a score's levels 0..9).
    pub fn labels(self) -> &'static [&'static str] {
        match self {
            Kind::Choice => &LETTERS,
            Kind::YesNo => &YES_NO,
            Kind::Score => &DIGITS,
        }
    }

    /// The label set as startup refusals name it ("Liquid reads need the digits 0-9 as single tokens").
    pub fn labels_name(self) -> &'static str {
        match self {
            Kind::Choice => "letters A-Z",
            Kind::YesNo => "yes/no",
            Kind::Score => "digits 0-9",
        }
    }

    /// The last line of the question in vLLM's and SGLang's wordings (a vLLM choice beyond 26 options
    /// says `CODE_REPLY` instead: `prompt/wording.rs`).
    pub fn reply(self) -> &'static str {
        match self {
            Kind::Choice => CHOICE_REPLY,
            Kind::YesNo => YES_NO_REPLY,
            Kind::Score => SCORE_REPLY,
        }
    }

    /// The reply line of a yes/no in the label order shown (`no_first`: a debiased read's second order).
    pub fn yes_no_reply(no_first: bool) -> &'static str {
        if no_first {
            NO_YES_REPLY
        } else {
            YES_NO_REPLY
        }
    }

    /// The most answers a next-token read can label (choices beyond the letters take option codes).
    pub fn max_answers(self) -> usize {
        match self {
            Kind::Choice => MAX_OPTION_CODES,
            Kind::YesNo => YES_NO.len(),
            Kind::Score => DIGITS.len(),
        }
    }

    /// TypeSafe's published confidence of the renormalised probabilities (`probability.rs`); a yes/no
    /// answer has none (the profiles that report one use the vLLM rule: `profile.rs`).
    pub fn confidence(self, p: &[f64]) -> Option<f64> {
        match self {
            Kind::Choice => Some(probability::choice_confidence(p)),
            Kind::YesNo => None,
            Kind::Score => Some(probability::score_confidence(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_labels_at_least_its_single_token_answers() {
        for kind in Kind::ALL {
            assert!(kind.max_answers() >= kind.labels().len(), "{kind:?}");
            assert!(!kind.reply().is_empty());
        }
        assert_eq!(Kind::Choice.labels().len(), LETTER_LABELS);
        assert_eq!(Kind::Score.labels().len(), DIGIT_LABELS);
    }

    #[test]
    fn every_kind_has_a_probe_of_that_kind_within_its_labels() {
        for kind in Kind::ALL {
            let probe = crate::ir::QuestionKind::probe(kind);
            assert_eq!(probe.kind(), kind);
            assert!(probe.arity() <= kind.labels().len(), "{kind:?}");
        }
    }

    #[test]
    fn index_is_the_place_in_all() {
        for (i, kind) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), i);
        }
    }

    #[test]
    fn yes_no_has_no_typesafe_confidence() {
        assert_eq!(Kind::YesNo.confidence(&[0.9, 0.1]), None);
        assert_eq!(Kind::Choice.confidence(&[1.0]), Some(1.0));
    }
}
