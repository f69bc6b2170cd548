//! PriDe's label-prior correction (`x_debias: "prior"`, `--debias prior`): a model's preference for a label
//! (position) whatever it labels, estimated per question signature from live traffic without any answers
//! known, then divided out of a single read.
//!
//! Estimation needs every cyclic order of a choice (a rotated read with K = n): there each option sits at
//! each position once, so the mean over the orders of `ln p(position j)` is the position's log-prior plus
//! terms equal for every position (PriDe, Zheng et al. 2024, eq. 5). The orders are taken in their canonical
//! sequence (sorted by what they show, `debias::variants`), never in the order the client sent, so the
//! estimate a sample adds does not depend on how its options were listed. This module sits below
//! `debias.rs`, which calls it, and knows nothing of orders.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::ir::{Answer, Question, QuestionKind};

/// Rotated reads of a signature before single reads of it are corrected (PriDe estimates on a few
/// percent of the traffic; a handful of samples already fixes the prior of one question form).
pub const DEFAULT_MIN_SAMPLES: u64 = 8;
/// Signatures kept at most; past it new ones are not estimated (their questions keep being rotated).
pub const MAX_SIGNATURES: usize = 4096;

/// A question's form without its state: its kind, its labels (the option count) and a hash of its
/// wording (instructions and the options as a set: names and descriptions in name order, so the same
/// question listed in another order has the same signature). The one rule for "the same question":
/// label priors are kept under it, and calibration fits (`calibration/`) are fitted and looked up by
/// it. The hash is SHA-256 over a length-prefixed encoding, so a signature stored on disk means the
/// same question in every build of the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signature(u64);

impl Signature {
    /// The signature a label prior is kept under. Only choices have a label prior apart from their
    /// content: a yes/no's labels are its answers, and a score's two orders are not all of its
    /// cyclic ones.
    pub fn of(question: &Question) -> Option<Signature> {
        matches!(question.kind, QuestionKind::Choice { .. }).then(|| Signature::form(question))
    }

    /// The signature of any question: a choice's options as a set, a yes/no's two descriptions
    /// (whichever side it shows first), a score's levels in their order (a level's index is its
    /// value).
    pub fn form(question: &Question) -> Signature {
        let mut hasher = Sha256::new();
        let mut text = |s: Option<&str>| match s {
            None => hasher.update([0u8]),
            Some(s) => {
                hasher.update([1u8]);
                hasher.update((s.len() as u64).to_le_bytes());
                hasher.update(s.as_bytes());
            }
        };
        text(Some(question.kind.kind().name()));
        text(Some(&question.kind.arity().to_string()));
        text(question.instructions.as_deref());
        match &question.kind {
            QuestionKind::Choice { options } => {
                let mut listed: Vec<(&str, Option<&str>)> = options
                    .iter()
                    .map(|o| (o.name.as_str(), o.description.as_deref()))
                    .collect();
                listed.sort_unstable();
                for (name, description) in listed {
                    text(Some(name));
                    text(description);
                }
            }
            QuestionKind::YesNo { yes, no, .. } => {
                text(yes.as_deref());
                text(no.as_deref());
            }
            QuestionKind::Score { levels, .. } => {
                for level in levels {
                    text(Some(level));
                }
            }
        }
        let digest = hasher.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        Signature(u64::from_be_bytes(first))
    }

    /// As requests and stored fits spell it: 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }

