//! The numbers of a calibration: fitting a temperature (and per-label biases) to labelled reads by
//! minimising log-loss, the held-out split, and the two scores a fit reports (ECE, log-loss).
//!
//! A calibrated answer is `softmax(ln p / T + b)`, `p` the answer's final probabilities (after any
//! debiasing), `T` the temperature and `b` one bias per label (zero for a temperature-only fit).

/// Held-out answers of a signature at most this fraction of it, by default.
pub const DEFAULT_HOLDOUT_FRACTION: f64 = 0.3;
/// Answers a question signature needs in a calibration set (at least one held out, the rest fitted).
pub const MIN_ANSWERS_PER_SIGNATURE: usize = 4;
/// Per-label biases are fitted (a choice's or a score's) only when the fit split has at least this
/// many answers per label: with fewer, k - 1 free biases overfit what a temperature does not.
pub const MIN_FIT_ANSWERS_PER_LABEL_FOR_BIASES: usize = 30;
/// Equal-width confidence bins of the ECE.
pub const ECE_BINS: usize = 10;
/// The temperatures searched: a fit at either end says the reads carry (almost) no signal.
pub const MIN_TEMPERATURE: f64 = 0.01;
pub const MAX_TEMPERATURE: f64 = 100.0;
/// The L2 penalty on biases (per answer), which keeps them finite when a label is never the answer.
const BIAS_PENALTY: f64 = 1e-3;
/// A probability of 0 read as this (the log of 0 would make a loss infinite).
const FLOOR: f64 = 1e-300;

/// One labelled read: the answer's final probabilities in the signature's label order, and the
/// index of the true label.
#[derive(Clone, Debug, PartialEq)]
pub struct Labelled {
    pub probabilities: Vec<f64>,
    pub truth: usize,
}

/// The parameters of one signature's calibration.
#[derive(Clone, Debug, PartialEq)]
pub struct Parameters {
    pub temperature: f64,
    /// One per label, summing to 0; `None` for a temperature-only fit.
    pub biases: Option<Vec<f64>>,
}

impl Parameters {
    pub const IDENTITY: Parameters = Parameters {
        temperature: 1.0,
        biases: None,
    };

    /// `softmax(ln p / T + b)`.
    pub fn apply(&self, probabilities: &[f64]) -> Vec<f64> {
        let logits: Vec<f64> = probabilities
            .iter()
            .enumerate()
            .map(|(i, p)| {
                p.max(FLOOR).ln() / self.temperature + self.biases.as_ref().map_or(0.0, |b| b[i])
            })
            .collect();
        crate::probability::softmax(&logits, 1.0)
    }
}

/// Log-loss and expected calibration error of a set of reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scores {
    /// Mean of `-ln p(true label)`.
    pub log_loss: f64,
    /// Top-label ECE over `ECE_BINS` equal-width bins of the chosen label's probability.
    pub ece: f64,
}

pub fn scores(reads: &[Labelled], parameters: &Parameters) -> Scores {
    let n = reads.len().max(1) as f64;
    let mut log_loss = 0.0;
    // Per bin: count, sum of confidence, correct answers.
    let mut bins = [(0usize, 0.0f64, 0usize); ECE_BINS];
    for read in reads {
        let p = parameters.apply(&read.probabilities);
        log_loss -= p[read.truth].max(FLOOR).ln();
        let chosen = crate::probability::argmax(&p);
        let confidence = p[chosen];
        let bin = ((confidence * ECE_BINS as f64) as usize).min(ECE_BINS - 1);
        bins[bin].0 += 1;
        bins[bin].1 += confidence;
        bins[bin].2 += usize::from(chosen == read.truth);
    }
    let ece = bins
        .iter()
        .filter(|b| b.0 > 0)
        .map(|&(_, confidence, correct)| (confidence - correct as f64).abs())
        .sum::<f64>()
        / n;
    Scores {
        log_loss: log_loss / n,
        ece,
    }
}

/// Mean log-loss with `beta = 1 / T` and biases `b`, with the biases' L2 penalty.
fn loss(reads: &[(Vec<f64>, usize)], beta: f64, biases: &[f64]) -> f64 {
    let n = reads.len().max(1) as f64;
    let mut total = 0.0;
    for (logp, truth) in reads {
        let logits = logp.iter().zip(biases).map(|(l, b)| beta * l + b);
        let max = logits.clone().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = logits.map(|z| (z - max).exp()).sum();
        total += max + sum.ln() - (beta * logp[*truth] + biases[*truth]);
    }
    let penalty: f64 = biases.iter().map(|b| b * b).sum::<f64>() * BIAS_PENALTY / 2.0;
    total / n + penalty
}

