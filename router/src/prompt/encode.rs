//! Tokenizing a request's prompts. They share a long head (chat template, instructions, state) and
//! differ in each question's body; tokenizing the head once per request instead of once per
//! question is most of the router's own time on long states (8 questions over a 512-token state:
//! 6.3 ms of full encodes).
//!
//! The head's ids are reused only where that is provably what a full encode gives: the cut sits at
//! the start of a line that begins with an ASCII letter or digit in every prompt. With a byte-level
//! BPE whose pre-tokenizer regex never joins a newline with what follows it (GPT-2's and Qwen's
//! patterns), a normalizer that is absent or NFC, and no added token that strips the whitespace
//! before it, no pre-token crosses such a point and nothing after it depends on what comes before:
//! the ids before the cut are the same for every prompt, and the ids after it are those of the
//! tail encoded alone. (The head alone is not enough: GPT-2's regex splits a trailing run of
//! whitespace differently at the end of a text.) Other tokenizers, or one that fails the
//! self-check at load, are encoded in full.
//!
//! Tails (a question's body and the reply prefix) repeat across requests, since clients ask the
//! same questions about many states, so recent tails are kept with their ids.
//!
//! An NFC normalizer is a quarter of an encode's time, and it changes nothing in a text that is
//! already in NFC (all ASCII is). Such texts are encoded by a copy of the tokenizer without it.
//!
//! The state itself is new in every request, but its words are not. A single space between two
//! ASCII letters is another point no pre-token crosses: the letters before it end a letter run, and
//! the space starts the next pre-token (" word") in both patterns, whatever follows. Texts are cut
//! there into pieces (mostly one word with its leading space), recent pieces are kept with their
//! ids, and only the runs of pieces not kept are encoded (once per run, split by token offsets).
//! With byte-level BPE, a piece's ids do not depend on its neighbours, so the ids of a text are
//! those of its pieces in order. This needs, beyond the shared-head conditions, added tokens that
//! neither contain whitespace nor look at their neighbours (`single_word`, `lstrip`, `rstrip`),
//! and no BPE dropout.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Encoding, Tokenizer};
use unicode_normalization::{is_nfc_quick, IsNormalized};

/// The tokenizer refused a text (the decider answers it as an internal error naming the tokenizer).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct EncodeError(tokenizers::Error);

/// Recent prompt tails kept with their ids (each at most `MAX_KEPT_TAIL_BYTES` long: at most 4 MiB
/// of text in all).
const KEPT_TAILS: usize = 1024;
const MAX_KEPT_TAIL_BYTES: usize = 4096;
/// Recent pieces kept with their ids (each at most `MAX_KEPT_PIECE_BYTES` long: a few MiB in all).
const KEPT_PIECES: usize = 32_768;
const MAX_KEPT_PIECE_BYTES: usize = 64;

pub struct PromptEncoder {
    tokenizer: Tokenizer,
    /// The same tokenizer without its NFC normalizer, for texts already in NFC; None when the
    /// tokenizer has no normalizer or another one.
    without_nfc: Option<Tokenizer>,
    shared_heads: bool,
    /// Texts are encoded piece by piece (cut at single spaces between ASCII letters).
    pieces: bool,
    tails: Kept,
    kept_pieces: Kept,
}

/// Texts kept with their ids, least recently used first out.
struct Kept(Mutex<LruCache<String, Arc<[u32]>>>);

