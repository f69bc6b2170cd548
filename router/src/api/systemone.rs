//! `POST /v1/systemone`, TypeSafe's System One shape (spec/API.md §1): parsing and validation into
//! the decision IR, response formatting, and this shape's error bodies.

use serde_json::{json, Map, Value};

use super::fields;
use crate::error::{DecisionError, FieldError, Loc};
use crate::ir::{
    ChoiceOption, Decision, DecisionRequest, Media, Modality, Question, QuestionKind, Reading,
};
use crate::limits::Limits;
use crate::profile::Compat;

/// Parses and validates a System One request; every problem found is reported, each naming its field.
pub fn parse(
    body: &Value,
    limits: &Limits,
    compat: Compat,
) -> Result<DecisionRequest, DecisionError> {
    let limits = &compat.limits(crate::profile::Shape::SystemOne, limits);
    let mut errors = Vec::new();
    let obj = fields::body_object(body, "model_attributes_type")?;
    fields::model_name(obj, "string_type", &mut errors)?;
    if compat == Compat::Sglang {
        // Seed 003: the `/v1/decisions` fields are refused here unless null.
        for key in [
            "temperature",
            "prompt_format_version",
            "return_prompt_token_ids",
        ] {
            if obj.get(key).is_some_and(|v| !v.is_null()) {
                errors.push(FieldError::new(
                    loc(&[key]),
                    "extra_forbidden",
                    format!("{key} is a /v1/decisions field; /v1/systemone takes it only as null"),
                ));
            }
        }
    }
    let state = match obj.get("state") {
        None => {
            errors.push(FieldError::new(
                loc(&["state"]),
                "missing",
                "state is required",
            ));
            Value::Null
        }
        Some(v) => v.clone(),
    };
    let instructions = match obj.get("instructions") {
        None | Some(Value::Null) => None,
        Some(v) => text_field(v, loc(&["instructions"]), &mut errors),
    };
    let chat_template_kwargs = fields::template_kwargs(obj, "dict_type", &mut errors);
    let cache_salt = match obj.get("cache_salt") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            errors.push(FieldError::new(
                loc(&["cache_salt"]),
                "string_type",
                "cache_salt must be a string",
            ));
            String::new()
        }
    };
    let media = parse_media(obj, &mut errors);
    let joint = fields::optional_bool(obj, "joint", "bool_type", &mut errors);
    let debias = fields::debias(obj, "literal_error", &mut errors);
    let calibration = fields::calibration(obj, "value_error", &mut errors);
    let questions = match obj.get("questions") {
        None => {
            errors.push(FieldError::new(
                loc(&["questions"]),
                "missing",
                "questions is required",
            ));
            Vec::new()
        }
        Some(Value::Object(map)) => parse_questions(map, limits, compat, &mut errors),
        Some(_) => {
            errors.push(FieldError::new(
                loc(&["questions"]),
                "dict_type",
                "questions must be an object mapping question ids to questions",
            ));
            Vec::new()
        }
    };
    if !errors.is_empty() {
        return Err(DecisionError::Invalid(errors));
    }
    Ok(DecisionRequest {
        state,
        instructions,
        questions,
        chat_template_kwargs,
        cache_salt,
        media,
        joint,
        debias,
        calibration,
    })
}

/// `images`, `audio`, `videos`: each null, absent, or a list of URL / data-URL strings. Which kinds
/// a model takes is its read strategy's business; here only the shape is checked.
fn parse_media(obj: &Map<String, Value>, errors: &mut Vec<FieldError>) -> Media {
    let mut media = Media::default();
    for modality in Modality::ALL {
        let field = modality.field();
        let urls = match obj.get(field) {
            None | Some(Value::Null) => continue,
            Some(Value::Array(items)) => items,
            Some(_) => {
                errors.push(FieldError::new(
                    loc(&[field]),
                    "list_type",
                    format!("{field} must be a list of URLs or data URLs"),
                ));
                continue;
            }
        };
        let mut kept = Vec::with_capacity(urls.len());
        for (i, url) in urls.iter().enumerate() {
            match url {
                Value::String(s) => kept.push(s.clone()),
                _ => {
                    let mut at = loc(&[field]);
                    at.push(Loc::Index(i));
                    errors.push(FieldError::new(
                        at,
                        "string_type",
                        format!("{field}[{i}] must be a URL or data URL string"),
                    ))
                }
            }
        }
        match modality {
            Modality::Image => media.images = kept,
            Modality::Audio => media.audio = kept,
            Modality::Video => media.videos = kept,
        }
    }
    media
}

fn loc(path: &[&str]) -> Vec<Loc> {
    fields::body_loc(&path.iter().copied().map(Loc::from).collect::<Vec<_>>())
}

fn at(base: &[Loc], more: impl Into<Loc>) -> Vec<Loc> {
    let mut v = base.to_vec();
    v.push(more.into());
    v
}

