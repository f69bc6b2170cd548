//! The OpenAPI document (`/api-doc/openapi.json`): request and response schemas of the three wire
//! shapes, for clients and for generated-input tests. These types only describe; parsing is in the
//! shape modules, which validate far more than a schema can say.

#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{OpenApi, ToSchema};

use super::openapi_examples::Examples;

/// Free text: a string, or an object / array rendered as JSON text.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Text {
    String(String),
    Json(Value),
}

/// A System One question (`type` is `choice`, `noul` or `score`).
#[derive(Serialize, Deserialize, ToSchema)]
pub struct SystemOneQuestion {
    /// `choice` | `noul` | `score`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Optional. A `noul` needs it or a `true` / `false` description, except under `--compat vllm`
    /// (vLLM reads a bare noul).
    pub instructions: Option<Text>,
    /// choice: option name → description or null (1..255 options; 1..26 under `--compat vllm`); noul:
    /// optional `true` / `false` descriptions; score: ordered list of 1..10 levels (2..10 under
    /// `--compat vllm`). Any other key in a question is refused.
    pub criteria: Option<Value>,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct SystemOneRequest {
    /// Any name; answered as the served model. `base:adapter` is refused.
    pub model: Option<String>,
    /// A string, or any JSON rendered as text.
    pub state: Value,
    pub instructions: Option<Text>,
    /// Ordered map of question id → question: 1..512 questions (64 under `--compat vllm`). Ids are
    /// non-blank by default, non-empty under `--compat vllm`, anything under `--compat sglang`.
    pub questions: BTreeMap<String, SystemOneQuestion>,
    pub chat_template_kwargs: Option<BTreeMap<String, Value>>,
    pub cache_salt: Option<String>,
    /// Image URLs or data URLs, for models that take images; any other model answers 400 naming the field.
    pub images: Option<Vec<String>>,
    /// Audio URLs or data URLs, for models that take audio; any other model answers 400 naming the field.
    pub audio: Option<Vec<String>>,
    /// Video URLs or data URLs, for models that take video; any other model answers 400 naming the field.
    pub videos: Option<Vec<String>>,
    /// Read several questions together: on block-diffusion models (DiffusionGemma) the questions share
    /// canvases, numbered answer lines on as few even chunks as fit the model's canvas (one question reads
    /// on its own). Models that read each question on their own answer 400 naming `joint`.
    pub joint: Option<bool>,
    /// `"off"` | `"rotate"` | `"prior"`: how the questions are read, overriding the server's
    /// `--debias`. `rotate` reads a choice under cyclic rotations of its options (up to
    /// `--debias-max-orders`), a score under both level orders, a noul under both label orders,
    /// averages each answer's probabilities by name and reports `debias`, `orders` and
    /// `order_sensitivity` (the largest change of the chosen option's probability across the orders
    /// read) with the answer's diagnostics. `prior` (PriDe) reads a choice once and divides out the
    /// label prior its question form has shown in earlier rotated reads (reporting `prior_samples`
    /// instead of `order_sensitivity`), or reads all its rotations while there is none yet. Any
    /// other value is a 4xx naming `x_debias`.
    pub x_debias: Option<String>,
    /// A calibration id (`POST /v1/calibrations` answers it) or `"auto"`: each answer's probabilities
    /// are calibrated (after any debiasing) by the fit of its question's signature, in that fit or
    /// (`auto`) the newest fit of this model and prompt format holding it, and its diagnostics say
    /// `calibration: {id, signature}`, or `{id: null, reason}` when no fit matched. An id this server
    /// does not hold, or a fit of another model or prompt format, is a 400 naming `x_calibration`;
    /// a malformed value a 4xx naming it.
    pub x_calibration: Option<String>,
    /// `--compat sglang`: `/v1/decisions` fields, refused here unless null (422).
    pub temperature: Option<Value>,
    pub prompt_format_version: Option<Value>,
    pub return_prompt_token_ids: Option<Value>,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct SystemOneAnswer {
    #[serde(rename = "type")]
    pub kind: String,
    /// choice: the most probable option.
    pub choice: Option<String>,
    /// noul: P(true).
    pub noul: Option<f64>,
    /// score: Σ i·p_i.
    pub score: Option<f64>,
    pub legend: Option<BTreeMap<String, Value>>,
    /// choice: by option name; score: by level index; noul: `yes` / `no` under `--compat vllm` only.
    pub probabilities: Option<BTreeMap<String, f64>>,
    /// Absent on a noul answer except under `--compat vllm`.
    pub confidence: Option<f64>,
    /// `--compat sglang`: the labels' full-vocabulary probability.
    pub x_label_mass: Option<f64>,
    /// `--compat sglang`, a debiased read: `rotate`, the orders read and the chosen option's largest
    /// change across them (the other profiles put them in their diagnostics).
    pub x_debias: Option<String>,
    pub x_orders: Option<u64>,
    pub x_order_sensitivity: Option<f64>,
    pub x_prior_samples: Option<u64>,
    /// `--compat sglang`, with `x_calibration`: `{id, signature}` or `{id: null, reason}`.
    pub x_calibration: Option<Value>,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct SystemOneUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct SystemOneResponse {
    pub model: String,
    pub answers: BTreeMap<String, SystemOneAnswer>,
    pub usage: SystemOneUsage,
    /// Default profile. Per question: `label_mass` and `argmax_is_label`; for a debiased read also
    /// `debias` (`rotate` or `prior`), `orders` (how many were read) and `order_sensitivity`, or for a
    /// prior-corrected read `prior_samples`; with `x_calibration`, `calibration`: `{id, signature}` or
    /// `{id: null, reason}`.
    pub x_diagnostics: Option<BTreeMap<String, Value>>,
    /// Default profile: prompt tokens read from the prefix cache.
    pub x_cached_tokens: Option<u64>,
    /// `--compat vllm`: `decision-…`.
    pub id: Option<String>,
    /// `--compat vllm`: `structured_decision`.
    pub object: Option<String>,
    /// `--compat vllm`: Unix seconds.
    pub created: Option<u64>,
    /// `--compat vllm`: `x_diagnostics` under vLLM's name.
    pub diagnostics: Option<BTreeMap<String, Value>>,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct ValidationDetail {
    pub loc: Vec<Value>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: String,
}

/// 422 (400 under `--compat vllm`): `detail` is a list of field errors; other errors: `detail` is
/// `{error_type, message}`, the type matching the status the profile gives it (`invalid_request` for a
/// label refusal that `--compat vllm` or `--compat sglang` answers with 400).
#[derive(Serialize, Deserialize, ToSchema)]
pub struct SystemOneError {
    pub detail: Value,
}

/// OpenAI shape: `predicate` | `choice` (2..255 typed values) | `score` (levels with labels).
#[derive(Serialize, Deserialize, ToSchema)]
pub struct OpenAiQuestion {
    #[serde(rename = "type")]
    pub kind: String,
    pub instructions: Value,
    pub name: Option<String>,
    pub choices: Option<Vec<Value>>,
    pub levels: Option<Vec<Value>>,
}

/// SGLang shape: `choice` (2..26 options) | `score` (2..10 levels) | `yes_no`. Text fields are
/// non-blank strings, or JSON objects / arrays rendered as compact JSON; any other key is a 400.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct SglangQuestion {
    /// Non-blank, unique in the request.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub question: Option<Text>,
    /// `{name, description?}`: names non-blank, without control or line-break characters, distinct
    /// after trimming and case folding.
    pub options: Option<Vec<Value>>,
    pub levels: Option<Vec<Text>>,
    pub yes: Option<Text>,
    pub no: Option<Text>,
}

/// `/v1/decisions` takes OpenAI's shape (`model`, `input`, `questions` with `instructions`/`name`/`choices`)
/// or SGLang's (`input`, `questions` with `id`/`question`/`options`, `temperature`, ...), told apart by fields.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct DecisionsRequest {
    pub model: Option<String>,
    /// OpenAI: a string or a list of messages; SGLang: a non-blank string, object or array.
    pub input: Value,
    /// A list of `OpenAiQuestion` or of `SglangQuestion`.
    pub questions: Vec<Value>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub temperature: Option<f64>,
    /// SGLang shape: pins the served wording (1 SGLang's version 1 under `--compat sglang`, 101 vLLM's,
    /// 201 Liquid d1's, 301 DiffusionGemma canvas reads', 401 Clef's joint-schema prompt; `GET /info` names it); another value is a 400.
    pub prompt_format_version: Option<u32>,
    pub return_prompt_token_ids: Option<bool>,
    pub chat_template_kwargs: Option<BTreeMap<String, Value>>,
    /// SGLang shape: read several questions together, as `joint` on `/v1/systemone` (block-diffusion
    /// models only; others answer 400 naming `joint`). The OpenAI shape does not take it.
    pub joint: Option<bool>,
    /// As on `/v1/systemone`, on both shapes; each debiased answer carries `x_debias`, `x_orders` and
    /// `x_order_sensitivity`. Refused as an unknown field by the OpenAI shape under `--compat vllm`
    /// and by the SGLang shape under `--compat sglang`, as those servers refuse it.
    pub x_debias: Option<String>,
    /// As on `/v1/systemone`, on both shapes (refused where `x_debias` is); each answer carries
    /// `x_calibration`: `{id, signature}` or `{id: null, reason}`. A fit calibrates reads at
    /// temperature 1: with a `temperature` other than 1 (SGLang shape) it is a 400 naming it.
    pub x_calibration: Option<String>,
}

/// OpenAI: `{model, answers: [...], usage}`; SGLang: `{object: "decisions", model, prompt_format_version, answers: {...}, usage}`.
/// An SGLang answer has `type`, `probabilities` (by option name, level index, or `yes`/`no`), `choice`
/// or `score`, `label_mass`, and with `return_prompt_token_ids` its `prompt_token_ids` and `label_token_ids`.
/// A debiased answer (`x_debias`, `--debias`; either shape) also has `x_debias`, `x_orders` and
/// `x_order_sensitivity` (a prior-corrected one `x_prior_samples` instead); with `x_calibration`,
/// `x_calibration`: `{id, signature}` or `{id: null, reason}`.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct DecisionsResponse {
    pub model: String,
    pub answers: Value,
    pub usage: Value,
    pub object: Option<String>,
    /// SGLang shape: the wording the answers were read in (see the request field).
    pub prompt_format_version: Option<u32>,
}

/// OpenAI: `{"error": {message, type, param, code}}`; SGLang: `{object: "error", message, type, param, code}`.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct DecisionsError {
    pub error: Option<Value>,
    pub object: Option<String>,
    pub message: Option<String>,
}

