//! The launcher's one configuration struct: every flag, its env var and its default live here,
//! and `--help` generated from it is the reference. Checks that clap cannot express sit in `validate`.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use clap::{ArgMatches, Args as _, CommandFactory as _, FromArgMatches as _, Parser, ValueEnum};
pub use decision_router::config::RouterFlags;

use crate::allocator::Allocator;
use crate::mkl_dispatch::MklDispatch;

/// Starts the decision-inference shard(s) and router, supervises them and shuts them down cleanly.
///
/// Every flag can also be set through the environment variable shown next to it.
#[derive(Parser, Debug, Clone)]
#[command(name = "decision-launcher", version)]
pub struct Config {
    /// Model to serve: a local Hugging Face folder, or a Hub id ORG/NAME[@REVISION] looked up in the local
    /// Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub) and downloaded into it
    /// when missing (config, tokenizer files and safetensors only; HF_TOKEN for private and gated models,
    /// HF_ENDPOINT for a mirror; HF_HUB_OFFLINE=1 forbids downloads). Without it the embedded default,
    /// SmolLM2-135M-Instruct, is converted once into the cache dir and served.
    #[arg(long, env = "MODEL_ID")]
    pub model_id: Option<String>,

    /// Revision of a Hub --model-id: a branch, tag or commit (default main). The same as ORG/NAME@REVISION.
    #[arg(long, env = "REVISION")]
    pub revision: Option<String>,

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

    /// The shard's own flags, each handed to every rank under its name (`shard_argv`).
    #[command(flatten)]
    pub shard: ShardFlags,

    /// Base path of the shards' unix sockets; rank R listens on `{uds-path}-{R}`.
    #[arg(long, env = "UDS_PATH", default_value = "/tmp/decision-server")]
    pub uds_path: PathBuf,

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

    /// Where converted models and other launcher artefacts are kept.
    /// [default: $XDG_CACHE_HOME/decision-inference or ~/.cache/decision-inference]
    #[arg(long, env = "DECISION_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// How long to wait for each shard to answer a real Health RPC before giving up, in seconds.
    /// Loading (and on first run converting) a model can take minutes.
    #[arg(long, env = "SHARD_STARTUP_TIMEOUT_SECS", default_value_t = 600)]
    pub shard_startup_timeout_secs: u64,

    /// The router's flags, declared once in `decision_router::config::RouterFlags`: every router
    /// flag is a launcher flag, handed on to the router when given (`router_argv`).
    #[command(flatten)]
    pub router: RouterFlags,

    /// Print every flag's name and env var as JSON and exit (the test harness's list of env vars to clear).
    #[arg(long, hide = true)]
    pub print_flags: bool,

    /// Print docs/configuration.md, the reference of every flag generated from these definitions, and exit.
    #[arg(long, hide = true)]
    pub print_configuration_reference: bool,

    /// The router flags given on the command line or in the environment, as router argv.
    #[arg(skip)]
    pub router_argv: Vec<OsString>,

    /// The shard flags as shard argv: every one with a value, its default included.
    #[arg(skip)]
    pub shard_argv: Vec<OsString>,
}

/// The flags of `decision-server serve` the launcher takes: declared here once and handed to every
/// rank as `--flag value` under the same name (`shard_argv`), so a new one is a field here and its
/// `cli.py` argument, nothing between. Their values are the shard's `choices.py` (an integration
/// test holds them equal).
#[derive(clap::Args, Debug, Clone)]
pub struct ShardFlags {
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
    /// (torch.compile, inductor; attention stays eager between calls), about 20 ops per layer
    /// instead of 205, and in bfloat16 or float16 on CPU fuses the eager elementwise chains too
    /// (1.15-1.2x faster reads on an AMX CPU). They compile at load (seconds, cached under the
    /// cache directory) and need a C++ compiler on CPU (the image has one); without it the shard
    /// warns and runs eagerly. Labels move by the fused ops' rounding (float32: about 1e-5 in
    /// log-probability). `off`: eager, float32 bit-equal to transformers.
    #[arg(long, env = "COMPILE", value_enum, default_value_t = Compile::Auto)]
    pub compile: Compile,

