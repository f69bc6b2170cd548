//! `POST /v1/decisions` in SGLang's shape (spec/API.md §3): questions with ids, temperature over the
//! label logits, label mass per answer, optional prompt token ids. The shape does not pick the wording:
//! `prompt_format_version` reports and pins whichever the profile and strategy render in.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::error::{DecisionError, FieldError, Loc};
use crate::ir::{ChoiceOption, Decision, DecisionRequest, Question, QuestionKind, Reading};
use crate::limits::Limits;
use crate::profile::Compat;
use crate::prompt::wording::PromptFormat;
use crate::prompt::{LabelGroup, PreparedRead};

use super::fields::{self, field_error as err};

/// Options per choice: one letter label each (seed 003: "2 to 26 objects").
const MAX_OPTIONS: usize = crate::limits::LETTER_LABELS;
/// Every field of the request (anything else is refused).
const FIELDS: &[&str] = &[
    "input",
    "questions",
    "temperature",
    "chat_template_kwargs",
    "prompt_format_version",
    "return_prompt_token_ids",
    "model",
    "joint",
];

pub struct Parsed {
    /// Shared with the decider while it reads.
    pub request: Arc<DecisionRequest>,
    pub temperature: f64,
    pub return_prompt_token_ids: bool,
    /// The request's `model`, echoed (`default` when omitted).
    pub model: String,
}

/// `served` is the wording this server renders in (`None` when the model has no strategy: the
/// request is then refused with a 501 after parsing). Parsed as the default profile does.
pub fn parse(
    body: &Value,
    limits: &Limits,
    served: Option<PromptFormat>,
) -> Result<Parsed, DecisionError> {
    parse_in(body, limits, served, Compat::Typesafe)
}

/// `parse` under a profile: SGLang's own refuses this server's extension fields (`x_debias`) as
/// unknown, as its seed refuses any field it does not list.
pub fn parse_in(
    body: &Value,
    limits: &Limits,
    served: Option<PromptFormat>,
    compat: Compat,
) -> Result<Parsed, DecisionError> {
    let obj = fields::body_object(body, "type_error")?;
    let mut errors = Vec::new();
    let extensions: &[&str] = if compat == Compat::Sglang {
        &[]
    } else {
        &fields::EXTENSIONS
    };
    let allowed: Vec<&str> = FIELDS.iter().chain(extensions).copied().collect();
    // Seed 003: "an unknown field anywhere in the request" is a 400.
    fields::unknown_keys(
        obj,
        &allowed,
        &[],
        "extra_forbidden",
        |key| {
            format!(
                "unknown field '{key}'; the request takes {}",
                allowed.join(", ")
            )
        },
        &mut errors,
    );
    let debias = if extensions.is_empty() {
        None
    } else {
        fields::debias(obj, "value_error", &mut errors)
    };
    let calibration = if extensions.is_empty() {
        None
    } else {
        fields::calibration(obj, "value_error", &mut errors)
    };
    // Echoed in the response, `default` when omitted (seed 003's `model` row).
    let model =
        fields::model_name(obj, "type_error", &mut errors)?.unwrap_or_else(|| "default".to_owned());
    let state = match obj.get("input") {
        Some(Value::String(s)) if !s.trim().is_empty() => Value::String(s.clone()),
        Some(v @ (Value::Object(_) | Value::Array(_))) if !is_empty_container(v) => v.clone(),
        None => {
            errors.push(err(&["input".into()], "missing", "input is required"));
            Value::Null
        }
        Some(_) => {
            errors.push(err(
                &["input".into()],
                "value_error",
                "input must be a non-blank string, object or array",
            ));
            Value::Null
        }
    };
    let temperature = match obj.get("temperature") {
        None | Some(Value::Null) => 1.0,
        Some(Value::Number(n)) if n.as_f64().is_some_and(|t| t > 0.0 && t.is_finite()) => {
            n.as_f64().unwrap_or(1.0)
        }
        Some(_) => {
            errors.push(err(
                &["temperature".into()],
                "value_error",
                "temperature must be a number greater than 0",
            ));
            1.0
        }
    };
    // A fit calibrates reads at temperature 1: another temperature first would scale them twice.
    if calibration.is_some() && temperature != 1.0 {
        errors.push(err(
            &[fields::CALIBRATION_FIELD.into()],
            "value_error",
            format!(
                "{}: a calibration fits reads at temperature 1, and this request asks for temperature {temperature}; send one or the other",
                fields::CALIBRATION_FIELD
            ),
        ));
    }
    match (obj.get("prompt_format_version"), served) {
        (None | Some(Value::Null), _) | (Some(_), None) => {}
        (Some(Value::Number(n)), Some(f)) if n.as_u64() == Some(u64::from(f.version)) => {}
        (Some(other), Some(f)) => errors.push(err(
            &["prompt_format_version".into()],
            "value_error",
            not_served(other, f),
        )),
    }
    let return_prompt_token_ids =
        fields::optional_bool(obj, "return_prompt_token_ids", "type_error", &mut errors);
    let joint = fields::optional_bool(obj, "joint", "type_error", &mut errors);
    let chat_template_kwargs = fields::template_kwargs(obj, "type_error", &mut errors);
    let mut questions: Vec<Question> = Vec::new();
    for (i, item) in fields::question_items(obj, limits, "type_error", &mut errors)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(q) = parse_question(i, item, limits, &mut errors) {
            if questions.iter().any(|other| other.id == q.id) {
                errors.push(err(
                    &["questions".into(), Loc::Index(i), "id".into()],
                    "value_error",
                    format!("duplicate question id '{}'", q.id),
                ));
            }
            questions.push(q);
        }
    }
    if !errors.is_empty() {
        return Err(DecisionError::Invalid(errors));
    }
    let request = DecisionRequest {
        state,
        instructions: None,
        questions,
        chat_template_kwargs,
        cache_salt: String::new(),
        media: Default::default(),
        joint,
        debias,
        calibration,
    };
    Ok(Parsed {
        request: Arc::new(request),
        temperature,
        return_prompt_token_ids,
        model,
    })
}