/// A free-text field: a string as is; an object or array as its JSON text.
fn text_field(value: &Value, loc: Vec<Loc>, errors: &mut Vec<FieldError>) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Object(_) | Value::Array(_) => Some(crate::json_text::dumps(
            value,
            crate::json_text::Separators::Default,
        )),
        _ => {
            errors.push(FieldError::new(
                loc,
                "string_type",
                "must be a string, an object or an array",
            ));
            None
        }
    }
}

fn parse_questions(
    map: &Map<String, Value>,
    limits: &Limits,
    compat: Compat,
    errors: &mut Vec<FieldError>,
) -> Vec<Question> {
    let base = loc(&["questions"]);
    if !fields::question_count(map.len(), limits, errors) {
        return Vec::new();
    }
    let mut questions = Vec::with_capacity(map.len());
    for (id, spec) in map {
        let qloc = at(&base, id.clone());
        if let Some(problem) = compat.question_id_problem(id) {
            errors.push(FieldError::new(qloc.clone(), "value_error", problem));
        }
        if let Some(q) = parse_question(id, spec, &qloc, limits, compat, errors) {
            questions.push(q);
        }
    }
    questions
}

fn parse_question(
    id: &str,
    spec: &Value,
    qloc: &[Loc],
    limits: &Limits,
    compat: Compat,
    errors: &mut Vec<FieldError>,
) -> Option<Question> {
    let Some(obj) = spec.as_object() else {
        errors.push(FieldError::new(
            qloc.to_vec(),
            "model_attributes_type",
            "a question must be an object",
        ));
        return None;
    };
    let before = errors.len();
    fields::unknown_keys(
        obj,
        &["type", "instructions", "criteria"],
        &qloc[1..],
        "extra_forbidden",
        |key| format!("unknown field '{key}' (a question has type, instructions and criteria)"),
        errors,
    );
    let instructions = match obj.get("instructions") {
        None | Some(Value::Null) => None,
        Some(v) => text_field(v, at(qloc, "instructions"), errors),
    };
    let criteria = obj.get("criteria").unwrap_or(&Value::Null);
    let cloc = at(qloc, "criteria");
    let kind = match obj.get("type") {
        None => {
            errors.push(FieldError::new(
                at(qloc, "type"),
                "missing",
                "type is required (choice, noul or score)",
            ));
            None
        }
        Some(Value::String(t)) if t == "choice" => parse_choice(criteria, &cloc, limits, errors),
        Some(Value::String(t)) if t == "noul" => {
            parse_noul(criteria, instructions.as_deref(), qloc, compat, errors)
        }
        Some(Value::String(t)) if t == "score" => parse_score(criteria, &cloc, limits, errors),
        Some(other) => {
            errors.push(FieldError::new(
                at(qloc, "type"),
                "literal_error",
                format!("type must be one of 'choice', 'noul', 'score', got {other}"),
            ));
            None
        }
    };
    if errors.len() > before {
        return None;
    }
    kind.map(|kind| Question {
        id: id.to_owned(),
        instructions,
        kind,
    })
}

fn parse_choice(
    criteria: &Value,
    cloc: &[Loc],
    limits: &Limits,
    errors: &mut Vec<FieldError>,
) -> Option<QuestionKind> {
    let Value::Object(map) = criteria else {
        let msg = if criteria.is_null() {
            "a choice needs criteria: an object of option name -> description or null"
        } else {
            "choice criteria must be an object of option name -> description or null"
        };
        errors.push(FieldError::new(
            cloc.to_vec(),
            if criteria.is_null() {
                "missing"
            } else {
                "dict_type"
            },
            msg,
        ));
        return None;
    };
    if map.is_empty() {
        errors.push(FieldError::new(
            cloc.to_vec(),
            "too_short",
            "a choice needs at least one option",
        ));
        return None;
    }
    if map.len() > limits.max_choices {
        errors.push(FieldError::new(
            cloc.to_vec(),
            "too_long",
            format!(
                "at most {} options per choice (max_choices), got {}",
                limits.max_choices,
                map.len()
            ),
        ));
        return None;
    }
    let mut seen: Vec<(String, &str)> = Vec::with_capacity(map.len());
    let mut options = Vec::with_capacity(map.len());
    for (name, description) in map {
        let oloc = at(cloc, name.clone());
        if let Some(problem) = fields::option_name_problem(name, &seen) {
            errors.push(FieldError::new(oloc.clone(), "value_error", problem));
        }
        seen.push((fields::folded(name), name));
        let description = match description {
            Value::Null => None,
            v => text_field(v, oloc, errors),
        };
        options.push(ChoiceOption {
            name: name.clone(),
            description,
        });
    }
    Some(QuestionKind::Choice { options })
}

