//! Each backend's expected delay for a new request, and for a client returning to it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::capacity::bounded_by;
use super::{Input, PolicyConfig, PolicyKind};

/// Each backend's expected delay for a new request under the composite policy: the time it
/// takes to prefill a prompt of the pool's mean size, times the requests ahead of it and
/// itself: those with no first token yet (`prefilling`: waiting, or running in a chunked
/// prefill), else those waiting, + 1.
///
/// The prefill time is the backend's measured prefill seconds per prompt token (vLLM's
/// `request_prefill_time_seconds` over `request_prompt_tokens`) times the pool's mean prompt
/// size, so two equal GPUs score alike whatever prompt sizes each happened to get; a backend
/// that reports only a mean prefill time per request is taken at that; one not measured yet
/// counts as the pool's median.
///
/// For a client returning to a backend that reports its prefix-cache hit rate h (session
/// persistence), the delays differ: at home its prompt is cached but for its new message,
/// elsewhere it is prefilled whole. With c = 1 − h the share of prompt tokens a backend
/// computes (first requests and returning ones together), its prefill time p for a whole
/// prompt and a requests ahead (each computing c of a prompt on average), the client's first
/// token comes after about p x c x a at home (its own new message neglected) and after
/// p x (c x a + 1) elsewhere.
pub(super) struct Delays {
    by_address: BTreeMap<IpAddr, f64>,
    /// The smallest expected delay of a usable backend.
    pub(super) best: f64,
    /// Per backend that reports its prefix-cache hits: a returning client's expected delay at
    /// home, and the least elsewhere (another usable backend, its whole prompt prefilled).
    pub(super) returning: BTreeMap<IpAddr, (f64, f64)>,
}

impl Delays {
    pub(super) fn of(&self, i: &Input) -> Option<f64> {
        self.by_address.get(&i.address).copied()
    }

    /// Whether a client returning to `address` is expected to get its first token sooner
    /// elsewhere (never for a backend whose prefix-cache hits are unknown: without them the
    /// cache's worth cannot be weighed, and a bound, if set, judges alone).
    pub(super) fn returning_elsewhere(&self, address: IpAddr) -> bool {
        self.returning
            .get(&address)
            .is_some_and(|(home, away)| home > away)
    }
}

pub(super) fn positive(v: Option<f64>) -> Option<f64> {
    v.filter(|v| v.is_finite() && *v > 0.0)
}

pub(super) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

pub(super) fn expected_delays(
    cfg: &PolicyConfig,
    inputs: &[Input],
    fresh: &dyn Fn(&Input) -> bool,
) -> Option<Delays> {
    if cfg.kind != PolicyKind::Composite || cfg.factors.delay <= 0.0 {
        return None;
    }
    let usable: Vec<&Input> = inputs
        .iter()
        .filter(|i| i.configured > 0 && fresh(i))
        .collect();
    let prefill = Prefill::of(cfg, &usable);
    let median_of =
        |f: &dyn Fn(&Input) -> Option<f64>| median(usable.iter().filter_map(|i| f(i)).collect());
    let median_request = median_of(&|i| prefill.per_request(i))?;
    let median_prompt = median_of(&|i| prefill.service(i).map(|(seconds, _)| seconds))?;
    let by_address: BTreeMap<IpAddr, f64> = usable
        .iter()
        .map(|i| {
            (
                i.address,
                prefill.per_request(i).unwrap_or(median_request) * (1.0 + ahead(i)),
            )
        })
        .collect();
    let best = by_address.values().copied().fold(f64::INFINITY, f64::min);
    Some(Delays {
        by_address,
        best,
        returning: returning(&prefill, &usable, median_prompt),
    })
}

/// The requests ahead of a new one at a backend: those with no first token yet, else those
/// waiting.
fn ahead(i: &Input) -> f64 {
    i.signals
        .as_ref()
        .and_then(|s| s.prefilling.or(s.waiting))
        .unwrap_or(0.0)
        .max(0.0)
}

/// The share of a prompt a backend computes: 1 - its prefix-cache hit rate, where known.
fn computed(i: &Input) -> Option<f64> {
    i.signals
        .as_ref()
        .and_then(|s| s.prefix_cache_hit_rate)
        .filter(|h| h.is_finite())
        .map(|h| 1.0 - h.clamp(0.0, 1.0))
}

