//! The weight policy engine: what the backends report (and the data plane's flow counts)
//! becomes each backend's Maglev weight. Pure: no I/O, no clock; the caller passes each
//! report's age and keeps the [`PolicyState`] between rounds.
//!
//! A round, for each backend:
//! 1. **Stale** reports (older than `stale_after`, or none yet) make it saturated (weight 0) or
//!    keep its last weight, as configured.
//! 2. **Saturation**: KV-cache use at or above `kv_saturation`, a queue of `queue_saturation`
//!    waiting requests or more, or free GPU memory below `min_free_gpu_memory`, gives weight 0
//!    at once: no new flows, established ones continue.
//! 3. **Score** by policy, times the backend's capacity: its configured weight, scaled — for
//!    `composite`, when backends report prefill times — by exp(`delay` x (1 - d / best)), where
//!    d is its expected delay for a new request (its prefill time for a prompt of the pool's
//!    mean size x (requests ahead of it + 1): where the backend says which requests have no
//!    first token yet (`prefilling`), its fastest measured prefill per prompt token x those;
//!    else its mean prefill per token x `waiting`; a speed measured over the tokens it
//!    computed times the share of a prompt it computes, 1 - its prefix-cache hit rate) and
//!    best the pool's
//!    smallest, so a slow GPU takes work only once the fast ones queue; otherwise by its KV
//!    capacity against the pool's mean when backends report one, so a bigger GPU takes more.
//!    `least-conn` 1/(1 + flows); `least-latency` 1/TTFT; `gpu` free GPU-memory fraction (or
//!    KV headroom); `tokens` free KV tokens; `composite` (1 - pressure)^2, where pressure is the
//!    factor-weighted mean of KV use, GPU-memory use, queue share `waiting/(waiting+running+1)`,
//!    connection share (flows over the pool's most) and TTFT share (over the pool's slowest).
//! 4. Scale to 0..=[`MAX_WEIGHT`], raise non-saturated backends to `floor` x max (slow GPUs stay
//!    in rotation), smooth with an EWMA, hold within `hysteresis` of the published weight, and
//!    round to `quantum`: small noise never rebuilds the table.
//! 5. If every backend would get 0, the non-stale ones get weights by capacity (configured
//!    weight x KV capacity; degraded, with the reason said): sending new flows nowhere is
//!    worse, and the bigger GPUs still take more.
//!
//! What one backend reports cannot take the pool: its KV capacity and its prefill speed count
//! within `max_ratio` of the pool's median either way, and no backend's share of the scored
//! backends' weight exceeds `max_share` times its share of their configured weights (the
//! others keep the rest, by their own scores).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use crate::steering::telemetry::signals::Signals;

mod capacity;
mod delay;
mod score;

pub use capacity::capacities;
use capacity::{PoolCapacity, cap_shares, capacity_of};
use delay::{Delays, expected_delays};
use score::score;

pub use crate::base::config::{
    Factors, MAX_POLICY_WEIGHT as MAX_WEIGHT, PolicyConfig, PolicyKind, StaleMode,
};

/// One backend's inputs for a round.
#[derive(Clone, Debug)]
pub struct Input {
    pub address: IpAddr,
    /// The configured weight (the operator's capacity hint; 0 = drained by weight).
    pub configured: u32,
    pub signals: Option<Signals>,
    /// Age of the newest report.
    pub age: Option<Duration>,
    /// Active flows in the data plane.
    pub flows: u64,
}

/// A backend's weight and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub address: IpAddr,
    pub weight: u32,
    pub reason: String,
    /// Over a saturation cut-off this round (KV cache, waiting requests, free GPU memory),
    /// whatever weight it got (when every backend is, they keep weights by capacity).
    pub saturated: bool,
    /// A client returning to it (session persistence) is expected to get its first token
    /// sooner from another backend, the prefill of its whole prompt there included (see
    /// `Delays::returning_elsewhere`): its returning clients' new flows go where the
    /// scheduler puts them this round (they keep it as their backend).
    pub returning_elsewhere: bool,
}

