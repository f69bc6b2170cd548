//! HTTP surface: routes, authentication, request ids, body limits and decompression, health and
//! metrics. Handlers only glue a wire shape to the shape-independent `Decider`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{json, Value};
use tower_http::decompression::RequestDecompressionLayer;

use crate::api::{self, openai, score, sglang, systemone};
use crate::body_clock;
use crate::config::Config;
use crate::connections::{self, ConnectionLimits, ConnectionStats};
use crate::decide::Decider;
use crate::error::{DecisionError, FieldError};
use crate::ir::Modality;
use crate::limits::Limits;
use crate::media::{Fetcher, MediaPolicy};
use crate::profile::Shape;
use crate::prompt;
use crate::queue::{BatchBudget, BudgetSource, Queue, QueueConfig, ReadTiming};
use crate::request_body;
use crate::shard::ShardSet;

pub const REQUEST_ID_HEADER: &str = "x-typesafe-request-id";

pub struct AppState {
    pub config: Config,
    pub model_name: String,
    pub decider: Decider,
    pub shards: ShardSet,
    /// The tokens the queue packs into one shard call, and where that number came from.
    pub batch_budget: BatchBudget,
    pub metrics: Option<PrometheusHandle>,
    /// Set when a shutdown signal arrives: `/health` answers 503 and new decision requests are
    /// refused with 503 + Retry-After while the ones already accepted finish.
    pub draining: AtomicBool,
    /// Decision requests being answered: a drain waits for it to reach zero.
    pub in_flight: InFlight,
    pub connections: Arc<ConnectionStats>,
}

/// A count of decision requests in flight, with a wake-up for whoever waits for it to empty.
#[derive(Default)]
pub struct InFlight {
    count: AtomicUsize,
    emptied: tokio::sync::Notify,
}

/// Held by a decision request from its first byte of handling to its answer.
pub struct InFlightGuard<'a>(&'a InFlight);

impl InFlight {
    pub fn enter(&self) -> InFlightGuard<'_> {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self)
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Resolves once no decision request is in flight.
    pub async fn emptied(&self) {
        loop {
            let notified = self.emptied.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.emptied.notify_waiters();
        }
    }
}

fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().ok())
        .clone()
}

/// Connects to the shards, checks the model's labels, and serves until SIGINT/SIGTERM.
pub async fn run(config: Config) -> Result<(), String> {
    let shards = ShardSet::connect(&config.shard_uds_path).await?;
    shards.health().await.map_err(|e| e.to_string())?;
    let info = shards.info.clone();
    tracing::info!(architecture = %info.architecture, dtype = %info.dtype, world_size = info.world_size, engine = %info.engine, implementation = %info.implementation, "connected to shards");
    let state = build_state(config, shards)?;
    let addr: SocketAddr = format!("{}:{}", state.config.hostname, state.config.port)
        .parse()
        .map_err(|e| {
            format!(
                "invalid listen address {}:{}: {e}",
                state.config.hostname, state.config.port
            )
        })?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let limits = connection_limits(&state.config);
    tracing::info!(%addr, model = %state.model_name, max_connections = limits.max_connections, "router ready");
    let state = Arc::new(state);
    let mut signals = Signals::install()?;
    let drain = {
        let state = state.clone();
        async move {
            let signal = signals.recv().await;
            drain(&state, signal, signals.recv()).await;
        }
    };
    let stats = state.connections.clone();
    connections::serve(listener, app(state), limits, stats, drain).await;
    tracing::info!("stopped");
    Ok(())
}

/// The connection bounds from the flags, with the connection cap kept below the open-file limit
/// (the shard sockets, the tokenizer's files and the logs need descriptors too).
fn connection_limits(config: &Config) -> ConnectionLimits {
    let mut max_connections = usize::try_from(config.max_connections).unwrap_or(usize::MAX);
    if let Some(files) = open_file_limit() {
        let room = files.saturating_sub(64).max(1);
        if room < max_connections {
            tracing::warn!(
                max_connections,
                open_file_limit = files,
                "--max-connections is above what the open-file limit allows; holding at most {room}"
            );
            max_connections = room;
        }
    }
    ConnectionLimits {
        max_connections,
        header_read_timeout: Duration::from_secs(config.header_read_timeout_secs),
        keep_alive_timeout: Duration::from_secs(config.keep_alive_timeout_secs),
    }
}

/// The soft RLIMIT_NOFILE of this process.
fn open_file_limit() -> Option<usize> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY)
        .then(|| usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX))
}

/// A graceful drain: `/health` turns 503 at once and new decision requests get 503 + Retry-After
/// (the listener keeps accepting, so clients and load balancers hear it rather than a refused
/// connection) until every request accepted before the signal has been answered. A second signal
/// ends the wait. The launcher bounds the whole drain with `--shutdown-grace-secs`.
async fn drain(state: &AppState, signal: &'static str, again: impl Future<Output = &'static str>) {
    state.draining.store(true, Ordering::SeqCst);
    tracing::info!(
        in_flight = state.in_flight.count(),
        "received {signal}: draining (new requests get 503)"
    );
    tokio::select! {
        () = state.in_flight.emptied() => tracing::info!("every accepted request was answered"),
        signal = again => tracing::warn!("received {signal} again: stopping without waiting"),
    }
}

