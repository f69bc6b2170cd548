//! Calibration with provenance (`/v1/calibrations`, a request's `x_calibration`): temperatures (and
//! per-label biases) fitted per question signature on labelled examples read by this server, kept in
//! an embedded database (`--data-dir`), applied after debiasing and named in every answer they touch.
//!
//! `fit.rs` holds the numbers, `store.rs` the database; this file the fits as they are stored and
//! exported, and how a request's answers use one. The calibration set as a request sends it, read
//! through the `Decider`, is the route's (`http/calibrations/set.rs`): this module stays below
//! `decide.rs`, which applies the fits.

pub mod fit;
pub mod store;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::DecisionError;
use crate::ir::{Answer, Question, QuestionKind};
pub use crate::ir::{CalibrationChoice, CalibrationReport};
use crate::label_prior::Signature;
use crate::prompt::wording::PromptFormat;
use fit::{Parameters, Scores};
use store::{Store, StoreError};

/// The request field that opts a request in.
pub const FIELD: &str = "x_calibration";
/// What an export document says it is; an import refuses anything else.
pub const DOCUMENT_KIND: &str = "decision-inference.calibration";
pub const DOCUMENT_VERSION: u32 = 1;

/// The model and prompt wording reads were made with: a fit applies only where they are the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// The served model name (`--served-model-name`, else the model folder's name).
    pub model: String,
    /// SHA-256 (first 16 hex digits) of the architecture, the vocabulary size and the model folder's
    /// `config.json`: a fit from another checkpoint under the same name is still refused.
    pub model_fingerprint: String,
    pub prompt_format: FormatName,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatName {
    pub name: String,
    pub version: u32,
}

impl From<PromptFormat> for FormatName {
    fn from(f: PromptFormat) -> Self {
        FormatName {
            name: f.name.to_owned(),
            version: f.version,
        }
    }
}

impl std::fmt::Display for Provenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "model '{}' (fingerprint {}), prompt format {} v{}",
            self.model, self.model_fingerprint, self.prompt_format.name, self.prompt_format.version
        )
    }
}

impl Provenance {
    /// This server's: the model folder's `config.json` (when it has one) hashed with what the shard
    /// reports of the model.
    pub fn of_server(
        model: &str,
        architecture: &str,
        vocab_size: u32,
        model_dir: &Path,
        prompt_format: PromptFormat,
    ) -> Provenance {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        hasher.update(architecture.as_bytes());
        hasher.update([0]);
        hasher.update(vocab_size.to_le_bytes());
        if let Ok(config) = std::fs::read(model_dir.join("config.json")) {
            hasher.update(&config);
        }
        let digest = hasher.finalize();
        Provenance {
            model: model.to_owned(),
            model_fingerprint: digest[..8].iter().map(|b| format!("{b:02x}")).collect(),
            prompt_format: prompt_format.into(),
        }
    }
}

/// The before/after scores of a signature on its held-out answers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Score {
    pub ece: f64,
    pub log_loss: f64,
}

impl From<Scores> for Score {
    fn from(s: Scores) -> Self {
        Score {
            ece: s.ece,
            log_loss: s.log_loss,
        }
    }
}

/// One signature's fit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureFit {
    /// `label_prior::Signature` as 16 hex digits.
    pub signature: String,
    /// `choice`, `noul` or `score` (System One's names).
    pub kind: String,
    /// The labels biases are keyed by, in the order the fit holds them: a choice's option names
    /// sorted, `true`/`false` for a noul, a score's level indices.
    pub labels: Vec<String>,
    /// The question's instructions, for a person reading the fit (the signature is what matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// `temperature`, `temperature+bias`, or `none`: no fit lowered the held-out log-loss, so
    /// this signature's answers are left uncalibrated (temperature 1, no biases).
    pub method: String,
    pub temperature: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub biases: Option<BTreeMap<String, f64>>,
    /// Answers of this signature in the set, fitted on, held out.
    pub n: usize,
    pub n_fit: usize,
    pub n_holdout: usize,
    pub before: Score,
    pub after: Score,
    /// Why a simpler method than the set allowed was kept: what the rejected fit scored held out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

pub const METHOD_TEMPERATURE: &str = "temperature";
pub const METHOD_BIASES: &str = "temperature+bias";
pub const METHOD_NONE: &str = "none";

impl SignatureFit {
    /// The parameters in label order, as `fit.rs` applies them.
    pub fn parameters(&self) -> Parameters {
        Parameters {
            temperature: self.temperature,
            biases: self.biases.as_ref().map(|b| {
                self.labels
                    .iter()
                    .map(|l| b.get(l).copied().unwrap_or(0.0))
                    .collect()
            }),
        }
    }
}

