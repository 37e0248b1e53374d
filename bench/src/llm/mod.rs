//! `cargo xtask bench llm`: routing quality on LLM traffic. A rack of simulated GPU servers
//! (`sim-llm`, 2 large + 2 small by default) behind the balancer, and the same servers behind two
//! real L7 routers from PyPI (vllm-router, sglang-router) started in the balancer's namespace,
//! so every contender has the same hops. For each workload shape (`load::workload`):
//!
//! 1. **The knee**: the highest offered load (requests/s) at which the best of the balancer's
//!    load-aware policies (composite, least-conn) keeps p99 TTFT within `knee_ttft`, found by
//!    doubling then bisecting (or given with `--knee shape=rate`).
//! 2. **The sweep**: each load of `loads` (fractions of the knee) x `reps` repetitions (each a
//!    different seed: other arrivals, sizes, texts and trace stretch) x the sweep's contenders;
//!    at the knee itself every contender.
//!
//! Each run starts the servers afresh (empty caches, counters at 0), plays the workload from the
//! client namespace (each conversation from its own address, a connection per request) and
//! records TTFT, inter-token latency, E2E, throughput, goodput (requests within the SLO), the
//! prefix-cache hit rate the servers saw, and the CPU the router used (the router's process; for
//! the balancer its daemon plus its XDP program's run time from the kernel's BPF statistics).
//! Before the sweep, the latency each adds on an idle pool. `report` writes the Markdown report,
//! the JSON and the plots.

pub mod contenders;
pub mod fairness;
mod knee;
pub mod page;
mod rack;
mod recommend;
pub mod report;
pub mod verdicts;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use knee::*;
use rack::*;
pub use rack::{LlmRack, composite_rack, config, config_with};
pub use recommend::apply as recommend_options;

use anyhow::{Context as _, Result, bail};
use balancer::base::config::{AttachMode, RawVip};

use self::contenders::{Contender, ROUTER_PORT, VipSettings, start_router};
use super::Figures;
use super::cpu_account::CpuAccount;
use crate::load::client::{self, ClientOptions, GiveUp, Outcome, Target};
use crate::load::stats::{Slo, Summary, summarize};
use crate::load::workload::{self, Shape, TraceRequest, WorkloadOptions};
use balancer_tests::configs::{backend, to_toml, vip};
use balancer_tests::rack::{Process, binary, spawn_passive_reporter};
use balancer_tests::topology::{LB4, Topology, TopologyOptions, VIP4, backend4, rack_config};

/// The port the simulated servers (and the VIP) listen on.
pub const LLM_PORT: u16 = 8000;
/// The model they serve.
pub const MODEL: &str = "llama-3-8b";
/// The LLM VIP's name in the balancer's config.
const VIP_NAME: &str = "llm";
/// Where the balancer's daemon serves its metrics, in the balancer's namespace.
const METRICS_PORT: u16 = 9190;

/// How to run the benchmark.
#[derive(Clone, Debug)]
pub struct Options {
    pub shapes: Vec<Shape>,
    /// Requests per run; None: as many as arrive in `duration` seconds at the run's rate (at
    /// least 40).
    pub requests: Option<usize>,
    /// Seconds of arrivals per run, when `requests` is None.
    pub duration: f64,
    /// Repetitions of each point; with `max_reps`, the fewest.
    pub reps: usize,
    /// `--reps auto`: after `reps`, another repetition of every point of a shape while one of
    /// its targets is undecided, up to this many.
    pub max_reps: Option<usize>,
    /// The seed of the first repetition (repetition r plays `first_seed + r`).
    pub first_seed: u64,
    /// Loads of the sweep, as fractions of the knee.
    pub loads: Vec<f64>,
    /// Knees given instead of searched, requests/s.
    pub knees: BTreeMap<String, f64>,
    /// The p99 TTFT the knee keeps, seconds.
    pub knee_ttft: f64,
    /// Contenders of the sweep (None: `default_sweep` of each shape).
    pub sweep: Option<Vec<String>>,
    /// Contenders at the knee (None: every one).
    pub at_knee: Option<Vec<String>>,
    /// GPU profiles of the backends.
    pub gpus: Vec<String>,
    pub slo: Slo,
    /// The balancer's fixed scrape interval for the telemetry policies, ms (None: the
    /// daemon's default, paced by the VIP's requests).
    pub scrape_ms: Option<u64>,
    pub timeout: Duration,
    pub out_dir: PathBuf,
    /// One shape at one given load, one repetition: a check that everything still runs.
    pub quick: bool,
    /// The trace the conversation shape replays (and the mixed shape draws sizes from), in
    /// any format `load::trace` reads (None: the shipped Azure excerpt).
    pub trace: Option<PathBuf>,
    /// How the trace's requests map to client addresses.
    pub trace_clients: workload::TraceClients,
    /// How the trace's arrival times map to a run's: compressed to each load's rate, or as
    /// recorded (the conversation shape then runs at the trace's own rate, one load).
    pub trace_time: workload::TraceTime,
    /// End with which policy to use and its config (`recommend`).
    pub recommend: bool,
}