fn not_served(asked: &Value, served: PromptFormat) -> String {
    let hint = if asked.as_u64() == Some(u64::from(PromptFormat::SGLANG_V1.version))
        && served.name == PromptFormat::VLLM.name
    {
        "; SGLang's version 1 wording is served under --compat sglang"
    } else {
        ""
    };
    format!(
        "prompt_format_version {asked} is not served; this server serves version {} ({} wording){hint}",
        served.version, served.name
    )
}

/// How messages name a question: its id, or its position when the id is blank.
fn name_of(id: &str, i: usize) -> String {
    if id.trim().is_empty() {
        format!("questions[{i}]")
    } else {
        format!("'{id}'")
    }
}

/// A text field of a question (`question`, a description, a level, `yes` / `no`): a non-blank string,
/// or a JSON object or array rendered as compact JSON (seed 003: "can also be JSON objects or arrays").
fn text(
    value: &Value,
    loc: &[Loc],
    field: &str,
    id: &str,
    i: usize,
    errors: &mut Vec<FieldError>,
) -> Option<String> {
    let who = name_of(id, i);
    match value {
        Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
        Value::String(_) => {
            errors.push(err(
                loc,
                "value_error",
                format!("question {who}: {field} must not be blank"),
            ));
            None
        }
        Value::Object(_) | Value::Array(_) if !is_empty_container(value) => Some(
            crate::json_text::dumps(value, crate::json_text::Separators::Compact),
        ),
        _ => {
            errors.push(err(
                loc,
                "type_error",
                format!(
                    "question {who}: {field} must be a non-blank string, a JSON object or an array"
                ),
            ));
            None
        }
    }
}

fn is_empty_container(v: &Value) -> bool {
    matches!(v, Value::Object(m) if m.is_empty()) || matches!(v, Value::Array(a) if a.is_empty())
}