/// The pool's references for prefill times: its mean prompt size, the median backend's
/// prefill time and the bound around it.
struct Prefill {
    pool_prompt: Option<f64>,
    median_service: Option<f64>,
    max_ratio: f64,
}

impl Prefill {
    fn of(cfg: &PolicyConfig, usable: &[&Input]) -> Prefill {
        let pool_prompt = median(
            usable
                .iter()
                .filter_map(|i| positive(i.signals.as_ref()?.prompt_tokens_mean))
                .collect(),
        );
        let mut prefill = Prefill {
            pool_prompt,
            median_service: None,
            max_ratio: cfg.max_ratio.max(1.0),
        };
        // Each backend's prefill time counts within `max_ratio` of the pool's median.
        prefill.median_service = median(
            usable
                .iter()
                .filter_map(|i| prefill.reported(i).map(|(seconds, _)| seconds))
                .collect(),
        );
        prefill
    }

    /// Prefill seconds of one prompt of the pool's mean size, for a backend that was
    /// measured, and whether that is a whole prompt's (its speed measured over the tokens it
    /// computed) or already net of its prefix-cache hits (a speed over prompt tokens, a mean
    /// prefill time). Where a backend says which requests have no first token yet, its own
    /// speed (the fastest measured) times them: its mean prefill time under a burst already
    /// counts the requests it prefilled together, which `prefilling` counts again.
    fn reported(&self, i: &Input) -> Option<(f64, bool)> {
        let s = i.signals.as_ref()?;
        let fastest = s
            .prefilling
            .and(positive(s.prefill_seconds_per_token_fastest));
        fastest
            .or(positive(s.prefill_seconds_per_token))
            .zip(self.pool_prompt)
            .map(|(per_token, tokens)| (per_token * tokens, s.computed_sum_count.is_some()))
            .or_else(|| positive(s.prefill_seconds).map(|seconds| (seconds, false)))
    }

    /// [`Prefill::reported`] within `max_ratio` of the pool's median.
    fn service(&self, i: &Input) -> Option<(f64, bool)> {
        let (seconds, whole) = self.reported(i)?;
        Some((
            bounded_by(seconds, self.median_service?, self.max_ratio),
            whole,
        ))
    }

    /// A request's prefill as requests come to a backend: a whole prompt's times the share it
    /// computes (at least a token of the pool's prompt: vLLM computes one even when the whole
    /// prompt is cached).
    fn per_request(&self, i: &Input) -> Option<f64> {
        let (seconds, whole) = self.service(i)?;
        let share = match (whole, computed(i), self.pool_prompt) {
            (true, Some(c), Some(tokens)) => c.max(1.0 / tokens.max(1.0)),
            _ => 1.0,
        };
        Some(seconds * share)
    }
}

/// A returning client's expected delay at home and the least elsewhere, per backend that
/// reports its prefix-cache hits: at home the queue's share c of each prompt ahead (its own
/// cached but for a new message), elsewhere the queue's and its whole prompt.
fn returning(
    prefill: &Prefill,
    usable: &[&Input],
    median_prompt: f64,
) -> BTreeMap<IpAddr, (f64, f64)> {
    let parts: Vec<(IpAddr, f64, Option<f64>, f64)> = usable
        .iter()
        .map(|i| {
            (
                i.address,
                prefill
                    .service(i)
                    .map_or(median_prompt, |(seconds, _)| seconds),
                computed(i),
                ahead(i),
            )
        })
        .collect();
    // Each backend's delay for a client arriving without its prompt cached; a backend's
    // "elsewhere" is the least of the others': the least overall, or the second least for
    // the backend that has it.
    let away: Vec<f64> = parts
        .iter()
        .map(|(_, prompt, computed, ahead)| prompt * (computed.unwrap_or(1.0) * ahead + 1.0))
        .collect();
    let (mut least, mut second) = ((usize::MAX, f64::INFINITY), f64::INFINITY);
    for (k, a) in away.iter().enumerate() {
        if *a < least.1 {
            second = least.1;
            least = (k, *a);
        } else if *a < second {
            second = *a;
        }
    }
    parts
        .iter()
        .enumerate()
        .filter_map(|(k, (address, prompt, computed, ahead))| {
            let home = prompt * (*computed)? * ahead;
            let away = if k == least.0 { second } else { least.1 };
            away.is_finite().then_some((*address, (home, away)))
        })
        .collect()
}