fn parse_noul(
    criteria: &Value,
    instructions: Option<&str>,
    qloc: &[Loc],
    compat: Compat,
    errors: &mut Vec<FieldError>,
) -> Option<QuestionKind> {
    let cloc = at(qloc, "criteria");
    let (mut yes, mut no) = (None, None);
    match criteria {
        Value::Null => {}
        Value::Object(map) => {
            for (key, value) in map {
                let side = match key.as_str() {
                    "true" => &mut yes,
                    "false" => &mut no,
                    _ => {
                        errors.push(FieldError::new(
                            at(&cloc, key.clone()),
                            "extra_forbidden",
                            format!(
                                "noul criteria may only describe 'true' and 'false', not '{key}'"
                            ),
                        ));
                        continue;
                    }
                };
                *side = match value {
                    Value::Null => None,
                    v => text_field(v, at(&cloc, key.clone()), errors),
                };
            }
        }
        _ => {
            errors.push(FieldError::new(cloc, "dict_type", "noul criteria must be null or an object with optional 'true' / 'false' descriptions"));
            return None;
        }
    }
    let has_instructions = instructions.is_some_and(|s| !s.trim().is_empty());
    let described = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.trim().is_empty());
    if !compat.reads_bare_noul() && !has_instructions && !described(&yes) && !described(&no) {
        errors.push(FieldError::new(
            qloc.to_vec(),
            "value_error",
            "a noul question needs instructions or a description of its 'true' or 'false' side",
        ));
        return None;
    }
    Some(QuestionKind::YesNo {
        yes,
        no,
        no_first: false,
    })
}

fn parse_score(
    criteria: &Value,
    cloc: &[Loc],
    limits: &Limits,
    errors: &mut Vec<FieldError>,
) -> Option<QuestionKind> {
    let Value::Array(items) = criteria else {
        let (kind, msg) = match criteria {
            Value::Null => (
                "missing",
                "a score needs criteria: an ordered list of levels",
            ),
            Value::Object(_) => (
                "list_type",
                "score criteria must be an ordered list of levels, not a map",
            ),
            _ => (
                "list_type",
                "score criteria must be an ordered list of levels",
            ),
        };
        errors.push(FieldError::new(cloc.to_vec(), kind, msg));
        return None;
    };
    if items.len() < limits.min_levels.max(1) {
        errors.push(FieldError::new(
            cloc.to_vec(),
            "too_short",
            match limits.min_levels {
                0 | 1 => "a score needs at least one level".to_owned(),
                n => format!("a score needs at least {n} levels, got {}", items.len()),
            },
        ));
        return None;
    }
    if items.len() > limits.max_levels {
        errors.push(FieldError::new(
            cloc.to_vec(),
            "too_long",
            format!(
                "at most {} levels per score (max_levels), got {}",
                limits.max_levels,
                items.len()
            ),
        ));
        return None;
    }
    let mut levels = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let lloc = at(cloc, i);
        match item {
            Value::String(s) if s.trim().is_empty() => {
                errors.push(FieldError::new(
                    lloc,
                    "value_error",
                    "score levels must be non-blank",
                ));
            }
            v => {
                if let Some(text) = text_field(v, lloc, errors) {
                    levels.push(text);
                }
            }
        }
    }
    Some(QuestionKind::Score {
        levels,
        sent: items.clone(),
    })
}