/// The `beta` in `[1/MAX_T, 1/MIN_T]` minimising the loss for fixed biases. The loss is convex in
/// `beta` (a log-sum-exp of functions linear in it), so a golden-section search on `ln beta` finds it.
fn best_beta(reads: &[(Vec<f64>, usize)], biases: &[f64]) -> f64 {
    let f = |x: f64| loss(reads, x.exp(), biases);
    let (mut a, mut b) = ((1.0 / MAX_TEMPERATURE).ln(), (1.0 / MIN_TEMPERATURE).ln());
    let ratio = (5f64.sqrt() - 1.0) / 2.0;
    let mut c = b - ratio * (b - a);
    let mut d = a + ratio * (b - a);
    let (mut fc, mut fd) = (f(c), f(d));
    while b - a > 1e-9 {
        if fc <= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - ratio * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + ratio * (b - a);
            fd = f(d);
        }
    }
    ((a + b) / 2.0).exp()
}

/// Fits a temperature, and biases when `with_biases`, to `reads` by minimising log-loss. A
/// temperature alone is a 1-D search; with biases the loss is convex in `(1/T, b)` jointly (the
/// logits are linear in them), so Newton's method from the temperature-only fit converges in a few
/// steps.
pub fn fit(reads: &[Labelled], labels: usize, with_biases: bool) -> Parameters {
    let prepared: Vec<(Vec<f64>, usize)> = reads
        .iter()
        .map(|r| {
            (
                r.probabilities.iter().map(|p| p.max(FLOOR).ln()).collect(),
                r.truth,
            )
        })
        .collect();
    let mut biases = vec![0.0; labels];
    let mut beta = best_beta(&prepared, &biases);
    if with_biases {
        (beta, biases) = newton(&prepared, beta, biases);
        // Only differences between biases matter: centred, they read as "this label's pull".
        let mean = biases.iter().sum::<f64>() / labels.max(1) as f64;
        for b in &mut biases {
            *b -= mean;
        }
    }
    Parameters {
        temperature: 1.0 / beta,
        biases: with_biases.then_some(biases),
    }
}

/// Newton's method on `(beta, b)` with a backtracking line search; `beta` kept in the searched range.
fn newton(reads: &[(Vec<f64>, usize)], mut beta: f64, mut biases: Vec<f64>) -> (f64, Vec<f64>) {
    let k = biases.len();
    let n = reads.len().max(1) as f64;
    let (low, high) = (1.0 / MAX_TEMPERATURE, 1.0 / MIN_TEMPERATURE);
    let mut current = loss(reads, beta, &biases);
    for _ in 0..100 {
        // Gradient and Hessian in (beta, b_0..b_k-1).
        let mut g = vec![0.0; k + 1];
        let mut h = vec![vec![0.0; k + 1]; k + 1];
        for (logp, truth) in reads {
            let logits: Vec<f64> = logp
                .iter()
                .zip(&biases)
                .map(|(l, b)| beta * l + b)
                .collect();
            let p = crate::probability::softmax(&logits, 1.0);
            let mean_l: f64 = p.iter().zip(logp).map(|(p, l)| p * l).sum();
            g[0] += (mean_l - logp[*truth]) / n;
            h[0][0] +=
                (p.iter().zip(logp).map(|(p, l)| p * l * l).sum::<f64>() - mean_l * mean_l) / n;
            for m in 0..k {
                let y = if m == *truth { 1.0 } else { 0.0 };
                g[m + 1] += (p[m] - y) / n;
                let cross = p[m] * (logp[m] - mean_l) / n;
                h[0][m + 1] += cross;
                h[m + 1][0] += cross;
                for j in 0..k {
                    let d = if j == m { p[m] } else { 0.0 };
                    h[m + 1][j + 1] += (d - p[m] * p[j]) / n;
                }
            }
        }
        for m in 0..k {
            g[m + 1] += BIAS_PENALTY * biases[m];
            h[m + 1][m + 1] += BIAS_PENALTY;
        }
        let Some(step) = solve(h, g.clone()) else {
            break;
        };
        // Backtracking: the full Newton step, halved until the loss goes down.
        let mut t = 1.0;
        let mut moved = false;
        for _ in 0..40 {
            let next_beta = (beta - t * step[0]).clamp(low, high);
            let next: Vec<f64> = biases
                .iter()
                .zip(&step[1..])
                .map(|(b, s)| b - t * s)
                .collect();
            let value = loss(reads, next_beta, &next);
            if value < current {
                beta = next_beta;
                biases = next;
                current = value;
                moved = true;
                break;
            }
            t /= 2.0;
        }
        let size = step.iter().fold(0.0f64, |m, s| m.max(s.abs())) * t;
        if !moved || size < 1e-12 {
            break;
        }
    }
    (beta, biases)
}

