//! Clef-Flash and Clef-Omni (spec/PROMPTS.md §6): one pooled read per request. The checkpoint's fixed prompt
//! holds the state and every question; each piece is tokenized on its own so the spans are known.

use std::path::Path;

use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use super::load_error::LoadError;
use super::wording::PromptFormat;
use super::{ReadStrategy, StrategyOptions};
use crate::error::DecisionError;
use crate::ir::{Answer, DecisionRequest, Media, Modality, Question, QuestionKind};
use crate::json_text::{dumps, Separators};
use crate::probability;
use crate::read::{PooledQuestion, PreparedRead, ReadKind, ReadOutcome, SpanFromEnd};

const SYSTEM_PROMPT: &str = "Read the complete state and schema. Decide every field jointly. Each answer must be exactly one of that field's allowed options.";
const PREFIX: &str = "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nSTATE:\n";
const SUFFIX: &str =
    "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:";
const NOUL_TRUE: &str = "The proposition is true or the answer is yes.";
const NOUL_FALSE: &str = "The proposition is false or the answer is no.";
const IMAGE: &str = "<|vision_start|><|image_pad|><|vision_end|>";
const VIDEO: &str = "<|vision_start|><|video_pad|><|vision_end|>";
const AUDIO: &str = "<|audio_start|><|audio_pad|><|audio_end|>";

/// Which checkpoint: their prompts are the same; their limits and media placeholders differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clef {
    Flash,
    Omni,
}

impl Clef {
    pub fn name(&self) -> &'static str {
        match self {
            Clef::Flash => "Clef-Flash",
            Clef::Omni => "Clef-Omni",
        }
    }

    /// The reference's bound on a prompt, before the model's own length caps it.
    pub fn max_length(&self) -> usize {
        match self {
            Clef::Flash => 16_384,
            Clef::Omni => 64_000,
        }
    }

    /// The placeholder text before the state. Flash: every image, then every video, then one newline;
    /// Omni: each placeholder followed by its own newline, images, audio, videos.
    pub fn media_text(&self, media: &Media) -> String {
        let (images, audio, videos) = (media.images.len(), media.audio.len(), media.videos.len());
        if images + audio + videos == 0 {
            return String::new();
        }
        match self {
            Clef::Flash => format!("{}{}\n", IMAGE.repeat(images), VIDEO.repeat(videos)),
            Clef::Omni => format!(
                "{}{}{}",
                format!("{IMAGE}\n").repeat(images),
                format!("{AUDIO}\n").repeat(audio),
                format!("{VIDEO}\n").repeat(videos)
            ),
        }
    }
}

pub struct JointSchemaStrategy {
    clef: Clef,
    tokenizer: Tokenizer,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    /// min(the reference's bound, the model's positions).
    max_length: usize,
    modalities: Vec<Modality>,
}

impl JointSchemaStrategy {
    pub fn load(
        model_dir: &Path,
        clef: Clef,
        options: &StrategyOptions,
    ) -> Result<Self, LoadError> {
        let path = model_dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| LoadError::Tokenizer {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let encode = |text: &str| -> Result<Vec<u32>, LoadError> {
            tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| LoadError::SchemaTokenizer(e.to_string()))
        };
        let prefix = encode(&PREFIX.replace("{system}", SYSTEM_PROMPT))?;
        let suffix = encode(SUFFIX)?;
        for token in ["<|im_start|>", "<|im_end|>"] {
            if tokenizer.token_to_id(token).is_none() {
                return Err(LoadError::SchemaToken { token });
            }
        }
        // The registry narrowed these to the checkpoint's (Flash: images and videos; Omni: images,
        // audio and videos) and what the shard's processor takes.
        let modalities = options.modalities.clone();
        Ok(JointSchemaStrategy {
            clef,
            prefix,
            suffix,
            max_length: clef.max_length().min(options.max_positions),
            tokenizer,
            modalities,
        })
    }

    pub fn boxed_flash(
        model_dir: &Path,
        options: &StrategyOptions,
    ) -> Result<Box<dyn ReadStrategy>, LoadError> {
        Self::load(model_dir, Clef::Flash, options).map(|s| Box::new(s) as Box<dyn ReadStrategy>)
    }

