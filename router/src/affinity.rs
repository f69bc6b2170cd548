//! The state-affinity key: a stable name for what a request's prompts share and the shards' prefix
//! cache keeps (the cache salt, the instructions, the media and the state, as the prompt renders them).
//! Every decision response carries it as `x-decision-affinity`, so a consistent-hash balancer that hashes
//! on it sends the later questions about one state to the replica that holds its keys/values, without
//! parsing a body. Its recipe is public (docs/deploy.md) so a client can compute it before its first request.

use serde_json::{json, Value};

use crate::ir::DecisionRequest;
use crate::json_text::{self, Separators};

/// The response header (and the request header a balancer hashes on).
pub const HEADER: &str = "x-decision-affinity";

/// The recipe's version, the first item of the hashed document: a changed recipe changes every key.
const VERSION: &str = "decision-affinity/1";

/// The key of `request`'s state prefix: the first 16 bytes of the SHA-256 of the compact JSON
/// (Python's `json.dumps(doc, ensure_ascii=False, separators=(",", ":"))`) of
/// `[VERSION, cache_salt, instructions or null, state text, images, audio, videos]`, as 32 hex digits.
/// The state text is the state as the prompt holds it: a string as is, any other JSON value in compact
/// JSON. The questions are not in it: every question about one state gets the same key.
pub fn key(request: &DecisionRequest) -> String {
    let document = json!([
        VERSION,
        request.cache_salt,
        request.instructions,
        json_text::text_or_json(&request.state, Separators::Compact),
        request.media.images,
        request.media.audio,
        request.media.videos,
    ]);
    digest(&document)
}

fn digest(document: &Value) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(json_text::dumps(document, Separators::Compact).as_bytes());
    hash[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Media, Question, QuestionKind};
    use crate::question_kind::Kind;

    fn request(state: Value, salt: &str, question: &str) -> DecisionRequest {
        DecisionRequest {
            state,
            instructions: None,
            questions: vec![Question {
                id: question.into(),
                instructions: Some(format!("{question}?")),
                kind: QuestionKind::probe(Kind::YesNo),
            }],
            chat_template_kwargs: Default::default(),
            cache_salt: salt.into(),
            media: Media::default(),
            joint: false,
            debias: None,
            calibration: None,
        }
    }

    #[test]
    fn the_questions_about_one_state_share_a_key_and_anything_in_the_prefix_changes_it() {
        let state = json!({"ticket": "Refund not received", "days": 12});
        let base = key(&request(state.clone(), "", "urgent"));
        assert_eq!(base.len(), 32);
        assert!(base.bytes().all(|b| b.is_ascii_hexdigit()));
        // Another question, same state: same key (the balancer co-locates them).
        assert_eq!(key(&request(state.clone(), "", "angry")), base);
        // Another salt, another state, other instructions, media: other keys.
        assert_ne!(key(&request(state.clone(), "tenant-a", "urgent")), base);
        assert_ne!(
            key(&request(json!({"ticket": "Refund received"}), "", "urgent")),
            base
        );
        let mut instructed = request(state.clone(), "", "urgent");
        instructed.instructions = Some("You route a support inbox.".into());
        assert_ne!(key(&instructed), base);
        let mut pictured = request(state.clone(), "", "urgent");
        pictured
            .media
            .images
            .push("data:image/png;base64,AAAA".into());
        assert_ne!(key(&pictured), base);
        // The salt and the instructions are not mixed up with each other.
        let mut a = request(json!("s"), "x", "q");
        let mut b = request(json!("s"), "", "q");
        a.instructions = None;
        b.instructions = Some("x".into());
        assert_ne!(key(&a), key(&b));
    }

    /// The recipe is public: these are the values Python's
    /// `hashlib.sha256(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()[:32]`
    /// gives (docs/deploy.md shows the function), so a client computes the same key.
    #[test]
    fn the_key_is_the_documented_recipe() {
        assert_eq!(
            key(&request(json!("Refund not received"), "", "q")),
            PYTHON_STRING_STATE
        );
        assert_eq!(
            key(&request(
                json!({"ticket": "Remboursé ?", "days": 12}),
                "t1",
                "q"
            )),
            PYTHON_JSON_STATE
        );
    }

    const PYTHON_STRING_STATE: &str = "2c1ce3968f8cf9f34cbdeed0c3db9985";
    const PYTHON_JSON_STATE: &str = "85780cdb1114ba69867d39d20efab1b7";
}
