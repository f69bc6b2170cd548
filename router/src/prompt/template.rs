//! The model's own chat template, rendered with minijinja so that the text equals what Python's
//! `tokenizer.apply_chat_template` (jinja2, trim_blocks + lstrip_blocks, loop controls) renders.

use std::path::Path;

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;
use serde_json::Map;

use crate::json_text;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the model folder has no chat template (chat_template.jinja or tokenizer_config.json 'chat_template')")]
    Missing,
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("chat template: {0}")]
    Render(String),
}

#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: Content,
}

/// A message's content as chat templates take it: a string, or a list of parts when media come with
/// the text (`[{"type": "image"}, …, {"type": "text", "text": …}]`, as transformers passes them).
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Part {
    Image,
    Audio,
    Video,
    Text { text: String },
}

impl Content {
    /// The text of the content (the text parts joined), for tests and messages.
    pub fn text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect(),
        }
    }
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Message {
            role: role.to_owned(),
            content: Content::Text(content.into()),
        }
    }

    /// A message whose media placeholders (`parts`, in order) come before its text.
    pub fn with_media(role: &str, parts: Vec<Part>, text: String) -> Self {
        if parts.is_empty() {
            return Message::new(role, text);
        }
        let mut parts = parts;
        parts.push(Part::Text { text });
        Message {
            role: role.to_owned(),
            content: Content::Parts(parts),
        }
    }
}

/// A compiled chat template plus the special-token strings transformers passes to it.
pub struct ChatTemplate {
    env: Environment<'static>,
    special_tokens: Map<String, serde_json::Value>,
}

impl ChatTemplate {
    /// Loads the template the way transformers does: `chat_template.jinja` first, then
    /// `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates: "default").
    pub fn from_model_dir(dir: &Path) -> Result<Self, TemplateError> {
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_default();
        let jinja_path = dir.join("chat_template.jinja");
        let source = if jinja_path.is_file() {
            std::fs::read_to_string(&jinja_path).map_err(|source| TemplateError::Io {
                path: jinja_path.display().to_string(),
                source,
            })?
        } else {
            match config.get("chat_template") {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .or_else(|| named.first())
                    .and_then(|t| t.get("template"))
                    .and_then(|t| t.as_str())
                    .ok_or(TemplateError::Missing)?
                    .to_owned(),
                _ => return Err(TemplateError::Missing),
            }
        };
        let mut special_tokens = Map::new();
        for (key, value) in &config {
            if key.ends_with("_token") {
                // Tokens are stored either as strings or as {"content": "..."} objects.
                let text = match value {
                    serde_json::Value::String(s) => Some(s.clone()),
                    serde_json::Value::Object(o) => {
                        o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
                    }
                    _ => None,
                };
                if let Some(text) = text {
                    special_tokens.insert(key.clone(), serde_json::Value::String(text));
                }
            }
        }
        Self::new(source, special_tokens)
    }

    pub fn new(
        source: String,
        special_tokens: Map<String, serde_json::Value>,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |format: String| {
            chrono::Local::now().format(&format).to_string()
        });
        // transformers' tojson is json.dumps(ensure_ascii=False), not minijinja's HTML-safe one.
        env.add_filter(
            "tojson",
            |value: Value| -> Result<String, minijinja::Error> {
                let json = serde_json::to_value(&value).map_err(|e| {
                    minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string())
                })?;
                Ok(json_text::dumps(&json, json_text::Separators::Default))
            },
        );
        env.add_template_owned("chat", source)
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            special_tokens,
        })
    }

    /// Renders `messages` with `add_generation_prompt`, plus the caller's template variables.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        kwargs: &Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let mut ctx = self.special_tokens.clone();
        for (k, v) in kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).unwrap_or_default(),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            serde_json::Value::Bool(add_generation_prompt),
        );
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| TemplateError::Render(e.to_string()))
    }
}

fn read_json(path: &Path) -> Result<Option<Map<String, serde_json::Value>>, TemplateError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| TemplateError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| TemplateError::Json {
            path: path.display().to_string(),
            source,
        })?;
    Ok(value.as_object().cloned())
}

#[cfg(test)]
mod tests {
    //! Goldens rendered by Python's transformers (`router/tests/goldens/generate.py`).
    use super::*;

    #[derive(serde::Deserialize)]
    struct Case {
        template: String,
        messages: Vec<Message>,
        kwargs: Map<String, serde_json::Value>,
        add_generation_prompt: bool,
        expected: String,
    }

    #[derive(serde::Deserialize)]
    struct Goldens {
        templates: std::collections::BTreeMap<String, TemplateFixture>,
        cases: Vec<Case>,
    }

    #[derive(serde::Deserialize)]
    struct TemplateFixture {
        source: String,
        special_tokens: Map<String, serde_json::Value>,
    }

    #[test]
    fn renders_exactly_like_transformers() {
        let text = include_str!("../../tests/goldens/chat_templates.json");
        let goldens: Goldens = serde_json::from_str(text).expect("goldens parse");
        assert!(goldens.cases.len() >= 10);
        for (i, case) in goldens.cases.iter().enumerate() {
            let fixture = &goldens.templates[&case.template];
            let template =
                ChatTemplate::new(fixture.source.clone(), fixture.special_tokens.clone())
                    .expect("compiles");
            let got = template
                .render(&case.messages, case.add_generation_prompt, &case.kwargs)
                .expect("renders");
            assert_eq!(got, case.expected, "case {i} ({}) differs", case.template);
        }
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}".into(), Map::new())
            .unwrap();
        let err = t.render(&[], true, &Map::new()).unwrap_err();
        assert!(err.to_string().contains("no system role"));
    }

    #[test]
    fn missing_template_is_reported() {
        let dir = std::env::temp_dir().join(format!("no-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
        assert!(matches!(
            ChatTemplate::from_model_dir(&dir),
            Err(TemplateError::Missing)
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
