//! decision-router: parses three wire shapes into one decision IR, renders prompts with the model's
//! chat template, batches reads across requests to the model shards, and turns label
//! log-probabilities into probabilities in each response shape.

pub mod affinity;
pub mod api;
pub mod calibration;
pub mod config;
pub mod debias;
pub mod decide;
pub mod error;
pub mod http;
pub mod ir;
pub mod json_text;
pub mod label_prior;
pub mod limits;
pub mod media;
pub mod probability;
pub mod profile;
pub mod prompt;
pub mod question_kind;
pub mod queue;
pub mod read;
pub mod series;
pub mod shard;
pub mod telemetry;