fn parse_question(
    i: usize,
    item: &Value,
    limits: &Limits,
    errors: &mut Vec<FieldError>,
) -> Option<Question> {
    let at = |k: &str| vec![Loc::from("questions"), Loc::Index(i), Loc::from(k)];
    let Some(obj) = item.as_object() else {
        errors.push(err(
            &["questions".into(), Loc::Index(i)],
            "type_error",
            "a question must be an object",
        ));
        return None;
    };
    let before = errors.len();
    let id = match obj.get("id") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => {
            errors.push(err(
                &at("id"),
                "value_error",
                format!("questions[{i}]: id must be a non-blank string"),
            ));
            String::new()
        }
    };
    let instructions = match obj.get("question") {
        // Absent: the question line is left out (as System One does without instructions).
        None | Some(Value::Null) => None,
        Some(value) => text(value, &at("question"), "question", &id, i, errors),
    };
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let allowed: &[&str] = match kind {
        "choice" => &["id", "type", "question", "options"],
        "score" => &["id", "type", "question", "levels"],
        "yes_no" => &["id", "type", "question", "yes", "no"],
        _ => {
            errors.push(err(
                &at("type"),
                "value_error",
                "type must be 'choice', 'score' or 'yes_no'",
            ));
            return None;
        }
    };
    fields::unknown_keys(
        obj,
        allowed,
        &["questions".into(), Loc::Index(i)],
        "extra_forbidden",
        |key| format!("unknown field '{key}' for a {kind} question"),
        errors,
    );
    let kind = match kind {
        "choice" => parse_options(obj, i, &id, errors)?,
        "score" => parse_levels(obj, i, &id, limits, errors)?,
        _ => parse_sides(obj, i, &id, errors)?,
    };
    if errors.len() > before {
        return None;
    }
    Some(Question {
        id,
        instructions,
        kind,
    })
}

/// A choice's `options`: 2 to 26 objects, each a name (distinct once folded) and a description.
fn parse_options(
    obj: &Map<String, Value>,
    i: usize,
    id: &str,
    errors: &mut Vec<FieldError>,
) -> Option<QuestionKind> {
    let at = |k: &str| vec![Loc::from("questions"), Loc::Index(i), Loc::from(k)];
    let Some(items) = obj.get("options").and_then(Value::as_array) else {
        errors.push(err(&at("options"), "missing", "a choice needs options"));
        return None;
    };
    if items.len() < 2 || items.len() > MAX_OPTIONS {
        errors.push(err(
            &at("options"),
            "value_error",
            format!(
                "a choice needs 2 to {MAX_OPTIONS} options, got {}",
                items.len()
            ),
        ));
        return None;
    }
    let mut options: Vec<ChoiceOption> = Vec::new();
    for (j, option) in items.iter().enumerate() {
        let oloc = vec![
            Loc::from("questions"),
            Loc::Index(i),
            Loc::from("options"),
            Loc::Index(j),
        ];
        let who = name_of(id, i);
        let Some(option_fields) = option.as_object() else {
            errors.push(err(
                &oloc,
                "type_error",
                format!("question {who}: option {j} must be an object with a name"),
            ));
            continue;
        };
        fields::unknown_keys(
            option_fields,
            &["name", "description"],
            &oloc,
            "extra_forbidden",
            |key| {
                format!("question {who}: unknown field '{key}' in option {j} (an option has name and description)")
            },
            errors,
        );
        let description = match option_fields.get("description") {
            None | Some(Value::Null) => None,
            Some(value) => text(value, &oloc, "description", id, i, errors),
        };
        let name = option_fields.get("name").and_then(Value::as_str);
        let earlier: Vec<(String, &str)> = options
            .iter()
            .map(|o| (fields::folded(&o.name), o.name.as_str()))
            .collect();
        match name.map(|n| (n, fields::option_name_problem(n, &earlier))) {
            Some((n, None)) => options.push(ChoiceOption {
                name: n.to_owned(),
                description,
            }),
            Some((_, Some(problem))) => errors.push(err(
                &oloc,
                "value_error",
                format!("question {who}: option {j}: {problem}"),
            )),
            None => errors.push(err(
                &oloc,
                "value_error",
                format!("question {who}: option {j} needs a non-blank name"),
            )),
        }
    }
    Some(QuestionKind::Choice { options })
}

