//! One read as the router sends it to the shards and what comes back, in the contract's terms (a kind
//! per read and per result). Every result is checked against its read before anything uses it.

use std::sync::Arc;

use decision_proto::v1 as pb;

use crate::error::DecisionError;
use crate::ir::Modality;

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

/// One media input as fetched, ready for the shard's processor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadMedia {
    pub modality: Modality,
    /// The request field and position (`images.0`): shard errors about it name it.
    pub name: String,
    pub data: Arc<[u8]>,
    /// Hex sha256 of `data`.
    pub sha256: String,
}

/// One question ready for the shard: its whole prompt, the label groups read after it, and the media
/// its placeholder tokens stand for (shared by every read of a request).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreparedRead {
    pub token_ids: Vec<u32>,
    pub labels: Vec<LabelGroup>,
    pub media: Arc<[ReadMedia]>,
}

impl PreparedRead {
    /// Every first token that starts a label (to tell whether the model's own pick is a label).
    pub fn first_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.labels
            .iter()
            .flat_map(|g| g.variants.iter().filter_map(|v| v.first().copied()))
    }

    pub fn to_pb(&self, id: u64, cache_salt: &str) -> pb::Read {
        let labels = self
            .labels
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
            .collect();
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
            })
            .collect();
        pb::Read {
            id,
            cache_salt: cache_salt.to_owned(),
            media,
            kind: Some(pb::read::Kind::NextToken(pb::NextTokenRead {
                token_ids: self.token_ids.clone(),
                labels,
            })),
        }
    }
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

/// What the shard said about one read, checked to have the read's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadOutcome {
    /// log P(variant | prompt), per label group and variant, in the read's order.
    pub variant_logprobs: Vec<Vec<f64>>,
    pub greedy_token_id: u32,
    pub tokens_computed: u32,
    pub tokens_cached: u32,
    /// Tokens the read's media expanded into (part of `tokens_computed`).
    pub media_tokens: u32,
}

impl ReadOutcome {
    /// Checks that `result` answers `read`: the same kind, one entry per label group, one log-prob per
    /// variant, each a log-probability (≤ 0, or −∞ for an impossible label). A shard that breaks this is
    /// a bug there; it becomes a 500 naming what was wrong, never a panic here.
    pub fn check(read: &PreparedRead, result: pb::ReadResult) -> Result<Self, String> {
        let next_token = match result.kind {
            Some(pb::read_result::Kind::NextToken(r)) => r,
            None => return Err("the shard's result has no kind (expected next_token)".into()),
        };
        if read.media.is_empty() && result.media_tokens != 0 {
            return Err(format!(
                "the shard counted {} media tokens for a read without media",
                result.media_tokens
            ));
        }
        if next_token.labels.len() != read.labels.len() {
            return Err(format!(
                "the shard returned {} label groups for a read of {}",
                next_token.labels.len(),
                read.labels.len()
            ));
        }
        let mut variant_logprobs = Vec::with_capacity(read.labels.len());
        for (i, (group, got)) in read.labels.iter().zip(next_token.labels).enumerate() {
            if got.variant_logprobs.len() != group.variants.len() {
                return Err(format!(
                    "label group {i}: the shard returned {} log-probs for {} variants",
                    got.variant_logprobs.len(),
                    group.variants.len()
                ));
            }
            if let Some(bad) = got
                .variant_logprobs
                .iter()
                .find(|lp| lp.is_nan() || **lp > 1e-6)
            {
                return Err(format!("label group {i}: {bad} is not a log-probability"));
            }
            variant_logprobs.push(got.variant_logprobs);
        }
        Ok(ReadOutcome {
            variant_logprobs,
            greedy_token_id: next_token.greedy_token_id,
            tokens_computed: result.tokens_computed,
            tokens_cached: result.tokens_cached,
            media_tokens: result.media_tokens,
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn read() -> PreparedRead {
        PreparedRead {
            token_ids: vec![1, 2, 3],
            labels: vec![
                LabelGroup {
                    variants: vec![vec![10], vec![11], vec![12]],
                },
                LabelGroup::single(vec![20, 21]),
            ],
            ..Default::default()
        }
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
        assert_eq!(
            read().first_tokens().collect::<Vec<_>>(),
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
        let labels = outcome.label_logprobs();
        assert!((labels[0] - lp(0.3)).abs() < 1e-12 && (labels[1] - lp(0.25)).abs() < 1e-12);
        assert!((outcome.label_mass() - 0.85).abs() < 1e-12);
        let impossible = ReadOutcome::check(
            &read(),
            result(vec![vec![f64::NEG_INFINITY; 3], vec![lp(0.5)]]),
        )
        .unwrap();
        assert_eq!(impossible.label_logprobs()[0], f64::NEG_INFINITY);
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
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }
}