    /// `auto`: on a CUDA device, the compiled layers (`--compile auto`) replay as CUDA graphs, one
    /// per layer and token-count bucket (16 to 4,096 tokens; a pass is padded to its bucket and
    /// attention stays eager between replays), captured at load within 60 s and checked against
    /// the compiled pass; a longer pass runs the compiled layers. `/info`'s `cuda_graph_buckets`
    /// lists the captured buckets. Nothing is captured on CPU or above one shard. `off`: the
    /// compiled layers without graphs.
    #[arg(long, env = "CUDA_GRAPHS", value_enum, default_value_t = CudaGraphs::Auto)]
    pub cuda_graphs: CudaGraphs,

    /// CPU threads each shard uses for compute. Omitted: the shard's own default.
    #[arg(long, env = "THREADS", value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,

    /// Memory the shards may spend keeping the KV of recent prompt prefixes (radix tree, LRU), in MiB
    /// of the whole model's keys/values; a repeated state then costs only its questions. 0 turns the
    /// prefix cache off. `auto`: room for 8 prompts of the model's full length, at most 10% of the host
    /// memory free after loading (30% of each GPU's); `/info` shows the budget and its rule.
    #[arg(long, env = "PREFIX_CACHE_MB", default_value = "auto", value_parser = parse_cache_size)]
    pub prefix_cache_mb: CacheSize,
}