/// A stored calibration: what it was fitted on and each signature's parameters and scores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fit {
    pub id: String,
    pub name: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub model_fingerprint: String,
    pub prompt_format: FormatName,
    /// How the examples were read (`x_debias` of the calibration request, else the server's).
    pub debias: String,
    pub seed: u64,
    pub holdout_fraction: f64,
    /// Answers in the set (every question of every example), fitted on, held out.
    pub n: usize,
    pub n_fit: usize,
    pub n_holdout: usize,
    pub signatures: Vec<SignatureFit>,
}

impl Fit {
    pub fn provenance(&self) -> Provenance {
        Provenance {
            model: self.model.clone(),
            model_fingerprint: self.model_fingerprint.clone(),
            prompt_format: self.prompt_format.clone(),
        }
    }

    /// As `GET /v1/calibrations/{id}` and `POST` answer it.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// As the list answers it: everything but the per-signature fits, which it counts.
    pub fn summary(&self) -> Value {
        let mut value = self.to_json();
        if let Some(obj) = value.as_object_mut() {
            obj.remove("signatures");
            obj.insert("n_signatures".into(), self.signatures.len().into());
        }
        value
    }

    /// The self-contained document `GET /v1/calibrations/{id}/export` answers and import takes.
    pub fn export(&self) -> Value {
        serde_json::json!({"kind": DOCUMENT_KIND, "version": DOCUMENT_VERSION, "calibration": self.to_json()})
    }

    fn signature(&self, signature: Signature) -> Option<&SignatureFit> {
        let hex = signature.hex();
        self.signatures.iter().find(|s| s.signature == hex)
    }

    /// Whether a document's fit is one a server could have written: every number finite, every
    /// temperature in range, labels and biases consistent. Each problem names its field.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !valid_id(&self.id) {
            out.push((
                "calibration.id".into(),
                format!(
                    "'{}' is not a calibration id (1-128 of A-Z a-z 0-9 _ -)",
                    self.id
                ),
            ));
        }
        if !(self.holdout_fraction > 0.0 && self.holdout_fraction < 1.0) {
            out.push((
                "calibration.holdout_fraction".into(),
                "must be between 0 and 1".into(),
            ));
        }
        if self.signatures.is_empty() {
            out.push((
                "calibration.signatures".into(),
                "a calibration has at least one signature".into(),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, s) in self.signatures.iter().enumerate() {
            let at = |f: &str| format!("calibration.signatures.{i}.{f}");
            if Signature::from_hex(&s.signature).is_none() {
                out.push((at("signature"), "must be 16 lowercase hex digits".into()));
            } else if !seen.insert(s.signature.clone()) {
                out.push((
                    at("signature"),
                    format!("signature {} is fitted twice", s.signature),
                ));
            }
            if !["choice", "noul", "score"].contains(&s.kind.as_str()) {
                out.push((
                    at("kind"),
                    "must be one of 'choice', 'noul', 'score'".into(),
                ));
            }
            if s.labels.is_empty() {
                out.push((at("labels"), "a fit has at least one label".into()));
            }
            if !(s.temperature.is_finite()
                && (fit::MIN_TEMPERATURE..=fit::MAX_TEMPERATURE).contains(&s.temperature))
            {
                out.push((
                    at("temperature"),
                    format!(
                        "must be between {} and {}",
                        fit::MIN_TEMPERATURE,
                        fit::MAX_TEMPERATURE
                    ),
                ));
            }
            let method_ok = match (&s.biases, s.method.as_str()) {
                (None, METHOD_TEMPERATURE) => true,
                (None, METHOD_NONE) => s.temperature == 1.0,
                (Some(b), METHOD_BIASES) => {
                    b.len() == s.labels.len()
                        && s.labels
                            .iter()
                            .all(|l| b.get(l).is_some_and(|x| x.is_finite()))
                }
                _ => false,
            };
            if !method_ok {
                out.push((
                    at("biases"),
                    format!("method '{}' takes {}", s.method, "no biases ('temperature'), temperature 1 and no biases ('none') or one finite bias per label ('temperature+bias')"),
                ));
            }
        }
        out
    }
}

/// A calibration id: what `x_calibration` and the routes accept.
pub fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A number as a fit keeps it: rounded to 12 decimals, so that its JSON text parses back to the
/// same `f64` on every server (export → import gives bit-for-bit the same answers).
pub fn exact(x: f64) -> f64 {
    format!("{x:.12}").parse().unwrap_or(x)
}