/// `h x = g` by Gaussian elimination with partial pivoting; `None` for a singular `h`.
fn solve(mut h: Vec<Vec<f64>>, mut g: Vec<f64>) -> Option<Vec<f64>> {
    let n = g.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| h[a][col].abs().total_cmp(&h[b][col].abs()))?;
        if h[pivot][col].abs() < 1e-300 {
            return None;
        }
        h.swap(col, pivot);
        g.swap(col, pivot);
        for row in col + 1..n {
            let f = h[row][col] / h[col][col];
            if f != 0.0 {
                let (above, below) = h.split_at_mut(row);
                for (x, p) in below[0][col..].iter_mut().zip(&above[col][col..]) {
                    *x -= f * p;
                }
                g[row] -= f * g[col];
            }
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|c| h[row][c] * x[c]).sum();
        x[row] = (g[row] - s) / h[row][row];
    }
    Some(x)
}

/// Whether a fit split of `n_fit` answers over `labels` labels is large enough for biases.
pub fn fits_biases(n_fit: usize, labels: usize) -> bool {
    n_fit >= MIN_FIT_ANSWERS_PER_LABEL_FOR_BIASES * labels
}

/// What a signature keeps: the parameters answers are calibrated with and how they scored held out.
#[derive(Clone, Debug, PartialEq)]
pub struct Chosen {
    /// Rounded as a fit stores them (`super::exact`), so the scores are those of what is applied.
    pub parameters: Parameters,
    /// `super::METHOD_BIASES`, `super::METHOD_TEMPERATURE` or `super::METHOD_NONE`.
    pub method: &'static str,
    /// Held out, uncalibrated and with `parameters`.
    pub before: Scores,
    pub after: Scores,
    /// What a richer fit scored held out, when it was not kept.
    pub reason: Option<String>,
}

/// Fits a signature on `fitted` and keeps the fit only where it pays on `held` answers it never saw:
/// of the candidates (temperature and biases when the set allows them, a temperature, none at all),
/// the one with the lowest held-out log-loss, the simpler one on a tie. A temperature that made
/// held-out answers less likely (too few answers, or reads that carry no signal) is not applied, and
/// the fit says what it scored.
pub fn choose(fitted: &[Labelled], held: &[Labelled], labels: usize, biases: bool) -> Chosen {
    let round = |p: Parameters| Parameters {
        temperature: super::exact(p.temperature),
        biases: p.biases.map(|b| b.into_iter().map(super::exact).collect()),
    };
    let before = scores(held, &Parameters::IDENTITY);
    let mut candidates = vec![(super::METHOD_NONE, Parameters::IDENTITY, before)];
    let temperature = round(fit(fitted, labels, false));
    let scored = scores(held, &temperature);
    candidates.push((super::METHOD_TEMPERATURE, temperature, scored));
    if biases {
        let with_biases = round(fit(fitted, labels, true));
        let scored = scores(held, &with_biases);
        candidates.push((super::METHOD_BIASES, with_biases, scored));
    }
    // Simplest first; a richer candidate must lower the log-loss to replace it.
    let best = (1..candidates.len()).fold(0, |best, i| {
        if candidates[i].2.log_loss < candidates[best].2.log_loss {
            i
        } else {
            best
        }
    });
    let reason = candidates[best + 1..].first().map(|(method, p, s)| {
        format!(
            "method '{method}' (temperature {}) scored held-out log-loss {:.4} against {:.4} with '{}', so it is not applied",
            p.temperature, s.log_loss, candidates[best].2.log_loss, candidates[best].0
        )
    });
    let (method, parameters, after) = candidates.swap_remove(best);
    Chosen {
        parameters,
        method,
        before,
        after,
        reason,
    }
}