/// Every shard flag that has a value, as `--flag value`, in declaration order.
fn shard_argv(matches: &ArgMatches) -> Vec<OsString> {
    let command = ShardFlags::augment_args(clap::Command::new("shard-flags"));
    let mut argv = Vec::new();
    for arg in command.get_arguments() {
        let (Some(long), Some(values)) = (arg.get_long(), matches.get_raw(arg.get_id().as_str()))
        else {
            continue;
        };
        for value in values {
            argv.push(OsString::from(format!("--{long}")));
            argv.push(value.to_owned());
        }
    }
    argv
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

/// Router flags the launcher hands on itself rather than as given: the key travels in the router's
/// environment (never in `ps`), the served name is resolved from the model id (`launch.rs`).
const SET_BY_THE_LAUNCHER: &[&str] = &["api_key", "served_model_name"];

impl Config {
    /// Parses the process's command line and environment; exits with clap's message on an error.
    pub fn parse_cli() -> Self {
        let matches = Self::command().get_matches();
        Self::from_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// Parses `args` (the program name first) and the environment.
    #[cfg(test)]
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Self::from_matches(&Self::command().try_get_matches_from(args)?)
    }

    fn from_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut config = Self::from_arg_matches(matches)?;
        config.router_argv = RouterFlags::given_argv(matches, SET_BY_THE_LAUNCHER);
        config.shard_argv = shard_argv(matches);
        Ok(config)
    }

    /// Every flag of the launcher's CLI with its env var and, for a fixed set, its values, as JSON
    /// (`--print-flags`): the test harness's env list, and what the shard's choices are checked against.
    pub fn flags_json() -> serde_json::Value {
        let command = Self::command();
        let flags: Vec<serde_json::Value> = command
            .get_arguments()
            .filter_map(|arg| {
                let long = arg.get_long()?;
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                let values: Vec<String> = arg
                    .get_possible_values()
                    .iter()
                    .map(|v| v.get_name().to_owned())
                    .collect();
                Some(serde_json::json!({ "flag": format!("--{long}"), "env": env, "values": values }))
            })
            .collect();
        serde_json::Value::Array(flags)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self
            .router
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
        // One flag for both: the router answers every request it accepted within this grace
        // (RouterFlags::shutdown_grace_secs), and the launcher stops it, then the shards, within it.
        std::time::Duration::from_secs(self.router.shutdown_grace_secs)
    }

    /// `--otlp-endpoint`, else `OTEL_EXPORTER_OTLP_ENDPOINT` as `get` reads it; empty is unset.
    pub fn otlp_endpoint(&self, get: impl Fn(&str) -> Option<String>) -> Option<String> {
        self.router
            .otlp_endpoint
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
    Float16,
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
pub enum CudaGraphs {
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

/// The spelling a child's CLI expects for a value enum: the same as ours.
pub fn flag_value<T: ValueEnum>(value: &T) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// Parses flags as a test would type them, with none of the launcher's env vars set.
#[cfg(test)]
pub(crate) fn parse_for_test(args: &[&str]) -> Config {
    tests::parse_with_env(args, &[]).expect("valid flags")
}

#[cfg(test)]
mod tests {
    use super::*;
    use decision_router::config::{Compat, Secret};
    use std::sync::Mutex;

    /// Env vars are process-wide and tests run in parallel: every test that parses a Config holds this.
    static ENV: Mutex<()> = Mutex::new(());

    /// Every env var the CLI reads, from its definition.
    fn env_names() -> Vec<String> {
        Config::command()
            .get_arguments()
            .filter_map(|arg| arg.get_env())
            .map(|env| env.to_string_lossy().into_owned())
            .collect()
    }

    pub(super) fn parse_with_env(
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Config, clap::Error> {
        let _guard = ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for name in env_names() {
            std::env::remove_var(name);
        }
        for (name, value) in env {
            std::env::set_var(name, value);
        }
        let parsed = Config::try_parse_args(
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
        assert_eq!(auto.shard.prefix_cache_mb, CacheSize::Auto);
        let off = parse_with_env(&["--prefix-cache-mb", "0"], &[]).expect("0 parses");
        assert_eq!(off.shard.prefix_cache_mb, CacheSize::Mib(0));
        let env = parse_with_env(&[], &[("PREFIX_CACHE_MB", "512")]).expect("env parses");
        assert_eq!(env.shard.prefix_cache_mb.to_string(), "512");
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
        assert_eq!(config.router.port, 3000);
        assert_eq!(config.router.hostname, "0.0.0.0");
        assert_eq!(config.num_shard, 1);
        assert_eq!(config.shard.dtype, Dtype::Auto);
        assert_eq!(config.shard.read_mode, ReadMode::Auto);
        assert_eq!(config.shard.matmul, Matmul::Auto);
        assert_eq!(config.shard.compile, Compile::Auto);
        assert_eq!(config.shard.cuda_graphs, CudaGraphs::Auto);
        assert_eq!(config.uds_path, PathBuf::from("/tmp/decision-server"));
        assert_eq!(config.router.compat, Compat::Typesafe);
        assert_eq!(config.router.api_key, None);
        assert_eq!(
            config.router.max_batch_prefill_tokens, None,
            "auto: the shards choose it"
        );
        assert_eq!(config.router.max_batch_wait_ms, 2);
        assert_eq!(
            config.router.max_input_tokens,
            decision_router::limits::DEFAULT_MAX_INPUT_TOKENS
        );
        assert!(
            config.router_argv.is_empty(),
            "defaults stay the router's own"
        );
        assert_eq!(config.router.max_queued_reads, 4096);
        assert!(config.router.media_allow_hosts.is_empty());
        assert_eq!(config.router.media_fetch_timeout_secs, 10);
        assert_eq!(
            (
                config.router.max_media_items,
                config.router.max_image_items,
                config.router.max_audio_items,
                config.router.max_video_items
            ),
            (8, 8, 4, 2)
        );
        assert_eq!(config.router.max_media_bytes, 20 << 20);
        assert_eq!(config.router.max_image_pixels, 4096 * 4096);
        assert_eq!(config.router.max_video_seconds, 60.0);
        assert_eq!(config.router.max_video_frames, 240);
        assert_eq!(config.router.max_audio_seconds, 60.0);
        assert_eq!(config.shard.threads, None);
        assert_eq!(config.shard_startup_timeout_secs, 600);
        assert_eq!(config.router.shutdown_grace_secs, 10);
        assert!(!config.router.json_output);
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
        assert_eq!(config.router.port, 8080);
        assert_eq!(config.router.hostname, "127.0.0.1");
        assert_eq!(config.shard.dtype, Dtype::Bfloat16);
        assert_eq!(config.shard.read_mode, ReadMode::Naive);
        assert_eq!(config.shard.matmul, Matmul::Fast);
        assert_eq!(config.router.compat, Compat::Sglang);
        assert_eq!(
            config.router.api_key.as_ref().map(Secret::expose),
            Some("s3cret")
        );
        assert_eq!(config.router.max_queued_reads, 17);
        assert_eq!(
            config.router.media_allow_hosts,
            ["cdn.example", "127.0.0.1"]
        );
        assert_eq!(config.router.max_image_pixels, 1000);
        assert_eq!(config.shard.threads, Some(4));
        assert_eq!(
            config.cache_dir().ok(),
            Some(PathBuf::from("/var/cache/di"))
        );
        assert!(config.router.json_output);
    }

    #[test]
    fn the_batch_budget_is_auto_unless_given_and_never_zero() {
        assert_eq!(
            parse_with_env(&[], &[])
                .expect("parses")
                .router
                .max_batch_prefill_tokens,
            None
        );
        let from_env =
            parse_with_env(&[], &[("MAX_BATCH_PREFILL_TOKENS", "65536")]).expect("parses");
        assert_eq!(from_env.router.max_batch_prefill_tokens, Some(65536));
        assert!(parse_with_env(&["--max-batch-prefill-tokens", "0"], &[]).is_err());
    }

    #[test]
    fn router_flags_given_by_flag_or_env_are_handed_on_and_defaults_are_not() {
        let config = parse_with_env(
            &["--max-body-bytes", "2048", "--public-ops"],
            &[
                ("OTLP_SERVICE_NAME", "edge"),
                ("MEDIA_ALLOW_HOSTS", "a.example,b.example"),
            ],
        )
        .expect("parses");
        assert_eq!(config.router.max_body_bytes, 2048);
        let argv: Vec<String> = config
            .router_argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            argv,
            [
                "--public-ops",
                "--otlp-service-name",
                "edge",
                "--max-body-bytes",
                "2048",
                "--media-allow-hosts",
                "a.example,b.example"
            ]
        );
        // The key and the served name are the launcher's to hand on (environment, resolved name).
        let keyed =
            parse_with_env(&["--api-key", "k", "--served-model-name", "n"], &[]).expect("parses");
        assert!(keyed.router_argv.is_empty(), "{:?}", keyed.router_argv);
    }

    #[test]
    fn the_shard_dtypes_include_float16() {
        let config = parse_with_env(&["--dtype", "float16"], &[]).expect("the shard takes float16");
        assert_eq!(config.shard.dtype, Dtype::Float16);
    }

    #[test]
    fn print_flags_lists_every_flag_with_its_env_var() {
        let flags = Config::flags_json();
        let listed: Vec<(&str, Option<&str>)> = flags
            .as_array()
            .expect("an array")
            .iter()
            .map(|f| (f["flag"].as_str().expect("flag"), f["env"].as_str()))
            .collect();
        assert!(listed.contains(&("--max-body-bytes", Some("MAX_BODY_BYTES"))));
        assert!(listed.contains(&("--num-shard", Some("NUM_SHARD"))));
        assert!(listed.contains(&("--print-flags", None)));
        let dtype = flags
            .as_array()
            .and_then(|all| all.iter().find(|f| f["flag"] == "--dtype"))
            .expect("--dtype");
        assert_eq!(
            dtype["values"],
            serde_json::json!(["auto", "float32", "bfloat16", "float16"])
        );
        assert_eq!(
            listed.len(),
            Config::command()
                .get_arguments()
                .filter(|a| a.get_long().is_some())
                .count()
        );
    }

    #[test]
    fn flags_win_over_env_vars() {
        let config =
            parse_with_env(&["--port", "9000"], &[("PORT", "8080")]).expect("flag and env parse");
        assert_eq!(config.router.port, 9000);
    }

    #[test]
    fn hostname_env_var_of_the_shell_is_ignored() {
        let _guard = ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::env::set_var("HOSTNAME", "build-box-7");
        let config = Config::try_parse_from(["decision-launcher"]);
        std::env::remove_var("HOSTNAME");
        assert_eq!(config.expect("parses").router.hostname, "0.0.0.0");
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
        assert_eq!(flag_value(&Dtype::Float16), "float16");
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

/// A `--prefix-cache-mb` that is neither auto nor a whole number of MiB.
#[derive(Debug, thiserror::Error)]
#[error("expected auto or a whole number of MiB, got {text:?}")]
pub struct CacheSizeError {
    text: String,
}

fn parse_cache_size(text: &str) -> Result<CacheSize, CacheSizeError> {
    if text == "auto" {
        return Ok(CacheSize::Auto);
    }
    text.parse()
        .map(CacheSize::Mib)
        .map_err(|_| CacheSizeError {
            text: text.to_owned(),
        })
}