/// SIGINT and SIGTERM, installed once so that a second one is heard too.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let error = |e: std::io::Error| format!("cannot install the SIGINT/SIGTERM handlers: {e}");
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).map_err(error)?,
            terminate: signal(SignalKind::terminate()).map_err(error)?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

/// The media kinds the shard's model folder can process, as its Info reports them.
fn shard_modalities(info: &decision_proto::v1::InfoResponse) -> Vec<Modality> {
    use decision_proto::v1::Modality as Pb;
    info.modalities()
        .filter_map(|m| match m {
            Pb::Image => Some(Modality::Image),
            Pb::Audio => Some(Modality::Audio),
            Pb::Video => Some(Modality::Video),
            Pb::Unspecified => None,
        })
        .collect()
}

pub fn build_state(config: Config, shards: ShardSet) -> Result<AppState, String> {
    let model_name = config.served_model_name.clone().unwrap_or_else(|| {
        config
            .model_dir()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let max_positions = shards.info.max_position_embeddings as usize;
    let strategy: Result<Arc<dyn prompt::ReadStrategy>, String> = prompt::strategy_for(
        &shards.info.architecture,
        &config.model_dir(),
        &prompt::StrategyOptions {
            max_positions: max_positions.max(1),
            wording: config.compat.wording(),
            modalities: shard_modalities(&shards.info),
        },
    )
    .map(Arc::from);
    match &strategy {
        Ok(s) => {
            for kind in probe_kinds() {
                if let Some(reason) = s.refusal(&kind) {
                    tracing::warn!("{reason}");
                }
            }
        }
        Err(reason) => tracing::warn!("decision routes will answer 501: {reason}"),
    }
    let limits = Limits {
        max_input_tokens: config.max_input_tokens,
        max_body_bytes: config.max_body_bytes,
        ..Limits::default()
    };
    let media = MediaPolicy::from_config(&config)?;
    let fetcher = Fetcher::new(&media)?;
    if !media.allow_hosts.is_empty() {
        tracing::info!(hosts = %config.media_allow_hosts.join(","), "media URLs are fetched from these hosts");
    }
    let batch_budget = BatchBudget::choose(
        config.max_batch_prefill_tokens,
        shards.info.batch_token_budget,
    )?;
    if batch_budget.source == BudgetSource::Flag
        && batch_budget.tokens != shards.info.batch_token_budget as usize
    {
        // Batches the shard then cuts into several forwards, or forwards the router never fills.
        tracing::warn!(
            max_batch_prefill_tokens = batch_budget.tokens,
            shard_batch_token_budget = shards.info.batch_token_budget,
            shard_rule = %shards.info.batch_budget_rule,
            "the router packs its shard calls to another budget than the shard's forward passes; give both the same --max-batch-prefill-tokens (the launcher does)"
        );
    }
    tracing::info!(
        max_batch_prefill_tokens = batch_budget.tokens,
        source = batch_budget.source.name(),
        shard_rule = %shards.info.batch_budget_rule,
        "batch budget"
    );
    let queue = Queue::start(
        shards.clone(),
        QueueConfig {
            max_batch_prefill_tokens: batch_budget.tokens,
            max_batch_wait: Duration::from_millis(config.max_batch_wait_ms),
            max_queued_reads: config.max_queued_reads,
        },
    );
    Ok(AppState {
        model_name,
        decider: Decider {
            strategy,
            queue,
            limits,
            media,
            fetcher,
            request_timeout: config.request_timeout(),
            shards: shards.clone(),
        },
        shards,
        batch_budget,
        metrics: metrics_handle(),
        draining: AtomicBool::new(false),
        in_flight: InFlight::default(),
        connections: Arc::new(ConnectionStats::default()),
        config,
    })
}

fn probe_kinds() -> Vec<crate::ir::QuestionKind> {
    use crate::ir::{ChoiceOption, QuestionKind};
    vec![
        QuestionKind::Choice {
            options: vec![ChoiceOption {
                name: "a".into(),
                description: None,
            }],
        },
        QuestionKind::YesNo {
            yes: None,
            no: None,
        },
        QuestionKind::Score {
            levels: vec!["0".into()],
        },
    ]
}

pub fn app(state: Arc<AppState>) -> Router {
    let body_time = Duration::from_secs(state.config.body_read_timeout_secs);
    Router::new()
        .route("/v1/systemone", post(systemone_handler))
        .route("/v1/decisions", post(decisions_handler))
        .route("/v1/score", post(score_handler))
        .route("/v1/models", get(models_handler))
        .route("/health", get(health_handler))
        .route("/info", get(info_handler))
        .route(
            "/metrics",
            get(metrics_handler)
                .route_layer(middleware::from_fn_with_state(state.clone(), ops_guard)),
        )
        .route(
            "/api-doc/openapi.json",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    api::schema::openapi_json(),
                )
            })
            .route_layer(middleware::from_fn_with_state(state.clone(), ops_guard)),
        )
        .route(
            "/docs",
            get(docs_handler).route_layer(middleware::from_fn_with_state(state.clone(), ops_guard)),
        )
        .layer(RequestDecompressionLayer::new())
        .layer(middleware::from_fn(move |request, next| {
            body_clock::limit_body(body_time, request, next)
        }))
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

