//! The router's one configuration struct: every flag documented, every flag also an env var.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, Parser};

pub use crate::profile::Compat;

impl Config {
    /// The model folder; clap guarantees it unless only the OpenAPI document was asked for.
    pub fn model_dir(&self) -> PathBuf {
        self.model_dir.clone().unwrap_or_default()
    }
}

impl RouterFlags {
    /// Moves a key from `--api-key-file` into `api_key`.
    pub fn load_api_key_file(&mut self) -> Result<(), ApiKeyFileError> {
        let Some(path) = &self.api_key_file else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path).map_err(|source| ApiKeyFileError::Unreadable {
            path: path.clone(),
            source,
        })?;
        let key = text.trim();
        if key.is_empty() {
            return Err(ApiKeyFileError::Empty { path: path.clone() });
        }
        self.api_key = Some(Secret::from(key.to_owned()));
        Ok(())
    }

    /// `--otlp-endpoint`, else the standard `OTEL_EXPORTER_OTLP_ENDPOINT`; empty counts as unset.
    pub fn otlp_endpoint(&self) -> Option<String> {
        self.otlp_endpoint
            .clone()
            .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok())
            .filter(|e| !e.trim().is_empty())
    }

    /// How long requests in flight at a shutdown signal may run before they are answered 503: the
    /// grace less 3 s, which the answers, the connections' close and the shards' own exit share
    /// (half the grace when it is under 6 s).
    pub fn drain_cut(&self) -> std::time::Duration {
        let grace = std::time::Duration::from_secs(self.shutdown_grace_secs);
        if self.shutdown_grace_secs >= 6 {
            grace - std::time::Duration::from_secs(3)
        } else {
            grace / 2
        }
    }

    /// Queued reads above which `/ready` answers 503: `--queue-high-water-percent` of
    /// `--max-queued-reads`, rounded down, at least 1.
    pub fn queue_high_water(&self) -> usize {
        (self.max_queued_reads * usize::from(self.queue_high_water_percent) / 100).max(1)
    }

    pub fn request_timeout(&self) -> Option<std::time::Duration> {
        (self.request_timeout_secs > 0)
            .then(|| std::time::Duration::from_secs(self.request_timeout_secs))
    }

    /// The router argv for the flags of this struct that `matches` (a CLI that flattens it) got
    /// from its command line or environment, skipping the ids in `except`: the router parses the
    /// operator's own text, and a flag not given keeps the one default declared here.
    pub fn given_argv(matches: &ArgMatches, except: &[&str]) -> Vec<OsString> {
        let command = Self::augment_args(Command::new("router-flags"));
        let mut argv = Vec::new();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            let (Some(long), false) = (arg.get_long(), except.contains(&id)) else {
                continue;
            };
            let given = matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            );
            if !given {
                continue;
            }
            if !arg.get_action().takes_values() {
                if matches.get_flag(id) {
                    argv.push(format!("--{long}").into());
                }
                continue;
            }
            let Some(raw) = matches.get_raw(id) else {
                continue;
            };
            let values: Vec<&OsStr> = raw.collect();
            argv.push(format!("--{long}").into());
            // A list flag (`value_delimiter`) travels as one comma-joined value.
            let mut joined = OsString::new();
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    joined.push(",");
                }
                joined.push(value);
            }
            argv.push(joined);
        }
        argv
    }
}

/// Why `--api-key-file` gave no key.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeyFileError {
    #[error("cannot read --api-key-file {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--api-key-file {} is empty", path.display())]
    Empty { path: PathBuf },
}

/// A value that must never reach a log line: `Debug` prints a placeholder.
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
    /// Every flag the launcher shares: declared once here, flattened into both CLIs.
    #[command(flatten)]
    pub flags: RouterFlags,
}

