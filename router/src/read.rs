//! One read as the router sends it to the shards and what comes back, in the contract's terms (a kind
//! per read and per result). Every result is checked against its read before anything uses it.

use std::sync::Arc;

use decision_proto::v1 as pb;

use crate::error::DecisionError;
use crate::ir::Modality;

/// One media input as fetched, ready for the shard's processor.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadMedia {
    pub modality: Modality,
    /// The request field and position (`images.0`): shard errors about it name it.
    pub name: String,
    pub data: Arc<[u8]>,
    /// Hex sha256 of `data`.
    pub sha256: String,
    /// Video and audio: the longest duration accepted, and for video the most frames sampled at 2 fps
    /// (the operator's `--max-video-*` / `--max-audio-seconds`); the shard's decoder checks them. 0: none.
    pub max_seconds: f64,
    pub max_frames: u32,
}

/// A medium the shard could not take (`images.1: cannot decode …`): the client's error, a 400 naming the
/// position the message starts with.
pub fn media_error(message: &str) -> DecisionError {
    DecisionError::BadRequest {
        param: message
            .split_once(": ")
            .map(|(name, _)| name.to_owned())
            .filter(|name| name.contains('.') && !name.contains(' ')),
        message: message.to_owned(),
    }
}

/// One allowed answer and every token sequence that spells it ("yes", "Yes", "YES"; "A", " A").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelGroup {
    pub variants: Vec<Vec<u32>>,
}

impl LabelGroup {
    /// A label spelled one way only.
    pub fn single(sequence: Vec<u32>) -> Self {
        LabelGroup {
            variants: vec![sequence],
        }
    }
}

/// One answer slot of a canvas read: the canvas position read, and the label groups scored there
/// (every variant one token: a slot holds one token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanvasRow {
    pub position: u32,
    pub labels: Vec<LabelGroup>,
}

/// A `[start, end)` stretch of a pooled prompt, counted from its end (`start < end <= 0`), so that it holds
/// after the media placeholders (which come before it) expand on the shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanFromEnd {
    pub start: i32,
    pub end: i32,
}

/// One question of a pooled read: its type id (noul 0, choice 1, score 2), the span of its instructions and
/// one span per option in the prompt's option order; `order[k]` is the request's index of prompt option `k`
/// (choices are sorted by name in the prompt).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PooledQuestion {
    pub type_id: u32,
    pub instructions: SpanFromEnd,
    pub options: Vec<SpanFromEnd>,
    pub order: Vec<usize>,
}

/// What a read asks the shard to compute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadKind {
    /// The distribution after the prompt, restricted to the label groups (one question).
    NextToken { labels: Vec<LabelGroup> },
    /// One read-only bidirectional step over a seeded canvas after the prompt; one row per question
    /// (several on a joint canvas).
    Canvas {
        canvas: Vec<u32>,
        rows: Vec<CanvasRow>,
    },
    /// One backbone pass over the prompt, every question's options scored by the model's joint-schema
    /// head; `media` is the stretch of prompt tokens that are the media placeholders.
    Pooled {
        questions: Vec<PooledQuestion>,
        media: (u32, u32),
    },
}

/// One read ready for the shard (its `ReadParts`). A clone shares it: the queue holds the reads it
/// sends and the decider the same reads, to turn their results into answers, without a copy of any
/// prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedRead(Arc<ReadParts>);

/// A read's whole prompt, what is read after it, and the media its placeholder tokens stand for
/// (shared by every read of a request).
#[derive(Clone, Debug, PartialEq)]
pub struct ReadParts {
    /// The prompt (for a canvas read: the encoder's input, thought block included).
    pub token_ids: Vec<u32>,
    pub kind: ReadKind,
    pub media: Arc<[ReadMedia]>,
}

impl std::ops::Deref for PreparedRead {
    type Target = ReadParts;

    fn deref(&self) -> &ReadParts {
        &self.0
    }
}

