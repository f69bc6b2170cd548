//! Wire shapes: each parses into the decision IR and formats answers and errors its own way.

pub(crate) mod fields;
pub mod openai;
pub(crate) mod openapi_examples;
pub mod score;
pub mod sglang;
pub mod systemone;

use serde_json::Value;

use crate::error::DecisionError;
use crate::profile::Shape;

/// Tells the two `/v1/decisions` shapes apart by their fields (spec/API.md §3); a request that
/// mixes them is refused with a message that says so.
pub fn decisions_shape(body: &Value) -> Result<Shape, DecisionError> {
    let mut sglang = Vec::new();
    let mut openai = Vec::new();
    if let Some(obj) = body.as_object() {
        for key in [
            "temperature",
            "prompt_format_version",
            "return_prompt_token_ids",
        ] {
            if obj.contains_key(key) {
                sglang.push(key.to_owned());
            }
        }
        for key in [
            "safety_identifier",
            "prompt_cache_key",
            "prompt_cache_options",
        ] {
            if obj.contains_key(key) {
                openai.push(key.to_owned());
            }
        }
        for q in obj
            .get("questions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(q) = q.as_object() else { continue };
            for key in ["question", "id", "options", "yes", "no"] {
                if q.contains_key(key) {
                    sglang.push(format!("questions[].{key}"));
                }
            }
            for key in ["instructions", "name", "choices"] {
                if q.contains_key(key) {
                    openai.push(format!("questions[].{key}"));
                }
            }
            match q.get("type").and_then(Value::as_str) {
                Some("yes_no") => sglang.push("type yes_no".into()),
                Some("predicate") => openai.push("type predicate".into()),
                _ => {}
            }
            if let Some(levels) = q.get("levels").and_then(Value::as_array) {
                if levels.iter().any(Value::is_string) {
                    sglang.push("string levels".into());
                }
                // OpenAI levels are `{"label": …}`; SGLang levels may be any JSON object.
                if levels
                    .iter()
                    .any(|l| l.as_object().is_some_and(|o| o.contains_key("label")))
                {
                    openai.push("{label} levels".into());
                }
            }
        }
    }
    sglang.dedup();
    openai.dedup();
    match (sglang.is_empty(), openai.is_empty()) {
        (false, false) => Err(DecisionError::BadRequest {
            param: None,
            message: format!(
                "the request mixes the SGLang shape ({}) and the OpenAI shape ({}) of /v1/decisions; use one",
                sglang.join(", "),
                openai.join(", ")
            ),
        }),
        (false, true) => Ok(Shape::Sglang),
        _ => Ok(Shape::OpenAi),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tells_shapes_apart_and_refuses_mixtures() {
        let openai = json!({"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "i"}]});
        let sglang =
            json!({"input": "x", "questions": [{"id": "a", "type": "yes_no", "question": "q"}]});
        assert_eq!(decisions_shape(&openai).unwrap(), Shape::OpenAi);
        assert_eq!(decisions_shape(&sglang).unwrap(), Shape::Sglang);
        assert_eq!(
            decisions_shape(&json!({"input": "x", "temperature": 1})).unwrap(),
            Shape::Sglang
        );
        let mixed = json!({"input": "x", "questions": [{"id": "a", "type": "predicate", "instructions": "i"}]});
        let err = decisions_shape(&mixed).unwrap_err();
        assert!(err.to_string().contains("mixes"));
        assert_eq!(err.status().as_u16(), 400);
    }
}
pub mod schema;
