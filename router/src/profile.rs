//! Compatibility profiles (`--compat`, spec/API.md §6): every way the default, `vllm` and `sglang`
//! profiles differ — wording, status codes, option limits, usage counting, confidence — in one place.

use axum::http::StatusCode;
use clap::ValueEnum;

use crate::error::DecisionError;
use crate::ir::{Answer, Usage};
use crate::limits::{Limits, DIGIT_LABELS, LETTER_LABELS};

/// vLLM's question limit (seeds 000/001 "Limits", and its OpenAI MVP's "1–64 questions").
pub const VLLM_MAX_QUESTIONS: usize = 64;
/// OpenAI's upstream schema limits (seed 000: "Upstream permits 200 questions and 255 choices").
pub const OPENAI_MAX_QUESTIONS: usize = 200;
pub const OPENAI_MAX_CHOICES: usize = 255;
use crate::probability;
use crate::prompt::wording::Wording;
use crate::question_kind::Kind;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Compat {
    /// TypeSafe System One contract (default).
    #[default]
    Typesafe,
    /// vLLM's decision endpoints, byte for byte.
    Vllm,
    /// SGLang's decision endpoints, byte for byte.
    Sglang,
}

/// The wire shape a request arrived in; error statuses depend on it as well as on the profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    SystemOne,
    OpenAi,
    Sglang,
}

/// Token counts as a profile reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountedUsage {
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
}