/// The held-out indices of `n` answers: `round(n * fraction)` of them, at least 1 and at most
/// `n - 1`, drawn by a generator seeded with `seed` (the same seed and set give the same split).
pub fn holdout(n: usize, fraction: f64, seed: u64) -> Vec<bool> {
    let k = ((n as f64 * fraction).round() as usize).clamp(1, n.saturating_sub(1));
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng::new(seed);
    // Fisher-Yates.
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mut held = vec![false; n];
    for &i in &order[..k.min(n)] {
        held[i] = true;
    }
    held
}

/// xorshift64* seeded through splitmix64 (any seed, 0 included, gives a good stream). No dependency:
/// the split must not change with a crate's version.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probability::softmax;

    /// A label drawn from `p`.
    fn draw(rng: &mut Rng, p: &[f64]) -> usize {
        let mut u = rng.next_f64();
        for (i, pi) in p.iter().enumerate() {
            if u < *pi {
                return i;
            }
            u -= pi;
        }
        p.len() - 1
    }

    /// Reads of a model whose log-probabilities are `planted_t` times too sharp (and, when given,
    /// skewed by `planted_b`): the truth is drawn from `softmax(ln p / T + b)`.
    fn synthetic(
        n: usize,
        k: usize,
        planted_t: f64,
        planted_b: &[f64],
        seed: u64,
    ) -> Vec<Labelled> {
        let mut rng = Rng::new(seed);
        (0..n)
            .map(|_| {
                let logits: Vec<f64> = (0..k).map(|_| 6.0 * rng.next_f64() - 3.0).collect();
                let probabilities = softmax(&logits, 1.0);
                let truth_p = Parameters {
                    temperature: planted_t,
                    biases: Some(planted_b.to_vec()),
                }
                .apply(&probabilities);
                let truth = draw(&mut rng, &truth_p);
                Labelled {
                    probabilities,
                    truth,
                }
            })
            .collect()
    }

    /// The test: a fit on synthetic logits recovers a planted temperature.
    #[test]
    fn a_fit_on_synthetic_logits_recovers_a_planted_temperature() {
        for planted in [0.5, 2.5] {
            let reads = synthetic(20_000, 4, planted, &[0.0; 4], 7);
            let fitted = fit(&reads, 4, false);
            assert!(
                (fitted.temperature - planted).abs() / planted < 0.05,
                "planted {planted}, fitted {}",
                fitted.temperature
            );
            assert_eq!(fitted.biases, None);
            // And it calibrates: lower log-loss and ECE than the raw reads on fresh ones.
            let fresh = synthetic(5_000, 4, planted, &[0.0; 4], 8);
            let before = scores(&fresh, &Parameters::IDENTITY);
            let after = scores(&fresh, &fitted);
            assert!(after.log_loss < before.log_loss, "{before:?} {after:?}");
            assert!(
                after.ece < before.ece && after.ece < 0.02,
                "{before:?} {after:?}"
            );
        }
    }

    #[test]
    fn a_fit_with_biases_recovers_planted_biases_and_temperature() {
        let planted_b = [0.6, -0.2, -0.4];
        let reads = synthetic(30_000, 3, 1.8, &planted_b, 11);
        assert!(fits_biases(reads.len(), 3));
        let fitted = fit(&reads, 3, true);
        assert!((fitted.temperature - 1.8).abs() / 1.8 < 0.05, "{fitted:?}");
        for (got, want) in fitted.biases.as_ref().unwrap().iter().zip(planted_b) {
            assert!((got - want).abs() < 0.06, "{fitted:?}");
        }
        // A temperature alone leaves the skew: the biased fit is better on fresh reads.
        let fresh = synthetic(5_000, 3, 1.8, &planted_b, 12);
        let t_only = fit(&reads, 3, false);
        assert!(scores(&fresh, &fitted).log_loss < scores(&fresh, &t_only).log_loss);
    }

    #[test]
    fn biases_need_enough_answers_per_label() {
        assert!(!fits_biases(89, 3));
        assert!(fits_biases(90, 3));
    }

    #[test]
    fn reads_that_say_nothing_fit_the_largest_temperature() {
        // Answers unrelated to the reads: the flattest calibration is the best.
        let mut rng = Rng::new(3);
        let reads: Vec<Labelled> = (0..2000)
            .map(|i| {
                let x = rng.next_f64();
                Labelled {
                    probabilities: vec![x, 1.0 - x],
                    truth: i % 2,
                }
            })
            .collect();
        let fitted = fit(&reads, 2, false);
        assert!(fitted.temperature > 10.0, "{fitted:?}");
    }

    #[test]
    fn scores_of_known_sets() {
        let reads = vec![
            Labelled {
                probabilities: vec![0.9, 0.1],
                truth: 0,
            },
            Labelled {
                probabilities: vec![0.9, 0.1],
                truth: 1,
            },
        ];
        let s = scores(&reads, &Parameters::IDENTITY);
        // Both in the 0.9 bin, half right: |0.9 * 2 - 1| / 2.
        assert!((s.ece - 0.4).abs() < 1e-12, "{s:?}");
        let want = -(0.9f64.ln() + 0.1f64.ln()) / 2.0;
        assert!((s.log_loss - want).abs() < 1e-12, "{s:?}");
        // A zero probability of the truth is a large, finite loss.
        let zero = vec![Labelled {
            probabilities: vec![1.0, 0.0],
            truth: 1,
        }];
        assert!(scores(&zero, &Parameters::IDENTITY).log_loss.is_finite());
    }

    #[test]
    fn the_holdout_is_deterministic_by_seed_and_never_empty() {
        let a = holdout(20, 0.3, 42);
        assert_eq!(a, holdout(20, 0.3, 42));
        assert_eq!(a.iter().filter(|h| **h).count(), 6);
        assert_ne!(a, holdout(20, 0.3, 43));
        assert_eq!(holdout(4, 0.01, 0).iter().filter(|h| **h).count(), 1);
        assert_eq!(holdout(4, 0.99, 0).iter().filter(|h| **h).count(), 3);
    }

    #[test]
    fn a_fit_is_kept_only_where_it_lowers_the_held_out_log_loss() {
        use crate::calibration::{METHOD_BIASES, METHOD_NONE, METHOD_TEMPERATURE};
        // Reads whose confidence carries the answer (planted temperature 3): a temperature pays.
        let fitted = synthetic(600, 3, 3.0, &[0.0; 3], 1);
        let held = synthetic(300, 3, 3.0, &[0.0; 3], 2);
        let kept = choose(&fitted, &held, 3, false);
        assert_eq!(kept.method, METHOD_TEMPERATURE);
        assert!((kept.parameters.temperature - 3.0).abs() < 0.3, "{kept:?}");
        assert!(
            kept.after.log_loss < kept.before.log_loss && kept.reason.is_none(),
            "{kept:?}"
        );
        // Already calibrated reads with a truth unrelated to them held out: no temperature lowers that
        // loss, so none is applied, and the fit says what the temperature scored.
        let fitted = synthetic(40, 3, 0.4, &[0.0; 3], 3);
        let held: Vec<Labelled> = synthetic(200, 3, 1.0, &[0.0; 3], 4)
            .into_iter()
            .map(|mut r| {
                // The most likely label is never the answer held out.
                let top = (0..3)
                    .max_by(|&a, &b| r.probabilities[a].total_cmp(&r.probabilities[b]))
                    .unwrap();
                r.truth = (top + 1) % 3;
                r
            })
            .collect();
        let kept = choose(&fitted, &held, 3, false);
        assert_eq!(kept.method, METHOD_NONE, "{kept:?}");
        assert_eq!(kept.parameters, Parameters::IDENTITY);
        assert_eq!(kept.after, kept.before);
        let reason = kept.reason.expect("the rejected temperature is reported");
        assert!(
            reason.contains("'temperature'") && reason.contains("'none'"),
            "{reason}"
        );
        // Biases are tried only when allowed, and kept only when they beat the temperature held out.
        let fitted = synthetic(3000, 3, 2.0, &[1.5, 0.0, -1.5], 5);
        let held = synthetic(1000, 3, 2.0, &[1.5, 0.0, -1.5], 6);
        assert_eq!(choose(&fitted, &held, 3, true).method, METHOD_BIASES);
        assert_eq!(choose(&fitted, &held, 3, false).method, METHOD_TEMPERATURE);
    }
}