/// The labels of a question in a fit's order, and for each the index of that answer in the question
/// as sent.
pub fn labels(kind: &QuestionKind) -> (Vec<String>, Vec<usize>) {
    match kind {
        QuestionKind::Choice { options } => {
            let mut order: Vec<usize> = (0..options.len()).collect();
            order.sort_by(|&a, &b| options[a].name.cmp(&options[b].name));
            (
                order.iter().map(|&i| options[i].name.clone()).collect(),
                order,
            )
        }
        QuestionKind::YesNo { .. } => (vec!["true".into(), "false".into()], vec![0, 1]),
        QuestionKind::Score { levels, .. } => (
            (0..levels.len()).map(|i| i.to_string()).collect(),
            (0..levels.len()).collect(),
        ),
    }
}

/// System One's name of a question's type.
pub fn kind_name(kind: &QuestionKind) -> &'static str {
    match kind {
        QuestionKind::Choice { .. } => "choice",
        QuestionKind::YesNo { .. } => "noul",
        QuestionKind::Score { .. } => "score",
    }
}

/// Why the calibration store or a fit in it cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BookError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the stored calibration '{id}' cannot be read: {reason}")]
    Corrupt { id: String, reason: String },
}

/// Fits by id, each with its place in the order stored.
type Placed = BTreeMap<String, (u64, Arc<Fit>)>;

/// The fits of this server: the database, and a copy of its fits in memory that requests read (a
/// write replaces the copy; a read takes the current one without waiting for the database).
pub struct Book {
    store: Store,
    /// Each fit with its place in the order it was stored (`created` has whole seconds, so two fits
    /// of one second are told apart by which was stored later).
    fits: RwLock<Arc<Placed>>,
    /// This server's model and wording; `None` when it has no read strategy (nothing is read).
    pub server: Option<Provenance>,
}

/// What a request's `x_calibration` resolved to, before its reads.
#[derive(Clone, Debug)]
pub enum Resolved {
    One(Arc<Fit>),
    /// `auto`: the fits of this model and wording, newest first.
    Auto(Vec<Arc<Fit>>),
}

impl Book {
    /// Opens (or creates) the database under `data_dir`, or one in memory without it, and loads its
    /// fits.
    pub fn open(data_dir: Option<&Path>, server: Option<Provenance>) -> Result<Book, BookError> {
        let store = Store::open(data_dir)?;
        let mut fits = BTreeMap::new();
        for (id, text) in store.all()? {
            // A row this build cannot read (written by another version, edited by hand) is left in
            // the file and not served: a request naming it is refused as unknown, and the log says why.
            match parse_stored(&id, &text) {
                Ok(fit) => {
                    let place = fits.len() as u64;
                    fits.insert(id, (place, Arc::new(fit)));
                }
                Err(e) => tracing::error!("{e}; it is not served"),
            }
        }
        Ok(Book {
            store,
            fits: RwLock::new(Arc::new(fits)),
            server,
        })
    }

    /// Where fits are kept: the database file, or `None` in memory.
    pub fn location(&self) -> Option<&Path> {
        self.store.path()
    }