    /// A signature spelled by `hex`; `None` for anything else.
    pub fn from_hex(text: &str) -> Option<Signature> {
        (text.len() == 16
            && text
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then(|| u64::from_str_radix(text, 16).ok().map(Signature))
        .flatten()
    }
}

/// One sample's log-prior per position, from the reads of all n cyclic orders of one n-option question
/// (the caller knows they are; `debias.rs` passes only full rotation sets), centred: only differences
/// between positions mean anything. `None` when the reads are not n reads of n labels each.
pub fn sample_log_prior(reads: &[Answer]) -> Option<Vec<f64>> {
    let n = reads.len();
    if n < 2 || reads.iter().any(|r| r.probabilities.len() != n) {
        return None;
    }
    let mut sums = vec![0.0; n];
    for read in reads {
        for (j, p) in read.probabilities.iter().enumerate() {
            // A probability of 0 would make the prior infinite: floor it at the smallest normal f64.
            sums[j] += p.max(f64::MIN_POSITIVE).ln();
        }
    }
    let means: Vec<f64> = sums.into_iter().map(|s| s / n as f64).collect();
    let centre = means.iter().sum::<f64>() / n as f64;
    Some(means.into_iter().map(|m| m - centre).collect())
}

/// The prior as probabilities over positions: `softmax` of the mean log-prior.
pub fn prior_probabilities(log_prior: &[f64]) -> Vec<f64> {
    crate::probability::softmax(log_prior, 1.0)
}

/// PriDe's correction of one read: `p(j) / prior(j)`, renormalised.
pub fn correct(probabilities: &[f64], prior: &[f64]) -> Vec<f64> {
    let raw: Vec<f64> = probabilities
        .iter()
        .zip(prior)
        .map(|(p, q)| p / q)
        .collect();
    let sum: f64 = raw.iter().sum();
    if !(sum.is_finite() && sum > 0.0) {
        return probabilities.to_vec();
    }
    raw.into_iter().map(|r| r / sum).collect()
}

#[derive(Clone, Debug, Default)]
struct Estimate {
    log_sum: Vec<f64>,
    samples: u64,
}

/// A prior ready to apply: per position, and how many samples it was estimated from.
#[derive(Clone, Debug, PartialEq)]
pub struct Prior {
    pub probabilities: Vec<f64>,
    pub samples: u64,
}

/// The estimates of this router's live traffic, by signature. A request touches it twice (a look-up
/// before its reads, a sample after them), each a few map operations under the lock.
#[derive(Debug)]
pub struct PriorBook {
    estimates: Mutex<HashMap<Signature, Estimate>>,
    min_samples: u64,
}

impl PriorBook {
    pub fn new(min_samples: u64) -> PriorBook {
        PriorBook {
            estimates: Mutex::new(HashMap::new()),
            min_samples: min_samples.max(1),
        }
    }

    /// Adds one sample's centred log-prior to its signature's estimate.
    pub fn observe(&self, signature: Signature, log_prior: &[f64]) {
        let Ok(mut estimates) = self.estimates.lock() else {
            return;
        };
        if !estimates.contains_key(&signature) && estimates.len() >= MAX_SIGNATURES {
            return;
        }
        let estimate = estimates.entry(signature).or_default();
        if estimate.log_sum.len() != log_prior.len() {
            *estimate = Estimate {
                log_sum: vec![0.0; log_prior.len()],
                samples: 0,
            };
        }
        for (sum, x) in estimate.log_sum.iter_mut().zip(log_prior) {
            *sum += x;
        }
        estimate.samples += 1;
    }

    /// The signature's prior over `n` positions once it has enough samples.
    pub fn prior(&self, signature: Signature, n: usize) -> Option<Prior> {
        let estimates = self.estimates.lock().ok()?;
        let estimate = estimates.get(&signature)?;
        if estimate.samples < self.min_samples || estimate.log_sum.len() != n {
            return None;
        }
        let mean: Vec<f64> = estimate
            .log_sum
            .iter()
            .map(|s| s / estimate.samples as f64)
            .collect();
        Some(Prior {
            probabilities: prior_probabilities(&mean),
            samples: estimate.samples,
        })
    }

    /// Samples held for a signature (0 when none).
    pub fn samples(&self, signature: Signature) -> u64 {
        self.estimates
            .lock()
            .ok()
            .and_then(|e| e.get(&signature).map(|e| e.samples))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ChoiceOption;
    use crate::probability;

    /// Every cyclic order of a question's options (what `debias::variants` reads, built here so this
    /// module's tests do not reach above it).
    fn rotations(q: &Question) -> Vec<QuestionKind> {
        let QuestionKind::Choice { options } = &q.kind else {
            unreachable!()
        };
        (0..options.len())
            .map(|s| QuestionKind::Choice {
                options: options[s..].iter().chain(&options[..s]).cloned().collect(),
            })
            .collect()
    }

    /// A tiny deterministic generator (no dependency): xorshift64*.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn question(names: &[String], instructions: &str) -> Question {
        Question {
            id: "q".into(),
            instructions: Some(instructions.into()),
            kind: QuestionKind::Choice {
                options: names
                    .iter()
                    .map(|n| ChoiceOption {
                        name: n.clone(),
                        description: None,
                    })
                    .collect(),
            },
        }
    }

    /// The model PriDe assumes: `p(position j) ∝ exp(content of the option shown there + bias_j)`.
    fn read(kind: &QuestionKind, content: &HashMap<String, f64>, bias: &[f64]) -> Answer {
        let QuestionKind::Choice { options } = kind else {
            unreachable!()
        };
        let logits: Vec<f64> = options
            .iter()
            .enumerate()
            .map(|(j, o)| content[&o.name] + bias[j])
            .collect();
        probability::answer(logits, 1.0, true, 1.0)
    }