impl Compat {
    pub fn name(&self) -> &'static str {
        match self {
            Compat::Typesafe => "typesafe",
            Compat::Vllm => "vllm",
            Compat::Sglang => "sglang",
        }
    }

    /// The wording every route renders in (spec/API.md §6); never chosen by the wire shape.
    pub fn wording(&self) -> Wording {
        match self {
            Compat::Sglang => Wording::Sglang,
            _ => Wording::Vllm,
        }
    }

    /// The request limits of a shape under this profile: the operator's limits (`base`, the default
    /// profile's), narrowed where the profile's seed says less. vLLM (seeds 000/001): 64 questions,
    /// 26 options, 10 levels, a score with at least two levels, on every route. OpenAI's shape keeps
    /// upstream's 200 questions and 255 choices in the other profiles.
    pub fn limits(&self, shape: Shape, base: &Limits) -> Limits {
        match (self, shape) {
            (Compat::Vllm, _) => Limits {
                max_questions: base.max_questions.min(VLLM_MAX_QUESTIONS),
                max_choices: base.max_choices.min(LETTER_LABELS),
                max_levels: base.max_levels.min(DIGIT_LABELS),
                min_levels: base.min_levels.max(2),
                ..base.clone()
            },
            (_, Shape::OpenAi) => Limits {
                max_questions: base.max_questions.min(OPENAI_MAX_QUESTIONS),
                max_choices: base.max_choices.min(OPENAI_MAX_CHOICES),
                ..base.clone()
            },
            _ => base.clone(),
        }
    }

    /// Why System One refuses a question id: blank ids by default, empty ones under vLLM ("a question
    /// id is a non-empty string", seeds 000/001, and vLLM 0.32's `if not qid`), none under SGLang
    /// (seed 003: "empty or blank question ids are accepted, as the System One schema allows").
    pub fn question_id_problem(&self, id: &str) -> Option<&'static str> {
        match self {
            Compat::Typesafe if id.trim().is_empty() => {
                Some("question ids must be non-blank strings")
            }
            Compat::Vllm if id.is_empty() => Some("question ids must be non-empty strings"),
            _ => None,
        }
    }

    /// Whether a `noul` with neither instructions nor descriptions is read: vLLM 0.32 reads it as "yes /
    /// no / Answer with yes or no only."; the default and SGLang refuse it (seed 003: "the SDK's bare
    /// `Noul()`, is refused").
    pub fn reads_bare_noul(&self) -> bool {
        *self == Compat::Vllm
    }

    /// Whether the OpenAI shape's `input` is text from user messages only (vLLM's MVP, seed 000: "an
    /// array of user messages with string content or input_text parts"; "Image inputs, other message
    /// roles ... are outside this MVP"). The other profiles join every role and read `input_image`.
    pub fn openai_input_is_user_text_only(&self) -> bool {
        *self == Compat::Vllm
    }

    /// The HTTP status of an error in a shape under this profile.
    pub fn status(&self, error: &DecisionError, shape: Shape) -> StatusCode {
        match error {
            DecisionError::Invalid(_) => match (shape, self) {
                (Shape::SystemOne, Compat::Typesafe | Compat::Sglang) => {
                    StatusCode::UNPROCESSABLE_ENTITY
                }
                _ => StatusCode::BAD_REQUEST,
            },
            // 529 is TypeSafe's "overloaded" (its SDK backs off on it); the others use 429.
            DecisionError::Overloaded { .. } | DecisionError::Backlogged { .. }
                if shape == Shape::SystemOne && *self == Compat::Typesafe =>
            {
                error.status()
            }
            DecisionError::Overloaded { .. } | DecisionError::Backlogged { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            // vLLM (seeds 000/001): "Each label must be one token there, or the request returns 400";
            // a model without a read strategy stays a 501 there ("Models without a supported read
            // strategy return 501").
            DecisionError::Unlabelable(_) if *self == Compat::Vllm => StatusCode::BAD_REQUEST,
            // SGLang (seed 003, "Errors"): a label that is not one token, a prompt over the context and
            // a model it cannot serve are 400s, on its shape and on System One under its profile
            // ("other refusals return 400"), never a 413 or a 501 that clients might retry.
            DecisionError::NotServable(_)
            | DecisionError::Unlabelable(_)
            | DecisionError::PromptTooLong { .. }
            | DecisionError::TokensExceeded { .. }
                if shape == Shape::Sglang || *self == Compat::Sglang =>
            {
                StatusCode::BAD_REQUEST
            }
            other => other.status(),
        }
    }

    /// The System One body's `error_type` of an error under this profile: TypeSafe's vocabulary, kept
    /// consistent with the status the profile gives it. A refusal SGLang answers with 400 (a label
    /// that is not one token, a model it cannot serve: seed 003, "other refusals return 400") is an
    /// `invalid_request` there, not the default profile's `not_implemented` (501).
    pub fn error_type(&self, error: &DecisionError, shape: Shape) -> &'static str {
        match error {
            DecisionError::NotServable(_) | DecisionError::Unlabelable(_)
                if self.status(error, shape) == StatusCode::BAD_REQUEST =>
            {
                "invalid_request"
            }
            other => other.error_type(),
        }
    }

    /// Usage as the profile counts it: tokens actually needed (default), or Σ per-question prompts
    /// with one output token per question (vLLM) or none (SGLang).
    pub fn usage(&self, usage: &Usage, questions: usize) -> CountedUsage {
        if usage.pooled {
            // One read holds every question (Clef): the prompt counts once, nothing is generated.
            return CountedUsage {
                input_tokens: usage.input_tokens,
                cached_tokens: usage.cached_tokens,
                output_tokens: 0,
            };
        }
        match self {
            Compat::Typesafe => CountedUsage {
                input_tokens: usage.input_tokens,
                cached_tokens: usage.cached_tokens,
                output_tokens: 0,
            },
            Compat::Vllm => CountedUsage {
                input_tokens: usage.per_question_prompt_tokens,
                cached_tokens: 0,
                output_tokens: questions as u64,
            },
            Compat::Sglang => CountedUsage {
                input_tokens: usage.per_question_prompt_tokens,
                cached_tokens: 0,
                output_tokens: 0,
            },
        }
    }

    /// Confidence of an answer; `None` where the profile reports none (yes/no outside vLLM).
    pub fn confidence(&self, kind: Kind, answer: &Answer) -> Option<f64> {
        let p = &answer.probabilities;
        if answer.pooled {
            // The head has no labels: the chosen option's probability, in every profile (the seeds).
            return Some(p[probability::argmax(p)]);
        }
        match self {
            // vLLM: the chosen label's full-vocabulary probability (its share times the label mass).
            Compat::Vllm => Some(p[probability::argmax(p)] * answer.label_mass),
            // TypeSafe's formula of the question's kind (`question_kind.rs`).
            _ => kind.confidence(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(p: Vec<f64>, mass: f64) -> Answer {
        Answer {
            label_logprobs: p.iter().map(|x| (x * mass).ln()).collect(),
            probabilities: p,
            label_mass: mass,
            argmax_is_label: true,
            pooled: false,
        }
    }

    #[test]
    fn limits_per_profile_and_shape() {
        let base = Limits::default();
        for shape in [Shape::SystemOne, Shape::OpenAi, Shape::Sglang] {
            let vllm = Compat::Vllm.limits(shape, &base);
            assert_eq!(
                (
                    vllm.max_questions,
                    vllm.max_choices,
                    vllm.max_levels,
                    vllm.min_levels
                ),
                (64, 26, 10, 2)
            );
        }
        let openai = Compat::Typesafe.limits(Shape::OpenAi, &base);
        assert_eq!((openai.max_questions, openai.max_choices), (200, 255));
        let s1 = Compat::Typesafe.limits(Shape::SystemOne, &base);
        assert_eq!((s1.max_questions, s1.min_levels), (base.max_questions, 1));
        let refusal = DecisionError::NotServable("label 'BQ' is not one token".into());
        assert_eq!(
            Compat::Sglang.status(&refusal, Shape::SystemOne).as_u16(),
            400
        );
        assert_eq!(
            Compat::Typesafe.status(&refusal, Shape::Sglang).as_u16(),
            400
        );
        assert_eq!(
            Compat::Typesafe.status(&refusal, Shape::SystemOne).as_u16(),
            501
        );
    }

    /// Seeds 000/001: a label that is not one token is a 400 under vLLM, while a model without a read
    /// strategy stays a 501; the default profile answers both with 501.
    #[test]
    fn label_refusals_are_400_under_vllm_and_unservable_models_501() {
        let refusal = DecisionError::Unlabelable("label 'A' is not one token".into());
        let unserved = DecisionError::NotServable("no read strategy".into());
        for shape in [Shape::SystemOne, Shape::OpenAi] {
            assert_eq!(Compat::Vllm.status(&refusal, shape).as_u16(), 400);
            assert_eq!(Compat::Vllm.status(&unserved, shape).as_u16(), 501);
            assert_eq!(Compat::Typesafe.status(&refusal, shape).as_u16(), 501);
            assert_eq!(Compat::Sglang.status(&refusal, shape).as_u16(), 400);
        }
        assert_eq!(
            Compat::Typesafe.status(&refusal, Shape::Sglang).as_u16(),
            400
        );
    }

    #[test]
    fn error_type_follows_the_profile_status() {
        let refusal = DecisionError::Unlabelable("label 'BQ' is not one token".into());
        assert_eq!(
            Compat::Sglang.error_type(&refusal, Shape::SystemOne),
            "invalid_request"
        );
        assert_eq!(
            Compat::Typesafe.error_type(&refusal, Shape::SystemOne),
            "not_implemented"
        );
        assert_eq!(
            Compat::Vllm.error_type(&refusal, Shape::SystemOne),
            "invalid_request"
        );
        let unserved = DecisionError::NotServable("no read strategy".into());
        assert_eq!(
            Compat::Vllm.error_type(&unserved, Shape::SystemOne),
            "not_implemented"
        );
        assert_eq!(
            Compat::Sglang.error_type(&unserved, Shape::SystemOne),
            "invalid_request"
        );
        let long = DecisionError::PromptTooLong {
            question: "q".into(),
            got: 2,
            limit: 1,
        };
        assert_eq!(
            Compat::Sglang.error_type(&long, Shape::SystemOne),
            "tokens_exceeded"
        );
    }

    #[test]
    fn validation_and_overload_statuses_follow_the_table() {
        let invalid = DecisionError::Invalid(vec![]);
        assert_eq!(
            Compat::Typesafe.status(&invalid, Shape::SystemOne).as_u16(),
            422
        );
        assert_eq!(
            Compat::Sglang.status(&invalid, Shape::SystemOne).as_u16(),
            422
        );
        assert_eq!(
            Compat::Vllm.status(&invalid, Shape::SystemOne).as_u16(),
            400
        );
        assert_eq!(
            Compat::Typesafe.status(&invalid, Shape::OpenAi).as_u16(),
            400
        );
        assert_eq!(
            Compat::Typesafe.status(&invalid, Shape::Sglang).as_u16(),
            400
        );
        let busy = DecisionError::Overloaded {
            queued: 1,
            limit: 1,
            retry_after_secs: 1,
        };
        assert_eq!(
            Compat::Typesafe.status(&busy, Shape::SystemOne).as_u16(),
            529
        );
        assert_eq!(Compat::Vllm.status(&busy, Shape::SystemOne).as_u16(), 429);
        assert_eq!(Compat::Typesafe.status(&busy, Shape::OpenAi).as_u16(), 429);
        assert_eq!(
            Compat::Typesafe
                .status(&DecisionError::Unauthorized, Shape::OpenAi)
                .as_u16(),
            401
        );
    }

    #[test]
    fn usage_per_profile() {
        let u = Usage {
            input_tokens: 100,
            cached_tokens: 40,
            per_question_prompt_tokens: 250,
            pooled: false,
        };
        assert_eq!(
            Compat::Typesafe.usage(&u, 3),
            CountedUsage {
                input_tokens: 100,
                cached_tokens: 40,
                output_tokens: 0
            }
        );
        assert_eq!(
            Compat::Vllm.usage(&u, 3),
            CountedUsage {
                input_tokens: 250,
                cached_tokens: 0,
                output_tokens: 3
            }
        );
        assert_eq!(
            Compat::Sglang.usage(&u, 3),
            CountedUsage {
                input_tokens: 250,
                cached_tokens: 0,
                output_tokens: 0
            }
        );
    }

    #[test]
    fn confidence_per_profile() {
        let a = answer(vec![0.88, 0.12], 0.5);
        assert!((Compat::Typesafe.confidence(Kind::Choice, &a).unwrap() - 0.76).abs() < 1e-12);
        assert!((Compat::Vllm.confidence(Kind::Choice, &a).unwrap() - 0.44).abs() < 1e-12);
        assert_eq!(Compat::Typesafe.confidence(Kind::YesNo, &a), None);
        assert!((Compat::Vllm.confidence(Kind::YesNo, &a).unwrap() - 0.44).abs() < 1e-12);
    }
}
