//! The launcher's one configuration struct: every flag, its env var and its default live here,
//! and `--help` generated from it is the reference. Checks that clap cannot express sit in `validate`.

use std::fmt;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::allocator::Allocator;
use crate::mkl_dispatch::MklDispatch;

/// Starts the decision-inference shard(s) and router, supervises them and shuts them down cleanly.
///
/// Every flag can also be set through the environment variable shown next to it.
#[derive(Parser, Debug, Clone)]
#[command(name = "decision-launcher", version)]
pub struct Config {
    /// Model to serve: a local Hugging Face folder, or an ORG/NAME id found (offline) in the local
    /// Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub). Without it the
    /// embedded default, SmolLM2-135M-Instruct, is converted once into the cache dir and served.
    #[arg(long, env = "MODEL_ID")]
    pub model_id: Option<String>,

    /// Model name clients send and see in responses. Defaults to the model id (or the folder's name).
    #[arg(long, env = "SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,

    /// HTTP port the router listens on.
    #[arg(long, env = "PORT", default_value_t = 3000)]
    pub port: u16,

    /// Address the router binds to. (Its env var is not HOSTNAME: shells set that to the machine name.)
    #[arg(long, env = "DECISION_HOSTNAME", default_value = "0.0.0.0")]
    pub hostname: String,

    /// Number of tensor-parallel shards (ranks), one process each, every one holding its slice of
    /// the weights: on CUDA rank R uses GPU R, on CPU all ranks share the machine. Above 1 only
    /// Llama-family and Qwen3 models are served, with at most one shard per key/value head; other
    /// models are refused at startup.
    #[arg(long, env = "NUM_SHARD", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub num_shard: u32,

    /// Address the shards' tensor-parallel rendezvous listens on (rank 0's side).
    #[arg(long, env = "MASTER_ADDR", default_value = "127.0.0.1")]
    pub master_addr: String,

    /// TCP port of the shards' tensor-parallel rendezvous. Omitted: a free port is picked at startup.
    /// Unused with one shard.
    #[arg(long, env = "MASTER_PORT")]
    pub master_port: Option<u16>,

    /// Weight dtype the shard loads the model in; `auto` lets the shard choose for its device.
    #[arg(long, env = "DTYPE", value_enum, default_value_t = Dtype::Auto)]
    pub dtype: Dtype,

    /// The shard's read engine. `auto` lets the model's architecture choose: `tree` for models whose
    /// every layer is attention, `fork` for hybrids (linear attention, short convolutions), where a
    /// masked pass would mix sibling questions. `tree` shares each prompt's prefix in one masked
    /// forward pass; `fork` prefills a shared prefix once and copies its cache per question; `naive`
    /// runs one full prefill per question (slower; the reference the others must equal). A mode the
    /// model cannot read exactly with is refused at startup. Block-diffusion models (DiffusionGemma)
    /// always read canvases (`auto` picks the canvas engine; the other modes are refused).
    #[arg(long, env = "READ_MODE", value_enum, default_value_t = ReadMode::Auto)]
    pub read_mode: ReadMode,

    /// How the shard's float32 linear layers multiply on CPU. `exact`: torch's F.linear (MKL), the
    /// sums transformers' own forward computes (labels within 1e-5 of it). `fast`: oneDNN's
    /// prepacked GEMM, the kernel vLLM's CPU backend uses, 1.1-1.75x faster per GEMM on AMD CPUs;
    /// labels move by a few 1e-5. `split`: each activation as a high and a low bfloat16 part, two
    /// bfloat16 GEMMs summed in float32 (MKL), about 2x faster per GEMM where the CPU has AMX; labels
    /// move by about 1e-4. `auto`: the shard times the modes at load, at the model's widest linear,
    /// and runs the fastest, leaving a more exact mode only for one at least 5% faster (its log
    /// says what it measured). With `--dtype bfloat16` or `float16`, `exact` runs the dtype's own
    /// GEMM (oneDNN, prepacked; vLLM's kernel) and `widen` holds the weights widened to float32 and
    /// runs float32 GEMMs (the same products and float32 sums in another order; outputs rounded to
    /// the dtype): 1.8x faster per GEMM on an Intel Xeon without AMX, several times on AVX2-only
    /// CPUs, at twice the weights' memory. `auto` times those two there, and widens only when the
    /// float32 copies fit in half the memory free at load. `widen` on a float32 model is refused.
    #[arg(long, env = "MATMUL", value_enum, default_value_t = Matmul::Auto)]
    pub matmul: Matmul,