impl Options {
    /// The full benchmark's defaults.
    pub fn full(out_dir: PathBuf) -> Options {
        Options {
            shapes: Shape::ALL.to_vec(),
            requests: None,
            duration: 30.0,
            reps: 3,
            max_reps: None,
            first_seed: 1,
            loads: vec![0.3, 0.5, 0.75, 1.0, 1.1],
            knees: BTreeMap::new(),
            knee_ttft: 5.0,
            sweep: None,
            at_knee: None,
            gpus: ["large", "large", "small", "small"]
                .map(String::from)
                .to_vec(),
            slo: Slo::default(),
            scrape_ms: None,
            timeout: Duration::from_secs(300),
            out_dir,
            quick: false,
            trace: None,
            trace_clients: workload::TraceClients::PerRequest,
            trace_time: workload::TraceTime::Rate,
            recommend: false,
        }
    }

    /// `--quick`: the conversation shape at 3 requests/s, 60 requests, once, for round robin,
    /// the composite policy and one router.
    pub fn quick(out_dir: PathBuf) -> Options {
        let mut knees = BTreeMap::new();
        knees.insert(Shape::Conversation.name().to_string(), 3.0);
        Options {
            shapes: vec![Shape::Conversation],
            requests: Some(60),
            reps: 1,
            first_seed: 1,
            loads: vec![1.0],
            knees,
            sweep: Some(
                ["round-robin", "composite", "vllm:power_of_two"]
                    .map(String::from)
                    .to_vec(),
            ),
            at_knee: Some(Vec::new()),
            quick: true,
            ..Options::full(out_dir)
        }
    }
}

impl Options {
    /// How many repetitions each point gets, in words.
    pub fn repetitions(&self) -> String {
        match self.max_reps {
            Some(cap) => format!(
                "at least {} repetitions of each point, then another of every point of a shape while one of its targets is undecided, up to {cap}",
                self.reps
            ),
            None => format!("{} repetition(s) of each point", self.reps),
        }
    }
}

/// The sweep's contenders for a shape: round robin (the baseline), the balancer's load-aware
/// policies (and, for multi-turn, its session-affinity policies), and each router's
/// default policy (cache_aware, their best in earlier measurements). Every other policy runs at the knee. The
/// NAT variant of multi-turn runs at the knee only.
pub fn default_sweep(shape: Shape) -> Vec<String> {
    if shape == Shape::MultiTurnNat {
        return Vec::new();
    }
    if shape == Shape::NoisyTenant {
        return fairness::CONTENDERS.map(String::from).to_vec();
    }
    let mut v = vec!["round-robin", "least-conn", "composite"];
    if shape.multi_turn() {
        v.extend(["affinity", "persistence", "persistence-unbounded"]);
    }
    let tenant_affinity = shape
        .tenants()
        .map(|l| contenders::tenant_affinity(l.prefix_v4));
    v.extend(tenant_affinity.as_deref());
    v.extend(["vllm:cache_aware", "sglang:cache_aware"]);
    v.into_iter().map(String::from).collect()
}