/// Formats answers in the System One shape, with the profile's extension fields.
pub fn format(
    request: &DecisionRequest,
    decision: &Decision,
    model: &str,
    compat: Compat,
) -> Value {
    let mut answers = Map::new();
    let mut diagnostics = Map::new();
    for (i, (question, answer)) in request.questions.iter().zip(&decision.answers).enumerate() {
        let p = &answer.probabilities;
        let confidence = compat.confidence(question.kind.kind(), answer);
        let mut value = match question.kind.reading(p) {
            Reading::Choice { options, chosen } => {
                let probabilities: Map<String, Value> = options
                    .iter()
                    .zip(p)
                    .map(|(o, pi)| (o.name.clone(), json!(pi)))
                    .collect();
                json!({"type": "choice", "choice": options[chosen].name, "probabilities": probabilities})
            }
            // vLLM keys a noul's probabilities by its labels (seed 000 and its NoulQuestion.answer).
            Reading::YesNo { yes, no } if compat == Compat::Vllm => {
                json!({"type": "noul", "noul": yes, "probabilities": {"yes": yes, "no": no}})
            }
            Reading::YesNo { yes, .. } => json!({"type": "noul", "noul": yes}),
            Reading::Score { sent, expected } => {
                // The legend echoes the levels exactly as sent (objects stay objects).
                let legend: Map<String, Value> = sent
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (i.to_string(), l.clone()))
                    .collect();
                let probabilities: Map<String, Value> = p
                    .iter()
                    .enumerate()
                    .map(|(i, pi)| (i.to_string(), json!(pi)))
                    .collect();
                json!({"type": "score", "score": expected, "legend": legend, "probabilities": probabilities})
            }
        };
        if let (Some(c), Some(obj)) = (confidence, value.as_object_mut()) {
            obj.insert("confidence".into(), json!(c));
        }
        let report = decision.orders.as_ref().and_then(|r| r.get(i));
        if compat == Compat::Sglang {
            if let Some(obj) = value.as_object_mut() {
                obj.insert("x_label_mass".into(), json!(answer.label_mass));
                // This profile has no diagnostics map: its extensions sit on the answer.
                obj.extend(report.map(|r| r.fields("x_")).unwrap_or_default());
                obj.extend(
                    decision
                        .calibration
                        .as_ref()
                        .and_then(|c| c.get(i))
                        .map(|c| c.field("x_")),
                );
            }
        }
        answers.insert(question.id.clone(), value);
        let mut diagnostic =
            json!({"label_mass": answer.label_mass, "argmax_is_label": answer.argmax_is_label});
        if let (Some(r), Some(obj)) = (report, diagnostic.as_object_mut()) {
            obj.extend(r.fields(""));
        }
        if let (Some(c), Some(obj)) = (
            decision.calibration.as_ref().and_then(|c| c.get(i)),
            diagnostic.as_object_mut(),
        ) {
            let (key, value) = c.field("");
            obj.insert(key, value);
        }
        diagnostics.insert(question.id.clone(), diagnostic);
    }
    let usage = compat.usage(&decision.usage, request.questions.len());
    let mut out = json!({
        "model": model,
        "answers": answers,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
    });
    let obj = out.as_object_mut().expect("object literal");
    match compat {
        Compat::Typesafe => {
            obj.insert("x_diagnostics".into(), Value::Object(diagnostics));
            obj.insert("x_cached_tokens".into(), json!(usage.cached_tokens));
        }
        Compat::Vllm => {
            let created = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            obj.insert(
                "id".into(),
                json!(format!("decision-{}", uuid::Uuid::new_v4().simple())),
            );
            obj.insert("object".into(), json!("structured_decision"));
            obj.insert("created".into(), json!(created));
            obj.insert("diagnostics".into(), Value::Object(diagnostics));
        }
        Compat::Sglang => {}
    }
    out
}

