//! `docs/benchmarks/llm.md`: the routing benchmark's current figures, rendered from the JSON
//! of the runs in [`CURRENT`] (a full run takes longer than a working session, so the page
//! gathers the runs that measured each shape last). `balancer-bench llm-page` rewrites it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::Figures;
use crate::llm::verdicts;

/// A run the page shows: what it measured, and its directory under `docs/results/llm`.
pub struct Source {
    pub label: &'static str,
    pub dir: &'static str,
}

/// The runs that hold the current figures, in the page's order.
pub const CURRENT: &[Source] = &[
    Source {
        label: "Prefill-heavy and conversation: sweep of 50-100% of the knee, 3 repetitions",
        dir: "computed-share/sweep/prefill-conversation",
    },
    Source {
        label: "Mixed: sweep of 50-100% of the knee, 3 repetitions",
        dir: "computed-share/sweep/mixed-24s",
    },
    Source {
        label: "`--recommend` on the shipped conversation trace (the walk-through in will-it-help.md): round robin, least-conn and composite at 50-100% of the knee, 2 repetitions",
        dir: "recommend",
    },
    Source {
        label: "Mixed at 50% of the knee, 5 repetitions",
        dir: "computed-share/sweep/mixed-50-5-reps",
    },
    Source {
        label: "Multi-turn against the L7 routers at the knee",
        dir: "multi-turn-routers",
    },
    Source {
        label: "Multi-turn, each conversation from its own address: the knee and 75%",
        dir: "multi-turn-kept-code",
    },
    Source {
        label: "Multi-turn, each conversation from its own address: 50% of the knee",
        dir: "multi-turn-kept-code/half-knee",
    },
    Source {
        label: "Multi-turn behind a NAT (4 addresses) at the knee, 12 seeds",
        dir: "nat-homes/kept-12-seeds",
    },
    Source {
        label: "Multi-turn behind a NAT at 75% of the knee",
        dir: "nat-homes/home-by-capacity/nat-75-percent",
    },
    Source {
        label: "Fair share between tenants (`noisy-tenant`): calm load 75% of the knee, 60 s runs, 3 repetitions",
        dir: "fair-share/load-75",
    },
    Source {
        label: "Fair share between tenants (`noisy-tenant`): calm load 50% of the knee, 60 s runs, 3 repetitions",
        dir: "fair-share/load-50",
    },
];

const ABOUT: &str = "Four simulated GPU servers (`sim-llm`: 2 large, 2 small, calibrated \
against a real vLLM in [calibration](../results/llm/calibration.md)) behind the balancer's VIP, \
and the same servers behind vllm-router and sglang-router from PyPI, every contender with the \
same hops. Per shape the benchmark finds the knee (the highest load at which the best \
load-aware policy keeps p99 TTFT <= 5 s), then sweeps fractions of it with repetitions on \
other seeds. Each ratio is a ratio of means over the repetitions both contenders ran (the same \
seeds), with a bootstrap 95% interval over those pairs; a target is met when the whole interval \
keeps its line, missed when none of it does, undecided otherwise. The best policies are picked on \
the same runs. How it measures: [benchmarking.md](../dev/benchmarking.md#llm-routing).";

const TARGETS: &str = "Targets: the best balancer policy's p99 TTFT <= 0.5x round robin's at \
50-100% of the knee with goodput and throughput no lower (>= 0.98x); at the knee <= 1.2x the best \
L7 router policy's p99 TTFT at <= 1/20 of its CPU per request; for multi-turn traffic, session \
affinity with >= 1.5x lower mean TTFT than load only (`composite`), p99 no worse (<= 1.02x); \
with a tenant asking 4x its share (`noisy-tenant`), fair admission keeps the others' p99 TTFT \
<= 1.2x of the run without its excess at >= 0.95x the pool goodput of the same policy without \
fairness.";