/// With an API key and without `--public-ops`, the operator routes need the key too.
async fn ops_guard(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if !state.config.public_ops {
        if let Err(e) = authorize(&state, request.headers()) {
            return error_response(&state, Shape::SystemOne, e);
        }
    }
    next.run(request).await
}

/// Every response carries a request id: the caller's (when it is a sane token) or a fresh one.
async fn request_id(request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .unwrap_or_else(|| format!("req_{}", uuid::Uuid::new_v4().simple()));
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    // Metric series are labelled by route template, so arbitrary paths cannot grow them.
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let span = tracing::info_span!("request", request_id = %id, %method, %path);
    crate::telemetry::continue_trace(&span, request.headers());
    let started = Instant::now();
    let mut response = {
        let _entered = span.enter();
        drop(_entered);
        tracing::Instrument::instrument(next.run(request), span.clone()).await
    };
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    metrics::counter!("decision_http_requests_total", "path" => route.clone(), "status" => status.to_string()).increment(1);
    metrics::histogram!("decision_http_request_duration_seconds", "path" => route)
        .record(elapsed.as_secs_f64());
    if let Some(timing) = response.extensions().get::<ReadTiming>().copied() {
        let breakdown = TimeBreakdown::of(elapsed, timing);
        metrics::histogram!("decision_router_overhead_seconds")
            .record(breakdown.router.as_secs_f64());
        metrics::histogram!("decision_queue_wait_seconds").record(breakdown.queued.as_secs_f64());
        if let Ok(value) = HeaderValue::from_str(&breakdown.server_timing()) {
            response.headers_mut().insert("server-timing", value);
        }
    }
    span.in_scope(|| {
        tracing::info!(
            status,
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "done"
        )
    });
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// A decision request's wall time, split into what the router itself spent (parsing, rendering,
/// tokenizing, gRPC encoding and decoding, probabilities, the response), the wait in the read queue
/// and the shard call.
#[derive(Clone, Copy, Debug, PartialEq)]
struct TimeBreakdown {
    router: Duration,
    queued: Duration,
    shard: Duration,
}

impl TimeBreakdown {
    fn of(total: Duration, timing: ReadTiming) -> Self {
        TimeBreakdown {
            router: total.saturating_sub(timing.queued + timing.shard),
            queued: timing.queued,
            shard: timing.shard,
        }
    }

    /// The standard `Server-Timing` header (W3C), durations in milliseconds.
    fn server_timing(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        format!(
            "router;dur={:.3}, queue;dur={:.3}, shard;dur={:.3}",
            ms(self.router),
            ms(self.queued),
            ms(self.shard)
        )
    }
}

/// `Authorization: Bearer <key>` when an API key is configured; any header is fine otherwise.
fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), DecisionError> {
    let Some(expected) = state.config.api_key.as_deref() else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match given {
        Some(key) if constant_time_eq(key.as_bytes(), expected.as_bytes()) => Ok(()),
        _ => Err(DecisionError::Unauthorized),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The body as JSON, or the error each shape reports for a body it cannot read.
pub fn json_body(body: Result<Bytes, DecisionError>) -> Result<Value, DecisionError> {
    let bytes = body?;
    serde_json::from_slice(&bytes).map_err(|e| {
        DecisionError::Invalid(vec![FieldError::new(
            vec!["body".into(), e.column().into()],
            "json_invalid",
            format!("the body is not valid JSON: {e}"),
        )])
    })
}

/// TypeSafe's SDK uploads images as multipart assets referenced from the state; this server reads the
/// seed's `images` field instead. Said plainly, rather than failing as a body that is not JSON.
fn refuse_multipart(headers: &HeaderMap) -> Result<(), DecisionError> {
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/")
        });
    if multipart {
        return Err(DecisionError::BadRequest {
            param: Some("images".into()),
            message: "multipart asset uploads (the TypeSafe SDK's Image assets) are not read by this server: send each image as a URL or data URL in the `images` field of a JSON body".into(),
        });
    }
    Ok(())
}

