//! The ratios the routing benchmark states, each with a bootstrap 95% interval over paired
//! seeds, and its targets' verdicts.
//!
//! Repetition r of every contender at a load plays the same workload (seed `first_seed + r`),
//! so two contenders' runs pair by repetition. A ratio is `mean(a) / mean(b)` over the
//! repetitions both ran, its interval the 2.5th and 97.5th percentiles of the same ratio over
//! resampled pairs ([`crate::ratio_of_means_with_95`]). A target is a line the ratio must stay
//! under (or over): *met* when the whole interval is on the right side, *missed* when it is all
//! on the wrong side, *undecided* when it straddles the line or there is one pair only.
//!
//! Everything is computed from the flat figures (`<shape>/<contender>/<load>/r<rep>/<metric>`),
//! so the report and the page (from a run's JSON) state the same. Written back as
//! `<shape>/target/<name>` (the ratio), `…/lo`, `…/hi`, `…/pairs`, the line as `…/at_most` or
//! `…/at_least`, and `…/verdict` (1 met, -1 missed, 0 undecided); `<shape>/targets_undecided`
//! counts the undecided.

use std::collections::BTreeMap;

use super::report::Metric;
use crate::Figures;

/// Bootstrap resamples per interval.
const RESAMPLES: usize = 4000;

/// One shape's per-repetition figures: by (contender, load key), by repetition, by metric.
#[derive(Default)]
pub struct Samples {
    by: BTreeMap<(String, String), BTreeMap<usize, BTreeMap<String, f64>>>,
    /// Contenders in first-seen order.
    names: Vec<String>,
}