/// Writes the page to `<root>/docs/benchmarks/llm.md` from the runs under
/// `<root>/docs/results/llm`.
pub fn write(root: &Path) -> Result<PathBuf> {
    let results = root.join("docs/results/llm");
    let mut runs = Vec::new();
    for source in CURRENT {
        let path = results.join(source.dir).join("llm.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        // A figure that was not a number (NaN) is written as null: left out.
        let figures: std::collections::BTreeMap<String, Option<f64>> =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let figures: Figures = figures
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
        runs.push((source, figures));
    }
    let page = render(&runs);
    let out = root.join("docs/benchmarks/llm.md");
    std::fs::write(&out, page).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

fn render(runs: &[(&Source, Figures)]) -> String {
    let mut md = format!(
        "# LLM routing\n\n```sh\ncargo xtask bench llm                 # the full benchmark: every shape, the sweep, every contender\n                                      # at the knee (9-10 hours on the 2-core VM)\ncargo xtask bench llm -- --quick      # one shape, one load, three contenders (3 minutes)\ncargo xtask bench llm -- --recommend --trace FILE   # the policy for your traffic (docs/user/will-it-help.md)\nbalancer-bench llm-page               # this page, from the runs' JSON\n```\n\n{ABOUT}\n\n{TARGETS}\n\nGenerated by `balancer-bench llm-page` from the `llm.json` of each run below; do not edit. \
         Each run's report (its command, commit, plots and every contender's figures) is beside its JSON.\n"
    );
    md.push_str(
        "\nReports without a JSON of targets: [calibration](../results/llm/calibration.md) (the \
         simulator against the real vLLM) and [passive latency](../results/llm/passive-latency/report.md) \
         (`balancer report --passive-latency`'s TTFT steering the composite policy).\n",
    );
    for (source, figures) in runs {
        let _ = writeln!(
            md,
            "\n## {}\n\n[report](../results/llm/{}/report.md)\n\n| shape | figure | value |\n| --- | --- | ---: |",
            source.label, source.dir
        );
        for (shape, figure, value) in rows(figures) {
            let _ = writeln!(md, "| {shape} | {figure} | {value} |");
        }
    }
    md
}

/// Each shape's knee and stated ratios in a run, with their intervals and verdicts, computed
/// from its repetitions' figures: `(shape, figure, value)`.
fn rows(f: &Figures) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let shapes: Vec<&str> = f
        .keys()
        .filter_map(|k| k.strip_suffix("/knee_rps"))
        .collect();
    for shape in shapes {
        let mut row = |figure: String, value: String| {
            out.push((shape.to_string(), figure, value));
        };
        if let Some(knee) = f.get(&format!("{shape}/knee_rps")) {
            row("knee".into(), format!("{knee:.2} requests/s"));
        }
        let stated = verdicts::stated(&verdicts::Samples::of_shape(f, shape));
        for s in &stated {
            row(s.what.clone(), s.reading());
        }
        if let Some(v) = verdicts::over_round_robin_overall(&stated) {
            row(
                "p99, goodput and throughput targets against round robin, every load".into(),
                format!("**{}**", v.word()),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_s_repetitions_become_rows_with_intervals_by_shape() {
        let mut f = Figures::new();
        f.insert("mixed/knee_rps".into(), 4.5);
        for (name, p99) in [
            ("composite", [1.0, 1.1, 0.9]),
            ("round-robin", [3.0, 3.0, 3.0]),
        ] {
            for (r, v) in p99.iter().enumerate() {
                f.insert(format!("mixed/{name}/0.50/r{r}/ttft_p99_s"), *v);
            }
            f.insert(format!("mixed/{name}/0.50/median/ttft_p99_s"), p99[0]);
        }
        f.insert("multi-turn/knee_rps".into(), 3.0);
        let rows = rows(&f);
        let find = |shape: &str, figure: &str| {
            rows.iter()
                .find(|(s, fig, _)| s == shape && fig.starts_with(figure))
                .map(|(_, _, v)| v.clone())
        };
        assert_eq!(find("mixed", "knee").as_deref(), Some("4.50 requests/s"));
        let p99 = find("mixed", "p99 TTFT, `composite` / round robin, at 50%").unwrap();
        assert!(p99.starts_with("0.33x ("), "{p99}");
        assert!(p99.ends_with("target <= 0.5x: **met**"), "{p99}");
        assert_eq!(
            find("mixed", "p99, goodput and throughput").as_deref(),
            Some("**met**")
        );
        assert_eq!(
            find("multi-turn", "knee").as_deref(),
            Some("3.00 requests/s")
        );
    }
}
