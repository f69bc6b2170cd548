//! The label check (vLLM's method, spec/PROMPTS.md §3): after the chat template's reply prefix every
//! label must add exactly one new token, distinct within its set. Done once at startup; a set that
//! fails makes its question type unservable (501 naming the reason).

use std::collections::HashSet;

use tokenizers::Tokenizer;

use super::template::{ChatTemplate, Message};
use super::wording::{self, LabelScheme};
use crate::question_kind::{Kind, MAX_OPTION_CODES};

/// Why a label set cannot be read on this model (kept per set: its question type answers 501 with it).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum LabelError {
    #[error("rendering {what} failed: {message}")]
    Render { what: &'static str, message: String },
    #[error("tokenizing {what} failed: {message}")]
    Tokenize { what: String, message: String },
    #[error("the chat template drops assistant replies")]
    DropsReplies,
    #[error("the chat template closes a reply with no special end-of-turn token")]
    NoEndOfTurn,
    #[error("label '{label}' changes the chat template's reply prefix when tokenized")]
    ChangesPrefix { label: String },
    #[error(
        "label '{label}' is not a single token after the chat template's reply prefix {prefix:?} (it encodes as {got:?} after {tail:?})"
    )]
    NotOneToken {
        label: String,
        prefix: String,
        got: Vec<u32>,
        tail: Vec<u32>,
    },
    #[error("label '{label}' shares token {id} with another label of its set")]
    SharedToken { label: String, id: u32 },
}

/// A question kind this model cannot label with `answers` answers (its type answers 501 with it).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("this model cannot answer {} questions with {answers} answers: {reason}", kind.name())]
pub struct Unlabelable {
    pub kind: Kind,
    pub answers: usize,
    pub reason: LabelError,
}

/// Which token answers each label, for one model.
#[derive(Clone, Debug)]
pub struct LabelVocabulary {
    /// Token ids after the last added/special token of a rendered prompt (the reply prefix).
    pub tail: Vec<u32>,
    /// Each kind's single-token labels (`Kind::labels`), in `Kind::ALL` order.
    singles: [Result<Vec<u32>, LabelError>; Kind::ALL.len()],
    /// For choices beyond 26 options: every option code (A.., AA..) as an exact token sequence
    /// closed by the template's end-of-turn token, so that no code is a prefix of another.
    pub codes: Result<Vec<Vec<u32>>, LabelError>,
    /// SGLang's two-letter labels AA, AB, … (only usable where each is one distinct token).
    pub two_letter: Result<Vec<u32>, LabelError>,
}

