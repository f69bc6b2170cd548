//! Tokenizing a request's prompts. They share a long head (chat template, instructions, state) and
//! differ in each question's body; tokenizing the head once per request instead of once per
//! question is most of the router's own time on long states (8 questions over a 512-token state:
//! 6.3 ms of full encodes).
//!
//! The head's ids are reused only where that is provably what a full encode gives: the cut sits at
//! the start of a line that begins with an ASCII letter or digit in every prompt. With a byte-level
//! BPE whose pre-tokenizer regex never joins a newline with what follows it (GPT-2's and Qwen's
//! patterns), and a normalizer that is absent or NFC, no pre-token crosses such a point and nothing
//! before it depends on what comes after, so the ids before the cut are the same for every prompt
//! and the ids after it are those of the suffix encoded alone. Other tokenizers, or one that fails
//! the self-check at load, are encoded in full.

use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::Tokenizer;

pub struct PromptEncoder {
    tokenizer: Tokenizer,
    shared_heads: bool,
}

impl PromptEncoder {
    pub fn new(tokenizer: Tokenizer) -> Self {
        let mut encoder = PromptEncoder {
            tokenizer,
            shared_heads: false,
        };
        encoder.shared_heads = splits_at_line_starts(&encoder.tokenizer) && encoder.self_check();
        encoder
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Whether prompts of one request share the tokenization of their common head.
    pub fn shares_heads(&self) -> bool {
        self.shared_heads
    }

    /// The ids of each text, exactly as encoding each alone (no special tokens added) gives them.
    pub fn encode_all(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, String> {
        let cut = if self.shared_heads {
            shared_cut(texts)
        } else {
            None
        };
        self.encode_with_cut(texts, cut)
    }

    /// Encodes `texts`, reusing the first one's ids before `cut` for the others when it is given.
    fn encode_with_cut(
        &self,
        texts: &[String],
        cut: Option<usize>,
    ) -> Result<Vec<Vec<u32>>, String> {
        let Some(cut) = cut else {
            return texts.iter().map(|text| self.encode(text)).collect();
        };
        let first = self
            .tokenizer
            .encode(texts[0].as_str(), false)
            .map_err(|e| e.to_string())?;
        // The head's ids are those of the first prompt's tokens that end by the cut; the next token
        // must start right at it (else the cut is inside a token: encode everything in full).
        let offsets = first.get_offsets();
        let head = offsets.partition_point(|&(_, end)| end <= cut);
        if offsets.get(head).is_none_or(|&(start, _)| start != cut) {
            return texts.iter().map(|text| self.encode(text)).collect();
        }
        let head_ids = &first.get_ids()[..head];
        let mut all = Vec::with_capacity(texts.len());
        all.push(first.get_ids().to_vec());
        for text in &texts[1..] {
            let mut ids = head_ids.to_vec();
            ids.extend(self.encode(&text[cut..])?);
            all.push(ids);
        }
        Ok(all)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// Both ways on prompts built to stress the cut (unicode, JSON, digits, spaces and blank lines
    /// around it); any difference turns shared heads off for this tokenizer.
    fn self_check(&self) -> bool {
        let heads = [
            "<|im_start|>user\nThe invoice total is wrong.  Refund   late\n\n",
            "{\"ticket\": \"Straße – 12 €\", \"days\": 12, \"n\": 1e-07}\n\n",
            "line one\n \nline\t two\r\n\n\n",
            "日本語のテキスト。\n絵文字 😀 and ' quotes 's\n\n",
        ];
        let bodies = [
            "Question: Which team?\nA: billing\nB: tech\nAnswer with the letter of one option only.<|im_end|>\n",
            "yes: it is\nno\nAnswer with yes or no only.",
            "0: low\n1: high\nAnswer with the number of one level only.\n\n",
            "Question:  spaced \n\nA: x",
        ];
        heads.iter().all(|head| {
            let texts: Vec<String> = bodies.iter().map(|body| format!("{head}{body}")).collect();
            let full: Result<Vec<Vec<u32>>, String> =
                texts.iter().map(|text| self.encode(text)).collect();
            let shared = self.encode_with_cut(&texts, shared_cut(&texts));
            matches!((full, shared), (Ok(a), Ok(b)) if a == b)
        })
    }
}

/// Byte offset of the latest line start shared by all texts where every text continues with an
/// ASCII letter or digit; None when there is none (or only one text).
pub fn shared_cut(texts: &[String]) -> Option<usize> {
    let (first, rest) = texts.split_first()?;
    if rest.is_empty() {
        return None;
    }
    let common = rest.iter().fold(first.len(), |common, text| {
        first.as_bytes()[..common]
            .iter()
            .zip(text.as_bytes())
            .take_while(|(a, b)| a == b)
            .count()
    });
    let starts_word = |text: &String, at: usize| {
        text.as_bytes()
            .get(at)
            .is_some_and(|b| b.is_ascii_alphanumeric())
    };
    // Positions after a newline within the common bytes; `\n` is ASCII, so each is a char boundary.
    first.as_bytes()[..common]
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, &b)| b == b'\n')
        .map(|(at, _)| at + 1)
        .find(|&cut| texts.iter().all(|text| starts_word(text, cut)))
}

/// A byte-level BPE with GPT-2's regex (ByteLevel with `use_regex`) or a regex split before a plain
/// ByteLevel, no prefix space, and no normalizer or NFC.
fn splits_at_line_starts(tokenizer: &Tokenizer) -> bool {
    let normalizer_ok = matches!(
        tokenizer.get_normalizer(),
        None | Some(NormalizerWrapper::NFC(_))
    );
    let byte_level = |b: &ByteLevel, regex: bool| !b.add_prefix_space && b.use_regex == regex;
    let pre_ok = match tokenizer.get_pre_tokenizer() {
        Some(PreTokenizerWrapper::ByteLevel(b)) => byte_level(b, true),
        Some(PreTokenizerWrapper::Sequence(sequence)) => matches!(
            sequence.as_ref(),
            [PreTokenizerWrapper::Split(_), PreTokenizerWrapper::ByteLevel(b)] if byte_level(b, false)
        ),
        _ => false,
    };
    normalizer_ok && pre_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::fixture_dir;

    fn encoder(name: &str) -> PromptEncoder {
        PromptEncoder::new(Tokenizer::from_file(fixture_dir(name).join("tokenizer.json")).unwrap())
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_cut_is_the_last_shared_line_start_that_begins_a_word_everywhere() {
        assert_eq!(
            shared_cut(&strings(&["ab\ncd\n\nQ: x", "ab\ncd\n\nQ: y"])),
            Some(7)
        );
        // One body starts with a space: that line start is no cut, the one before is.
        assert_eq!(
            shared_cut(&strings(&["ab\ncd\n\nQ: x", "ab\ncd\n\n Q: y"])),
            Some(3)
        );
        // Bodies that differ from their first byte still cut right after the blank line.
        assert_eq!(
            shared_cut(&strings(&["s\n\nQuestion: x", "s\n\nA: y", "s\n\n0: z"])),
            Some(3)
        );
        assert_eq!(
            shared_cut(&strings(&["no newline", "no newline at all"])),
            None
        );
        assert_eq!(shared_cut(&strings(&["ab\n\nQ"])), None);
        assert_eq!(shared_cut(&strings(&["ab\n\n", "ab\n\nQ"])), None);
    }

    #[test]
    fn both_fixture_tokenizers_share_heads() {
        for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"] {
            assert!(encoder(name).shares_heads(), "{name}");
        }
    }

    /// A small deterministic generator (xorshift) for texts full of what could break a cut.
    struct Texts(u64);

    impl Texts {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn piece(&mut self) -> &'static str {
            const PIECES: &[&str] = &[
                "word",
                " ",
                "  ",
                "\n",
                "\n\n",
                "\t",
                "\r\n",
                "12",
                "3.5",
                "é",
                "e\u{301}",
                "日本",
                "😀",
                "'s",
                "'ll",
                "\"",
                "{",
                "}",
                ":",
                ", ",
                "-",
                "A",
                "Question",
                " yes",
                "<|im_end|>",
                "<|im_start|>",
                "Straße",
                "1e-07",
                "\u{a0}",
                "!!",
                "...",
            ];
            PIECES[(self.next() % PIECES.len() as u64) as usize]
        }

        fn text(&mut self, pieces: usize) -> String {
            (0..pieces).map(|_| self.piece()).collect()
        }
    }

