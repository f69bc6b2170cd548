//! `POST /v1/score`, SGLang's scoring route as seed 003 uses it to pin and replay a decision: token ids
//! in (`query` + each of `items`), and per item the next-token probabilities of its label tokens out.
//! Nothing is rendered: the ids are scored exactly as sent, through the same next-token reads (and
//! batching) as the decision routes, so replaying a decision's `prompt_token_ids` with its
//! `label_token_ids` gives back its probabilities.

use serde_json::{json, Map, Value};

use crate::error::DecisionError;
use crate::read::{LabelGroup, PreparedRead, ReadOutcome};

/// A parsed `/v1/score` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoreRequest {
    /// One prompt per item: `query` then the item (or the item then `query` with `item_first`).
    pub prompts: Vec<Vec<u32>>,
    /// Each item's label tokens (a flat `label_token_ids` list is every item's).
    pub labels: Vec<Vec<u32>>,
    pub apply_softmax: bool,
    pub temperature: f64,
    pub return_token_logprobs: bool,
    pub model: Option<String>,
}

const FIELDS: &[&str] = &[
    "query",
    "items",
    "label_token_ids",
    "apply_softmax",
    "item_first",
    "temperature",
    "return_token_logprobs",
    "model",
];

fn bad(param: &str, message: String) -> DecisionError {
    DecisionError::BadRequest {
        param: Some(param.to_owned()),
        message,
    }
}

/// Token ids of `value` at `at`: a list of integers in `0..vocab_size`.
fn token_ids(value: &Value, at: &str, vocab_size: u32) -> Result<Vec<u32>, DecisionError> {
    let Value::Array(items) = value else {
        return Err(bad(
            at,
            format!("{at} must be a list of token ids (text is not accepted: send the ids the tokenizer gives)"),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(index, id)| match id.as_u64() {
            Some(id) if vocab_size == 0 || id < u64::from(vocab_size) => Ok(id as u32),
            Some(id) => Err(bad(
                at,
                format!("{at}[{index}]: token id {id} is outside the vocabulary (0..{vocab_size})"),
            )),
            None => Err(bad(
                at,
                format!("{at}[{index}]: a token id is a non-negative integer, got {id}"),
            )),
        })
        .collect()
}

fn flag(obj: &Map<String, Value>, key: &str) -> Result<bool, DecisionError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(bad(key, format!("{key} must be a boolean, got {other}"))),
    }
}

/// Parses and checks a body against the served model: `vocab_size` rows of its head, prompts of at
/// most `max_tokens` (the model's context less the answer position, and the request token limit).
pub fn parse(
    body: &Value,
    vocab_size: u32,
    max_tokens: usize,
) -> Result<ScoreRequest, DecisionError> {
    let Some(obj) = body.as_object() else {
        return Err(bad("body", "the body must be a JSON object".into()));
    };
    if let Some(unknown) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(
            unknown,
            format!(
                "unknown field {unknown:?}; /v1/score takes {}",
                FIELDS.join(", ")
            ),
        ));
    }
    let query = match obj.get("query") {
        None | Some(Value::Null) => Vec::new(),
        Some(q) => token_ids(q, "query", vocab_size)?,
    };
    let items = match obj.get("items") {
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) => {
            return Err(bad("items", "items must hold at least one item".into()))
        }
        _ => {
            return Err(bad(
                "items",
                "items is required: a list of token id lists".into(),
            ))
        }
    };
    let item_first = flag(obj, "item_first")?;
    let mut prompts = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let at = format!("items[{index}]");
        let ids = token_ids(item, &at, vocab_size)?;
        let prompt: Vec<u32> = if item_first {
            ids.iter().chain(&query).copied().collect()
        } else {
            query.iter().chain(&ids).copied().collect()
        };
        if prompt.is_empty() {
            return Err(bad(
                &at,
                format!("{at}: the query and the item are both empty: nothing to score after"),
            ));
        }
        if prompt.len() > max_tokens {
            return Err(DecisionError::BadRequest {
                param: Some(at.clone()),
                message: format!(
                    "{at}: the query and the item are {} tokens, over the limit of {max_tokens} for this model",
                    prompt.len()
                ),
            });
        }
        prompts.push(prompt);
    }
    let labels = match obj.get("label_token_ids") {
        Some(Value::Array(lists)) if !lists.is_empty() && lists.iter().all(Value::is_array) => {
            if lists.len() != prompts.len() {
                return Err(bad(
                    "label_token_ids",
                    format!(
                        "label_token_ids has {} lists for {} items: one per item, or one flat list for all",
                        lists.len(),
                        prompts.len()
                    ),
                ));
            }
            lists
                .iter()
                .enumerate()
                .map(|(i, l)| token_ids(l, &format!("label_token_ids[{i}]"), vocab_size))
                .collect::<Result<Vec<_>, _>>()?
        }
        Some(flat @ Value::Array(_)) => {
            let ids = token_ids(flat, "label_token_ids", vocab_size)?;
            vec![ids; prompts.len()]
        }
        _ => {
            return Err(bad(
                "label_token_ids",
                "label_token_ids is required: the label tokens, one list per item or one flat list for all".into(),
            ))
        }
    };
    for (index, list) in labels.iter().enumerate() {
        if list.is_empty() {
            return Err(bad(
                "label_token_ids",
                format!(
                    "label_token_ids[{index}] is empty: each item needs at least one label token"
                ),
            ));
        }
    }
    let temperature = match obj.get("temperature") {
        None | Some(Value::Null) => 1.0,
        Some(t) => match t.as_f64() {
            Some(t) if t > 0.0 && t.is_finite() => t,
            _ => {
                return Err(bad(
                    "temperature",
                    format!("temperature must be a number above 0, got {t}"),
                ))
            }
        },
    };
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(other) => return Err(bad("model", format!("model must be a string, got {other}"))),
    };
    Ok(ScoreRequest {
        prompts,
        labels,
        apply_softmax: flag(obj, "apply_softmax")?,
        temperature,
        return_token_logprobs: flag(obj, "return_token_logprobs")?,
        model,
    })
}