/// Whether `shape` replays the trace at its recorded times (one load: the trace's own).
fn as_recorded(opts: &Options, shape: Shape) -> bool {
    shape == Shape::Conversation && opts.trace_time != workload::TraceTime::Rate
}

/// Whether the run has a conversation shape that replays its trace as recorded.
fn conversation_as_recorded(opts: &Options) -> bool {
    opts.shapes.contains(&Shape::Conversation) && as_recorded(opts, Shape::Conversation)
}

/// Requests of a run at `rate`.
fn requests_at(opts: &Options, rate: f64) -> usize {
    opts.requests
        .unwrap_or_else(|| ((rate * opts.duration).round() as usize).max(40))
}

/// One run's results.
#[derive(Clone, Debug)]
pub struct Run {
    pub shape: Shape,
    pub contender: String,
    /// Fraction of the knee (0 for the knee search's probes).
    pub load: f64,
    /// Offered requests per second.
    pub rate: f64,
    pub rep: usize,
    pub summary: Summary,
    /// CPU seconds of the contender per 1,000 requests.
    pub cpu_per_1k: Option<f64>,
    /// The balancer's BPF programs' part of `cpu_per_1k`.
    pub bpf_cpu_per_1k: Option<f64>,
    /// BPF program runs (packets through the balancer) per request.
    pub bpf_runs_per_request: Option<f64>,
    /// The balancer's rebuilds of the VIP's table per minute of the run (its weight rounds'
    /// changes reaching the table).
    pub table_rebuilds_per_min: Option<f64>,
    /// Session persistence's outcomes for the run's new flows (the daemon's global counters:
    /// the LLM VIP is the rack's only VIP with persistence); None for a router or a policy
    /// without persistence.
    pub persistence: Option<PersistenceChoices>,
    /// Prompt tokens found in the servers' prefix caches, of those looked up.
    pub prefix_hit_rate: Option<f64>,
    /// Every completed request's TTFT (for CDFs).
    pub ttfts: Vec<f64>,
    /// The requests of the premium clients (`workload::PREMIUM_PREFIX`) and of the others.
    pub premium: Summary,
    pub others: Summary,
    /// The `noisy-tenant` shape's figures by tenant and period.
    pub tenants: Option<fairness::TenantFigures>,
    pub wall: f64,
}

/// Session persistence's outcomes for new flows (`balancer_persistence_choices_total`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PersistenceChoices {
    /// Sent to the client's backend.
    pub returned: f64,
    /// The client's backend over its bounded load: placed by the scheduler.
    pub over_bound: f64,
    /// The client's backend marked by the policy's verdict (another serves its returning
    /// clients sooner): placed by the scheduler.
    pub sent_elsewhere: f64,
    /// No backend to return to: placed by the scheduler.
    pub placed: f64,
}

impl PersistenceChoices {
    /// Every new flow counted.
    pub fn total(&self) -> f64 {
        self.returned + self.over_bound + self.sent_elsewhere + self.placed
    }

    /// New flows of clients with a backend to return to.
    pub fn returning(&self) -> f64 {
        self.returned + self.over_bound + self.sent_elsewhere
    }
}

/// What one shape gave.
#[derive(Clone, Debug)]
pub struct ShapeResult {
    pub shape: Shape,
    pub knee: f64,
    /// "searched (N probes)" or "given".
    pub knee_how: String,
    pub probes: Vec<Run>,
    pub runs: Vec<Run>,
}

/// Everything the benchmark measured.
#[derive(Clone, Debug)]
pub struct Results {
    pub opts: Options,
    /// Median TTFT added on an idle pool, seconds, per contender (against the servers
    /// reached directly).
    pub idle_added: BTreeMap<String, f64>,
    pub idle_direct: f64,
    pub shapes: Vec<ShapeResult>,
    pub wall: f64,
    /// How the contenders' processes' CPU time was read.
    pub cpu_source: super::cpu_account::Source,
}

/// Where a run stands in the benchmark.
#[derive(Clone, Copy, Debug)]
struct Point<'a> {
    shape: Shape,
    contender: &'a str,
    rate: f64,
    /// Fraction of the knee (0 for the knee search's probes).
    load: f64,
    rep: usize,
}

