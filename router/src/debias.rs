//! Order-debiased reads (`--debias`, a request's `x_debias`): each question is read under several
//! orders of its answers, every answer's probability is averaged by name (never by position), and
//! each answer reports how far the chosen option moved across the orders read.
//!
//! The expansion is a plain IR rewrite before the strategy renders anything: the K orders of a
//! question are K questions of one request, so they share its state (the tree engine computes the
//! chat head and state once, and each order's short suffix). Strategies and the shard never know.

use crate::ir::{Answer, DecisionRequest, Question, QuestionKind};
pub use crate::ir::{Debias, OrderReport};
use crate::label_prior::{self, Prior, PriorBook, Signature};
use crate::probability;

/// `--debias-max-orders`' default: rotations read per choice.
pub const DEFAULT_MAX_ORDERS: usize = 4;

/// One order of a question: the question as rendered, and for each answer position of its read the
/// index of that answer in the question as sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    pub kind: QuestionKind,
    pub back: Vec<usize>,
    /// Where each answer (by its index as sent) is shown in this order, for the canonical sum.
    pub shown_at: Vec<usize>,
}

/// The cyclic shifts a choice of `n` options is read under: all of them when `n <= max_orders`,
/// else `max_orders` evenly spaced ones (`⌊i·n/K⌋`: a subgroup of the rotations when K divides n,
/// so the same orders are read whichever of them was sent).
pub fn rotation_shifts(n: usize, max_orders: usize) -> Vec<usize> {
    let k = n.min(max_orders.max(1));
    (0..k).map(|i| i * n / k).collect()
}

/// The orders a question is read under (the order sent among them), sorted by what they show, so
/// that requests sending any of them read the same prompts in the same sequence.
pub fn variants(kind: &QuestionKind, max_orders: usize) -> Vec<Variant> {
    let mut out: Vec<Variant> = match kind {
        QuestionKind::Choice { options } => rotation_shifts(options.len(), max_orders)
            .into_iter()
            .map(|s| {
                let n = options.len();
                let back: Vec<usize> = (0..n).map(|j| (j + s) % n).collect();
                Variant {
                    kind: QuestionKind::Choice {
                        options: back.iter().map(|&i| options[i].clone()).collect(),
                    },
                    shown_at: inverse(&back),
                    back,
                }
            })
            .collect(),
        QuestionKind::Score { levels, sent } => {
            let n = levels.len();
            let forward: Vec<usize> = (0..n).collect();
            let mut orders = vec![forward.clone()];
            if n > 1 {
                orders.push(forward.into_iter().rev().collect());
            }
            orders
                .into_iter()
                .map(|back| Variant {
                    kind: QuestionKind::Score {
                        levels: back.iter().map(|&i| levels[i].clone()).collect(),
                        sent: back.iter().map(|&i| sent[i].clone()).collect(),
                    },
                    shown_at: inverse(&back),
                    back,
                })
                .collect()
        }
        // Labels are read by name (yes, no) in either display order.
        QuestionKind::YesNo { yes, no, no_first } => [*no_first, !*no_first]
            .into_iter()
            .map(|first| Variant {
                kind: QuestionKind::YesNo {
                    yes: yes.clone(),
                    no: no.clone(),
                    no_first: first,
                },
                back: vec![0, 1],
                shown_at: if first { vec![1, 0] } else { vec![0, 1] },
            })
            .collect(),
    };
    out.sort_by_cached_key(|v| display_key(&v.kind));
    out
}

fn inverse(back: &[usize]) -> Vec<usize> {
    let mut shown_at = vec![0; back.len()];
    for (j, &i) in back.iter().enumerate() {
        shown_at[i] = j;
    }
    shown_at
}

/// What an order shows, in order: the key variants are sorted by.
fn display_key(kind: &QuestionKind) -> Vec<String> {
    match kind {
        QuestionKind::Choice { options } => options
            .iter()
            .map(|o| format!("{}\u{0}{}", o.name, o.description.as_deref().unwrap_or("")))
            .collect(),
        QuestionKind::Score { levels, .. } => levels.clone(),
        QuestionKind::YesNo { no_first, .. } => vec![no_first.to_string()],
    }
}

/// How one question of a debiased request is read.
enum Plan {
    /// In each of these orders, averaged by name (a choice read in all its rotations also adds a
    /// sample to its signature's prior).
    Orders {
        variants: Vec<Variant>,
        signature: Option<Signature>,
    },
    /// Once, in the order sent, its signature's label prior divided out.
    Corrected { prior: Prior },
}