/// `/v1/score` (SGLang's scoring route): score the next token after token ids you send, e.g. to replay a
/// decision's `prompt_token_ids` with its `label_token_ids`.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct ScoreRequest {
    /// Token ids put before each item (after it with `item_first`); default empty.
    pub query: Option<Vec<u32>>,
    /// One token id list per item (at least one); each `query` + item must fit the model's context.
    pub items: Vec<Vec<u32>>,
    /// One label token list per item, or one flat list for every item. Each label is one token.
    pub label_token_ids: Value,
    /// Softmax over the labels (divided by `temperature`), as a decision answers; otherwise each
    /// label's full-vocabulary probability. Default false.
    pub apply_softmax: Option<bool>,
    /// Above 0, default 1: divides the label log-probabilities before the softmax.
    pub temperature: Option<f64>,
    /// Adds `token_logprobs`: the labels' full-vocabulary log-probabilities per item.
    pub return_token_logprobs: Option<bool>,
    pub item_first: Option<bool>,
    /// Echoed; the served model's name when omitted.
    pub model: Option<String>,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct ScoreResponse {
    /// `scoring`.
    pub object: String,
    pub model: String,
    /// Per item, one score per label, in the order sent.
    pub scores: Vec<Vec<f64>>,
    /// With `return_token_logprobs`: per item, each label's log-probability.
    pub token_logprobs: Option<Vec<Vec<f64>>>,
    /// `prompt_tokens` (every item's ids), `completion_tokens` 0, `total_tokens`.
    pub usage: Value,
}

