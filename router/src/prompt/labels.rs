//! The label check (vLLM's method, spec/PROMPTS.md §3): after the chat template's reply prefix every
//! label must add exactly one new token, distinct within its set. Done once at startup; a set that
//! fails makes its question type unservable (501 naming the reason).

use std::collections::HashSet;

use tokenizers::Tokenizer;

use super::template::{ChatTemplate, Message};
use super::wording::{DIGITS, LETTERS, YES_NO};
use crate::ir::QuestionKind;

/// Which token answers each label, for one model.
#[derive(Clone, Debug)]
pub struct LabelVocabulary {
    /// Token ids after the last added/special token of a rendered prompt (the reply prefix).
    pub tail: Vec<u32>,
    pub letters: Result<Vec<u32>, String>,
    pub yes_no: Result<Vec<u32>, String>,
    pub digits: Result<Vec<u32>, String>,
}

impl LabelVocabulary {
    /// Renders a probe conversation and checks every label set against its reply prefix.
    pub fn check(tokenizer: &Tokenizer, template: &ChatTemplate, kwargs: &serde_json::Map<String, serde_json::Value>) -> Result<Self, String> {
        let probe = template
            .render(&[Message::new("user", "probe")], true, kwargs)
            .map_err(|e| format!("rendering the label-check probe failed: {e}"))?;
        let encoding = tokenizer.encode(probe.as_str(), false).map_err(|e| format!("tokenizing the probe failed: {e}"))?;
        let ids = encoding.get_ids();
        let added: HashSet<u32> = tokenizer.get_added_tokens_decoder().keys().copied().collect();
        let (tail, tail_text) = match ids.iter().rposition(|id| added.contains(id)) {
            Some(pos) => (ids[pos + 1..].to_vec(), probe[encoding.get_offsets()[pos].1..].to_owned()),
            None => (ids.to_vec(), probe.clone()),
        };
        let check = |labels: &[&str]| check_set(tokenizer, &tail, &tail_text, labels);
        Ok(LabelVocabulary { letters: check(&LETTERS), yes_no: check(&YES_NO), digits: check(&DIGITS), tail })
    }

    /// The label token of every answer of a question, or why this model cannot answer its type.
    pub fn for_kind(&self, kind: &QuestionKind) -> Result<Vec<u32>, String> {
        let (set, n) = match kind {
            QuestionKind::Choice { options } => (&self.letters, options.len()),
            QuestionKind::YesNo { .. } => (&self.yes_no, 2),
            QuestionKind::Score { levels } => (&self.digits, levels.len()),
        };
        set.as_ref().map(|ids| ids[..n.min(ids.len())].to_vec()).map_err(Clone::clone)
    }
}

fn check_set(tokenizer: &Tokenizer, tail: &[u32], tail_text: &str, labels: &[&str]) -> Result<Vec<u32>, String> {
    let mut ids = Vec::with_capacity(labels.len());
    for label in labels {
        let text = format!("{tail_text}{label}");
        let encoded = tokenizer.encode(text.as_str(), false).map_err(|e| format!("tokenizing label '{label}' failed: {e}"))?;
        let got = encoded.get_ids();
        if got.len() != tail.len() + 1 || &got[..tail.len()] != tail {
            return Err(format!(
                "label '{label}' is not a single token after the chat template's reply prefix {tail_text:?} (it encodes as {:?} after {:?})",
                got, tail
            ));
        }
        let id = got[tail.len()];
        if ids.contains(&id) {
            return Err(format!("label '{label}' shares token {id} with another label of its set"));
        }
        ids.push(id);
    }
    Ok(ids)
}