/// What a policy remembers between rounds.
#[derive(Clone, Debug, Default)]
pub struct PolicyState {
    smoothed: BTreeMap<IpAddr, f64>,
    published: BTreeMap<IpAddr, u32>,
}

impl PolicyState {
    /// The weight last published for a backend.
    pub fn published(&self, address: IpAddr) -> Option<u32> {
        self.published.get(&address).copied()
    }
}

/// A backend's judgement in a round, before weights are scaled.
enum Verdict {
    /// Weight 0 for a reason other than load (configured 0, a stale report).
    Zero(String),
    /// Weight 0: over a saturation cut-off (KV cache, queue, free GPU memory).
    Saturated(String),
    Keep(String),
    Score(f64, String),
}

/// Whether a pool is saturated for admission control: it has an eligible backend (`eligible`:
/// one that may take new flows at all: in the pool, healthy, not drained, configured weight),
/// and every eligible backend was over a saturation cut-off this round. A stale report is not
/// saturation: with one, the pool is not saturated (admission fails open when telemetry does).
pub fn pool_saturated(decisions: &[Decision], eligible: impl Fn(IpAddr) -> bool) -> bool {
    let mut any = false;
    for d in decisions.iter().filter(|d| eligible(d.address)) {
        if !d.saturated {
            return false;
        }
        any = true;
    }
    any
}