impl LabelVocabulary {
    /// Renders a probe conversation and checks every label set against its reply prefix.
    pub fn check(
        tokenizer: &Tokenizer,
        template: &ChatTemplate,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Self, LabelError> {
        let probe = template
            .render(&[Message::new("user", "probe")], true, kwargs)
            .map_err(|e| LabelError::Render {
                what: "the label-check probe",
                message: e.to_string(),
            })?;
        let encoding =
            tokenizer
                .encode(probe.as_str(), false)
                .map_err(|e| LabelError::Tokenize {
                    what: "the probe".into(),
                    message: e.to_string(),
                })?;
        let ids = encoding.get_ids();
        let added: HashSet<u32> = tokenizer
            .get_added_tokens_decoder()
            .keys()
            .copied()
            .collect();
        let (tail, tail_text) = match ids.iter().rposition(|id| added.contains(id)) {
            Some(pos) => (
                ids[pos + 1..].to_vec(),
                probe[encoding.get_offsets()[pos].1..].to_owned(),
            ),
            None => (ids.to_vec(), probe.clone()),
        };
        let check = |labels: &[&str]| check_set(tokenizer, &tail, &tail_text, labels);
        let codes = end_of_turn(tokenizer, template, kwargs)
            .and_then(|eot| code_sequences(tokenizer, &tail, &tail_text, eot));
        let two_letter_codes: Vec<String> = (0..MAX_OPTION_CODES)
            .map(wording::two_letter_code)
            .collect();
        let two_letter = check(
            &two_letter_codes
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        Ok(LabelVocabulary {
            singles: Kind::ALL.map(|kind| check(kind.labels())),
            codes,
            two_letter,
            tail,
        })
    }

    /// The token of each of a kind's single-token labels, or why this model cannot read them.
    pub fn single(&self, kind: Kind) -> &Result<Vec<u32>, LabelError> {
        &self.singles[kind.index()]
    }

    /// The label token sequence of each of `n` answers under a scheme, or why this model cannot read them.
    pub fn sequences(&self, scheme: LabelScheme, n: usize) -> Result<Vec<Vec<u32>>, LabelError> {
        let singles = |set: &Result<Vec<u32>, LabelError>| {
            set.as_ref()
                .map(|ids| ids.iter().take(n).map(|&id| vec![id]).collect())
                .map_err(Clone::clone)
        };
        match scheme {
            LabelScheme::Single(kind) => singles(self.single(kind)),
            LabelScheme::TwoLetterTokens => singles(&self.two_letter),
            LabelScheme::ExactCodes => self
                .codes
                .as_ref()
                .map(|c| c.iter().take(n).cloned().collect())
                .map_err(Clone::clone),
        }
    }
}

/// The token that closes an assistant turn in this template (e.g. `<|im_end|>`), found by rendering
/// a finished reply and taking the added token that follows it.
fn end_of_turn(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<u32, LabelError> {
    const REPLY: &str = "Probe reply";
    let text = template
        .render(
            &[
                Message::new("user", "probe"),
                Message::new("assistant", REPLY),
            ],
            false,
            kwargs,
        )
        .map_err(|e| LabelError::Render {
            what: "a finished reply",
            message: e.to_string(),
        })?;
    let end = text
        .rfind(REPLY)
        .map(|i| i + REPLY.len())
        .ok_or(LabelError::DropsReplies)?;
    let encoding = tokenizer
        .encode(text.as_str(), false)
        .map_err(|e| LabelError::Tokenize {
            what: "a finished reply".into(),
            message: e.to_string(),
        })?;
    let added: HashSet<u32> = tokenizer
        .get_added_tokens_decoder()
        .keys()
        .copied()
        .collect();
    encoding
        .get_ids()
        .iter()
        .zip(encoding.get_offsets())
        .find(|(_, (start, _))| *start >= end)
        .map(|(id, _)| *id)
        .filter(|id| added.contains(id))
        .ok_or(LabelError::NoEndOfTurn)
}

fn code_sequences(
    tokenizer: &Tokenizer,
    tail: &[u32],
    tail_text: &str,
    eot: u32,
) -> Result<Vec<Vec<u32>>, LabelError> {
    let mut sequences = Vec::with_capacity(MAX_OPTION_CODES);
    for code in (0..MAX_OPTION_CODES).map(wording::option_code) {
        let text = format!("{tail_text}{code}");
        let encoded = tokenizer
            .encode(text.as_str(), false)
            .map_err(|e| LabelError::Tokenize {
                what: format!("label '{code}'"),
                message: e.to_string(),
            })?;
        let got = encoded.get_ids();
        if got.len() <= tail.len() || &got[..tail.len()] != tail {
            return Err(LabelError::ChangesPrefix { label: code });
        }
        let mut sequence = got[tail.len()..].to_vec();
        sequence.push(eot);
        sequences.push(sequence);
    }
    Ok(sequences)
}

pub(crate) fn check_set(
    tokenizer: &Tokenizer,
    tail: &[u32],
    tail_text: &str,
    labels: &[&str],
) -> Result<Vec<u32>, LabelError> {
    let mut ids = Vec::with_capacity(labels.len());
    for label in labels {
        let text = format!("{tail_text}{label}");
        let encoded = tokenizer
            .encode(text.as_str(), false)
            .map_err(|e| LabelError::Tokenize {
                what: format!("label '{label}'"),
                message: e.to_string(),
            })?;
        let got = encoded.get_ids();
        if got.len() != tail.len() + 1 || &got[..tail.len()] != tail {
            return Err(LabelError::NotOneToken {
                label: (*label).to_owned(),
                prefix: tail_text.to_owned(),
                got: got.to_vec(),
                tail: tail.to_vec(),
            });
        }
        let id = got[tail.len()];
        if ids.contains(&id) {
            return Err(LabelError::SharedToken {
                label: (*label).to_owned(),
                id,
            });
        }
        ids.push(id);
    }
    Ok(ids)
}