    /// `auto`: the shard runs its decoder's layers between attentions as one compiled graph
    /// (torch.compile, inductor; attention stays eager between calls), about 17 ops per layer
    /// instead of 205, and in bfloat16 or float16 on CPU fuses the eager elementwise chains too
    /// (1.15-1.2x faster reads on an AMX CPU). They compile at load (seconds, cached under the
    /// cache directory) and need a C++ compiler on CPU (the image has one); without it the shard
    /// warns and runs eagerly. Labels move by the fused ops' rounding (float32: about 1e-5 in
    /// log-probability). `off`: eager, float32 bit-equal to transformers.
    #[arg(long, env = "COMPILE", value_enum, default_value_t = Compile::Auto)]
    pub compile: Compile,

    /// Base path of the shards' unix sockets; rank R listens on `{uds-path}-{R}`.
    #[arg(long, env = "UDS_PATH", default_value = "/tmp/decision-server")]
    pub uds_path: PathBuf,

    /// Compatibility profile of the HTTP API: the TypeSafe System One contract, or byte-for-byte
    /// wording of the vLLM or SGLang implementations.
    #[arg(long, env = "COMPAT", value_enum, default_value_t = Compat::Typesafe)]
    pub compat: Compat,

    /// Bearer token clients must send (every route but /health; see --public-ops). Passed to the
    /// router through its environment, never on its command line, so it does not show in `ps`.
    /// Prefer the environment variable or --api-key-file over the flag, whose value `ps` shows for the
    /// launcher itself. No key: the API is open.
    #[arg(
        long,
        env = "API_KEY",
        hide_env_values = true,
        conflicts_with = "api_key_file"
    )]
    pub api_key: Option<Secret>,

    /// A file holding the API key (surrounding whitespace ignored); the router reads it at startup.
    #[arg(long, env = "API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,

    /// With an API key: /metrics, /info, /docs and /api-doc/openapi.json answer without it (a
    /// scraper on a trusted network). /info shows filesystem paths only to a caller with the key.
    #[arg(long, env = "PUBLIC_OPS")]
    pub public_ops: bool,

    /// Seconds a decision request may take; past it the answer is 504 naming the limit (503
    /// `shard_unavailable` when the shards miss a health probe too) and its unsent reads are dropped.
    /// A request the queued work would keep past it is refused at once with 529/429 + Retry-After.
    /// 0: no deadline.
    #[arg(long, env = "REQUEST_TIMEOUT_SECS", default_value_t = 120)]
    pub request_timeout_secs: u64,

    /// Seconds a client may take to send a request's head, from its first byte; then its
    /// connection is closed.
    #[arg(long, env = "HEADER_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_secs: u64,

    /// Seconds a request's body may take to arrive once its head has (then 408 and the connection
    /// closes). 0: no limit.
    #[arg(long, env = "BODY_READ_TIMEOUT_SECS", default_value_t = 60)]
    pub body_read_timeout_secs: u64,

    /// Seconds a client connection may sit with nothing arriving and no request in flight.
    #[arg(long, env = "KEEP_ALIVE_TIMEOUT_SECS", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_alive_timeout_secs: u64,

    /// Client connections the router holds at once (kept below its open-file limit); more wait in
    /// the listen backlog.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,

    /// OTLP/gRPC collector (e.g. http://collector:4317) the router and the shards export their spans
    /// to, as one trace per request; also read from OTEL_EXPORTER_OTLP_ENDPOINT. Unset (default): no
    /// spans leave the processes and no outbound connection is made.
    #[arg(long, env = "OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Token budget of one batch: the unique prompt tokens the router packs into one shard call,
    /// and the packed tokens of one shard forward pass. Unset (auto, default): each shard chooses it
    /// for its device (on CUDA from the memory left after the weights and the prefix cache, 8192 on
    /// CPU) and the router follows rank 0's; /info shows it and the rule. Set: passed to the router
    /// and to every shard, so both use the same.
    #[arg(long, env = "MAX_BATCH_PREFILL_TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_batch_prefill_tokens: Option<u32>,

    /// How long the batcher waits for more reads before running a batch that is not full, in milliseconds.
    #[arg(long, env = "MAX_BATCH_WAIT_MS", default_value_t = 2)]
    pub max_batch_wait_ms: u64,

    /// Unique prompt tokens one request may need; larger requests are refused (413, 400 under
    /// `--compat sglang`). Unset: the router's default (`decision-router --help`), which is defined there only.
    #[arg(long, env = "MAX_INPUT_TOKENS")]
    pub max_input_tokens: Option<u32>,

    /// Reads that may wait in the router's queue; beyond that requests are refused with Retry-After.
    #[arg(long, env = "MAX_QUEUED_READS", default_value_t = 4096)]
    pub max_queued_reads: u32,

    /// Hosts whose `http(s)` media URLs (images, audio, videos) the router fetches: a comma list of
    /// host names, IP addresses and `*.domain` patterns, or `*` for any public host. Loopback,
    /// link-local, private and CGNAT addresses are reached only through an entry that names them,
    /// never through `*`. Empty (default): only `data:` URLs are read.
    #[arg(long, env = "MEDIA_ALLOW_HOSTS", value_delimiter = ',')]
    pub media_allow_hosts: Vec<String>,

    /// Time one media fetch may take (connect, redirects and body), in seconds.
    #[arg(long, env = "MEDIA_FETCH_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub media_fetch_timeout_secs: u64,

    /// Media items (images, audio and videos together) one request may carry.
    #[arg(long, env = "MAX_MEDIA_ITEMS", default_value_t = 8)]
    pub max_media_items: u32,

    /// Images one request may carry.
    #[arg(long, env = "MAX_IMAGE_ITEMS", default_value_t = 8)]
    pub max_image_items: u32,

    /// Audio clips one request may carry.
    #[arg(long, env = "MAX_AUDIO_ITEMS", default_value_t = 4)]
    pub max_audio_items: u32,

    /// Videos one request may carry.
    #[arg(long, env = "MAX_VIDEO_ITEMS", default_value_t = 2)]
    pub max_video_items: u32,

    /// Bytes of one media item, decoded from its data URL or downloaded (default 20 MiB).
    #[arg(long, env = "MAX_MEDIA_BYTES", default_value_t = 20 << 20)]
    pub max_media_bytes: u64,

    /// Pixels (width × height, read from the header) of one image (default 4096 × 4096).
    #[arg(long, env = "MAX_IMAGE_PIXELS", default_value_t = 4096 * 4096)]
    pub max_image_pixels: u64,

    /// Seconds of one video.
    #[arg(long, env = "MAX_VIDEO_SECONDS", default_value_t = 60.0)]
    pub max_video_seconds: f64,

    /// Frames sampled from one video.
    #[arg(long, env = "MAX_VIDEO_FRAMES", default_value_t = 240)]
    pub max_video_frames: u32,

    /// Seconds of one audio clip.
    #[arg(long, env = "MAX_AUDIO_SECONDS", default_value_t = 60.0)]
    pub max_audio_seconds: f64,

    /// CPU threads each shard uses for compute. Omitted: the shard's own default.
    #[arg(long, env = "THREADS", value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,

    /// Memory allocator of the shards: `auto` preloads tcmalloc when it is installed (freed blocks are
    /// reused instead of faulted in again every forward pass) and otherwise tunes glibc's malloc to
    /// keep them.
    #[arg(long, env = "ALLOCATOR", value_enum, default_value_t = Allocator::Auto)]
    pub allocator: Allocator,

    /// Which kernels Intel MKL runs in the shards (torch's float32 GEMMs, and the products inside its
    /// CPU attention): MKL takes generic kernels on CPUs not made by Intel. `auto` preloads a library
    /// that makes it choose by instruction sets on AMD CPUs with AVX-512 (measured there: float32
    /// GEMMs 2.1x, attention 2-3.5x faster); `features` does so on every CPU; `vendor` never.
    #[arg(long, env = "MKL_DISPATCH", value_enum, default_value_t = MklDispatch::Auto)]
    pub mkl_dispatch: MklDispatch,

    /// Level of the shards' own log lines, passed to each shard and let through the launcher's filter
    /// (`RUST_LOG` filters the rest). `debug` adds a line per batch of reads: reads, forward passes,
    /// packed tokens and forward milliseconds, the numbers to look at when a read is slower than expected.
    #[arg(long, env = "SHARD_LOG_LEVEL", value_enum, default_value_t = ShardLogLevel::Info)]
    pub shard_log_level: ShardLogLevel,

    /// Memory the shards may spend keeping the KV of recent prompt prefixes (radix tree, LRU), in MiB
    /// of the whole model's keys/values; a repeated state then costs only its questions. 0 turns the
    /// prefix cache off. `auto`: room for 8 prompts of the model's full length, at most 10% of the host
    /// memory free after loading (30% of each GPU's); `/info` shows the budget and its rule.
    #[arg(long, env = "PREFIX_CACHE_MB", default_value = "auto", value_parser = parse_cache_size)]
    pub prefix_cache_mb: CacheSize,

    /// Where converted models and other launcher artefacts are kept.
    /// [default: $XDG_CACHE_HOME/decision-inference or ~/.cache/decision-inference]
    #[arg(long, env = "DECISION_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// How long to wait for each shard to answer a real Health RPC before giving up, in seconds.
    /// Loading (and on first run converting) a model can take minutes.
    #[arg(long, env = "SHARD_STARTUP_TIMEOUT_SECS", default_value_t = 600)]
    pub shard_startup_timeout_secs: u64,

    /// On shutdown, how long children get after SIGTERM before they are killed, in seconds. The
    /// router (stopped first) answers every request it accepted within it: those still in flight at
    /// the grace less 3 s (half the grace under 6 s) get 503 + Retry-After; the shards stop after it.
    #[arg(long, env = "SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,

    /// Log JSON lines (the launcher's own and its children's) instead of human-readable text.
    #[arg(long, env = "JSON_OUTPUT")]
    pub json_output: bool,
}

