//! What a backend counts for beside its score: its KV capacity against the pool's, within
//! `max_ratio` of the median, and its share of the weight, within `max_share`.

use std::net::IpAddr;

use super::Input;
use super::delay::median;

/// The pool's KV-cache capacities in tokens, over the backends that report one: their median,
/// each backend's counting within `max_ratio` of it either way, and the mean of those.
pub(super) struct PoolCapacity {
    median: f64,
    max_ratio: f64,
    mean: f64,
}

impl PoolCapacity {
    pub(super) fn of(inputs: &[Input], max_ratio: f64) -> Option<PoolCapacity> {
        let reported: Vec<f64> = inputs
            .iter()
            .filter_map(|i| i.signals.as_ref()?.kv_capacity_tokens)
            .filter(|c| c.is_finite() && *c > 0.0)
            .collect();
        let median = median(reported.clone())?;
        let max_ratio = max_ratio.max(1.0);
        let mean = reported
            .iter()
            .map(|c| bounded_by(*c, median, max_ratio))
            .sum::<f64>()
            / reported.len() as f64;
        Some(PoolCapacity {
            median,
            max_ratio,
            mean,
        })
    }

    /// A reported capacity within `max_ratio` of the median.
    fn bounded(&self, capacity: f64) -> f64 {
        bounded_by(capacity, self.median, self.max_ratio)
    }
}

/// `value` within `ratio` (>= 1) of `reference` either way; total over any floats (max then
/// min, where `clamp` panics on bounds out of order).
pub(super) fn bounded_by(value: f64, reference: f64, ratio: f64) -> f64 {
    value.max(reference / ratio).min(reference * ratio)
}

/// A backend's capacity: its configured weight x its KV-cache capacity (bounded, see
/// [`PoolCapacity`]) against the pool's mean (the configured weight alone without one).
pub(super) fn capacity_of(i: &Input, pool: Option<&PoolCapacity>) -> f64 {
    f64::from(i.configured)
        * match (i.signals.as_ref().and_then(|s| s.kv_capacity_tokens), pool) {
            (Some(c), Some(pool)) if c > 0.0 && c.is_finite() => pool.bounded(c) / pool.mean,
            _ => 1.0,
        }
}

/// Bounds each scored backend's target weight (`targets`, None where not scored) so that its
/// share of the scored backends' total is at most `max_share` times its share of their
/// configured weights, the others keeping theirs (water-filling: the capped backends' weight
/// is set from the total it leaves). Returns which backends were capped.
pub(super) fn cap_shares(
    targets: &mut [Option<f64>],
    inputs: &[Input],
    max_share: f64,
) -> Vec<bool> {
    let mut capped = vec![false; targets.len()];
    let configured: f64 = inputs
        .iter()
        .zip(targets.iter())
        .filter(|(_, t)| t.is_some())
        .map(|(i, _)| f64::from(i.configured))
        .sum();
    if configured <= 0.0 {
        return capped;
    }
    // A backend's most share of the total.
    let limit = |i: &Input| max_share * f64::from(i.configured) / configured;
    loop {
        let (mut free, mut capped_limits) = (0.0, 0.0);
        for (k, t) in targets.iter().enumerate() {
            match (t, capped[k]) {
                (Some(_), true) => capped_limits += limit(&inputs[k]),
                (Some(t), false) => free += t,
                _ => {}
            }
        }
        if capped_limits >= 1.0 || free <= 0.0 {
            // The capped backends alone would hold it all: no bound applies.
            return vec![false; targets.len()];
        }
        let total = free / (1.0 - capped_limits);
        let mut more = false;
        for (k, t) in targets.iter().enumerate() {
            if let Some(t) = t
                && !capped[k]
                && *t > limit(&inputs[k]) * total
            {
                capped[k] = true;
                more = true;
            }
        }
        if !more {
            for (k, t) in targets.iter_mut().enumerate() {
                if capped[k] {
                    *t = Some(limit(&inputs[k]) * total);
                }
            }
            return capped;
        }
    }
}

/// Each backend's capacity (see [`capacity_of`]), in the inputs' order: what session
/// persistence spreads a VIP's few heavy clients by. Unlike the weights, which follow the
/// load of the moment, it changes only with the configuration and the reported KV capacity.
pub fn capacities(inputs: &[Input], max_ratio: f64) -> Vec<(IpAddr, f64)> {
    let pool = PoolCapacity::of(inputs, max_ratio);
    inputs
        .iter()
        .map(|i| (i.address, capacity_of(i, pool.as_ref())))
        .collect()
}