/// This shape's error body: a `detail` list for validation, a `detail` object otherwise, with the
/// `error_type` the profile gives the error (`Compat::error_type`).
pub fn error_body(error: &DecisionError, error_type: &str) -> Value {
    match error {
        DecisionError::Invalid(fields) => json!({
            "detail": fields.iter().map(|f| json!({
                "loc": f.loc.iter().map(Loc::to_json).collect::<Vec<_>>(),
                "msg": f.msg,
                "type": f.kind,
            })).collect::<Vec<_>>()
        }),
        other => {
            json!({"detail": {"error_type": error_type, "message": other.to_string()}})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    fn invalid(body: Value) -> Vec<FieldError> {
        match parse(&body, &limits(), Compat::Typesafe) {
            Err(DecisionError::Invalid(fields)) => fields,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    fn locs(fields: &[FieldError]) -> Vec<String> {
        fields.iter().map(FieldError::param).collect()
    }

    #[test]
    fn joint_is_a_boolean_defaulting_to_false() {
        let body = |joint: Value| json!({"state": "s", "joint": joint, "questions": {"u": {"type": "noul", "instructions": "x"}}});
        let limits = limits();
        assert!(
            parse(&body(json!(true)), &limits, Compat::Typesafe)
                .unwrap()
                .joint
        );
        assert!(
            !parse(&body(json!(false)), &limits, Compat::Typesafe)
                .unwrap()
                .joint
        );
        assert!(
            !parse(&body(Value::Null), &limits, Compat::Typesafe)
                .unwrap()
                .joint
        );
        let Err(DecisionError::Invalid(errors)) =
            parse(&body(json!("yes")), &limits, Compat::Typesafe)
        else {
            panic!("a non-boolean joint is invalid")
        };
        assert_eq!(
            (errors[0].param(), errors[0].kind),
            ("joint".to_owned(), "bool_type")
        );
    }

    #[test]
    fn parses_the_spec_example() {
        let body = json!({
            "model": "jev-latest",
            "state": {"ticket": "Refund not received", "days": 12},
            "instructions": "You route tickets.",
            "questions": {
                "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "payments", "tech": null}},
                "urgent": {"type": "noul", "instructions": "Needs a reply within the hour?", "criteria": {"true": "money is moving"}},
                "tone": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "furious"]}
            },
            "chat_template_kwargs": {"enable_thinking": false},
            "cache_salt": "s",
            "unknown_top_level": 1
        });
        let r = parse(&body, &limits(), Compat::Typesafe).unwrap();
        assert_eq!(r.questions.len(), 3);
        assert_eq!(r.questions[0].id, "team");
        assert_eq!(r.instructions.as_deref(), Some("You route tickets."));
        assert_eq!(r.cache_salt, "s");
        assert_eq!(
            r.questions[0].kind,
            QuestionKind::Choice {
                options: vec![
                    ChoiceOption {
                        name: "billing".into(),
                        description: Some("payments".into())
                    },
                    ChoiceOption {
                        name: "tech".into(),
                        description: None
                    }
                ]
            }
        );
        assert_eq!(
            r.questions[1].kind,
            QuestionKind::YesNo {
                yes: Some("money is moving".into()),
                no: None,
                no_first: false,
            }
        );
        assert_eq!(
            r.questions[2].kind,
            QuestionKind::score(vec!["calm".into(), "annoyed".into(), "furious".into()])
        );
    }

    #[test]
    fn object_descriptions_render_as_json() {
        let body = json!({"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": {"k": [1, 2]}}}}, "instructions": ["x"]});
        let r = parse(&body, &limits(), Compat::Typesafe).unwrap();
        assert_eq!(r.instructions.as_deref(), Some("[\"x\"]"));
        assert_eq!(
            r.questions[0].kind,
            QuestionKind::Choice {
                options: vec![ChoiceOption {
                    name: "a".into(),
                    description: Some("{\"k\": [1, 2]}".into())
                }]
            }
        );
    }

    #[test]
    fn every_validation_rule_names_its_field() {
        let q = |spec: Value| json!({"state": "s", "questions": {"q": spec}});
        let cases: Vec<(Value, &str)> = vec![
            (json!([1]), ""),
            (
                json!({"questions": {"q": {"type": "noul", "instructions": "x"}}}),
                "state",
            ),
            (json!({"state": "s"}), "questions"),
            (json!({"state": "s", "questions": {}}), "questions"),
            (json!({"state": "s", "questions": []}), "questions"),
            (
                json!({"state": "s", "model": 3, "questions": {"q": {"type": "noul", "instructions": "x"}}}),
                "model",
            ),
            (
                json!({"state": "s", "questions": {" ": {"type": "noul", "instructions": "x"}}}),
                "questions. ",
            ),
            (q(json!("text")), "questions.q"),
            (q(json!({"instructions": "x"})), "questions.q.type"),
            (
                q(json!({"type": "ranking", "instructions": "x"})),
                "questions.q.type",
            ),
            (
                q(json!({"type": "noul", "instructions": "x", "extra": 1})),
                "questions.q.extra",
            ),
            (
                q(json!({"type": "choice", "criteria": ["a", "b"]})),
                "questions.q.criteria",
            ),
            (q(json!({"type": "choice"})), "questions.q.criteria"),
            (
                q(json!({"type": "choice", "criteria": {}})),
                "questions.q.criteria",
            ),
            (
                q(json!({"type": "choice", "criteria": {" ": null}})),
                "questions.q.criteria. ",
            ),
            (
                q(json!({"type": "choice", "criteria": {"a\nb": null}})),
                "questions.q.criteria.a\nb",
            ),
            (
                q(json!({"type": "choice", "criteria": {"Yes": null, " yes ": null}})),
                "questions.q.criteria. yes ",
            ),
            (
                q(json!({"type": "choice", "criteria": {"a": 5}})),
                "questions.q.criteria.a",
            ),
            (q(json!({"type": "noul"})), "questions.q"),
            (
                q(json!({"type": "noul", "criteria": {"maybe": "x"}, "instructions": "x"})),
                "questions.q.criteria.maybe",
            ),
            (
                q(json!({"type": "noul", "criteria": ["x"], "instructions": "x"})),
                "questions.q.criteria",
            ),
            (
                q(json!({"type": "score", "criteria": {"0": "low"}})),
                "questions.q.criteria",
            ),
            (
                q(json!({"type": "score", "criteria": []})),
                "questions.q.criteria",
            ),
            (
                q(json!({"type": "score", "criteria": ["a", ""]})),
                "questions.q.criteria.1",
            ),
            (
                q(
                    json!({"type": "score", "criteria": ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"]}),
                ),
                "questions.q.criteria",
            ),
            (
                q(json!({"type": "noul", "instructions": 7})),
                "questions.q.instructions",
            ),
            (
                json!({"state": "s", "instructions": 1, "questions": {"q": {"type": "noul", "instructions": "x"}}}),
                "instructions",
            ),
            (
                json!({"state": "s", "chat_template_kwargs": [], "questions": {"q": {"type": "noul", "instructions": "x"}}}),
                "chat_template_kwargs",
            ),
        ];
        for (body, field) in cases {
            let fields = invalid(body.clone());
            assert!(
                locs(&fields).iter().any(|l| l == field),
                "{body} -> {:?}, expected {field:?}",
                locs(&fields)
            );
            assert!(fields
                .iter()
                .all(|f| matches!(f.loc.first(), Some(Loc::Key(k)) if k == "body")));
        }
    }

    #[test]
    fn too_many_questions_and_options_name_the_limit() {
        let many: Map<String, Value> = (0..limits().max_questions + 1)
            .map(|i| {
                (
                    format!("q{i}"),
                    json!({"type": "noul", "instructions": "x"}),
                )
            })
            .collect();
        let fields = invalid(json!({"state": "s", "questions": many}));
        assert!(fields[0].msg.contains("max_questions"));
        let options: Map<String, Value> = (0..limits().max_choices + 1)
            .map(|i| (format!("o{i}"), Value::Null))
            .collect();
        let fields = invalid(
            json!({"state": "s", "questions": {"q": {"type": "choice", "criteria": options}}}),
        );
        assert!(fields[0].msg.contains("max_choices"));
    }

    #[test]
    fn adapter_model_names_are_refused_and_others_accepted() {
        let ok = json!({"model": "anything-at-all", "state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}});
        assert!(parse(&ok, &limits(), Compat::Typesafe).is_ok());
        let adapter = json!({"model": "base:adapter", "state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}});
        let err = parse(&adapter, &limits(), Compat::Typesafe).unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
    }

    #[test]
    fn unicode_ids_and_names_are_kept_byte_exact() {
        let body = json!({"state": "s", "questions": {"é 🚀 id": {"type": "choice", "criteria": {"Ünï 🚀": null, "b": "d"}}}});
        let r = parse(&body, &limits(), Compat::Typesafe).unwrap();
        assert_eq!(r.questions[0].id, "é 🚀 id");
        assert!(
            matches!(&r.questions[0].kind, QuestionKind::Choice { options } if options[0].name == "Ünï 🚀")
        );
    }

    #[test]
    fn error_bodies() {
        let v = error_body(
            &DecisionError::Invalid(vec![FieldError::new(
                loc(&["questions", "tone", "criteria"]),
                "list_type",
                "m",
            )]),
            "invalid_request",
        );
        assert_eq!(
            v,
            json!({"detail": [{"loc": ["body", "questions", "tone", "criteria"], "msg": "m", "type": "list_type"}]})
        );
        let v = error_body(
            &DecisionError::Unauthorized,
            DecisionError::Unauthorized.error_type(),
        );
        assert_eq!(v["detail"]["error_type"], "authentication_error");
    }

    #[test]
    fn formats_answers() {
        use crate::ir::{Answer, Usage};
        let body = json!({"state": "s", "questions": {
            "team": {"type": "choice", "criteria": {"billing": null, "tech": null}},
            "urgent": {"type": "noul", "instructions": "u"},
            "tone": {"type": "score", "criteria": ["calm", {"label": "annoyed"}, "furious"]}}});
        let r = parse(&body, &limits(), Compat::Typesafe).unwrap();
        let ans = |p: Vec<f64>| Answer {
            label_logprobs: p.iter().map(|x| x.ln()).collect(),
            probabilities: p,
            label_mass: 0.9,
            argmax_is_label: true,
            pooled: false,
        };
        let d = Decision {
            answers: vec![
                ans(vec![0.88, 0.12]),
                ans(vec![0.25, 0.75]),
                ans(vec![0.0, 0.95, 0.05]),
            ],
            usage: Usage {
                input_tokens: 42,
                cached_tokens: 0,
                per_question_prompt_tokens: 100,
                pooled: false,
            },
            calibration: None,
            orders: None,
        };
        let out = format(&r, &d, "m", Compat::Typesafe);
        assert_eq!(out["answers"]["team"]["choice"], "billing");
        assert!((out["answers"]["team"]["confidence"].as_f64().unwrap() - 0.76).abs() < 1e-12);
        assert_eq!(
            out["answers"]["urgent"],
            json!({"type": "noul", "noul": 0.25})
        );
        assert!((out["answers"]["tone"]["score"].as_f64().unwrap() - 1.05).abs() < 1e-12);
        assert!((out["answers"]["tone"]["confidence"].as_f64().unwrap() - 0.925).abs() < 1e-12);
        assert_eq!(
            out["answers"]["tone"]["legend"],
            json!({"0": "calm", "1": {"label": "annoyed"}, "2": "furious"})
        );
        assert_eq!(
            out["usage"],
            json!({"input_tokens": 42, "output_tokens": 0})
        );
        assert_eq!(
            out["x_diagnostics"]["team"],
            json!({"label_mass": 0.9, "argmax_is_label": true})
        );
        let keys: Vec<&String> = out["answers"].as_object().unwrap().keys().collect();
        assert_eq!(keys, vec!["team", "urgent", "tone"]);

        let vllm = format(&r, &d, "m", Compat::Vllm);
        assert_eq!(vllm["object"], "structured_decision");
        assert!(vllm["id"].as_str().unwrap().starts_with("decision-"));
        assert!(
            (vllm["answers"]["team"]["confidence"].as_f64().unwrap() - 0.88 * 0.9).abs() < 1e-12
        );
        assert!(
            (vllm["answers"]["urgent"]["confidence"].as_f64().unwrap() - 0.75 * 0.9).abs() < 1e-12
        );
        assert_eq!(
            vllm["answers"]["urgent"]["probabilities"],
            json!({"yes": 0.25, "no": 0.75})
        );
        assert_eq!(
            vllm["usage"],
            json!({"input_tokens": 100, "output_tokens": 3})
        );
        assert_eq!(
            vllm["diagnostics"]["tone"],
            json!({"label_mass": 0.9, "argmax_is_label": true})
        );
        assert!(vllm.get("x_diagnostics").is_none());

        let sglang = format(&r, &d, "m", Compat::Sglang);
        assert_eq!(sglang["answers"]["team"]["x_label_mass"], json!(0.9));
        assert!(sglang["answers"]["urgent"].get("confidence").is_none());
        assert_eq!(
            sglang["usage"],
            json!({"input_tokens": 100, "output_tokens": 0})
        );
    }

    #[test]
    fn x_debias_is_parsed_and_a_bad_value_names_the_field() {
        use crate::debias::Debias;
        let body = |v: Value| json!({"state": "s", "x_debias": v, "questions": {"q": {"type": "noul", "instructions": "x"}}});
        for compat in [Compat::Typesafe, Compat::Vllm, Compat::Sglang] {
            let parsed = |v| parse(&body(v), &limits(), compat).unwrap().debias;
            assert_eq!(parsed(json!("rotate")), Some(Debias::Rotate));
            assert_eq!(parsed(json!("off")), Some(Debias::Off));
            assert_eq!(parsed(Value::Null), None);
            for bad in [json!("shuffle"), json!(true), json!(["rotate"])] {
                let Err(DecisionError::Invalid(errors)) = parse(&body(bad), &limits(), compat)
                else {
                    panic!("x_debias must be off or rotate")
                };
                assert_eq!(
                    (errors[0].param(), errors[0].kind),
                    ("x_debias".to_owned(), "literal_error")
                );
                assert!(
                    errors[0].msg.contains("'off', 'rotate'"),
                    "{}",
                    errors[0].msg
                );
            }
        }
        let absent =
            json!({"state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}});
        assert_eq!(
            parse(&absent, &limits(), Compat::Typesafe).unwrap().debias,
            None
        );
    }

    /// A debiased answer reports what it used where each profile puts its diagnostics; with the
    /// feature off nothing changes (the test above holds the off shape byte for byte).
    #[test]
    fn debiased_answers_report_orders_where_the_profile_puts_diagnostics() {
        use crate::debias::{Debias, OrderReport};
        use crate::ir::{Answer, Usage};
        let body = json!({"state": "s", "questions": {
            "team": {"type": "choice", "criteria": {"billing": null, "tech": null}},
            "urgent": {"type": "noul", "instructions": "u"}}});
        let r = parse(&body, &limits(), Compat::Typesafe).unwrap();
        let ans = |p: Vec<f64>| Answer {
            label_logprobs: p.iter().map(|x| x.ln()).collect(),
            probabilities: p,
            label_mass: 0.9,
            argmax_is_label: true,
            pooled: false,
        };
        let report = |orders, order_sensitivity| OrderReport {
            method: Debias::Rotate,
            orders,
            order_sensitivity: Some(order_sensitivity),
            prior_samples: None,
        };
        let d = Decision {
            answers: vec![ans(vec![0.6, 0.4]), ans(vec![0.3, 0.7])],
            usage: Usage::default(),
            calibration: None,
            orders: Some(vec![report(2, 0.25), report(2, 0.125)]),
        };
        let out = format(&r, &d, "m", Compat::Typesafe);
        assert_eq!(
            out["x_diagnostics"]["team"],
            json!({"label_mass": 0.9, "argmax_is_label": true, "debias": "rotate", "orders": 2, "order_sensitivity": 0.25})
        );
        assert_eq!(
            out["answers"]["urgent"],
            json!({"type": "noul", "noul": 0.3})
        );
        let vllm = format(&r, &d, "m", Compat::Vllm);
        assert_eq!(
            vllm["diagnostics"]["urgent"]["order_sensitivity"],
            json!(0.125)
        );
        let prior = Decision {
            calibration: None,
            orders: Some(vec![
                OrderReport {
                    method: Debias::Prior,
                    orders: 1,
                    order_sensitivity: None,
                    prior_samples: Some(9),
                },
                report(2, 0.125),
            ]),
            ..d.clone()
        };
        // One order read: nothing measured, so no order_sensitivity; the prior's sample count instead.
        assert_eq!(
            format(&r, &prior, "m", Compat::Typesafe)["x_diagnostics"]["team"],
            json!({"label_mass": 0.9, "argmax_is_label": true, "debias": "prior", "orders": 1, "prior_samples": 9})
        );
        let sglang = format(&r, &d, "m", Compat::Sglang);
        assert_eq!(sglang["answers"]["team"]["x_debias"], json!("rotate"));
        assert_eq!(sglang["answers"]["team"]["x_orders"], json!(2));
        assert_eq!(
            sglang["answers"]["urgent"]["x_order_sensitivity"],
            json!(0.125)
        );
    }

    /// A calibrated request's answers name their fit (or why none) beside the debias report, where
    /// each profile puts its diagnostics.
    #[test]
    fn calibrated_answers_report_their_fit_where_the_profile_puts_diagnostics() {
        use crate::ir::{Answer, CalibrationReport, Usage};
        let body = json!({"state": "s", "x_calibration": "auto", "questions": {
            "team": {"type": "choice", "criteria": {"billing": null, "tech": null}},
            "urgent": {"type": "noul", "instructions": "u"}}});
        let r = parse(&body, &limits(), Compat::Typesafe).unwrap();
        assert_eq!(r.calibration, Some(crate::ir::CalibrationChoice::Auto));
        let ans = |p: Vec<f64>| Answer {
            label_logprobs: p.iter().map(|x| x.ln()).collect(),
            probabilities: p,
            label_mass: 0.9,
            argmax_is_label: true,
            pooled: false,
        };
        let d = Decision {
            answers: vec![ans(vec![0.6, 0.4]), ans(vec![0.3, 0.7])],
            usage: Usage::default(),
            orders: None,
            calibration: Some(vec![
                CalibrationReport::Applied {
                    id: "cal-1".into(),
                    signature: "00000000000000ab".into(),
                },
                CalibrationReport::None {
                    reason: "no fit".into(),
                },
            ]),
        };
        let applied = json!({"id": "cal-1", "signature": "00000000000000ab"});
        let none = json!({"id": null, "reason": "no fit"});
        let typesafe = format(&r, &d, "m", Compat::Typesafe);
        assert_eq!(
            typesafe["x_diagnostics"]["team"],
            json!({"label_mass": 0.9, "argmax_is_label": true, "calibration": applied})
        );
        assert_eq!(typesafe["x_diagnostics"]["urgent"]["calibration"], none);
        assert!(typesafe["answers"]["team"].get("x_calibration").is_none());
        let vllm = format(&r, &d, "m", Compat::Vllm);
        assert_eq!(vllm["diagnostics"]["team"]["calibration"], applied);
        let sglang = format(&r, &d, "m", Compat::Sglang);
        assert_eq!(sglang["answers"]["team"]["x_calibration"], applied);
        assert_eq!(sglang["answers"]["urgent"]["x_calibration"], none);
    }

    /// vLLM 0.32 reads a bare noul (`instructions` defaults to "", criteria to null) and refuses only an
    /// empty id; the default profile refuses both a bare noul and a blank id, SGLang's a bare noul only.
    #[test]
    fn bare_noul_and_question_ids_per_profile() {
        let bare = json!({"state": "s", "questions": {"q": {"type": "noul"}}});
        assert!(parse(&bare, &limits(), Compat::Vllm).is_ok());
        assert!(parse(&bare, &limits(), Compat::Typesafe).is_err());
        assert!(parse(&bare, &limits(), Compat::Sglang).is_err());
        let id = |id: &str| json!({"state": "s", "questions": {id: {"type": "noul", "instructions": "x"}}});
        for (compat, empty_ok, blank_ok) in [
            (Compat::Typesafe, false, false),
            (Compat::Vllm, false, true),
            (Compat::Sglang, true, true),
        ] {
            assert_eq!(
                parse(&id(""), &limits(), compat).is_ok(),
                empty_ok,
                "{compat:?}"
            );
            assert_eq!(
                parse(&id("  "), &limits(), compat).is_ok(),
                blank_ok,
                "{compat:?}"
            );
        }
    }

    #[test]
    fn vllm_profile_refuses_more_than_26_options() {
        let options: Map<String, Value> = (0..27).map(|i| (format!("o{i}"), Value::Null)).collect();
        let body =
            json!({"state": "s", "questions": {"q": {"type": "choice", "criteria": options}}});
        assert!(parse(&body, &limits(), Compat::Typesafe).is_ok());
        assert!(parse(&body, &limits(), Compat::Sglang).is_ok());
        match parse(&body, &limits(), Compat::Vllm) {
            Err(DecisionError::Invalid(f)) => assert!(f[0].msg.contains("at most 26")),
            other => panic!("{other:?}"),
        }
    }
}