    /// The test: synthetic traffic (random content per sample, one planted position bias) feeds
    /// the estimator through rotated reads, which recovers the planted prior; then a single read
    /// corrected by it gives the content's own distribution.
    #[test]
    fn estimation_on_synthetic_traffic_recovers_a_planted_bias() {
        let planted = [1.2, -0.3, 0.4, -1.0];
        let names: Vec<String> = ["billing", "tech", "sales", "legal"]
            .map(String::from)
            .to_vec();
        let book = PriorBook::new(DEFAULT_MIN_SAMPLES);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let signature = Signature::of(&question(&names, "Which team?")).unwrap();
        let mut last_content = HashMap::new();
        for sample in 0..50 {
            let content: HashMap<String, f64> = names
                .iter()
                .map(|n| (n.clone(), 4.0 * rng.next() - 2.0))
                .collect();
            // Each sample arrives in its own order: the estimate must not care.
            let shift = sample % names.len();
            let sent: Vec<String> = names[shift..]
                .iter()
                .chain(&names[..shift])
                .cloned()
                .collect();
            let q = question(&sent, "Which team?");
            assert_eq!(Signature::of(&q), Some(signature));
            let reads: Vec<Answer> = rotations(&q)
                .iter()
                .map(|kind| read(kind, &content, &planted))
                .collect();
            book.observe(signature, &sample_log_prior(&reads).unwrap());
            if sample + 1 < DEFAULT_MIN_SAMPLES as usize {
                assert_eq!(book.prior(signature, 4), None);
            }
            last_content = content;
        }
        let prior = book.prior(signature, 4).unwrap();
        assert_eq!(prior.samples, 50);
        let expected = probability::softmax(&planted, 1.0);
        for (got, want) in prior.probabilities.iter().zip(&expected) {
            assert!(
                (got - want).abs() < 1e-12,
                "{:?} vs {expected:?}",
                prior.probabilities
            );
        }
        // Applied as PriDe does: one read, divided by the prior, is the content's distribution.
        let q = question(&names, "Which team?");
        let observed = read(&q.kind, &last_content, &planted);
        let corrected = correct(&observed.probabilities, &prior.probabilities);
        let truth = probability::softmax(
            &names.iter().map(|n| last_content[n]).collect::<Vec<_>>(),
            1.0,
        );
        for (got, want) in corrected.iter().zip(&truth) {
            assert!((got - want).abs() < 1e-12, "{corrected:?} vs {truth:?}");
        }
    }

    #[test]
    fn signatures_ignore_the_option_order_but_not_the_wording() {
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let reversed: Vec<String> = names.iter().rev().cloned().collect();
        let a = Signature::of(&question(&names, "Pick"));
        assert_eq!(a, Signature::of(&question(&reversed, "Pick")));
        assert_ne!(a, Signature::of(&question(&names, "Pick one")));
        assert_ne!(a, Signature::of(&question(&names[..2], "Pick")));
        let yes_no = Question {
            id: "q".into(),
            instructions: None,
            kind: QuestionKind::YesNo {
                yes: None,
                no: None,
                no_first: false,
            },
        };
        assert_eq!(Signature::of(&yes_no), None);
    }

    #[test]
    fn a_sample_is_n_reads_of_n_labels_centred() {
        let names: Vec<String> = (0..6).map(|i| format!("o{i}")).collect();
        let q = question(&names, "Pick");
        let content: HashMap<String, f64> = names.iter().map(|n| (n.clone(), 0.0)).collect();
        let bias = [0.5, 0.0, 0.0, 0.0, 0.0, -0.5];
        let reads: Vec<Answer> = rotations(&q)
            .iter()
            .map(|kind| read(kind, &content, &bias))
            .collect();
        assert_eq!(sample_log_prior(&reads[..4]), None);
        let sample = sample_log_prior(&reads).unwrap();
        assert!(sample.iter().sum::<f64>().abs() < 1e-12, "{sample:?}");
        assert!(
            (sample[0] - 0.5).abs() < 1e-12 && (sample[5] + 0.5).abs() < 1e-12,
            "{sample:?}"
        );
    }

    #[test]
    fn a_zero_probability_does_not_poison_the_estimate_or_the_correction() {
        assert_eq!(correct(&[0.5, 0.5], &[0.0, 1.0]), vec![0.5, 0.5]);
        let c = correct(&[0.2, 0.8], &[0.8, 0.2]);
        assert!((c[0] - 1.0 / 17.0).abs() < 1e-12);
    }
}