impl Samples {
    /// `shape`'s runs among `f`'s keys.
    pub fn of_shape(f: &Figures, shape: &str) -> Samples {
        let mut s = Samples::default();
        let prefix = format!("{shape}/");
        for (k, v) in f {
            let Some(rest) = k.strip_prefix(&prefix) else {
                continue;
            };
            // contender (which may hold '/'), load, r<rep>, metric.
            let mut parts = rest.rsplitn(4, '/');
            let (Some(metric), Some(rep), Some(load), Some(name)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Some(rep) = rep.strip_prefix('r').and_then(|r| r.parse::<usize>().ok()) else {
                continue;
            };
            if load.parse::<f64>().is_err() || !v.is_finite() {
                continue;
            }
            s.insert(name, load, rep, metric, *v);
        }
        s
    }

    /// From runs: each run's metrics.
    pub fn of_runs<'a>(
        runs: impl IntoIterator<Item = (&'a str, f64, usize, Vec<Metric>)>,
    ) -> Samples {
        let mut s = Samples::default();
        for (name, load, rep, metrics) in runs {
            for (metric, v) in metrics {
                if v.is_finite() {
                    s.insert(name, &load_key(load), rep, metric, v);
                }
            }
        }
        s
    }

    fn insert(&mut self, name: &str, load: &str, rep: usize, metric: &str, v: f64) {
        if !self.names.iter().any(|n| n == name) {
            self.names.push(name.to_string());
        }
        self.by
            .entry((name.to_string(), load.to_string()))
            .or_default()
            .entry(rep)
            .or_default()
            .insert(metric.to_string(), v);
    }

    /// The loads measured, sorted.
    fn loads(&self) -> Vec<String> {
        let mut v: Vec<String> = self.by.keys().map(|(_, l)| l.clone()).collect();
        v.sort_by(|a, b| load_of(a).total_cmp(&load_of(b)));
        v.dedup();
        v
    }

    /// `name`'s `metric` at `load` by repetition.
    fn reps(&self, name: &str, load: &str, metric: &str) -> BTreeMap<usize, f64> {
        self.by
            .get(&(name.to_string(), load.to_string()))
            .map(|reps| {
                reps.iter()
                    .filter_map(|(r, m)| Some((*r, *m.get(metric)?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The mean of `name`'s `metric` at `load` over its repetitions.
    fn mean(&self, name: &str, load: &str, metric: &str) -> Option<f64> {
        let v = self.reps(name, load, metric);
        (!v.is_empty()).then(|| v.values().sum::<f64>() / v.len() as f64)
    }

    /// `a`'s `metric` over `b`'s at `load`, over the repetitions both ran.
    pub fn paired(&self, a: &str, b: &str, load: &str, metric: &str) -> Option<Ratio> {
        let (ra, rb) = (self.reps(a, load, metric), self.reps(b, load, metric));
        let (num, den): (Vec<f64>, Vec<f64>) = ra
            .iter()
            .filter_map(|(r, x)| Some((*x, *rb.get(r)?)))
            .unzip();
        if num.is_empty() || den.iter().sum::<f64>() <= 0.0 {
            return None;
        }
        let (value, (lo, hi)) = crate::ratio_of_means_with_95(&num, &den, RESAMPLES);
        value.is_finite().then_some(Ratio {
            value,
            lo,
            hi,
            pairs: num.len(),
        })
    }
}

/// A ratio of means over paired repetitions and its 95% interval (NaN bounds from one pair).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratio {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
    pub pairs: usize,
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lo.is_finite() && self.hi.is_finite() {
            write!(f, "{:.2}x ({:.2}–{:.2})", self.value, self.lo, self.hi)
        } else {
            write!(f, "{:.2}x (one pair: no interval)", self.value)
        }
    }
}

/// The line a target's ratio must keep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Line {
    AtMost(f64),
    AtLeast(f64),
}

/// A target's reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    Undecided,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "missed",
            Verdict::Undecided => "undecided",
        }
    }

    fn number(self) -> f64 {
        match self {
            Verdict::Met => 1.0,
            Verdict::Missed => -1.0,
            Verdict::Undecided => 0.0,
        }
    }

    /// Every one of `v` met: met; any missed: missed; else undecided.
    pub fn all(v: impl IntoIterator<Item = Verdict>) -> Option<Verdict> {
        let mut out = None;
        for x in v {
            out = Some(match (out, x) {
                (_, Verdict::Missed) | (Some(Verdict::Missed), _) => Verdict::Missed,
                (_, Verdict::Undecided) | (Some(Verdict::Undecided), _) => Verdict::Undecided,
                _ => Verdict::Met,
            });
        }
        out
    }
}

impl Line {
    /// Met when the whole interval keeps the line, missed when none of it does.
    pub fn verdict(self, r: &Ratio) -> Verdict {
        if !(r.lo.is_finite() && r.hi.is_finite()) {
            return Verdict::Undecided;
        }
        let (keeps, breaks) = match self {
            Line::AtMost(l) => (r.hi <= l, r.lo > l),
            Line::AtLeast(l) => (r.lo >= l, r.hi < l),
        };
        if keeps {
            Verdict::Met
        } else if breaks {
            Verdict::Missed
        } else {
            Verdict::Undecided
        }
    }
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Line::AtMost(l) => write!(f, "<= {l}x"),
            Line::AtLeast(l) => write!(f, ">= {l}x"),
        }
    }
}

/// A ratio the benchmark states: its JSON key (under `<shape>/target/`), what it compares, the
/// ratio, and the target's line if it is one.
#[derive(Clone, Debug)]
pub struct Stated {
    pub key: String,
    pub what: String,
    pub ratio: Ratio,
    pub line: Option<Line>,
}

impl Stated {
    pub fn verdict(&self) -> Option<Verdict> {
        self.line.map(|l| l.verdict(&self.ratio))
    }

    /// `0.43x (0.38–0.49); target <= 0.5x: **met**`, or for a ratio without a target, whether
    /// its interval excludes 1.
    pub fn reading(&self) -> String {
        match (self.line, self.verdict()) {
            (Some(l), Some(v)) => format!("{}; target {l}: **{}**", self.ratio, v.word()),
            _ => format!("{}; {}", self.ratio, differs(&self.ratio)),
        }
    }
}

