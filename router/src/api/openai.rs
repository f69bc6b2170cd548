//! `POST /v1/decisions` in OpenAI's shape (spec/API.md §2), read through vLLM's adapter
//! (spec/PROMPTS.md §1): every question becomes a lettered choice; answers come back typed.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::fields::{self, field_error as err};
use crate::error::{DecisionError, FieldError, Loc};
use crate::ir::{ChoiceOption, Decision, DecisionRequest, Question, QuestionKind, Reading};
use crate::json_text::{self, Separators};
use crate::limits::Limits;
use crate::probability;
use crate::profile::Compat;
use crate::question_kind::Kind;

const TOP_LEVEL: [&str; 8] = [
    "model",
    "input",
    "questions",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_options",
    "chat_template_kwargs",
    "metadata",
];

/// What the response needs to echo that the IR does not carry: each question's type, name and typed values.
#[derive(Clone, Debug, PartialEq)]
pub enum Echo {
    Predicate {
        name: Option<String>,
    },
    Choice {
        name: Option<String>,
        values: Vec<Value>,
    },
    Score {
        name: Option<String>,
        labels: Vec<String>,
    },
}

pub struct Parsed {
    /// Shared with the decider while it reads.
    pub request: Arc<DecisionRequest>,
    pub echo: Vec<Echo>,
}

#[cfg(test)]
fn loc(path: &[Loc]) -> Vec<Loc> {
    fields::body_loc(path)
}

pub fn parse(body: &Value, limits: &Limits, compat: Compat) -> Result<Parsed, DecisionError> {
    let limits = &compat.limits(crate::profile::Shape::OpenAi, limits);
    let obj = fields::body_object(body, "type_error")?;
    let mut errors = Vec::new();
    // `x_debias` is this server's extension: vLLM's profile refuses it as upstream refuses any
    // field it does not know.
    let extensions: &[&str] = if compat == Compat::Vllm {
        &[]
    } else {
        &fields::EXTENSIONS
    };
    let allowed: Vec<&str> = TOP_LEVEL.iter().chain(extensions).copied().collect();
    fields::unknown_keys(
        obj,
        &allowed,
        &[],
        "unknown_parameter",
        |key| format!("Unrecognized request argument supplied: {key}"),
        &mut errors,
    );
    match obj.get("model") {
        Some(Value::String(name)) => fields::check_model_name(name)?,
        None => errors.push(err(&["model".into()], "missing", "model is required")),
        Some(_) => errors.push(err(
            &["model".into()],
            "invalid_type",
            "model must be a string",
        )),
    }
    for key in ["safety_identifier", "prompt_cache_key"] {
        if let Some(v) = obj.get(key) {
            if !v.is_string() && !v.is_null() {
                errors.push(err(
                    &[key.into()],
                    "invalid_type",
                    format!("{key} must be a string"),
                ));
            }
        }
    }
    let mut images = Vec::new();
    let mut image_parts = Vec::new();
    let state = match obj.get("input") {
        None => {
            errors.push(err(&["input".into()], "missing", "input is required"));
            String::new()
        }
        Some(v) => input_text(v, compat, &mut images, &mut image_parts, &mut errors),
    };
    let chat_template_kwargs = fields::template_kwargs(obj, "invalid_type", &mut errors);
    let debias = if extensions.is_empty() {
        None
    } else {
        fields::debias(obj, "invalid_value", &mut errors)
    };
    let calibration = if extensions.is_empty() {
        None
    } else {
        fields::calibration(obj, "invalid_value", &mut errors)
    };
    let max_choices = limits.max_choices;
    let mut questions = Vec::new();
    let mut echo = Vec::new();
    for (i, item) in fields::question_items(obj, limits, "invalid_type", &mut errors)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some((q, e)) = parse_question(i, item, limits, max_choices, &mut errors) {
            questions.push(q);
            echo.push(e);
        }
    }
    if !errors.is_empty() {
        return Err(DecisionError::Invalid(errors));
    }
    let cache_salt = obj
        .get("prompt_cache_key")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let request = DecisionRequest {
        state: Value::String(state),
        instructions: None,
        questions,
        chat_template_kwargs,
        cache_salt,
        // `input_image` parts, in order; like System One's `images`, read before the state.
        media: crate::ir::Media {
            images,
            image_parts,
            ..Default::default()
        },
        joint: false,
        debias,
        calibration,
    };
    Ok(Parsed {
        request: Arc::new(request),
        echo,
    })
}