#[utoipa::path(post, path = "/v1/score", request_body = ScoreRequest,
    responses((status = 200, body = ScoreResponse), (status = 400, body = DecisionsError),
              (status = 401, body = DecisionsError), (status = 413, body = DecisionsError), (status = 501, body = DecisionsError)))]
fn score() {}

#[utoipa::path(post, path = "/v1/systemone", request_body = SystemOneRequest,
    responses((status = 200, body = SystemOneResponse), (status = 422, body = SystemOneError),
              (status = 400, body = SystemOneError), (status = 401, body = SystemOneError), (status = 413, body = SystemOneError),
              (status = 429, body = SystemOneError), (status = 501, body = SystemOneError), (status = 529, body = SystemOneError)))]
fn systemone() {}

#[utoipa::path(post, path = "/v1/decisions", request_body = DecisionsRequest,
    responses((status = 200, body = DecisionsResponse), (status = 400, body = DecisionsError),
              (status = 401, body = DecisionsError), (status = 413, body = DecisionsError), (status = 429, body = DecisionsError),
              (status = 501, body = DecisionsError)))]
fn decisions() {}

/// One labelled example: a System One request (`state`, `questions`, optional `instructions`,
/// media, ...) and the true answer of each of its questions.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct CalibrationExample {
    pub state: Value,
    pub instructions: Option<Text>,
    pub questions: BTreeMap<String, SystemOneQuestion>,
    /// Question id → a choice's option name, a noul's `true`/`false`, a score's level index. Every
    /// question is answered.
    pub answers: BTreeMap<String, Value>,
}