/// One next-token read per item; each label token is its own group of one variant.
pub fn reads(request: &ScoreRequest) -> Vec<PreparedRead> {
    request
        .prompts
        .iter()
        .zip(&request.labels)
        .map(|(prompt, labels)| {
            let groups = labels
                .iter()
                .map(|&id| LabelGroup::single(vec![id]))
                .collect();
            PreparedRead::next_token(prompt.clone(), groups)
        })
        .collect()
}

/// Per item: with `apply_softmax`, a softmax of the label log-probs divided by `temperature` (what a
/// decision answers); without, each label's full-vocabulary probability `exp(logprob)`.
pub fn scores(request: &ScoreRequest, outcome: &ReadOutcome) -> (Vec<f64>, Vec<f64>) {
    let logprobs = outcome.rows[0].label_logprobs();
    let scores = if request.apply_softmax {
        crate::probability::softmax(&logprobs, request.temperature)
    } else {
        logprobs.iter().map(|lp| lp.exp()).collect()
    };
    (scores, logprobs)
}

pub fn format(request: &ScoreRequest, outcomes: &[ReadOutcome], model_name: &str) -> Value {
    let (scores, logprobs): (Vec<_>, Vec<_>) = outcomes.iter().map(|o| scores(request, o)).unzip();
    let prompt_tokens: usize = request.prompts.iter().map(Vec::len).sum();
    let mut body = json!({
        "object": "scoring",
        "model": request.model.clone().unwrap_or_else(|| model_name.to_owned()),
        "scores": scores,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens},
    });
    if request.return_token_logprobs {
        body["token_logprobs"] = json!(logprobs);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::RowOutcome;

    fn param(err: DecisionError) -> (Option<String>, String) {
        match err {
            DecisionError::BadRequest { param, message } => (param, message),
            other => panic!("not a 400: {other:?}"),
        }
    }

    #[test]
    fn a_replay_body_parses_into_one_read_per_item() {
        let body = json!({"query": [1, 2], "items": [[3], [4, 5]], "label_token_ids": [[7, 8], [9]],
            "apply_softmax": true, "temperature": 0.5, "return_token_logprobs": true});
        let parsed = parse(&body, 100, 10).unwrap();
        assert_eq!(parsed.prompts, vec![vec![1, 2, 3], vec![1, 2, 4, 5]]);
        assert_eq!(parsed.labels, vec![vec![7, 8], vec![9]]);
        assert!(parsed.apply_softmax && parsed.return_token_logprobs && parsed.temperature == 0.5);
        let reads = reads(&parsed);
        assert_eq!(reads[1].token_ids, vec![1, 2, 4, 5]);
        assert_eq!(reads[0].question_labels()[0].len(), 2);
        // A flat label list is every item's; item_first puts the item before the query.
        let flat = parse(
            &json!({"query": [1], "items": [[3], [4]], "label_token_ids": [7], "item_first": true}),
            100,
            10,
        )
        .unwrap();
        assert_eq!(flat.labels, vec![vec![7], vec![7]]);
        assert_eq!(flat.prompts, vec![vec![3, 1], vec![4, 1]]);
        assert!(!flat.apply_softmax && flat.temperature == 1.0);
    }

    #[test]
    fn every_bad_item_is_a_400_naming_it() {
        let cases = [
            (
                json!({"items": [[1], [2, 100]], "label_token_ids": [1]}),
                "items[1]",
                "outside the vocabulary",
            ),
            (
                json!({"items": [[1], []], "label_token_ids": [1]}),
                "items[1]",
                "both empty",
            ),
            (
                json!({"items": [[1], vec![1; 11]], "label_token_ids": [1]}),
                "items[1]",
                "over the limit of 10",
            ),
            (
                json!({"items": [[1], [-3]], "label_token_ids": [1]}),
                "items[1]",
                "non-negative integer",
            ),
            (
                json!({"items": ["some text"], "label_token_ids": [1]}),
                "items[0]",
                "list of token ids",
            ),
            (
                json!({"items": [], "label_token_ids": [1]}),
                "items",
                "at least one",
            ),
            (json!({"label_token_ids": [1]}), "items", "required"),
            (
                json!({"items": [[1]], "label_token_ids": [[1], [2]]}),
                "label_token_ids",
                "2 lists for 1 items",
            ),
            (
                json!({"items": [[1]], "label_token_ids": [[]]}),
                "label_token_ids",
                "is empty",
            ),
            (
                json!({"items": [[1]], "label_token_ids": [100]}),
                "label_token_ids",
                "outside the vocabulary",
            ),
            (json!({"items": [[1]]}), "label_token_ids", "required"),
            (
                json!({"items": [[1]], "label_token_ids": [1], "temperature": 0}),
                "temperature",
                "above 0",
            ),
            (
                json!({"items": [[1]], "label_token_ids": [1], "apply_softmax": "yes"}),
                "apply_softmax",
                "boolean",
            ),
            (
                json!({"items": [[1]], "label_token_ids": [1], "query": [100]}),
                "query",
                "outside",
            ),
            (
                json!({"items": [[1]], "label_token_ids": [1], "extra": 1}),
                "extra",
                "unknown field",
            ),
        ];
        for (body, at, words) in cases {
            let (p, message) = param(parse(&body, 100, 10).unwrap_err());
            assert_eq!(p.as_deref(), Some(at), "{body}: {message}");
            assert!(message.contains(words), "{body}: {message}");
        }
    }

    #[test]
    fn scores_are_softmaxed_at_the_temperature_or_full_vocabulary_probabilities() {
        let outcome = ReadOutcome {
            rows: vec![RowOutcome {
                variant_logprobs: vec![vec![-1.0], vec![-2.0]],
                greedy_token_id: 0,
            }],
            option_logits: Vec::new(),
            tokens_computed: 3,
            tokens_cached: 0,
            media_tokens: 0,
        };
        let mut request = parse(
            &json!({"items": [[1]], "label_token_ids": [1, 2], "return_token_logprobs": true}),
            100,
            10,
        )
        .unwrap();
        let body = format(&request, std::slice::from_ref(&outcome), "served");
        let raw = body["scores"][0].as_array().unwrap();
        assert!((raw[0].as_f64().unwrap() - (-1.0f64).exp()).abs() < 1e-12);
        assert_eq!(body["token_logprobs"], json!([[-1.0, -2.0]]));
        assert_eq!(body["object"], "scoring");
        assert_eq!(body["model"], "served");
        assert_eq!(body["usage"]["prompt_tokens"], 1);
        request.apply_softmax = true;
        request.temperature = 2.0;
        let (soft, _) = scores(&request, &outcome);
        let expected = 1.0 / (1.0 + (-0.5f64).exp());
        assert!((soft[0] - expected).abs() < 1e-12 && (soft[0] + soft[1] - 1.0).abs() < 1e-12);
    }
}