/// The adapter's state text: a string as is; messages joined by a blank line, parts by a newline.
/// `input_image` parts (`image_url`: a URL or data URL) are collected into `images`, in order, and
/// their `(message, part)` places into `image_parts` (media errors name `input[i].content[j]`).
fn input_text(
    input: &Value,
    compat: Compat,
    images: &mut Vec<String>,
    image_parts: &mut Vec<(usize, usize)>,
    errors: &mut Vec<FieldError>,
) -> String {
    match input {
        Value::String(s) => s.clone(),
        Value::Array(messages) if !messages.is_empty() => {
            let mut texts = Vec::with_capacity(messages.len());
            for (i, message) in messages.iter().enumerate() {
                let at = [Loc::from("input"), Loc::Index(i)];
                let Some(m) = message.as_object() else {
                    errors.push(err(
                        &at,
                        "invalid_type",
                        "each input item must be a message object",
                    ));
                    continue;
                };
                match m.get("type").and_then(Value::as_str) {
                    None | Some("message") => {}
                    Some(other) => {
                        errors.push(err(
                            &at,
                            "unsupported_value",
                            format!(
                                "input items of type '{other}' are not supported; send messages"
                            ),
                        ));
                        continue;
                    }
                }
                match m.get("role").and_then(Value::as_str) {
                    Some("user") => {}
                    // vLLM (seed 000): "input accepts a string or an array of user messages"; other
                    // roles are outside its MVP. The default profile joins them like the adapter.
                    Some("system" | "developer" | "assistant")
                        if !compat.openai_input_is_user_text_only() => {}
                    Some(role) if compat.openai_input_is_user_text_only() => errors.push(err(
                        &[at[0].clone(), at[1].clone(), "role".into()],
                        "invalid_value",
                        format!("input[{i}]: only user messages are accepted under --compat vllm, got role '{role}'"),
                    )),
                    _ => errors.push(err(
                        &[at[0].clone(), at[1].clone(), "role".into()],
                        "invalid_value",
                        "role must be user, system, developer or assistant",
                    )),
                }
                match m.get("content") {
                    Some(Value::String(s)) => texts.push(s.clone()),
                    Some(Value::Array(parts)) => {
                        let mut part_texts = Vec::with_capacity(parts.len());
                        for (j, part) in parts.iter().enumerate() {
                            let ploc = [
                                at[0].clone(),
                                at[1].clone(),
                                "content".into(),
                                Loc::Index(j),
                            ];
                            match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                                (Some("input_text" | "output_text" | "text"), Some(t)) => part_texts.push(t.to_owned()),
                                (Some("input_json" | "json"), _) => match part.get("json") {
                                    Some(j) => part_texts.push(json_text::dumps(j, Separators::Default)),
                                    None => errors.push(err(&ploc, "missing", "a json part needs 'json'")),
                                },
                                // vLLM (seed 000): "Image inputs ... are outside this MVP", "a string or an
                                // array of user messages with string content or input_text parts".
                                (Some("input_image"), _) if compat.openai_input_is_user_text_only() => errors.push(err(&ploc, "unsupported_value", "input_image parts are outside vLLM's text-only /v1/decisions (--compat vllm); send images to /v1/systemone's `images` on a model that takes them")),
                                (Some("input_image"), _) => match part.get("image_url") {
                                    Some(Value::String(url)) if !url.is_empty() => {
                                        images.push(url.clone());
                                        image_parts.push((i, j));
                                    }
                                    _ => errors.push(err(&ploc, "invalid_value", "an input_image part needs an image_url (a URL or data URL); file_id is not supported")),
                                },
                                (Some("image"), _) => {
                                    errors.push(err(&ploc, "unsupported_value", "image parts must be {\"type\": \"input_image\", \"image_url\": ...}"))
                                }
                                _ => errors.push(err(&ploc, "invalid_value", "a content part must be {\"type\": \"input_text\", \"text\": ...}")),
                            }
                        }
                        texts.push(part_texts.join("\n"));
                    }
                    _ => errors.push(err(
                        &[at[0].clone(), at[1].clone(), "content".into()],
                        "invalid_type",
                        "content must be a string or a list of parts",
                    )),
                }
            }
            texts.join("\n\n")
        }
        Value::Array(_) => {
            errors.push(err(
                &["input".into()],
                "too_short",
                "input must hold at least one message",
            ));
            String::new()
        }
        _ => {
            errors.push(err(
                &["input".into()],
                "invalid_type",
                "input must be a string or a list of messages",
            ));
            String::new()
        }
    }
}

