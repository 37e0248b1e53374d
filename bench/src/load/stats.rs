//! Figures of a run: latency percentiles, throughput and goodput (requests that met the
//! service-level objective), shares per backend.

use std::collections::BTreeMap;

use super::client::Outcome;

/// Percentile `p` (0..100) of `values` (sorted in place), by nearest rank; NaN when empty.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil().max(1.0) as usize;
    values[rank.min(values.len()) - 1]
}

/// The median of `values` (NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A service-level objective: time to first token and mean inter-token latency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slo {
    pub ttft: f64,
    pub itl: f64,
}

impl Default for Slo {
    /// 2 s to the first token, 100 ms between tokens (a chat user's patience; the decode
    /// steps of the simulated GPUs are 30-80 ms).
    fn default() -> Self {
        Slo {
            ttft: 2.0,
            itl: 0.1,
        }
    }
}

impl Slo {
    pub fn met(&self, o: &Outcome) -> bool {
        o.ok() && o.ttft.is_some_and(|t| t <= self.ttft) && o.itl.is_none_or(|i| i <= self.itl)
    }
}

/// A run's figures (seconds, requests per second, shares 0..1).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub requests: usize,
    pub completed: usize,
    pub failed: usize,
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    pub ttft_p99: f64,
    pub ttft_mean: f64,
    pub itl_p50: f64,
    pub itl_p99: f64,
    pub e2e_p50: f64,
    pub e2e_p90: f64,
    pub e2e_p99: f64,
    /// Completed requests per second, from the first sent to the last finished.
    pub throughput: f64,
    pub tokens_per_s: f64,
    /// Requests per second that met the objective, and their share of all requests.
    pub goodput: f64,
    pub slo_share: f64,
    /// Requests served per backend (`x-served-by`), as shares.
    pub shares: BTreeMap<String, f64>,
    /// Per backend, the later turns of conversations whose turn before it served (both
    /// completed), and how many of them another backend served (see [`Summary::turns_moved`]).
    pub turns_moved_from: BTreeMap<String, (usize, usize)>,
}

impl Summary {
    /// Of the later turns of conversations (each after a completed turn of its own), the
    /// share served by another backend than the turn before: how often a conversation left
    /// the server that holds its context. NaN without such turns.
    pub fn turns_moved(&self) -> f64 {
        moved_share(self.turns_moved_from.values())
    }
}

/// Sums up `outcomes` against `slo`.
pub fn summarize(outcomes: &[Outcome], slo: Slo) -> Summary {
    let done: Vec<&Outcome> = outcomes.iter().filter(|o| o.ok()).collect();
    let mut ttft: Vec<f64> = done.iter().filter_map(|o| o.ttft).collect();
    let mut itl: Vec<f64> = done.iter().filter_map(|o| o.itl).collect();
    let mut e2e: Vec<f64> = done.iter().filter_map(|o| o.e2e).collect();
    let first = outcomes
        .iter()
        .map(|o| o.sent)
        .fold(f64::INFINITY, f64::min);
    let last = done
        .iter()
        .map(|o| o.sent + o.e2e.unwrap_or(0.0))
        .fold(0.0, f64::max);
    let span = (last - first).max(1e-9);
    let met = outcomes.iter().filter(|o| slo.met(o)).count();
    let mut shares = BTreeMap::new();
    for o in &done {
        *shares
            .entry(o.backend.clone().unwrap_or_else(|| "?".into()))
            .or_insert(0.0) += 1.0 / done.len() as f64;
    }
    Summary {
        requests: outcomes.len(),
        completed: done.len(),
        failed: outcomes.len() - done.len(),
        ttft_mean: if ttft.is_empty() {
            f64::NAN
        } else {
            ttft.iter().sum::<f64>() / ttft.len() as f64
        },
        ttft_p50: percentile(&mut ttft, 50.0),
        ttft_p90: percentile(&mut ttft, 90.0),
        ttft_p99: percentile(&mut ttft, 99.0),
        itl_p50: percentile(&mut itl, 50.0),
        itl_p99: percentile(&mut itl, 99.0),
        e2e_p50: percentile(&mut e2e, 50.0),
        e2e_p90: percentile(&mut e2e, 90.0),
        e2e_p99: percentile(&mut e2e, 99.0),
        throughput: done.len() as f64 / span,
        tokens_per_s: done.iter().map(|o| f64::from(o.tokens)).sum::<f64>() / span,
        goodput: met as f64 / span,
        slo_share: met as f64 / outcomes.len().max(1) as f64,
        shares,
        turns_moved_from: turns_moved(outcomes),
    }
}

