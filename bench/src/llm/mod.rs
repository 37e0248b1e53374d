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
pub mod report;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use balancer::base::config::{AttachMode, RawVip};

use self::contenders::{Contender, ROUTER_PORT, VipSettings, start_router};
use super::Figures;
use super::cpu_account::CpuAccount;
use crate::load::client::{self, ClientOptions, Outcome, Target};
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
    pub reps: usize,
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
}

impl Options {
    /// The full benchmark's defaults.
    pub fn full(out_dir: PathBuf) -> Options {
        Options {
            shapes: Shape::ALL.to_vec(),
            requests: None,
            duration: 30.0,
            reps: 3,
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

/// The sweep's contenders for a shape: round robin (the baseline), the balancer's load-aware
/// policies (and, for multi-turn, its session-affinity policies), and each router's
/// default policy (cache_aware, their best in earlier measurements). Every other policy runs at the knee. The
/// NAT variant of multi-turn runs at the knee only.
pub fn default_sweep(shape: Shape) -> Vec<String> {
    if shape == Shape::MultiTurnNat {
        return Vec::new();
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

/// The rack: a simulated server per backend, the client with 150 addresses, the balancer.
pub struct LlmRack {
    pub topo: Topology,
    gpus: Vec<String>,
    /// The L7 router, while one is the contender.
    router: Option<Process>,
    /// Each backend's `balancer report --passive-latency`, while a contender reads them.
    reporters: Vec<Process>,
    /// The CPU time of the contender's processes during a run.
    account: CpuAccount,
}

impl LlmRack {
    pub fn build(tag: &str, gpus: &[String]) -> Result<LlmRack> {
        let mut opts = TopologyOptions::new(tag);
        opts.backends = gpus.len();
        let mut topo = Topology::build(opts)?;
        topo.attach_peer_pass(AttachMode::Native)?;
        let addresses = workload::client_addresses(150);
        let script: String = addresses
            .iter()
            .map(|a| {
                format!(
                    "ip addr add {a}/24 dev eth0 nodad 2>/dev/null || ip addr add {a}/24 dev eth0; "
                )
            })
            .collect();
        topo.client.sh(&script)?;
        let mut rack = LlmRack {
            topo,
            gpus: gpus.to_vec(),
            router: None,
            reporters: Vec::new(),
            account: CpuAccount::new("balancer-bench-llm"),
        };
        rack.start_sims()?;
        let first = config(&rack.topo, &VipSettings::ROUND_ROBIN);
        rack.topo.start_balancer(&first)?;
        Ok(rack)
    }

    /// (Re)starts every simulated server: empty caches, counters at 0.
    pub fn start_sims(&mut self) -> Result<()> {
        let sim = binary("sim-llm")?.to_string_lossy().to_string();
        for (i, profile) in self.gpus.iter().enumerate() {
            let name = format!("sim-{}", i + 1);
            self.topo.rack.processes.retain(|p| p.name != name);
            let served_by = format!("gpu{}-{profile}", i + 1);
            let listen = format!("0.0.0.0:{LLM_PORT}");
            let argv = [
                sim.as_str(),
                "--listen",
                &listen,
                "--name",
                &served_by,
                "--profile",
                profile,
                "--model",
                MODEL,
            ];
            let mut p = Process::spawn(
                &self.topo.backends[i],
                &name,
                &argv,
                &self.topo.rack.log_dir,
            )?;
            p.wait_for_log("listening", Duration::from_secs(10))?;
            self.topo.rack.processes.push(p);
        }
        Ok(())
    }

    /// Puts `c` in front of the servers; the address the client sends to.
    fn prepare(&mut self, c: &Contender) -> Result<SocketAddr> {
        self.router = None;
        self.reporters.clear();
        match c {
            Contender::Balancer { settings, .. } => {
                if settings.passive_latency != contenders::PassiveLatency::Off {
                    self.start_reporters()?;
                }
                let text = config(&self.topo, settings);
                self.topo.reload_balancer(&text)?;
                Ok(SocketAddr::new(VIP4.into(), LLM_PORT))
            }
            Contender::Router { router, policy } => {
                self.router = Some(start_router(
                    &self.topo,
                    *router,
                    policy,
                    self.gpus.len(),
                    LLM_PORT,
                )?);
                Ok(SocketAddr::new(LB4.into(), ROUTER_PORT))
            }
        }
    }

    /// Starts `balancer report --serve` with passive latency on each backend's interface.
    fn start_reporters(&mut self) -> Result<()> {
        for i in 0..self.gpus.len() {
            let p = spawn_passive_reporter(
                &self.topo.backends[i],
                &format!("report-{}", i + 1),
                contenders::REPORT_PORT,
                LLM_PORT,
                &self.topo.rack.log_dir,
            )?;
            self.reporters.push(p);
        }
        Ok(())
    }

    /// Starts counting the contender's CPU time afresh: its processes (the router's, or the
    /// balancer's daemon and the backends' reporters when it reads them) alone in the account.
    fn start_accounting(&mut self, c: &Contender) -> Result<CpuUse> {
        self.account.clear();
        if c.is_router() {
            let pid = self.router.as_ref().context("no router running")?.pid();
            self.account.add_tree(pid);
        } else {
            let pid = self
                .topo
                .process("balancer")
                .context("no balancer running")?
                .pid();
            self.account.add_tree(pid);
            for p in &self.reporters {
                self.account.add_tree(p.pid());
            }
        }
        self.cpu_use(c)
    }

    /// CPU time the contender has used so far: its processes' (see [`Self::start_accounting`])
    /// and, for the balancer, its XDP program's (and the reporters' tc programs', when it reads
    /// them) from the kernel's BPF statistics.
    fn cpu_use(&self, c: &Contender) -> Result<CpuUse> {
        let processes_ns = self.account.used_ns()?;
        if c.is_router() {
            return Ok(CpuUse {
                processes_ns,
                ..CpuUse::default()
            });
        }
        let info = aya::programs::ProgramInfo::from_pin(
            balancer::dataplane::pinning::Pins::new(self.topo.pin_dir()).program(),
        )
        .context("reading the XDP program's statistics")?;
        let mut bpf_ns = info.run_time().as_nanos() as u64;
        let mut bpf_runs = info.run_count();
        if !self.reporters.is_empty() {
            let (ns, runs) = tc_latency_runs()?;
            bpf_ns += ns;
            bpf_runs += runs;
        }
        Ok(CpuUse {
            processes_ns,
            bpf_ns,
            bpf_runs,
        })
    }

    /// Fails if vllm-router's prefix policy routed without the prompt's tokens (the servers'
    /// render/tokenize answers did not reach it: the comparison would flatter the balancer).
    fn check_router_inputs(&self, c: &Contender) -> Result<()> {
        let page = self.metrics_page_in_lb(contenders::ROUTER_METRICS_PORT)?;
        let samples = balancer::steering::telemetry::page::parse(&page)?;
        let missing: f64 = samples
            .iter()
            .filter(|s| {
                s.name == "vllm_router_prefix_routing_decisions_total"
                    && s.label("outcome") == Some("missing_tokens")
            })
            .map(|s| s.value)
            .sum();
        if missing > 0.0 {
            bail!(
                "{}: {missing} requests were routed without their tokens (the servers' render answers did not reach the router)",
                c.name()
            );
        }
        Ok(())
    }

    /// The metrics page served on loopback `port` in the balancer's namespace (the router's
    /// or the daemon's).
    fn metrics_page_in_lb(&self, port: u16) -> Result<String> {
        let addr = SocketAddr::new([127, 0, 0, 1].into(), port);
        self.topo.lb.run_in(move || {
            balancer_tests::traffic::http_get_path(addr, "/metrics", Duration::from_secs(5))
        })?
    }

    /// The daemon's counters a run reads before and after: its rebuilds of the LLM VIP's
    /// table (`balancer_table_rebuilds_total`) and session persistence's outcomes
    /// (`balancer_persistence_choices_total`); None for a router.
    fn daemon_counts(&self, c: &Contender) -> Result<Option<DaemonCounts>> {
        if c.is_router() {
            return Ok(None);
        }
        let page = self.metrics_page_in_lb(METRICS_PORT)?;
        DaemonCounts::from_page(&page).map(Some)
    }

    /// Prompt tokens the servers found in their prefix caches, and looked up, since they
    /// started.
    fn prefix_counts(&self) -> Result<(f64, f64)> {
        let servers: Vec<SocketAddr> = (0..self.gpus.len())
            .map(|i| SocketAddr::new(IpAddr::V4(backend4(i)), LLM_PORT))
            .collect();
        let pages = self.topo.client.run_in(move || {
            servers
                .iter()
                .map(|s| {
                    balancer_tests::traffic::http_get_path(*s, "/metrics", Duration::from_secs(5))
                })
                .collect::<Result<Vec<String>>>()
        })??;
        let mut total = (0.0, 0.0);
        for page in pages {
            let samples = balancer::steering::telemetry::page::parse(&page)?;
            if let Some((h, q)) =
                balancer::steering::telemetry::signals::extract(&samples).prefix_cache_counts
            {
                total.0 += h;
                total.1 += q;
            }
        }
        Ok(total)
    }

    /// One run of `work` through `c`.
    fn run(
        &mut self,
        c: &Contender,
        work: &[workload::Conversation],
        opts: &Options,
    ) -> Result<RunOutput> {
        self.start_sims()?;
        let addr = self.prepare(c)?;
        if let Contender::Balancer { settings, .. } = c {
            // The first scrapes and weight rounds (paced: the first two come 100 ms apart).
            let ms = settings
                .scrape_ms
                .unwrap_or(balancer::base::config::DEFAULT_SCRAPE_INTERVAL_MS);
            std::thread::sleep(Duration::from_millis(3 * ms));
        }
        // Read before the CPU is counted and after: a page of the daemon's metrics costs it
        // a count of the connection table and of each table's slots.
        let counts0 = self.daemon_counts(c)?;
        let cpu0 = self.start_accounting(c)?;
        let target = Target {
            addr,
            model: MODEL.into(),
        };
        let w = work.to_vec();
        let copts = ClientOptions {
            timeout: opts.timeout,
            keep_alive: false,
            bind_sources: true,
        };
        let t0 = Instant::now();
        let outcomes = self
            .topo
            .client
            .run_in(move || client::run(&target, &w, copts))?;
        let wall = t0.elapsed().as_secs_f64();
        let cpu = self.cpu_use(c)?.since(&cpu0);
        let counts = self
            .daemon_counts(c)?
            .zip(counts0)
            .map(|(n, n0)| n.since(&n0));
        let (hits, queries) = self.prefix_counts()?;
        if c.is_router() {
            self.check_router_inputs(c)?;
        }
        self.router = None;
        self.reporters.clear();
        let per_1k = |ns: u64| ns as f64 / 1e9 / outcomes.len().max(1) as f64 * 1000.0;
        Ok(RunOutput {
            cpu_per_1k: per_1k(cpu.processes_ns + cpu.bpf_ns),
            bpf_cpu_per_1k: (!c.is_router()).then(|| per_1k(cpu.bpf_ns)),
            bpf_runs_per_request: (!c.is_router())
                .then(|| cpu.bpf_runs as f64 / outcomes.len().max(1) as f64),
            table_rebuilds_per_min: counts.map(|n| n.table_rebuilds / wall.max(1e-3) * 60.0),
            persistence: counts.map(|n| n.persistence).filter(|p| p.total() > 0.0),
            outcomes,
            prefix_hit_rate: (queries > 0.0).then(|| hits / queries),
            wall,
        })
    }
}

/// CPU time a contender used: its processes' and its BPF programs'.
#[derive(Clone, Copy, Debug, Default)]
struct CpuUse {
    processes_ns: u64,
    bpf_ns: u64,
    /// Times the BPF programs ran (packets seen).
    bpf_runs: u64,
}

impl CpuUse {
    /// What was used since `earlier`.
    fn since(&self, earlier: &CpuUse) -> CpuUse {
        CpuUse {
            processes_ns: self.processes_ns.saturating_sub(earlier.processes_ns),
            bpf_ns: self.bpf_ns.saturating_sub(earlier.bpf_ns),
            bpf_runs: self.bpf_runs.saturating_sub(earlier.bpf_runs),
        }
    }
}

/// What a run gave, before it is summed up.
struct RunOutput {
    outcomes: Vec<Outcome>,
    cpu_per_1k: f64,
    /// The balancer's BPF programs' part of `cpu_per_1k`.
    bpf_cpu_per_1k: Option<f64>,
    /// BPF program runs (packets) per request.
    bpf_runs_per_request: Option<f64>,
    table_rebuilds_per_min: Option<f64>,
    persistence: Option<PersistenceChoices>,
    prefix_hit_rate: Option<f64>,
    wall: f64,
}

/// Counters of the balancer's daemon (from its metrics page).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct DaemonCounts {
    /// Rebuilds of the LLM VIP's table.
    table_rebuilds: f64,
    persistence: PersistenceChoices,
}

impl DaemonCounts {
    /// The counts on a metrics page of the daemon.
    fn from_page(page: &str) -> Result<DaemonCounts> {
        let samples = balancer::steering::telemetry::page::parse(page)?;
        let table_rebuilds = samples
            .iter()
            .find(|s| s.name == "balancer_table_rebuilds_total" && s.label("vip") == Some(VIP_NAME))
            .map(|s| s.value)
            .with_context(|| {
                format!(
                    "the daemon's metrics have no balancer_table_rebuilds_total of VIP {VIP_NAME}"
                )
            })?;
        let choice = |result: &str| {
            samples
                .iter()
                .find(|s| {
                    s.name == "balancer_persistence_choices_total"
                        && s.label("result") == Some(result)
                })
                .map(|s| s.value)
                .with_context(|| {
                    format!(
                        "the daemon's metrics have no balancer_persistence_choices_total{{result=\"{result}\"}}"
                    )
                })
        };
        Ok(DaemonCounts {
            table_rebuilds,
            persistence: PersistenceChoices {
                returned: choice("returned")?,
                over_bound: choice("over_bound")?,
                sent_elsewhere: choice("sent_elsewhere")?,
                placed: choice("placed")?,
            },
        })
    }

    /// What was counted since `earlier`.
    fn since(&self, earlier: &DaemonCounts) -> DaemonCounts {
        let p = &self.persistence;
        let e = &earlier.persistence;
        DaemonCounts {
            table_rebuilds: self.table_rebuilds - earlier.table_rebuilds,
            persistence: PersistenceChoices {
                returned: p.returned - e.returned,
                over_bound: p.over_bound - e.over_bound,
                sent_elsewhere: p.sent_elsewhere - e.sent_elsewhere,
                placed: p.placed - e.placed,
            },
        }
    }
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

/// Run time (ns) and runs of every loaded passive latency program (the backends'
/// reporters'), from the kernel's BPF statistics.
fn tc_latency_runs() -> Result<(u64, u64)> {
    let mut total = (0, 0);
    for info in aya::programs::loaded_programs() {
        let info = info.context("listing the loaded BPF programs")?;
        let name = info.name_as_str().unwrap_or_default();
        if name == balancer::dataplane::ebpf::LATENCY_INGRESS_PROGRAM
            || name == balancer::dataplane::ebpf::LATENCY_EGRESS_PROGRAM
        {
            total.0 += info.run_time().as_nanos() as u64;
            total.1 += info.run_count();
        }
    }
    Ok(total)
}

/// The balancer config: the rack's usual VIPs, metrics on loopback, and the LLM VIP over
/// every backend with `settings`.
pub fn config(topo: &Topology, settings: &VipSettings) -> String {
    config_with(topo, |llm| settings.apply(llm))
}

/// Like [`config`], with the LLM VIP's settings made by `edit`.
pub fn config_with(topo: &Topology, edit: impl FnOnce(&mut RawVip)) -> String {
    let mut config = rack_config(topo, "l2-dsr", AttachMode::Native);
    config.metrics.listen = Some(format!("127.0.0.1:{METRICS_PORT}"));
    // The premium clients, a tier for the contenders with admission control (the others
    // never look it up: their VIP dedicates no backends to it).
    config.tier.push(balancer::base::config::RawTier {
        name: Some(contenders::PREMIUM_TIER.into()),
        prefixes: vec![workload::PREMIUM_PREFIX.into()],
        ..Default::default()
    });
    let mut llm = vip(VIP_NAME, VIP4, LLM_PORT);
    llm.backend = (0..topo.backends.len())
        .map(|i| backend(backend4(i), None))
        .collect();
    edit(&mut llm);
    config.vip.push(llm);
    to_toml(&config)
}

/// A rack of 2 large and 2 small simulated GPUs with the balancer running the composite
/// policy (the demo's and the real client's setup).
pub fn composite_rack(tag: &str) -> Result<Topology> {
    let gpus: Vec<String> = ["large", "large", "small", "small"]
        .map(String::from)
        .to_vec();
    let mut rack = LlmRack::build(tag, &gpus)?;
    let Contender::Balancer { settings, .. } = Contender::parse("composite", None)? else {
        bail!("composite is the balancer's");
    };
    let text = config(&rack.topo, &settings);
    rack.topo.reload_balancer(&text)?;
    let LlmRack { topo, .. } = rack;
    Ok(topo)
}

/// Plays one run and sums it up.
fn measured_run(
    rack: &mut LlmRack,
    point: Point<'_>,
    trace: &[TraceRequest],
    opts: &Options,
) -> Result<Run> {
    let Point {
        shape,
        contender: name,
        rate,
        load,
        rep,
    } = point;
    let c = Contender::parse(name, opts.scrape_ms)?;
    let work = workload::build(
        &WorkloadOptions {
            shape,
            requests: requests_at(opts, rate),
            rate,
            seed: opts.first_seed + rep as u64,
        },
        trace,
    )?;
    let RunOutput {
        outcomes,
        cpu_per_1k,
        bpf_cpu_per_1k,
        bpf_runs_per_request,
        table_rebuilds_per_min,
        persistence,
        prefix_hit_rate,
        wall,
    } = rack.run(&c, &work, opts)?;
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
    let errors: BTreeMap<String, usize> =
        outcomes
            .iter()
            .filter_map(|o| o.error.clone())
            .fold(BTreeMap::new(), |mut m, e| {
                *m.entry(e.chars().take(60).collect()).or_default() += 1;
                m
            });
    println!(
        "  {:<7} {:<20} {rate:>5.2} req/s  rep {rep}: p99 TTFT {:>7.2} s, goodput {:>5.2}/s, {}/{} ok{}{}  ({wall:.0} s)",
        shape.name(),
        name,
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
    let homes = busiest_servers(&work, &outcomes);
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
        wall,
    })
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

/// The knee of a shape: the highest rate at which the best of composite and least-conn keeps
/// p99 TTFT within `knee_ttft` with nothing failed, bracketed by doubling or halving from 2
/// requests/s, then 3 bisections.
fn find_knee(
    rack: &mut LlmRack,
    shape: Shape,
    trace: &[TraceRequest],
    opts: &Options,
) -> Result<(f64, Vec<Run>)> {
    let mut probes = Vec::new();
    let passes = |rack: &mut LlmRack, rate: f64, probes: &mut Vec<Run>| -> Result<bool> {
        let mut ok = false;
        for name in ["composite", "least-conn"] {
            let r = measured_run(
                rack,
                Point {
                    shape,
                    contender: name,
                    rate,
                    load: 0.0,
                    rep: 0,
                },
                trace,
                opts,
            )?;
            ok |= r.summary.failed == 0 && r.summary.ttft_p99 <= opts.knee_ttft;
            probes.push(r);
            if ok {
                break;
            }
        }
        Ok(ok)
    };
    // Bracket the knee by doubling (or halving) from 2 requests/s.
    let (mut good, mut bad);
    let mut rate = 2.0;
    if passes(rack, rate, &mut probes)? {
        loop {
            good = rate;
            rate *= 2.0;
            if rate > 64.0 {
                bail!("{}: no knee below 64 requests/s", shape.name());
            }
            if !passes(rack, rate, &mut probes)? {
                bad = rate;
                break;
            }
        }
    } else {
        loop {
            bad = rate;
            rate /= 2.0;
            if rate < 0.1 {
                bail!(
                    "{}: even 0.1 requests/s miss a p99 TTFT of {} s",
                    shape.name(),
                    opts.knee_ttft
                );
            }
            if passes(rack, rate, &mut probes)? {
                good = rate;
                break;
            }
        }
    }
    for _ in 0..3 {
        let mid = (good + bad) / 2.0;
        if passes(rack, mid, &mut probes)? {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Ok((good, probes))
}

/// 30 one-token requests, one at a time, to `addr` from the client: their outcomes.
fn idle_probe(rack: &LlmRack, addr: SocketAddr) -> Result<Vec<Outcome>> {
    let target = Target {
        addr,
        model: MODEL.into(),
    };
    let work: Vec<workload::Conversation> = (0..30)
        .map(|i| workload::Conversation {
            id: i,
            start: i as f64 * 0.25,
            source: workload::client_addresses(1)[0],
            turns: vec![workload::Turn {
                message: format!("idle probe {i}"),
                output_tokens: 1,
                think: 0.0,
            }],
        })
        .collect();
    let outcomes = rack.topo.client.run_in(move || {
        client::run(
            &target,
            &work,
            ClientOptions {
                timeout: Duration::from_secs(10),
                keep_alive: false,
                bind_sources: true,
            },
        )
    })?;
    if let Some(e) = outcomes.iter().find_map(|o| o.error.clone()) {
        bail!("an idle probe to {addr} failed: {e}");
    }
    Ok(outcomes)
}

/// The TTFT each contender adds on an idle pool: each request's TTFT against the median TTFT
/// of the same server reached directly (servers of two sizes answer in different times).
fn idle_latency(
    rack: &mut LlmRack,
    names: &[String],
    opts: &Options,
) -> Result<(f64, BTreeMap<String, f64>)> {
    rack.start_sims()?;
    let mut direct: BTreeMap<String, f64> = BTreeMap::new();
    for i in 0..rack.gpus.len() {
        let o = idle_probe(rack, SocketAddr::new(backend4(i).into(), LLM_PORT))?;
        let t: Vec<f64> = o.iter().filter_map(|o| o.ttft).collect();
        let name = o
            .iter()
            .find_map(|o| o.backend.clone())
            .context("no x-served-by")?;
        direct.insert(name, crate::load::stats::median(&t));
    }
    let mut added = BTreeMap::new();
    // One balancer policy stands for all (the data path is the same); each router policy on
    // its own (some ask every server before they route).
    for name in names {
        let c = Contender::parse(name, opts.scrape_ms)?;
        let key = match &c {
            Contender::Balancer { .. } => "balancer".to_string(),
            Contender::Router { .. } => c.name(),
        };
        if added.contains_key(&key) {
            continue;
        }
        rack.start_sims()?;
        let addr = rack.prepare(&c)?;
        let outcomes = idle_probe(rack, addr)?;
        rack.router = None;
        let extra: Vec<f64> = outcomes
            .iter()
            .filter_map(|o| Some(o.ttft? - direct.get(o.backend.as_ref()?)?))
            .collect();
        added.insert(key, crate::load::stats::median(&extra));
    }
    let base = crate::load::stats::median(&direct.values().copied().collect::<Vec<_>>());
    Ok((base, added))
}

/// Runs the benchmark; prints as it goes, then writes the report.
pub fn run(opts: &Options) -> Result<(Results, Figures)> {
    let started = Instant::now();
    // BPF run-time statistics while the benchmark runs (the fd turns them off when dropped):
    // the balancer's CPU includes its XDP program's time, and the passive contender's its
    // backends' tc programs'.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enabling BPF run-time statistics")?;
    let trace = workload::shipped_trace()?;
    println!(
        "LLM routing benchmark: GPUs {}; {} per run, {} repetition(s), loads {:?} of each shape's knee; SLO TTFT <= {} s and ITL <= {} ms",
        opts.gpus.join(", "),
        opts.requests.map_or(
            format!("the requests of {} s (at least 40)", opts.duration),
            |n| format!("{n} requests")
        ),
        opts.reps,
        opts.loads,
        opts.slo.ttft,
        opts.slo.itl * 1e3
    );
    let mut rack = LlmRack::build("llm", &opts.gpus)?;
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
        let (knee, knee_how, probes) = match opts.knees.get(shape.name()) {
            Some(k) => (*k, "given".to_string(), Vec::new()),
            None => {
                println!("{}: searching the knee", shape.name());
                let (k, probes) = find_knee(&mut rack, shape, &trace, opts)?;
                (k, format!("searched ({} probes)", probes.len()), probes)
            }
        };
        println!("{}: knee {knee:.2} requests/s ({knee_how})", shape.name());
        let sweep_set = opts.sweep.clone().unwrap_or_else(|| default_sweep(shape));
        let knee_set = opts.at_knee.clone().unwrap_or_else(contenders::all);
        let mut runs = Vec::new();
        for &load in &opts.loads {
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
            for rep in 0..opts.reps {
                for name in &names {
                    runs.push(measured_run(
                        &mut rack,
                        Point {
                            shape,
                            contender: name,
                            rate: knee * load,
                            load,
                            rep,
                        },
                        &trace,
                        opts,
                    )?);
                }
            }
        }
        shapes.push(ShapeResult {
            shape,
            knee,
            knee_how,
            probes,
            runs,
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn page(rebuilds: u64, choices: [u64; 4]) -> String {
        let [returned, over_bound, sent_elsewhere, placed] = choices;
        format!(
            "# TYPE balancer_table_rebuilds_total counter\n\
             balancer_table_rebuilds_total{{vip=\"other\"}} 99\n\
             balancer_table_rebuilds_total{{vip=\"{VIP_NAME}\"}} {rebuilds}\n\
             # TYPE balancer_persistence_choices_total counter\n\
             balancer_persistence_choices_total{{result=\"returned\"}} {returned}\n\
             balancer_persistence_choices_total{{result=\"over_bound\"}} {over_bound}\n\
             balancer_persistence_choices_total{{result=\"sent_elsewhere\"}} {sent_elsewhere}\n\
             balancer_persistence_choices_total{{result=\"placed\"}} {placed}\n"
        )
    }

    #[test]
    fn a_run_s_daemon_counts_are_the_difference_of_two_pages() {
        let before = DaemonCounts::from_page(&page(3, [10, 2, 1, 4])).unwrap();
        let after = DaemonCounts::from_page(&page(7, [40, 12, 1, 9])).unwrap();
        let run = after.since(&before);
        assert_eq!(run.table_rebuilds, 4.0);
        assert_eq!(
            run.persistence,
            PersistenceChoices {
                returned: 30.0,
                over_bound: 10.0,
                sent_elsewhere: 0.0,
                placed: 5.0,
            }
        );
        assert_eq!(run.persistence.returning(), 40.0);
        assert_eq!(run.persistence.total(), 45.0);
    }

    #[test]
    fn each_address_s_busiest_server_is_the_one_that_served_most_of_its_requests() {
        let conv = |id: usize, source: &str| workload::Conversation {
            id,
            start: 0.0,
            source: source.parse().unwrap(),
            turns: Vec::new(),
        };
        let work = [
            conv(0, "10.0.0.1"),
            conv(1, "10.0.0.1"),
            conv(2, "10.0.0.2"),
        ];
        let served = |conversation: usize, backend: &str| Outcome {
            conversation,
            e2e: Some(1.0),
            backend: Some(backend.into()),
            ..Default::default()
        };
        let mut outcomes = vec![
            served(0, "gpu0-large"),
            served(1, "gpu0-large"),
            served(1, "gpu2-small"),
            served(0, "gpu0-large"),
            served(2, "gpu3-small"),
        ];
        // A failed request counts for no server.
        outcomes.push(Outcome {
            error: Some("refused".into()),
            ..served(2, "gpu1-large")
        });
        let homes = busiest_servers(&work, &outcomes);
        assert_eq!(homes.len(), 2);
        assert_eq!(
            homes[&"10.0.0.1".parse::<IpAddr>().unwrap()],
            ("gpu0-large".into(), 0.75)
        );
        assert_eq!(
            homes[&"10.0.0.2".parse::<IpAddr>().unwrap()],
            ("gpu3-small".into(), 1.0)
        );
    }

    #[test]
    fn a_page_without_a_counter_is_an_error_naming_it() {
        let without = page(3, [1, 1, 1, 1]).replace("result=\"over_bound\"", "result=\"other\"");
        let err = DaemonCounts::from_page(&without).unwrap_err().to_string();
        assert!(err.contains("over_bound"), "{err}");
        let err = DaemonCounts::from_page("").unwrap_err().to_string();
        assert!(err.contains("balancer_table_rebuilds_total"), "{err}");
    }
}