fn instructions_text(
    value: Option<&Value>,
    at: &[Loc],
    errors: &mut Vec<FieldError>,
) -> Option<String> {
    let mut path = at.to_vec();
    path.push("instructions".into());
    match value {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
        Some(Value::Array(parts)) if !parts.is_empty() => {
            let mut texts = Vec::new();
            for part in parts {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "text"), Some(t)) => texts.push(t.to_owned()),
                    _ => {
                        errors.push(err(
                            &path,
                            "unsupported_value",
                            "instructions parts must be input_text parts",
                        ));
                        return None;
                    }
                }
            }
            Some(texts.join("\n"))
        }
        None => {
            errors.push(err(&path, "missing", "instructions is required"));
            None
        }
        Some(_) => {
            errors.push(err(
                &path,
                "invalid_value",
                "instructions must be a non-empty string or a list of input_text parts",
            ));
            None
        }
    }
}

fn parse_question(
    i: usize,
    item: &Value,
    limits: &Limits,
    max_choices: usize,
    errors: &mut Vec<FieldError>,
) -> Option<(Question, Echo)> {
    let at = [Loc::from("questions"), Loc::Index(i)];
    let sub = |k: &str| [at[0].clone(), at[1].clone(), Loc::from(k)];
    let Some(obj) = item.as_object() else {
        errors.push(err(&at, "invalid_type", "a question must be an object"));
        return None;
    };
    let before = errors.len();
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let allowed: &[&str] = match kind {
        "predicate" => &["type", "instructions", "name"],
        "choice" => &["type", "instructions", "name", "choices"],
        "score" => &["type", "instructions", "name", "levels"],
        _ => {
            errors.push(err(
                &sub("type"),
                "invalid_value",
                "type must be 'predicate', 'choice' or 'score'",
            ));
            return None;
        }
    };
    fields::unknown_keys(
        obj,
        allowed,
        &at,
        "unknown_parameter",
        |key| format!("unknown field '{key}' for a {kind} question"),
        errors,
    );
    let name = match obj.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            errors.push(err(&sub("name"), "invalid_type", "name must be a string"));
            None
        }
    };
    let instructions = instructions_text(obj.get("instructions"), &at, errors);
    let (options, echo) = match kind {
        "predicate" => predicate(name.clone()),
        "choice" => parse_choices(obj, &at, max_choices, name.clone(), errors)?,
        _ => parse_levels(obj, &at, limits, name.clone(), errors)?,
    };
    if errors.len() > before {
        return None;
    }
    let id = name.unwrap_or_else(|| format!("questions[{i}]"));
    Some((
        Question {
            id,
            instructions,
            kind: QuestionKind::Choice { options },
        },
        echo,
    ))
}

/// vLLM's adapter reads a predicate as the choice between `false` and `true`.
fn predicate(name: Option<String>) -> (Vec<ChoiceOption>, Echo) {
    let option = |name: &str| ChoiceOption {
        name: name.into(),
        description: None,
    };
    (
        vec![option("false"), option("true")],
        Echo::Predicate { name },
    )
}

