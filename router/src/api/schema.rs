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
    /// prior-corrected read `prior_samples`.
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
}

/// OpenAI: `{model, answers: [...], usage}`; SGLang: `{object: "decisions", model, prompt_format_version, answers: {...}, usage}`.
/// An SGLang answer has `type`, `probabilities` (by option name, level index, or `yes`/`no`), `choice`
/// or `score`, `label_mass`, and with `return_prompt_token_ids` its `prompt_token_ids` and `label_token_ids`.
/// A debiased answer (`x_debias`, `--debias`; either shape) also has `x_debias`, `x_orders` and
/// `x_order_sensitivity` (a prior-corrected one `x_prior_samples` instead).
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
    paths(systemone, decisions, score, models, health, ready, info, metrics),
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
        ScoreResponse
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