impl Plan {
    fn reads(&self) -> usize {
        match self {
            Plan::Orders { variants, .. } => variants.len(),
            Plan::Corrected { .. } => 1,
        }
    }
}

/// A request rewritten so every question is read in each of its orders (or once, for a
/// prior-corrected choice).
pub struct Expansion {
    /// The request the strategy renders: each question's orders in a row.
    pub request: DecisionRequest,
    plans: Vec<Plan>,
}

impl Expansion {
    pub fn new(
        request: &DecisionRequest,
        mode: Debias,
        max_orders: usize,
        priors: &PriorBook,
    ) -> Expansion {
        let plans: Vec<Plan> = request
            .questions
            .iter()
            .map(|q| {
                let signature = Signature::of(q);
                let arity = q.kind.arity();
                if mode == Debias::Prior {
                    if let Some(prior) = signature.and_then(|s| priors.prior(s, arity)) {
                        return Plan::Corrected { prior };
                    }
                }
                // Estimating needs every rotation, whatever the cap.
                let cap = if mode == Debias::Prior {
                    max_orders.max(arity)
                } else {
                    max_orders
                };
                Plan::Orders {
                    variants: variants(&q.kind, cap),
                    signature,
                }
            })
            .collect();
        let questions = request
            .questions
            .iter()
            .zip(&plans)
            .flat_map(|(q, plan)| {
                let kinds: Vec<QuestionKind> = match plan {
                    Plan::Orders { variants, .. } => {
                        variants.iter().map(|v| v.kind.clone()).collect()
                    }
                    Plan::Corrected { .. } => vec![q.kind.clone()],
                };
                kinds.into_iter().map(move |kind| Question {
                    id: q.id.clone(),
                    instructions: q.instructions.clone(),
                    kind,
                })
            })
            .collect();
        Expansion {
            request: DecisionRequest {
                questions,
                ..request.clone()
            },
            plans,
        }
    }

    /// The answers of the request as sent, from the answers of the expanded one (in its order); every
    /// choice read in all its rotations adds its sample to `priors`.
    pub fn combine(
        &self,
        answers: Vec<Answer>,
        priors: &PriorBook,
    ) -> (Vec<Answer>, Vec<OrderReport>) {
        let mut rest = answers.into_iter();
        let mut combined = Vec::with_capacity(self.plans.len());
        let mut reports = Vec::with_capacity(self.plans.len());
        for plan in &self.plans {
            let read: Vec<Answer> = rest.by_ref().take(plan.reads()).collect();
            let (answer, report) = match plan {
                Plan::Orders {
                    variants,
                    signature,
                } => {
                    // A sample needs every rotation (the orders read are all n of them).
                    let full = variants.len() == variants.first().map_or(0, |v| v.back.len());
                    let sample = full.then(|| label_prior::sample_log_prior(&read)).flatten();
                    if let (Some(signature), Some(sample)) = (signature, sample) {
                        priors.observe(*signature, &sample);
                    }
                    average(variants, &read)
                }
                Plan::Corrected { prior } => corrected(read, prior),
            };
            combined.push(answer);
            reports.push(report);
        }
        (combined, reports)
    }
}

/// One read with its signature's label prior divided out (PriDe).
fn corrected(read: Vec<Answer>, prior: &Prior) -> (Answer, OrderReport) {
    let report = OrderReport {
        method: Debias::Prior,
        orders: read.len(),
        order_sensitivity: None,
        prior_samples: Some(prior.samples),
    };
    let Some(mut answer) = read.into_iter().next() else {
        return (
            Answer {
                probabilities: Vec::new(),
                label_mass: 0.0,
                argmax_is_label: false,
                label_logprobs: Vec::new(),
                pooled: false,
            },
            report,
        );
    };
    answer.probabilities = label_prior::correct(&answer.probabilities, &prior.probabilities);
    (answer, report)
}

