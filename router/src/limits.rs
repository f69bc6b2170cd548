//! Every request limit in one place; the defaults are the default profile's (spec/API.md §4). The CLI
//! defaults (`config.rs`) and the profile narrowing (`profile.rs`) read these constants.

use std::time::Duration;

/// Options a choice can label with one letter each (`A` to `Z`): vLLM's and SGLang's option limit.
pub const LETTER_LABELS: usize = 26;
/// Levels a score can label with one digit each (`0` to `9`).
pub const DIGIT_LABELS: usize = 10;
/// Unique prompt tokens one request may need, unless `--max-input-tokens` says otherwise.
pub const DEFAULT_MAX_INPUT_TOKENS: usize = 65_536;
/// Decompressed request body bytes, unless `--max-body-bytes` says otherwise.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

#[derive(Clone, Debug)]
pub struct Limits {
    pub max_questions: usize,
    pub max_choices: usize,
    pub max_levels: usize,
    /// Levels a System One score needs at least (1 by default; vLLM's seed says two).
    pub min_levels: usize,
    /// Unique prompt tokens one request may need.
    pub max_input_tokens: usize,
    /// Decompressed request body size.
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_questions: 512,
            max_choices: 255,
            max_levels: DIGIT_LABELS,
            min_levels: 1,
            max_input_tokens: DEFAULT_MAX_INPUT_TOKENS,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// How long a request may take from its parse to its answer, and what set that limit: the
/// `--request-timeout-secs` flag or the client's own budget header, whichever is shorter. Its 504
/// and its 529 name the source.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    pub limit: Duration,
    pub source: &'static str,
}

impl Budget {
    /// `--request-timeout-secs`, as its error messages name it.
    pub const FLAG: &'static str = "request_timeout_secs";
}
