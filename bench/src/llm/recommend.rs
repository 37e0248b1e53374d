//! `balancer-bench llm --recommend`: which of the balancer's policies to use for the user's
//! traffic and pool, from a knee search and a short sweep of the candidates, with the figures
//! and intervals that say why and the VIP's config to paste.
//!
//! The rule: among the load-aware candidates, those whose goodput is not lower than round
//! robin's at any load of the sweep (no interval wholly under 0.98x); of them, the lowest
//! geometric mean of mean p99 TTFT over the loads. If none, round robin. The runner-up is
//! compared with it at the knee, so the reader sees whether the choice is decided.

use std::fmt::Write as _;

use anyhow::{Result, bail};
use balancer::base::config::RawVip;
use balancer_tests::configs::{backend, vip};

use super::contenders::Contender;
use super::verdicts::{Line, Verdict, load_key, load_words};
use super::{LLM_PORT, Options, ShapeResult};
use crate::load::workload::TraceClients;

/// The loads of `--recommend`'s sweep, fractions of the knee.
pub const LOADS: [f64; 3] = [0.5, 0.75, 1.0];

/// The candidates for traffic whose clients map to addresses as `clients` says: round robin
/// (the baseline), least-conn, composite, and session persistence where a client's requests
/// share prompts (by session, by prefix or behind a few addresses).
pub fn candidates(clients: TraceClients) -> Vec<String> {
    let mut v = vec!["round-robin", "least-conn", "composite"];
    if clients != TraceClients::PerRequest {
        v.push("persistence");
    }
    v.into_iter().map(String::from).collect()
}

/// `--recommend`'s changes to `opts`: the sweep and the knee run the candidates only, at
/// [`LOADS`]; repetitions until the targets are decided (3 to `max_reps`, default 6) unless
/// `--reps` is given.
pub fn apply(opts: &mut Options, reps_given: bool, max_reps: Option<usize>) {
    let c = candidates(opts.trace_clients);
    opts.sweep = Some(c.clone());
    opts.at_knee = Some(c);
    opts.loads = LOADS.to_vec();
    if !reps_given {
        let cap = max_reps.unwrap_or(6);
        opts.reps = 3.min(cap);
        opts.max_reps = Some(cap);
    }
}

/// The recommendation for one shape.
#[derive(Clone, Debug)]
pub struct Recommendation {
    pub policy: String,
    /// Why, one line each.
    pub because: Vec<String>,
}

/// Picks the policy for `s` by the rule of the module's doc.
pub fn recommend(s: &ShapeResult) -> Option<Recommendation> {
    let samples = super::report::samples(&s.runs);
    let loads: Vec<String> = LOADS.iter().map(|l| load_key(*l)).collect();
    let ran = |n: &str| s.runs.iter().any(|r| r.contender == n);
    if !ran("round-robin") {
        return None;
    }
    let mut left_out = Vec::new();
    let mut scored: Vec<(String, f64)> = Vec::new();
    for name in candidates_ran(s) {
        let mut lower_goodput = None;
        let mut p99s = Vec::new();
        for load in &loads {
            let Some(p99) = samples.paired(&name, "round-robin", load, "ttft_p99_s") else {
                continue;
            };
            p99s.push(p99.value);
            if let Some(g) = samples.paired(&name, "round-robin", load, "goodput_rps")
                && Line::AtLeast(0.98).verdict(&g) == Verdict::Missed
            {
                lower_goodput = Some((load.clone(), g));
            }
        }
        if let Some((load, g)) = lower_goodput {
            left_out.push(format!(
                "`{name}` left out: its goodput is lower than round robin's {}: {g}",
                load_words(&load)
            ));
            continue;
        }
        if p99s.is_empty() {
            continue;
        }
        let score = (p99s.iter().map(|x| x.max(1e-6).ln()).sum::<f64>() / p99s.len() as f64).exp();
        scored.push((name, score));
    }
    scored.sort_by(|a, b| a.1.total_cmp(&b.1));
    let Some((best, _)) = scored.first().cloned() else {
        left_out.push("no load-aware candidate kept round robin's goodput: round robin".into());
        return Some(Recommendation {
            policy: "round-robin".into(),
            because: left_out,
        });
    };
    let mut because = Vec::new();
    for load in &loads {
        for (metric, what) in [("ttft_p99_s", "p99 TTFT"), ("goodput_rps", "goodput")] {
            if let Some(r) = samples.paired(&best, "round-robin", load, metric) {
                because.push(format!("{what} / round robin's {}: {r}", load_words(load)));
            }
        }
    }
    if let Some((second, _)) = scored.get(1) {
        let knee = load_key(1.0);
        for (metric, what) in [("ttft_p99_s", "p99 TTFT"), ("goodput_rps", "goodput")] {
            if let Some(r) = samples.paired(&best, second, &knee, metric) {
                because.push(format!(
                    "{what} / the runner-up `{second}`'s at the knee: {r}{}",
                    if r.lo.is_finite() && r.lo <= 1.0 && r.hi >= 1.0 {
                        " (no difference we can see: either will do)"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    because.extend(left_out);
    Some(Recommendation {
        policy: best,
        because,
    })
}

/// The load-aware candidates that ran in `s`, in the order they ran.
fn candidates_ran(s: &ShapeResult) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in &s.runs {
        if r.contender != "round-robin" && !v.contains(&r.contender) {
            v.push(r.contender.clone());
        }
    }
    v
}

/// The `[[vip]]` of the balancer's config with `policy`'s settings, for `servers` backends
/// (documentation addresses to replace with yours).
pub fn snippet(policy: &str, servers: usize) -> Result<String> {
    let Contender::Balancer { settings, .. } = Contender::parse(policy, None)? else {
        bail!("{policy} is not one of the balancer's policies");
    };
    let mut v = vip("llm", "192.0.2.10", LLM_PORT);
    v.backend = (0..servers)
        .map(|i| backend(format!("192.0.2.{}", 21 + i), None))
        .collect();
    settings.apply(&mut v);
    #[derive(serde::Serialize)]
    struct Vips {
        vip: Vec<RawVip>,
    }
    Ok(toml::to_string(&Vips { vip: vec![v] })?)
}

/// The report's section: per shape, the policy, why, and the config.
pub fn section(shapes: &[ShapeResult], opts: &Options, md: &mut String) -> Result<()> {
    let _ = writeln!(
        md,
        "## Recommendation\n\nThe rule: of the load-aware candidates whose goodput is not lower than round robin's at any load \
         (no interval wholly under 0.98x), the lowest geometric mean of p99 TTFT over {} of the knee; ratios are means over \
         paired seeds with bootstrap 95% intervals.\n",
        LOADS
            .iter()
            .map(|l| format!("{:.0}%", l * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for s in shapes {
        let Some(r) = recommend(s) else {
            let _ = writeln!(
                md,
                "### {}\n\nNo recommendation: round robin did not run.\n",
                s.shape.name()
            );
            continue;
        };
        let _ = writeln!(
            md,
            "### {}: use `{}`\n\nKnee {:.2} requests/s. {}\n",
            s.shape.name(),
            r.policy,
            s.knee,
            Contender::describe(&r.policy)
        );
        for b in &r.because {
            let _ = writeln!(md, "- {b}");
        }
        let _ = writeln!(
            md,
            "\nThe VIP in `/etc/balancer/balancer.toml` (addresses to replace with yours):\n\n```toml\n{}```\n",
            snippet(&r.policy, opts.gpus.len())?
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
