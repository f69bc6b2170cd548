//! Turns label log-probabilities into answers: softmax over the labels, label mass, expected score,
//! and TypeSafe's published confidence formulas. All arithmetic in f64. `Answer` lives here, below the IR that
//! carries it (`ir` re-exports it), so the formulas depend on nothing above them.

/// What the model said about one question, before any wire formatting.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// Probabilities renormalised over the labels, in option / level order (yes, no for yes/no).
    pub probabilities: Vec<f64>,
    /// Full-vocabulary probability mass on the labels.
    pub label_mass: f64,
    /// Whether the model's greedy next token is one of the labels.
    pub argmax_is_label: bool,
    /// Full-vocabulary log-probabilities of the labels, as read (a pooled answer: the log of each
    /// option's probability).
    pub label_logprobs: Vec<f64>,
    /// Scored by a joint-schema head (Clef): no labels, so the label mass is 1 and every profile's
    /// confidence is the chosen option's probability.
    pub pooled: bool,
}

/// `softmax(lp / T)` over the labels, computed stably.
pub fn softmax(logprobs: &[f64], temperature: f64) -> Vec<f64> {
    let scaled: Vec<f64> = logprobs.iter().map(|lp| lp / temperature).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        // Every label impossible under the model: no information, spread evenly.
        return vec![1.0 / logprobs.len().max(1) as f64; logprobs.len()];
    }
    let exps: Vec<f64> = scaled.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Builds an answer from a read: renormalised probabilities, label mass (every spelling of every
/// label, computed by the caller) and whether the greedy token is a label.
pub fn answer(
    label_logprobs: Vec<f64>,
    label_mass: f64,
    argmax_is_label: bool,
    temperature: f64,
) -> Answer {
    let probabilities = softmax(&label_logprobs, temperature);
    Answer {
        probabilities,
        label_mass,
        argmax_is_label,
        label_logprobs,
        pooled: false,
    }
}

/// A joint-schema head's answer: `softmax(logit / T)` over the question's options, label mass 1.
pub fn pooled_answer(option_logits: &[f64], temperature: f64) -> Answer {
    let probabilities = softmax(option_logits, temperature);
    Answer {
        label_logprobs: probabilities.iter().map(|p| p.ln()).collect(),
        probabilities,
        label_mass: 1.0,
        argmax_is_label: true,
        pooled: true,
    }
}

/// Index of the most probable label; ties go to the earlier label.
pub fn argmax(p: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in p.iter().enumerate() {
        if v > p[best] {
            best = i;
        }
    }
    best
}

/// Expected level: Σ i·p_i.
pub fn expected_score(p: &[f64]) -> f64 {
    p.iter().enumerate().map(|(i, pi)| i as f64 * pi).sum()
}

/// Choice confidence: `(n·p_max − 1)/(n − 1)` clipped to [0, 1]; 1 when there is one option.
pub fn choice_confidence(p: &[f64]) -> f64 {
    let n = p.len();
    if n <= 1 {
        return 1.0;
    }
    let p_max = p.iter().copied().fold(0.0, f64::max);
    ((n as f64 * p_max - 1.0) / (n as f64 - 1.0)).clamp(0.0, 1.0)
}

/// Score confidence: `max(0, 1 − Σ p_i·|i − mode| / U)` with `U = (1/n)·Σ_i |i − (n−1)/2|`; 1 when n = 1.
pub fn score_confidence(p: &[f64]) -> f64 {
    let n = p.len();
    if n <= 1 {
        return 1.0;
    }
    let mode = argmax(p) as f64;
    let spread: f64 = p
        .iter()
        .enumerate()
        .map(|(i, pi)| pi * (i as f64 - mode).abs())
        .sum();
    let center = (n as f64 - 1.0) / 2.0;
    let u = (0..n).map(|i| (i as f64 - center).abs()).sum::<f64>() / n as f64;
    (1.0 - spread / u).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn typesafe_published_examples() {
        assert!(close(score_confidence(&[0.0, 0.95, 0.05]), 0.925));
        assert!(close(choice_confidence(&[0.88, 0.12]), 0.76));
    }

    #[test]
    fn single_option_is_certain() {
        assert_eq!(choice_confidence(&[1.0]), 1.0);
        assert_eq!(score_confidence(&[1.0]), 1.0);
    }

    #[test]
    fn uniform_choice_has_zero_confidence_and_certain_has_one() {
        assert!(close(choice_confidence(&[0.25; 4]), 0.0));
        assert!(close(choice_confidence(&[1.0, 0.0, 0.0]), 1.0));
    }

    #[test]
    fn score_confidence_clips_at_zero() {
        // All mass at the far ends: spread 1.5·... exceeds U.
        assert_eq!(
            score_confidence(&[0.5, 0.0, 0.0, 0.0, 0.5]),
            0.0_f64.max(1.0 - 2.0 / 1.2)
        );
        assert!(score_confidence(&[0.5, 0.0, 0.0, 0.0, 0.5]) >= 0.0);
    }

    #[test]
    fn softmax_renormalises_and_respects_temperature() {
        let lp = [(0.6f64).ln(), (0.2f64).ln()];
        let p = softmax(&lp, 1.0);
        assert!(close(p[0], 0.75) && close(p[1], 0.25));
        let hot = softmax(&lp, 2.0);
        assert!(hot[0] < 0.75 && hot[0] > 0.5);
        assert!(close(hot.iter().sum::<f64>(), 1.0));
    }

    #[test]
    fn answer_keeps_the_label_mass_and_renormalises() {
        let a = answer(vec![(0.6f64).ln(), (0.2f64).ln()], 0.8, true, 1.0);
        assert!(close(a.label_mass, 0.8));
        assert!(close(a.probabilities[0], 0.75));
        assert!(close(expected_score(&[0.7, 0.2, 0.1]), 0.4));
    }

    #[test]
    fn impossible_labels_spread_evenly() {
        assert_eq!(
            softmax(&[f64::NEG_INFINITY, f64::NEG_INFINITY], 1.0),
            vec![0.5, 0.5]
        );
    }

    #[test]
    fn argmax_ties_go_first() {
        assert_eq!(argmax(&[0.4, 0.4, 0.2]), 0);
        assert_eq!(argmax(&[0.1, 0.5, 0.4]), 1);
    }
}
