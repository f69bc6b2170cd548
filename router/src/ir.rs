//! The decision IR: what every wire shape parses into and everything after parsing works on.
//! Nothing here knows about JSON field names or response shapes.

use clap::ValueEnum;
use serde_json::Value;

use crate::probability;
pub use crate::probability::Answer;
use crate::question_kind::Kind;

/// One decision request, independent of the wire shape it arrived in.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionRequest {
    /// The state as sent: a string, or any JSON value rendered by the wording's JSON rule.
    pub state: Value,
    /// Request-level context (a system message in vLLM wording).
    pub instructions: Option<String>,
    pub questions: Vec<Question>,
    /// Extra variables for the chat template (`enable_thinking` is checked, never forced on).
    pub chat_template_kwargs: serde_json::Map<String, Value>,
    /// Reads with different salts never share cached prefixes.
    pub cache_salt: String,
    /// Images, audio and videos attached to the request (URLs or data URLs), in request order.
    pub media: Media,
    /// Read several questions together (one canvas for many on block-diffusion models); a strategy
    /// that reads each question on its own refuses it.
    pub joint: bool,
    /// `x_debias`: how this request's questions are read; `None` takes the server's `--debias`.
    pub debias: Option<Debias>,
    /// `x_calibration`: the calibration its answers use (`calibration/`); `None`: none, and its
    /// answers say nothing about calibration.
    pub calibration: Option<CalibrationChoice>,
}

/// A kind of media input, named as the request field that carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Modality {
    Image,
    Audio,
    Video,
}

impl Modality {
    pub const ALL: [Modality; 3] = [Modality::Image, Modality::Audio, Modality::Video];

    /// The request field (`images`, `audio`, `videos`).
    pub fn field(&self) -> &'static str {
        match self {
            Modality::Image => "images",
            Modality::Audio => "audio",
            Modality::Video => "videos",
        }
    }

    /// The word for it in messages ("this model does not take image inputs").
    pub fn noun(&self) -> &'static str {
        match self {
            Modality::Image => "image",
            Modality::Audio => "audio",
            Modality::Video => "video",
        }
    }
}

/// Media URLs by kind. A strategy reads the kinds it takes; any other kind present refuses the request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Media {
    pub images: Vec<String>,
    pub audio: Vec<String>,
    pub videos: Vec<String>,
    /// Where each image sits on the wire when the shape carries images as message parts (the OpenAI
    /// shape: `input[i].content[j]` is `(i, j)`), so errors about an image name that place; empty for
    /// shapes with an `images` field (errors name `images.N`).
    pub image_parts: Vec<(usize, usize)>,
}

impl Media {
    pub fn of(&self, modality: Modality) -> &[String] {
        match modality {
            Modality::Image => &self.images,
            Modality::Audio => &self.audio,
            Modality::Video => &self.videos,
        }
    }

