//! Benchmarks run by `cargo xtask bench <name>`: each prints a table and writes its figures as
//! flat JSON (units in the key names) to `target/bench/<name>.json`, and the canonical runs a
//! page under `docs/benchmarks/` ([`page`]). [`load`] is the LLM load generator the routing
//! benchmark, the calibration and the demo play.

pub mod calibrate;
pub mod client;
pub mod control;
pub mod cpu_account;
pub mod dataplane;
pub mod e2e;
pub mod fleet;
pub mod history;
pub mod llm;
pub mod load;
pub mod page;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

/// A benchmark's figures: flat keys with units in their names.
pub type Figures = BTreeMap<String, f64>;

/// Bootstrap resamples of the per-round ratios behind each 95% interval.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;

/// The median of `samples` (NaN when empty).
pub use crate::load::stats::median;

/// Where benchmark results go: `$BALANCER_BENCH_DIR`, or `target/bench` in the workspace.
pub fn results_dir() -> PathBuf {
    std::env::var_os("BALANCER_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            tests.parent().unwrap_or(&tests).join("target/bench")
        })
}

/// Writes `figures` to `<results_dir>/<name>.json`.
pub fn write_json(name: &str, figures: &Figures) -> Result<PathBuf> {
    let dir = results_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(figures)?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// utime + stime of every thread of `pid`, ns.
pub fn process_cpu_ns(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the command.
    let ticks: u64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0);
    Ok(ticks * (1_000_000_000 / clock_ticks()))
}

pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// The geometric mean of `ratios` and its 95% interval by the percentile bootstrap:
/// `resamples` draws of `ratios.len()` ratios with replacement (a fixed seed: the same ratios
/// give the same interval), the 2.5th and 97.5th percentiles of their geometric means. (The
/// mean of the logs, not the median: per-round ratios of whole nanoseconds take few values,
/// and a median's resamples then collapse onto one of them.) NaN when empty.
pub fn geomean_with_95(ratios: &[f64], resamples: usize) -> (f64, (f64, f64)) {
    let logs: Vec<f64> = ratios
        .iter()
        .filter(|r| r.is_finite() && **r > 0.0)
        .map(|r| r.ln())
        .collect();
    if logs.is_empty() || resamples == 0 {
        return (f64::NAN, (f64::NAN, f64::NAN));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let mut rng = crate::load::workload::Rng::new(0x5eed);
    let n = logs.len();
    let mut draw = vec![0.0; n];
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| {
            for d in draw.iter_mut() {
                *d = logs[(rng.next_u64() % n as u64) as usize];
            }
            mean(&draw)
        })
        .collect();
    let lo = crate::load::stats::percentile(&mut means, 2.5).exp();
    let hi = crate::load::stats::percentile(&mut means, 97.5).exp();
    (mean(&logs).exp(), (lo, hi))
}

/// The ratio of two paired samples' means, `mean(num) / mean(den)`, with a bootstrap 95%
/// interval that resamples the pairs (rounds): for costs that may come out near zero or below
/// in one round (net of a floor), where a mean of per-round ratios would not be defined.
pub fn ratio_of_means_with_95(num: &[f64], den: &[f64], resamples: usize) -> (f64, (f64, f64)) {
    let n = num.len().min(den.len());
    let ratio = |pick: &mut dyn FnMut() -> usize| {
        let (mut a, mut b) = (0.0, 0.0);
        for _ in 0..n {
            let i = pick();
            a += num[i];
            b += den[i];
        }
        a / b
    };
    if n == 0 || resamples == 0 {
        return (f64::NAN, (f64::NAN, f64::NAN));
    }
    let mut all = 0..n;
    let point = ratio(&mut || all.next().unwrap_or(0));
    if n < 2 {
        // One round says nothing of the spread.
        return (point, (f64::NAN, f64::NAN));
    }
    let mut rng = crate::load::workload::Rng::new(0x5eed);
    let mut draws: Vec<f64> = (0..resamples)
        .map(|_| ratio(&mut || (rng.next_u64() % n as u64) as usize))
        .filter(|r| r.is_finite())
        .collect();
    if draws.is_empty() {
        return (point, (f64::NAN, f64::NAN));
    }
    let lo = crate::load::stats::percentile(&mut draws, 2.5);
    let hi = crate::load::stats::percentile(&mut draws, 97.5);
    (point, (lo, hi))
}