/// The share of moved turns over some backends' (later turns, moved) counts; NaN when none.
pub fn moved_share<'a>(counts: impl Iterator<Item = &'a (usize, usize)>) -> f64 {
    let (later, moved) = counts.fold((0, 0), |(l, m), (a, b)| (l + a, m + b));
    if later == 0 {
        f64::NAN
    } else {
        moved as f64 / later as f64
    }
}

/// Per backend, the later turns whose conversation's turn before it served (both completed,
/// both naming their backend), and how many of them another backend served.
fn turns_moved(outcomes: &[Outcome]) -> BTreeMap<String, (usize, usize)> {
    let mut served: Vec<(usize, usize, &str)> = outcomes
        .iter()
        .filter(|o| o.ok())
        .filter_map(|o| Some((o.conversation, o.turn, o.backend.as_deref()?)))
        .collect();
    served.sort_unstable();
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for pair in served.windows(2) {
        let ((c0, t0, b0), (c1, t1, b1)) = (pair[0], pair[1]);
        if c0 == c1 && t1 == t0 + 1 {
            let (later, moved) = counts.entry(b0.to_string()).or_default();
            *later += 1;
            *moved += usize::from(b0 != b1);
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(sent: f64, ttft: f64, e2e: f64, itl: f64, backend: &str) -> Outcome {
        Outcome {
            sent,
            ttft: Some(ttft),
            e2e: Some(e2e),
            itl: Some(itl),
            tokens: 10,
            backend: Some(backend.into()),
            ..Outcome::default()
        }
    }

    #[test]
    fn percentiles_by_nearest_rank_and_medians() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 50.0), 50.0);
        assert_eq!(percentile(&mut v, 99.0), 99.0);
        assert!(percentile(&mut [], 50.0).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, f64::NAN, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn goodput_counts_requests_within_the_objective() {
        let outcomes = vec![
            outcome(0.0, 0.5, 2.0, 0.05, "a"),
            outcome(1.0, 3.0, 4.0, 0.05, "b"), // too slow to start
            outcome(2.0, 0.5, 8.0, 0.5, "a"),  // too slow between tokens
            Outcome {
                sent: 3.0,
                error: Some("refused".into()),
                ..Outcome::default()
            },
        ];
        let s = summarize(&outcomes, Slo::default());
        assert_eq!((s.requests, s.completed, s.failed), (4, 3, 1));
        // The span runs from 0 to 10 s (the third ends at 2 + 8).
        assert!((s.throughput - 0.3).abs() < 1e-9);
        assert!((s.goodput - 0.1).abs() < 1e-9);
        assert!((s.slo_share - 0.25).abs() < 1e-9);
        assert!((s.shares["a"] - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(s.ttft_p99, 3.0);
        // Four single requests: no later turns.
        assert!(s.turns_moved().is_nan());
    }

    #[test]
    fn turns_moved_counts_later_turns_served_elsewhere_than_the_turn_before() {
        let turn = |conversation, turn, backend: &str| Outcome {
            conversation,
            turn,
            ..outcome(0.0, 0.1, 1.0, 0.05, backend)
        };
        let outcomes = vec![
            // Conversation 0: a, a, b -> two later turns, one moved.
            turn(0, 2, "b"),
            turn(0, 0, "a"),
            turn(0, 1, "a"),
            // Conversation 1: a, then a failed turn, then b: the turn after a failure has
            // no turn before to compare with.
            turn(1, 0, "a"),
            Outcome {
                conversation: 1,
                turn: 1,
                error: Some("timed out".into()),
                ..Outcome::default()
            },
            turn(1, 2, "b"),
            // Conversation 2: b, a -> one later turn, moved.
            turn(2, 0, "b"),
            turn(2, 1, "a"),
        ];
        let s = summarize(&outcomes, Slo::default());
        assert!(
            (s.turns_moved() - 2.0 / 3.0).abs() < 1e-9,
            "{}",
            s.turns_moved()
        );
        // After a turn on a: two later turns, one moved (conversation 0); after one on b: one,
        // moved (conversation 2).
        assert_eq!(s.turns_moved_from["a"], (2, 1));
        assert_eq!(s.turns_moved_from["b"], (1, 1));
    }
}
