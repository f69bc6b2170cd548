//! DiffusionGemma canvas reads (block diffusion, spec/PROMPTS.md §7, vLLM 0.33's DiffusionGemmaCanvasStrategy):
//! one read-only denoising step on a seeded canvas after the prompt and its thought block; `joint` canvases.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256, Sha512};
use tokenizers::Tokenizer;

use super::chat::{checked_kwargs, ChatPrompts};
use super::labels::check_set;
use super::load_error::{JointLinesError, LoadError};
use super::template::Part;
use super::wording::{PromptFormat, Wording};
use super::{ReadStrategy, StrategyOptions};
use crate::error::DecisionError;
use crate::ir::{DecisionRequest, Modality, Question, QuestionKind};
use crate::question_kind::Kind;
use crate::read::{CanvasRow, LabelGroup, PreparedRead};

/// Appended after the rendered prompt, outside the canvas (the reference: far worse results inside it).
pub const THOUGHT: &str = "<|channel>thought\n<channel|>";
pub const END_OF_TURN: &str = "<turn|>";
/// A per-question canvas, and the step joint canvases round up to.
pub const CANVAS_STEP: usize = 16;
pub const JOINT_REPLY: &str =
    "Reply with one line per question, in order, formatted as \"number: answer\".";
/// Answer lines are checked for numbers 1..=64 at startup (the reference's question limit), so a joint
/// request holds at most this many questions.
pub const MAX_JOINT_QUESTIONS: usize = 64;
/// transformers' `DiffusionGemmaConfig.canvas_length` default, for a config.json without it.
const DEFAULT_CANVAS_LENGTH: usize = 256;

/// How joint canvases are written for this tokenizer: every answer line `"{k}: {label}"` must encode as
/// the same prefix for its number and set, then one label token, and repeat unchanged after a newline.
#[derive(Debug)]
struct JointLines {
    newline: u32,
    /// (number, set) → the line's ids before the label.
    prefix: HashMap<(usize, Kind), Vec<u32>>,
    /// label → its id at the end of an answer line.
    slot_ids: HashMap<&'static str, u32>,
}

pub struct DiffusionGemmaCanvasStrategy {
    chat: ChatPrompts,
    thought: Vec<u32>,
    /// label → its id as the first token after the thought block.
    label_ids: HashMap<&'static str, u32>,
    end: u32,
    pad: u32,
    vocab_size: u32,
    /// The served canvas (block) length: joint canvases never exceed it.
    served: usize,
    max_positions: usize,
    /// Why joint reads are off for this tokenizer, when they are.
    joint: Result<JointLines, JointLinesError>,
    /// The media the shard reads for this model (images, when the folder ships its processor).
    modalities: Vec<Modality>,
}

/// Why a canvas read takes no videos or audio even where the shard has a processor for them: transformers'
/// `DiffusionGemmaForBlockDiffusion`, the reference the reads equal, encodes images only.
const NO_VIDEO_OR_AUDIO: &str = "transformers' DiffusionGemmaForBlockDiffusion encodes images only (its encoder has a vision tower and no video or audio input), so there is no reference to read them as";

