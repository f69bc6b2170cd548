//! A cheap lower bound on a text's token count, so that a prompt which certainly exceeds the token
//! limit is refused before the tokenizer spends seconds and hundreds of MiB on it (an 8 MiB word).
//!
//! A token stands for at most as many characters of normalized text as its vocabulary string is long
//! (byte-level BPE writes one character per byte; `▁`, `##` and `<0x..>` only make the string longer),
//! so a text of C characters has at least ceil(C / (longest token × shrink)) tokens, where `shrink` is
//! how many characters the normalizer may fold into one. The bound holds only when no step can drop
//! text or fold an unbounded run into one token; for tokenizers where one can (whitespace-splitting or
//! `Removed` pre-tokenizers, stripping normalizers, fused unknown tokens) there is no bound and the
//! text is tokenized as before.

use serde_json::Value;
use tokenizers::Tokenizer;

/// The most code points canonical composition folds into one (α + three marks = U+1F87).
const NFC_SHRINK: usize = 4;

#[derive(Clone, Debug, PartialEq)]
pub struct TokenBound {
    /// Characters of the caller's text one token may stand for at most.
    chars_per_token: usize,
    /// How many characters the normalizer may fold into one (none in a text already in NFC).
    shrink: usize,
    /// Byte-level BPE: for each byte, 1 / the longest token (in bytes) containing it. A token of k
    /// bytes has k bytes each contributing at most 1/k, so the sum over a text's bytes never
    /// exceeds its token count — much tighter than the longest token overall (Qwen's is 128
    /// spaces; no token of letters is near that long).
    per_byte: Option<Box<[f64; 256]>>,
}

impl TokenBound {
    /// The bound for a tokenizer, or None when none is sound for it.
    pub fn of(tokenizer: &Tokenizer) -> Option<Self> {
        let json = |v: Option<Value>| v.unwrap_or(Value::Null);
        let normalizer = json(
            tokenizer
                .get_normalizer()
                .and_then(|n| serde_json::to_value(n).ok()),
        );
        let pre_tokenizer = json(
            tokenizer
                .get_pre_tokenizer()
                .and_then(|p| serde_json::to_value(p).ok()),
        );
        let model = serde_json::to_value(tokenizer.get_model()).ok()?;
        let shrink = normalizer_shrink(&normalizer)?;
        if !keeps_every_character(&pre_tokenizer) || !model_is_bounded(&model) {
            return None;
        }
        let mut longest = tokenizer
            .get_vocab(true)
            .keys()
            .map(|t| t.chars().count())
            .max()?;
        if model["type"] == "WordPiece" {
            // A word longer than this is one unknown token.
            longest = longest.max(model["max_input_chars_per_word"].as_u64()? as usize);
        }
        let byte_level = uses_byte_level(&pre_tokenizer);
        let per_byte = byte_level.then(|| per_byte_weights(tokenizer));
        Some(TokenBound {
            chars_per_token: longest.max(1).checked_mul(shrink)?,
            shrink,
            per_byte,
        })
    }

    pub fn chars_per_token(&self) -> usize {
        self.chars_per_token
    }

    /// At least this many tokens encode `text` (linear in its length, allocates nothing).
    pub fn tokens_at_least(&self, text: &str) -> usize {
        let by_chars = text.chars().count().div_ceil(self.chars_per_token);
        let nfc = self.shrink == 1
            || unicode_normalization::is_nfc_quick(text.chars())
                == unicode_normalization::IsNormalized::Yes;
        match &self.per_byte {
            Some(weights) if nfc => {
                let sum: f64 = text.bytes().map(|b| weights[b as usize]).sum();
                // Rounding over millions of additions is far below this margin.
                by_chars.max((sum * (1.0 - 1e-9)).floor() as usize)
            }
            _ => by_chars,
        }
    }
}

/// GPT-2's byte-to-character table, reversed: the byte each vocabulary character stands for.
fn byte_of_char() -> std::collections::HashMap<char, u8> {
    let mut map = std::collections::HashMap::new();
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        map.insert(c, b);
    }
    map
}

fn per_byte_weights(tokenizer: &Tokenizer) -> Box<[f64; 256]> {
    let bytes = byte_of_char();
    let mut longest = [1usize; 256];
    let mut note = |token: &[u8]| {
        for &b in token {
            longest[b as usize] = longest[b as usize].max(token.len());
        }
    };
    for token in tokenizer.get_vocab(false).keys() {
        // A string with a character outside the byte alphabet never matches a byte-level text.
        if let Some(token) = token
            .chars()
            .map(|c| bytes.get(&c).copied())
            .collect::<Option<Vec<u8>>>()
        {
            note(&token);
        }
    }
    // Added tokens are matched in the raw text, before the byte-level step.
    for added in tokenizer.get_added_tokens_decoder().values() {
        note(added.content.as_bytes());
    }
    Box::new(longest.map(|l| 1.0 / l as f64))
}