/// A choice question's `choices`: each a string or boolean `value`, named by its JSON.
fn parse_choices(
    obj: &Map<String, Value>,
    at: &[Loc; 2],
    max_choices: usize,
    name: Option<String>,
    errors: &mut Vec<FieldError>,
) -> Option<(Vec<ChoiceOption>, Echo)> {
    let sub = |k: &str| [at[0].clone(), at[1].clone(), Loc::from(k)];
    let Some(items) = obj.get("choices").and_then(Value::as_array) else {
        errors.push(err(
            &sub("choices"),
            "missing",
            "a choice question needs a list of choices",
        ));
        return None;
    };
    if items.len() < 2 || items.len() > max_choices {
        errors.push(err(
            &sub("choices"),
            "invalid_length",
            format!(
                "provide between 2 and {max_choices} choices, got {}",
                items.len()
            ),
        ));
        return None;
    }
    let mut options = Vec::new();
    let mut values: Vec<Value> = Vec::new();
    for (j, choice) in items.iter().enumerate() {
        let cloc = [
            at[0].clone(),
            at[1].clone(),
            "choices".into(),
            Loc::Index(j),
        ];
        let value = choice.get("value");
        match value {
            Some(v @ (Value::String(_) | Value::Bool(_))) => {
                if values.contains(v) {
                    errors.push(err(
                        &cloc,
                        "duplicate_value",
                        format!("choice {v} appears twice; each choice must be unique"),
                    ));
                }
                values.push(v.clone());
                // vLLM's adapter names an option by the JSON of its value: strings quoted, booleans bare.
                options.push(ChoiceOption {
                    name: json_text::dumps(v, Separators::Default),
                    description: description(choice, &cloc, errors),
                });
            }
            _ => errors.push(err(
                &cloc,
                "invalid_type",
                "each choice needs a 'value' that is a string or a boolean",
            )),
        }
        if let Some(fields) = choice.as_object() {
            fields::unknown_keys(
                fields,
                &["value", "description"],
                &cloc,
                "unknown_parameter",
                |key| format!("unknown field '{key}' in a choice"),
                errors,
            );
        }
    }
    Some((options, Echo::Choice { name, values }))
}

/// A score question's `levels`: each a non-blank `label`, worth its position.
fn parse_levels(
    obj: &Map<String, Value>,
    at: &[Loc; 2],
    limits: &Limits,
    name: Option<String>,
    errors: &mut Vec<FieldError>,
) -> Option<(Vec<ChoiceOption>, Echo)> {
    let sub = |k: &str| [at[0].clone(), at[1].clone(), Loc::from(k)];
    let Some(items) = obj.get("levels").and_then(Value::as_array) else {
        errors.push(err(
            &sub("levels"),
            "missing",
            "a score question needs a list of levels",
        ));
        return None;
    };
    if items.len() < 2 || items.len() > limits.max_levels {
        errors.push(err(
            &sub("levels"),
            "invalid_length",
            format!(
                "provide between 2 and {} levels, got {}",
                limits.max_levels,
                items.len()
            ),
        ));
        return None;
    }
    let mut options = Vec::new();
    let mut labels = Vec::new();
    for (j, level) in items.iter().enumerate() {
        let lloc = [at[0].clone(), at[1].clone(), "levels".into(), Loc::Index(j)];
        match level.get("label") {
            Some(Value::String(label)) if !label.trim().is_empty() => {
                labels.push(label.clone());
                options.push(ChoiceOption {
                    name: label.clone(),
                    description: description(level, &lloc, errors),
                });
            }
            _ => errors.push(err(
                &lloc,
                "invalid_value",
                "each level needs a non-empty string 'label'",
            )),
        }
        if let Some(fields) = level.as_object() {
            fields::unknown_keys(
                fields,
                &["label", "description"],
                &lloc,
                "unknown_parameter",
                |key| format!("unknown field '{key}' in a level"),
                errors,
            );
        }
    }
    Some((options, Echo::Score { name, labels }))
}

fn description(item: &Value, at: &[Loc], errors: &mut Vec<FieldError>) -> Option<String> {
    match item.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            let mut path = at.to_vec();
            path.push("description".into());
            errors.push(err(&path, "invalid_type", "description must be a string"));
            None
        }
    }
}