/// What an interval of a new / old ratio says: "faster" or "slower" when it excludes 1.0,
/// else "no difference we can see".
pub fn verdict((lo, hi): (f64, f64)) -> &'static str {
    if hi < 1.0 {
        "faster"
    } else if lo > 1.0 {
        "slower"
    } else {
        "no difference we can see"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn a_ratio_of_means_pairs_the_rounds_and_survives_a_round_below_zero() {
        // Net costs: the numerator's third round fell below its floor.
        let num = [30.0, 32.0, -2.0, 31.0, 29.0, 33.0];
        let den = [100.0, 104.0, 98.0, 102.0, 99.0, 101.0];
        let (r, (lo, hi)) = ratio_of_means_with_95(&num, &den, 2000);
        assert!((r - 153.0 / 604.0).abs() < 1e-12, "{r}");
        assert!(lo < r && r < hi && lo > 0.1 && hi < 0.4, "{lo} {r} {hi}");
        // Paired: a drift shared by both sides moves neither the ratio nor its interval much.
        let drift: Vec<f64> = (0..6).map(|i| 1.0 + 0.3 * f64::from(i)).collect();
        let num2: Vec<f64> = drift.iter().map(|d| 30.0 * d).collect();
        let den2: Vec<f64> = drift.iter().map(|d| 100.0 * d).collect();
        let (r2, (lo2, hi2)) = ratio_of_means_with_95(&num2, &den2, 2000);
        assert!(
            (r2 - 0.3).abs() < 1e-12 && (hi2 - lo2) < 1e-9,
            "{lo2} {r2} {hi2}"
        );
        assert!(ratio_of_means_with_95(&[], &[], 100).0.is_nan());
        let (one, (lo1, hi1)) = ratio_of_means_with_95(&[1.0], &[4.0], 100);
        assert!(one == 0.25 && lo1.is_nan() && hi1.is_nan());
    }

    #[test]
    fn a_bootstrap_interval_holds_the_mean_and_narrows_with_more_rounds() {
        let round = |i: u32| 1.0 + 0.01 * f64::from(i % 5) - 0.02;
        let few: Vec<f64> = (0..9).map(round).collect();
        let (g, (lo, hi)) = geomean_with_95(&few, 2000);
        assert!(lo < g && g < hi, "{lo} {g} {hi}");
        assert!((g - 1.0).abs() < 0.01, "{g}");
        let many: Vec<f64> = (0..90).map(round).collect();
        let (_, (lo2, hi2)) = geomean_with_95(&many, 2000);
        assert!(hi2 - lo2 < hi - lo, "[{lo2}, {hi2}] vs [{lo}, {hi}]");
        assert_eq!(geomean_with_95(&few, 2000), (g, (lo, hi)), "deterministic");
        assert!(geomean_with_95(&[], 100).0.is_nan());
        let verdict_of = |r: &[f64]| verdict(geomean_with_95(r, 1000).1);
        assert_eq!(verdict_of(&[0.90, 0.91, 0.92, 0.90, 0.93]), "faster");
        assert_eq!(
            verdict_of(&[0.98, 1.02, 0.99, 1.01, 1.0]),
            "no difference we can see"
        );
        assert_eq!(verdict_of(&[1.10, 1.12, 1.09, 1.11, 1.1]), "slower");
        // Ratios of whole nanoseconds that take three values still get an interval.
        let quantized = [
            66.0 / 67.0,
            1.0,
            68.0 / 67.0,
            1.0,
            68.0 / 67.0,
            1.0,
            66.0 / 67.0,
        ];
        let (_, (lo, hi)) = geomean_with_95(&quantized, 2000);
        assert!(lo < 1.0 && hi > 1.0, "[{lo}, {hi}]");
    }
}