/// `POST /v1/calibrations`: a calibration set, read as its requests would be and fitted per
/// question signature (kind, labels, wording).
#[derive(Serialize, Deserialize, ToSchema)]
pub struct CalibrationSet {
    /// Non-blank, at most 200 characters.
    pub name: String,
    /// 1..4096 examples; each question signature needs at least 4 answers (at least one is held out).
    pub examples: Vec<CalibrationExample>,
    /// Share of each signature's answers held out to score the fit (0 < f < 1, default 0.3; at least
    /// one held out, one fitted).
    pub holdout_fraction: Option<f64>,
    /// The held-out split's seed (default 0): the same set and seed give the same split.
    pub seed: Option<u64>,
    /// How the examples are read (`off` | `rotate` | `prior`); default the server's `--debias`.
    pub x_debias: Option<String>,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct CalibrationScore {
    /// Top-label expected calibration error, 10 equal-width bins.
    pub ece: f64,
    /// Mean negative log-probability of the true answer.
    pub log_loss: f64,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct CalibrationSignature {
    /// 16 hex digits: the question's kind, labels and wording, hashed (option order does not matter).
    pub signature: String,
    /// `choice` | `noul` | `score`.
    pub kind: String,
    /// A choice's option names sorted; `true`, `false`; a score's level indices.
    pub labels: Vec<String>,
    pub instructions: Option<String>,
    /// What is applied: of `none`, `temperature` and (for a choice or score with at least 30 fitted
    /// answers per label) `temperature+bias`, the one with the lowest held-out log-loss. `none`
    /// (temperature 1) leaves this signature's answers uncalibrated.
    pub method: String,
    /// Calibrated probabilities are `softmax(ln p / temperature + bias)`.
    pub temperature: f64,
    /// Per label (`temperature+bias` only), summing to 0.
    pub biases: Option<BTreeMap<String, f64>>,
    pub n: u64,
    pub n_fit: u64,
    pub n_holdout: u64,
    /// On the held-out answers, uncalibrated.
    pub before: CalibrationScore,
    /// On the held-out answers, with what is applied.
    pub after: CalibrationScore,
    /// When a richer fit was not kept: what it scored held out.
    pub reason: Option<String>,
}

/// A stored fit, with what it was fitted on: a fit applies only where the model (fingerprint) and
/// the prompt format are this server's.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Calibration {
    /// `cal-…`.
    pub id: String,
    pub name: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// First 16 hex digits of SHA-256 over the architecture, vocabulary size and `config.json`.
    pub model_fingerprint: String,
    /// `{name, version}`, as `GET /info` reports it.
    pub prompt_format: Value,
    /// How the examples were read.
    pub debias: String,
    pub seed: u64,
    pub holdout_fraction: f64,
    /// Answers in the set, fitted, held out.
    pub n: u64,
    pub n_fit: u64,
    pub n_holdout: u64,
    pub signatures: Vec<CalibrationSignature>,
}

/// `GET /v1/calibrations`: every fit, oldest first, without `signatures` (counted in `n_signatures`).
#[derive(Serialize, Deserialize, ToSchema)]
pub struct CalibrationList {
    pub calibrations: Vec<Value>,
}

/// `GET /v1/calibrations/{id}/export`, and what `POST /v1/calibrations/import` takes.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct CalibrationDocument {
    /// `decision-inference.calibration`.
    pub kind: String,
    /// 1.
    pub version: u32,
    pub calibration: Calibration,
}