pub fn format(parsed: &Parsed, decision: &Decision, model: &str, compat: Compat) -> Value {
    let answers: Vec<Value> = parsed
        .echo
        .iter()
        .zip(&parsed.request.questions)
        .zip(&decision.answers)
        .enumerate()
        .map(|(i, ((echo, question), answer))| {
            let p = &answer.probabilities;
            // Every question here is a lettered choice (`parse`): a predicate over [false, true], a
            // score over its levels, whose answer is still the expected level and whose confidence is
            // the score's (`question_kind.rs`).
            let Reading::Choice { chosen, .. } = question.kind.reading(p) else {
                unreachable!("OpenAI's questions are all lettered choices")
            };
            let mut value = match echo {
                Echo::Predicate { name } => json!({"type": "predicate", "name": name, "probability": p[1]}),
                Echo::Choice { name, values } => json!({
                    "type": "choice",
                    "name": name,
                    "choice": values[chosen],
                    "probabilities": values.iter().zip(p).map(|(v, pi)| json!({"value": v, "probability": pi})).collect::<Vec<_>>(),
                    "confidence": compat.confidence(Kind::Choice, answer),
                }),
                Echo::Score { name, labels } => json!({
                    "type": "score",
                    "name": name,
                    "score": probability::expected_score(p),
                    "probabilities": labels.iter().zip(p).enumerate()
                        .map(|(i, (label, pi))| json!({"value": i, "label": label, "probability": pi})).collect::<Vec<_>>(),
                    "confidence": compat.confidence(Kind::Score, answer),
                }),
            };
            // A debiased read reports what it used on the answer (the shape has no diagnostics).
            if let (Some(r), Some(obj)) = (
                decision.orders.as_ref().and_then(|r| r.get(i)),
                value.as_object_mut(),
            ) {
                obj.extend(r.fields("x_"));
            }
            if let (Some(c), Some(obj)) = (
                decision.calibration.as_ref().and_then(|c| c.get(i)),
                value.as_object_mut(),
            ) {
                let (key, field) = c.field("x_");
                obj.insert(key, field);
            }
            value
        })
        .collect();
    let usage = compat.usage(&decision.usage, parsed.echo.len());
    json!({
        "model": model,
        "answers": answers,
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    })
}

/// OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`.
pub fn error_body(error: &DecisionError) -> Value {
    let (kind, code, param) = match error {
        DecisionError::Invalid(fields) => (
            "invalid_request_error",
            fields.first().map(|f| f.kind),
            fields.first().map(FieldError::param),
        ),
        DecisionError::BadRequest { param, .. } => (
            "invalid_request_error",
            Some("invalid_value"),
            param.clone(),
        ),
        DecisionError::ThinkingOn => (
            "invalid_request_error",
            Some("invalid_value"),
            Some("chat_template_kwargs".into()),
        ),
        DecisionError::Unauthorized => ("invalid_request_error", Some("invalid_api_key"), None),
        DecisionError::BodyTooLarge { .. } => {
            ("invalid_request_error", Some("request_too_large"), None)
        }
        DecisionError::MediaTooLarge { param, .. } => (
            "invalid_request_error",
            Some("request_too_large"),
            Some(param.clone()),
        ),
        DecisionError::TokensExceeded { .. } | DecisionError::PromptTooLong { .. } => (
            "invalid_request_error",
            Some("context_length_exceeded"),
            Some("input".into()),
        ),
        DecisionError::Overloaded { .. } | DecisionError::Backlogged { .. } => {
            ("rate_limit_error", Some("rate_limit_exceeded"), None)
        }
        DecisionError::Timeout { .. } => ("server_error", Some("timeout"), None),
        DecisionError::BodyTooSlow { .. } => ("invalid_request_error", Some("timeout"), None),
        DecisionError::NotServable(_) => (
            "invalid_request_error",
            Some("model_not_supported"),
            Some("model".into()),
        ),
        DecisionError::Unlabelable(_) => (
            "invalid_request_error",
            Some("unsupported_labels"),
            Some("questions".into()),
        ),
        _ => ("server_error", None, None),
    };
    json!({"error": {"message": error.to_string(), "type": kind, "param": param, "code": code}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Answer, Usage};

    fn parse_ok(body: Value) -> Parsed {
        parse(&body, &Limits::default(), Compat::Typesafe).unwrap()
    }

    fn invalid(body: Value) -> Vec<FieldError> {
        match parse(&body, &Limits::default(), Compat::Typesafe) {
            Err(DecisionError::Invalid(f)) => f,
            other => panic!("expected invalid, got {:?}", other.map(|p| p.echo)),
        }
    }

    /// An image error names the content part the image came from, not `images.N` (a field this
    /// shape does not have), in the message and in `param`; the shard's errors get the same name.
    #[tokio::test]
    async fn image_errors_name_the_input_part() {
        use crate::media::{self, Fetcher, MediaPolicy};
        let p = parse_ok(
            json!({"model": "m", "questions": [{"type": "predicate", "instructions": "i"}],
            "input": [{"role": "user", "content": "first"}, {"role": "user", "content": [
                {"type": "input_text", "text": "the parcel"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}),
        );
        assert_eq!(p.request.media.image_parts, vec![(1, 1), (1, 2)]);
        let policy = MediaPolicy::default();
        let error = media::resolve(&p.request.media, &policy, &Fetcher::new(&policy).unwrap())
            .await
            .unwrap_err();
        let body = error_body(&error);
        assert_eq!(body["error"]["param"], json!("input[1].content[1]"));
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("input[1].content[1]: "), "{message}");
        assert!(!message.contains("images."), "{message}");
    }

    /// The seed's MVP refuses image parts; we read them as the request's images, before the state.
    #[test]
    fn input_image_parts_are_the_requests_images_in_order() {
        let p = parse_ok(
            json!({"model": "m", "questions": [{"type": "predicate", "instructions": "Damaged?"}], "input": [
            {"role": "user", "content": [
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                {"type": "input_text", "text": "the parcel"},
                {"type": "input_image", "image_url": "https://img.example/b.jpg", "detail": "auto"}]}]}),
        );
        assert_eq!(
            p.request.media.images,
            vec!["data:image/png;base64,AAAA", "https://img.example/b.jpg"]
        );
        assert_eq!(p.request.state, json!("the parcel"));
        for part in [
            json!({"type": "input_image", "file_id": "file-1"}),
            json!({"type": "input_image", "image_url": ""}),
            json!({"type": "image", "image_url": "https://img.example/b.jpg"}),
        ] {
            let errors = invalid(
                json!({"model": "m", "questions": [{"type": "predicate", "instructions": "i"}],
                "input": [{"role": "user", "content": [part]}]}),
            );
            assert_eq!(errors[0].param(), "input.0.content.0", "{errors:?}");
        }
    }

    /// Unknown keys in a choice or a level are each named at their own path, as in the other shapes
    /// (they were reported once, at the choice, naming only the first).
    #[test]
    fn every_unknown_key_of_a_choice_or_level_is_named() {
        let errors = invalid(json!({"model": "m", "input": "x", "questions": [
            {"type": "choice", "instructions": "i", "choices": [{"value": "a", "colour": 1, "size": 2}, {"value": "b"}]},
            {"type": "score", "instructions": "i", "levels": [{"label": "a"}, {"label": "b", "weight": 3}]}]}));
        let params: Vec<String> = errors.iter().map(FieldError::param).collect();
        assert_eq!(
            params,
            [
                "questions.0.choices.0.colour",
                "questions.0.choices.0.size",
                "questions.1.levels.1.weight"
            ]
        );
    }

    /// Seed 000: "Image inputs ... are outside this MVP"; `--compat vllm` refuses them, naming the part.
    #[test]
    fn vllm_profile_refuses_input_image_parts() {
        let body = json!({"model": "m", "questions": [{"type": "predicate", "instructions": "i"}],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "t"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]});
        assert!(parse(&body, &Limits::default(), Compat::Typesafe).is_ok());
        match parse(&body, &Limits::default(), Compat::Vllm) {
            Err(DecisionError::Invalid(f)) => {
                assert_eq!(f[0].param(), "input.0.content.1");
                assert!(
                    f[0].msg.contains("outside vLLM's text-only"),
                    "{}",
                    f[0].msg
                );
            }
            other => panic!("{:?}", other.map(|p| p.echo)),
        }
    }

    #[test]
    fn adapter_turns_every_question_into_a_lettered_choice() {
        let p = parse_ok(json!({
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "part 1"}, {"type": "input_text", "text": "part 2"}]},
                      {"role": "user", "content": "second"}],
            "questions": [
                {"type": "predicate", "instructions": "Is it urgent?", "name": "urgent"},
                {"type": "choice", "instructions": "Which?", "choices": [{"value": "true"}, {"value": true, "description": "the boolean"}]},
                {"type": "score", "instructions": "How bad?", "levels": [{"label": "low", "description": "fine"}, {"label": "high"}]}
            ]
        }));
        assert_eq!(p.request.state, json!("part 1\npart 2\n\nsecond"));
        let names = |q: &Question| match &q.kind {
            QuestionKind::Choice { options } => options
                .iter()
                .map(|o| (o.name.clone(), o.description.clone()))
                .collect::<Vec<_>>(),
            _ => panic!("not a choice"),
        };
        assert_eq!(
            names(&p.request.questions[0]),
            vec![("false".into(), None), ("true".into(), None)]
        );
        assert_eq!(
            names(&p.request.questions[1]),
            vec![
                ("\"true\"".into(), None),
                ("true".into(), Some("the boolean".into()))
            ]
        );
        assert_eq!(
            names(&p.request.questions[2]),
            vec![("low".into(), Some("fine".into())), ("high".into(), None)]
        );
        assert_eq!(
            p.echo[1],
            Echo::Choice {
                name: None,
                values: vec![json!("true"), json!(true)]
            }
        );
        let text = crate::prompt::wording::Wording::Vllm.user_message("S", &p.request.questions[2]);
        assert_eq!(text, "S\n\nQuestion: How bad?\nA: low - fine\nB: high\nAnswer with the letter of one option only.");
    }

    #[test]
    fn typed_values_are_distinct_but_duplicates_are_refused() {
        let dup = invalid(
            json!({"model": "m", "input": "x", "questions": [{"type": "choice", "instructions": "i", "choices": [{"value": "a"}, {"value": "a"}]}]}),
        );
        assert_eq!(dup[0].param(), "questions.0.choices.1");
    }

    #[test]
    fn refusals_name_the_field() {
        let q = |question: Value| json!({"model": "m", "input": "x", "questions": [question]});
        let cases = vec![
            (
                json!({"input": "x", "questions": [{"type": "predicate", "instructions": "i"}]}),
                "model",
            ),
            (
                json!({"model": "m", "questions": [{"type": "predicate", "instructions": "i"}]}),
                "input",
            ),
            (
                json!({"model": "m", "input": "x", "questions": []}),
                "questions",
            ),
            (
                json!({"model": "m", "input": "x", "questions": [], "temperature": 1}),
                "temperature",
            ),
            (
                json!({"model": "m", "input": 5, "questions": [{"type": "predicate", "instructions": "i"}]}),
                "input",
            ),
            (q(json!({"type": "predicate"})), "questions.0.instructions"),
            (
                q(json!({"type": "predicate", "instructions": "i", "extra": 1})),
                "questions.0.extra",
            ),
            (
                q(json!({"type": "choice", "instructions": "i", "choices": [{"value": "a"}]})),
                "questions.0.choices",
            ),
            (
                q(
                    json!({"type": "choice", "instructions": "i", "choices": [{"value": 1}, {"value": "b"}]}),
                ),
                "questions.0.choices.0",
            ),
            (
                q(json!({"type": "score", "instructions": "i", "levels": [{"label": "a"}]})),
                "questions.0.levels",
            ),
            (
                q(
                    json!({"type": "score", "instructions": "i", "levels": [{"label": ""}, {"label": "b"}]}),
                ),
                "questions.0.levels.0",
            ),
            (
                q(json!({"type": "rank", "instructions": "i"})),
                "questions.0.type",
            ),
        ];
        for (body, field) in cases {
            let fields = invalid(body.clone());
            assert!(
                fields.iter().any(|f| f.param() == field),
                "{body}: {:?}",
                fields.iter().map(FieldError::param).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn formats_typed_answers_and_full_usage() {
        let p = parse_ok(json!({"model": "m", "input": "x", "questions": [
            {"type": "predicate", "instructions": "i", "name": "p"},
            {"type": "choice", "instructions": "i", "choices": [{"value": "true"}, {"value": true}]},
            {"type": "score", "instructions": "i", "levels": [{"label": "lo"}, {"label": "hi"}]}]}));
        let a = |p: Vec<f64>| Answer {
            label_logprobs: vec![],
            probabilities: p,
            label_mass: 1.0,
            argmax_is_label: true,
            pooled: false,
        };
        let d = Decision {
            answers: vec![a(vec![0.3, 0.7]), a(vec![0.2, 0.8]), a(vec![0.25, 0.75])],
            usage: Usage {
                input_tokens: 10,
                cached_tokens: 4,
                per_question_prompt_tokens: 30,
                pooled: false,
            },
            calibration: None,
            orders: None,
        };
        let out = format(&p, &d, "served", Compat::Typesafe);
        assert_eq!(
            out["answers"][0],
            json!({"type": "predicate", "name": "p", "probability": 0.7})
        );
        assert_eq!(out["answers"][1]["choice"], json!(true));
        assert_eq!(out["answers"][1]["name"], Value::Null);
        assert_eq!(
            out["answers"][1]["probabilities"][0],
            json!({"value": "true", "probability": 0.2})
        );
        assert_eq!(
            out["answers"][2]["probabilities"][1],
            json!({"value": 1, "label": "hi", "probability": 0.75})
        );
        assert_eq!(out["answers"][2]["score"], json!(0.75));
        assert_eq!(
            out["usage"]["input_tokens_details"],
            json!({"cached_tokens": 4, "cache_write_tokens": 0})
        );
        assert_eq!(out["usage"]["total_tokens"], json!(10));
        assert_eq!(out["model"], "served");
    }

    #[test]
    fn x_debias_is_an_extension_the_vllm_profile_refuses() {
        use crate::debias::Debias;
        let body = |v: Value| json!({"model": "m", "input": "x", "x_debias": v, "questions": [{"type": "predicate", "instructions": "i"}]});
        assert_eq!(
            parse_ok(body(json!("rotate"))).request.debias,
            Some(Debias::Rotate)
        );
        assert_eq!(
            parse_ok(body(json!("off"))).request.debias,
            Some(Debias::Off)
        );
        assert_eq!(parse_ok(body(Value::Null)).request.debias, None);
        let errors = invalid(body(json!("all")));
        assert_eq!(
            (errors[0].param(), errors[0].kind),
            ("x_debias".to_owned(), "invalid_value")
        );
        let error = error_body(&DecisionError::Invalid(errors));
        assert_eq!(error["error"]["param"], json!("x_debias"));
        // vLLM's OpenAI shape refuses any field it does not know, this one too.
        let Err(DecisionError::Invalid(errors)) =
            parse(&body(json!("rotate")), &Limits::default(), Compat::Vllm)
        else {
            panic!("--compat vllm refuses x_debias")
        };
        assert_eq!(
            (errors[0].param(), errors[0].msg.as_str()),
            (
                "x_debias".to_owned(),
                "Unrecognized request argument supplied: x_debias"
            )
        );
    }

    #[test]
    fn a_debiased_answer_carries_its_orders() {
        use crate::debias::{Debias, OrderReport};
        let p = parse_ok(json!({"model": "m", "input": "x", "questions": [
            {"type": "predicate", "instructions": "i", "name": "p"}]}));
        let d = Decision {
            answers: vec![Answer {
                label_logprobs: vec![],
                probabilities: vec![0.4, 0.6],
                label_mass: 1.0,
                argmax_is_label: true,
                pooled: false,
            }],
            usage: Usage::default(),
            calibration: None,
            orders: Some(vec![OrderReport {
                method: Debias::Rotate,
                orders: 2,
                order_sensitivity: Some(0.5),
                prior_samples: None,
            }]),
        };
        let out = format(&p, &d, "served", Compat::Typesafe);
        assert_eq!(
            out["answers"][0],
            json!({"type": "predicate", "name": "p", "probability": 0.6, "x_debias": "rotate", "x_orders": 2, "x_order_sensitivity": 0.5})
        );
    }

    #[test]
    fn error_shape() {
        let e = error_body(&DecisionError::Invalid(vec![FieldError::new(
            loc(&["questions".into(), Loc::Index(0)]),
            "missing",
            "m",
        )]));
        assert_eq!(
            e,
            json!({"error": {"message": "invalid request: questions.0: m", "type": "invalid_request_error", "param": "questions.0", "code": "missing"}})
        );
    }
}