impl DiffusionGemmaCanvasStrategy {
    pub fn load(model_dir: &Path, max_positions: usize) -> Result<Self, LoadError> {
        let chat = ChatPrompts::load(model_dir, max_positions)?;
        let tokenizer = chat.tokenizer();
        let encode = |text: &str| -> Result<Vec<u32>, LoadError> {
            tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| LoadError::Tokenize {
                    text: text.to_owned(),
                    message: e.to_string(),
                })
        };
        let end = match encode(END_OF_TURN)?.as_slice() {
            [one] => Some(*one),
            _ => None,
        };
        let pad = pad_token(model_dir, tokenizer);
        let (Some(end), Some(pad)) = (end, pad) else {
            return Err(LoadError::CanvasTokens {
                end_of_turn: END_OF_TURN,
                end_of_turn_missing: end.is_none(),
                pad_missing: pad.is_none(),
            });
        };
        let thought = encode(THOUGHT)?;
        let label_ids = labels_after_thought(tokenizer, &thought)?;
        let config = read_config(model_dir)?;
        let text = config.get("text_config").unwrap_or(&config);
        let vocab_size = text
            .get("vocab_size")
            .or_else(|| config.get("vocab_size"))
            .and_then(Value::as_u64)
            .filter(|v| *v > 0 && *v <= u64::from(u32::MAX))
            .ok_or(LoadError::NoVocabSize)? as u32;
        let served = match config.get("canvas_length") {
            None | Some(Value::Null) => DEFAULT_CANVAS_LENGTH,
            Some(v) => v.as_u64().ok_or(LoadError::CanvasLengthNotNumber)? as usize,
        };
        if CANVAS_STEP > served {
            return Err(LoadError::CanvasTooShort {
                step: CANVAS_STEP,
                served,
            });
        }
        let joint = joint_lines(tokenizer, &label_ids);
        match &joint {
            Ok(_) => tracing::info!(served, "joint canvas reads are on"),
            Err(reason) => tracing::warn!(reason = %reason, "joint canvas reads are off"),
        }
        Ok(DiffusionGemmaCanvasStrategy {
            chat,
            thought,
            label_ids,
            end,
            pad,
            vocab_size,
            served,
            max_positions,
            joint,
            modalities: Vec::new(),
        })
    }

    /// DiffusionGemma owns its wording (the reference's per-question and joint prompts).
    pub fn boxed(
        model_dir: &Path,
        options: &StrategyOptions,
    ) -> Result<Box<dyn ReadStrategy>, LoadError> {
        let mut strategy = Self::load(model_dir, options.max_positions)?;
        strategy.modalities = options.modalities.clone();
        Ok(Box::new(strategy))
    }

    /// Why joint reads are refused on this model, if they are.
    pub fn joint_refusal(&self) -> Option<&JointLinesError> {
        self.joint.as_ref().err()
    }

    /// The user message of each read: one per question, or one per joint chunk (in `joint_chunks` order).
    fn contents(&self, request: &DecisionRequest, joint: Option<&JointLines>) -> Vec<String> {
        let wording = Wording::Vllm;
        let state = wording.state_text(&request.state);
        match joint {
            None => request
                .questions
                .iter()
                .map(|q| wording.user_message(&state, q))
                .collect(),
            Some(lines) => joint_chunks(&self.rows(lines, &request.questions), self.served)
                .into_iter()
                .map(|(start, end)| {
                    joint_content(&state, &request.questions[start..end], start + 1)
                })
                .collect(),
        }
    }

    /// Each question's canvas row cost in a joint layout (its line prefix, the slot, the newline).
    fn rows(&self, lines: &JointLines, questions: &[Question]) -> Vec<usize> {
        questions
            .iter()
            .enumerate()
            .map(|(i, q)| lines.prefix[&(i + 1, q.kind.kind())].len() + 2)
            .collect()
    }

    /// The rendered prompt texts of a request (for tests and debugging).
    pub fn render(&self, request: &DecisionRequest) -> Result<Vec<String>, DecisionError> {
        let joint = self.joint_for(request)?;
        self.render_contents(request, self.contents(request, joint))
    }

    fn render_contents(
        &self,
        request: &DecisionRequest,
        contents: Vec<String>,
    ) -> Result<Vec<String>, DecisionError> {
        let kwargs = checked_kwargs(&request.chat_template_kwargs)?;
        let instructions = request.instructions.as_deref().filter(|i| !i.is_empty());
        // Images lead the user message, before the state (as on every model here); each canvas read of the
        // request carries them all.
        let media: Vec<Part> = ChatPrompts::media_parts(&request.media);
        contents
            .into_iter()
            .map(|user| {
                let messages = ChatPrompts::messages(instructions, true, &media, user);
                self.chat.render(&messages, &kwargs)
            })
            .collect()
    }

    /// The joint layout to use: `None` for per-question reads (also for a single question, which reads
    /// best with the per-question prompt, as the reference does); refuses `joint` where it is off.
    fn joint_for(&self, request: &DecisionRequest) -> Result<Option<&JointLines>, DecisionError> {
        if !request.joint {
            return Ok(None);
        }
        let lines = self
            .joint
            .as_ref()
            .map_err(|reason| DecisionError::BadRequest {
                param: Some("joint".into()),
                message: format!("joint: this model reads each question on its own: {reason}"),
            })?;
        if request.questions.len() > MAX_JOINT_QUESTIONS {
            return Err(DecisionError::BadRequest {
                param: Some("joint".into()),
                message: format!(
                    "joint: at most {MAX_JOINT_QUESTIONS} questions share canvases on this model, got {}",
                    request.questions.len()
                ),
            });
        }
        Ok((request.questions.len() > 1).then_some(lines))
    }

    fn check_arity(&self, question: &Question) -> Result<(), DecisionError> {
        let max = question.kind.kind().labels().len();
        let n = question.kind.arity();
        if n > max {
            return Err(DecisionError::BadRequest {
                param: Some(format!("questions.{}", question.id)),
                message: format!(
                    "question '{}': at most {max} options for this model, got {n}",
                    question.id
                ),
            });
        }
        Ok(())
    }

    /// The prompt plus its thought block and canvas must fit the model.
    fn check_length(&self, name: &str, prompt: &[u32], width: usize) -> Result<(), DecisionError> {
        let extra = self.thought.len() + width;
        if prompt.len() + extra > self.max_positions {
            return Err(DecisionError::BadRequest {
                param: None,
                message: format!(
                    "{name}: the prompt has {} tokens and a canvas read adds {extra} (thought block and canvas), more than the model's {} positions",
                    prompt.len(),
                    self.max_positions
                ),
            });
        }
        Ok(())
    }

    fn check_tail(&self, name: &str, prompt: &[u32]) -> Result<(), DecisionError> {
        if !prompt.ends_with(&self.chat.labels.tail) {
            return Err(DecisionError::BadRequest {
                param: Some("chat_template_kwargs".into()),
                message: format!("{name}: these chat options end the prompt differently, so the labels' tokens are unknown"),
            });
        }
        Ok(())
    }

    fn with_thought(&self, prompt: Vec<u32>) -> Vec<u32> {
        let mut ids = prompt;
        ids.extend_from_slice(&self.thought);
        ids
    }
}