#[utoipa::path(post, path = "/v1/calibrations", request_body = CalibrationSet,
    responses((status = 201, body = Calibration, description = "read, fitted and stored (under --data-dir; in memory without it)"),
              (status = 422, body = SystemOneError, description = "a field of the set, named"), (status = 401, body = SystemOneError),
              (status = 413, body = SystemOneError), (status = 501, body = SystemOneError)))]
fn calibrations_create() {}

#[utoipa::path(get, path = "/v1/calibrations", responses((status = 200, body = CalibrationList)))]
fn calibrations_list() {}

#[utoipa::path(get, path = "/v1/calibrations/{id}", params(("id" = String, Path)),
    responses((status = 200, body = Calibration), (status = 404, body = SystemOneError)))]
fn calibrations_get() {}

#[utoipa::path(delete, path = "/v1/calibrations/{id}", params(("id" = String, Path)),
    responses((status = 204, description = "deleted"), (status = 404, body = SystemOneError)))]
fn calibrations_delete() {}

#[utoipa::path(get, path = "/v1/calibrations/{id}/export", params(("id" = String, Path)),
    responses((status = 200, body = CalibrationDocument), (status = 404, body = SystemOneError)))]
fn calibrations_export() {}

#[utoipa::path(post, path = "/v1/calibrations/import", request_body = CalibrationDocument,
    responses((status = 201, body = Calibration, description = "stored under its own id"),
              (status = 200, body = Calibration, description = "the same document was stored already"),
              (status = 409, body = SystemOneError, description = "another fit holds the id"),
              (status = 422, body = SystemOneError, description = "a field of the document, named")))]
fn calibrations_import() {}

#[utoipa::path(get, path = "/v1/models", responses((status = 200, description = "TypeSafe's model list, with an OpenAI-style `data` list")))]
fn models() {}

#[utoipa::path(get, path = "/health", responses((status = 200, description = "liveness: every shard answered a Health RPC (draining or not)"), (status = 503, description = "a shard did not")))]
fn health() {}

#[utoipa::path(get, path = "/ready", responses((status = 200, description = "readiness: the model is served, not draining, the queue under its high-water mark, the shards answer"), (status = 503, description = "not ready: every reason listed, with Retry-After")))]
fn ready() {}

#[utoipa::path(get, path = "/info", responses((status = 200, description = "model, dtype, shards, read mode, limits, version")))]
fn info() {}

#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format")))]
fn metrics() {}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "decision-inference",
        description = "Language models as decision models: a probability for every allowed option."
    ),
    paths(systemone, decisions, score, calibrations_create, calibrations_list, calibrations_get,
          calibrations_delete, calibrations_export, calibrations_import, models, health, ready, info, metrics),
    modifiers(&Examples),
    components(schemas(
        Text,
        SystemOneQuestion,
        SystemOneRequest,
        SystemOneAnswer,
        SystemOneUsage,
        SystemOneResponse,
        ValidationDetail,
        SystemOneError,
        OpenAiQuestion,
        SglangQuestion,
        DecisionsRequest,
        DecisionsResponse,
        DecisionsError,
        ScoreRequest,
        ScoreResponse,
        CalibrationExample,
        CalibrationSet,
        CalibrationScore,
        CalibrationSignature,
        Calibration,
        CalibrationList,
        CalibrationDocument
    ))
)]
pub struct ApiDoc;

/// The document as pretty JSON, with the crate version (what `decision-router --print-openapi` prints).
pub fn openapi_json() -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.to_pretty_json().unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    #[test]
    fn checked_in_document_matches_the_code() {
        let checked_in = include_str!("../../../docs/openapi.json");
        assert!(
            checked_in == super::openapi_json(),
            "docs/openapi.json drifted from the code: run `.venv/bin/decision-router --print-openapi > docs/openapi.json`"
        );
    }
}