fn uses_byte_level(pre_tokenizer: &Value) -> bool {
    match pre_tokenizer["type"].as_str() {
        Some("ByteLevel") => true,
        Some("Sequence") => pre_tokenizer["pretokenizers"]
            .as_array()
            .is_some_and(|all| all.iter().any(uses_byte_level)),
        _ => false,
    }
}

/// How many characters the normalizer may fold into one; None when it may drop text.
fn normalizer_shrink(normalizer: &Value) -> Option<usize> {
    if normalizer.is_null() {
        return Some(1);
    }
    match normalizer["type"].as_str()? {
        "NFD" | "NFKD" | "Lowercase" | "Prepend" | "ByteLevel" => Some(1),
        "NFC" | "NFKC" => Some(NFC_SHRINK),
        "Replace" => {
            let pattern = normalizer["pattern"]["String"].as_str()?.chars().count();
            let content = normalizer["content"].as_str()?.chars().count();
            (content > 0).then(|| pattern.div_ceil(content).max(1))
        }
        "Sequence" => normalizer["normalizers"]
            .as_array()?
            .iter()
            .try_fold(1usize, |acc, n| acc.checked_mul(normalizer_shrink(n)?)),
        _ => None,
    }
}

/// True when pre-tokenizing drops no character (splitting on whitespace, or `Removed`, does).
fn keeps_every_character(pre_tokenizer: &Value) -> bool {
    if pre_tokenizer.is_null() {
        return true;
    }
    match pre_tokenizer["type"].as_str() {
        Some("ByteLevel" | "Metaspace" | "Punctuation" | "Digits" | "UnicodeScripts")
        | Some("FixedLength") => true,
        Some("Split") => pre_tokenizer["behavior"] != "Removed",
        Some("Sequence") => pre_tokenizer["pretokenizers"]
            .as_array()
            .is_some_and(|all| all.iter().all(keeps_every_character)),
        _ => false,
    }
}

/// False when one token may stand for an unbounded run (fused unknowns, a whole unknown word).
fn model_is_bounded(model: &Value) -> bool {
    let byte_fallback = model["byte_fallback"].as_bool().unwrap_or(false);
    match model["type"].as_str() {
        Some("BPE") => {
            byte_fallback || model["unk_token"].is_null() || model["fuse_unk"] != Value::Bool(true)
        }
        Some("WordPiece") => true,
        Some("Unigram") => byte_fallback,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn steps_that_may_drop_text_give_no_bound() {
        assert_eq!(normalizer_shrink(&Value::Null), Some(1));
        assert_eq!(normalizer_shrink(&json!({"type": "NFC"})), Some(4));
        assert_eq!(
            normalizer_shrink(&json!({"type": "Sequence", "normalizers": [
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}, {"type": "NFKC"}]})),
            Some(4)
        );
        assert_eq!(
            normalizer_shrink(
                &json!({"type": "Replace", "pattern": {"String": " "}, "content": ""})
            ),
            None
        );
        assert_eq!(normalizer_shrink(&json!({"type": "BertNormalizer"})), None);
        assert!(keeps_every_character(
            &json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "behavior": "Isolated"}, {"type": "ByteLevel"}]})
        ));
        assert!(!keeps_every_character(&json!({"type": "Whitespace"})));
        assert!(!keeps_every_character(
            &json!({"type": "Split", "behavior": "Removed"})
        ));
        assert!(!model_is_bounded(
            &json!({"type": "BPE", "unk_token": "<unk>", "fuse_unk": true})
        ));
        assert!(model_is_bounded(
            &json!({"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true})
        ));
    }

    /// The bound never exceeds a real count, on every fixture's tokenizer and hostile texts.
    #[test]
    fn the_bound_is_below_the_real_count_on_the_fixtures() {
        let texts = [
            "x".repeat(5000),
            "hello world ".repeat(300),
            " ".repeat(3000),
            "\n".repeat(3000),
            "ᾇ".repeat(500),
            "\u{3b1}\u{314}\u{342}\u{345}".repeat(500),
            "<|im_start|>".repeat(200),
            "😀".repeat(700),
            "0123456789".repeat(300),
            "x y\n\t=-".repeat(700),
            "é".repeat(900),
            "e\u{301}".repeat(900),
        ];
        for name in [
            "SmolLM2-135M-Instruct",
            "tiny-qwen3",
            "tiny-gemma4",
            "tiny-lfm2-vl",
        ] {
            let dir = crate::prompt::fixture_dir(name);
            let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
            let bound = TokenBound::of(&tokenizer).unwrap_or_else(|| panic!("{name}: no bound"));
            for text in &texts {
                let real = tokenizer.encode(text.as_str(), false).unwrap().len();
                assert!(
                    bound.tokens_at_least(text) <= real,
                    "{name}: bound {} > real {real} on {:?}…",
                    bound.tokens_at_least(text),
                    text.chars().take(4).collect::<String>()
                );
            }
        }
    }
}