/// What an interval says of a ratio with no target: lower, higher, or no difference.
fn differs(r: &Ratio) -> &'static str {
    if !(r.lo.is_finite() && r.hi.is_finite()) {
        "undecided"
    } else if r.hi < 1.0 {
        "lower"
    } else if r.lo > 1.0 {
        "higher"
    } else {
        "no difference we can see"
    }
}

/// The balancer's contenders that choose by load (round robin and static Maglev are not),
/// at any scrape interval (`composite@4000`).
pub fn is_load_aware_ours(name: &str) -> bool {
    matches!(
        super::contenders::without_interval(name),
        "least-conn" | "composite" | "affinity" | "persistence" | "persistence-unbounded"
    )
}

/// `0.50` for a load of half the knee.
pub fn load_key(load: f64) -> String {
    format!("{load:.2}")
}

fn load_of(key: &str) -> f64 {
    key.parse().unwrap_or(f64::NAN)
}

/// `1.00` as "at the knee", `0.50` as "at 50% of the knee".
pub fn load_words(load: &str) -> String {
    let l = load_of(load);
    if (l - 1.0).abs() < 1e-9 {
        "at the knee".into()
    } else {
        format!("at {:.0}% of the knee", l * 100.0)
    }
}

/// What the benchmark states for one shape, in the report's order:
///
/// - The best load-aware balancer policy (the lowest geometric mean of mean p99 TTFT over
///   50-100% of the knee) against round robin at each of those loads: p99 TTFT (target <=
///   0.5x), mean TTFT, goodput and throughput (targets: no lower, >= 0.98x).
/// - At the knee, the best balancer policy against the best router policy (each the lowest
///   mean p99 TTFT): p99 TTFT (<= 1.2x), mean TTFT, goodput, CPU per request (<= 0.05x).
/// - Where a session-affinity policy ran beside `composite`: `composite`'s mean TTFT over the
///   policy's (>= 1.5x), the policy's p99 over `composite`'s (no worse, <= 1.02x).
/// - Where a tenant-affinity policy ran: `composite`'s and `affinity`'s mean TTFT over its.
///
/// The best policies are picked on the same runs, so their ratios lean their way.
pub fn stated(s: &Samples) -> Vec<Stated> {
    let mut out = Vec::new();
    over_round_robin(s, &mut out);
    over_routers(s, &mut out);
    affinity(s, &mut out);
    tenant_affinity(s, &mut out);
    fair_share(s, &mut out);
    out
}