impl ReadStrategy for DiffusionGemmaCanvasStrategy {
    fn name(&self) -> &'static str {
        "diffusion_gemma_canvas"
    }

    fn prompt_format(&self) -> PromptFormat {
        PromptFormat::DIFFUSION_GEMMA_CANVAS
    }

    fn refusal(&self, _kind: &QuestionKind) -> Option<String> {
        // Every label set was checked after the thought block at startup (a failure refuses the model).
        None
    }

    fn modalities(&self) -> &[Modality] {
        &self.modalities
    }

    fn media_refusal(&self, modality: Modality) -> Option<&'static str> {
        (modality != Modality::Image).then_some(NO_VIDEO_OR_AUDIO)
    }

    fn supports_joint(&self) -> bool {
        // A joint request on a tokenizer whose answer lines fail the check is refused in `prepare`,
        // naming why (the shared refusal would not say).
        true
    }

    fn prepare(
        &self,
        request: &DecisionRequest,
        max_input_tokens: usize,
    ) -> Result<Vec<PreparedRead>, DecisionError> {
        for question in &request.questions {
            self.check_arity(question)?;
        }
        let joint = self.joint_for(request)?;
        let texts = self.render_contents(request, self.contents(request, joint))?;
        let encoded = self.chat.encode_all(&texts, max_input_tokens)?;
        let mut reads = Vec::with_capacity(encoded.len());
        match joint {
            None => {
                for (question, prompt) in request.questions.iter().zip(encoded) {
                    let name = format!("question '{}'", question.id);
                    self.check_tail(&name, &prompt)?;
                    self.check_length(&name, &prompt, CANVAS_STEP)?;
                    let canvas = single_canvas(&prompt, self.vocab_size, self.end, self.pad);
                    let labels = question.kind.kind().labels()[..question.kind.arity()]
                        .iter()
                        .map(|l| LabelGroup::single(vec![self.label_ids[l]]))
                        .collect();
                    let rows = vec![CanvasRow {
                        position: 0,
                        labels,
                    }];
                    reads.push(PreparedRead::canvas(
                        self.with_thought(prompt),
                        canvas,
                        rows,
                    ));
                }
            }
            Some(lines) => {
                let chunks = joint_chunks(&self.rows(lines, &request.questions), self.served);
                for ((start, end), prompt) in chunks.into_iter().zip(encoded) {
                    let questions = &request.questions[start..end];
                    let name = format!("questions {}..{} (a joint canvas)", start + 1, end);
                    self.check_tail(&name, &prompt)?;
                    let prefixes: Vec<&[u32]> = questions
                        .iter()
                        .enumerate()
                        .map(|(i, q)| lines.prefix[&(start + i + 1, q.kind.kind())].as_slice())
                        .collect();
                    let (canvas, positions) = joint_canvas(
                        &prefixes,
                        &prompt,
                        self.vocab_size,
                        lines.newline,
                        self.end,
                        self.pad,
                        self.served,
                    );
                    self.check_length(&name, &prompt, canvas.len())?;
                    let rows = questions
                        .iter()
                        .zip(positions)
                        .map(|(q, position)| CanvasRow {
                            position: position as u32,
                            labels: self.joint_groups(lines, q),
                        })
                        .collect();
                    reads.push(PreparedRead::canvas(
                        self.with_thought(prompt),
                        canvas,
                        rows,
                    ));
                }
            }
        }
        Ok(reads)
    }
}

impl DiffusionGemmaCanvasStrategy {
    /// A label on an answer line counts as its line token (usually with its leading space) and as its
    /// token after the thought block, as in a per-question read; the same id once.
    fn joint_groups(&self, lines: &JointLines, question: &Question) -> Vec<LabelGroup> {
        question.kind.kind().labels()[..question.kind.arity()]
            .iter()
            .map(|l| {
                let slot = lines.slot_ids[l];
                let alone = self.label_ids[l];
                let variants = if slot == alone {
                    vec![vec![slot]]
                } else {
                    vec![vec![slot], vec![alone]]
                };
                LabelGroup { variants }
            })
            .collect()
    }
}

/// The tokenizer's pad token, as transformers names it (tokenizer_config.json, then special_tokens_map.json).
fn pad_token(model_dir: &Path, tokenizer: &Tokenizer) -> Option<u32> {
    ["tokenizer_config.json", "special_tokens_map.json"]
        .iter()
        .filter_map(|file| std::fs::read_to_string(model_dir.join(file)).ok())
        .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
        .find_map(|config| match config.get("pad_token") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        })
        .and_then(|token| tokenizer.token_to_id(&token))
}

fn read_config(model_dir: &Path) -> Result<Value, LoadError> {
    let path = model_dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| LoadError::ReadConfig {
        path: path.clone(),
        message: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| LoadError::ParseConfig {
        path,
        message: e.to_string(),
    })
}

/// Every label's token as the first token after the thought block: the thought's ids after its last
/// added token, then the label, must add exactly one id, distinct within its set (vLLM's check, done on
/// the thought block because that is what the canvas follows). Any set failing refuses the model.
fn labels_after_thought(
    tokenizer: &Tokenizer,
    thought: &[u32],
) -> Result<HashMap<&'static str, u32>, LoadError> {
    let added: std::collections::HashSet<u32> = tokenizer
        .get_added_tokens_decoder()
        .keys()
        .copied()
        .collect();
    let start = thought
        .iter()
        .rposition(|id| added.contains(id))
        .map_or(0, |p| p + 1);
    let tail = &thought[start..];
    let tail_text = tokenizer
        .decode(tail, false)
        .map_err(|e| LoadError::DecodeThought(e.to_string()))?;
    let mut ids = HashMap::new();
    for set in Kind::ALL {
        let got = check_set(tokenizer, tail, &tail_text, set.labels()).map_err(|reason| {
            LoadError::LabelsAfterThought {
                thought: THOUGHT,
                reason,
            }
        })?;
        ids.extend(set.labels().iter().copied().zip(got));
    }
    Ok(ids)
}

