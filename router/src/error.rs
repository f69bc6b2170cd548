//! Domain errors of the router and the one mapping from an error to an HTTP status.
//! Each wire shape renders the body its own way (see `api::*::error_body`).

use axum::http::StatusCode;
use serde_json::Value;

/// One part of a field path: an object key or an array index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    Key(String),
    Index(usize),
}

impl From<&str> for Loc {
    fn from(s: &str) -> Self {
        Loc::Key(s.to_owned())
    }
}
impl From<String> for Loc {
    fn from(s: String) -> Self {
        Loc::Key(s)
    }
}
impl From<usize> for Loc {
    fn from(i: usize) -> Self {
        Loc::Index(i)
    }
}

impl Loc {
    pub fn to_json(&self) -> Value {
        match self {
            Loc::Key(k) => Value::String(k.clone()),
            Loc::Index(i) => Value::from(*i),
        }
    }
}

/// A request field that failed validation: where, why, and a machine-readable kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path from the body root, e.g. `["body", "questions", "tone", "criteria"]`.
    pub loc: Vec<Loc>,
    pub msg: String,
    /// pydantic-style kind: `missing`, `string_type`, `value_error`, `extra_forbidden`, ...
    pub kind: &'static str,
}

impl FieldError {
    pub fn new(loc: Vec<Loc>, kind: &'static str, msg: impl Into<String>) -> Self {
        FieldError {
            loc,
            msg: msg.into(),
            kind,
        }
    }