/// Renders an error in a shape, with the status the profile gives it there.
fn error_response(state: &AppState, shape: Shape, error: DecisionError) -> Response {
    let status = state.config.compat.status(&error, shape);
    if status.is_server_error() {
        tracing::error!(%status, "{error}");
    } else {
        tracing::info!(%status, "{error}");
    }
    let body = match shape {
        Shape::SystemOne => {
            systemone::error_body(&error, state.config.compat.error_type(&error, shape))
        }
        Shape::OpenAi => openai::error_body(&error),
        Shape::Sglang => sglang::error_body(&error, status.as_u16()),
    };
    let mut response = (status, Json(body)).into_response();
    if let Some(secs) = error.retry_after_secs() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if matches!(
        error,
        DecisionError::BodyTooSlow { .. } | DecisionError::BodyTooLarge { .. }
    ) {
        // The rest of the body may still be on its way (`request_body` reads a refused one only so far):
        // this connection carries no further request.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

async fn systemone_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = request_body::read(body, state.decider.limits.max_body_bytes).await;
    let _in_flight = state.in_flight.enter();
    let mut timing = None;
    let result = async {
        authorize(&state, &headers)?;
        refuse_when_draining(&state)?;
        refuse_multipart(&headers)?;
        let value = json_body(body)?;
        let compat = state.config.compat;
        let request = systemone::parse(&value, &state.decider.limits, compat)?;
        let decided = state.decider.decide(request, 1.0, false).await?;
        timing = Some(decided.timing);
        Ok::<_, DecisionError>(systemone::format(
            &decided.request,
            &value["questions"],
            &decided.decision,
            &state.model_name,
            compat,
        ))
    }
    .await;
    match result {
        Ok(v) => answered(v, timing),
        Err(e) => error_response(&state, Shape::SystemOne, e),
    }
}

/// `/v1/decisions` serves OpenAI's and SGLang's shapes, told apart by their fields.
async fn decisions_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = request_body::read(body, state.decider.limits.max_body_bytes).await;
    let _in_flight = state.in_flight.enter();
    let mut shape = Shape::OpenAi;
    let mut timing = None;
    let result = async {
        authorize(&state, &headers)?;
        let value = json_body(body)?;
        shape = api::decisions_shape(&value)?;
        refuse_when_draining(&state)?;
        let limits = &state.decider.limits;
        if shape == Shape::Sglang {
            let limits = &state.config.compat.limits(Shape::Sglang, limits);
            let parsed = sglang::parse(&value, limits, state.decider.prompt_format())?;
            let (temperature, keep) = (parsed.temperature, parsed.return_prompt_token_ids);
            let decided = state
                .decider
                .decide(parsed.request, temperature, keep)
                .await?;
            timing = Some(decided.timing);
            let parsed = sglang::Parsed {
                request: decided.request,
                ..parsed
            };
            Ok::<_, DecisionError>(sglang::format(
                &parsed,
                &decided.decision,
                decided.reads.as_deref(),
                decided.prompt_format,
            ))
        } else {
            let parsed = openai::parse(&value, limits, state.config.compat)?;
            let decided = state.decider.decide(parsed.request, 1.0, false).await?;
            timing = Some(decided.timing);
            let parsed = openai::Parsed {
                request: decided.request,
                echo: parsed.echo,
            };
            Ok(openai::format(
                &parsed,
                &decided.decision,
                &state.model_name,
                state.config.compat,
            ))
        }
    }
    .await;
    match result {
        Ok(v) => answered(v, timing),
        Err(e) => error_response(&state, shape, e),
    }
}

/// `/v1/score` (SGLang's scoring route): token ids in, label probabilities out; for pinning and
/// replaying a decision's prompt. Only next-token engines can score ids this way.
async fn score_handler(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = request_body::read(body, state.decider.limits.max_body_bytes).await;
    let mut timing = None;
    let result = async {
        authorize(&state, &headers)?;
        refuse_when_draining(&state)?;
        let value = json_body(body)?;
        let info = &state.shards.info;
        if !matches!(info.engine.as_str(), "tree" | "fork" | "naive") {
            return Err(DecisionError::BadRequest {
                param: None,
                message: format!(
                    "/v1/score reads the next token after the ids sent; this model's reads are {} reads",
                    info.engine
                ),
            });
        }
        // The answer position must fit in the model's context.
        let context = match info.max_position_embeddings as usize {
            0 => usize::MAX,
            n => n - 1,
        };
        let max_tokens = context.min(state.decider.limits.max_input_tokens);
        let request = score::parse(&value, info.vocab_size, max_tokens)?;
        let (outcomes, read_timing) = state.decider.score(score::reads(&request)).await?;
        timing = Some(read_timing);
        Ok::<_, DecisionError>(score::format(&request, &outcomes, &state.model_name))
    }
    .await;
    match result {
        Ok(v) => answered(v, timing),
        Err(e) => error_response(&state, Shape::Sglang, e),
    }
}

/// Requests that arrive after a shutdown signal (on connections already open) go elsewhere.
fn refuse_when_draining(state: &AppState) -> Result<(), DecisionError> {
    if state.draining.load(Ordering::SeqCst) {
        Err(DecisionError::Draining)
    } else {
        Ok(())
    }
}

