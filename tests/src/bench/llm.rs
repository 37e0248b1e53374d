//! `cargo xtask bench llm`: routing quality on LLM traffic. A rack of simulated GPU servers of
//! two sizes (2 large + 2 small by default) behind the balancer; the same workload (a slice of
//! a real trace, or a synthetic one) replayed through the VIP under each policy in turn: time
//! to first token and end-to-end latency percentiles, throughput, failures, share per backend,
//! a TTFT CDF picture, and flat figures in `target/bench/llm.json`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use balancer::config::AttachMode;

use super::Figures;
use crate::llmload::{
    Connections, Outcome, TraceRequest, at_rate, percentile, read_trace, replay, synthetic,
};
use crate::netns::{PREFIX, sweep};
use crate::topology::{Process, Topology, TopologyOptions, VIP4, backend4, binary, rack_config};

/// The port the simulated servers (and the VIP) listen on.
pub const LLM_PORT: u16 = 8000;
/// The model they serve.
pub const MODEL: &str = "llama-3-8b";

/// The policies compared, by name: what the VIP's config says for each.
pub const POLICIES: [(&str, &str); 4] = [
    ("round-robin", "scheduler = \"round-robin\"\n"),
    ("least-conn", "scheduler = \"least-conn\"\n"),
    ("maglev", "scheduler = \"maglev\"\n"),
    (
        "composite",
        "scheduler = \"maglev\"\n\
         telemetry = { source = \"scrape\", port = 8000, interval_ms = 100 }\n\
         policy = { kind = \"composite\" }\n",
    ),
];

/// How to run the comparison.
#[derive(Clone, Debug)]
pub struct Options {
    /// A `TIMESTAMP,ContextTokens,GeneratedTokens` trace; synthetic when absent.
    pub trace: Option<PathBuf>,
    pub requests: usize,
    /// Offered load, requests per second.
    pub rate: f64,
    pub policies: Vec<String>,
    /// GPU profiles of the backends, in order.
    pub gpus: Vec<String>,
    /// 0: a connection per request; else keep-alive sessions.
    pub sessions: usize,
    pub seed: u64,
    pub timeout: Duration,
    /// Where the table and the picture go.
    pub out_dir: PathBuf,
}

/// One policy's results.
pub struct PolicyResult {
    pub name: String,
    pub outcomes: Vec<Outcome>,
    pub wall: f64,
}

/// The workload of `opts`.
pub fn workload(opts: &Options) -> Result<Vec<TraceRequest>> {
    Ok(match &opts.trace {
        Some(path) => {
            let trace = read_trace(path)?;
            if trace.len() < opts.requests {
                bail!(
                    "{} has {} requests, fewer than --requests {}",
                    path.display(),
                    trace.len(),
                    opts.requests
                );
            }
            at_rate(&trace, opts.requests, opts.rate)
        }
        None => synthetic(opts.requests, opts.rate, opts.seed),
    })
}

/// The rack: `gpus.len()` backends, each running `sim-llm` with its profile on port 8000.
pub fn rack(tag: &str, gpus: &[String]) -> Result<Topology> {
    sweep(&format!("{PREFIX}-{tag}-"));
    let mut opts = TopologyOptions::new(tag);
    opts.backends = gpus.len();
    let mut topo = Topology::build(opts)?;
    topo.attach_peer_pass(AttachMode::Native)?;
    let sim = binary("sim-llm")?;
    let sim = sim.to_string_lossy().to_string();
    for (i, profile) in gpus.iter().enumerate() {
        let name = format!("gpu{}-{profile}", i + 1);
        let listen = format!("0.0.0.0:{LLM_PORT}");
        let argv = [
            sim.as_str(),
            "--listen",
            &listen,
            "--name",
            &name,
            "--profile",
            profile,
            "--model",
            MODEL,
        ];
        let mut p = Process::spawn(
            &topo.backends[i],
            &format!("sim-{}", i + 1),
            &argv,
            &topo.log_dir,
        )?;
        p.wait_for_log("listening", Duration::from_secs(10))?;
        topo.processes.push(p);
    }
    Ok(topo)
}

/// A rack of 2 large and 2 small simulated GPUs with the balancer running the composite
/// policy (the demo's and the real client's setup).
pub fn composite_rack(tag: &str) -> Result<Topology> {
    let gpus: Vec<String> = ["large", "large", "small", "small"]
        .map(String::from)
        .to_vec();
    let mut topo = rack(tag, &gpus)?;
    let composite = POLICIES
        .iter()
        .find(|(n, _)| *n == "composite")
        .map(|p| p.1)
        .unwrap_or_default();
    topo.start_balancer(&config(&topo, composite))?;
    Ok(topo)
}