impl Kept {
    fn new(capacity: usize) -> Self {
        Kept(Mutex::new(LruCache::new(
            NonZeroUsize::new(capacity).expect("capacity > 0"),
        )))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, Arc<[u32]>>> {
        // A panic while holding the lock cannot leave a wrong entry behind: entries are inserted whole.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl PromptEncoder {
    pub fn new(tokenizer: Tokenizer) -> Self {
        let without_nfc = matches!(tokenizer.get_normalizer(), Some(NormalizerWrapper::NFC(_)))
            .then(|| {
                let mut plain = tokenizer.clone();
                plain.with_normalizer(None::<NormalizerWrapper>);
                plain
            });
        let mut encoder = PromptEncoder {
            tokenizer,
            without_nfc,
            shared_heads: false,
            pieces: false,
            tails: Kept::new(KEPT_TAILS),
            kept_pieces: Kept::new(KEPT_PIECES),
        };
        if splits_at_line_starts(&encoder.tokenizer) {
            // Pieces and shared heads together, else shared heads alone; each only if the
            // self-check agrees with full encodes.
            encoder.shared_heads = true;
            encoder.pieces = pieces_are_independent(&encoder.tokenizer);
            if !encoder.self_check() {
                encoder.pieces = false;
                encoder.shared_heads = encoder.self_check();
            }
        }
        encoder.tails.lock().clear();
        encoder.kept_pieces.lock().clear();
        encoder
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Whether prompts are encoded as a head and a tail (the head once per request).
    pub fn shares_heads(&self) -> bool {
        self.shared_heads
    }

    /// Whether texts are encoded piece by piece, with recent pieces kept.
    pub fn encodes_pieces(&self) -> bool {
        self.pieces
    }

    /// The ids of each text, exactly as encoding each alone (no special tokens added) gives them.
    pub fn encode_all(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, EncodeError> {
        let cut = if self.shared_heads {
            shared_cut(texts)
        } else {
            None
        };
        match cut {
            Some(cut) => self.encode_with_cut(texts, cut),
            None => texts.iter().map(|text| self.encode(text)).collect(),
        }
    }

    /// Encodes the first text and reuses its ids before `cut` for the others, each followed by
    /// the ids of its tail (kept or encoded alone).
    fn encode_with_cut(&self, texts: &[String], cut: usize) -> Result<Vec<Vec<u32>>, EncodeError> {
        let first = &texts[0];
        // Up to its last piece start before the cut, the first prompt is encoded piece by piece;
        // the rest of it in one encode, whose offsets find the cut.
        let split = if self.pieces {
            piece_starts(&first[..cut]).last().unwrap_or(0)
        } else {
            0
        };
        let mut head_ids = self.encode(&first[..split])?;
        let rest = self.full_encode(&first[split..])?;
        let mut first_ids = Vec::with_capacity(head_ids.len() + rest.len());
        first_ids.extend_from_slice(&head_ids);
        first_ids.extend_from_slice(rest.get_ids());
        // The head's ids are those of the first prompt's tokens that end by the cut; the next token
        // must start right at it (else the cut is inside a token: encode the others in full).
        let offsets = rest.get_offsets();
        let head = offsets.partition_point(|&(_, end)| end <= cut - split);
        let mut all = Vec::with_capacity(texts.len());
        all.push(first_ids);
        if offsets
            .get(head)
            .is_none_or(|&(start, _)| start != cut - split)
        {
            for text in &texts[1..] {
                all.push(self.encode(text)?);
            }
            return Ok(all);
        }
        head_ids.extend_from_slice(&rest.get_ids()[..head]);
        for text in &texts[1..] {
            let tail = self.tail(&text[cut..])?;
            let mut ids = Vec::with_capacity(head_ids.len() + tail.len());
            ids.extend_from_slice(&head_ids);
            ids.extend_from_slice(&tail);
            all.push(ids);
        }
        Ok(all)
    }

    /// A tail's ids: kept from an earlier request, or encoded alone (and kept if short enough).
    fn tail(&self, text: &str) -> Result<Arc<[u32]>, EncodeError> {
        if text.len() > MAX_KEPT_TAIL_BYTES {
            return self.encode(text).map(Arc::from);
        }
        if let Some(ids) = self.tails.lock().get(text) {
            return Ok(ids.clone());
        }
        let ids: Arc<[u32]> = self.encode(text)?.into();
        self.tails.lock().put(text.to_owned(), ids.clone());
        Ok(ids)
    }

    /// A text's ids: piece by piece where that is proven exact, else in one encode.
    fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        if self.pieces {
            self.encode_pieces(text)
        } else {
            self.full_encode(text).map(|e| e.get_ids().to_vec())
        }
    }

    /// What the tokenizer gives for the whole text (no special tokens added).
    fn full_encode(&self, text: &str) -> Result<Encoding, EncodeError> {
        self.tokenizer_for(text)
            .encode(text, false)
            .map_err(EncodeError)
    }

    /// The ids of each piece in order: kept ones as they are, each run of the others encoded at
    /// once and split at its piece starts by token offsets (and kept, when short).
    fn encode_pieces(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let bounds: Vec<usize> = std::iter::once(0)
            .chain(piece_starts(text))
            .chain(std::iter::once(text.len()))
            .collect();
        let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
        let kept: Vec<Option<Arc<[u32]>>> = {
            let mut cache = self.kept_pieces.lock();
            pieces
                .iter()
                .map(|piece| cache.get(*piece).cloned())
                .collect()
        };
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut learned = Vec::new();
        let mut i = 0;
        while i < pieces.len() {
            if let Some(known) = &kept[i] {
                ids.extend_from_slice(known);
                i += 1;
                continue;
            }
            let first = i;
            while i < pieces.len() && kept[i].is_none() {
                i += 1;
            }
            let run = self.full_encode(&text[bounds[first]..bounds[i]])?;
            ids.extend_from_slice(run.get_ids());
            learned.extend(split_run(&run, &bounds[first..=i], &pieces[first..i]));
        }
        if !learned.is_empty() {
            let mut cache = self.kept_pieces.lock();
            for (piece, piece_ids) in learned {
                cache.put(piece.to_owned(), piece_ids);
            }
        }
        Ok(ids)
    }

    /// The tokenizer that encodes `text` as the full one does, the cheapest first: NFC changes
    /// nothing in a text that its quick check proves to be in NFC already.
    fn tokenizer_for(&self, text: &str) -> &Tokenizer {
        match &self.without_nfc {
            Some(plain) if is_nfc_quick(text.chars()) == IsNormalized::Yes => plain,
            _ => &self.tokenizer,
        }
    }

    /// Both ways on prompts built to stress the cut (unicode, JSON, digits, spaces and blank lines
    /// around it); any difference turns shared heads off for this tokenizer.
    fn self_check(&self) -> bool {
        let heads = [
            "<|im_start|>user\nThe invoice total is wrong.  Refund   late\n\n",
            "{\"ticket\": \"Straße – 12 €\", \"days\": 12, \"n\": 1e-07}\n\n",
            "line one\n \nline\t two\r\n\n\n",
            "日本語のテキスト。\n絵文字 😀 and ' quotes 's\n\n",
            "It's a test of Straße and cafe\u{301} words, I'll see it so.\tTab a b\n\n",
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nok so A B\n\n",
        ];
        let bodies = [
            "Question: Which team?\nA: billing\nB: tech\nAnswer with the letter of one option only.<|im_end|>\n",
            "yes: it is\nno\nAnswer with yes or no only.",
            "0: low\n1: high\nAnswer with the number of one level only.\n\n",
            "Question:  spaced \n\nA: x",
        ];
        heads.iter().all(|head| {
            let texts: Vec<String> = bodies.iter().map(|body| format!("{head}{body}")).collect();
            let full: Result<Vec<Vec<u32>>, EncodeError> = texts
                .iter()
                .map(|text| self.full_encode(text).map(|e| e.get_ids().to_vec()))
                .collect();
            let cut = shared_cut(&texts);
            let parts = cut.map(|cut| self.encode_with_cut(&texts, cut));
            let each: Result<Vec<Vec<u32>>, EncodeError> =
                texts.iter().map(|text| self.encode(text)).collect();
            matches!((&full, parts, each), (Ok(a), Some(Ok(b)), Ok(c)) if *a == b && *a == c)
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

/// Byte offsets where a new piece starts: each single space between two ASCII letters.
fn piece_starts(text: &str) -> impl Iterator<Item = usize> + '_ {
    let bytes = text.as_bytes();
    (1..bytes.len().saturating_sub(1)).filter(move |&at| {
        bytes[at] == b' '
            && bytes[at - 1].is_ascii_alphabetic()
            && bytes[at + 1].is_ascii_alphabetic()
    })
}

/// Each piece of a run with its ids, if every token of the run lies within one piece (it does
/// where the pieces are independent; nothing is kept otherwise). Long pieces are not kept.
fn split_run<'t>(
    run: &Encoding,
    bounds: &[usize],
    pieces: &[&'t str],
) -> Vec<(&'t str, Arc<[u32]>)> {
    let (ids, offsets) = (run.get_ids(), run.get_offsets());
    let mut split = Vec::with_capacity(pieces.len());
    let mut token = 0;
    for (piece, end) in pieces.iter().zip(&bounds[1..]) {
        let end = end - bounds[0];
        let from = token;
        while token < offsets.len() && offsets[token].1 <= end {
            token += 1;
        }
        if offsets.get(token).is_some_and(|&(start, _)| start < end) {
            return Vec::new();
        }
        if piece.len() <= MAX_KEPT_PIECE_BYTES {
            split.push((*piece, Arc::from(&ids[from..token])));
        }
    }
    split
}

/// Whether a text's pieces encode independently (given `splits_at_line_starts`): no added token
/// contains whitespace or looks at its neighbours, the BPE has no dropout, and no token of the
/// vocabulary holds an ASCII letter followed by a space (`Ġ` in byte-level form), so no merge can
/// join a word to the space after it, whatever the pre-tokenizer's pattern lets through.
fn pieces_are_independent(tokenizer: &Tokenizer) -> bool {
    let no_word_space = tokenizer.get_vocab(false).keys().all(|token| {
        !token
            .chars()
            .zip(token.chars().skip(1))
            .any(|(a, b)| a.is_ascii_alphabetic() && b == '\u{120}')
    });
    let added_ok = tokenizer.get_added_tokens_decoder().values().all(|token| {
        !token.single_word
            && !token.lstrip
            && !token.rstrip
            && !token.content.chars().any(char::is_whitespace)
    });
    let bpe_ok = matches!(tokenizer.get_model(), ModelWrapper::BPE(bpe) if bpe.dropout.is_none());
    added_ok && bpe_ok && no_word_space
}

/// A byte-level BPE with GPT-2's regex (ByteLevel with `use_regex`) or a regex split before a plain
/// ByteLevel, no prefix space, no normalizer or NFC, and no added token that takes the whitespace
/// before it (`lstrip`: it would take the newline before a cut).
fn splits_at_line_starts(tokenizer: &Tokenizer) -> bool {
    let no_lstrip = tokenizer
        .get_added_tokens_decoder()
        .values()
        .all(|token| !token.lstrip);
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
    normalizer_ok && pre_ok && no_lstrip
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

    /// Each text encoded alone and in full: what `encode_all` must give.
    fn full_encodes(tokenizer: &Tokenizer, texts: &[String]) -> Vec<Vec<u32>> {
        texts
            .iter()
            .map(|t| {
                tokenizer
                    .encode(t.as_str(), false)
                    .unwrap()
                    .get_ids()
                    .to_vec()
            })
            .collect()
    }

    /// `encode_all` gives the full encodes, twice (the second time from what the first one kept).
    fn encodes_like_full_encodes_twice(encoder: &PromptEncoder, name: &str, texts: &[String]) {
        let full = full_encodes(encoder.tokenizer(), texts);
        for _ in 0..2 {
            assert_eq!(
                encoder.encode_all(texts).unwrap(),
                full,
                "{name}: {texts:?}"
            );
        }
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
        assert_eq!(shared_cut(&[]), None);
        assert_eq!(shared_cut(&strings(&["ab\n\n", "ab\n\nQ"])), None);
    }

    #[test]
    fn both_fixture_tokenizers_share_heads_and_encode_pieces() {
        for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"] {
            let encoder = encoder(name);
            assert!(encoder.shares_heads(), "{name}");
            assert!(encoder.encodes_pieces(), "{name}");
            assert_eq!(
                encoder.kept_pieces.lock().len(),
                0,
                "the self-check leaves nothing kept"
            );
        }
    }

    #[test]
    fn pieces_start_at_single_spaces_between_ascii_letters() {
        let starts = |text: &str| piece_starts(text).collect::<Vec<_>>();
        assert_eq!(starts("The cat sat"), vec![3, 7]);
        // Not between letters: double spaces, digits, punctuation, non-ASCII letters, the edges.
        assert_eq!(starts("a  b 1 c, d é e f"), vec![16]);
        assert_eq!(starts(" a b "), vec![2]);
        assert_eq!(starts(""), Vec::<usize>::new());
        assert_eq!(starts("x"), Vec::<usize>::new());
    }

    #[test]
    fn single_prompts_encode_piece_by_piece_exactly_like_full_encodes() {
        for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"] {
            let encoder = encoder(name);
            let mut gen = Texts(0x2545_f491_4f6c_dd1d);
            let mut starts = 0;
            for _ in 0..400 {
                let texts = vec![gen.text(24)];
                starts += piece_starts(&texts[0]).count();
                // The second time every short piece is a kept one.
                encodes_like_full_encodes_twice(&encoder, name, &texts);
            }
            assert!(
                starts > 400,
                "{name}: only {starts} piece starts in 400 texts"
            );
            assert!(encoder.kept_pieces.lock().len() > 100, "{name}");
        }
    }

    #[test]
    fn pieces_are_kept_within_their_bounds() {
        let qwen = encoder("tiny-qwen3");
        let long = format!(" {}", "x".repeat(MAX_KEPT_PIECE_BYTES));
        let text = format!("a{long} b");
        assert_eq!(
            vec![qwen.encode(&text).unwrap()],
            full_encodes(qwen.tokenizer(), std::slice::from_ref(&text))
        );
        let mut kept = qwen.kept_pieces.lock();
        assert_eq!(kept.len(), 2, "the long piece is not kept");
        assert!(kept.get("a").is_some() && kept.get(" b").is_some());
        assert!(kept.get(long.as_str()).is_none());
        drop(kept);
        // Distinct letter-only words, more of them than are kept.
        let word = |mut i: usize| {
            let mut w = String::from("w");
            while i > 0 {
                w.push((b'a' + (i % 26) as u8) as char);
                i /= 26;
            }
            w
        };
        let text: Vec<String> = (1..=KEPT_PIECES + 10).map(word).collect();
        let text = text.join(" ");
        assert_eq!(
            vec![qwen.encode(&text).unwrap()],
            full_encodes(qwen.tokenizer(), std::slice::from_ref(&text))
        );
        let mut kept = qwen.kept_pieces.lock();
        assert_eq!(
            kept.len(),
            KEPT_PIECES,
            "the least recent pieces are let go"
        );
        assert!(kept.get("a").is_none());
        assert!(kept.get(&format!(" {}", word(KEPT_PIECES + 10))).is_some());
    }

    #[test]
    fn a_run_with_a_token_across_a_piece_start_keeps_nothing() {
        let qwen = encoder("tiny-qwen3");
        let run = qwen.tokenizer().encode("Question", false).unwrap();
        assert_eq!(run.get_ids().len(), 1);
        assert!(split_run(&run, &[0, 3, 8], &["Que", "stion"]).is_empty());
        let run = qwen.tokenizer().encode("a b", false).unwrap();
        let split = split_run(&run, &[0, 1, 3], &["a", " b"]);
        assert_eq!(split.len(), 2);
        assert_eq!(&*split[1].1, &run.get_ids()[1..]);
    }

    #[test]
    fn a_vocabulary_token_across_a_word_and_a_space_turns_pieces_off() {
        let path = fixture_dir("tiny-qwen3").join("tokenizer.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        json["model"]["vocab"]["New\u{120}York"] = serde_json::json!(200_000);
        let tokenizer: Tokenizer = json.to_string().parse().unwrap();
        assert!(pieces_are_independent(
            &Tokenizer::from_file(fixture_dir("tiny-qwen3").join("tokenizer.json")).unwrap()
        ));
        assert!(!pieces_are_independent(&tokenizer));
        assert!(!PromptEncoder::new(tokenizer).encodes_pieces());
    }

    #[test]
    fn an_added_token_with_a_space_or_a_strip_turns_pieces_off() {
        let dir = fixture_dir("tiny-qwen3");
        let text = "we flew to New York in May";
        for token in [
            tokenizers::AddedToken::from("New York", false),
            tokenizers::AddedToken::from("York", false).rstrip(true),
        ] {
            let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
            tokenizer.add_tokens(std::slice::from_ref(&token));
            let mut encoder = PromptEncoder::new(tokenizer);
            assert!(!encoder.encodes_pieces(), "{token:?}");
            let full = encoder
                .tokenizer()
                .encode(text, false)
                .unwrap()
                .get_ids()
                .to_vec();
            assert_eq!(encoder.encode(text).unwrap(), full);
            // Forced on, pieces kept from other texts would change the ids: the rule is what
            // keeps them exact.
            encoder.pieces = true;
            for other in ["we flew to New cars in a May", "at York"] {
                encoder.encode(other).unwrap();
            }
            assert_ne!(encoder.encode(text).unwrap(), full, "{token:?}");
        }
    }

    #[test]
    fn texts_in_nfc_skip_the_normalizer_and_others_keep_it() {
        let qwen = encoder("tiny-qwen3");
        let plain = qwen
            .without_nfc
            .as_ref()
            .expect("Qwen3's normalizer is NFC");
        assert!(encoder("SmolLM2-135M-Instruct").without_nfc.is_none());
        // Composed and plain texts are in NFC; a combining accent, a Hangul jamo pair and a
        // singleton (the Ångström sign) are not, and NFC changes their ids.
        let composed = ["plain ASCII\n\nQuestion: A?", "Straße – café 日本 😀"];
        let decomposed = ["cafe\u{301} ok", "\u{1100}\u{1161} x", "\u{212b} unit"];
        for text in composed.iter().chain(&decomposed) {
            let full = qwen
                .tokenizer()
                .encode(*text, false)
                .unwrap()
                .get_ids()
                .to_vec();
            assert_eq!(qwen.encode(text).unwrap(), full, "{text:?}");
        }
        for text in decomposed {
            assert!(
                std::ptr::eq(qwen.tokenizer_for(text), qwen.tokenizer()),
                "{text:?}"
            );
            let skipped = plain.encode(text, false).unwrap().get_ids().to_vec();
            assert_ne!(
                skipped,
                qwen.encode(text).unwrap(),
                "{text:?}: NFC should matter here"
            );
        }
        for text in composed {
            assert!(std::ptr::eq(qwen.tokenizer_for(text), plain), "{text:?}");
        }
    }

    #[test]
    fn tails_are_kept_across_requests_within_their_bounds() {
        let qwen = encoder("tiny-qwen3");
        assert_eq!(
            qwen.tails.lock().len(),
            0,
            "the self-check leaves nothing kept"
        );
        let tail = "Question: Which team?\nA: billing<|im_end|>\n<|im_start|>assistant\n";
        let long_tail = format!(
            "Question: {}?<|im_end|>\n",
            "why ".repeat(MAX_KEPT_TAIL_BYTES / 4)
        );
        let texts = |state: &str| -> Vec<String> {
            vec![
                format!("<|im_start|>user\n{state}\n\nQuestion: Urgent?<|im_end|>\n"),
                format!("<|im_start|>user\n{state}\n\n{tail}"),
                format!("<|im_start|>user\n{state}\n\n{long_tail}"),
            ]
        };
        for state in ["first state", "another state, same questions"] {
            let texts = texts(state);
            assert_eq!(
                qwen.encode_all(&texts).unwrap(),
                full_encodes(qwen.tokenizer(), &texts)
            );
        }
        let mut kept = qwen.tails.lock();
        assert_eq!(kept.len(), 1, "only the short tail is kept");
        let ids = kept.get(tail).expect("the short tail is kept").to_vec();
        assert_eq!(ids, qwen.tokenizer().encode(tail, false).unwrap().get_ids());
        drop(kept);
        for i in 0..KEPT_TAILS + 10 {
            qwen.encode_all(&[format!("s\n\nQuestion {i}?"), format!("s\n\nQuestion {i}!")])
                .unwrap();
        }
        assert_eq!(
            qwen.tails.lock().len(),
            KEPT_TAILS,
            "the least recent tails are let go"
        );
        assert!(qwen.tails.lock().get(tail).is_none());
    }

    #[test]
    fn a_cut_inside_a_token_falls_back_to_full_encodes() {
        let qwen = encoder("tiny-qwen3");
        // Byte 6 is inside "Question" (not a line start): the first prompt's tokens do not meet there.
        let texts = strings(&["s\n\nQuestion: a", "s\n\nQuestion: b", "s\n\nQuestion: c"]);
        assert_eq!(
            qwen.encode_with_cut(&texts, 6).unwrap(),
            full_encodes(qwen.tokenizer(), &texts)
        );
        assert_eq!(qwen.tails.lock().len(), 0, "no tail of a bad cut is kept");
    }

    #[test]
    fn an_added_token_that_strips_the_whitespace_before_it_turns_cuts_off() {
        let dir = fixture_dir("tiny-qwen3");
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        assert!(PromptEncoder::new(tokenizer.clone()).shares_heads());
        // With this token, "\nQuestion" is one added token that takes the newline: no cut before it.
        tokenizer.add_tokens(&[tokenizers::AddedToken::from("Question", false).lstrip(true)]);
        let encoder = PromptEncoder::new(tokenizer);
        assert!(!encoder.shares_heads());
        // The first prompt's tokens do meet at the cut; only the second tail starts with the token.
        let texts = strings(&["s\n\nAnswer: a", "s\n\nQuestion: b"]);
        let full = full_encodes(encoder.tokenizer(), &texts);
        assert_eq!(encoder.encode_all(&texts).unwrap(), full);
        let cut = shared_cut(&texts).unwrap();
        let parts = encoder.encode_with_cut(&texts, cut).unwrap();
        assert_ne!(parts, full, "cutting here would change the ids");
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
                "the cat",
                " sat on",
                "x y z",
                "I'm in",
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
                let n = 1 + (gen.next() % 5) as usize;
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
                // The second time the tails and pieces are the kept ones.
                encodes_like_full_encodes_twice(&encoder, name, &texts);
            }
            assert!(
                cuts > 100,
                "{name}: only {cuts} of 400 generated requests had a cut"
            );
        }
    }
}