    pub fn boxed_omni(
        model_dir: &Path,
        options: &StrategyOptions,
    ) -> Result<Box<dyn ReadStrategy>, LoadError> {
        Self::load(model_dir, Clef::Omni, options).map(|s| Box::new(s) as Box<dyn ReadStrategy>)
    }

    pub fn clef(&self) -> Clef {
        self.clef
    }

    fn tokens(&self, text: &str) -> Result<Vec<u32>, DecisionError> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| DecisionError::Internal(format!("tokenizer: {e}")))
    }

    /// The pooled read of one request: its prompt and its questions' spans. `max_input_tokens` (the
    /// server's limit) caps the prompt too, so a long state is truncated rather than refused.
    pub fn encode(
        &self,
        request: &DecisionRequest,
        max_input_tokens: usize,
    ) -> Result<PreparedRead, DecisionError> {
        let mut schema = self.tokens("\n\nSCHEMA FIELDS:\n")?;
        let mut spans: Vec<SchemaSpans> = Vec::new();
        for (n, question) in request.questions.iter().enumerate() {
            schema.extend(self.tokens(&format!(
                "\nFIELD {}\nID: {}\nTYPE: {}\nINSTRUCTION: ",
                n + 1,
                question.id,
                type_name(&question.kind)
            ))?);
            let start = schema.len();
            let instructions = match question.instructions.as_deref() {
                Some(text) if !text.is_empty() => text,
                _ => question.id.as_str(),
            };
            schema.extend(self.tokens(instructions)?);
            let instruction_span = (start, schema.len());
            schema.extend(self.tokens("\nALLOWED OPTIONS:\n")?);
            let options = prompt_options(question);
            let mut option_spans = Vec::with_capacity(options.len());
            for (m, option) in options.iter().enumerate() {
                schema.extend(self.tokens(&format!("OPTION {}: ", m + 1))?);
                let start = schema.len();
                schema.extend(self.tokens(&option.json())?);
                option_spans.push((start, schema.len()));
                schema.extend(self.tokens("\n")?);
            }
            schema.extend(self.tokens("END FIELD\n")?);
            spans.push(SchemaSpans {
                instructions: instruction_span,
                options: option_spans,
                type_id: type_id(&question.kind),
                order: options.iter().map(|o| o.index).collect(),
            });
        }
        let media = self.tokens(&self.clef.media_text(&request.media))?;
        let limit = self.max_length.min(max_input_tokens);
        let fixed = self.prefix.len() + media.len() + schema.len() + self.suffix.len();
        if fixed > limit {
            return Err(DecisionError::BadRequest {
                param: Some("questions".into()),
                message: format!(
                    "questions: the questions take {fixed} tokens, more than the {limit} this model reads ({} reads the state within that bound, truncated from its end)",
                    self.clef.name()
                ),
            });
        }
        let mut state = self.tokens(&render(&request.state))?;
        state.truncate(limit - fixed);
        let end = schema.len() + self.suffix.len();
        let from_end = |(s, e): (usize, usize)| SpanFromEnd {
            start: s as i32 - end as i32,
            end: e as i32 - end as i32,
        };
        let questions = spans
            .into_iter()
            .map(|q| PooledQuestion {
                type_id: q.type_id,
                instructions: from_end(q.instructions),
                options: q.options.into_iter().map(from_end).collect(),
                order: q.order,
            })
            .collect();
        let media_range = (
            self.prefix.len() as u32,
            (self.prefix.len() + media.len()) as u32,
        );
        let mut prompt = Vec::with_capacity(fixed + state.len());
        prompt.extend_from_slice(&self.prefix);
        prompt.extend(media);
        prompt.extend(state);
        prompt.extend(schema);
        prompt.extend_from_slice(&self.suffix);
        Ok(PreparedRead::pooled(prompt, questions, media_range))
    }
}

/// One question's spans within the schema tokens (before they are counted from the prompt's end).
struct SchemaSpans {
    instructions: (usize, usize),
    options: Vec<(usize, usize)>,
    type_id: u32,
    order: Vec<usize>,
}