/// The router's flags that `decision-launcher` takes too: it flattens this struct into its own CLI
/// and hands the router the ones the operator gave (`given_argv`), so a new flag here is a launcher
/// flag by construction. Docs speak for both binaries: `decision-launcher --help` shows them.
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct RouterFlags {
    /// Address the router listens on. (Its env var is not HOSTNAME: shells set that to the machine name.)
    #[arg(long, env = "DECISION_HOSTNAME", default_value = "0.0.0.0")]
    pub hostname: String,
    /// HTTP port the router listens on.
    #[arg(long, env = "PORT", default_value_t = 3000)]
    pub port: u16,
    /// Name the model is served and reported under, the one clients send. Defaults to the model
    /// folder's name (under the launcher: the model id).
    #[arg(long, env = "SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Compatibility profile of the HTTP API: the TypeSafe System One contract, or byte-for-byte
    /// wording, error codes and extension fields of the vLLM or SGLang implementations.
    #[arg(long, env = "COMPAT", value_enum, default_value = "typesafe")]
    pub compat: Compat,
    /// When set, every route but /health, /ready and the playground page requires `Authorization: Bearer <key>`
    /// (the /v1 routes and, unless --public-ops, /metrics, /info, /docs and /api-doc; the page at / asks
    /// for the key and sends it). The launcher hands it to the router
    /// in its environment, never on its command line. Prefer the environment variable or
    /// --api-key-file: a flag's value shows in the process list. No key: the API is open.
    #[arg(
        long,
        env = "API_KEY",
        hide_env_values = true,
        conflicts_with = "api_key_file"
    )]
    pub api_key: Option<Secret>,
    /// A file holding the API key (surrounding whitespace ignored), read once at startup.
    #[arg(long, env = "API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// With an API key: /metrics, /info, /docs and /api-doc/openapi.json answer without it (for a
    /// scraper or a dashboard on a trusted network). /info never shows filesystem paths to a caller
    /// that did not present the key.
    #[arg(long, env = "PUBLIC_OPS")]
    pub public_ops: bool,
    /// Serve no playground at `/` (a page where a person types a state and questions and sees the
    /// probabilities, calling /info and /v1/systemone). With an API key the page loads but asks for the
    /// key, and sends it on every call.
    #[arg(long, env = "NO_PLAYGROUND")]
    pub no_playground: bool,
    /// Seconds a decision request may take from its parse to its answer; past it the answer is 504
    /// naming the limit (503 `shard_unavailable` when the shards do not answer a health probe
    /// either) and its reads not yet sent are dropped. Requests that the work queued ahead of them
    /// would keep past it are refused at once with 529 (429 outside the default profile) and
    /// Retry-After. 0 turns the deadline off.
    #[arg(long, env = "REQUEST_TIMEOUT_SECS", default_value_t = 120)]
    pub request_timeout_secs: u64,
    /// Seconds between a shutdown signal and the router's exit; the launcher gives its router and
    /// shards the same grace on shutdown (the router first, then the shards). New requests get 503 + Retry-After at once; requests in flight get
    /// the grace less 3 s (half of it under 6 s) to finish, and the rest are then answered 503 +
    /// Retry-After with their reads dropped, so every accepted request hears a status line.
    #[arg(long, env = "SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,
    /// Seconds a client may take to send a request's head, from its first byte; then the connection
    /// is closed.
    #[arg(long, env = "HEADER_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_secs: u64,
    /// Seconds a request's body may take to arrive once its head has; past it the answer is 408
    /// naming the limit and the connection is closed. 0 turns it off.
    #[arg(long, env = "BODY_READ_TIMEOUT_SECS", default_value_t = 60)]
    pub body_read_timeout_secs: u64,
    /// Seconds a connection may stay open with nothing arriving and no request in flight.
    #[arg(long, env = "KEEP_ALIVE_TIMEOUT_SECS", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_alive_timeout_secs: u64,
    /// Client connections held at once; beyond it new ones wait in the listen backlog. Capped below
    /// the process's open-file limit (RLIMIT_NOFILE) so accepting never runs out of descriptors.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// OTLP/gRPC endpoint to export traces to (e.g. http://collector:4317); also read from the
    /// standard OTEL_EXPORTER_OTLP_ENDPOINT. The launcher gives the shards the same one, so a request
    /// is one trace. Unset (default): no spans leave the processes and no outbound connection is made.
    #[arg(long, env = "OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the exported spans.
    #[arg(long, env = "OTLP_SERVICE_NAME", default_value = "decision-router")]
    pub otlp_service_name: String,
    /// Unique prompt tokens packed into one shard call (a single larger request still runs alone).
    /// Unset (auto, default): the shard's own batch budget, read from its Info at startup (from the
    /// GPU memory left after the weights and the prefix cache on CUDA, a CPU default on CPU). Set:
    /// this value; give the shards the same one (the launcher passes it to every shard), or /info
    /// shows the two apart.
    #[arg(long, env = "MAX_BATCH_PREFILL_TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batch_prefill_tokens: Option<u64>,
    /// How long the first read of a batch waits for reads of other requests, in milliseconds.
    #[arg(long, env = "MAX_BATCH_WAIT_MS", default_value_t = 2)]
    pub max_batch_wait_ms: u64,
    /// Shard calls outstanding at once. 2: a batch that fills --max-batch-prefill-tokens is sent
    /// while the shard still reads the one before it and waits there, so under load the device starts
    /// each batch without waiting for a round trip to the router (a batch that is not full still
    /// waits for the shard to answer, as more requests may join it). 1: one call at a time. Unset
    /// (auto, default): 2 on a GPU shard of one rank; 1 on CPU, where the device is the host's own
    /// cores and the router's work would only move beside the forward; 1 with tensor parallelism,
    /// whose ranks must run batches in one order (two calls in flight could reach them in different
    /// orders), where 2 is refused at startup.
    #[arg(long, env = "MAX_BATCHES_AT_SHARD", value_parser = clap::value_parser!(u64).range(1..=2))]
    pub max_batches_at_shard: Option<u64>,
    /// Unique prompt tokens one request may need; larger requests get 413 naming the limit.
    #[arg(long, env = "MAX_INPUT_TOKENS", default_value_t = crate::limits::DEFAULT_MAX_INPUT_TOKENS)]
    pub max_input_tokens: usize,
    /// Reads that may wait at once; beyond it requests get 529 (429 in other profiles) with Retry-After.
    #[arg(long, env = "MAX_QUEUED_READS", default_value_t = 4096)]
    pub max_queued_reads: usize,
    /// The queue's high-water mark for readiness, in percent of --max-queued-reads: while more reads
    /// than that wait, `GET /ready` answers 503 so that a load balancer or an endpoint picker sends new
    /// work to other replicas before this one starts refusing it (529/429 at --max-queued-reads).
    /// `/health` (liveness) does not look at the queue.
    #[arg(long, env = "QUEUE_HIGH_WATER_PERCENT", default_value_t = 80, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub queue_high_water_percent: u8,
    /// Largest accepted request body after decompression, in bytes.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = crate::limits::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Hosts whose `http(s)` media URLs the router fetches (images, audio, videos): a comma list of host
    /// names, IP addresses and `*.domain` patterns, or `*` for any public host. Loopback, link-local,
    /// private and CGNAT addresses are reached only through an entry that names them, never through
    /// `*`. Empty (default): only `data:` URLs are read and any other URL is a 400 naming its position.
    #[arg(long, env = "MEDIA_ALLOW_HOSTS", value_delimiter = ',')]
    pub media_allow_hosts: Vec<String>,
    /// Time one media fetch may take (connect, redirects and body), in seconds; slower is a 400.
    #[arg(long, env = "MEDIA_FETCH_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub media_fetch_timeout_secs: u64,
    /// Media items (images, audio and videos together) one request may carry; more is a 422/400.
    #[arg(long, env = "MAX_MEDIA_ITEMS", default_value_t = 8)]
    pub max_media_items: usize,
    /// Images one request may carry.
    #[arg(long, env = "MAX_IMAGE_ITEMS", default_value_t = 8)]
    pub max_image_items: usize,
    /// Audio clips one request may carry.
    #[arg(long, env = "MAX_AUDIO_ITEMS", default_value_t = 4)]
    pub max_audio_items: usize,
    /// Videos one request may carry (each is up to --max-video-frames images to the model).
    #[arg(long, env = "MAX_VIDEO_ITEMS", default_value_t = 2)]
    pub max_video_items: usize,
    /// Bytes of one media item, decoded from its data URL or downloaded (default 20 MiB); larger is a 413.
    #[arg(long, env = "MAX_MEDIA_BYTES", default_value_t = 20 << 20)]
    pub max_media_bytes: usize,
    /// Pixels (width × height, read from the header) of one image (default 4096 × 4096); more is a 413.
    #[arg(long, env = "MAX_IMAGE_PIXELS", default_value_t = 4096 * 4096)]
    pub max_image_pixels: u64,
    /// Seconds of one video; checked by the shard's decoder.
    #[arg(long, env = "MAX_VIDEO_SECONDS", default_value_t = 60.0, value_parser = positive_seconds)]
    pub max_video_seconds: f64,
    /// Frames sampled from one video; checked by the shard's decoder.
    #[arg(long, env = "MAX_VIDEO_FRAMES", default_value_t = 240)]
    pub max_video_frames: u32,
    /// Seconds of one audio clip; checked by the shard's decoder.
    #[arg(long, env = "MAX_AUDIO_SECONDS", default_value_t = 60.0, value_parser = positive_seconds)]
    pub max_audio_seconds: f64,
    /// How decision questions are read when a request does not say (`x_debias`): `off`, once in the
    /// order sent; `rotate`, a choice under cyclic rotations of its options (all of them up to
    /// --debias-max-orders, else that many evenly spaced), a score under both level orders, a yes/no
    /// under both label orders, each answer's probabilities averaged by name and its
    /// `order_sensitivity` reported; `prior`, PriDe's label-prior correction: a choice read once with
    /// its label prior divided out, once earlier rotated reads of the same question form (kind,
    /// options, wording) have estimated one (8 samples), else read under all its rotations. The
    /// orders share the request's state, so each adds only its question's own tokens.
    #[arg(long, env = "DEBIAS", value_enum, default_value = "off")]
    pub debias: crate::debias::Debias,
    /// Rotations a choice is read under at most with `rotate` (a choice with more options is read
    /// under this many evenly spaced rotations).
    #[arg(long, env = "DEBIAS_MAX_ORDERS", default_value_t = crate::debias::DEFAULT_MAX_ORDERS as u64, value_parser = clap::value_parser!(u64).range(1..=255))]
    pub debias_max_orders: u64,
    /// Where the router keeps what must survive a restart: the calibration fits
    /// (`/v1/calibrations`), in `calibrations.sqlite3` under this folder (created if missing). Without
    /// it fits are kept in memory and lost when the router stops. The image sets `/data` (a volume).
    #[arg(long, env = "DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Emit logs as JSON lines (under the launcher: its own and every child's).
    #[arg(long, env = "JSON_OUTPUT")]
    pub json_output: bool,
}

/// A media duration flag that is not a positive, finite number of seconds.
#[derive(Debug, thiserror::Error)]
#[error("'{value}' is not a positive number of seconds")]
pub struct NotPositiveSeconds {
    value: String,
}

fn positive_seconds(value: &str) -> Result<f64, NotPositiveSeconds> {
    match value.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Ok(s),
        _ => Err(NotPositiveSeconds {
            value: value.to_owned(),
        }),
    }
}