/// A read is changed only while it is prepared (its media attached), before anything shares it; a
/// shared one would be copied first.
impl std::ops::DerefMut for PreparedRead {
    fn deref_mut(&mut self) -> &mut ReadParts {
        Arc::make_mut(&mut self.0)
    }
}

impl PreparedRead {
    fn new(token_ids: Vec<u32>, kind: ReadKind) -> Self {
        PreparedRead(Arc::new(ReadParts {
            token_ids,
            kind,
            media: Arc::default(),
        }))
    }

    pub fn next_token(token_ids: Vec<u32>, labels: Vec<LabelGroup>) -> Self {
        PreparedRead::new(token_ids, ReadKind::NextToken { labels })
    }

    pub fn canvas(token_ids: Vec<u32>, canvas: Vec<u32>, rows: Vec<CanvasRow>) -> Self {
        PreparedRead::new(token_ids, ReadKind::Canvas { canvas, rows })
    }

    pub fn pooled(token_ids: Vec<u32>, questions: Vec<PooledQuestion>, media: (u32, u32)) -> Self {
        PreparedRead::new(token_ids, ReadKind::Pooled { questions, media })
    }

    /// The label groups of each question this read answers, in question order (one for a next-token
    /// read, one per row for a canvas; none for a pooled read, whose head scores options directly).
    pub fn question_labels(&self) -> Vec<&[LabelGroup]> {
        match &self.kind {
            ReadKind::NextToken { labels } => vec![labels.as_slice()],
            ReadKind::Canvas { rows, .. } => rows.iter().map(|r| r.labels.as_slice()).collect(),
            ReadKind::Pooled { questions, .. } => questions.iter().map(|_| &[][..]).collect(),
        }
    }

    /// How many questions this read answers.
    pub fn questions(&self) -> usize {
        match &self.kind {
            ReadKind::NextToken { .. } => 1,
            ReadKind::Canvas { rows, .. } => rows.len(),
            ReadKind::Pooled { questions, .. } => questions.len(),
        }
    }

    pub fn to_pb(&self, id: u64, cache_salt: &str) -> pb::Read {
        let kind = match &self.kind {
            ReadKind::NextToken { labels } => pb::read::Kind::NextToken(pb::NextTokenRead {
                token_ids: self.token_ids.clone(),
                labels: groups_to_pb(labels),
                shared_prefix: 0,
            }),
            ReadKind::Canvas { canvas, rows } => pb::read::Kind::Canvas(pb::CanvasRead {
                prompt_ids: self.token_ids.clone(),
                canvas_ids: canvas.clone(),
                rows: rows
                    .iter()
                    .map(|row| pb::CanvasRow {
                        position: row.position,
                        labels: groups_to_pb(&row.labels),
                    })
                    .collect(),
            }),
            ReadKind::Pooled { questions, media } => pb::read::Kind::Pooled(pb::PooledRead {
                token_ids: self.token_ids.clone(),
                questions: questions
                    .iter()
                    .map(|q| pb::PooledQuestion {
                        type_id: q.type_id,
                        instructions: Some(span_to_pb(q.instructions)),
                        options: q.options.iter().copied().map(span_to_pb).collect(),
                    })
                    .collect(),
                media_start: media.0,
                media_end: media.1,
            }),
        };
        let media = self
            .media
            .iter()
            .map(|m| pb::MediaItem {
                modality: match m.modality {
                    Modality::Image => pb::Modality::Image,
                    Modality::Audio => pb::Modality::Audio,
                    Modality::Video => pb::Modality::Video,
                } as i32,
                data: m.data.to_vec(),
                sha256: m.sha256.clone(),
                name: m.name.clone(),
                max_seconds: m.max_seconds,
                max_frames: m.max_frames,
            })
            .collect();
        pb::Read {
            id,
            cache_salt: cache_salt.to_owned(),
            media,
            kind: Some(kind),
        }
    }
}