/// One option as the prompt lists it: its request index, id and description.
struct PromptOption {
    index: usize,
    id: String,
    description: Option<String>,
}

impl PromptOption {
    /// `{"option_id": id}` plus `"description"` when it has one, compact with sorted keys.
    fn json(&self) -> String {
        let mut object = Map::new();
        if let Some(description) = &self.description {
            object.insert("description".into(), Value::String(description.clone()));
        }
        object.insert("option_id".into(), Value::String(self.id.clone()));
        dumps(&Value::Object(object), Separators::Compact)
    }
}

/// The model's option order: noul true then false (default descriptions), choices sorted by name, score
/// levels by index (`option_id` the index, description the level).
fn prompt_options(question: &Question) -> Vec<PromptOption> {
    match &question.kind {
        QuestionKind::YesNo { yes, no, no_first } => {
            let mut sides = vec![
                PromptOption {
                    index: 0,
                    id: "true".into(),
                    description: Some(yes.clone().unwrap_or_else(|| NOUL_TRUE.into())),
                },
                PromptOption {
                    index: 1,
                    id: "false".into(),
                    description: Some(no.clone().unwrap_or_else(|| NOUL_FALSE.into())),
                },
            ];
            // A debiased read's second label order: false listed first, answers still by index.
            if *no_first {
                sides.reverse();
            }
            sides
        }
        QuestionKind::Choice { options } => {
            let mut listed: Vec<PromptOption> = options
                .iter()
                .enumerate()
                .map(|(index, o)| PromptOption {
                    index,
                    id: o.name.clone(),
                    description: o.description.clone(),
                })
                .collect();
            // Python's sort of str: by code point, which is UTF-8 byte order; stable for equal names.
            listed.sort_by(|a, b| a.id.cmp(&b.id));
            listed
        }
        QuestionKind::Score { levels, .. } => levels
            .iter()
            .enumerate()
            .map(|(index, level)| PromptOption {
                index,
                id: index.to_string(),
                description: Some(level.clone()),
            })
            .collect(),
    }
}

fn type_name(kind: &QuestionKind) -> &'static str {
    match kind {
        QuestionKind::YesNo { .. } => "noul",
        QuestionKind::Choice { .. } => "choice",
        QuestionKind::Score { .. } => "score",
    }
}

fn type_id(kind: &QuestionKind) -> u32 {
    match kind {
        QuestionKind::YesNo { .. } => 0,
        QuestionKind::Choice { .. } => 1,
        QuestionKind::Score { .. } => 2,
    }
}

/// A string as is; anything else compact JSON with sorted keys (at every depth).
pub fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => dumps(&sorted(other), Separators::Compact),
    }
}

fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