/// Averages the reads of one question's orders by answer name. Each answer's sum runs in the order
/// of the position it was shown at (ties by order), so a request that sends the question in any of
/// the orders read gets bit-for-bit the same probabilities.
pub fn average(variants: &[Variant], reads: &[Answer]) -> (Answer, OrderReport) {
    let k = reads.len().max(1) as f64;
    let n = variants.first().map_or(0, |v| v.back.len());
    // Per order, the probabilities mapped back to the answers as sent.
    let mapped: Vec<Vec<f64>> = variants
        .iter()
        .zip(reads)
        .map(|(v, a)| {
            let mut p = vec![0.0; n];
            for (j, &i) in v.back.iter().enumerate() {
                p[i] = a.probabilities[j];
            }
            p
        })
        .collect();
    let canonical_sum = |i: usize, value: &dyn Fn(usize) -> f64| {
        let mut terms: Vec<(usize, usize)> = variants
            .iter()
            .enumerate()
            .map(|(o, v)| (v.shown_at[i], o))
            .collect();
        terms.sort_unstable();
        terms.into_iter().map(|(_, o)| value(o)).sum::<f64>()
    };
    let probabilities: Vec<f64> = (0..n)
        .map(|i| canonical_sum(i, &|o| mapped[o][i]) / k)
        .collect();
    let full: Vec<f64> = (0..n)
        .map(|i| canonical_sum(i, &|o| mapped[o][i] * reads[o].label_mass) / k)
        .collect();
    let mut masses: Vec<f64> = reads.iter().map(|a| a.label_mass).collect();
    masses.sort_by(f64::total_cmp);
    let chosen = probability::argmax(&probabilities);
    let (lo, hi) = mapped
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
            (lo.min(p[chosen]), hi.max(p[chosen]))
        });
    let answer = Answer {
        probabilities,
        label_mass: masses.iter().sum::<f64>() / k,
        argmax_is_label: reads.iter().all(|a| a.argmax_is_label),
        label_logprobs: full.iter().map(|f| f.ln()).collect(),
        pooled: !reads.is_empty() && reads.iter().all(|a| a.pooled),
    };
    let report = OrderReport {
        method: Debias::Rotate,
        orders: reads.len(),
        order_sensitivity: (!reads.is_empty()).then_some(hi - lo),
        prior_samples: None,
    };
    (answer, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ChoiceOption;

    fn choice(names: &[&str]) -> QuestionKind {
        QuestionKind::Choice {
            options: names
                .iter()
                .map(|n| ChoiceOption {
                    name: n.to_string(),
                    description: None,
                })
                .collect(),
        }
    }

    fn names(kind: &QuestionKind) -> Vec<String> {
        match kind {
            QuestionKind::Choice { options } => options.iter().map(|o| o.name.clone()).collect(),
            QuestionKind::Score { levels, .. } => levels.clone(),
            QuestionKind::YesNo { .. } => vec!["yes".into(), "no".into()],
        }
    }

    /// A model with a position bias and a content preference, as log-weights: what it reads for
    /// an order is deterministic in what the order shows.
    fn biased_read(kind: &QuestionKind) -> Answer {
        let shown = names(kind);
        let logits: Vec<f64> = shown
            .iter()
            .enumerate()
            .map(|(pos, name)| {
                let content = name.bytes().map(f64::from).sum::<f64>() / 97.0;
                let position = [1.3, 0.2, -0.4, 0.9, -1.1, 0.05][pos % 6];
                content + position
            })
            .collect();
        let mass = 0.5 + 0.1 * (shown[0].len() as f64 / 7.0);
        probability::answer(logits, mass, true, 1.0)
    }

    fn debiased(kind: &QuestionKind, max_orders: usize) -> (Answer, OrderReport) {
        let vs = variants(kind, max_orders);
        let reads: Vec<Answer> = vs.iter().map(|v| biased_read(&v.kind)).collect();
        average(&vs, &reads)
    }

    fn by_name(kind: &QuestionKind, answer: &Answer) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = names(kind)
            .into_iter()
            .zip(&answer.probabilities)
            .map(|(n, p)| (n, p.to_bits()))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn rotations_cover_every_shift_up_to_the_cap_then_spread_evenly() {
        assert_eq!(rotation_shifts(3, 4), vec![0, 1, 2]);
        assert_eq!(rotation_shifts(4, 4), vec![0, 1, 2, 3]);
        assert_eq!(rotation_shifts(8, 4), vec![0, 2, 4, 6]);
        assert_eq!(rotation_shifts(6, 4), vec![0, 1, 3, 4]);
        assert_eq!(rotation_shifts(1, 4), vec![0]);
        assert_eq!(rotation_shifts(5, 1), vec![0]);
    }

    /// The test: an option's averaged probability does not depend on where it was listed,
    /// for every cyclic order read: bit-for-bit equal across the K rotations' own permutations.
    #[test]
    fn averaged_probabilities_are_exactly_equal_across_the_orders_read() {
        for (sent, cap) in [
            (vec!["billing", "refund", "bug", "other"], 4),
            (vec!["x", "yy", "zzz"], 4),
            (vec!["a", "b", "c", "d", "e", "f", "g", "h"], 4),
            (vec!["north", "south"], 4),
        ] {
            let kind = choice(&sent);
            let (reference, report) = debiased(&kind, cap);
            assert_eq!(report.orders, sent.len().min(cap));
            let expected = by_name(&kind, &reference);
            for v in variants(&kind, cap) {
                let (answer, other_report) = debiased(&v.kind, cap);
                assert_eq!(
                    by_name(&v.kind, &answer),
                    expected,
                    "sent as {:?}",
                    names(&v.kind)
                );
                assert_eq!(
                    other_report.order_sensitivity.map(f64::to_bits),
                    report.order_sensitivity.map(f64::to_bits)
                );
                assert_eq!(answer.label_mass.to_bits(), reference.label_mass.to_bits());
            }
        }
    }

    #[test]
    fn averaging_removes_a_pure_position_bias_and_reports_it() {
        // Every option equal in content: the reads differ only by position, so the average is
        // uniform and the chosen option's probability moved by the bias's full range.
        let kind = choice(&["ab", "ba", "ab ", "ba "]);
        let vs = variants(&kind, 4);
        let reads: Vec<Answer> = vs
            .iter()
            .map(|_| probability::answer(vec![2.0, 0.0, 0.0, 0.0], 1.0, true, 1.0))
            .collect();
        let (answer, report) = average(&vs, &reads);
        for p in &answer.probabilities {
            assert!((p - 0.25).abs() < 1e-12, "{:?}", answer.probabilities);
        }
        let first = reads[0].probabilities[0] - reads[0].probabilities[1];
        assert!((report.order_sensitivity.unwrap() - first).abs() < 1e-12);
        assert_eq!(report.orders, 4);
    }

    #[test]
    fn a_score_is_read_in_both_level_orders_and_mapped_back() {
        let kind = QuestionKind::score(vec!["low".into(), "mid".into(), "high".into()]);
        let vs = variants(&kind, 4);
        assert_eq!(vs.len(), 2);
        let reversed = vs.iter().find(|v| v.back == vec![2, 1, 0]).unwrap();
        assert_eq!(names(&reversed.kind), ["high", "mid", "low"]);
        // The reversed read says "0" (shown first: high) with 0.7: that is level 2's probability.
        let reads: Vec<Answer> = vs
            .iter()
            .map(|v| {
                let lp = if v.back[0] == 0 {
                    [0.6f64, 0.3, 0.1]
                } else {
                    [0.7, 0.2, 0.1]
                };
                probability::answer(lp.iter().map(|p| p.ln()).collect(), 1.0, true, 1.0)
            })
            .collect();
        let (answer, report) = average(&vs, &reads);
        let expected = [(0.6 + 0.1) / 2.0, (0.3 + 0.2) / 2.0, (0.1 + 0.7) / 2.0];
        for (p, e) in answer.probabilities.iter().zip(expected) {
            assert!((p - e).abs() < 1e-12, "{:?}", answer.probabilities);
        }
        // Chosen: level 2 (0.4), read 0.1 and 0.7.
        assert!((report.order_sensitivity.unwrap() - 0.6).abs() < 1e-12);
    }

    #[test]
    fn a_yes_no_is_read_in_both_label_orders_by_label_name() {
        let kind = QuestionKind::YesNo {
            yes: Some("it is urgent".into()),
            no: None,
            no_first: false,
        };
        let vs = variants(&kind, 4);
        assert_eq!(vs.len(), 2);
        assert!(vs
            .iter()
            .any(|v| matches!(v.kind, QuestionKind::YesNo { no_first: true, .. })));
        assert!(vs.iter().all(|v| v.back == vec![0, 1]));
        let reads = [
            probability::answer(vec![0.8f64.ln(), 0.2f64.ln()], 0.9, true, 1.0),
            probability::answer(vec![0.6f64.ln(), 0.4f64.ln()], 0.7, false, 1.0),
        ];
        let (answer, report) = average(&vs, &reads);
        assert!((answer.probabilities[0] - 0.7).abs() < 1e-12);
        assert!((answer.label_mass - 0.8).abs() < 1e-12);
        assert!(!answer.argmax_is_label);
        assert!((report.order_sensitivity.unwrap() - 0.2).abs() < 1e-12);
    }

    #[test]
    fn the_expansion_keeps_ids_and_combines_in_question_order() {
        let request = DecisionRequest {
            state: serde_json::json!("s"),
            instructions: None,
            questions: vec![
                Question {
                    id: "c".into(),
                    instructions: Some("Pick".into()),
                    kind: choice(&["a", "b", "c"]),
                },
                Question {
                    id: "s".into(),
                    instructions: None,
                    kind: QuestionKind::score(vec!["0".into(), "1".into()]),
                },
            ],
            chat_template_kwargs: Default::default(),
            cache_salt: String::new(),
            media: Default::default(),
            joint: false,
            debias: Some(Debias::Rotate),
            calibration: None,
        };
        let priors = PriorBook::new(label_prior::DEFAULT_MIN_SAMPLES);
        let expansion = Expansion::new(&request, Debias::Rotate, 4, &priors);
        let ids: Vec<&str> = expansion
            .request
            .questions
            .iter()
            .map(|q| q.id.as_str())
            .collect();
        assert_eq!(ids, ["c", "c", "c", "s", "s"]);
        let reads: Vec<Answer> = expansion
            .request
            .questions
            .iter()
            .map(|q| biased_read(&q.kind))
            .collect();
        let (answers, reports) = expansion.combine(reads, &priors);
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0].probabilities.len(), 3);
        assert_eq!(answers[1].probabilities.len(), 2);
        assert_eq!(reports.iter().map(|r| r.orders).collect::<Vec<_>>(), [3, 2]);
        for a in &answers {
            assert!((a.probabilities.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
    }

    /// `prior`: a form without an estimate is read in all its rotations (past the cap) and adds a
    /// sample; once it has enough, one read, divided by the prior.
    #[test]
    fn prior_rotates_until_the_form_has_a_prior_then_reads_once() {
        let names = ["a", "b", "c", "d", "e", "f"];
        let request = DecisionRequest {
            state: serde_json::json!("s"),
            instructions: None,
            questions: vec![Question {
                id: "c".into(),
                instructions: Some("Pick".into()),
                kind: choice(&names),
            }],
            chat_template_kwargs: Default::default(),
            cache_salt: String::new(),
            media: Default::default(),
            joint: false,
            debias: Some(Debias::Prior),
            calibration: None,
        };
        let priors = PriorBook::new(2);
        for round in 0..2 {
            let expansion = Expansion::new(&request, Debias::Prior, 4, &priors);
            assert_eq!(expansion.request.questions.len(), 6, "round {round}");
            let reads = expansion
                .request
                .questions
                .iter()
                .map(|q| biased_read(&q.kind))
                .collect();
            let (_, reports) = expansion.combine(reads, &priors);
            assert_eq!(reports[0].method, Debias::Rotate);
        }
        // The rotate mode keeps its cap and adds no sample (4 of 6 rotations).
        let rotate = Expansion::new(&request, Debias::Rotate, 4, &priors);
        assert_eq!(rotate.request.questions.len(), 4);
        let expansion = Expansion::new(&request, Debias::Prior, 4, &priors);
        assert_eq!(expansion.request.questions.len(), 1);
        assert_eq!(
            expansion.request.questions[0].kind,
            request.questions[0].kind
        );
        let read = biased_read(&request.questions[0].kind);
        let prior = priors
            .prior(Signature::of(&request.questions[0]).unwrap(), 6)
            .unwrap();
        let (answers, reports) = expansion.combine(vec![read.clone()], &priors);
        assert_eq!(
            reports[0],
            OrderReport {
                method: Debias::Prior,
                orders: 1,
                order_sensitivity: None,
                prior_samples: Some(2),
            }
        );
        assert_eq!(
            answers[0].probabilities,
            label_prior::correct(&read.probabilities, &prior.probabilities)
        );
        // The biased reader's position bias is what the prior holds: position 0 most favoured.
        assert_eq!(probability::argmax(&prior.probabilities), 0);
    }

    #[test]
    fn names_round_trip() {
        for d in Debias::ALL {
            assert_eq!(Debias::from_name(d.name()), Some(d));
        }
        assert_eq!(Debias::from_name("shuffle"), None);
    }
}