/// A decision answer; its read timing rides along for the request middleware to report.
fn answered(body: Value, timing: Option<ReadTiming>) -> Response {
    let mut response = Json(body).into_response();
    if let Some(timing) = timing {
        response.extensions_mut().insert(timing);
    }
    response
}

async fn models_handler(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return error_response(&state, Shape::SystemOne, e);
    }
    let name = &state.model_name;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Json(json!({
        "models": [{
            "name": name,
            "description": format!("{name} ({}) served as a decision model by decision-inference", state.shards.info.architecture),
            "release_date": chrono::Local::now().format("%Y-%m-%d").to_string(),
        }],
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": "decision-inference"}],
    }))
    .into_response()
}

async fn health_handler(State(state): State<Arc<AppState>>) -> Response {
    if state.draining.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, HeaderValue::from(1))],
            Json(json!({"status": "draining", "message": DecisionError::Draining.to_string()})),
        )
            .into_response();
    }
    match state.shards.health().await {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "message": e.to_string()})),
        )
            .into_response(),
    }
}

async fn info_handler(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    // Only a caller that presented the key learns where the model lives on disk.
    let keyed = state.config.api_key.is_some() && authorize(&state, &headers).is_ok();
    if !keyed && !state.config.public_ops {
        if let Err(e) = authorize(&state, &headers) {
            return error_response(&state, Shape::SystemOne, e);
        }
    }
    let info = &state.shards.info;
    let limits = &state.decider.limits;
    let refusals: Vec<String> = match &state.decider.strategy {
        Ok(s) => probe_kinds().iter().filter_map(|k| s.refusal(k)).collect(),
        Err(reason) => vec![reason.clone()],
    };
    let mut body = json!({
        "model_id": state.model_name,
        "architecture": info.architecture,
        "dtype": info.dtype,
        "device": info.device,
        "shards": state.shards.world_size(),
        // `read_mode` is the engine's older name, kept for clients that read it.
        "read_mode": info.engine,
        "engine": info.engine,
        "implementation": info.implementation,
        "matmul": info.matmul,
        "compiled_chains": info.compiled_chains,
        "read_strategy": state.decider.strategy.as_ref().map(|s| s.name()).unwrap_or("none"),
        "modalities": state.decider.strategy.as_ref().map(|s| s.modalities().iter().map(|m| m.field()).collect::<Vec<_>>()).unwrap_or_default(),
        "prompt_format": state.decider.prompt_format().map(|f| json!({"name": f.name, "version": f.version})),
        "refusals": refusals,
        "max_position_embeddings": info.max_position_embeddings,
        "prefix_cache": {
            "enabled": info.prefix_cache_bytes > 0,
            "budget_bytes": info.prefix_cache_bytes,
            "rule": info.prefix_cache_rule,
        },
        // The router's tokens per shard call and where they came from, beside the shard's budget for
        // one forward pass and its rule (equal unless the two were started with different values).
        "batch_budget": {
            "max_batch_prefill_tokens": state.batch_budget.tokens,
            "source": state.batch_budget.source.name(),
            "batch_token_budget": info.batch_token_budget,
            "batch_budget_rule": info.batch_budget_rule,
        },
        "limits": {
            "max_questions": limits.max_questions,
            "max_choices": limits.max_choices,
            "max_levels": limits.max_levels,
            "max_input_tokens": limits.max_input_tokens,
            "max_body_bytes": limits.max_body_bytes,
            "max_batch_prefill_tokens": state.batch_budget.tokens,
            "max_batch_wait_ms": state.config.max_batch_wait_ms,
            "max_queued_reads": state.config.max_queued_reads,
            "request_timeout_secs": state.config.request_timeout_secs,
            "header_read_timeout_secs": state.config.header_read_timeout_secs,
            "body_read_timeout_secs": state.config.body_read_timeout_secs,
            "keep_alive_timeout_secs": state.config.keep_alive_timeout_secs,
            "max_connections": connection_limits(&state.config).max_connections,
        },
        "compat": state.config.compat.name(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    if keyed {
        body["model_dir"] = json!(state.config.model_dir());
    }
    Json(body).into_response()
}

async fn metrics_handler(State(state): State<Arc<AppState>>) -> Response {
    if let Some(handle) = &state.metrics {
        metrics::gauge!("decision_queued_reads").set(state.decider.queue.queued_reads() as f64);
        metrics::gauge!("decision_queued_tokens").set(state.decider.queue.queued_tokens() as f64);
        metrics::gauge!("decision_read_rate_tokens_per_second")
            .set(state.decider.queue.read_rate());
        metrics::gauge!("decision_http_requests_in_flight").set(state.in_flight.count() as f64);
        metrics::gauge!("decision_http_connections_open")
            .set(state.connections.open.load(Ordering::Relaxed) as f64);
        metrics::gauge!("decision_http_connections_closed_idle")
            .set(state.connections.closed_idle.load(Ordering::Relaxed) as f64);
        metrics::gauge!("decision_http_connections_closed_slow")
            .set(state.connections.closed_slow.load(Ordering::Relaxed) as f64);
        (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder unavailable",
        )
            .into_response()
    }
}

/// A self-contained reference page (no CDN: deployments are often offline) built from the OpenAPI document.
async fn docs_handler() -> Response {
    let doc: Value = serde_json::from_str(&api::schema::openapi_json()).unwrap_or_default();
    let mut rows = String::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for (method, op) in item.as_object().into_iter().flatten() {
            let statuses: Vec<&String> = op["responses"]
                .as_object()
                .map(|r| r.keys().collect())
                .unwrap_or_default();
            rows.push_str(&format!(
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td></tr>",
                method.to_uppercase(),
                html_escape(path),
                html_escape(
                    &statuses
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            ));
        }
    }
    let schemas =
        html_escape(&serde_json::to_string_pretty(&doc["components"]).unwrap_or_default());
    let page = format!(
        "<!doctype html><meta charset=utf-8><title>decision-inference API</title>\
         <h1>decision-inference API</h1><p>Machine-readable: <a href=/api-doc/openapi.json>/api-doc/openapi.json</a></p>\
         <table border=1 cellpadding=4><tr><th>method</th><th>path</th><th>statuses</th></tr>{rows}</table>\
         <h2>Schemas</h2><pre>{schemas}</pre>"
    );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use clap::Parser;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    /// The app over no shards and no model: enough for routes, metrics and drain.
    fn test_state() -> Arc<AppState> {
        state_with(&[])
    }

    fn state_with(flags: &[&str]) -> Arc<AppState> {
        let mut args = vec![
            "decision-router",
            "--model-dir",
            "/srv/private-tree/secret-place",
        ];
        args.extend_from_slice(flags);
        let config = Config::parse_from(args);
        Arc::new(build_state(config, ShardSet::detached()).unwrap())
    }

    fn get_with_key(path: &str, key: &str) -> axum::http::Request<Body> {
        axum::http::Request::get(path)
            .header(header::AUTHORIZATION, format!("Bearer {key}"))
            .body(Body::empty())
            .unwrap()
    }

    const OPS_ROUTES: [&str; 4] = ["/metrics", "/info", "/docs", "/api-doc/openapi.json"];

    #[tokio::test]
    async fn with_an_api_key_the_operator_routes_need_it_and_health_does_not() {
        let state = state_with(&["--api-key", "k3y"]);
        for path in OPS_ROUTES {
            let response = call(&state, get(path)).await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
            assert!(
                text(response).await.contains("authentication_error"),
                "{path}"
            );
            let wrong = call(&state, get_with_key(path, "k3yx")).await;
            assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{path}");
            let right = call(&state, get_with_key(path, "k3y")).await;
            assert_eq!(right.status(), StatusCode::OK, "{path}");
        }
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        // The key holder sees where the model lives.
        let info: Value =
            serde_json::from_str(&text(call(&state, get_with_key("/info", "k3y")).await).await)
                .unwrap();
        assert_eq!(info["model_dir"], "/srv/private-tree/secret-place");
    }

    #[tokio::test]
    async fn public_ops_opens_the_operator_routes_but_info_shows_paths_only_to_the_key() {
        let state = state_with(&["--api-key", "k3y", "--public-ops"]);
        for path in OPS_ROUTES {
            assert_eq!(
                call(&state, get(path)).await.status(),
                StatusCode::OK,
                "{path}"
            );
        }
        let anonymous = text(call(&state, get("/info")).await).await;
        assert!(!anonymous.contains("private-tree"), "{anonymous}");
        let keyed = text(call(&state, get_with_key("/info", "k3y")).await).await;
        assert!(keyed.contains("private-tree"), "{keyed}");
        // The decision routes still need the key.
        let request = axum::http::Request::post("/v1/systemone")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"state": {}, "questions": {}}"#))
            .unwrap();
        assert_eq!(
            call(&state, request).await.status(),
            StatusCode::UNAUTHORIZED
        );
    }

    #[tokio::test]
    async fn without_an_api_key_info_shows_no_filesystem_path() {
        let state = test_state();
        let info = text(call(&state, get("/info")).await).await;
        assert!(
            !info.contains("private-tree") && !info.contains("model_dir"),
            "{info}"
        );
        let info: Value = serde_json::from_str(&info).unwrap();
        assert_eq!(info["limits"]["request_timeout_secs"], 120);
        assert_eq!(info["limits"]["header_read_timeout_secs"], 10);
        assert_eq!(info["limits"]["keep_alive_timeout_secs"], 20);
    }

    /// Without --max-batch-prefill-tokens the router packs its calls to the shard's budget; with it,
    /// to the flag's. /info shows the one in use, where it came from, and the shard's with its rule.
    #[tokio::test]
    async fn info_shows_the_batch_budget_in_use_and_where_it_came_from() {
        let info = |state: Arc<AppState>| async move {
            serde_json::from_str::<Value>(&text(call(&state, get("/info")).await).await).unwrap()
        };
        let auto = test_state();
        assert_eq!(
            auto.batch_budget,
            BatchBudget {
                tokens: 4096,
                source: BudgetSource::Shard
            }
        );
        let shown = info(auto).await;
        assert_eq!(
            shown["batch_budget"],
            json!({
                "max_batch_prefill_tokens": 4096,
                "source": "shard",
                "batch_token_budget": 4096,
                "batch_budget_rule": "detached: no shards",
            })
        );
        assert_eq!(shown["limits"]["max_batch_prefill_tokens"], 4096);

        let given = state_with(&["--max-batch-prefill-tokens", "2048"]);
        assert_eq!(given.batch_budget.tokens, 2048);
        let shown = info(given).await;
        assert_eq!(
            shown["batch_budget"]["source"],
            "--max-batch-prefill-tokens"
        );
        assert_eq!(shown["batch_budget"]["max_batch_prefill_tokens"], 2048);
        assert_eq!(shown["batch_budget"]["batch_token_budget"], 4096);
        assert_eq!(shown["limits"]["max_batch_prefill_tokens"], 2048);

        // A shard that reports no budget leaves the router nothing to follow but the flag.
        let mut silent = ShardSet::detached();
        silent.info.batch_token_budget = 0;
        let config = Config::parse_from(["decision-router", "--model-dir", "/m"]);
        let error = build_state(config, silent.clone())
            .err()
            .expect("no budget");
        assert!(error.contains("--max-batch-prefill-tokens"), "{error}");
        let config = Config::parse_from([
            "decision-router",
            "--model-dir",
            "/m",
            "--max-batch-prefill-tokens",
            "1024",
        ]);
        assert_eq!(
            build_state(config, silent).unwrap().batch_budget.tokens,
            1024
        );
        assert!(Config::try_parse_from([
            "decision-router",
            "--model-dir",
            "/m",
            "--max-batch-prefill-tokens",
            "0"
        ])
        .is_err());
    }

    #[test]
    fn the_api_key_can_come_from_a_file() {
        let path = std::env::temp_dir().join(format!("di-key-{}", std::process::id()));
        std::fs::write(&path, "  from-a-file\n").unwrap();
        let mut config = Config::parse_from([
            "decision-router",
            "--model-dir",
            "/m",
            "--api-key-file",
            path.to_str().unwrap(),
        ]);
        config.load_api_key_file().unwrap();
        assert_eq!(config.api_key.as_deref(), Some("from-a-file"));
        std::fs::write(&path, "\n").unwrap();
        let error = config.load_api_key_file().unwrap_err();
        assert!(error.contains("is empty"), "{error}");
        std::fs::remove_file(&path).ok();
        assert!(Config::try_parse_from([
            "decision-router",
            "--model-dir",
            "/m",
            "--api-key",
            "a",
            "--api-key-file",
            "/f",
        ])
        .is_err());
    }

    /// The drain waits for requests already in flight, and a second signal cuts it short.
    #[tokio::test]
    async fn a_drain_refuses_new_work_and_ends_when_the_accepted_requests_are_answered() {
        let state = test_state();
        let first = state.in_flight.enter();
        let second = state.in_flight.enter();
        let draining = {
            let state = state.clone();
            tokio::spawn(async move { drain(&state, "SIGTERM", std::future::pending()).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(state.draining.load(Ordering::SeqCst));
        assert_eq!(
            call(&state, get("/health")).await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        drop(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!draining.is_finished(), "one request is still in flight");
        drop(second);
        tokio::time::timeout(Duration::from_secs(1), draining)
            .await
            .expect("the drain ends with the last request")
            .unwrap();

        let state = test_state();
        let _stuck = state.in_flight.enter();
        tokio::time::timeout(
            Duration::from_secs(1),
            drain(&state, "SIGTERM", async { "SIGINT" }),
        )
        .await
        .expect("a second signal ends the wait");
    }

    async fn call(state: &Arc<AppState>, request: axum::http::Request<Body>) -> Response {
        app(state.clone()).oneshot(request).await.unwrap()
    }

    async fn text(response: Response) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn get(path: &str) -> axum::http::Request<Body> {
        axum::http::Request::get(path).body(Body::empty()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_trickles_past_its_limit_is_408_and_closes_the_connection() {
        use futures::StreamExt as _;
        let state = state_with(&["--body-read-timeout-secs", "2"]);
        let first = Bytes::from_static(br#"{"state": "Refund"#);
        let stalled = futures::stream::iter([Ok::<_, std::io::Error>(first)])
            .chain(futures::stream::pending());
        let request = axum::http::Request::post("/v1/systemone")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(stalled))
            .unwrap();
        let started = tokio::time::Instant::now();
        let response = call(&state, request).await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        let body: Value = serde_json::from_str(&text(response).await).unwrap();
        assert_eq!(body["detail"]["error_type"], "timeout", "{body}");
        assert!(
            body["detail"]["message"]
                .as_str()
                .unwrap()
                .contains("within 2 s (body_read_timeout_secs)"),
            "{body}"
        );
        let info: Value =
            serde_json::from_str(&text(call(&state, get("/info")).await).await).unwrap();
        assert_eq!(info["limits"]["body_read_timeout_secs"], 2);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_read_to_its_end_before_its_413_on_every_route() {
        // Refused unread, the rest of the upload met the connection's reset, and a proxy could drop the 413 with
        // it (docker's port proxy did, 1 run in 4). axum's `Bytes` extractor stopped reading at the limit.
        use futures::StreamExt as _;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let state = state_with(&["--max-body-bytes", "1000"]);
        for route in ["/v1/systemone", "/v1/decisions", "/v1/score"] {
            let taken = Arc::new(AtomicUsize::new(0));
            let counted = taken.clone();
            let chunks = futures::stream::iter(0..30).map(move |_| {
                counted.fetch_add(100, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 100]))
            });
            let request = axum::http::Request::post(route)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(chunks))
                .unwrap();
            let response = call(&state, request).await;
            assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE, "{route}");
            assert_eq!(response.headers()[header::CONNECTION], "close", "{route}");
            assert_eq!(
                taken.load(Ordering::SeqCst),
                3000,
                "{route}: the rest of the body was left unread"
            );
            let body = text(response).await;
            assert!(
                body.contains("larger than the limit of 1000 bytes"),
                "{route}: {body}"
            );
        }
    }

    #[tokio::test]
    async fn random_paths_share_one_metric_series() {
        let state = test_state();
        for i in 0..500 {
            let path = format!("/no/such/route-{i}-{}", "y".repeat(i % 200));
            assert_eq!(
                call(&state, get(&path)).await.status(),
                StatusCode::NOT_FOUND
            );
        }
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        let scrape = text(call(&state, get("/metrics")).await).await;
        assert!(
            !scrape.contains("/no/such/route"),
            "raw paths leak into labels"
        );
        let unmatched = scrape
            .lines()
            .filter(|l| {
                l.starts_with("decision_http_requests_total{") && l.contains("path=\"unmatched\"")
            })
            .count();
        assert_eq!(unmatched, 1, "{scrape}");
        assert!(scrape.contains("path=\"/health\""), "{scrape}");
        assert!(scrape.len() < 32 << 10, "{} bytes", scrape.len());
    }

    #[tokio::test]
    async fn a_multipart_upload_is_refused_saying_what_to_send() {
        let state = test_state();
        let request = axum::http::Request::post("/v1/systemone")
            .header(header::CONTENT_TYPE, "multipart/form-data; boundary=x")
            .body(Body::from("--x\r\n\r\n{}\r\n--x--\r\n"))
            .unwrap();
        let response = call(&state, request).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = text(response).await;
        assert!(
            body.contains("multipart asset uploads") && body.contains("`images`"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_draining_server_refuses_new_work_with_503_and_retry_after() {
        let state = test_state();
        assert_eq!(call(&state, get("/health")).await.status(), StatusCode::OK);
        state.draining.store(true, Ordering::SeqCst);
        let health = call(&state, get("/health")).await;
        assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE);
        let post = |path: &str, body: &str| {
            axum::http::Request::post(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_owned()))
                .unwrap()
        };
        for (path, body, error_field) in [
            (
                "/v1/systemone",
                r#"{"state": {}, "questions": {}}"#,
                "error_type",
            ),
            (
                "/v1/decisions",
                r#"{"model": "m", "state": {}, "questions": []}"#,
                "error",
            ),
        ] {
            let response = call(&state, post(path, body)).await;
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
            assert_eq!(response.headers()[header::RETRY_AFTER], "1", "{path}");
            let body = text(response).await;
            assert!(
                body.contains(error_field) && body.contains("shutting down"),
                "{path}: {body}"
            );
        }
    }

    #[test]
    fn router_time_is_what_the_queue_and_the_shard_did_not_take() {
        let timing = ReadTiming {
            queued: Duration::from_micros(250),
            shard: Duration::from_millis(40),
        };
        let breakdown = TimeBreakdown::of(Duration::from_micros(41_500), timing);
        assert_eq!(breakdown.router, Duration::from_micros(1_250));
        assert_eq!(
            breakdown.server_timing(),
            "router;dur=1.250, queue;dur=0.250, shard;dur=40.000"
        );
        // Clocks read at different places never make the router's share negative.
        assert_eq!(
            TimeBreakdown::of(Duration::from_millis(1), timing).router,
            Duration::ZERO
        );
    }
}