/// The `noisy-tenant` shape's runs (`llm::fairness`): at each load, the well-behaved tenants'
/// p99 TTFT in the noisy period with fair admission over the calm run's (<= 1.2x) and over the
/// run without fairness; the pool's goodput with fair admission over the run without (>=
/// 0.95x); and the well-behaved tenants' goodput in the period over the calm run's.
fn fair_share(s: &Samples, out: &mut Vec<Stated>) {
    use super::fairness::{CALM, CONTENDERS, NOISY};
    let fair = format!("{NOISY}:{}", CONTENDERS[0]);
    let calm = format!("{CALM}:{}", CONTENDERS[0]);
    let unfair = format!("{NOISY}:{}", CONTENDERS[1]);
    if !s.names.contains(&fair) {
        return;
    }
    for load in s.loads() {
        let at = load_words(&load);
        let mut push = |key: &str, what: String, r: Option<Ratio>, line: Option<Line>| {
            if let Some(ratio) = r {
                out.push(Stated {
                    key: format!("{key}/{load}"),
                    what,
                    ratio,
                    line,
                });
            }
        };
        push(
            "fair_well_p99_over_calm",
            format!(
                "well-behaved tenants' p99 TTFT in the noisy period, fair admission / the run without the excess, {at}"
            ),
            s.paired(&fair, &calm, &load, "well_ttft_p99_s"),
            Some(Line::AtMost(1.2)),
        );
        push(
            "fair_goodput_over_unfair",
            format!(
                "pool goodput with the noisy tenant, fair admission / the same policy without it, {at}"
            ),
            s.paired(&fair, &unfair, &load, "goodput_rps"),
            Some(Line::AtLeast(0.95)),
        );
        push(
            "unfair_well_p99_over_calm",
            format!(
                "well-behaved tenants' p99 TTFT in the noisy period without fairness / the run without the excess, {at}"
            ),
            s.paired(&unfair, &calm, &load, "well_ttft_p99_s"),
            None,
        );
        push(
            "fair_well_p99_over_unfair",
            format!(
                "well-behaved tenants' p99 TTFT in the noisy period, fair admission / without, {at}"
            ),
            s.paired(&fair, &unfair, &load, "well_ttft_p99_s"),
            None,
        );
        push(
            "fair_well_goodput_over_calm",
            format!(
                "well-behaved tenants' goodput in the noisy period, fair admission / the run without the excess, {at}"
            ),
            s.paired(&fair, &calm, &load, "well_goodput_rps"),
            None,
        );
    }
}

/// The loads of 50-100% of the knee.
fn mid_loads(s: &Samples) -> Vec<String> {
    s.loads()
        .into_iter()
        .filter(|l| (0.5 - 1e-9..=1.0 + 1e-9).contains(&load_of(l)))
        .collect()
}