/// A score's `levels`: texts (or JSON objects and arrays), level i worth i, kept as sent too.
fn parse_levels(
    obj: &Map<String, Value>,
    i: usize,
    id: &str,
    limits: &Limits,
    errors: &mut Vec<FieldError>,
) -> Option<QuestionKind> {
    let at = |k: &str| vec![Loc::from("questions"), Loc::Index(i), Loc::from(k)];
    let Some(items) = obj.get("levels").and_then(Value::as_array) else {
        errors.push(err(&at("levels"), "missing", "a score needs levels"));
        return None;
    };
    if items.len() < 2 || items.len() > limits.max_levels {
        errors.push(err(
            &at("levels"),
            "value_error",
            format!(
                "a score needs 2 to {} levels, got {}",
                limits.max_levels,
                items.len()
            ),
        ));
        return None;
    }
    let mut levels = Vec::with_capacity(items.len());
    for (j, level) in items.iter().enumerate() {
        let mut loc = at("levels");
        loc.push(Loc::Index(j));
        if let Some(level) = text(level, &loc, &format!("level {j}"), id, i, errors) {
            levels.push(level);
        }
    }
    Some(QuestionKind::Score {
        levels,
        sent: items.clone(),
    })
}

/// A yes/no question's optional `yes` and `no` descriptions.
fn parse_sides(
    obj: &Map<String, Value>,
    i: usize,
    id: &str,
    errors: &mut Vec<FieldError>,
) -> Option<QuestionKind> {
    let at = |k: &str| vec![Loc::from("questions"), Loc::Index(i), Loc::from(k)];
    let side = |k: &str, errors: &mut Vec<FieldError>| match obj.get(k) {
        None | Some(Value::Null) => None,
        Some(value) => text(value, &at(k), k, id, i, errors),
    };
    Some(QuestionKind::YesNo {
        yes: side("yes", errors),
        no: side("no", errors),
        no_first: false,
    })
}

pub fn format(
    parsed: &Parsed,
    decision: &Decision,
    reads: Option<&[PreparedRead]>,
    prompt_format: PromptFormat,
) -> Value {
    // Each question's prompt and labels (a joint canvas read answers several questions).
    let per_question: Option<Vec<(&[u32], &[LabelGroup])>> = reads.map(|reads| {
        reads
            .iter()
            .flat_map(|read| {
                read.question_labels()
                    .into_iter()
                    .map(move |labels| (read.token_ids.as_slice(), labels))
            })
            .collect()
    });
    let mut answers = Map::new();
    for (i, (question, answer)) in parsed
        .request
        .questions
        .iter()
        .zip(&decision.answers)
        .enumerate()
    {
        let p = &answer.probabilities;
        let mut value = match question.kind.reading(p) {
            Reading::Choice { options, chosen } => json!({
                "type": "choice",
                "choice": options[chosen].name,
                "probabilities": options.iter().zip(p).map(|(o, pi)| (o.name.clone(), json!(pi))).collect::<Map<_, _>>(),
            }),
            Reading::YesNo { yes, no } => {
                json!({"type": "yes_no", "probabilities": {"yes": yes, "no": no}})
            }
            // Keyed by level index (seed 003): equal level texts stay apart.
            Reading::Score { expected, .. } => json!({
                "type": "score",
                "score": expected,
                "probabilities": (0..p.len()).zip(p).map(|(k, pi)| (k.to_string(), json!(pi))).collect::<Map<_, _>>(),
            }),
        };
        let obj = value.as_object_mut().expect("object literal");
        obj.insert("label_mass".into(), json!(answer.label_mass));
        // A debiased read reports what it used on the answer (the shape has no diagnostics).
        if let Some(r) = decision.orders.as_ref().and_then(|r| r.get(i)) {
            obj.extend(r.fields("x_"));
        }
        if let Some(c) = decision.calibration.as_ref().and_then(|c| c.get(i)) {
            let (key, field) = c.field("x_");
            obj.insert(key, field);
        }
        if let Some((prompt, groups)) = per_question.as_ref().and_then(|r| r.get(i)) {
            obj.insert("prompt_token_ids".into(), json!(prompt));
            let labels: Vec<Value> = groups
                .iter()
                .map(|group| match group.variants.as_slice() {
                    [one] if one.len() == 1 => json!(one[0]),
                    [one] => json!(one),
                    variants => json!(variants),
                })
                .collect();
            obj.insert("label_token_ids".into(), Value::Array(labels));
        }
        answers.insert(question.id.clone(), value);
    }
    let prompt_tokens = decision.usage.per_question_prompt_tokens;
    json!({
        "object": "decisions",
        "model": parsed.model,
        "prompt_format_version": prompt_format.version,
        "answers": answers,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens},
    })
}