/// Plays one run and sums it up.
fn measured_run(
    rack: &mut LlmRack,
    point: Point<'_>,
    trace: &[TraceRequest],
    opts: &Options,
) -> Result<Run> {
    let (shape, rate, load) = (point.shape, point.rate, point.load);
    let c = Contender::parse(point.contender, opts.scrape_ms)?;
    let work = workload::build(
        &WorkloadOptions {
            shape,
            requests: requests_at(opts, rate),
            rate,
            seed: opts.first_seed + point.rep as u64,
            trace_clients: opts.trace_clients,
            trace_time: opts.trace_time,
            seconds: opts.duration,
        },
        trace,
    )?;
    // A knee probe stops once its p99 is certainly over the line: the search needs only
    // whether it passed, and an overloaded probe would take minutes to drain.
    let give_up = (load == 0.0).then(|| {
        GiveUp::p99_over(
            Duration::from_secs_f64(opts.knee_ttft),
            workload::request_count(&work),
        )
    });
    // As recorded, the stretch says how many requests came in the run's seconds.
    let rate = if as_recorded(opts, shape) {
        workload::request_count(&work) as f64 / opts.duration
    } else {
        rate
    };
    played_run(rack, Point { rate, ..point }, &c, &work, opts, give_up)
}

/// Plays `work` through `c` and sums it up as the run of `point` (its contender's name as the
/// run's: a variant may name it otherwise than `c`).
fn played_run(
    rack: &mut LlmRack,
    point: Point<'_>,
    c: &Contender,
    work: &[workload::Conversation],
    opts: &Options,
    give_up: Option<GiveUp>,
) -> Result<Run> {
    let Point {
        shape,
        contender: name,
        rate,
        load,
        rep,
    } = point;
    let RunOutput {
        outcomes,
        cpu_per_1k,
        bpf_cpu_per_1k,
        bpf_runs_per_request,
        table_rebuilds_per_min,
        persistence,
        prefix_hit_rate,
        wall,
    } = rack.run(c, work, opts, give_up)?;
    let summary = summarize(&outcomes, opts.slo);
    let (premium, others): (Vec<Outcome>, Vec<Outcome>) = outcomes.iter().cloned().partition(|o| {
        work.iter()
            .find(|c| c.id == o.conversation)
            .is_some_and(|c| workload::is_premium(c.source))
    });
    let (premium, others) = (summarize(&premium, opts.slo), summarize(&others, opts.slo));
    let mut ttfts: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.ok())
        .filter_map(|o| o.ttft)
        .collect();
    ttfts.sort_by(f64::total_cmp);
    print_run(
        &point_line(shape, name, rate, rep),
        &summary,
        &outcomes,
        work,
        persistence,
        wall,
    );
    let tenants = (shape == Shape::NoisyTenant)
        .then(|| fairness::tenant_figures(work, &outcomes, opts.slo, opts.timeout.as_secs_f64()));
    Ok(Run {
        shape,
        contender: name.to_string(),
        load,
        rate,
        rep,
        summary,
        cpu_per_1k: Some(cpu_per_1k),
        bpf_cpu_per_1k,
        bpf_runs_per_request,
        table_rebuilds_per_min,
        persistence,
        prefix_hit_rate,
        ttfts,
        premium,
        others,
        tenants,
        wall,
    })
}