/// A next-token read's prompt shares at least this many leading tokens with the read before it before
/// the wire says so (`share_prefixes`): below it the saving is smaller than a field.
const MIN_SHARED_PREFIX: usize = 8;

/// Sends each next-token read's prompt less the prefix it shares with the read before it in the batch
/// (`NextTokenRead.shared_prefix`): a request's questions follow each other and share their state, so
/// the state crosses the wire, and the shard decodes it, once per request, not once per question (a
/// batch of 64 requests x 8 questions over 512-token states: 276,480 prompt tokens, about 42,600 sent).
pub fn share_prefixes(reads: &mut [pb::Read]) {
    // From the last read back, so the read before each one still holds its whole prompt.
    for index in (1..reads.len()).rev() {
        let (before, rest) = reads.split_at_mut(index);
        let (Some(pb::read::Kind::NextToken(previous)), Some(pb::read::Kind::NextToken(read))) =
            (&before[index - 1].kind, &mut rest[0].kind)
        else {
            continue;
        };
        let shared = previous
            .token_ids
            .iter()
            .zip(&read.token_ids)
            .take_while(|(a, b)| a == b)
            .count();
        if shared >= MIN_SHARED_PREFIX {
            read.token_ids.drain(..shared);
            read.shared_prefix = shared as u32;
        }
    }
}

fn span_to_pb(span: SpanFromEnd) -> pb::PooledSpan {
    pb::PooledSpan {
        start: span.start,
        end: span.end,
    }
}

/// Every first token that starts a label (to tell whether the model's own pick is a label).
pub fn first_tokens(labels: &[LabelGroup]) -> impl Iterator<Item = u32> + '_ {
    labels
        .iter()
        .flat_map(|g| g.variants.iter().filter_map(|v| v.first().copied()))
}

fn groups_to_pb(labels: &[LabelGroup]) -> Vec<pb::LabelGroup> {
    labels
        .iter()
        .map(|group| pb::LabelGroup {
            variants: group
                .variants
                .iter()
                .map(|v| pb::LabelSequence {
                    token_ids: v.clone(),
                })
                .collect(),
        })
        .collect()
}

/// What the shard said about one answer position, checked to have its labels' shape.
#[derive(Clone, Debug, PartialEq)]
pub struct RowOutcome {
    /// log P(variant | prompt), per label group and variant, in the read's order.
    pub variant_logprobs: Vec<Vec<f64>>,
    pub greedy_token_id: u32,
}

impl RowOutcome {
    /// Each label's log-prob: the best of its variants (the model "says" a label by any one spelling).
    pub fn label_logprobs(&self) -> Vec<f64> {
        self.variant_logprobs
            .iter()
            .map(|v| v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
            .collect()
    }

    /// Probability the model puts on any spelling of any label (every variant counts).
    pub fn label_mass(&self) -> f64 {
        self.variant_logprobs
            .iter()
            .flatten()
            .map(|lp| lp.exp())
            .sum::<f64>()
            .min(1.0)
    }
}

/// What the shard said about one read, checked to have the read's shape: one row for a next-token
/// read, one per canvas row for a canvas read.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadOutcome {
    pub rows: Vec<RowOutcome>,
    /// A pooled read's option logits, per question in the read's order, per option in the prompt's
    /// option order (empty for other kinds).
    pub option_logits: Vec<Vec<f64>>,
    pub tokens_computed: u32,
    pub tokens_cached: u32,
    /// Tokens the read's media expanded into (part of `tokens_computed`).
    pub media_tokens: u32,
}