impl ReadStrategy for JointSchemaStrategy {
    fn name(&self) -> &'static str {
        match self.clef {
            Clef::Flash => "clef_flash",
            Clef::Omni => "clef_omni",
        }
    }

    fn prompt_format(&self) -> PromptFormat {
        PromptFormat::JOINT_SCHEMA
    }

    fn refusal(&self, _kind: &QuestionKind) -> Option<String> {
        None
    }

    fn modalities(&self) -> &[Modality] {
        &self.modalities
    }

    fn supports_joint(&self) -> bool {
        // Every read is joint: the head scores all questions of a request in one pass.
        true
    }

    fn prepare(
        &self,
        request: &DecisionRequest,
        max_input_tokens: usize,
    ) -> Result<Vec<PreparedRead>, DecisionError> {
        if request
            .instructions
            .as_deref()
            .is_some_and(|i| !i.is_empty())
        {
            return Err(DecisionError::BadRequest {
                param: Some("instructions".into()),
                message: format!(
                    "instructions: {} reads a fixed prompt, so it takes no instructions",
                    self.clef.name()
                ),
            });
        }
        // chat_template_kwargs have no effect: the prompt is the checkpoint's, not a chat template's.
        Ok(vec![self.encode(request, max_input_tokens)?])
    }

    fn answers(&self, read: &PreparedRead, outcome: &ReadOutcome, temperature: f64) -> Vec<Answer> {
        let ReadKind::Pooled { questions, .. } = &read.kind else {
            return Vec::new();
        };
        questions
            .iter()
            .zip(&outcome.option_logits)
            .map(|(question, logits)| {
                let in_prompt_order = probability::pooled_answer(logits, temperature);
                // Back to the request's option order.
                let mut answer = in_prompt_order.clone();
                for (k, &index) in question.order.iter().enumerate() {
                    answer.probabilities[index] = in_prompt_order.probabilities[k];
                    answer.label_logprobs[index] = in_prompt_order.label_logprobs[k];
                }
                answer
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    //! Goldens on the tiny Clef fixtures (the real Qwen3.5 tokenizer; Qwen3's with Qwen3-Omni's media
    //! tokens). `integration-tests/test_clef.py` checks the same prompts id for id against a Python
    //! rendering of PROMPTS.md §6 with transformers' tokenizer.
    use super::*;
    use crate::ir::ChoiceOption;
    use crate::prompt::fixture_dir;
    use crate::prompt::wording::Wording;
    use serde_json::json;

    fn strategy(clef: Clef, modalities: Vec<Modality>) -> JointSchemaStrategy {
        let fixture = match clef {
            Clef::Flash => "tiny-clef-flash",
            Clef::Omni => "tiny-clef-omni",
        };
        let options = StrategyOptions {
            max_positions: 32_768,
            wording: Wording::Vllm,
            modalities,
        };
        JointSchemaStrategy::load(&fixture_dir(fixture), clef, &options).expect("loads")
    }

    fn questions() -> Vec<Question> {
        vec![
            Question {
                id: "team".into(),
                instructions: Some("Which team?".into()),
                kind: QuestionKind::Choice {
                    options: vec![
                        ChoiceOption {
                            name: "tech".into(),
                            description: Some("broken things".into()),
                        },
                        ChoiceOption {
                            name: "billing".into(),
                            description: None,
                        },
                    ],
                },
            },
            Question {
                id: "urgent".into(),
                instructions: None,
                kind: QuestionKind::YesNo {
                    yes: Some("money is moving".into()),
                    no: None,
                    no_first: false,
                },
            },
            Question {
                id: "tone".into(),
                instructions: Some("How upset?".into()),
                kind: QuestionKind::score(vec!["calm".into(), "furious".into()]),
            },
        ]
    }

    fn request(state: Value) -> DecisionRequest {
        DecisionRequest {
            state,
            instructions: None,
            questions: questions(),
            chat_template_kwargs: Map::new(),
            cache_salt: String::new(),
            media: Media::default(),
            joint: false,
            debias: None,
            calibration: None,
        }
    }

    fn decode(s: &JointSchemaStrategy, ids: &[u32]) -> String {
        s.tokenizer.decode(ids, false).expect("decodes")
    }

    fn span(prompt: &[u32], span: SpanFromEnd) -> &[u32] {
        let n = prompt.len() as i32;
        &prompt[(n + span.start) as usize..(n + span.end) as usize]
    }

    const GOLDEN: &str = "<|im_start|>system\nRead the complete state and schema. Decide every field jointly. Each answer must be exactly one of that field's allowed options.<|im_end|>\n<|im_start|>user\nSTATE:\n{\"days\":12,\"ticket\":{\"a\":[1,2.5],\"z\":\"Refund\"}}\n\nSCHEMA FIELDS:\n\nFIELD 1\nID: team\nTYPE: choice\nINSTRUCTION: Which team?\nALLOWED OPTIONS:\nOPTION 1: {\"option_id\":\"billing\"}\nOPTION 2: {\"description\":\"broken things\",\"option_id\":\"tech\"}\nEND FIELD\n\nFIELD 2\nID: urgent\nTYPE: noul\nINSTRUCTION: urgent\nALLOWED OPTIONS:\nOPTION 1: {\"description\":\"money is moving\",\"option_id\":\"true\"}\nOPTION 2: {\"description\":\"The proposition is false or the answer is no.\",\"option_id\":\"false\"}\nEND FIELD\n\nFIELD 3\nID: tone\nTYPE: score\nINSTRUCTION: How upset?\nALLOWED OPTIONS:\nOPTION 1: {\"description\":\"calm\",\"option_id\":\"0\"}\nOPTION 2: {\"description\":\"furious\",\"option_id\":\"1\"}\nEND FIELD\n\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:";

    /// Every type, sorted choices, the noul defaults, sorted keys at every depth: the same text on both
    /// checkpoints, with spans over exactly the instructions and each option's JSON.
    #[test]
    fn golden_prompt_and_spans() {
        for clef in [Clef::Flash, Clef::Omni] {
            let s = strategy(clef, vec![]);
            let r = request(json!({"ticket": {"z": "Refund", "a": [1, 2.5]}, "days": 12}));
            let reads = s.prepare(&r, usize::MAX).expect("prepares");
            assert_eq!(reads.len(), 1, "one read per request");
            let read = &reads[0];
            assert_eq!(decode(&s, &read.token_ids), GOLDEN, "{clef:?}");
            let ReadKind::Pooled { questions, media } = &read.kind else {
                panic!("pooled read expected")
            };
            assert_eq!(*media, (s.prefix.len() as u32, s.prefix.len() as u32));
            let text = |sp: SpanFromEnd| decode(&s, span(&read.token_ids, sp));
            assert_eq!(text(questions[0].instructions), "Which team?");
            assert_eq!(text(questions[1].instructions), "urgent");
            assert_eq!(text(questions[2].instructions), "How upset?");
            assert_eq!(text(questions[0].options[0]), r#"{"option_id":"billing"}"#);
            assert_eq!(
                text(questions[0].options[1]),
                r#"{"description":"broken things","option_id":"tech"}"#
            );
            assert_eq!(
                text(questions[1].options[1]),
                r#"{"description":"The proposition is false or the answer is no.","option_id":"false"}"#
            );
            assert_eq!(
                questions.iter().map(|q| q.type_id).collect::<Vec<_>>(),
                vec![1, 0, 2]
            );
            // Choices are sorted in the prompt: billing (request index 1) first.
            assert_eq!(questions[0].order, vec![1, 0]);
            assert_eq!(questions[1].order, vec![0, 1]);
            assert!(questions
                .iter()
                .flat_map(|q| std::iter::once(q.instructions).chain(q.options.iter().copied()))
                .all(|sp| sp.start < sp.end && sp.end < 0));
        }
    }

    /// The state is truncated from its end so the prompt fits exactly; a schema that alone does not
    /// fit is a 400 naming `questions`; request instructions are a 400 naming `instructions`.
    #[test]
    fn truncation_and_refusals() {
        let s = strategy(Clef::Flash, vec![]);
        let long = "word ".repeat(400);
        let whole = s
            .prepare(&request(json!(long.clone())), usize::MAX)
            .unwrap();
        let full_len = whole[0].token_ids.len();
        let state_len = s.tokens(&long).unwrap().len();
        let fixed = full_len - state_len;
        let limit = fixed + 10;
        let cut = s.prepare(&request(json!(long)), limit).unwrap();
        assert_eq!(cut[0].token_ids.len(), limit);
        let text = decode(&s, &cut[0].token_ids);
        assert!(
            text.contains("STATE:\nword word word word word word word word word word\n\nSCHEMA"),
            "{text}"
        );
        // Spans still point at the same pieces (they count from the end).
        let (ReadKind::Pooled { questions: a, .. }, ReadKind::Pooled { questions: b, .. }) =
            (&whole[0].kind, &cut[0].kind)
        else {
            panic!("pooled reads expected")
        };
        assert_eq!(a, b);
        match s.prepare(&request(json!("x")), fixed - 1) {
            Err(DecisionError::BadRequest { param, message }) => {
                assert_eq!(param.as_deref(), Some("questions"));
                assert!(
                    message.contains(&format!("more than the {}", fixed - 1)),
                    "{message}"
                );
            }
            other => panic!("expected a 400, got {other:?}"),
        }
        // The model's own bound: 16,384 for Flash, capped by max_positions.
        assert_eq!(s.max_length, 16_384);
        let with_instructions = DecisionRequest {
            instructions: Some("Be brief.".into()),
            ..request(json!("x"))
        };
        match s.prepare(&with_instructions, usize::MAX) {
            Err(DecisionError::BadRequest { param, message }) => {
                assert_eq!(param.as_deref(), Some("instructions"));
                assert!(message.contains("fixed prompt"), "{message}");
            }
            other => panic!("expected a 400, got {other:?}"),
        }
        // chat_template_kwargs change nothing.
        let mut kwargs = Map::new();
        kwargs.insert("enable_thinking".into(), json!(true));
        let with_kwargs = DecisionRequest {
            chat_template_kwargs: kwargs,
            ..request(json!("x"))
        };
        assert_eq!(
            s.prepare(&with_kwargs, usize::MAX).unwrap(),
            s.prepare(&request(json!("x")), usize::MAX).unwrap()
        );
        assert_eq!(strategy(Clef::Omni, vec![]).max_length, 32_768);
    }

    /// Flash: all images, then all videos, then one newline; Omni: each placeholder with its own
    /// newline, images, audio, videos. Placed before the state; the media stretch is marked.
    #[test]
    fn media_placeholders_per_checkpoint() {
        let media = Media {
            images: vec!["a".into(), "b".into()],
            audio: vec!["c".into()],
            videos: vec!["d".into()],
            ..Media::default()
        };
        assert_eq!(
            Clef::Flash.media_text(&media),
            format!("{IMAGE}{IMAGE}{VIDEO}\n")
        );
        assert_eq!(
            Clef::Omni.media_text(&media),
            format!("{IMAGE}\n{IMAGE}\n{AUDIO}\n{VIDEO}\n")
        );
        assert_eq!(Clef::Omni.media_text(&Media::default()), "");
        for clef in [Clef::Flash, Clef::Omni] {
            let s = strategy(clef, vec![Modality::Image]);
            assert_eq!(s.modalities(), &[Modality::Image], "{clef:?}");
            let r = DecisionRequest {
                media: Media {
                    images: vec!["a".into()],
                    ..Media::default()
                },
                ..request(json!("S"))
            };
            let read = &s.prepare(&r, usize::MAX).unwrap()[0];
            let ReadKind::Pooled { media, .. } = &read.kind else {
                panic!("pooled read expected")
            };
            let stretch = decode(&s, &read.token_ids[media.0 as usize..media.1 as usize]);
            assert_eq!(stretch, format!("{IMAGE}\n"), "{clef:?}");
            let text = decode(&s, &read.token_ids);
            assert!(
                text.contains(&format!("STATE:\n{IMAGE}\nS\n\nSCHEMA")),
                "{text}"
            );
        }
    }

    /// Option logits come back in the prompt's order; answers are in the request's, label mass 1.
    #[test]
    fn answers_map_sorted_choices_back() {
        let s = strategy(Clef::Flash, vec![]);
        let read = s
            .prepare(&request(json!("x")), usize::MAX)
            .unwrap()
            .remove(0);
        let outcome = ReadOutcome {
            rows: vec![],
            option_logits: vec![vec![2.0, 0.0], vec![0.0, 0.0], vec![0.0, 1.0]],
            tokens_computed: 1,
            tokens_cached: 0,
            media_tokens: 0,
        };
        let answers = s.answers(&read, &outcome, 1.0);
        let e = 2f64.exp();
        // billing (prompt option 1) got logit 2: request order is [tech, billing].
        assert!((answers[0].probabilities[1] - e / (e + 1.0)).abs() < 1e-12);
        assert!((answers[0].probabilities[0] - 1.0 / (e + 1.0)).abs() < 1e-12);
        assert_eq!(answers[1].probabilities, vec![0.5, 0.5]);
        assert!(answers.iter().all(|a| a.pooled && a.label_mass == 1.0));
        let sum: f64 = answers[2].label_logprobs.iter().map(|l| l.exp()).sum();
        assert!((sum - 1.0).abs() < 1e-12);
    }
}