    /// The kinds present, in field order.
    pub fn present(&self) -> Vec<Modality> {
        Modality::ALL
            .into_iter()
            .filter(|m| !self.of(*m).is_empty())
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Question {
    /// The caller's key for this question, echoed byte-exact.
    pub id: String,
    pub instructions: Option<String>,
    pub kind: QuestionKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum QuestionKind {
    /// Pick one of the options, in request order.
    Choice { options: Vec<ChoiceOption> },
    /// Yes or no, each side optionally described.
    YesNo {
        yes: Option<String>,
        no: Option<String>,
        /// Shown no side first (the second label order of a debiased read, `debias.rs`); answers
        /// stay yes then no, read by label.
        no_first: bool,
    },
    /// One of the ordered levels; level i is worth i. `levels` are the texts the prompt shows (an
    /// object level rendered as JSON); `sent` holds each level exactly as the request sent it (an
    /// object stays an object), for the shapes that echo them.
    Score {
        levels: Vec<String>,
        sent: Vec<Value>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChoiceOption {
    pub name: String,
    pub description: Option<String>,
}

/// An answer in its question's terms, with what the wire shapes echo: the chosen option of a choice
/// (the most probable; the first of equals), the two sides of a yes/no, a score's expected level
/// (level i is worth i). Every shape's `format` (`api/`) spells one of these; none recomputes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reading<'a> {
    Choice {
        options: &'a [ChoiceOption],
        chosen: usize,
    },
    YesNo {
        yes: f64,
        no: f64,
    },
    Score {
        sent: &'a [Value],
        expected: f64,
    },
}

impl QuestionKind {
    /// The answer `p` (renormalised probabilities in answer order) as this question reads it.
    pub fn reading(&self, p: &[f64]) -> Reading<'_> {
        match self {
            QuestionKind::Choice { options } => Reading::Choice {
                options,
                chosen: probability::argmax(p),
            },
            QuestionKind::YesNo { .. } => Reading::YesNo {
                yes: p[0],
                no: p[1],
            },
            QuestionKind::Score { sent, .. } => Reading::Score {
                sent,
                expected: probability::expected_score(p),
            },
        }
    }

    /// A score whose levels were sent as these strings.
    pub fn score(levels: Vec<String>) -> Self {
        let sent = levels.iter().map(|l| Value::String(l.clone())).collect();
        QuestionKind::Score { levels, sent }
    }

    /// Its row in the question-kind table (`question_kind.rs`): labels, reply line, confidence.
    pub fn kind(&self) -> Kind {
        match self {
            QuestionKind::Choice { .. } => Kind::Choice,
            QuestionKind::YesNo { .. } => Kind::YesNo,
            QuestionKind::Score { .. } => Kind::Score,
        }
    }

    /// The smallest question of a kind: what a strategy is asked about at startup (its refusals).
    pub fn probe(kind: Kind) -> Self {
        match kind {
            Kind::Choice => QuestionKind::Choice {
                options: vec![ChoiceOption {
                    name: "a".into(),
                    description: None,
                }],
            },
            Kind::YesNo => QuestionKind::YesNo {
                yes: None,
                no: None,
                no_first: false,
            },
            Kind::Score => QuestionKind::score(vec!["0".into()]),
        }
    }

    /// How many answers the question allows (its label count).
    pub fn arity(&self) -> usize {
        match self {
            QuestionKind::Choice { options } => options.len(),
            QuestionKind::YesNo { .. } => 2,
            QuestionKind::Score { levels, .. } => levels.len(),
        }
    }
}

/// The answers of one request, in question order, and its honest token usage.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub answers: Vec<Answer>,
    pub usage: Usage,
    /// Per answer, what a debiased read used (`debias.rs`); `None` when each question was read once,
    /// in the order sent.
    pub orders: Option<Vec<OrderReport>>,
    /// Per answer, the calibration it used or why none (`calibration/`); `None` when the request
    /// asked for none.
    pub calibration: Option<Vec<CalibrationReport>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens the request needed (a prefix shared by its questions counts once).
    pub input_tokens: u64,
    /// Of those, tokens served from the shard's prefix cache.
    pub cached_tokens: u64,
    /// Sum of every question's full prompt, as a per-question prefill server would count.
    pub per_question_prompt_tokens: u64,
    /// Every question was read in one pooled read (Clef): every profile counts the prompt once and no
    /// output tokens.
    pub pooled: bool,
}

/// How a request's questions are read (`--debias`, `x_debias`); the reads themselves are `debias.rs`'s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Debias {
    /// One read in the order sent.
    #[default]
    Off,
    /// A choice under cyclic rotations of its options (all of them up to `--debias-max-orders`, else
    /// evenly spaced ones), a score under both level orders, a yes/no under both label orders; each
    /// answer's probabilities averaged by name.
    Rotate,
    /// PriDe: a choice is read once and its label prior divided out, once its question signature has
    /// a prior estimated from earlier traffic; until then it is read under all its rotations (which
    /// adds a sample). Scores and yes/no questions are read as `rotate` reads them.
    Prior,
}

impl Debias {
    pub const ALL: [Debias; 3] = [Debias::Off, Debias::Rotate, Debias::Prior];

