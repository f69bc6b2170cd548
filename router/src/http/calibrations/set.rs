//! A calibration set as `POST /v1/calibrations` sends it (System One examples with their answers),
//! checked whole before anything is read, then read through the decision pipeline and fitted.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use serde_json::{Map, Value};

use crate::api::{fields, systemone};
use crate::calibration::fit::{self, Labelled};
use crate::calibration::{kind_name, labels, Fit, Provenance, Score, SignatureFit};
use crate::decide::Decider;
use crate::error::{DecisionError, FieldError, Loc};
use crate::ir::{Debias, DecisionRequest, QuestionKind};
use crate::label_prior::Signature;
use crate::limits::{Budget, Limits};
use crate::profile::Compat;

/// Examples in one calibration set at most.
pub const MAX_EXAMPLES: usize = 4096;
/// Characters of a calibration's name at most.
pub const MAX_NAME_CHARS: usize = 200;
/// Examples read at a time (the queue batches them; more would only crowd it).
const CONCURRENT_EXAMPLES: usize = 16;
/// The fields of the set's body.
const FIELDS: [&str; 5] = ["name", "examples", "holdout_fraction", "seed", "x_debias"];

/// One answered question of an example.
#[derive(Clone, Debug)]
struct Answered {
    example: usize,
    question: usize,
    /// The true answer's index in the question as sent.
    truth: usize,
}

/// A checked calibration set.
pub struct CalibrationSet {
    pub name: String,
    pub holdout_fraction: f64,
    pub seed: u64,
    pub debias: Option<Debias>,
    /// Each example as the decision request its reads are.
    examples: Vec<Arc<DecisionRequest>>,
    /// Per signature (in order of first appearance), its answers.
    signatures: Vec<(Signature, Vec<Answered>)>,
}

fn loc(path: &[Loc]) -> Vec<Loc> {
    fields::body_loc(path)
}