    /// The dotted form used in messages and in `param` fields: `questions.tone.criteria`.
    pub fn param(&self) -> String {
        self.loc
            .iter()
            .skip_while(|l| matches!(l, Loc::Key(k) if k == "body"))
            .map(|l| match l {
                Loc::Key(k) => k.clone(),
                Loc::Index(i) => i.to_string(),
            })
            .collect::<Vec<_>>()
            .join(".")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    #[error("invalid request: {}", .0.iter().map(|e| format!("{}: {}", e.param(), e.msg)).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<FieldError>),
    #[error("{message}")]
    BadRequest {
        param: Option<String>,
        message: String,
    },
    #[error("a read is the reply's first token, so thinking must be off (chat_template_kwargs.enable_thinking)")]
    ThinkingOn,
    #[error("missing or invalid API key")]
    Unauthorized,
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// The body did not arrive within `--body-read-timeout-secs` of the request head.
    #[error("the request body did not arrive within {limit_secs} s (body_read_timeout_secs)")]
    BodyTooSlow { limit_secs: u64 },
    /// A media item over a size limit (bytes, pixels); `param` names it (`images.1`).
    #[error("{message}")]
    MediaTooLarge { param: String, message: String },
    #[error("the request needs {got} prompt tokens; the limit is {limit} (max_input_tokens)")]
    TokensExceeded { got: usize, limit: usize },
    #[error("question '{question}': its prompt has {got} tokens; the model reads at most {limit} (max_position_embeddings)")]
    PromptTooLong {
        question: String,
        got: usize,
        limit: usize,
    },
    #[error("the server is at capacity ({queued} reads queued, limit {limit}); retry after {retry_after_secs} s")]
    Overloaded {
        queued: usize,
        limit: usize,
        retry_after_secs: u64,
    },
    /// Admission by work: the reads queued ahead of this request, at the rate the shards have been
    /// reading, would not let it finish within its budget (`--request-timeout-secs`, or less that
    /// the client asked for: `set_by` names which).
    #[error("the server cannot finish this request within its {deadline_secs} s deadline ({set_by}): about {wait_secs} s of reads are queued ahead of it; retry after {retry_after_secs} s")]
    Backlogged {
        wait_secs: u64,
        deadline_secs: f64,
        set_by: &'static str,
        retry_after_secs: u64,
    },
    /// The request ran past its budget; its reads were dropped.
    #[error("the request did not finish within {limit_secs} s ({set_by}); its reads were dropped")]
    Timeout {
        limit_secs: f64,
        set_by: &'static str,
    },
    #[error("{0}")]
    NotServable(String),
    /// A question's answers cannot be labelled for this tokenizer (a label that is not one token at
    /// the answer position, more answers than the strategy labels). 501 by default, like a question
    /// type the model cannot serve; a 400 under vLLM's and SGLang's profiles (their seeds).
    #[error("{0}")]
    Unlabelable(String),
    #[error("model shard failed: {0}")]
    Shard(String),
    #[error("model shard is unavailable: {0}")]
    ShardUnavailable(String),
    /// The server is shutting down: requests it already accepted finish, new ones go elsewhere.
    #[error("the server is shutting down; retry on another instance")]
    Draining,
    /// A resource a route names does not exist (`/v1/calibrations/{id}`).
    #[error("{0}")]
    NotFound(String),
    /// A write that would replace something else held under the same name.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Internal(String),
}

impl DecisionError {
    pub fn status(&self) -> StatusCode {
        match self {
            DecisionError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            DecisionError::BadRequest { .. } | DecisionError::ThinkingOn => StatusCode::BAD_REQUEST,
            DecisionError::Unauthorized => StatusCode::UNAUTHORIZED,
            DecisionError::NotFound(_) => StatusCode::NOT_FOUND,
            DecisionError::Conflict(_) => StatusCode::CONFLICT,
            DecisionError::BodyTooLarge { .. }
            | DecisionError::MediaTooLarge { .. }
            | DecisionError::TokensExceeded { .. }
            | DecisionError::PromptTooLong { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            // 529 is TypeSafe's "overloaded"; its SDK backs off and retries on it.
            DecisionError::Overloaded { .. } | DecisionError::Backlogged { .. } => {
                StatusCode::from_u16(529).unwrap_or(StatusCode::TOO_MANY_REQUESTS)
            }
            DecisionError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            DecisionError::BodyTooSlow { .. } => StatusCode::REQUEST_TIMEOUT,
            DecisionError::NotServable(_) | DecisionError::Unlabelable(_) => {
                StatusCode::NOT_IMPLEMENTED
            }
            DecisionError::Shard(_) | DecisionError::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            DecisionError::ShardUnavailable(_) | DecisionError::Draining => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// TypeSafe's `error_type` vocabulary, extended with specific kinds.
    pub fn error_type(&self) -> &'static str {
        match self {
            DecisionError::Invalid(_)
            | DecisionError::BadRequest { .. }
            | DecisionError::ThinkingOn => "invalid_request",
            DecisionError::Unauthorized => "authentication_error",
            DecisionError::NotFound(_) => "not_found",
            DecisionError::Conflict(_) => "conflict",
            DecisionError::BodyTooLarge { .. } | DecisionError::MediaTooLarge { .. } => {
                "request_too_large"
            }
            DecisionError::TokensExceeded { .. } | DecisionError::PromptTooLong { .. } => {
                "tokens_exceeded"
            }
            DecisionError::Overloaded { .. } | DecisionError::Backlogged { .. } => "overloaded",
            DecisionError::Timeout { .. } | DecisionError::BodyTooSlow { .. } => "timeout",
            DecisionError::NotServable(_) | DecisionError::Unlabelable(_) => "not_implemented",
            // A rank that is down or restarting (retry later) apart from one that failed a read.
            DecisionError::ShardUnavailable(_) => "shard_unavailable",
            DecisionError::Shard(_) => "shard_error",
            DecisionError::Draining => "draining",
            DecisionError::Internal(_) => "unknown",
        }
    }

    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            DecisionError::Overloaded {
                retry_after_secs, ..
            }
            | DecisionError::Backlogged {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            DecisionError::ShardUnavailable(_) | DecisionError::Draining => Some(1),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_error_is_4xx_and_only_server_faults_are_5xx() {
        let client = [
            DecisionError::Invalid(vec![]),
            DecisionError::BadRequest {
                param: None,
                message: "x".into(),
            },
            DecisionError::ThinkingOn,
            DecisionError::Unauthorized,
            DecisionError::BodyTooLarge { limit: 1 },
            DecisionError::MediaTooLarge {
                param: "images.0".into(),
                message: "x".into(),
            },
            DecisionError::TokensExceeded { got: 2, limit: 1 },
            DecisionError::PromptTooLong {
                question: "q".into(),
                got: 2,
                limit: 1,
            },
        ];
        for e in &client {
            assert!(e.status().is_client_error(), "{e:?} -> {}", e.status());
        }
        assert_eq!(
            DecisionError::Overloaded {
                queued: 1,
                limit: 1,
                retry_after_secs: 1
            }
            .status()
            .as_u16(),
            529
        );
        let backlogged = DecisionError::Backlogged {
            wait_secs: 90,
            deadline_secs: 30.0,
            set_by: "request_timeout_secs",
            retry_after_secs: 60,
        };
        assert_eq!(backlogged.status().as_u16(), 529);
        assert_eq!(backlogged.retry_after_secs(), Some(60));
        assert!(backlogged
            .to_string()
            .contains("30 s deadline (request_timeout_secs)"));
        let timeout = DecisionError::Timeout {
            limit_secs: 7.0,
            set_by: "request_timeout_secs",
        };
        assert_eq!(timeout.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(timeout.error_type(), "timeout");
        assert!(timeout.to_string().contains("7 s (request_timeout_secs)"));
        assert_eq!(
            DecisionError::NotServable("no".into()).status(),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(
            DecisionError::Shard("x".into()).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            DecisionError::ShardUnavailable("x".into()).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            DecisionError::Unauthorized.error_type(),
            "authentication_error"
        );
        assert_eq!(
            DecisionError::TokensExceeded { got: 2, limit: 1 }.error_type(),
            "tokens_exceeded"
        );
        // Operators tell a dead rank from a failed read from a router bug by the error type.
        assert_eq!(
            DecisionError::ShardUnavailable("rank 1: gone".into()).error_type(),
            "shard_unavailable"
        );
        assert_eq!(
            DecisionError::Shard("rank 0: boom".into()).error_type(),
            "shard_error"
        );
        assert_eq!(
            DecisionError::Internal("bug".into()).error_type(),
            "unknown"
        );
    }

    #[test]
    fn param_drops_body_prefix() {
        let e = FieldError::new(
            vec![
                "body".into(),
                "questions".into(),
                "tone".into(),
                2usize.into(),
            ],
            "value_error",
            "bad",
        );
        assert_eq!(e.param(), "questions.tone.2");
    }
}