/// The balancer config for `policy`: the rack's usual settings plus the LLM VIP.
pub fn config(topo: &Topology, policy_lines: &str) -> String {
    let base = rack_config(
        topo,
        "l2-dsr",
        AttachMode::Native,
        "[metrics]\nlisten = \"127.0.0.1:9190\"\n",
    );
    let mut text = format!(
        "{base}[[vip]]\nname = \"llm\"\naddress = \"{VIP4}\"\nport = {LLM_PORT}\n{policy_lines}"
    );
    for i in 0..topo.backends.len() {
        let _ = write!(text, "  [[vip.backend]]\n  address = \"{}\"\n", backend4(i));
    }
    text
}

/// Waits until every simulated server is idle (nothing running or waiting).
fn wait_idle(topo: &Topology, limit: Duration) -> Result<()> {
    let servers: Vec<SocketAddr> = (0..topo.backends.len())
        .map(|i| SocketAddr::new(IpAddr::V4(backend4(i)), LLM_PORT))
        .collect();
    let started = Instant::now();
    loop {
        let list = servers.clone();
        let busy = topo.client.run_in(move || -> usize {
            list.iter()
                .map(|s| {
                    let page =
                        crate::traffic::http_get_path(*s, "/metrics", Duration::from_secs(2))
                            .unwrap_or_default();
                    page.lines()
                        .filter(|l| {
                            l.starts_with("vllm:num_requests_running")
                                || l.starts_with("vllm:num_requests_waiting")
                        })
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum::<f64>() as usize
                })
                .sum()
        })?;
        if busy == 0 {
            return Ok(());
        }
        if started.elapsed() > limit {
            bail!("the servers still have {busy} requests after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the comparison; prints and writes the results.
pub fn run(opts: &Options) -> Result<Figures> {
    let work = workload(opts)?;
    let topo = rack("llm", &opts.gpus)?;
    let mut started = false;
    let mut results = Vec::new();
    let native_ctx: f64 =
        work.iter().map(|r| f64::from(r.prompt_tokens)).sum::<f64>() / work.len() as f64;
    let native_out: f64 =
        work.iter().map(|r| f64::from(r.output_tokens)).sum::<f64>() / work.len() as f64;
    println!(
        "LLM routing benchmark: {} requests at {:.1} req/s ({}), mean prompt {:.0} and output {:.0} tokens; GPUs: {}; {}",
        work.len(),
        opts.rate,
        opts.trace
            .as_ref()
            .map_or("synthetic workload".to_string(), |p| p
                .display()
                .to_string()),
        native_ctx,
        native_out,
        opts.gpus.join(", "),
        if opts.sessions == 0 {
            "a connection per request".to_string()
        } else {
            format!("{} keep-alive sessions", opts.sessions)
        }
    );
    let mut topo = topo;
    for name in &opts.policies {
        let (_, lines) = POLICIES.iter().find(|(n, _)| n == name).with_context(|| {
            format!(
                "unknown policy {name:?}; choose from {}",
                POLICIES.map(|p| p.0).join(", ")
            )
        })?;
        let text = config(&topo, lines);
        if started {
            topo.reload_balancer(&text)?;
        } else {
            topo.start_balancer(&text)?;
            started = true;
        }
        if *name == "composite" {
            // Let the first scrapes and weight rounds happen.
            std::thread::sleep(Duration::from_millis(500));
        }
        wait_idle(&topo, Duration::from_secs(600))?;
        let vip = SocketAddr::new(VIP4.into(), LLM_PORT);
        let how = if opts.sessions == 0 {
            Connections::PerRequest
        } else {
            Connections::Sessions(opts.sessions)
        };
        let w = work.clone();
        let timeout = opts.timeout;
        let t0 = Instant::now();
        let outcomes = topo
            .client
            .run_in(move || replay(vip, MODEL, &w, how, timeout))?;
        let wall = t0.elapsed().as_secs_f64();
        let ok = outcomes.iter().filter(|o| o.error.is_none()).count();
        println!("  {name}: {ok}/{} completed in {wall:.1} s", outcomes.len());
        results.push(PolicyResult {
            name: name.clone(),
            outcomes,
            wall,
        });
        wait_idle(&topo, Duration::from_secs(600))?;
    }
    let figures = summarize(&results, opts)?;
    drop(topo);
    Ok(figures)
}

fn ms(v: f64) -> f64 {
    v * 1e3
}

/// The table, the picture and the figures.
pub fn summarize(results: &[PolicyResult], opts: &Options) -> Result<Figures> {
    let mut figures = Figures::new();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| policy | TTFT p50 | TTFT p90 | TTFT p99 | E2E p50 | E2E p90 | E2E p99 | throughput | tokens/s | failed | share per backend |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    let mut curves: Vec<(String, Vec<f64>)> = Vec::new();
    for r in results {
        let done: Vec<&Outcome> = r
            .outcomes
            .iter()
            .filter(|o| o.error.is_none() && o.e2e.is_some())
            .collect();
        let mut ttft: Vec<f64> = done.iter().filter_map(|o| o.ttft).collect();
        let mut e2e: Vec<f64> = done.iter().filter_map(|o| o.e2e).collect();
        let failed = r.outcomes.len() - done.len();
        let first = r
            .outcomes
            .iter()
            .map(|o| o.sent)
            .fold(f64::INFINITY, f64::min);
        let last = done
            .iter()
            .map(|o| o.sent + o.e2e.unwrap_or(0.0))
            .fold(0.0, f64::max);
        let span = (last - first).max(1e-9);
        let throughput = done.len() as f64 / span;
        let tokens: u64 = done.iter().map(|o| u64::from(o.tokens)).sum();
        let mut shares: BTreeMap<String, usize> = BTreeMap::new();
        for o in &done {
            *shares
                .entry(o.backend.clone().unwrap_or_else(|| "?".into()))
                .or_insert(0) += 1;
        }
        let share_text = shares
            .iter()
            .map(|(b, n)| format!("{b} {:.0}%", 100.0 * *n as f64 / done.len().max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ");
        let p = |v: &mut Vec<f64>, q: f64| ms(percentile(v, q));
        let (t50, t90, t99) = (p(&mut ttft, 50.0), p(&mut ttft, 90.0), p(&mut ttft, 99.0));
        let (e50, e90, e99) = (p(&mut e2e, 50.0), p(&mut e2e, 90.0), p(&mut e2e, 99.0));
        let _ = writeln!(
            md,
            "| {} | {t50:.0} ms | {t90:.0} ms | {t99:.0} ms | {:.2} s | {:.2} s | {:.2} s | {throughput:.2} req/s | {:.0} | {failed} | {share_text} |",
            r.name,
            e50 / 1e3,
            e90 / 1e3,
            e99 / 1e3,
            tokens as f64 / span
        );
        let key = r.name.replace('-', "_");
        for (k, v) in [
            ("ttft_p50_ms", t50),
            ("ttft_p90_ms", t90),
            ("ttft_p99_ms", t99),
            ("e2e_p50_ms", e50),
            ("e2e_p90_ms", e90),
            ("e2e_p99_ms", e99),
            ("throughput_rps", throughput),
            ("tokens_per_s", tokens as f64 / span),
            ("failed", failed as f64),
            ("completed", done.len() as f64),
        ] {
            figures.insert(format!("{key}_{k}"), v);
        }
        curves.push((r.name.clone(), ttft));
    }
    let ratio = |figures: &Figures, a: &str, b: &str, k: &str| -> Option<f64> {
        Some(figures.get(&format!("{a}_{k}"))? / figures.get(&format!("{b}_{k}"))?)
    };
    let mut notes = String::new();
    if let Some(r) = ratio(&figures, "round_robin", "composite", "ttft_p99_ms") {
        figures.insert("round_robin_over_composite_ttft_p99".into(), r);
        let _ = writeln!(notes, "p99 TTFT, round robin / composite: {r:.1}x");
    }
    if let Some(r) = ratio(&figures, "composite", "round_robin", "throughput_rps") {
        figures.insert("composite_over_round_robin_throughput".into(), r);
        let _ = writeln!(notes, "throughput, composite / round robin: {r:.2}x");
    }
    println!("\n{md}\n{notes}");
    std::fs::create_dir_all(&opts.out_dir)?;
    let md_path = opts.out_dir.join("llm.md");
    std::fs::write(
        &md_path,
        format!(
            "{md}\n{notes}\nWorkload: {} requests at {:.1} req/s ({}); GPUs: {}; {}.\n",
            results.first().map_or(0, |r| r.outcomes.len()),
            opts.rate,
            opts.trace.as_ref().map_or("synthetic".to_string(), |p| p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string()),
            opts.gpus.join(", "),
            if opts.sessions == 0 {
                "a connection per request".to_string()
            } else {
                format!("{} keep-alive sessions", opts.sessions)
            }
        ),
    )?;
    let svg_path = opts.out_dir.join("ttft-cdf.svg");
    plot_cdf(&svg_path, &curves)?;
    println!("wrote {} and {}", md_path.display(), svg_path.display());
    Ok(figures)
}

/// A TTFT CDF per policy (log time axis).
fn plot_cdf(path: &Path, curves: &[(String, Vec<f64>)]) -> Result<()> {
    use plotters::prelude::*;
    let max = curves
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.1f64, f64::max)
        * 1.2;
    let min = curves
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(max, f64::min)
        .max(0.005)
        * 0.8;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Time to first token, CDF per policy", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((min..max).log_scale(), 0.0f64..1.0f64)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("TTFT (s, log scale)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let colors = [RED, BLUE, MAGENTA, GREEN, CYAN, BLACK];
    for (i, (name, values)) in curves.iter().enumerate() {
        let mut v = values.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len().max(1) as f64;
        let points: Vec<(f64, f64)> = v
            .iter()
            .enumerate()
            .map(|(k, t)| (t.max(min), (k + 1) as f64 / n))
            .collect();
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