    fn snapshot(&self) -> Arc<Placed> {
        match self.fits.read() {
            Ok(f) => f.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, f: impl FnOnce(&mut Placed)) {
        let mut guard = match self.fits.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut next = (**guard).clone();
        f(&mut next);
        *guard = Arc::new(next);
    }

    /// Every fit, oldest first: by `created`, then in the order stored (the same after a restart).
    pub fn list(&self) -> Vec<Arc<Fit>> {
        let mut all: Vec<(u64, Arc<Fit>)> = self.snapshot().values().cloned().collect();
        all.sort_by_key(|(place, fit)| (fit.created, *place));
        all.into_iter().map(|(_, fit)| fit).collect()
    }

    pub fn get(&self, id: &str) -> Option<Arc<Fit>> {
        self.snapshot().get(id).map(|(_, fit)| fit.clone())
    }

    /// Stores a fit (its numbers as its JSON text reads back) and answers it as stored. An id held
    /// already: the same fit is answered as stored (`false`: nothing was written); another is a 409.
    pub fn insert(&self, fit: &Fit) -> Result<(Arc<Fit>, bool), DecisionError> {
        let text = serde_json::to_string(fit)
            .map_err(|e| DecisionError::Internal(format!("cannot encode a calibration: {e}")))?;
        let stored = Arc::new(
            parse_stored(&fit.id, &text).map_err(|e| DecisionError::Internal(e.to_string()))?,
        );
        if let Some(held) = self.get(&fit.id) {
            if *held == *stored {
                return Ok((held, false));
            }
            return Err(DecisionError::Conflict(format!(
                "a different calibration '{}' is stored already; delete it first (DELETE /v1/calibrations/{})",
                fit.id, fit.id
            )));
        }
        self.store
            .insert(&fit.id, fit.created, &text)
            .map_err(|e| DecisionError::Internal(e.to_string()))?;
        self.replace(|fits| {
            let place = fits.values().map(|(p, _)| p + 1).max().unwrap_or(0);
            fits.insert(fit.id.clone(), (place, stored.clone()));
        });
        Ok((stored, true))
    }

    /// Deletes a fit; `false` when there was none.
    pub fn delete(&self, id: &str) -> Result<bool, DecisionError> {
        let deleted = self
            .store
            .delete(id)
            .map_err(|e| DecisionError::Internal(e.to_string()))?;
        self.replace(|fits| {
            fits.remove(id);
        });
        Ok(deleted)
    }

    /// A request's `x_calibration`, checked before anything is read: an id this server does not
    /// hold, or a fit of another model or wording, is refused naming the field.
    pub fn resolve(&self, choice: &CalibrationChoice) -> Result<Resolved, DecisionError> {
        let refuse = |message: String| DecisionError::BadRequest {
            param: Some(FIELD.into()),
            message: format!("{FIELD}: {message}"),
        };
        let server = self.server.as_ref();
        match choice {
            CalibrationChoice::Id(id) => {
                let fit = self.get(id).ok_or_else(|| {
                    refuse(format!(
                        "no calibration '{id}' on this server (GET /v1/calibrations lists them)"
                    ))
                })?;
                let provenance = fit.provenance();
                match server {
                    Some(s) if *s == provenance => Ok(Resolved::One(fit)),
                    Some(s) => Err(refuse(format!(
                        "calibration '{id}' was fitted on {provenance}; this server reads {s}, so it is not applied"
                    ))),
                    None => Err(refuse(format!(
                        "calibration '{id}' cannot be applied: this server has no read strategy"
                    ))),
                }
            }
            CalibrationChoice::Auto => {
                let mut fits: Vec<Arc<Fit>> = self
                    .list()
                    .into_iter()
                    .filter(|f| server.is_some_and(|s| *s == f.provenance()))
                    .collect();
                fits.reverse();
                Ok(Resolved::Auto(fits))
            }
        }
    }
}

fn parse_stored(id: &str, text: &str) -> Result<Fit, BookError> {
    serde_json::from_str(text).map_err(|e| BookError::Corrupt {
        id: id.to_owned(),
        reason: e.to_string(),
    })
}

impl Resolved {
    /// Calibrates each answer whose question's signature the fit (or, for `auto`, the newest fit
    /// holding it) has, and says for every answer which fit it used or why none.
    pub fn apply(&self, questions: &[Question], answers: &mut [Answer]) -> Vec<CalibrationReport> {
        questions
            .iter()
            .zip(answers.iter_mut())
            .map(|(question, answer)| {
                let signature = Signature::form(question);
                let found = match self {
                    Resolved::One(fit) => fit.signature(signature).map(|s| (fit, s)).ok_or_else(|| {
                        format!(
                            "calibration '{}' has no fit for this question (signature {})",
                            fit.id,
                            signature.hex()
                        )
                    }),
                    Resolved::Auto(fits) => fits
                        .iter()
                        .find_map(|f| f.signature(signature).map(|s| (f, s)))
                        .ok_or_else(|| {
                            format!(
                                "no calibration of this model and prompt format has a fit for this question (signature {})",
                                signature.hex()
                            )
                        }),
                };
                let (fit, fitted) = match found {
                    Ok(found) => found,
                    Err(reason) => return CalibrationReport::None { reason },
                };
                if fitted.method == METHOD_NONE {
                    return CalibrationReport::None {
                        reason: format!(
                            "calibration '{}' leaves signature {} uncalibrated: no fit lowered its held-out log-loss",
                            fit.id, fitted.signature
                        ),
                    };
                }
                let (labels, order) = labels(&question.kind);
                if labels != fitted.labels || answer.probabilities.len() != labels.len() {
                    return CalibrationReport::None {
                        reason: format!(
                            "calibration '{}' fits signature {} over other labels",
                            fit.id, fitted.signature
                        ),
                    };
                }
                let in_fit_order: Vec<f64> =
                    order.iter().map(|&i| answer.probabilities[i]).collect();
                let calibrated = fitted.parameters().apply(&in_fit_order);
                for (p, &i) in calibrated.into_iter().zip(&order) {
                    answer.probabilities[i] = p;
                }
                CalibrationReport::Applied {
                    id: fit.id.clone(),
                    signature: fitted.signature.clone(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