    #[test]
    fn shared_heads_encode_exactly_like_full_encodes_on_generated_prompts() {
        for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"] {
            let encoder = encoder(name);
            let mut gen = Texts(0x9e37_79b9_7f4a_7c15);
            let mut cuts = 0;
            for _ in 0..400 {
                let head = gen.text(12);
                let n = 2 + (gen.next() % 4) as usize;
                let texts: Vec<String> = (0..n)
                    .map(|_| {
                        let lead = ["Question: ", "A: ", "yes", "0: ", " ", "", "\n", "é"]
                            [(gen.next() % 8) as usize];
                        format!("{head}\n\n{lead}{}", gen.text(6))
                    })
                    .collect();
                if shared_cut(&texts).is_some() {
                    cuts += 1;
                }
                let full: Vec<Vec<u32>> = texts
                    .iter()
                    .map(|t| {
                        encoder
                            .tokenizer()
                            .encode(t.as_str(), false)
                            .unwrap()
                            .get_ids()
                            .to_vec()
                    })
                    .collect();
                assert_eq!(
                    encoder.encode_all(&texts).unwrap(),
                    full,
                    "{name}: {texts:?}"
                );
            }
            assert!(
                cuts > 100,
                "{name}: only {cuts} of 400 generated requests had a cut"
            );
        }
    }
}
