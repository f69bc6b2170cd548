//! The checks the three wire shapes share (System One, OpenAI, SGLang): the body object, `model`,
//! booleans, `chat_template_kwargs`, unknown keys, question and option counts, option names. Each
//! shape calls these with its own error kinds and wording; the rules themselves live only here.

use serde_json::{Map, Value};

use crate::debias::Debias;
use crate::error::{DecisionError, FieldError, Loc};
use crate::ir::CalibrationChoice;
use crate::limits::Limits;

/// A path from the body root: `["body", …path]`.
pub(crate) fn body_loc(path: &[Loc]) -> Vec<Loc> {
    std::iter::once(Loc::from("body"))
        .chain(path.iter().cloned())
        .collect()
}

/// A field error at `path` (from the body root).
pub(crate) fn field_error(path: &[Loc], kind: &'static str, msg: impl Into<String>) -> FieldError {
    FieldError::new(body_loc(path), kind, msg)
}

/// The body as a JSON object, or the shape's validation error for anything else.
pub(crate) fn body_object<'a>(
    body: &'a Value,
    kind: &'static str,
) -> Result<&'a Map<String, Value>, DecisionError> {
    body.as_object().ok_or_else(|| {
        DecisionError::Invalid(vec![field_error(
            &[],
            kind,
            "the body must be a JSON object",
        )])
    })
}

/// Any model name is accepted and answered as the served model, except the `base:adapter` form
/// (seed 003: "a `model` that names a LoRA adapter" is a 400).
pub(crate) fn check_model_name(name: &str) -> Result<(), DecisionError> {
    if name.contains(':') {
        return Err(DecisionError::BadRequest {
            param: Some("model".into()),
            message: format!(
                "model '{name}': adapters ('base:adapter') are not supported by this server"
            ),
        });
    }
    Ok(())
}

/// `model`: absent or null is `None`, a string is checked for the adapter form, anything else is a
/// field error of `kind`.
pub(crate) fn model_name(
    obj: &Map<String, Value>,
    kind: &'static str,
    errors: &mut Vec<FieldError>,
) -> Result<Option<String>, DecisionError> {
    match obj.get("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) => {
            check_model_name(name)?;
            Ok(Some(name.clone()))
        }
        Some(_) => {
            errors.push(field_error(
                &["model".into()],
                kind,
                "model must be a string",
            ));
            Ok(None)
        }
    }
}

/// An optional boolean (`joint`, `return_prompt_token_ids`): absent or null is false.
pub(crate) fn optional_bool(
    obj: &Map<String, Value>,
    key: &str,
    kind: &'static str,
    errors: &mut Vec<FieldError>,
) -> bool {
    match obj.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errors.push(field_error(
                &[key.into()],
                kind,
                format!("{key} must be a boolean"),
            ));
            false
        }
    }
}

/// `x_debias` (`"off"` or `"rotate"`): absent or null is `None` (the server's `--debias`); anything
/// else is a field error of `kind` naming the field and the values it takes.
pub(crate) fn debias(
    obj: &Map<String, Value>,
    kind: &'static str,
    errors: &mut Vec<FieldError>,
) -> Option<Debias> {
    let value = obj.get(DEBIAS_FIELD)?;
    if value.is_null() {
        return None;
    }
    let parsed = value.as_str().and_then(Debias::from_name);
    if parsed.is_none() {
        let names: Vec<String> = Debias::ALL
            .iter()
            .map(|d| format!("'{}'", d.name()))
            .collect();
        errors.push(field_error(
            &[DEBIAS_FIELD.into()],
            kind,
            format!(
                "{DEBIAS_FIELD} must be one of {}, got {value}",
                names.join(", ")
            ),
        ));
    }
    parsed
}

/// The request field that overrides `--debias`.
pub const DEBIAS_FIELD: &str = "x_debias";

/// The request field that names a calibration (`calibration/`).
pub const CALIBRATION_FIELD: &str = crate::calibration::FIELD;

/// This server's extension fields on the decision shapes: a profile that refuses unknown fields
/// refuses these too.
pub const EXTENSIONS: [&str; 2] = [DEBIAS_FIELD, CALIBRATION_FIELD];

/// `x_calibration` (a calibration id or `"auto"`): absent or null is `None`; anything else is a
/// field error of `kind` naming the field.
pub(crate) fn calibration(
    obj: &Map<String, Value>,
    kind: &'static str,
    errors: &mut Vec<FieldError>,
) -> Option<CalibrationChoice> {
    let value = obj.get(CALIBRATION_FIELD)?;
    match value {
        Value::Null => None,
        Value::String(s) if s == "auto" => Some(CalibrationChoice::Auto),
        Value::String(s) if crate::calibration::valid_id(s) => {
            Some(CalibrationChoice::Id(s.clone()))
        }
        _ => {
            errors.push(field_error(
                &[CALIBRATION_FIELD.into()],
                kind,
                format!(
                    "{CALIBRATION_FIELD} must be a calibration id (1-128 of A-Z a-z 0-9 _ -, as POST /v1/calibrations answers it) or 'auto', got {value}"
                ),
            ));
            None
        }
    }
}