fn joint_lines(
    tokenizer: &Tokenizer,
    label_ids: &HashMap<&'static str, u32>,
) -> Result<JointLines, JointLinesError> {
    let encode = |text: &str| -> Result<Vec<u32>, JointLinesError> {
        tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| JointLinesError::Tokenize {
                text: text.to_owned(),
                message: e.to_string(),
            })
    };
    let newline = match encode("\n")?.as_slice() {
        [one] => *one,
        _ => return Err(JointLinesError::NewlineNotOneToken),
    };
    let mut prefix = HashMap::new();
    let mut slot_ids: HashMap<&'static str, u32> = HashMap::new();
    for k in 1..=MAX_JOINT_QUESTIONS {
        for set in Kind::ALL {
            let mut first = encode(&format!("{k}: {}", set.labels()[0]))?;
            first.pop();
            for &label in set.labels() {
                let line = encode(&format!("{k}: {label}"))?;
                let after = encode(&format!("{k}: {label}\n{k}: {label}"))?;
                let Some(&last) = line.last() else {
                    return Err(JointLinesError::EmptyLine {
                        line: format!("{k}: {label}"),
                    });
                };
                let slot = *slot_ids.entry(label).or_insert(last);
                let repeated: Vec<u32> = line
                    .iter()
                    .copied()
                    .chain([newline])
                    .chain(line.iter().copied())
                    .collect();
                if after != repeated || line[..line.len() - 1] != first[..] || slot != last {
                    return Err(JointLinesError::NotPrefixAndLabel {
                        line: format!("{k}: {label}"),
                    });
                }
            }
            prefix.insert((k, set), first);
        }
    }
    // The reference also bounds the union of label ids per request by its engine's logprob limit (128);
    // with 38 labels the union is at most 76, well under it.
    debug_assert!(slot_ids.len() + label_ids.len() <= 128);
    Ok(JointLines {
        newline,
        prefix,
        slot_ids,
    })
}

/// `{state}\n\n` + `Question {k}: {instr}\n{body}` blocks (`\n\n` between) + `\n\n` + the reply line.
/// The heading shows even without instructions, so each answer line's number matches a question.
pub fn joint_content(state: &str, questions: &[Question], first: usize) -> String {
    let asks: Vec<String> = questions
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let number = first + i;
            let head = match q.instructions.as_deref().filter(|s| !s.is_empty()) {
                Some(instructions) => format!("Question {number}: {instructions}"),
                None => format!("Question {number}:"),
            };
            format!("{head}\n{}", Wording::Vllm.answer_lines(q))
        })
        .collect();
    format!("{state}\n\n{}\n\n{JOINT_REPLY}", asks.join("\n\n"))
}

/// The fewest even runs of questions whose lines fit the canvas, as (first index, end index): `count`
/// runs of `n / count` questions, the first `n % count` one longer. A run fits when its lines and
/// `<turn|>` leave a pad slot (`1 + Σ rows < served`), else label mass is lost. When no split into
/// fewer runs than questions fits, each question gets its own canvas.
pub fn joint_chunks(rows: &[usize], served: usize) -> Vec<(usize, usize)> {
    let n = rows.len();
    for count in 1..n {
        let (size, extra) = (n / count, n % count);
        let bounds: Vec<usize> = (0..=count).map(|i| i * size + i.min(extra)).collect();
        let spans: Vec<(usize, usize)> = bounds.windows(2).map(|w| (w[0], w[1])).collect();
        if spans
            .iter()
            .all(|&(a, b)| 1 + rows[a..b].iter().sum::<usize>() < served)
        {
            return spans;
        }
    }
    (0..n).map(|i| (i, i + 1)).collect()
}

/// `[noise, <turn|>, pad × 14]`: the noise drawn from the prompt (before its thought block), so a
/// repeated read gets the same canvas.
pub fn single_canvas(prompt: &[u32], vocab_size: u32, end: u32, pad: u32) -> Vec<u32> {
    let mut rng = PyRandom::for_prompt(prompt);
    let mut canvas = vec![rng.randrange(vocab_size), end];
    canvas.resize(CANVAS_STEP, pad);
    canvas
}

/// The answer lines with noise in the slots, `<turn|>`, then pad up to a multiple of 16 (capped at the
/// served canvas); returns the canvas and each question's slot position. One RNG, seeded from the
/// chunk's prompt, draws the slots in order.
pub fn joint_canvas(
    prefixes: &[&[u32]],
    prompt: &[u32],
    vocab_size: u32,
    newline: u32,
    end: u32,
    pad: u32,
    served: usize,
) -> (Vec<u32>, Vec<usize>) {
    let mut rng = PyRandom::for_prompt(prompt);
    let mut canvas = Vec::new();
    let mut positions = Vec::with_capacity(prefixes.len());
    for prefix in prefixes {
        canvas.extend_from_slice(prefix);
        positions.push(canvas.len());
        canvas.push(rng.randrange(vocab_size));
        canvas.push(newline);
    }
    canvas.push(end);
    let width = (canvas.len() + 1).div_ceil(CANVAS_STEP) * CANVAS_STEP;
    let width = width.min(served);
    if width > canvas.len() {
        canvas.resize(width, pad);
    }
    (canvas, positions)
}