impl CalibrationSet {
    pub fn parse(body: &Value, limits: &Limits, compat: Compat) -> Result<Self, DecisionError> {
        let obj = fields::body_object(body, "model_attributes_type")?;
        let mut errors = Vec::new();
        fields::unknown_keys(
            obj,
            &FIELDS,
            &[],
            "extra_forbidden",
            |key| {
                format!(
                    "unknown field '{key}' (a calibration set has {})",
                    FIELDS.join(", ")
                )
            },
            &mut errors,
        );
        let name = match obj.get("name") {
            Some(Value::String(s))
                if !s.trim().is_empty() && s.chars().count() <= MAX_NAME_CHARS =>
            {
                s.clone()
            }
            None => {
                errors.push(FieldError::new(
                    loc(&["name".into()]),
                    "missing",
                    "name is required",
                ));
                String::new()
            }
            Some(_) => {
                errors.push(FieldError::new(
                    loc(&["name".into()]),
                    "string_type",
                    format!(
                        "name must be a non-blank string of at most {MAX_NAME_CHARS} characters"
                    ),
                ));
                String::new()
            }
        };
        let holdout_fraction = match obj.get("holdout_fraction") {
            None | Some(Value::Null) => fit::DEFAULT_HOLDOUT_FRACTION,
            Some(Value::Number(n)) if n.as_f64().is_some_and(|f| f > 0.0 && f < 1.0) => {
                n.as_f64().unwrap_or(fit::DEFAULT_HOLDOUT_FRACTION)
            }
            Some(other) => {
                errors.push(FieldError::new(
                    loc(&["holdout_fraction".into()]),
                    "value_error",
                    format!("holdout_fraction must be a number between 0 and 1 (exclusive), got {other}"),
                ));
                fit::DEFAULT_HOLDOUT_FRACTION
            }
        };
        let seed = match obj.get("seed") {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64().unwrap_or(0),
            Some(other) => {
                errors.push(FieldError::new(
                    loc(&["seed".into()]),
                    "int_type",
                    format!("seed must be a non-negative integer, got {other}"),
                ));
                0
            }
        };
        let debias = fields::debias(obj, "literal_error", &mut errors);
        let items: &[Value] = match obj.get("examples") {
            Some(Value::Array(items)) if !items.is_empty() && items.len() <= MAX_EXAMPLES => items,
            Some(Value::Array(items)) => {
                errors.push(FieldError::new(
                    loc(&["examples".into()]),
                    if items.is_empty() {
                        "too_short"
                    } else {
                        "too_long"
                    },
                    format!(
                        "examples must hold 1 to {MAX_EXAMPLES} examples, got {}",
                        items.len()
                    ),
                ));
                &[]
            }
            None => {
                errors.push(FieldError::new(
                    loc(&["examples".into()]),
                    "missing",
                    "examples is required",
                ));
                &[]
            }
            Some(_) => {
                errors.push(FieldError::new(
                    loc(&["examples".into()]),
                    "list_type",
                    "examples must be a list of System One requests with their answers",
                ));
                &[]
            }
        };
        let mut examples = Vec::with_capacity(items.len());
        let mut by_signature: BTreeMap<Signature, (usize, Vec<Answered>)> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let at = |more: &[Loc]| {
                let mut path: Vec<Loc> = vec!["examples".into(), Loc::Index(i)];
                path.extend_from_slice(more);
                loc(&path)
            };
            let Some(example) = item.as_object() else {
                errors.push(FieldError::new(
                    at(&[]),
                    "model_attributes_type",
                    "an example must be an object: a System One request and its answers",
                ));
                continue;
            };
            for key in [crate::calibration::FIELD, fields::DEBIAS_FIELD] {
                if example.contains_key(key) {
                    errors.push(FieldError::new(
                        at(&[key.into()]),
                        "extra_forbidden",
                        format!("{key} is not taken by an example (x_debias is one for the whole set, at its top level)"),
                    ));
                }
            }
            let answers = match example.get("answers") {
                Some(Value::Object(a)) => Some(a),
                None => {
                    errors.push(FieldError::new(
                        at(&["answers".into()]),
                        "missing",
                        "answers is required: question id -> its true answer",
                    ));
                    None
                }
                Some(_) => {
                    errors.push(FieldError::new(
                        at(&["answers".into()]),
                        "dict_type",
                        "answers must be an object of question id -> its true answer",
                    ));
                    None
                }
            };
            let request: Map<String, Value> = example
                .iter()
                .filter(|(k, _)| k.as_str() != "answers")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let mut request = match systemone::parse(&Value::Object(request), limits, compat) {
                Ok(r) => r,
                Err(DecisionError::Invalid(inner)) => {
                    // Re-rooted under the example: `body.examples.3.questions.team.criteria`.
                    errors.extend(inner.into_iter().map(|mut e| {
                        let rest: Vec<Loc> = e.loc.iter().skip(1).cloned().collect();
                        e.loc = at(&rest);
                        e
                    }));
                    continue;
                }
                Err(other) => return Err(other),
            };
            request.debias = debias;
            let Some(answers) = answers else { continue };
            for id in answers.keys() {
                if !request.questions.iter().any(|q| &q.id == id) {
                    errors.push(FieldError::new(
                        at(&["answers".into(), id.clone().into()]),
                        "extra_forbidden",
                        format!("answer for '{id}', which is not a question of this example"),
                    ));
                }
            }
            for (q, question) in request.questions.iter().enumerate() {
                let aloc = at(&["answers".into(), question.id.clone().into()]);
                let Some(given) = answers.get(&question.id) else {
                    errors.push(FieldError::new(
                        aloc,
                        "missing",
                        format!("question '{}' has no answer", question.id),
                    ));
                    continue;
                };
                match truth(&question.kind, given) {
                    Ok(truth) => {
                        let signature = Signature::form(question);
                        let first = by_signature.len();
                        by_signature
                            .entry(signature)
                            .or_insert((first, Vec::new()))
                            .1
                            .push(Answered {
                                example: i,
                                question: q,
                                truth,
                            });
                    }
                    Err(message) => errors.push(FieldError::new(aloc, "value_error", message)),
                }
            }
            examples.push(Arc::new(request));
        }
        if errors.is_empty() {
            for (signature, (_, answers)) in &by_signature {
                if answers.len() < fit::MIN_ANSWERS_PER_SIGNATURE {
                    let first = &answers[0];
                    let id = &examples[first.example].questions[first.question].id;
                    errors.push(FieldError::new(
                        loc(&["examples".into()]),
                        "too_short",
                        format!(
                            "question '{id}' (signature {}, first in examples.{}) is answered {} times; a signature needs at least {} answers (one held out)",
                            signature.hex(),
                            first.example,
                            answers.len(),
                            fit::MIN_ANSWERS_PER_SIGNATURE
                        ),
                    ));
                }
            }
        }
        if !errors.is_empty() {
            return Err(DecisionError::Invalid(errors));
        }
        let mut signatures: Vec<(usize, Signature, Vec<Answered>)> = by_signature
            .into_iter()
            .map(|(s, (first, answers))| (first, s, answers))
            .collect();
        signatures.sort_by_key(|(first, _, _)| *first);
        Ok(CalibrationSet {
            name,
            holdout_fraction,
            seed,
            debias,
            examples,
            signatures: signatures.into_iter().map(|(_, s, a)| (s, a)).collect(),
        })
    }

    /// Reads every example as a request would be read (each within `budget`), splits each
    /// signature's answers by the seed and fits it. The fit gets a new id and the current time.
    pub async fn fit(
        &self,
        decider: &Decider,
        server: &Provenance,
        budget: Option<Budget>,
    ) -> Result<Fit, DecisionError> {
        let decided: Vec<Vec<Vec<f64>>> = futures::stream::iter(self.examples.iter().cloned())
            .map(|request| async move {
                let decided = decider.decide(request, 1.0, false, budget).await?;
                Ok::<_, DecisionError>(
                    decided
                        .decision
                        .answers
                        .into_iter()
                        .map(|a| a.probabilities)
                        .collect(),
                )
            })
            .buffered(CONCURRENT_EXAMPLES)
            .try_collect()
            .await?;
        let mut out = Vec::with_capacity(self.signatures.len());
        let (mut n_fit, mut n_holdout) = (0, 0);
        for (signature, answers) in &self.signatures {
            let first = &answers[0];
            let question = &self.examples[first.example].questions[first.question];
            let (label_names, order) = labels(&question.kind);
            let reads: Vec<Labelled> = answers
                .iter()
                .map(|a| {
                    let q = &self.examples[a.example].questions[a.question];
                    // Each example may list the options in its own order: by name into the fit's.
                    let (_, order) = labels(&q.kind);
                    let p = &decided[a.example][a.question];
                    Labelled {
                        probabilities: order.iter().map(|&i| p[i]).collect(),
                        truth: order.iter().position(|&i| i == a.truth).unwrap_or(0),
                    }
                })
                .collect();
            let held = fit::holdout(reads.len(), self.holdout_fraction, self.seed);
            let (fit_reads, held_reads): (Vec<Labelled>, Vec<Labelled>) = reads
                .into_iter()
                .zip(&held)
                .fold((Vec::new(), Vec::new()), |(mut f, mut h), (r, &is_held)| {
                    if is_held {
                        h.push(r);
                    } else {
                        f.push(r);
                    }
                    (f, h)
                });
            let k = order.len();
            let with_biases = !matches!(question.kind, QuestionKind::YesNo { .. })
                && fit::fits_biases(fit_reads.len(), k);
            let chosen = fit::choose(&fit_reads, &held_reads, k, with_biases);
            n_fit += fit_reads.len();
            n_holdout += held_reads.len();
            out.push(SignatureFit {
                signature: signature.hex(),
                kind: kind_name(&question.kind).into(),
                labels: label_names.clone(),
                instructions: question.instructions.clone(),
                method: chosen.method.into(),
                temperature: chosen.parameters.temperature,
                biases: chosen
                    .parameters
                    .biases
                    .map(|b| label_names.iter().cloned().zip(b).collect()),
                n: fit_reads.len() + held_reads.len(),
                n_fit: fit_reads.len(),
                n_holdout: held_reads.len(),
                before: Score::from(chosen.before),
                after: Score::from(chosen.after),
                reason: chosen.reason,
            });
        }
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Ok(Fit {
            id: format!("cal-{}", uuid::Uuid::new_v4().simple()),
            name: self.name.clone(),
            created,
            model: server.model.clone(),
            model_fingerprint: server.model_fingerprint.clone(),
            prompt_format: server.prompt_format.clone(),
            debias: self.debias.unwrap_or(decider.debias).name().into(),
            seed: self.seed,
            holdout_fraction: self.holdout_fraction,
            n: n_fit + n_holdout,
            n_fit,
            n_holdout,
            signatures: out,
        })
    }
}

/// The index of an example's true answer in its question as sent: a choice's option name, a noul's
/// `true`/`false`, a score's level index.
fn truth(kind: &QuestionKind, given: &Value) -> Result<usize, String> {
    match kind {
        QuestionKind::Choice { options } => given
            .as_str()
            .and_then(|name| options.iter().position(|o| o.name == name))
            .ok_or_else(|| {
                let names: Vec<&str> = options.iter().map(|o| o.name.as_str()).collect();
                format!(
                    "a choice's answer is one of its option names ({}), got {given}",
                    names.join(", ")
                )
            }),
        QuestionKind::YesNo { .. } => match given {
            Value::Bool(true) => Ok(0),
            Value::Bool(false) => Ok(1),
            _ => Err(format!("a noul's answer is true or false, got {given}")),
        },
        QuestionKind::Score { levels, .. } => given
            .as_u64()
            .filter(|&i| (i as usize) < levels.len())
            .map(|i| i as usize)
            .ok_or_else(|| {
                format!(
                    "a score's answer is a level index from 0 to {}, got {given}",
                    levels.len() - 1
                )
            }),
    }
}
