//! What every chat-template strategy shares: the model's tokenizer and chat template, the startup label
//! check, rendering with thinking off, and the checks every encoded prompt must pass before it is read.

use std::path::Path;

use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use super::encode::PromptEncoder;
use super::labels::LabelVocabulary;
use super::load_error::LoadError;
use super::template::{ChatTemplate, Message, Part};
use super::token_bound::TokenBound;
use crate::error::DecisionError;
use crate::ir::{Media, Modality};
use crate::read::LabelGroup;

pub struct ChatPrompts {
    encoder: PromptEncoder,
    template: ChatTemplate,
    /// The label sets checked at startup against the template's reply prefix.
    pub labels: LabelVocabulary,
    max_positions: usize,
    /// A cheap lower bound on a prompt's tokens (None when none is sound for this tokenizer).
    bound: Option<TokenBound>,
}

impl ChatPrompts {
    pub fn load(model_dir: &Path, max_positions: usize) -> Result<Self, LoadError> {
        let tokenizer_path = model_dir.join("tokenizer.json");
        let tokenizer =
            Tokenizer::from_file(&tokenizer_path).map_err(|e| LoadError::Tokenizer {
                path: tokenizer_path.clone(),
                message: e.to_string(),
            })?;
        let template = ChatTemplate::from_model_dir(model_dir)?;
        let labels = LabelVocabulary::check(&tokenizer, &template, &thinking_off(&Map::new()))?;
        let bound = TokenBound::of(&tokenizer);
        match &bound {
            Some(b) => tracing::info!(
                chars_per_token = b.chars_per_token(),
                "prompts that certainly exceed max_input_tokens are refused before tokenizing"
            ),
            None => tracing::warn!("no sound token bound for this tokenizer: every prompt is tokenized before the token limit is checked"),
        }
        let encoder = PromptEncoder::new(tokenizer);
        if !encoder.shares_heads() {
            tracing::info!("this tokenizer is encoded in full per question (no shared-head cut is proven safe for it)");
        }
        if !encoder.encodes_pieces() {
            tracing::info!("prompts are encoded whole, not word by word (pieces are not proven independent for this tokenizer)");
        }
        Ok(ChatPrompts {
            encoder,
            template,
            labels,
            max_positions,
            bound,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.encoder.tokenizer()
    }

    /// The conversation of one question: request-level instructions as a system message (when the
    /// strategy's wording has one), else leading the user message; the media placeholders come first
    /// in the user message, before the state.
    pub fn messages(
        instructions: Option<&str>,
        system_message: bool,
        media: &[Part],
        user: String,
    ) -> Vec<Message> {
        let user_message = |text: String| Message::with_media("user", media.to_vec(), text);
        match instructions {
            Some(instructions) if system_message => {
                vec![Message::new("system", instructions), user_message(user)]
            }
            Some(instructions) => vec![user_message(format!("{instructions}\n\n{user}"))],
            None => vec![user_message(user)],
        }
    }

    /// One placeholder part per media item, in the order the read carries them: images, audio, videos.
    pub fn media_parts(media: &Media) -> Vec<Part> {
        Modality::ALL
            .into_iter()
            .flat_map(|m| {
                let part = match m {
                    Modality::Image => Part::Image,
                    Modality::Audio => Part::Audio,
                    Modality::Video => Part::Video,
                };
                std::iter::repeat_n(part, media.of(m).len())
            })
            .collect()
    }

    /// The prompt text of one conversation, reply prefix last, thinking off.
    pub fn render(
        &self,
        messages: &[Message],
        kwargs: &Map<String, Value>,
    ) -> Result<String, DecisionError> {
        let text = self.template.render(messages, true, kwargs).map_err(|e| {
            DecisionError::BadRequest {
                param: Some("chat_template_kwargs".into()),
                message: e.to_string(),
            }
        })?;
        if leaves_reasoning_open(&text) {
            return Err(DecisionError::BadRequest {
                param: Some("chat_template_kwargs".into()),
                message: "the rendered prompt leaves a reasoning block open; a read is the reply's first token, so thinking must be off".into(),
            });
        }
        Ok(text)
    }

    /// The token ids of each prompt. A request's unique prompt tokens are at least those of its
    /// longest prompt, so one whose lower bound already exceeds `max_input_tokens` is refused
    /// without tokenizing anything (an 8 MiB word would cost seconds and hundreds of MiB).
    pub fn encode_all(
        &self,
        texts: &[String],
        max_input_tokens: usize,
    ) -> Result<Vec<Vec<u32>>, DecisionError> {
        if let Some(bound) = &self.bound {
            let at_least = texts
                .iter()
                .map(|t| bound.tokens_at_least(t))
                .max()
                .unwrap_or(0);
            if at_least > max_input_tokens {
                return Err(DecisionError::TokensExceeded {
                    got: at_least,
                    limit: max_input_tokens,
                });
            }
        }
        self.encoder
            .encode_all(texts)
            .map_err(|e| DecisionError::Internal(format!("tokenizer: {e}")))
    }

    /// The labels were checked after the template's reply prefix, so the prompt must end with it; and
    /// the prompt plus its longest label must fit the model.
    pub fn check_prompt(
        &self,
        question: &str,
        token_ids: &[u32],
        labels: &[LabelGroup],
    ) -> Result<(), DecisionError> {
        if !token_ids.ends_with(&self.labels.tail) {
            return Err(DecisionError::Internal(format!(
                "question '{question}': the rendered prompt does not end with the chat template's reply prefix"
            )));
        }
        let longest_label = labels
            .iter()
            .flat_map(|g| g.variants.iter().map(Vec::len))
            .max()
            .unwrap_or(1);
        if token_ids.len() + longest_label > self.max_positions {
            return Err(DecisionError::PromptTooLong {
                question: question.to_owned(),
                got: token_ids.len(),
                limit: self.max_positions,
            });
        }
        Ok(())
    }
}

/// The caller's template variables with thinking forced off; thinking on is refused.
pub fn checked_kwargs(kwargs: &Map<String, Value>) -> Result<Map<String, Value>, DecisionError> {
    match kwargs.get("enable_thinking") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(thinking_off(kwargs)),
        Some(_) => Err(DecisionError::ThinkingOn),
    }
}

fn thinking_off(kwargs: &Map<String, Value>) -> Map<String, Value> {
    let mut kwargs = kwargs.clone();
    kwargs.insert("enable_thinking".into(), Value::Bool(false));
    kwargs
}

/// True when the last `<think>` comes after the last `</think>`.
fn leaves_reasoning_open(text: &str) -> bool {
    match (text.rfind("<think>"), text.rfind("</think>")) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_block_detection() {
        assert!(!leaves_reasoning_open(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(leaves_reasoning_open("<|im_start|>assistant\n<think>\n"));
        assert!(!leaves_reasoning_open("plain"));
    }

    #[test]
    fn thinking_on_is_refused_and_off_is_forced() {
        let mut on = Map::new();
        on.insert("enable_thinking".into(), Value::Bool(true));
        assert!(matches!(
            checked_kwargs(&on),
            Err(DecisionError::ThinkingOn)
        ));
        let mut text = Map::new();
        text.insert("enable_thinking".into(), Value::String("yes".into()));
        assert!(matches!(
            checked_kwargs(&text),
            Err(DecisionError::ThinkingOn)
        ));
        let off = checked_kwargs(&Map::new()).unwrap();
        assert_eq!(off.get("enable_thinking"), Some(&Value::Bool(false)));
    }

    #[test]
    fn instructions_are_a_system_message_or_lead_the_user_message() {
        let system = ChatPrompts::messages(Some("ctx"), true, &[], "q".into());
        assert_eq!(
            (
                system.len(),
                system[0].role.as_str(),
                system[1].content.text()
            ),
            (2, "system", "q".to_owned())
        );
        let leading = ChatPrompts::messages(Some("ctx"), false, &[], "q".into());
        assert_eq!(
            (leading.len(), leading[0].content.text()),
            (1, "ctx\n\nq".to_owned())
        );
        assert_eq!(ChatPrompts::messages(None, true, &[], "q".into()).len(), 1);
    }

    #[test]
    fn media_placeholders_lead_the_user_message_in_field_order() {
        use crate::prompt::template::Content;
        let media = Media {
            images: vec!["a".into(), "b".into()],
            audio: vec![],
            videos: vec!["v".into()],
            ..Media::default()
        };
        let parts = ChatPrompts::media_parts(&media);
        assert_eq!(parts, vec![Part::Image, Part::Image, Part::Video]);
        let messages = ChatPrompts::messages(Some("ctx"), true, &parts, "state".into());
        assert_eq!(messages[0].content, Content::Text("ctx".into()));
        let expected = serde_json::json!([
            {"type": "image"}, {"type": "image"}, {"type": "video"}, {"type": "text", "text": "state"}
        ]);
        assert_eq!(
            serde_json::to_value(&messages[1].content).unwrap(),
            expected
        );
    }
}
