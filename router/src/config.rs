//! The router's one configuration struct: every flag documented, every flag also an env var.

use std::path::PathBuf;

use clap::Parser;

pub use crate::profile::Compat;

impl Config {
    /// The model folder; clap guarantees it unless only the OpenAPI document was asked for.
    pub fn model_dir(&self) -> PathBuf {
        self.model_dir.clone().unwrap_or_default()
    }
}

#[derive(Clone, Debug, Parser)]
#[command(
    name = "decision-router",
    version,
    about = "HTTP front of decision-inference: wire shapes -> decision IR -> batched shard reads -> probabilities"
)]
pub struct Config {
    /// Hugging Face model folder: tokenizer.json, tokenizer_config.json / chat_template.jinja, config.json.
    #[arg(long, env = "MODEL_DIR", required_unless_present = "print_openapi")]
    pub model_dir: Option<PathBuf>,
    /// Print the OpenAPI document and exit.
    #[arg(long)]
    pub print_openapi: bool,
    /// Base path of the shard sockets; rank r listens on `{base}-{r}`.
    #[arg(long, env = "SHARD_UDS_PATH", default_value = "/tmp/decision-server")]
    pub shard_uds_path: PathBuf,
    /// Address to listen on.
    #[arg(long, env = "DECISION_HOSTNAME", default_value = "0.0.0.0")]
    pub hostname: String,
    /// Port to listen on.
    #[arg(long, env = "PORT", default_value_t = 3000)]
    pub port: u16,
    /// Name the model is served and reported under (defaults to the model folder's name).
    #[arg(long, env = "SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Compatibility profile: wording, error codes and extension fields.
    #[arg(long, env = "COMPAT", value_enum, default_value = "typesafe")]
    pub compat: Compat,
    /// When set, every /v1 route requires `Authorization: Bearer <key>`.
    #[arg(long, env = "API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Unique prompt tokens packed into one shard call (a single larger request still runs alone).
    #[arg(long, env = "MAX_BATCH_PREFILL_TOKENS", default_value_t = 8192)]
    pub max_batch_prefill_tokens: usize,
    /// How long the first read of a batch waits for reads of other requests, in milliseconds.
    #[arg(long, env = "MAX_BATCH_WAIT_MS", default_value_t = 2)]
    pub max_batch_wait_ms: u64,
    /// Unique prompt tokens one request may need; larger requests get 413 naming the limit.
    #[arg(long, env = "MAX_INPUT_TOKENS", default_value_t = 65_536)]
    pub max_input_tokens: usize,
    /// Reads that may wait at once; beyond it requests get 529 (429 in other profiles) with Retry-After.
    #[arg(long, env = "MAX_QUEUED_READS", default_value_t = 4096)]
    pub max_queued_reads: usize,
    /// Largest accepted request body after decompression, in bytes.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Emit logs as JSON lines.
    #[arg(long, env = "JSON_OUTPUT")]
    pub json_output: bool,
}