fn pct(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

/// One round: the weight of every backend.
pub fn decide(cfg: &PolicyConfig, inputs: &[Input], state: &mut PolicyState) -> Vec<Decision> {
    if cfg.kind == PolicyKind::Static {
        return static_weights(inputs, state);
    }
    let pool = Pool::of(cfg, inputs);
    let verdicts: Vec<Verdict> = inputs.iter().map(|i| verdict(cfg, &pool, i)).collect();
    let (targets, capped) = targets(cfg, inputs, &verdicts);
    let mut decisions: Vec<Decision> = inputs
        .iter()
        .zip(verdicts)
        .enumerate()
        .map(|(k, (i, verdict))| {
            let target = Target {
                weight: targets[k].unwrap_or(0.0),
                capped: capped[k],
            };
            let (weight, reason, saturated) = weigh(cfg, state, i, verdict, target);
            Decision {
                address: i.address,
                weight,
                reason,
                saturated,
                returning_elsewhere: pool
                    .delays
                    .as_ref()
                    .is_some_and(|d| d.returning_elsewhere(i.address)),
            }
        })
        .collect();
    if decisions.iter().all(|d| d.weight == 0) {
        weigh_by_capacity(cfg, &pool, inputs, &mut decisions);
    }
    for d in &decisions {
        state.published.insert(d.address, d.weight);
    }
    decisions
}

/// A static policy: the configured weights.
fn static_weights(inputs: &[Input], state: &mut PolicyState) -> Vec<Decision> {
    state.smoothed.clear();
    state.published = inputs.iter().map(|i| (i.address, i.configured)).collect();
    inputs
        .iter()
        .map(|i| Decision {
            address: i.address,
            weight: i.configured,
            reason: "static: configured weight".into(),
            saturated: false,
            returning_elsewhere: false,
        })
        .collect()
}

/// Whether a backend's report is fresh enough to use (always, for a policy that reads none).
fn fresh(cfg: &PolicyConfig, i: &Input) -> bool {
    !cfg.kind.needs_reports() || i.age.is_some_and(|a| a <= cfg.stale_after)
}

/// The pool-wide references of a round.
struct Pool {
    capacity: Option<PoolCapacity>,
    /// The most active flows of a backend (at least 1).
    max_flows: f64,
    /// The slowest time to first token reported.
    max_ttft: f64,
    delays: Option<Delays>,
}

impl Pool {
    fn of(cfg: &PolicyConfig, inputs: &[Input]) -> Pool {
        Pool {
            capacity: PoolCapacity::of(inputs, cfg.max_ratio),
            max_flows: inputs.iter().map(|i| i.flows).max().unwrap_or(0).max(1) as f64,
            max_ttft: inputs
                .iter()
                .filter_map(|i| i.signals.as_ref()?.ttft_seconds)
                .fold(0.0f64, f64::max),
            delays: expected_delays(cfg, inputs, &|i: &Input| fresh(cfg, i)),
        }
    }
}

/// A backend's verdict: zero (configured 0, stale), saturated, kept, or scored times its
/// capacity.
fn verdict(cfg: &PolicyConfig, pool: &Pool, i: &Input) -> Verdict {
    if i.configured == 0 {
        return Verdict::Zero("configured weight 0".into());
    }
    if !fresh(cfg, i) {
        let why = match i.age {
            Some(a) => format!("stale report ({} ms old)", a.as_millis()),
            None => "no report yet".into(),
        };
        return match cfg.stale {
            StaleMode::Saturated => Verdict::Zero(format!("{why}: treated as saturated")),
            StaleMode::Keep => Verdict::Keep(format!("{why}: keeping the last weight")),
        };
    }
    let s = i.signals.clone().unwrap_or_default();
    if let Some(why) = saturation(cfg, &s) {
        return Verdict::Saturated(why);
    }
    let (score, why) = score(cfg, i, &s, pool.max_flows, pool.max_ttft);
    let (capacity, why) = capacity(cfg, pool, i, why);
    Verdict::Score(capacity * score, why)
}

/// Which saturation cut-off a backend's report is over, if any (KV cache, waiting requests,
/// free GPU memory).
fn saturation(cfg: &PolicyConfig, s: &Signals) -> Option<String> {
    if let Some(kv) = s.kv_usage.filter(|kv| *kv >= cfg.kv_saturation) {
        return Some(format!(
            "saturated: KV cache {} >= {}",
            pct(kv),
            pct(cfg.kv_saturation)
        ));
    }
    if cfg.queue_saturation > 0
        && let Some(waiting) = s.waiting.filter(|w| *w >= f64::from(cfg.queue_saturation))
    {
        return Some(format!(
            "saturated: {waiting:.0} requests waiting >= {}",
            cfg.queue_saturation
        ));
    }
    if cfg.min_free_gpu_memory_bytes > 0.0
        && let Some(free) = s
            .gpu_memory_free_bytes()
            .filter(|f| *f < cfg.min_free_gpu_memory_bytes)
    {
        return Some(format!(
            "saturated: free GPU memory {:.0} MiB < {:.0} MiB",
            free / 1048576.0,
            cfg.min_free_gpu_memory_bytes / 1048576.0
        ));
    }
    None
}

/// A backend's capacity, what its score is multiplied by: what it is measured to serve (its
/// expected delay against the pool's best), else its KV capacity against the pool's mean.
fn capacity(cfg: &PolicyConfig, pool: &Pool, i: &Input, why: String) -> (f64, String) {
    let Some((d, delay)) = pool.delays.as_ref().and_then(|d| Some((d, d.of(i)?))) else {
        return (capacity_of(i, pool.capacity.as_ref()), why);
    };
    let best = d.best.max(1e-3);
    let mut why = format!(
        "{why}; expected delay {:.0} ms, pool's best {:.0} ms",
        delay * 1e3,
        best * 1e3
    );
    if d.returning_elsewhere(i.address)
        && let Some((home, away)) = d.returning.get(&i.address)
    {
        why.push_str(&format!(
            "; a returning client sooner elsewhere ({:.0} ms here, {:.0} ms there with its whole prompt)",
            home * 1e3,
            away * 1e3
        ));
    }
    let capacity =
        f64::from(i.configured) * (cfg.factors.delay * (1.0 - delay.max(best) / best)).exp();
    (capacity, why)
}

/// Each scored backend's target weight (scaled to the top score, at least the floor), its
/// share bounded by `max_share`; and whether the bound capped it.
fn targets(
    cfg: &PolicyConfig,
    inputs: &[Input],
    verdicts: &[Verdict],
) -> (Vec<Option<f64>>, Vec<bool>) {
    let top = verdicts
        .iter()
        .filter_map(|v| match v {
            Verdict::Score(s, _) => Some(*s),
            _ => None,
        })
        .fold(0.0f64, f64::max);
    let floor = cfg.floor * f64::from(MAX_WEIGHT);
    let mut targets: Vec<Option<f64>> = verdicts
        .iter()
        .map(|v| match v {
            Verdict::Score(score, _) if top > 0.0 => {
                Some((score / top * f64::from(MAX_WEIGHT)).max(floor))
            }
            Verdict::Score(..) => Some(floor),
            _ => None,
        })
        .collect();
    let capped = cap_shares(&mut targets, inputs, cfg.max_share);
    (targets, capped)
}

/// A scored backend's target weight, and whether `max_share` capped it.
struct Target {
    weight: f64,
    capped: bool,
}

/// A backend's weight from its verdict: 0, the last published, or its target smoothed, held
/// within the hysteresis and rounded to the quantum. Also the reason, and whether it is
/// saturated.
fn weigh(
    cfg: &PolicyConfig,
    state: &mut PolicyState,
    i: &Input,
    verdict: Verdict,
    target: Target,
) -> (u32, String, bool) {
    let previous = state.published.get(&i.address).copied();
    match verdict {
        Verdict::Zero(why) => {
            state.smoothed.insert(i.address, 0.0);
            (0, why, false)
        }
        Verdict::Saturated(why) => {
            state.smoothed.insert(i.address, 0.0);
            (0, why, true)
        }
        Verdict::Keep(why) => (previous.unwrap_or(i.configured.min(MAX_WEIGHT)), why, false),
        Verdict::Score(_, mut why) => {
            if target.capped {
                why.push_str(&format!(
                    "; share capped at {} its configured share (policy.max_share)",
                    cfg.max_share
                ));
            }
            let smoothed = match state.smoothed.get(&i.address) {
                // Coming back from 0 starts from the floor, not from nothing.
                Some(s) if *s > 0.0 => cfg.ewma_alpha * target.weight + (1.0 - cfg.ewma_alpha) * s,
                _ => target.weight,
            };
            state.smoothed.insert(i.address, smoothed);
            let held = match previous {
                Some(p)
                    if p > 0
                        && (smoothed - f64::from(p)).abs() <= cfg.hysteresis * f64::from(p) =>
                {
                    p
                }
                _ => quantize(smoothed, cfg.quantum),
            };
            (held.max(cfg.quantum.min(MAX_WEIGHT)), why, false)
        }
    }
}

/// When every backend would get 0: sending new flows nowhere is worse than queueing them, so
/// each backend with fresh reports takes a share by its capacity (configured weight x KV
/// capacity against the pool's mean), and the bigger GPUs still take more.
fn weigh_by_capacity(
    cfg: &PolicyConfig,
    pool: &Pool,
    inputs: &[Input],
    decisions: &mut [Decision],
) {
    let capacity = |i: &Input| capacity_of(i, pool.capacity.as_ref());
    let usable = |i: &Input| i.configured > 0 && (fresh(cfg, i) || !cfg.kind.needs_reports());
    let top = inputs
        .iter()
        .filter(|i| usable(i))
        .map(capacity)
        .fold(0.0f64, f64::max);
    for (d, i) in decisions.iter_mut().zip(inputs) {
        if usable(i) && top > 0.0 {
            d.weight = quantize(capacity(i) / top * f64::from(MAX_WEIGHT), cfg.quantum)
                .max(cfg.quantum.min(MAX_WEIGHT));
            d.reason = format!("every backend saturated: weight by capacity ({})", d.reason);
        }
    }
}

fn quantize(weight: f64, quantum: u32) -> u32 {
    let q = f64::from(quantum.max(1));
    ((weight / q).round() * q).clamp(0.0, f64::from(MAX_WEIGHT)) as u32
}

#[cfg(test)]
mod tests;