/// `chat_template_kwargs`: absent or null is empty; anything but an object is a field error of `kind`.
pub(crate) fn template_kwargs(
    obj: &Map<String, Value>,
    kind: &'static str,
    errors: &mut Vec<FieldError>,
) -> Map<String, Value> {
    match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            errors.push(field_error(
                &["chat_template_kwargs".into()],
                kind,
                "chat_template_kwargs must be an object",
            ));
            Map::new()
        }
    }
}

/// Every key of `obj` outside `allowed`, as an error of `kind` at `at.key` with the shape's message.
pub(crate) fn unknown_keys(
    obj: &Map<String, Value>,
    allowed: &[&str],
    at: &[Loc],
    kind: &'static str,
    message: impl Fn(&str) -> String,
    errors: &mut Vec<FieldError>,
) {
    for key in obj.keys().filter(|k| !allowed.contains(&k.as_str())) {
        let mut path = at.to_vec();
        path.push(Loc::from(key.as_str()));
        errors.push(field_error(&path, kind, message(key)));
    }
}

/// The question count against the limit, for a list or a map of questions; false after an error.
pub(crate) fn question_count(count: usize, limits: &Limits, errors: &mut Vec<FieldError>) -> bool {
    let loc = [Loc::from("questions")];
    if count == 0 {
        errors.push(field_error(
            &loc,
            "too_short",
            "questions must hold at least one question",
        ));
        return false;
    }
    if count > limits.max_questions {
        errors.push(field_error(
            &loc,
            "too_long",
            format!(
                "at most {} questions per request (max_questions), got {count}",
                limits.max_questions
            ),
        ));
        return false;
    }
    true
}

/// The `questions` list of the list-shaped requests, within the question limit; `None` after a field error.
pub(crate) fn question_items<'a>(
    obj: &'a Map<String, Value>,
    limits: &Limits,
    type_kind: &'static str,
    errors: &mut Vec<FieldError>,
) -> Option<&'a Vec<Value>> {
    let loc = [Loc::from("questions")];
    match obj.get("questions") {
        Some(Value::Array(items)) => question_count(items.len(), limits, errors).then_some(items),
        None => {
            errors.push(field_error(&loc, "missing", "questions is required"));
            None
        }
        Some(_) => {
            errors.push(field_error(&loc, type_kind, "questions must be a list"));
            None
        }
    }
}

/// Control characters and everything Python's `str.splitlines` breaks on (U+2028, U+2029 included;
/// U+0085 and the other C0/C1 codes are controls).
pub(crate) fn is_line_break_or_control(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// How option names are compared: trimmed and case-folded (Unicode full case folding, as Python's
/// `str.casefold`: `Straße` and `STRASSE` are the same name).
pub(crate) fn folded(name: &str) -> String {
    caseless::default_case_fold_str(name.trim())
}

/// Why an option name cannot be used (seed 003, on both of its routes): blank, with control or
/// line-break characters, or the same as an earlier one (`earlier` holds the earlier names folded).
pub(crate) fn option_name_problem(name: &str, earlier: &[(String, &str)]) -> Option<String> {
    if name.trim().is_empty() {
        return Some("the name is blank".into());
    }
    if name.chars().any(is_line_break_or_control) {
        return Some(format!(
            "the name {name:?} contains a control or line-break character"
        ));
    }
    let folded = folded(name);
    earlier
        .iter()
        .find(|(f, _)| *f == folded)
        .map(|(_, first)| {
            format!(
                "the name {name:?} repeats {first:?} (names are compared trimmed and case-folded)"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn option_names_fold_like_python_casefold() {
        let earlier = vec![(folded("Straße"), "Straße")];
        // Bug fixed: the SGLang shape compared lower-cased names, so these two were kept apart.
        assert!(option_name_problem(" STRASSE ", &earlier)
            .unwrap()
            .contains("repeats \"Straße\""));
        assert!(option_name_problem("a\u{85}b", &[]).is_some());
        assert!(option_name_problem("a\u{2028}b", &[]).is_some());
        assert_eq!(
            option_name_problem("  ", &[]).as_deref(),
            Some("the name is blank")
        );
        assert_eq!(option_name_problem("Strasse-2", &earlier), None);
    }

    #[test]
    fn counts_and_keys() {
        let limits = Limits {
            max_questions: 2,
            ..Limits::default()
        };
        let mut errors = Vec::new();
        assert!(question_count(2, &limits, &mut errors));
        assert!(!question_count(3, &limits, &mut errors));
        assert!(!question_count(0, &limits, &mut errors));
        assert_eq!(
            errors.iter().map(|e| e.kind).collect::<Vec<_>>(),
            ["too_long", "too_short"]
        );
        let obj = json!({"a": 1, "b": 2}).as_object().unwrap().clone();
        let mut errors = Vec::new();
        unknown_keys(
            &obj,
            &["a"],
            &["q".into()],
            "extra_forbidden",
            |k| format!("no {k}"),
            &mut errors,
        );
        assert_eq!(
            (errors[0].param(), errors[0].msg.as_str()),
            ("q.b".to_owned(), "no b")
        );
    }
}