    pub fn name(self) -> &'static str {
        match self {
            Debias::Off => "off",
            Debias::Rotate => "rotate",
            Debias::Prior => "prior",
        }
    }

    /// The value as a request sends it (`"off"`, `"rotate"`).
    pub fn from_name(name: &str) -> Option<Debias> {
        Debias::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// What one debiased answer used, reported where the profile puts its diagnostics.
#[derive(Clone, Debug, PartialEq)]
pub struct OrderReport {
    pub method: Debias,
    /// Orders read.
    pub orders: usize,
    /// The largest change of the chosen option's probability across the orders read
    /// (max − min of its probability in each order); `None` for a question read in one order (a
    /// prior-corrected read), where nothing was measured.
    pub order_sensitivity: Option<f64>,
    /// A prior-corrected read: the samples its signature's prior was estimated from.
    pub prior_samples: Option<u64>,
}

impl OrderReport {
    /// The report as diagnostics fields (`prefix` "" in a diagnostics map, "x_" on an answer object
    /// of a shape without one): `debias`, `orders`, `order_sensitivity`.
    pub fn fields(&self, prefix: &str) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        out.insert(format!("{prefix}debias"), self.method.name().into());
        out.insert(format!("{prefix}orders"), self.orders.into());
        if let Some(s) = self.order_sensitivity {
            out.insert(format!("{prefix}order_sensitivity"), s.into());
        }
        if let Some(n) = self.prior_samples {
            out.insert(format!("{prefix}prior_samples"), n.into());
        }
        out
    }
}

/// A request's `x_calibration`: a stored fit by id, or `auto`, each answer the newest fit of this
/// model and wording that holds its question's signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CalibrationChoice {
    Id(String),
    Auto,
}

/// What calibrated one answer, reported where the profile puts its diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CalibrationReport {
    /// The fit and the signature whose parameters were applied.
    Applied { id: String, signature: String },
    /// No fit matched the question.
    None { reason: String },
}

impl CalibrationReport {
    /// The report as one diagnostics field (`prefix` "" in a diagnostics map, "x_" on an answer
    /// object of a shape without one): `calibration: {"id", "signature"}` or `{"id": null, "reason"}`.
    pub fn field(&self, prefix: &str) -> (String, serde_json::Value) {
        let value = match self {
            CalibrationReport::Applied { id, signature } => {
                serde_json::json!({"id": id, "signature": signature})
            }
            CalibrationReport::None { reason } => serde_json::json!({"id": null, "reason": reason}),
        };
        (format!("{prefix}calibration"), value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(names: &[&str]) -> Vec<ChoiceOption> {
        names
            .iter()
            .map(|n| ChoiceOption {
                name: n.to_string(),
                description: None,
            })
            .collect()
    }

    #[test]
    fn a_reading_is_the_answer_in_its_questions_terms() {
        let choice = QuestionKind::Choice {
            options: options(&["a", "b", "c"]),
        };
        match choice.reading(&[0.2, 0.5, 0.3]) {
            Reading::Choice { options, chosen } => assert_eq!(options[chosen].name, "b"),
            other => panic!("{other:?}"),
        }
        // Equal probabilities: the first listed option is chosen, in every wire shape.
        match choice.reading(&[0.4, 0.2, 0.4]) {
            Reading::Choice { chosen, .. } => assert_eq!(chosen, 0),
            other => panic!("{other:?}"),
        }
        let yes_no = QuestionKind::YesNo {
            yes: None,
            no: None,
            no_first: false,
        };
        assert_eq!(
            yes_no.reading(&[0.7, 0.3]),
            Reading::YesNo { yes: 0.7, no: 0.3 }
        );
        let score = QuestionKind::score(vec!["low".into(), "mid".into(), "high".into()]);
        match score.reading(&[0.25, 0.25, 0.5]) {
            Reading::Score { sent, expected } => {
                assert_eq!(sent.len(), 3);
                assert!((expected - 1.25).abs() < 1e-12);
            }
            other => panic!("{other:?}"),
        }
    }
}