/// Checks that depend on what the rest of the system can do today, rather than on flag syntax.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--served-model-name must not be empty")]
    EmptyServedModelName,
    #[error("--uds-path must not be empty")]
    EmptyUdsPath,
    #[error("no cache directory: set --cache-dir (DECISION_CACHE_DIR), XDG_CACHE_HOME or HOME")]
    NoCacheDir,
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self
            .served_model_name
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            return Err(ConfigError::EmptyServedModelName);
        }
        if self.uds_path.as_os_str().is_empty() {
            return Err(ConfigError::EmptyUdsPath);
        }
        Ok(())
    }

    /// `--cache-dir`, else `$XDG_CACHE_HOME/decision-inference`, else `~/.cache/decision-inference`.
    pub fn cache_dir(&self) -> Result<PathBuf, ConfigError> {
        if let Some(dir) = &self.cache_dir {
            return Ok(dir.clone());
        }
        user_cache_root()
            .map(|root| root.join("decision-inference"))
            .ok_or(ConfigError::NoCacheDir)
    }

    pub fn shard_startup_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.shard_startup_timeout_secs)
    }

    pub fn shutdown_grace(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.shutdown_grace_secs)
    }

    /// `--otlp-endpoint`, else `OTEL_EXPORTER_OTLP_ENDPOINT` as `get` reads it; empty is unset.
    pub fn otlp_endpoint(&self, get: impl Fn(&str) -> Option<String>) -> Option<String> {
        self.otlp_endpoint
            .clone()
            .or_else(|| get("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .filter(|e| !e.trim().is_empty())
    }
}

/// `$XDG_CACHE_HOME`, else `$HOME/.cache`: the root both our cache and Hugging Face's default to.
pub fn user_cache_root() -> Option<PathBuf> {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    non_empty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".cache")))
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Auto,
    Float32,
    Bfloat16,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    Auto,
    Tree,
    Fork,
    Naive,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matmul {
    Auto,
    Exact,
    Fast,
    Split,
    Widen,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compile {
    Auto,
    Off,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardLogLevel {
    Error,
    Warning,
    Info,
    Debug,
}

impl ShardLogLevel {
    /// The same level in the launcher's own terms: what its filter must let through.
    pub fn tracing_level(self) -> tracing::Level {
        match self {
            ShardLogLevel::Error => tracing::Level::ERROR,
            ShardLogLevel::Warning => tracing::Level::WARN,
            ShardLogLevel::Info => tracing::Level::INFO,
            ShardLogLevel::Debug => tracing::Level::DEBUG,
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compat {
    Typesafe,
    Vllm,
    Sglang,
}

/// The spelling a child's CLI expects for a value enum: the same as ours.
pub fn flag_value<T: ValueEnum>(value: &T) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// A value that must never reach a log line; `Debug` prints a placeholder.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Parses flags as a test would type them, with none of the launcher's env vars set.
#[cfg(test)]
pub(crate) fn parse_for_test(args: &[&str]) -> Config {
    tests::parse_with_env(args, &[]).expect("valid flags")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Env vars are process-wide and tests run in parallel: every test that parses a Config holds this.
    static ENV: Mutex<()> = Mutex::new(());

    const ENV_NAMES: &[&str] = &[
        "MODEL_ID",
        "SERVED_MODEL_NAME",
        "PORT",
        "DECISION_HOSTNAME",
        "NUM_SHARD",
        "MASTER_ADDR",
        "MASTER_PORT",
        "DTYPE",
        "READ_MODE",
        "UDS_PATH",
        "COMPAT",
        "API_KEY",
        "API_KEY_FILE",
        "PUBLIC_OPS",
        "REQUEST_TIMEOUT_SECS",
        "HEADER_READ_TIMEOUT_SECS",
        "BODY_READ_TIMEOUT_SECS",
        "KEEP_ALIVE_TIMEOUT_SECS",
        "MAX_CONNECTIONS",
        "OTLP_ENDPOINT",
        "MAX_BATCH_PREFILL_TOKENS",
        "MAX_BATCH_WAIT_MS",
        "MAX_INPUT_TOKENS",
        "MAX_QUEUED_READS",
        "MEDIA_ALLOW_HOSTS",
        "MEDIA_FETCH_TIMEOUT_SECS",
        "MAX_MEDIA_ITEMS",
        "MAX_IMAGE_ITEMS",
        "MAX_AUDIO_ITEMS",
        "MAX_VIDEO_ITEMS",
        "MAX_MEDIA_BYTES",
        "MAX_IMAGE_PIXELS",
        "MAX_VIDEO_SECONDS",
        "MAX_VIDEO_FRAMES",
        "MAX_AUDIO_SECONDS",
        "THREADS",
        "ALLOCATOR",
        "MKL_DISPATCH",
        "SHARD_LOG_LEVEL",
        "PREFIX_CACHE_MB",
        "DECISION_CACHE_DIR",
        "SHARD_STARTUP_TIMEOUT_SECS",
        "SHUTDOWN_GRACE_SECS",
        "JSON_OUTPUT",
    ];

    pub(super) fn parse_with_env(
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Config, clap::Error> {
        let _guard = ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for name in ENV_NAMES {
            std::env::remove_var(name);
        }
        for (name, value) in env {
            std::env::set_var(name, value);
        }
        let parsed = Config::try_parse_from(
            std::iter::once("decision-launcher").chain(args.iter().copied()),
        );
        for (name, _) in env {
            std::env::remove_var(name);
        }
        parsed
    }

    #[test]
    fn prefix_cache_size_is_auto_by_default_or_a_number_of_mib() {
        let auto = parse_with_env(&[], &[]).expect("no flags parse");
        assert_eq!(auto.prefix_cache_mb, CacheSize::Auto);
        let off = parse_with_env(&["--prefix-cache-mb", "0"], &[]).expect("0 parses");
        assert_eq!(off.prefix_cache_mb, CacheSize::Mib(0));
        let env = parse_with_env(&[], &[("PREFIX_CACHE_MB", "512")]).expect("env parses");
        assert_eq!(env.prefix_cache_mb.to_string(), "512");
        for bad in ["lots", "1.5", "", "4294967296"] {
            let error = parse_with_env(&[&format!("--prefix-cache-mb={bad}")], &[]).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("expected auto or a whole number of MiB"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn defaults_match_the_documented_cli() {
        let config = parse_with_env(&[], &[]).expect("no flags parse");
        assert_eq!(config.model_id, None);
        assert_eq!(config.port, 3000);
        assert_eq!(config.hostname, "0.0.0.0");
        assert_eq!(config.num_shard, 1);
        assert_eq!(config.dtype, Dtype::Auto);
        assert_eq!(config.read_mode, ReadMode::Auto);
        assert_eq!(config.matmul, Matmul::Auto);
        assert_eq!(config.compile, Compile::Auto);
        assert_eq!(config.uds_path, PathBuf::from("/tmp/decision-server"));
        assert_eq!(config.compat, Compat::Typesafe);
        assert_eq!(config.api_key, None);
        assert_eq!(
            config.max_batch_prefill_tokens, None,
            "auto: the shards choose it"
        );
        assert_eq!(config.max_batch_wait_ms, 2);
        assert_eq!(config.max_input_tokens, None, "the router owns the default");
        assert_eq!(config.max_queued_reads, 4096);
        assert!(config.media_allow_hosts.is_empty());
        assert_eq!(config.media_fetch_timeout_secs, 10);
        assert_eq!(
            (
                config.max_media_items,
                config.max_image_items,
                config.max_audio_items,
                config.max_video_items
            ),
            (8, 8, 4, 2)
        );
        assert_eq!(config.max_media_bytes, 20 << 20);
        assert_eq!(config.max_image_pixels, 4096 * 4096);
        assert_eq!(config.max_video_seconds, 60.0);
        assert_eq!(config.max_video_frames, 240);
        assert_eq!(config.max_audio_seconds, 60.0);
        assert_eq!(config.threads, None);
        assert_eq!(config.shard_startup_timeout_secs, 600);
        assert_eq!(config.shutdown_grace_secs, 10);
        assert!(!config.json_output);
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn env_vars_set_flags() {
        let config = parse_with_env(
            &[],
            &[
                ("MODEL_ID", "org/model"),
                ("PORT", "8080"),
                ("DECISION_HOSTNAME", "127.0.0.1"),
                ("DTYPE", "bfloat16"),
                ("READ_MODE", "naive"),
                ("MATMUL", "fast"),
                ("COMPAT", "sglang"),
                ("API_KEY", "s3cret"),
                ("MAX_QUEUED_READS", "17"),
                ("MEDIA_ALLOW_HOSTS", "cdn.example,127.0.0.1"),
                ("MAX_IMAGE_PIXELS", "1000"),
                ("THREADS", "4"),
                ("DECISION_CACHE_DIR", "/var/cache/di"),
                ("JSON_OUTPUT", "true"),
            ],
        )
        .expect("env values parse");
        assert_eq!(config.model_id.as_deref(), Some("org/model"));
        assert_eq!(config.port, 8080);
        assert_eq!(config.hostname, "127.0.0.1");
        assert_eq!(config.dtype, Dtype::Bfloat16);
        assert_eq!(config.read_mode, ReadMode::Naive);
        assert_eq!(config.matmul, Matmul::Fast);
        assert_eq!(config.compat, Compat::Sglang);
        assert_eq!(config.api_key.as_ref().map(Secret::expose), Some("s3cret"));
        assert_eq!(config.max_queued_reads, 17);
        assert_eq!(config.media_allow_hosts, ["cdn.example", "127.0.0.1"]);
        assert_eq!(config.max_image_pixels, 1000);
        assert_eq!(config.threads, Some(4));
        assert_eq!(
            config.cache_dir().ok(),
            Some(PathBuf::from("/var/cache/di"))
        );
        assert!(config.json_output);
    }

    #[test]
    fn the_batch_budget_is_auto_unless_given_and_never_zero() {
        assert_eq!(
            parse_with_env(&[], &[])
                .expect("parses")
                .max_batch_prefill_tokens,
            None
        );
        let from_env =
            parse_with_env(&[], &[("MAX_BATCH_PREFILL_TOKENS", "65536")]).expect("parses");
        assert_eq!(from_env.max_batch_prefill_tokens, Some(65536));
        assert!(parse_with_env(&["--max-batch-prefill-tokens", "0"], &[]).is_err());
    }

    #[test]
    fn flags_win_over_env_vars() {
        let config =
            parse_with_env(&["--port", "9000"], &[("PORT", "8080")]).expect("flag and env parse");
        assert_eq!(config.port, 9000);
    }

    #[test]
    fn hostname_env_var_of_the_shell_is_ignored() {
        let _guard = ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::env::set_var("HOSTNAME", "build-box-7");
        let config = Config::try_parse_from(["decision-launcher"]);
        std::env::remove_var("HOSTNAME");
        assert_eq!(config.expect("parses").hostname, "0.0.0.0");
    }

    #[test]
    fn several_shards_and_their_rendezvous_are_accepted() {
        let config = parse_with_env(&["--num-shard", "2"], &[]).expect("2 is a valid number");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(
            (config.master_addr.as_str(), config.master_port),
            ("127.0.0.1", None)
        );

        let from_env = parse_with_env(
            &[],
            &[
                ("NUM_SHARD", "4"),
                ("MASTER_ADDR", "10.0.0.2"),
                ("MASTER_PORT", "29500"),
            ],
        )
        .expect("parses");
        assert_eq!(from_env.validate(), Ok(()));
        assert_eq!(from_env.num_shard, 4);
        assert_eq!(
            (from_env.master_addr.as_str(), from_env.master_port),
            ("10.0.0.2", Some(29500))
        );
    }

    #[test]
    fn zero_shards_and_unknown_values_are_syntax_errors() {
        assert!(parse_with_env(&["--num-shard", "0"], &[]).is_err());
        assert!(parse_with_env(&["--dtype", "float16"], &[]).is_err());
        assert!(parse_with_env(&["--compat", "tgi"], &[]).is_err());
        assert!(parse_with_env(&[], &[("PORT", "not-a-port")]).is_err());
    }

    #[test]
    fn api_key_never_appears_in_debug_output_or_help() {
        let config = parse_with_env(&[], &[("API_KEY", "s3cret")]).expect("parses");
        assert!(!format!("{config:?}").contains("s3cret"));

        let _guard = ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::env::set_var("API_KEY", "s3cret");
        let help = <Config as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        std::env::remove_var("API_KEY");
        assert!(!help.contains("s3cret"));
        assert!(help.contains("API_KEY"));
    }

    #[test]
    fn enum_values_are_passed_to_children_in_cli_spelling() {
        assert_eq!(flag_value(&Dtype::Bfloat16), "bfloat16");
        assert_eq!(flag_value(&ReadMode::Naive), "naive");
        assert_eq!(flag_value(&ReadMode::Fork), "fork");
        assert_eq!(flag_value(&ReadMode::Auto), "auto");
        assert_eq!(flag_value(&Compat::Typesafe), "typesafe");
    }

    #[test]
    fn clap_definition_is_consistent() {
        <Config as clap::CommandFactory>::command().debug_assert();
    }
}

/// `--prefix-cache-mb`: sized by the shard's rule, or a number of MiB (0: off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSize {
    Auto,
    Mib(u32),
}

impl fmt::Display for CacheSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheSize::Auto => f.write_str("auto"),
            CacheSize::Mib(mib) => write!(f, "{mib}"),
        }
    }
}

fn parse_cache_size(text: &str) -> Result<CacheSize, String> {
    if text == "auto" {
        return Ok(CacheSize::Auto);
    }
    text.parse()
        .map(CacheSize::Mib)
        .map_err(|_| format!("expected auto or a whole number of MiB, got {text:?}"))
}