/// A run's line: who, where, its p99 TTFT and goodput, errors, persistence's choices; and,
/// behind a NAT, each client address's busiest server.
fn print_run(
    who: &str,
    summary: &Summary,
    outcomes: &[Outcome],
    work: &[workload::Conversation],
    persistence: Option<PersistenceChoices>,
    wall: f64,
) {
    let errors: BTreeMap<String, usize> =
        outcomes
            .iter()
            .filter_map(|o| o.error.clone())
            .fold(BTreeMap::new(), |mut m, e| {
                *m.entry(e.chars().take(60).collect()).or_default() += 1;
                m
            });
    println!(
        "  {who}: p99 TTFT {:>7.2} s, goodput {:>5.2}/s, {}/{} ok{}{}  ({wall:.0} s)",
        summary.ttft_p99,
        summary.goodput,
        summary.completed,
        summary.requests,
        if errors.is_empty() {
            String::new()
        } else {
            format!(", errors {errors:?}")
        },
        persistence.map_or(String::new(), |p| format!(
            "; persistence: {:.0} returned, {:.0} over the bound, {:.0} sent elsewhere, {:.0} placed",
            p.returned, p.over_bound, p.sent_elsewhere, p.placed
        )),
    );
    let homes = busiest_servers(work, outcomes);
    if homes.len() <= NAT_ADDRESSES_SHOWN {
        println!(
            "    by client address, the server that served most of its requests (its share): {}",
            homes
                .iter()
                .map(|(source, (server, share))| format!(
                    "{source} {server} ({:.0}%)",
                    share * 100.0
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// `shape contender rate rep`, as a run's line starts.
fn point_line(shape: Shape, name: &str, rate: f64, rep: usize) -> String {
    format!(
        "{:<7} {:<20} {rate:>5.2} req/s  rep {rep}",
        shape.name(),
        name
    )
}

/// Client addresses up to which a run's line says each one's busiest server (the shapes behind
/// a NAT: a few addresses, many conversations each).
const NAT_ADDRESSES_SHOWN: usize = 8;

/// Per client address of `work`, the server that served most of its completed requests, and
/// its share of them.
fn busiest_servers(
    work: &[workload::Conversation],
    outcomes: &[Outcome],
) -> BTreeMap<IpAddr, (String, f64)> {
    let source: BTreeMap<usize, IpAddr> = work.iter().map(|c| (c.id, c.source)).collect();
    let mut served: BTreeMap<IpAddr, BTreeMap<&str, usize>> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.ok()) {
        if let (Some(src), Some(backend)) = (source.get(&o.conversation), o.backend.as_deref()) {
            *served.entry(*src).or_default().entry(backend).or_default() += 1;
        }
    }
    served
        .into_iter()
        .filter_map(|(src, by)| {
            let total: usize = by.values().sum();
            let (server, n) = by.into_iter().max_by_key(|(_, n)| *n)?;
            Some((src, (server.to_string(), n as f64 / total as f64)))
        })
        .collect()
}

/// Runs the benchmark; prints as it goes, then writes the report.
pub fn run(opts: &Options) -> Result<(Results, Figures)> {
    let started = Instant::now();
    // BPF run-time statistics while the benchmark runs (the fd turns them off when dropped):
    // the balancer's CPU includes its XDP program's time, and the passive contender's its
    // backends' tc programs'.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enabling BPF run-time statistics")?;
    let trace = match &opts.trace {
        Some(path) => workload::read_trace(path)?,
        None => workload::shipped_trace()?,
    };
    if opts.shapes.contains(&Shape::Conversation) {
        opts.trace_time.check_span(&trace, opts.duration)?;
    }
    println!(
        "LLM routing benchmark: GPUs {}; {} per run, {}, loads {:?} of each shape's knee{}; SLO TTFT <= {} s and ITL <= {} ms",
        opts.gpus.join(", "),
        opts.requests.map_or(
            format!("the requests of {} s (at least 40)", opts.duration),
            |n| format!("{n} requests")
        ),
        opts.repetitions(),
        opts.loads,
        if conversation_as_recorded(opts) {
            " (conversation: one load, its trace as recorded)"
        } else {
            ""
        },
        opts.slo.ttft,
        opts.slo.itl * 1e3
    );
    let mut rack = LlmRack::build("llm", &opts.gpus)?;
    let everyone = every_contender(opts);
    for n in &everyone {
        Contender::parse(n, opts.scrape_ms)?;
    }
    let (idle_direct, idle_added) = idle_latency(&mut rack, &everyone, opts)?;
    println!(
        "idle pool: TTFT {:.1} ms reaching a server directly; added: {}",
        idle_direct * 1e3,
        idle_added
            .iter()
            .map(|(k, v)| format!("{k} {:+.2} ms", v * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut shapes = Vec::new();
    for &shape in &opts.shapes {
        shapes.push(run_shape(&mut rack, shape, &trace, opts)?);
    }
    let cpu_source = rack.account.source();
    drop(rack);
    let results = Results {
        opts: opts.clone(),
        idle_added,
        idle_direct,
        shapes,
        cpu_source,
        wall: started.elapsed().as_secs_f64(),
    };
    let figures = report::write(&results)?;
    Ok((results, figures))
}

/// Every contender some shape runs, each once, in the order first named.
fn every_contender(opts: &Options) -> Vec<String> {
    let mut everyone: Vec<String> = Vec::new();
    for s in &opts.shapes {
        for n in opts
            .sweep
            .clone()
            .unwrap_or_else(|| default_sweep(*s))
            .into_iter()
            .chain(opts.at_knee.clone().unwrap_or_else(contenders::all))
        {
            if !everyone.contains(&n) {
                everyone.push(n);
            }
        }
    }
    everyone
}

/// One shape: its knee (given or searched), then each load of the sweep x repetitions x the
/// contenders (every contender at the knee).
fn run_shape(
    rack: &mut LlmRack,
    shape: Shape,
    trace: &[TraceRequest],
    opts: &Options,
) -> Result<ShapeResult> {
    let recorded = as_recorded(opts, shape)
        .then(|| opts.trace_time.rate_of(trace))
        .flatten();
    let (knee, knee_how, probes) = match (recorded, opts.knees.get(shape.name())) {
        (Some(rate), _) => (
            rate,
            "as recorded: the trace's mean rate, not a knee".to_string(),
            Vec::new(),
        ),
        (None, Some(k)) => (*k, "given".to_string(), Vec::new()),
        (None, None) => {
            println!("{}: searching the knee", shape.name());
            let (k, probes) = find_knee(rack, shape, trace, opts)?;
            (k, format!("searched ({} probes)", probes.len()), probes)
        }
    };
    println!("{}: knee {knee:.2} requests/s ({knee_how})", shape.name());
    if shape == Shape::NoisyTenant {
        let runs = fairness::runs(rack, knee, opts)?;
        return Ok(ShapeResult {
            shape,
            knee,
            knee_how,
            probes,
            runs,
        });
    }
    let sweep_set = opts.sweep.clone().unwrap_or_else(|| default_sweep(shape));
    let knee_set = opts.at_knee.clone().unwrap_or_else(contenders::all);
    // Each load's contenders: the sweep's, and at the knee every contender of the knee set.
    let mut points: Vec<(f64, Vec<String>)> = Vec::new();
    // As recorded, one load: the trace's own, where every contender runs.
    let loads = match recorded {
        Some(_) => vec![1.0],
        None => opts.loads.clone(),
    };
    for &load in &loads {
        if sweep_set.is_empty() && (load - 1.0).abs() > 1e-9 {
            continue;
        }
        let mut names = sweep_set.clone();
        if (load - 1.0).abs() < 1e-9 {
            for n in &knee_set {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
        }
        points.push((load, names));
    }
    // Repetition by repetition, so that `--reps auto` can stop when every target is decided.
    let mut runs = Vec::new();
    for rep in 0.. {
        for (load, names) in &points {
            for name in names {
                runs.push(measured_run(
                    rack,
                    Point {
                        shape,
                        contender: name,
                        rate: knee * load,
                        load: *load,
                        rep,
                    },
                    trace,
                    opts,
                )?);
            }
        }
        let done = rep + 1;
        if done < opts.reps {
            continue;
        }
        let Some(cap) = opts.max_reps else { break };
        let stated = verdicts::stated(&report::samples(&runs));
        let undecided = verdicts::undecided(&stated);
        println!(
            "{}: after {done} repetition(s), {undecided} target(s) undecided{}",
            shape.name(),
            if undecided > 0 && done < cap {
                ": another repetition"
            } else {
                ""
            }
        );
        if undecided == 0 || done >= cap {
            break;
        }
    }
    Ok(ShapeResult {
        shape,
        knee,
        knee_how,
        probes,
        runs,
    })
}

#[cfg(test)]
mod tests;