/// SGLang's error shape: `{"object": "error", "message", "type", "param", "code"}`.
pub fn error_body(error: &DecisionError, status: u16) -> Value {
    let param = match error {
        DecisionError::Invalid(fields) => fields.first().map(FieldError::param),
        DecisionError::BadRequest { param, .. } => param.clone(),
        DecisionError::MediaTooLarge { param, .. } => Some(param.clone()),
        _ => None,
    };
    let kind = match status {
        400 | 413 | 422 => "BadRequestError",
        401 => "AuthenticationError",
        429 => "RateLimitError",
        501 => "NotImplementedError",
        _ => "InternalServerError",
    };
    json!({"object": "error", "message": error.to_string(), "type": kind, "param": param, "code": status})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joint_is_a_boolean_defaulting_to_false() {
        let body = |joint: Value| json!({"input": "x", "joint": joint, "questions": [{"id": "u", "type": "yes_no", "question": "Urgent?"}]});
        let parsed = |joint: Value| parse(&body(joint), &Limits::default(), None);
        assert!(parsed(json!(true)).unwrap().request.joint);
        assert!(!parsed(Value::Null).unwrap().request.joint);
        let Err(DecisionError::Invalid(errors)) = parsed(json!(1)) else {
            panic!("a non-boolean joint is invalid")
        };
        assert_eq!(errors[0].param(), "joint");
    }

    #[test]
    fn x_debias_is_an_extension_the_sglang_profile_refuses() {
        use crate::debias::Debias;
        let body = |v: Value| json!({"input": "x", "x_debias": v, "questions": [{"id": "u", "type": "yes_no", "question": "Urgent?"}]});
        let parsed = |v| parse(&body(v), &Limits::default(), None);
        assert_eq!(
            parsed(json!("rotate")).unwrap().request.debias,
            Some(Debias::Rotate)
        );
        assert_eq!(parsed(Value::Null).unwrap().request.debias, None);
        let Err(DecisionError::Invalid(errors)) = parsed(json!(1)) else {
            panic!("x_debias must be off or rotate")
        };
        assert_eq!(
            (errors[0].param(), errors[0].kind),
            ("x_debias".to_owned(), "value_error")
        );
        assert_eq!(
            error_body(&DecisionError::Invalid(errors), 400)["param"],
            json!("x_debias")
        );
        // Seed 003: an unknown field anywhere is a 400; SGLang does not know this one.
        let Err(DecisionError::Invalid(errors)) = parse_in(
            &body(json!("rotate")),
            &Limits::default(),
            None,
            Compat::Sglang,
        ) else {
            panic!("--compat sglang refuses x_debias")
        };
        assert_eq!(
            (errors[0].param(), errors[0].kind),
            ("x_debias".to_owned(), "extra_forbidden")
        );
        assert!(!errors[0].msg.contains("takes input, questions, temperature, chat_template_kwargs, prompt_format_version, return_prompt_token_ids, model, joint, x_debias"));
    }

    #[test]
    fn parses_all_types_with_temperature() {
        let p = parse(
            &json!({"input": {"ticket": "x"}, "temperature": 0.5, "prompt_format_version": 1, "return_prompt_token_ids": true, "questions": [
                {"id": "team", "type": "choice", "question": "Which?", "options": [{"name": "a", "description": "d"}, {"name": "b"}]},
                {"id": "u", "type": "yes_no", "question": "Urgent?", "no": "calm"},
                {"id": "t", "type": "score", "question": "How?", "levels": ["lo", "hi"]}]}),
            &Limits::default(),
            Some(PromptFormat::SGLANG_V1),
        )
        .unwrap();
        assert_eq!(p.temperature, 0.5);
        assert!(p.return_prompt_token_ids);
        assert_eq!(
            p.request.questions[1].kind,
            QuestionKind::YesNo {
                yes: None,
                no: Some("calm".into()),
                no_first: false,
            }
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let base = |q: Value| json!({"input": "x", "questions": [q]});
        let cases = vec![
            (
                json!({"input": " ", "questions": [{"id": "a", "type": "yes_no"}]}),
                "input",
            ),
            (
                json!({"questions": [{"id": "a", "type": "yes_no"}]}),
                "input",
            ),
            (
                json!({"input": "x", "temperature": 0, "questions": [{"id": "a", "type": "yes_no"}]}),
                "temperature",
            ),
            (
                json!({"input": "x", "prompt_format_version": 2, "questions": [{"id": "a", "type": "yes_no"}]}),
                "prompt_format_version",
            ),
            (
                json!({"input": "x", "questions": [{"id": "a", "type": "yes_no", "question": "q"}, {"id": "a", "type": "yes_no", "question": "q"}]}),
                "questions.1.id",
            ),
            (
                base(json!({"id": "a", "type": "choice", "options": [{"name": "x"}]})),
                "questions.0.options",
            ),
            (
                base(json!({"id": "a", "type": "score", "levels": ["x"]})),
                "questions.0.levels",
            ),
            (
                base(json!({"id": "a", "type": "yes_no", "extra": 1})),
                "questions.0.extra",
            ),
            (base(json!({"type": "yes_no"})), "questions.0.id"),
        ];
        for (body, field) in cases {
            match parse(&body, &Limits::default(), Some(PromptFormat::SGLANG_V1)) {
                Err(DecisionError::Invalid(f)) => assert!(
                    f.iter().any(|e| e.param() == field),
                    "{body}: {:?}",
                    f.iter().map(FieldError::param).collect::<Vec<_>>()
                ),
                _ => panic!("{body} was accepted"),
            }
        }
    }

    /// Seed 003's "Errors" bullets, each a 400 naming the question (by id, or by position when the id is
    /// blank), and its text rules: JSON objects and arrays as compact JSON, the model echoed.
    #[test]
    fn seed_003_errors_and_text_rules() {
        let q = |extra: Value| {
            let mut question = json!({"id": "a", "type": "choice", "question": "Which?", "options": [{"name": "x"}, {"name": "y"}]});
            question
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            json!({"input": "x", "questions": [question]})
        };
        let refused =
            |body: Value, field: &str, words: &str| match parse(&body, &Limits::default(), None) {
                Err(DecisionError::Invalid(f)) => assert!(
                    f.iter()
                        .any(|e| e.param() == field && e.msg.contains(words)),
                    "{body}: {:?}",
                    f.iter()
                        .map(|e| (e.param(), e.msg.clone()))
                        .collect::<Vec<_>>()
                ),
                _ => panic!("{body} was accepted"),
            };
        refused(
            json!({"input": "x", "extra": 1, "questions": [{"id": "a", "type": "yes_no", "question": "q"}]}),
            "extra",
            "unknown field",
        );
        refused(
            q(json!({"options": [{"name": "x", "colour": 1}, {"name": "y"}]})),
            "questions.0.options.0.colour",
            "unknown field 'colour' in option 0",
        );
        refused(
            q(json!({"question": "  "})),
            "questions.0.question",
            "question 'a': question must not be blank",
        );
        refused(
            q(json!({"id": " "})),
            "questions.0.id",
            "questions[0]: id must be a non-blank string",
        );
        refused(
            q(json!({"options": [{"name": "x\u{7}"}, {"name": "y"}]})),
            "questions.0.options.0",
            "control or line-break",
        );
        refused(
            q(json!({"options": [{"name": "x\ny"}, {"name": "y"}]})),
            "questions.0.options.0",
            "control or line-break",
        );
        refused(
            q(json!({"options": [{"name": "Billing"}, {"name": " billing "}]})),
            "questions.0.options.1",
            "repeats \"Billing\"",
        );
        refused(
            json!({"input": "x", "questions": [{"id": "s", "type": "score", "question": "q", "levels": ["a", " "]}]}),
            "questions.0.levels.1",
            "level 1 must not be blank",
        );
        refused(
            json!({"input": "x", "questions": [{"id": "s", "type": "score", "question": "q", "levels": ["a", null]}]}),
            "questions.0.levels.1",
            "level 1 must be",
        );
        // Case folding, not lower-casing (Python's `casefold`, as SGLang compares): ß folds to ss.
        refused(
            q(json!({"options": [{"name": "Straße"}, {"name": "STRASSE"}]})),
            "questions.0.options.1",
            "repeats \"Straße\"",
        );
        let parsed = parse(
            &json!({"input": "x", "model": "my-model", "questions": [{"id": "u", "type": "yes_no", "question": {"ask": "late?", "n": [1, 2]}, "yes": ["a", 1]},
                {"id": "s", "type": "score", "question": "q", "levels": [{"l": 1}, "same", "same"]}]}),
            &Limits::default(),
            None,
        )
        .unwrap();
        assert_eq!(parsed.model, "my-model");
        assert_eq!(
            parsed.request.questions[0].instructions.as_deref(),
            Some(r#"{"ask":"late?","n":[1,2]}"#)
        );
        assert_eq!(
            parsed.request.questions[0].kind,
            QuestionKind::YesNo {
                yes: Some(r#"["a",1]"#.into()),
                no: None,
                no_first: false,
            }
        );
        assert_eq!(
            parsed.request.questions[1].kind,
            QuestionKind::Score {
                levels: vec![r#"{"l":1}"#.into(), "same".into(), "same".into()],
                sent: vec![json!({"l": 1}), json!("same"), json!("same")],
            }
        );
        let omitted = parse(
            &json!({"input": "x", "questions": [{"id": "u", "type": "yes_no", "question": "q"}]}),
            &Limits::default(),
            None,
        )
        .unwrap();
        assert_eq!(omitted.model, "default");
    }

    /// The pinned version is checked against the wording served, not against the shape.
    #[test]
    fn prompt_format_version_pins_the_served_wording() {
        let body = |v: u32| json!({"input": "x", "prompt_format_version": v, "questions": [{"id": "a", "type": "yes_no", "question": "q"}]});
        let limits = Limits::default();
        assert!(parse(&body(1), &limits, Some(PromptFormat::SGLANG_V1)).is_ok());
        assert!(parse(&body(101), &limits, Some(PromptFormat::VLLM)).is_ok());
        assert!(parse(&body(201), &limits, Some(PromptFormat::LIQUID_D1)).is_ok());
        // No strategy: nothing to pin against; the route answers 501 after parsing.
        assert!(parse(&body(7), &limits, None).is_ok());
        match parse(&body(1), &limits, Some(PromptFormat::VLLM)) {
            Err(DecisionError::Invalid(f)) => {
                let message = &f[0].msg;
                assert!(
                    message.contains("serves version 101 (vllm wording)")
                        && message.contains("--compat sglang"),
                    "{message}"
                );
            }
            _ => panic!("version 1 accepted under vLLM's wording"),
        }
        assert!(parse(&body(1), &limits, Some(PromptFormat::LIQUID_D1)).is_err());
    }

    #[test]
    fn error_shape() {
        let e = error_body(
            &DecisionError::Invalid(vec![err(&["temperature".into()], "value_error", "m")]),
            400,
        );
        assert_eq!(e["object"], "error");
        assert_eq!(e["param"], "temperature");
        assert_eq!(e["code"], 400);
    }
}
