//! The benchmark's outputs: a Markdown report (`report.md`), flat JSON figures (returned, and
//! written by the caller to `target/bench/llm.json`), and SVG plots per shape — p99 TTFT and
//! goodput against load, one line per contender, and the TTFT CDFs at the knee.
//!
//! JSON keys: `<shape>/<contender>/<load>/r<rep>/<metric>` for each run,
//! `<shape>/<contender>/<load>/median/<metric>` (and `min`, `max`) over repetitions,
//! `<shape>/knee_rps`, `idle/<contender>/added_ttft_ms`, and the stated ratios with their
//! intervals and verdicts under `<shape>/target/...` (`super::verdicts`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

mod plots;
mod targets;

use plots::*;
pub(crate) use targets::samples;
use targets::*;

use anyhow::Result;

use super::contenders::Contender;
use super::verdicts::load_key;
use super::{Results, Run, ShapeResult};
use crate::Figures;
use crate::load::stats::median;

/// A figure of a run: its name (with its unit) and value.
pub type Metric = (&'static str, f64);

/// A run's figures by name (seconds, requests/s, shares).
pub(super) fn metrics(r: &Run) -> Vec<Metric> {
    let s = &r.summary;
    let mut v = vec![
        ("ttft_p50_s", s.ttft_p50),
        ("ttft_p90_s", s.ttft_p90),
        ("ttft_p99_s", s.ttft_p99),
        ("ttft_mean_s", s.ttft_mean),
        ("itl_p50_ms", s.itl_p50 * 1e3),
        ("itl_p99_ms", s.itl_p99 * 1e3),
        ("e2e_p50_s", s.e2e_p50),
        ("e2e_p99_s", s.e2e_p99),
        ("throughput_rps", s.throughput),
        ("tokens_per_s", s.tokens_per_s),
        ("goodput_rps", s.goodput),
        ("slo_share", s.slo_share),
        ("failed", s.failed as f64),
        ("rate_rps", r.rate),
        ("premium_ttft_p50_s", r.premium.ttft_p50),
        ("premium_ttft_p99_s", r.premium.ttft_p99),
        ("premium_goodput_rps", r.premium.goodput),
        ("premium_failed", r.premium.failed as f64),
        ("others_ttft_p99_s", r.others.ttft_p99),
        ("others_goodput_rps", r.others.goodput),
        ("others_failed", r.others.failed as f64),
    ];
    if let Some(c) = r.cpu_per_1k {
        v.push(("cpu_s_per_1k_requests", c));
    }
    if let Some(c) = r.bpf_cpu_per_1k {
        v.push(("bpf_cpu_s_per_1k_requests", c));
    }
    if let Some(n) = r.bpf_runs_per_request {
        v.push(("bpf_runs_per_request", n));
    }
    if let Some(n) = r.table_rebuilds_per_min {
        v.push(("table_rebuilds_per_min", n));
    }
    if let Some(h) = r.prefix_hit_rate {
        v.push(("prefix_hit_rate", h));
    }
    if let Some(p) = r.persistence {
        // Of the new flows of clients with a backend to return to: the shares the bound and
        // the policy's verdict sent elsewhere; and of all new flows, those with none.
        let returning = p.returning();
        if returning > 0.0 {
            v.push(("returning_over_bound", p.over_bound / returning));
            v.push(("returning_sent_elsewhere", p.sent_elsewhere / returning));
        }
        v.push(("new_flows_placed", p.placed / p.total()));
    }
    if let Some(t) = &r.tenants {
        v.push(("well_ttft_p99_s", t.well_ttft_p99));
        v.push(("well_goodput_rps", t.well_goodput));
        v.push(("well_failed", t.well_failed as f64));
        v.push(("noisy_goodput_rps", t.noisy_goodput));
        v.push(("noisy_failed", t.noisy_failed as f64));
    }
    let moved = s.turns_moved();
    if !moved.is_nan() {
        v.push(("turns_moved", moved));
    }
    // The same by the kind of GPU the turn before was on (servers are named gpuN-PROFILE).
    for (profile, key) in [
        ("large", "turns_moved_from_large"),
        ("small", "turns_moved_from_small"),
    ] {
        let share = crate::load::stats::moved_share(
            s.turns_moved_from
                .iter()
                .filter(|(backend, _)| backend.rsplit('-').next() == Some(profile))
                .map(|(_, counts)| counts),
        );
        if !share.is_nan() {
            v.push((key, share));
        }
    }
    v
}

/// (median, min, max) of a metric over the repetitions of (contender, load).
fn stat(runs: &[&Run], metric: &str) -> Option<(f64, f64, f64)> {
    let v: Vec<f64> = runs
        .iter()
        .filter_map(|r| {
            metrics(r)
                .into_iter()
                .find(|(k, _)| *k == metric)
                .map(|x| x.1)
        })
        .filter(|x| !x.is_nan())
        .collect();
    if v.is_empty() {
        return None;
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((median(&v), lo, hi))
}

/// Runs by (contender, load key).
type ByPoint<'a> = BTreeMap<(String, String), Vec<&'a Run>>;

/// Runs grouped by (contender, load), contenders in first-seen order, loads sorted.
fn groups(s: &ShapeResult) -> (Vec<String>, Vec<f64>, ByPoint<'_>) {
    let mut names: Vec<String> = Vec::new();
    let mut loads: Vec<f64> = Vec::new();
    let mut g: ByPoint<'_> = BTreeMap::new();
    for r in &s.runs {
        if !names.contains(&r.contender) {
            names.push(r.contender.clone());
        }
        if !loads.iter().any(|l| (l - r.load).abs() < 1e-9) {
            loads.push(r.load);
        }
        g.entry((r.contender.clone(), load_key(r.load)))
            .or_default()
            .push(r);
    }
    loads.sort_by(f64::total_cmp);
    (names, loads, g)
}

fn cell(v: Option<(f64, f64, f64)>, scale: f64, digits: usize) -> String {
    match v {
        Some((m, lo, hi)) if (hi - lo).abs() > 1e-12 => format!(
            "{:.*} ({:.*}–{:.*})",
            digits,
            m * scale,
            digits,
            lo * scale,
            digits,
            hi * scale
        ),
        Some((m, _, _)) => format!("{:.*}", digits, m * scale),
        None => "–".into(),
    }
}

/// What this run covered, as the options that chose it.
fn options_line(o: &super::Options) -> String {
    let list = |v: &Option<Vec<String>>, default: &str| match v {
        Some(v) if v.is_empty() => "none".to_string(),
        Some(v) => v
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", "),
        None => default.to_string(),
    };
    format!(
        "Covered: shapes {}; loads {} of the knee; knees {}; swept: {}; also at the knee: {}; the balancer {}. The trace: {}, its requests' client addresses {}, its times {}.",
        o.shapes
            .iter()
            .map(|s| format!("`{}`", s.name()))
            .collect::<Vec<_>>()
            .join(", "),
        o.loads
            .iter()
            .map(|l| format!("{l}"))
            .collect::<Vec<_>>()
            .join(", "),
        if super::conversation_as_recorded(o) {
            "searched, but for conversation: its trace as recorded, at the trace's rate (one load)"
                .to_string()
        } else if o.knees.is_empty() {
            "searched".to_string()
        } else {
            format!(
                "given for {} (the others searched)",
                o.knees
                    .iter()
                    .map(|(s, r)| format!("{s} = {r} requests/s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        list(&o.sweep, "each shape's default set"),
        if o.loads.iter().any(|l| (l - 1.0).abs() < 1e-9) {
            list(&o.at_knee, "every contender")
        } else {
            "none (the loads leave the knee out)".to_string()
        },
        match o.scrape_ms {
            Some(ms) => format!("scraped every {ms} ms"),
            None => format!(
                "paced its scrapes by its requests (the daemon's default: {} requests per backend between scrapes, every {}-{} ms)",
                balancer::base::config::DEFAULT_REQUESTS_PER_SCRAPE,
                balancer::base::config::DEFAULT_SCRAPE_INTERVAL_MS,
                balancer::base::config::DEFAULT_MAX_SCRAPE_INTERVAL_MS
            ),
        },
        o.trace.as_ref().map_or(
            "the shipped Azure conversation excerpt".to_string(),
            |p| format!("`{}`", p.display())
        ),
        o.trace_clients.spec(),
        o.trace_time.describe(),
    )
}

/// Writes the report and plots under `out_dir`; the figures.
pub fn write(res: &Results) -> Result<Figures> {
    let out = &res.opts.out_dir;
    std::fs::create_dir_all(out)?;
    let mut f = Figures::new();
    let mut md = String::new();
    let o = &res.opts;
    let _ = writeln!(
        md,
        "# LLM routing benchmark\n\n`cargo xtask bench llm{}` on this machine ({} cores), wall time {:.0} min.\n\n\
         Pool: {} simulated GPUs (`sim-llm`: {}). Each run: {}, each conversation from its own client \
         address (4 addresses behind a NAT for `multi-turn-nat`), a connection per request, streamed completions; \
         the servers restarted before each run (empty caches); {}, seeds from {} (other seeds: other arrivals, \
         sizes, texts, trace stretch); cells show the median and, in brackets, the range. SLO for goodput: TTFT <= \
         {} s and mean inter-token latency <= {} ms. The knee: the highest load at which the best of the balancer's \
         composite and least-conn policies keeps p99 TTFT <= {} s with nothing failed.\n\n{}\n",
        if o.quick { " --quick" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        res.wall / 60.0,
        o.gpus.len(),
        o.gpus.join(", "),
        o.requests.map_or(
            format!(
                "the requests that arrive in {} s at its load (at least 40)",
                o.duration
            ),
            |n| format!("{n} requests")
        ),
        o.repetitions(),
        o.first_seed,
        o.slo.ttft,
        o.slo.itl * 1e3,
        o.knee_ttft,
        options_line(o),
    );
    let _ = writeln!(
        md,
        "## Latency added on an idle pool\n\nMedian TTFT of 30 one-token requests over the same server reached \
         directly ({:.1} ms):\n\n| contender | added |\n| --- | ---: |",
        res.idle_direct * 1e3
    );
    for (k, v) in &res.idle_added {
        let _ = writeln!(md, "| {k} | {:+.2} ms |", v * 1e3);
        f.insert(format!("idle/{k}/added_ttft_ms"), v * 1e3);
    }
    f.insert("idle/direct_ttft_ms".into(), res.idle_direct * 1e3);
    let _ = writeln!(
        md,
        "\nCPU per 1,000 requests, over a run (from its first request to its last answer): the contender's \
         processes' time, read from {}; for the balancer, its daemon's (and, for `-passive` contenders, \
         the backends' reporters') plus the run time of its BPF programs from the kernel's BPF statistics \
         (that part and the packets it saw per request in the column `XDP`). Table rebuilds: the \
         balancer's rebuilds of the VIP's Maglev table per minute of the run (its metric \
         `balancer_table_rebuilds_total`, read before and after), each a change of the weights \
         reaching the data plane.\n",
        res.cpu_source.describe()
    );

    if res.opts.recommend {
        super::recommend::section(&res.shapes, &res.opts, &mut md)?;
    }
    for s in &res.shapes {
        shape_section(s, &mut md, &mut f, out)?;
    }
    let _ = writeln!(md, "## Contenders\n\n| name | what |\n| --- | --- |");
    let mut names: Vec<&String> = res
        .shapes
        .iter()
        .flat_map(|s| s.runs.iter().map(|r| &r.contender))
        .collect();
    names.sort();
    names.dedup();
    for n in names {
        let _ = writeln!(md, "| `{n}` | {} |", Contender::describe(n));
    }
    f.insert("wall_s".into(), res.wall);
    let path = out.join("report.md");
    std::fs::write(&path, &md)?;
    println!("\n{md}\nwrote {}", path.display());
    Ok(f)
}

fn shape_section(s: &ShapeResult, md: &mut String, f: &mut Figures, out: &Path) -> Result<()> {
    let shape = s.shape.name();
    let (names, loads, g) = groups(s);
    shape_figures(s, &g, f);
    let _ = writeln!(
        md,
        "\n## {shape}\n\nKnee: **{:.2} requests/s** ({}); {} repetition(s) of each point.\n",
        s.knee,
        s.knee_how,
        s.runs.iter().map(|r| r.rep + 1).max().unwrap_or(0)
    );
    load_tables(s, &names, &loads, &g, md);
    if s.shape == crate::load::workload::Shape::NoisyTenant {
        tenant_table(&names, &loads, &g, md);
    } else {
        tier_table(&names, &loads, &g, md);
        knee_table(s, &names, &g, md);
    }
    targets(s, &names, &g, md, f);
    plots(s, &names, &loads, &g, out, md)?;
    Ok(())
}

/// A shape's figures: every run's, and each point's median, min and max.
fn shape_figures(s: &ShapeResult, g: &ByPoint<'_>, f: &mut Figures) {
    let shape = s.shape.name();
    f.insert(format!("{shape}/knee_rps"), s.knee);
    for r in &s.runs {
        for (k, v) in metrics(r) {
            f.insert(
                format!(
                    "{shape}/{}/{}/r{}/{k}",
                    r.contender,
                    load_key(r.load),
                    r.rep
                ),
                v,
            );
        }
    }
    for ((name, load), runs) in g {
        for (k, _) in metrics(runs[0]) {
            if let Some((m, lo, hi)) = stat(runs, k) {
                f.insert(format!("{shape}/{name}/{load}/median/{k}"), m);
                f.insert(format!("{shape}/{name}/{load}/min/{k}"), lo);
                f.insert(format!("{shape}/{name}/{load}/max/{k}"), hi);
            }
        }
    }
}

/// Tables by load: p99 TTFT and goodput.
fn load_tables(s: &ShapeResult, names: &[String], loads: &[f64], g: &ByPoint<'_>, md: &mut String) {
    // Tables by load: p99 TTFT and goodput.
    for (title, metric, scale, digits) in [
        ("p99 TTFT, s", "ttft_p99_s", 1.0, 2),
        ("Goodput, requests/s within the SLO", "goodput_rps", 1.0, 2),
    ] {
        let _ = write!(md, "### {title}\n\n| contender |");
        for l in loads {
            let _ = write!(md, " {:.0}% ({:.2}/s) |", l * 100.0, l * s.knee);
        }
        let _ = write!(md, "\n| --- |");
        for _ in loads {
            md.push_str(" ---: |");
        }
        md.push('\n');
        for n in names {
            let _ = write!(md, "| `{n}` |");
            for l in loads {
                let cellv = g
                    .get(&(n.clone(), load_key(*l)))
                    .and_then(|runs| stat(runs, metric));
                let _ = write!(md, " {} |", cell(cellv, scale, digits));
            }
            md.push('\n');
        }
        md.push('\n');
    }
}

/// By client tier: what admission control keeps for the premium clients, and what the others
/// lose.
fn tier_table(names: &[String], loads: &[f64], g: &ByPoint<'_>, md: &mut String) {
    let intro = format!(
        "### By client tier\n\nPremium clients ({}: 28 of the 100 client addresses): p99 TTFT s / goodput per s; \
         the other clients: p99 TTFT s / requests failed (refused, for admission control).",
        crate::load::workload::PREMIUM_PREFIX
    );
    split_table(
        &intro,
        ("premium", "others"),
        (
            &[("premium_ttft_p99_s", 2), ("premium_goodput_rps", 2)],
            &[("others_ttft_p99_s", 2), ("others_failed", 0)],
        ),
        (names, loads, g),
        md,
    );
}

/// The `noisy-tenant` shape's runs in the noisy period: the well-behaved tenants' p99 TTFT,
/// goodput and failures, the noisy tenant's goodput and failures.
fn tenant_table(names: &[String], loads: &[f64], g: &ByPoint<'_>, md: &mut String) {
    split_table(
        "### The noisy period, by tenant\n\nThe requests scheduled in the middle third of a run (where \
         the noisy tenant asks 4x its share): the three well-behaved tenants' p99 TTFT s (a failed \
         request counts as the client's timeout) / goodput per s / requests failed (refused); the \
         noisy tenant's goodput per s / requests failed.",
        ("well-behaved", "noisy"),
        (
            &[
                ("well_ttft_p99_s", 2),
                ("well_goodput_rps", 2),
                ("well_failed", 0),
            ],
            &[("noisy_goodput_rps", 2), ("noisy_failed", 0)],
        ),
        (names, loads, g),
        md,
    );
}

/// Metrics of a table cell: each metric's name and the digits it is shown with.
type CellMetrics<'a> = &'a [(&'a str, usize)];

/// A table of two columns per load (`labels`), each cell the medians of its `metrics` joined
/// by " / ", a row per contender, after `intro`.
fn split_table(
    intro: &str,
    labels: (&str, &str),
    metrics: (CellMetrics<'_>, CellMetrics<'_>),
    (names, loads, g): (&[String], &[f64], &ByPoint<'_>),
    md: &mut String,
) {
    let _ = write!(md, "{intro}\n\n| contender |");
    for l in loads {
        let _ = write!(md, " {:.0}% {} | {} |", l * 100.0, labels.0, labels.1);
    }
    let _ = write!(md, "\n| --- |");
    for _ in loads {
        md.push_str(" ---: | ---: |");
    }
    md.push('\n');
    for n in names {
        let _ = write!(md, "| `{n}` |");
        for l in loads {
            let runs = g.get(&(n.clone(), load_key(*l)));
            let cells = |ms: CellMetrics<'_>| {
                ms.iter()
                    .map(|(m, d)| cell(runs.and_then(|r| stat(r, m)), 1.0, *d))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let _ = write!(md, " {} | {} |", cells(metrics.0), cells(metrics.1));
        }
        md.push('\n');
    }
    md.push('\n');
}

/// Everything at the knee, per contender.
fn knee_table(s: &ShapeResult, names: &[String], g: &ByPoint<'_>, md: &mut String) {
    // Everything at the knee.
    let knee = load_key(1.0);
    let _ = writeln!(
        md,
        "### At the knee ({:.2} requests/s)\n\n| contender | TTFT p50 s | p90 s | p99 s | mean s | ITL p50 ms | p99 ms | E2E p50 s | p99 s | throughput /s | goodput /s | failed | prefix hits | CPU s / 1k req | XDP s / 1k req (packets / req) | table rebuilds / min |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        s.knee
    );
    for n in names {
        let Some(runs) = g.get(&(n.clone(), knee.clone())) else {
            continue;
        };
        let c = |m: &str, scale: f64, d: usize| cell(stat(runs, m), scale, d);
        let _ = writeln!(
            md,
            "| `{n}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c("ttft_p50_s", 1.0, 2),
            c("ttft_p90_s", 1.0, 2),
            c("ttft_p99_s", 1.0, 2),
            c("ttft_mean_s", 1.0, 2),
            c("itl_p50_ms", 1.0, 0),
            c("itl_p99_ms", 1.0, 0),
            c("e2e_p50_s", 1.0, 1),
            c("e2e_p99_s", 1.0, 1),
            c("throughput_rps", 1.0, 2),
            c("goodput_rps", 1.0, 2),
            c("failed", 1.0, 0),
            c("prefix_hit_rate", 100.0, 0) + "%",
            c("cpu_s_per_1k_requests", 1.0, 3),
            match stat(runs, "bpf_cpu_s_per_1k_requests") {
                Some(_) => format!(
                    "{} ({:.0})",
                    c("bpf_cpu_s_per_1k_requests", 1.0, 4),
                    stat(runs, "bpf_runs_per_request").map_or(f64::NAN, |s| s.0)
                ),
                None => "–".into(),
            },
            c("table_rebuilds_per_min", 1.0, 1),
        );
    }
}