/// The best load-aware balancer policy over 50-100% of the knee.
pub fn best_ours(s: &Samples) -> Option<String> {
    let mid = mid_loads(s);
    let score = |n: &str| -> Option<f64> {
        let v: Option<Vec<f64>> = mid.iter().map(|l| s.mean(n, l, "ttft_p99_s")).collect();
        let v = v?;
        (!v.is_empty())
            .then(|| (v.iter().map(|x| x.max(1e-6).ln()).sum::<f64>() / v.len() as f64).exp())
    };
    s.names
        .iter()
        .filter(|n| is_load_aware_ours(n))
        .filter_map(|n| Some((n.clone(), score(n)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|b| b.0)
}

fn over_round_robin(s: &Samples, out: &mut Vec<Stated>) {
    let Some(best) = best_ours(s) else { return };
    if !s.names.iter().any(|n| n == "round-robin") {
        return;
    }
    for load in mid_loads(s) {
        for (metric, key, what, line) in [
            (
                "ttft_p99_s",
                "ttft_p99",
                "p99 TTFT",
                Some(Line::AtMost(0.5)),
            ),
            ("ttft_mean_s", "ttft_mean", "mean TTFT", None),
            (
                "goodput_rps",
                "goodput",
                "goodput",
                Some(Line::AtLeast(0.98)),
            ),
            (
                "throughput_rps",
                "throughput",
                "throughput",
                Some(Line::AtLeast(0.98)),
            ),
        ] {
            if let Some(ratio) = s.paired(&best, "round-robin", &load, metric) {
                out.push(Stated {
                    key: format!("best_over_rr/{load}/{key}"),
                    what: format!("{what}, `{best}` / round robin, {}", load_words(&load)),
                    ratio,
                    line,
                });
            }
        }
    }
}

fn over_routers(s: &Samples, out: &mut Vec<Stated>) {
    let knee = load_key(1.0);
    let best = |pick: &dyn Fn(&str) -> bool| {
        s.names
            .iter()
            .filter(|n| pick(n))
            .filter_map(|n| Some((n.clone(), s.mean(n, &knee, "ttft_p99_s")?)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|b| b.0)
    };
    let (Some(ours), Some(router)) = (best(&is_load_aware_ours), best(&|n| n.contains(':'))) else {
        return;
    };
    for (metric, key, what, line) in [
        (
            "ttft_p99_s",
            "ttft_p99",
            "p99 TTFT",
            Some(Line::AtMost(1.2)),
        ),
        ("ttft_mean_s", "ttft_mean", "mean TTFT", None),
        ("goodput_rps", "goodput", "goodput", None),
        (
            "cpu_s_per_1k_requests",
            "cpu",
            "CPU per request",
            Some(Line::AtMost(0.05)),
        ),
    ] {
        if let Some(ratio) = s.paired(&ours, &router, &knee, metric) {
            out.push(Stated {
                key: format!("best_over_router/{key}"),
                what: format!("{what}, `{ours}` / `{router}`, at the knee"),
                ratio,
                line,
            });
        }
    }
}

fn affinity(s: &Samples, out: &mut Vec<Stated>) {
    for load in s.loads() {
        for policy in ["affinity", "persistence", "persistence-unbounded"] {
            if let Some(ratio) = s.paired("composite", policy, &load, "ttft_mean_s") {
                out.push(Stated {
                    key: format!("composite_over_{policy}/{load}/ttft_mean"),
                    what: format!(
                        "mean TTFT, load only (`composite`) / `{policy}`, {}",
                        load_words(&load)
                    ),
                    ratio,
                    line: Some(Line::AtLeast(1.5)),
                });
            }
            if let Some(ratio) = s.paired(policy, "composite", &load, "ttft_p99_s") {
                out.push(Stated {
                    key: format!("{policy}_over_composite/{load}/ttft_p99"),
                    what: format!(
                        "p99 TTFT, `{policy}` / load only (`composite`), {}",
                        load_words(&load)
                    ),
                    ratio,
                    line: Some(Line::AtMost(1.02)),
                });
            }
        }
    }
}

fn tenant_affinity(s: &Samples, out: &mut Vec<Stated>) {
    let knee = load_key(1.0);
    for tenant in s.names.iter().filter(|n| n.starts_with("tenant-affinity/")) {
        for other in ["composite", "affinity"] {
            if let Some(ratio) = s.paired(other, tenant, &knee, "ttft_mean_s") {
                out.push(Stated {
                    key: format!("{other}_over_tenant_affinity/ttft_mean"),
                    what: format!("mean TTFT, `{other}` / `{tenant}`, at the knee"),
                    ratio,
                    line: None,
                });
            }
        }
    }
}

/// The targets of `stated` still undecided.
pub fn undecided(stated: &[Stated]) -> usize {
    stated
        .iter()
        .filter(|s| s.verdict() == Some(Verdict::Undecided))
        .count()
}

/// The best policy's targets against round robin at every load, together.
pub fn over_round_robin_overall(stated: &[Stated]) -> Option<Verdict> {
    Verdict::all(
        stated
            .iter()
            .filter(|s| s.key.starts_with("best_over_rr/"))
            .filter_map(Stated::verdict),
    )
}

/// Writes `stated` into `f` under `<shape>/target/`.
pub fn insert(f: &mut Figures, shape: &str, stated: &[Stated]) {
    for s in stated {
        let k = format!("{shape}/target/{}", s.key);
        f.insert(k.clone(), s.ratio.value);
        f.insert(format!("{k}/lo"), s.ratio.lo);
        f.insert(format!("{k}/hi"), s.ratio.hi);
        f.insert(format!("{k}/pairs"), s.ratio.pairs as f64);
        if let (Some(line), Some(v)) = (s.line, s.verdict()) {
            let (name, l) = match line {
                Line::AtMost(l) => ("at_most", l),
                Line::AtLeast(l) => ("at_least", l),
            };
            f.insert(format!("{k}/{name}"), l);
            f.insert(format!("{k}/verdict"), v.number());
        }
    }
    f.insert(
        format!("{shape}/targets_undecided"),
        undecided(stated) as f64,
    );
}

#[cfg(test)]
mod tests;