impl ReadOutcome {
    /// Checks that `result` answers `read`: the same kind, one row per answer position, one entry per
    /// label group, one log-prob per variant, each a log-probability (≤ 0, or −∞ for an impossible
    /// label). A shard that breaks this is a bug there; it becomes a 500 naming what was wrong, never
    /// a panic here.
    pub fn check(read: &PreparedRead, result: pb::ReadResult) -> Result<Self, OutcomeError> {
        if read.media.is_empty() && result.media_tokens != 0 {
            return Err(OutcomeError::MediaTokens(result.media_tokens));
        }
        let mut option_logits = Vec::new();
        let rows = match (&read.kind, result.kind) {
            (ReadKind::NextToken { labels }, Some(pb::read_result::Kind::NextToken(r))) => {
                vec![check_row(labels, r.labels, r.greedy_token_id, None)?]
            }
            (ReadKind::Pooled { questions, .. }, Some(pb::read_result::Kind::Pooled(r))) => {
                option_logits = check_pooled(questions, r)?;
                Vec::new()
            }
            (ReadKind::Canvas { rows, .. }, Some(pb::read_result::Kind::Canvas(r))) => {
                if r.rows.len() != rows.len() {
                    return Err(OutcomeError::CanvasRows {
                        got: r.rows.len(),
                        expected: rows.len(),
                    });
                }
                rows.iter()
                    .zip(r.rows)
                    .enumerate()
                    .map(|(i, (row, got))| {
                        check_row(&row.labels, got.labels, got.greedy_token_id, Some(i))
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            (kind, got) => {
                let expected = match kind {
                    ReadKind::NextToken { .. } => "next_token",
                    ReadKind::Canvas { .. } => "canvas",
                    ReadKind::Pooled { .. } => "pooled",
                };
                return Err(match got {
                    None => OutcomeError::NoKind { expected },
                    Some(_) => OutcomeError::OtherKind { expected },
                });
            }
        };
        Ok(ReadOutcome {
            rows,
            option_logits,
            tokens_computed: result.tokens_computed,
            tokens_cached: result.tokens_cached,
            media_tokens: result.media_tokens,
        })
    }

    /// The only row of a next-token read (the first of a canvas).
    pub fn row(&self) -> &RowOutcome {
        &self.rows[0]
    }
}

/// What a shard's result got wrong against its read: a bug on the shard, answered 500 naming it.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OutcomeError {
    #[error("the shard counted {0} media tokens for a read without media")]
    MediaTokens(u32),
    #[error("the shard's result has no kind (expected {expected})")]
    NoKind { expected: &'static str },
    #[error("the shard's result is of another kind (expected {expected})")]
    OtherKind { expected: &'static str },
    #[error("the shard returned {got} canvas rows for a read of {expected}")]
    CanvasRows { got: usize, expected: usize },
    #[error("the shard returned {got} pooled questions for a read of {expected}")]
    PooledQuestions { got: usize, expected: usize },
    #[error(
        "pooled question {question}: the shard returned {got} option logits for {options} options"
    )]
    OptionLogits {
        question: usize,
        got: usize,
        options: usize,
    },
    #[error("pooled question {question}: option logit {value} is not finite")]
    LogitNotFinite { question: usize, value: f64 },
    #[error("{}the shard returned {got} label groups for a read of {expected}", row_prefix(*.row))]
    LabelGroups {
        row: Option<usize>,
        got: usize,
        expected: usize,
    },
    #[error("{}label group {group}: the shard returned {got} log-probs for {variants} variants", row_prefix(*.row))]
    Variants {
        row: Option<usize>,
        group: usize,
        got: usize,
        variants: usize,
    },
    #[error("{}label group {group}: {value} is not a log-probability", row_prefix(*.row))]
    NotALogprob {
        row: Option<usize>,
        group: usize,
        value: f64,
    },
}

/// Where in a canvas read an error is (`None`: a next-token read's only row).
fn row_prefix(row: Option<usize>) -> String {
    row.map(|i| format!("canvas row {i}: ")).unwrap_or_default()
}

/// One logit per option of every question, each finite.
fn check_pooled(
    questions: &[PooledQuestion],
    got: pb::PooledResult,
) -> Result<Vec<Vec<f64>>, OutcomeError> {
    if got.questions.len() != questions.len() {
        return Err(OutcomeError::PooledQuestions {
            got: got.questions.len(),
            expected: questions.len(),
        });
    }
    questions
        .iter()
        .zip(got.questions)
        .enumerate()
        .map(|(i, (question, got))| {
            if got.option_logits.len() != question.options.len() {
                return Err(OutcomeError::OptionLogits {
                    question: i,
                    got: got.option_logits.len(),
                    options: question.options.len(),
                });
            }
            if let Some(bad) = got.option_logits.iter().find(|v| !v.is_finite()) {
                return Err(OutcomeError::LogitNotFinite {
                    question: i,
                    value: *bad,
                });
            }
            Ok(got.option_logits)
        })
        .collect()
}

fn check_row(
    labels: &[LabelGroup],
    got: Vec<pb::LabelGroupLogprobs>,
    greedy_token_id: u32,
    row: Option<usize>,
) -> Result<RowOutcome, OutcomeError> {
    if got.len() != labels.len() {
        return Err(OutcomeError::LabelGroups {
            row,
            got: got.len(),
            expected: labels.len(),
        });
    }
    let mut variant_logprobs = Vec::with_capacity(labels.len());
    for (i, (group, got)) in labels.iter().zip(got).enumerate() {
        if got.variant_logprobs.len() != group.variants.len() {
            return Err(OutcomeError::Variants {
                row,
                group: i,
                got: got.variant_logprobs.len(),
                variants: group.variants.len(),
            });
        }
        if let Some(bad) = got
            .variant_logprobs
            .iter()
            .find(|lp| lp.is_nan() || **lp > 1e-6)
        {
            return Err(OutcomeError::NotALogprob {
                row,
                group: i,
                value: *bad,
            });
        }
        variant_logprobs.push(got.variant_logprobs);
    }
    Ok(RowOutcome {
        variant_logprobs,
        greedy_token_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read() -> PreparedRead {
        PreparedRead::next_token(
            vec![1, 2, 3],
            vec![
                LabelGroup {
                    variants: vec![vec![10], vec![11], vec![12]],
                },
                LabelGroup::single(vec![20, 21]),
            ],
        )
    }

    /// What the shard rebuilds from a batch sent with `share_prefixes`: each prompt whole again.
    fn unshared(reads: &[pb::Read]) -> Vec<Vec<u32>> {
        let mut prompts: Vec<Vec<u32>> = Vec::new();
        for read in reads {
            let Some(pb::read::Kind::NextToken(t)) = &read.kind else {
                prompts.push(Vec::new());
                continue;
            };
            let shared = t.shared_prefix as usize;
            let mut prompt = if shared > 0 {
                prompts.last().expect("a previous read")[..shared].to_vec()
            } else {
                Vec::new()
            };
            prompt.extend(&t.token_ids);
            prompts.push(prompt);
        }
        prompts
    }

    #[test]
    fn a_batch_sends_each_state_once_and_the_shard_can_rebuild_every_prompt() {
        let state: Vec<u32> = (100..612).collect();
        let with = |tail: &[u32]| [state.clone(), tail.to_vec()].concat();
        let prompts = vec![
            with(&[1, 2, 3]),
            with(&[1, 2, 4]),
            with(&[9]),
            (0..20).collect(),                // another state: nothing shared
            (0..7).chain([50, 51]).collect(), // 7 tokens shared: under the minimum
            (0..20).collect(),                // the same prompt as two reads before: shared whole
            (0..20).collect(),
        ];
        let mut reads: Vec<pb::Read> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                PreparedRead::next_token(p.clone(), vec![LabelGroup::single(vec![10])])
                    .to_pb(i as u64, "")
            })
            .collect();
        // A canvas read between two next-token reads breaks the chain: the one after it is whole.
        reads.insert(3, canvas_read().to_pb(99, ""));
        share_prefixes(&mut reads);
        let sent: Vec<(u32, usize)> = reads
            .iter()
            .filter_map(|r| match &r.kind {
                Some(pb::read::Kind::NextToken(t)) => Some((t.shared_prefix, t.token_ids.len())),
                _ => None,
            })
            .collect();
        assert_eq!(
            sent,
            vec![
                (0, 515),
                (514, 1),
                (512, 1),
                (0, 20),
                (0, 9),
                (0, 20),
                (20, 0)
            ]
        );
        let mut rebuilt = unshared(&reads);
        rebuilt.remove(3);
        assert_eq!(rebuilt, prompts);
    }

    fn canvas_read() -> PreparedRead {
        PreparedRead::canvas(
            vec![1, 2, 3],
            vec![7, 8, 9, 9],
            vec![
                CanvasRow {
                    position: 0,
                    labels: vec![LabelGroup::single(vec![10]), LabelGroup::single(vec![11])],
                },
                CanvasRow {
                    position: 2,
                    labels: vec![LabelGroup {
                        variants: vec![vec![12], vec![13]],
                    }],
                },
            ],
        )
    }

    fn canvas_result(rows: Vec<Vec<Vec<f64>>>) -> pb::ReadResult {
        pb::ReadResult {
            id: 0,
            tokens_computed: 3,
            tokens_cached: 0,
            media_tokens: 0,
            media_error: String::new(),
            kind: Some(pb::read_result::Kind::Canvas(pb::CanvasResult {
                rows: rows
                    .into_iter()
                    .enumerate()
                    .map(|(i, groups)| pb::CanvasRowResult {
                        labels: groups
                            .into_iter()
                            .map(|v| pb::LabelGroupLogprobs {
                                variant_logprobs: v,
                            })
                            .collect(),
                        greedy_token_id: 10 + i as u32,
                    })
                    .collect(),
            })),
        }
    }

    #[test]
    fn canvas_reads_travel_with_their_rows_and_results_are_checked_per_row() {
        let pb = canvas_read().to_pb(3, "");
        let Some(pb::read::Kind::Canvas(c)) = pb.kind else {
            panic!("canvas read expected")
        };
        assert_eq!(
            (c.prompt_ids, c.canvas_ids),
            (vec![1, 2, 3], vec![7, 8, 9, 9])
        );
        assert_eq!(
            c.rows.iter().map(|r| r.position).collect::<Vec<_>>(),
            vec![0, 2]
        );
        assert_eq!(c.rows[1].labels[0].variants.len(), 2);
        assert_eq!(canvas_read().questions(), 2);
        let outcome = ReadOutcome::check(
            &canvas_read(),
            canvas_result(vec![vec![vec![-1.0], vec![-2.0]], vec![vec![-3.0, -0.5]]]),
        )
        .expect("well-formed");
        assert_eq!(outcome.rows.len(), 2);
        assert_eq!(outcome.rows[1].label_logprobs(), vec![-0.5]);
        assert_eq!(outcome.rows[1].greedy_token_id, 11);
        let cases: Vec<(pb::ReadResult, &str)> = vec![
            (
                canvas_result(vec![vec![vec![-1.0], vec![-2.0]]]),
                "1 canvas rows for a read of 2",
            ),
            (
                canvas_result(vec![vec![vec![-1.0]], vec![vec![-3.0, -0.5]]]),
                "canvas row 0: the shard returned 1 label groups for a read of 2",
            ),
            (
                canvas_result(vec![vec![vec![-1.0], vec![-2.0]], vec![vec![-3.0]]]),
                "canvas row 1: label group 0: the shard returned 1 log-probs for 2 variants",
            ),
            (
                canvas_result(vec![
                    vec![vec![-1.0], vec![f64::NAN]],
                    vec![vec![-3.0, -0.5]],
                ]),
                "canvas row 0: label group 1: NaN is not a log-probability",
            ),
            (result(vec![vec![-1.0]]), "another kind (expected canvas)"),
            (
                pb::ReadResult {
                    kind: None,
                    ..Default::default()
                },
                "no kind (expected canvas)",
            ),
        ];
        for (bad, expected) in cases {
            let err = ReadOutcome::check(&canvas_read(), bad).expect_err(expected);
            assert!(
                err.to_string().contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
        let err = ReadOutcome::check(&read(), canvas_result(vec![])).expect_err("kind");
        assert_eq!(
            err,
            OutcomeError::OtherKind {
                expected: "next_token"
            }
        );
        assert!(err
            .to_string()
            .contains("another kind (expected next_token)"));
    }

    fn result(groups: Vec<Vec<f64>>) -> pb::ReadResult {
        pb::ReadResult {
            id: 0,
            tokens_computed: 3,
            tokens_cached: 0,
            media_tokens: 0,
            media_error: String::new(),
            kind: Some(pb::read_result::Kind::NextToken(pb::NextTokenResult {
                labels: groups
                    .into_iter()
                    .map(|v| pb::LabelGroupLogprobs {
                        variant_logprobs: v,
                    })
                    .collect(),
                greedy_token_id: 11,
            })),
        }
    }

    #[test]
    fn groups_travel_as_variants_in_order() {
        let pb = read().to_pb(7, "salt");
        let Some(pb::read::Kind::NextToken(r)) = pb.kind else {
            panic!("next-token read expected")
        };
        assert_eq!((pb.id, pb.cache_salt.as_str()), (7, "salt"));
        assert_eq!(r.token_ids, vec![1, 2, 3]);
        let variants: Vec<Vec<Vec<u32>>> = r
            .labels
            .iter()
            .map(|g| g.variants.iter().map(|v| v.token_ids.clone()).collect())
            .collect();
        assert_eq!(
            variants,
            vec![vec![vec![10], vec![11], vec![12]], vec![vec![20, 21]]]
        );
        let read = read();
        assert_eq!(
            first_tokens(read.question_labels()[0]).collect::<Vec<_>>(),
            vec![10, 11, 12, 20]
        );
    }

    #[test]
    fn a_label_is_its_best_variant_and_the_mass_sums_every_variant() {
        let lp = |p: f64| p.ln();
        let outcome = ReadOutcome::check(
            &read(),
            result(vec![vec![lp(0.2), lp(0.3), lp(0.1)], vec![lp(0.25)]]),
        )
        .expect("well-formed");
        let labels = outcome.row().label_logprobs();
        assert!((labels[0] - lp(0.3)).abs() < 1e-12 && (labels[1] - lp(0.25)).abs() < 1e-12);
        assert!((outcome.row().label_mass() - 0.85).abs() < 1e-12);
        let impossible = ReadOutcome::check(
            &read(),
            result(vec![vec![f64::NEG_INFINITY; 3], vec![lp(0.5)]]),
        )
        .unwrap();
        assert_eq!(impossible.row().label_logprobs()[0], f64::NEG_INFINITY);
    }

    #[test]
    fn results_of_the_wrong_shape_are_errors_not_panics() {
        let cases: Vec<(pb::ReadResult, &str)> = vec![
            (
                pb::ReadResult {
                    kind: None,
                    ..Default::default()
                },
                "no kind",
            ),
            (
                result(vec![vec![-1.0, -1.0, -1.0]]),
                "1 label groups for a read of 2",
            ),
            (
                result(vec![vec![-1.0], vec![-1.0]]),
                "group 0: the shard returned 1 log-probs for 3 variants",
            ),
            (
                result(vec![vec![-1.0, f64::NAN, -1.0], vec![-1.0]]),
                "NaN is not a log-probability",
            ),
            (
                result(vec![vec![-1.0, -1.0, -1.0], vec![0.5]]),
                "0.5 is not a log-probability",
            ),
        ];
        for (bad, expected) in cases {
            let err = ReadOutcome::check(&read(), bad).expect_err(expected);
            assert!(
                err.to_string().contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }
}
