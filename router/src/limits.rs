//! Every request limit in one place; the defaults are the default profile's (spec/API.md §4).

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
            max_levels: 10,
            min_levels: 1,
            max_input_tokens: 65_536,
            max_body_bytes: 8 << 20,
        }
    }
}