/// Python's `random.Random(sha256(json.dumps(prompt_ids)).digest())`: the MT19937 generator, seeded
/// exactly as CPython seeds it from bytes, with `randrange` as CPython draws below a bound.
pub struct PyRandom {
    state: [u32; 624],
    index: usize,
}

impl PyRandom {
    /// Seeded from `json.dumps(prompt)` (default separators: `[1, 2, 3]`).
    pub fn for_prompt(prompt: &[u32]) -> Self {
        let json = format!(
            "[{}]",
            prompt
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        Self::from_bytes(&Sha256::digest(json.as_bytes()))
    }

    /// `random.seed(bytes)` (version 2): the integer `int.from_bytes(a + sha512(a))` (big-endian),
    /// split into 32-bit words least significant first, fed to `init_by_array`.
    pub fn from_bytes(seed: &[u8]) -> Self {
        let mut full = seed.to_vec();
        full.extend_from_slice(&Sha512::digest(seed));
        let mut words: Vec<u32> = full
            .rchunks(4)
            .map(|chunk| chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)))
            .collect();
        while words.len() > 1 && words.last() == Some(&0) {
            words.pop();
        }
        Self::init_by_array(&words)
    }

    fn init_genrand(seed: u32) -> [u32; 624] {
        let mut mt = [0u32; 624];
        mt[0] = seed;
        for i in 1..624 {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        mt
    }

    fn init_by_array(key: &[u32]) -> Self {
        let mut mt = Self::init_genrand(19_650_218);
        let n = 624usize;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..n.max(key.len()) {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= n {
                mt[0] = mt[n - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..n - 1 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= n {
                mt[0] = mt[n - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        PyRandom {
            state: mt,
            index: n,
        }
    }

    fn next_u32(&mut self) -> u32 {
        const N: usize = 624;
        const M: usize = 397;
        if self.index >= N {
            let mt = &mut self.state;
            for k in 0..N {
                let y = (mt[k] & 0x8000_0000) | (mt[(k + 1) % N] & 0x7fff_ffff);
                let mut next = mt[(k + M) % N] ^ (y >> 1);
                if y & 1 != 0 {
                    next ^= 0x9908_b0df;
                }
                mt[k] = next;
            }
            self.index = 0;
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `randrange(n)` = `_randbelow(n)`: `getrandbits(n.bit_length())` until below `n`.
    pub fn randrange(&mut self, n: u32) -> u32 {
        let bits = 32 - n.leading_zeros();
        loop {
            let r = self.next_u32() >> (32 - bits);
            if r < n {
                return r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Goldens produced by `scripts/canvas_goldens.py`: Python's own hashlib + random.Random and vLLM
    //! 0.33's chunking and layout rules, on the tiny-diffusiongemma fixture (transformers' tokenizer and
    //! apply_chat_template), pasted here as literals.
    use super::*;
    use crate::ir::ChoiceOption;
    use crate::prompt::fixture_dir;
    use crate::read::ReadKind;
    use serde_json::json;

    const FIXTURE: &str = "tiny-diffusiongemma";

    fn strategy() -> DiffusionGemmaCanvasStrategy {
        DiffusionGemmaCanvasStrategy::load(&fixture_dir(FIXTURE), 8192).expect("loads")
    }

    fn noul(id: &str, instructions: Option<&str>) -> Question {
        Question {
            id: id.into(),
            instructions: instructions.map(Into::into),
            kind: QuestionKind::YesNo {
                yes: None,
                no: None,
                no_first: false,
            },
        }
    }

    fn team() -> Question {
        Question {
            id: "team".into(),
            instructions: Some("Team?".into()),
            kind: QuestionKind::Choice {
                options: vec![
                    ChoiceOption {
                        name: "billing".into(),
                        description: None,
                    },
                    ChoiceOption {
                        name: "tech".into(),
                        description: Some("broken things".into()),
                    },
                ],
            },
        }
    }

    fn tone() -> Question {
        Question {
            id: "tone".into(),
            instructions: None,
            kind: QuestionKind::score(vec!["calm".into(), "angry".into()]),
        }
    }

    fn request(
        questions: Vec<Question>,
        instructions: Option<&str>,
        joint: bool,
    ) -> DecisionRequest {
        DecisionRequest {
            state: json!({"ticket": "Refund not received", "days": 12}),
            instructions: instructions.map(Into::into),
            questions,
            chat_template_kwargs: Default::default(),
            cache_salt: String::new(),
            media: Default::default(),
            joint,
            debias: None,
            calibration: None,
        }
    }

    #[test]
    fn the_noise_token_is_pythons_random_seeded_with_the_prompts_sha256() {
        assert_eq!(PyRandom::for_prompt(&[1, 2, 3]).randrange(768), 618);
        assert_eq!(PyRandom::for_prompt(&[5]).randrange(262_144), 90_931);
        let long: Vec<u32> = (0..300).collect();
        assert_eq!(PyRandom::for_prompt(&long).randrange(1000), 603);
        let mut rng = PyRandom::for_prompt(&[7, 8, 9]);
        let drawn: Vec<u32> = (0..5).map(|_| rng.randrange(768)).collect();
        assert_eq!(drawn, vec![212, 422, 649, 319, 453]);
        assert_eq!(PyRandom::for_prompt(&[4]).randrange(1), 0);
    }

    #[test]
    fn joint_chunks_are_the_fewest_even_runs_that_fit() {
        assert_eq!(joint_chunks(&[4; 8], 64), vec![(0, 8)]);
        assert_eq!(joint_chunks(&[4; 8], 16), vec![(0, 3), (3, 6), (6, 8)]);
        assert_eq!(
            joint_chunks(&[5, 4, 4, 4, 4], 13),
            vec![(0, 2), (2, 4), (4, 5)]
        );
        // No split into fewer runs fits: one canvas per question.
        assert_eq!(joint_chunks(&[4; 3], 5), vec![(0, 1), (1, 2), (2, 3)]);
        assert_eq!(joint_chunks(&[4], 16), vec![(0, 1)]);
    }

    #[test]
    fn joint_canvases_round_up_to_sixteen_and_stop_at_the_served_length() {
        // round_up(len + 1, 16): 14 tokens → 16, 15 → 16 (one pad left), 16 → 32; capped at `served`.
        let (canvas, positions) =
            joint_canvas(&[&[1, 2], &[3, 4], &[5, 6, 7]], &[9], 768, 25, 6, 0, 64);
        assert_eq!(canvas.len(), 16);
        assert_eq!(positions, vec![2, 6, 11]);
        assert_eq!(&canvas[13..], &[6, 0, 0]);
        let (canvas, _) = joint_canvas(&[&[1, 2], &[3, 4], &[5, 6, 7, 8]], &[9], 768, 25, 6, 0, 64);
        assert_eq!((canvas.len(), canvas[14], canvas[15]), (16, 6, 0));
        let (canvas, _) = joint_canvas(
            &[&[1, 2], &[3, 4], &[5, 6, 7, 8, 9]],
            &[9],
            768,
            25,
            6,
            0,
            64,
        );
        assert_eq!((canvas.len(), canvas[15], canvas[16]), (32, 6, 0));
        let (canvas, _) = joint_canvas(
            &[&[1, 2], &[3, 4], &[5, 6, 7, 8, 9]],
            &[9],
            768,
            25,
            6,
            0,
            16,
        );
        assert_eq!((canvas.len(), canvas[15]), (16, 6));
    }

    #[test]
    fn a_single_read_is_the_vllm_prompt_then_the_thought_and_a_seeded_canvas() {
        let s = strategy();
        let r = request(
            vec![noul("urgent", Some("Urgent?"))],
            Some("You route tickets."),
            false,
        );
        assert_eq!(
            s.render(&r).unwrap(),
            vec!["<bos><|turn>system\nYou route tickets.<turn|>\n<|turn>user\n{\"ticket\": \"Refund not received\", \"days\": 12}\n\nQuestion: Urgent?\nyes\nno\nAnswer with yes or no only.<turn|>\n<|turn>model\n"]
        );
        let reads = s.prepare(&r, usize::MAX).unwrap();
        let prompt: Vec<u32> = vec![
            2, 5, 401, 25, 83, 105, 111, 24, 108, 105, 111, 479, 640, 99, 93, 101, 95, 110, 109,
            40, 6, 25, 5, 388, 25, 117, 28, 110, 99, 93, 101, 95, 110, 28, 52, 24, 28, 519, 96,
            111, 104, 94, 705, 24, 108, 95, 93, 95, 99, 112, 95, 94, 28, 38, 24, 28, 94, 91, 115,
            109, 28, 52, 24, 43, 44, 119, 25, 25, 422, 52, 555, 108, 97, 95, 104, 110, 57, 25, 378,
            25, 383, 25, 410, 655, 563, 649, 569, 721, 40, 6, 25, 5, 405, 25,
        ];
        let mut with_thought = prompt.clone();
        with_thought.extend([8, 534, 25, 9]);
        assert_eq!(reads.len(), 1);
        assert_eq!(reads[0].token_ids, with_thought);
        let ReadKind::Canvas { canvas, rows } = &reads[0].kind else {
            panic!("a canvas read")
        };
        assert_eq!(
            canvas,
            &vec![199, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].position, 0);
        assert_eq!(
            rows[0].labels,
            vec![LabelGroup::single(vec![378]), LabelGroup::single(vec![383])]
        );
        // Repeats are identical; `joint` with one question reads it on its own, as the reference does.
        assert_eq!(s.prepare(&r, usize::MAX).unwrap(), reads);
        let joint_one = DecisionRequest { joint: true, ..r };
        assert_eq!(s.prepare(&joint_one, usize::MAX).unwrap(), reads);
    }

    #[test]
    fn images_lead_the_user_message_of_every_canvas_and_videos_are_refused_saying_why() {
        let s = DiffusionGemmaCanvasStrategy::boxed(
            &fixture_dir(FIXTURE),
            &StrategyOptions {
                max_positions: 8192,
                wording: Wording::Vllm,
                modalities: vec![Modality::Image],
            },
        )
        .expect("loads");
        assert_eq!(s.modalities(), &[Modality::Image]);
        let image = "<|image|>";
        let mut r = request(vec![noul("urgent", Some("Urgent?")), team()], None, false);
        r.media.images = vec!["data:a".into(), "data:b".into()];
        let plain = strategy();
        let texts = plain.render(&r).unwrap();
        // (The unboxed strategy renders the same placeholders: the parts come from the request.)
        assert_eq!(texts.len(), 2);
        for text in &texts {
            assert!(
                text.starts_with(&format!("<bos><|turn>user\n{image}{image}{{\"ticket\"")),
                "{text}"
            );
        }
        let reads = s.prepare(&r, usize::MAX).unwrap();
        let placeholder = plain.chat.tokenizer().token_to_id(image).expect("a token");
        for read in &reads {
            assert_eq!(
                read.token_ids.iter().filter(|t| **t == placeholder).count(),
                2
            );
        }
        // Joint canvases carry the images too, once per chunk.
        let joint = DecisionRequest {
            joint: true,
            ..r.clone()
        };
        let joint_reads = s.prepare(&joint, usize::MAX).unwrap();
        assert_eq!(joint_reads.len(), 1);
        assert_eq!(
            joint_reads[0]
                .token_ids
                .iter()
                .filter(|t| **t == placeholder)
                .count(),
            2
        );
        // A video names the field and why: the reference has no video input.
        let mut video = request(vec![noul("urgent", None)], None, false);
        video.media.videos = vec!["data:v".into()];
        let err = crate::prompt::check_media(s.as_ref(), &video).unwrap_err();
        let DecisionError::BadRequest { param, message } = err else {
            panic!("a 400")
        };
        assert_eq!(param.as_deref(), Some("videos"));
        assert_eq!(
            message,
            format!("videos: this model (diffusion_gemma_canvas reads) does not take video inputs: {NO_VIDEO_OR_AUDIO}")
        );
        assert!(crate::prompt::check_media(s.as_ref(), &r).is_ok());
        // A folder without a processor (the shard reports no media) refuses images as before.
        assert!(crate::prompt::check_media(&plain, &r).is_err());
    }

    #[test]
    fn a_joint_read_numbers_the_questions_on_one_canvas() {
        let s = strategy();
        assert_eq!(s.joint_refusal(), None);
        let r = request(
            vec![noul("urgent", Some("Urgent?")), team(), tone()],
            None,
            true,
        );
        let text = s.render(&r).unwrap();
        assert_eq!(text.len(), 1);
        assert_eq!(
            text[0],
            "<bos><|turn>user\n{\"ticket\": \"Refund not received\", \"days\": 12}\n\nQuestion 1: Urgent?\nyes\nno\nAnswer with yes or no only.\n\nQuestion 2: Team?\nA: billing\nB: tech - broken things\nAnswer with the letter of one option only.\n\nQuestion 3:\n0: calm\n1: angry\nAnswer with the number of one level only.\n\nReply with one line per question, in order, formatted as \"number: answer\".<turn|>\n<|turn>model\n"
        );
        let reads = s.prepare(&r, usize::MAX).unwrap();
        assert_eq!(reads.len(), 1);
        let ReadKind::Canvas { canvas, rows } = &reads[0].kind else {
            panic!("a canvas read")
        };
        assert_eq!(
            canvas,
            &vec![43, 52, 174, 25, 44, 52, 41, 25, 45, 52, 24, 381, 25, 6, 0, 0]
        );
        assert_eq!(
            rows.iter().map(|r| r.position).collect::<Vec<_>>(),
            vec![2, 6, 11]
        );
        let groups = |i: usize| -> Vec<Vec<Vec<u32>>> {
            rows[i].labels.iter().map(|g| g.variants.clone()).collect()
        };
        // The line token (after "k: ") and the label alone; once when they are the same token.
        assert_eq!(
            groups(0),
            vec![vec![vec![563], vec![378]], vec![vec![569], vec![383]]]
        );
        assert_eq!(
            groups(1),
            vec![vec![vec![535], vec![59]], vec![vec![536], vec![60]]]
        );
        assert_eq!(groups(2), vec![vec![vec![42]], vec![vec![43]]]);
        assert!(reads[0].token_ids.ends_with(&[405, 25, 8, 534, 25, 9]));
        assert_eq!(reads[0].questions(), 3);
    }

    #[test]
    fn joint_requests_split_into_even_chunks_when_the_canvas_is_too_short() {
        let s = strategy();
        // 40 yes/no questions: rows of 4 ("k:" then the slot and a newline; "10:" is three tokens)
        // never fit one 64-token canvas, so they split into the fewest even runs that do.
        let questions: Vec<Question> = (0..40).map(|i| noul(&format!("q{i}"), None)).collect();
        let reads = s
            .prepare(&request(questions, None, true), usize::MAX)
            .unwrap();
        let sizes: Vec<usize> = reads.iter().map(PreparedRead::questions).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 40);
        assert!(sizes.len() > 1 && sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        for read in &reads {
            let ReadKind::Canvas { canvas, .. } = &read.kind else {
                panic!()
            };
            assert!(
                canvas.len() <= 64 && canvas.len() % 16 == 0,
                "{}",
                canvas.len()
            );
        }
        let too_many: Vec<Question> = (0..65).map(|i| noul(&format!("q{i}"), None)).collect();
        let err = s
            .prepare(&request(too_many, None, true), usize::MAX)
            .unwrap_err();
        assert!(
            err.to_string().contains("joint: at most 64 questions"),
            "{err}"
        );
    }

    #[test]
    fn over_long_prompts_and_too_many_options_are_refused() {
        let s = DiffusionGemmaCanvasStrategy::load(&fixture_dir(FIXTURE), 80).expect("loads");
        let r = request(vec![noul("urgent", Some("Urgent?"))], None, false);
        let err = s.prepare(&r, usize::MAX).unwrap_err();
        assert!(
            matches!(&err, DecisionError::BadRequest { .. })
                && err.to_string().contains("question 'urgent': the prompt has")
                && err.to_string().contains("a canvas read adds 20 (thought block and canvas), more than the model's 80 positions"),
            "{err}"
        );
        let s = strategy();
        let many = Question {
            id: "many".into(),
            instructions: None,
            kind: QuestionKind::Choice {
                options: (0..27)
                    .map(|i| ChoiceOption {
                        name: format!("o{i}"),
                        description: None,
                    })
                    .collect(),
            },
        };
        let err = s
            .prepare(&request(vec![many], None, false), usize::MAX)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("question 'many': at most 26 options"),
            "{err}"
        );
        let mut thinking = request(vec![noul("urgent", None)], None, false);
        thinking
            .chat_template_kwargs
            .insert("enable_thinking".into(), Value::Bool(true));
        assert!(matches!(
            s.prepare(&thinking, usize::MAX),
            Err(DecisionError::ThinkingOn)
        ));
    }

    /// A copy of the fixture folder with its tokenizer or tokenizer config changed.
    fn altered(edit: impl FnOnce(&Path)) -> std::path::PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "di-canvas-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        for file in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "config.json",
        ] {
            std::fs::copy(fixture_dir(FIXTURE).join(file), dir.join(file)).unwrap();
        }
        edit(&dir);
        dir
    }

    #[test]
    fn a_model_without_a_pad_token_or_turn_end_is_refused_at_startup_naming_it() {
        let no_pad = altered(|dir| {
            let path = dir.join("tokenizer_config.json");
            let mut config: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config.as_object_mut().unwrap().remove("pad_token");
            std::fs::write(&path, config.to_string()).unwrap();
        });
        let err = DiffusionGemmaCanvasStrategy::load(&no_pad, 8192)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains(
                "need the model's '<turn|>' and pad tokens: the tokenizer has no pad token"
            ) && !err.contains("is not one token"),
            "{err}"
        );
        let no_turn = altered(|dir| {
            let path = dir.join("tokenizer.json");
            let text = std::fs::read_to_string(&path)
                .unwrap()
                .replace("<turn|>", "<end_of_turn>");
            std::fs::write(&path, text).unwrap();
        });
        let err = DiffusionGemmaCanvasStrategy::load(&no_turn, 8192)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("'<turn|>' is not one token of this tokenizer"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(no_pad);
        let _ = std::fs::remove_dir_all(no_turn);
    }

    #[test]
    fn a_served_canvas_below_sixteen_tokens_or_no_vocab_size_is_refused_at_startup() {
        let edit_config = |edit: fn(&mut serde_json::Map<String, Value>)| {
            altered(move |dir| {
                let path = dir.join("config.json");
                let mut config: Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                edit(config.as_object_mut().unwrap());
                std::fs::write(&path, config.to_string()).unwrap();
            })
        };
        let short = edit_config(|c| {
            c.insert("canvas_length".into(), json!(8));
        });
        let err = DiffusionGemmaCanvasStrategy::load(&short, 8192)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("need a canvas of 16, and the served canvas is 8"),
            "{err}"
        );
        let no_vocab = edit_config(|c| {
            c.get_mut("text_config")
                .unwrap()
                .as_object_mut()
                .unwrap()
                .remove("vocab_size");
        });
        let err = DiffusionGemmaCanvasStrategy::load(&no_vocab, 8192)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("config.json has no vocab_size"), "{err}");
        // Without canvas_length, transformers' default (256) is served.
        let default = edit_config(|c| {
            c.remove("canvas_length");
        });
        assert_eq!(
            DiffusionGemmaCanvasStrategy::load(&default, 8192)
                .unwrap()
                .served,
            256
        );
        for dir in [short, no_vocab, default] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn answer_lines_that_do_not_tokenize_as_prefix_and_label_turn_joint_reads_off() {
        // An added token ": yes" makes "1: yes" encode as ["1", ": yes"], unlike "1: no".
        let dir = altered(|dir| {
            let path = dir.join("tokenizer.json");
            let mut tokenizer = Tokenizer::from_file(&path).unwrap();
            tokenizer.add_tokens(&[tokenizers::AddedToken::from(": yes", false)]);
            tokenizer.save(&path, false).unwrap();
        });
        let s =
            DiffusionGemmaCanvasStrategy::load(&dir, 8192).expect("per-question reads still load");
        let reason = s.joint_refusal().expect("joint reads are off").to_string();
        assert!(
            reason.contains("does not tokenize as a prefix and one label token"),
            "{reason}"
        );
        let r = request(vec![noul("a", None), tone()], None, true);
        let err = s.prepare(&r, usize::MAX).unwrap_err();
        assert!(
            matches!(&err, DecisionError::BadRequest { param: Some(p), .. } if p == "joint")
                && err
                    .to_string()
                    .starts_with("joint: this model reads each question on its own"),
            "{err}"
        );
        assert_eq!(
            s.prepare(&DecisionRequest { joint: false, ..r }, usize::MAX)
                .unwrap()
                .len(),
            2
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
