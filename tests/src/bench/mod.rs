//! Benchmarks run by `cargo xtask bench <name>`: each prints a table and writes its figures as
//! flat JSON (units in the key names) to `target/bench/<name>.json`.

pub mod calibrate;
pub mod client;
pub mod control;
pub mod cpu_account;
pub mod dataplane;
pub mod e2e;
pub mod fleet;
pub mod generators;
pub mod llm;
pub mod page;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

/// A benchmark's figures: flat keys with units in their names.
pub type Figures = BTreeMap<String, f64>;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
