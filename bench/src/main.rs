//! `balancer-bench`: the benchmarks behind `cargo xtask bench`.

use anyhow::{Context as _, Result};
use balancer_bench::load::stats::Slo;
use balancer_bench::load::workload::{self, Shape};
use balancer_bench::{self as bench, client, control, dataplane, e2e, fleet, history, llm};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "balancer benchmarks; each prints a table and writes target/bench/<name>.json")]
struct Args {
    #[command(subcommand)]
    bench: Bench,
    /// Also write the benchmark's page (Markdown: its figures, the command, commit, date and
    /// machine) here; `cargo xtask bench <name>` without arguments writes
    /// docs/benchmarks/<name>.md (dataplane, e2e, control, fleet).
    #[arg(long, global = true, value_name = "PATH")]
    page: Option<std::path::PathBuf>,
}

/// Writes `figures` as `name`'s JSON, and as its page when `--page` names one.
fn publish(
    name: &str,
    figures: &bench::Figures,
    page: Option<&bench::page::Page>,
    to: Option<&std::path::Path>,
) -> Result<()> {
    publish_as(
        name,
        figures,
        page,
        to,
        &format!("cargo xtask bench {name}"),
    )
}

/// [`publish`], the page naming `command` as the run that made it.
fn publish_as(
    name: &str,
    figures: &bench::Figures,
    page: Option<&bench::page::Page>,
    to: Option<&std::path::Path>,
    command: &str,
) -> Result<()> {
    let path = bench::write_json(name, figures)?;
    println!("wrote {}", path.display());
    if let Some(to) = to {
        let page = page.with_context(|| format!("the {name} benchmark has no page"))?;
        bench::page::write(to, page, figures, command)?;
        println!("wrote {}", to.display());
    }
    Ok(())
}

#[derive(clap::Args)]
struct DataplaneArgs {
    /// Interleaved rounds (the median is reported; with --baseline, more rounds narrow
    /// each ratio's 95% interval).
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// Runs per syscall for the paths timed with the kernel's repeat.
    #[arg(long, default_value_t = 1_000_000)]
    repeat: u32,
    /// Single-run syscalls per round for the encapsulating paths.
    #[arg(long, default_value_t = 20_000)]
    singles: u32,
    /// Another build of the balancer object (e.g. an earlier commit's `xdp-balancer`, from
    /// its `target/*/build/balancer-user-*/out/`), timed beside this one in the same rounds:
    /// each path's new / baseline ratio.
    #[arg(long, value_name = "OBJECT")]
    baseline: Option<std::path::PathBuf>,
    /// Load the programs afresh every N rounds (0: once), so that the rounds also sample
    /// where the JIT places each program: one load's placement is fixed for its rounds, and
    /// intervals from a single load are too narrow.
    #[arg(long, default_value_t = 1, value_name = "N")]
    reload_every: usize,
    /// With --baseline: stop once every path's ratio has a 95% interval within ±WIDTH
    /// (e.g. 0.02), after at least 6 rounds; --rounds is then the most.
    #[arg(long, value_name = "WIDTH")]
    until_width: Option<f64>,
    /// Katran's XDP balancer object, built from Katran's source (`balancer.bpf.c`, default
    /// features; see docs/dev/benchmarking.md), timed beside this program in the same rounds
    /// on four paths: each path's cost net of the bare pass floor, ours / Katran's.
    #[arg(long, value_name = "OBJECT")]
    katran_object: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
struct E2eArgs {
    /// Rounds (peers interleaved, a fresh rack each; median and spread reported, and each of
    /// our modes beside its fair peer as a paired ratio with a bootstrap 95% interval).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds per phase.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Concurrent TCP connections (one generator thread each).
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// UDP sockets of the generator.
    #[arg(long, default_value_t = 4)]
    udp_sockets: usize,
    /// UDP datagrams in flight per socket.
    #[arg(long, default_value_t = 16)]
    udp_window: usize,
    /// Pin the generator to the last CPU and everything else to the others.
    #[arg(long)]
    pin: bool,
    /// Peers measured, in order: baseline, router (a plain forwarding hop), balancer,
    /// balancer_skb, balancer_nat (NAT to unmodified backends), balancer_snat (NAT with
    /// source NAT), balancer_snat_skb (the same in skb mode), nftables, nftables_snat (DNAT +
    /// masquerade), haproxy.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "baseline,router,balancer,balancer_skb,balancer_nat,balancer_snat,balancer_snat_skb,nftables,nftables_snat,haproxy"
    )]
    peers: Vec<String>,
}

#[derive(clap::Args)]
struct FleetArgs {
    /// Weight changes made on the leader.
    #[arg(long, default_value_t = 100)]
    changes: usize,
    /// Balancers in the fleet (one leads).
    #[arg(long, default_value_t = 3)]
    balancers: usize,
    /// Only the secured etcd (no plain run).
    #[arg(long)]
    tls_only: bool,
}

#[derive(clap::Args)]
struct CalibrateArgs {
    /// A running OpenAI-compatible server (vLLM, SGLang, sim-llm) to measure instead: its step
    /// time alone and with up to 4 requests at once, its prefill speed, its KV capacity.
    #[arg(long, value_name = "HOST:PORT")]
    server: Option<std::net::SocketAddr>,
    /// With --server: the model to ask for (default: the first it lists at /v1/models).
    #[arg(long, requires = "server")]
    model: Option<String>,
    /// With --server: the most requests in its batch (vLLM's --max-num-seqs).
    #[arg(long, requires = "server")]
    batch: Option<usize>,
    /// With --server: its KV cache in tokens (default: from its /metrics, vLLM's
    /// cache_config_info or TGI's batch budget).
    #[arg(long, requires = "server")]
    kv_tokens: Option<u64>,
    /// With --server: tokens computed per step at most (vLLM's --max-num-batched-tokens;
    /// default 128 per request of the batch).
    #[arg(long, requires = "server")]
    step_tokens: Option<u64>,
    /// With --server: the profile's name (a-z, 0-9, _).
    #[arg(long, default_value = "calibrated", requires = "server")]
    name: String,
    /// With --server: where to write the profile (default target/bench/NAME.profile).
    #[arg(long, value_name = "FILE", requires = "server")]
    profile_out: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
struct LlmArgs {
    /// One shape at 3 req/s, 60 requests, once: round robin, composite, vllm:power_of_two
    /// (a check that everything runs; `cargo xtask test` runs it).
    #[arg(long)]
    quick: bool,
    /// Which policy to use for this traffic and pool: the knee search, then round robin,
    /// least-conn, composite (and persistence when --trace-clients groups requests) at 50, 75
    /// and 100% of the knee, repeated until decided (3-6 times unless --reps says), ending with
    /// the choice, the ratios with their intervals that made it, and the VIP's config.
    #[arg(long, conflicts_with_all = ["quick", "sweep", "at_knee", "loads"])]
    recommend: bool,
    /// Workload shapes: conversation, prefill-heavy, mixed, multi-turn, multi-turn-nat,
    /// tenants, tenants-many, noisy-tenant (fair share between tenants: its own runs at 75%
    /// of its knee, with and without a tenant asking 4x its share, with and without fair
    /// admission).
    #[arg(long, value_delimiter = ',')]
    shapes: Option<Vec<String>>,
    /// Your own trace for the conversation shape to replay (as --trace-time says)
    /// and the mixed shape to draw sizes from, instead of the shipped Azure excerpt: an
    /// Azure LLM inference trace CSV, a BurstGPT CSV or Mooncake JSON lines, recognised
    /// from the first line.
    #[arg(long, value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
    /// Which client address each request of --trace comes from: per-request (request i from
    /// address i mod 100), per-session (BurstGPT's Session ID), per-prefix (Mooncake's first
    /// block: clients that share a prompt prefix share an address) or behind:N (N addresses
    /// in turn, as behind a NAT).
    #[arg(long, default_value = "per-request", value_name = "MAPPING")]
    trace_clients: String,
    /// How the trace's arrival times map to a run's: rate (scaled to each load's rate, the
    /// gaps kept in proportion) or recorded[:X] (at the recorded times, X times as fast: the
    /// trace's own rate and bursts; the conversation shape then runs once per repetition, at
    /// that rate, with no knee search or sweep, --duration seconds of the trace from an
    /// offset chosen by the seed).
    #[arg(long, default_value = "rate", value_name = "rate|recorded[:X]")]
    trace_time: String,
    /// Requests per run (default: those of --duration seconds at the run's load).
    #[arg(long)]
    requests: Option<usize>,
    /// Seconds of arrivals per run.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Repetitions of each point (different seeds), or `auto`: 3, then another repetition of
    /// every point of a shape while one of its targets is undecided (its interval straddles
    /// the line), up to --max-reps.
    #[arg(long, value_name = "N|auto")]
    reps: Option<String>,
    /// With --reps auto: the most repetitions of a shape (default 10; with --recommend, 6).
    #[arg(long)]
    max_reps: Option<usize>,
    /// Seed of the first repetition (repetition r plays seed FIRST_SEED + r): runs split
    /// over several commands, e.g. two builds interleaved seed by seed, replay the same
    /// workloads.
    #[arg(long, default_value_t = 1)]
    first_seed: u64,
    /// Loads of the sweep, as fractions of the knee.
    #[arg(long, value_delimiter = ',')]
    loads: Option<Vec<f64>>,
    /// A shape's knee instead of searching it, e.g. conversation=4.5 (repeatable).
    #[arg(long = "knee", value_name = "SHAPE=RATE")]
    knees: Vec<String>,
    /// The p99 TTFT (s) the knee keeps.
    #[arg(long, default_value_t = 5.0)]
    knee_ttft: f64,
    /// Contenders of the sweep (default per shape: round-robin, least-conn, composite,
    /// affinity, persistence and persistence-unbounded for the multi-turn shapes,
    /// tenant-affinity for tenants,
    /// vllm:cache_aware, sglang:cache_aware; none for multi-turn-nat, which runs at the
    /// knee only). A balancer's contender may name its own scrape interval, e.g.
    /// composite@4000.
    #[arg(long, value_delimiter = ',')]
    sweep: Option<Vec<String>>,
    /// Contenders at the knee (default: every policy and router policy).
    #[arg(long, value_delimiter = ',')]
    at_knee: Option<Vec<String>>,
    /// GPU profiles of the backends, one per server: large, small, a GPU written as numbers
    /// (NAME:kv=TOKENS:prefill=TOKENS_PER_S:decode=TOKENS_PER_S:batch=N, see sim-llm --help),
    /// or @FILE holding one (as `balancer-bench calibrate` writes it).
    #[arg(long, value_delimiter = ',', default_value = "large,large,small,small")]
    gpus: Vec<String>,
    /// SLO: time to first token, seconds.
    #[arg(long, default_value_t = 2.0)]
    slo_ttft: f64,
    /// SLO: mean inter-token latency, ms.
    #[arg(long, default_value_t = 100.0)]
    slo_itl_ms: f64,
    /// A fixed scrape interval for the balancer's telemetry policies, ms (default: the
    /// daemon's, paced by the VIP's requests: 8 per backend between scrapes, every
    /// 100-4000 ms)
    #[arg(long)]
    scrape_ms: Option<u64>,
    /// Where the report and plots go (default docs/results/llm; target/bench/llm-quick with
    /// --quick, target/bench/llm-recommend with --recommend).
    #[arg(long)]
    out_dir: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
struct ClientArgs {
    /// Requests per second (Poisson).
    #[arg(long, default_value_t = 3.0)]
    rate: f64,
    /// Seconds of load.
    #[arg(long, default_value_t = 30)]
    seconds: u32,
}

#[derive(clap::Args)]
struct HistoryArgs {
    /// The commits to compare, oldest first (at least two; anything `git rev-parse` takes):
    /// each is built in a worktree under target/history/ and its program loaded by its own
    /// daemon.
    #[arg(required = true, num_args = 2.., value_name = "COMMIT")]
    commits: Vec<String>,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Runs per syscall for the paths timed with the kernel's repeat.
    #[arg(long, default_value_t = 1_000_000)]
    repeat: u32,
    /// Single-run syscalls per round for the encapsulating path.
    #[arg(long, default_value_t = 20_000)]
    singles: u32,
    /// Load every build afresh (its daemon started again on a fresh pin directory) every N
    /// rounds (0: once).
    #[arg(long, default_value_t = 1, value_name = "N")]
    reload_every: usize,
}

#[derive(Subcommand)]
enum Bench {
    /// ns/packet of the XDP program per path (BPF_PROG_TEST_RUN), vs a bare XDP_PASS.
    Dataplane(DataplaneArgs),
    /// ns/packet of the XDP program as several commits built it, each loaded and configured by
    /// its own daemon, in the same rounds: each build against the one before it.
    History(HistoryArgs),
    /// The balancer against nftables DNAT, HAProxy (TCP mode) and no balancer, in the same
    /// rack: new connections/s, keep-alive requests/s, UDP packets/s, p50/p99 latency, CPU per
    /// packet.
    E2e(E2eArgs),
    /// Maglev build time, slots moved, balance, publish latency, daemon memory.
    Control,
    /// A fleet of balancers on etcd, with TLS, client certificates and a password, then plain:
    /// time from a weight change on the leader to its table being live on every follower,
    /// p50/p99/max.
    Fleet(FleetArgs),
    /// Routing quality on LLM traffic: simulated GPUs (two large and two small, or yours:
    /// --gpus) behind the balancer and behind two L7 routers (vllm-router, sglang-router), per
    /// workload shape: the knee, then a load sweep with repetitions, every ratio with a 95%
    /// interval over paired seeds; report, JSON and plots under docs/results/llm/ (default)
    /// and target/bench/llm.json. --recommend: which policy to use for your trace and pool.
    Llm(Box<LlmArgs>),
    /// The simulator against the real vLLM (CPU build) under the same burst: timelines of
    /// running, waiting, KV use and counters; docs/results/llm/calibration.md, and that
    /// server as a GPU profile for `llm --gpus @FILE` (calibration.profile). With --server:
    /// your running server measured and written as a GPU profile, nothing else.
    Calibrate(CalibrateArgs),
    /// Rewrites docs/benchmarks/llm.md from the JSON of the LLM runs it lists.
    LlmPage,
    /// A maintained load generator from PyPI (inference-perf) against the simulated GPU rack
    /// through the balancer (installs it into target/pyenv-inference-perf on first use).
    Client(ClientArgs),
}

fn main() -> Result<()> {
    let args = Args::parse();
    let page = args.page.as_deref();
    match args.bench {
        Bench::Dataplane(a) => dataplane_bench(a, page)?,
        Bench::History(a) => history_bench(a, page)?,
        Bench::E2e(a) => e2e_bench(a, page)?,
        Bench::Control => {
            let figures = control::run()?;
            publish("control", &figures, Some(&control::PAGE), page)?;
        }
        Bench::Fleet(a) => fleet_bench(a, page)?,
        Bench::Llm(a) => llm_bench(*a, page)?,
        Bench::Calibrate(a) => calibrate_bench(a, page)?,
        Bench::Client(a) => client_bench(a)?,
        Bench::LlmPage => {
            let root = workspace_root();
            let path = llm::page::write(&root)?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// `balancer-bench dataplane`.
fn dataplane_bench(a: DataplaneArgs, page: Option<&std::path::Path>) -> Result<()> {
    let DataplaneArgs {
        rounds,
        repeat,
        singles,
        baseline,
        reload_every,
        until_width,
        katran_object,
    } = a;
    if !(1..=1000).contains(&rounds) {
        anyhow::bail!("--rounds must be in 1..=1000");
    }
    if let Some(w) = until_width
        && (baseline.is_none() || !(w > 0.0 && w < 1.0))
    {
        anyhow::bail!("--until-width needs --baseline and a width in (0, 1), e.g. 0.02");
    }
    let baseline = baseline
        .map(|p| {
            std::fs::read(&p)
                .with_context(|| format!("reading the baseline object {}", p.display()))
        })
        .transpose()?;
    // The page names the run that made it (a page is written only with --page).
    let command = match (&katran_object, page) {
        (Some(k), Some(to)) => format!(
            "cargo xtask bench dataplane -- --katran-object {} --rounds {rounds} --page {}",
            k.display(),
            to.display()
        ),
        _ => "cargo xtask bench dataplane".to_string(),
    };
    let katran = katran_object
        .map(|p| {
            std::fs::read(&p).with_context(|| format!("reading the Katran object {}", p.display()))
        })
        .transpose()?;
    if baseline.is_some() && page.is_some() {
        anyhow::bail!("--page shows one build's figures: leave out --baseline");
    }
    let figures = dataplane::run(&dataplane::Settings {
        rounds,
        repeat,
        singles,
        baseline: baseline.as_deref(),
        reload_every,
        until_width,
        katran: katran.as_deref(),
    })?;
    publish_as(
        "dataplane",
        &figures,
        Some(&dataplane::PAGE),
        page,
        &command,
    )?;
    Ok(())
}

/// `balancer-bench history`.
fn history_bench(a: HistoryArgs, page: Option<&std::path::Path>) -> Result<()> {
    if !(2..=1000).contains(&a.rounds) {
        anyhow::bail!("--rounds must be in 2..=1000");
    }
    if a.commits.len() > 16 {
        anyhow::bail!("at most 16 commits");
    }
    let root = workspace_root();
    let figures = history::run(&history::Settings {
        root: &root,
        commits: &a.commits,
        rounds: a.rounds,
        repeat: a.repeat,
        singles: a.singles,
        reload_every: a.reload_every,
    })?;
    let command = format!("cargo xtask bench history -- {}", a.commits.join(" "));
    publish_as("history", &figures, Some(&history::PAGE), page, &command)
}

/// `balancer-bench e2e`.
fn e2e_bench(a: E2eArgs, page: Option<&std::path::Path>) -> Result<()> {
    let E2eArgs {
        rounds,
        seconds,
        connections,
        udp_sockets,
        udp_window,
        pin,
        peers,
    } = a;
    if !(0.1..=600.0).contains(&seconds) || !(1..=100).contains(&rounds) {
        anyhow::bail!("--seconds must be in [0.1, 600] and --rounds in 1..=100");
    }
    if !(1..=1024).contains(&connections)
        || !(1..=256).contains(&udp_sockets)
        || !(1..=4096).contains(&udp_window)
    {
        anyhow::bail!(
            "--connections must be in 1..=1024, --udp-sockets in 1..=256, --udp-window in 1..=4096"
        );
    }
    let peers = peers
        .iter()
        .map(|p| {
            e2e::Peer::by_key(p).ok_or_else(|| {
                anyhow::anyhow!("--peers: unknown peer {p:?} (baseline, router, balancer, balancer_skb, balancer_nat, balancer_snat, nftables, nftables_snat, haproxy)")
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let opts = e2e::Options {
        rounds,
        seconds,
        connections,
        udp_sockets,
        udp_window,
        pin,
        peers,
    };
    let figures = e2e::run(&opts)?;
    publish("e2e", &figures, Some(&e2e::PAGE), page)?;
    Ok(())
}

/// `balancer-bench fleet`.
fn fleet_bench(a: FleetArgs, page: Option<&std::path::Path>) -> Result<()> {
    let FleetArgs {
        changes,
        balancers,
        tls_only,
    } = a;
    if !(1..=10_000).contains(&changes) || !(2..=3).contains(&balancers) {
        anyhow::bail!("--changes must be in 1..=10000 and --balancers 2 or 3");
    }
    let opts = fleet::Options {
        changes,
        balancers,
        security: {
            use balancer_tests::fleet::EtcdSecurity;
            let mut s = vec![EtcdSecurity::MutualTlsAndPassword];
            if !tls_only {
                s.push(EtcdSecurity::Plain);
            }
            s
        },
    };
    let figures = fleet::run(&opts)?;
    publish("fleet", &figures, Some(&fleet::PAGE), page)?;
    Ok(())
}

/// `balancer-bench llm`.
fn llm_bench(a: LlmArgs, page: Option<&std::path::Path>) -> Result<()> {
    let opts = llm_options(a)?;
    let (_, figures) = llm::run(&opts)?;
    publish(
        if opts.quick {
            "llm-quick"
        } else if opts.recommend {
            "llm-recommend"
        } else {
            "llm"
        },
        &figures,
        None,
        page,
    )?;
    Ok(())
}

/// The routing benchmark's options from its arguments: `--quick`'s or the full run's, then
/// what the arguments change, each checked.
fn llm_options(a: LlmArgs) -> Result<llm::Options> {
    let LlmArgs {
        quick,
        recommend,
        shapes,
        trace,
        trace_clients,
        trace_time,
        requests,
        duration,
        reps,
        max_reps,
        first_seed,
        loads,
        knees,
        knee_ttft,
        sweep,
        at_knee,
        gpus,
        slo_ttft,
        slo_itl_ms,
        scrape_ms,
        out_dir,
    } = a;
    let root = workspace_root();
    let mut opts = if quick {
        llm::Options::quick(bench::results_dir().join("llm-quick"))
    } else {
        llm::Options::full(root.join("docs/results/llm"))
    };
    let out_dir_given = out_dir.is_some();
    if let Some(d) = out_dir {
        opts.out_dir = d;
    }
    let shapes_given = shapes.is_some();
    if let Some(s) = shapes {
        opts.shapes = s
            .iter()
            .map(|n| {
                Shape::parse(n).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--shapes: unknown shape {n:?} (conversation, prefill-heavy, mixed, multi-turn, multi-turn-nat, tenants, tenants-many, noisy-tenant)"
                    )
                })
            })
            .collect::<Result<_>>()?;
    }
    if requests.is_some() {
        opts.requests = requests;
    }
    if !quick {
        opts.duration = duration;
    }
    // Read with --reps auto, or by --recommend when it picks the repetitions.
    let cap_read = match reps.as_deref() {
        Some(n) => n == "auto",
        None => recommend,
    };
    if max_reps.is_some() && !cap_read {
        anyhow::bail!("--max-reps: applies with --reps auto (or --recommend without --reps) only");
    }
    match reps.as_deref() {
        None => {}
        Some("auto") => {
            let cap = max_reps.unwrap_or(10);
            opts.reps = AUTO_MIN_REPS.min(cap);
            opts.max_reps = Some(cap);
        }
        Some(n) => {
            opts.reps = n
                .parse()
                .map_err(|_| anyhow::anyhow!("--reps {n:?}: expected a number or auto"))?;
        }
    }
    opts.first_seed = first_seed;
    if let Some(l) = loads {
        opts.loads = l;
    }
    for k in knees {
        let (shape, rate) = k
            .split_once('=')
            .and_then(|(s, r)| Some((Shape::parse(s)?, r.parse::<f64>().ok()?)))
            .filter(|(_, r)| *r > 0.0 && *r <= 1000.0)
            .ok_or_else(|| {
                anyhow::anyhow!("--knee {k:?}: expected SHAPE=RATE, e.g. conversation=4.5")
            })?;
        opts.knees.insert(shape.name().to_string(), rate);
    }
    if sweep.is_some() {
        opts.sweep = sweep;
    }
    if at_knee.is_some() {
        opts.at_knee = at_knee;
    }
    opts.gpus = gpus.iter().map(|g| gpu_profile(g)).collect::<Result<_>>()?;
    opts.knee_ttft = knee_ttft;
    opts.slo = Slo {
        ttft: slo_ttft,
        itl: slo_itl_ms / 1e3,
    };
    opts.scrape_ms = scrape_ms;
    opts.trace_clients =
        workload::TraceClients::parse(&trace_clients).context("--trace-clients")?;
    opts.trace_time = workload::TraceTime::parse(&trace_time).context("--trace-time")?;
    if opts.trace_time != workload::TraceTime::Rate && requests.is_some() {
        anyhow::bail!(
            "--requests: a trace replayed as recorded plays --duration seconds of it; leave --requests out"
        );
    }
    if let Some(path) = trace {
        // Read once here, so a bad trace fails before any rack is built.
        let requests = bench::load::trace::read_trace(&path)?;
        println!("trace {}: {} requests", path.display(), requests.len());
        opts.trace_time
            .check_span(&requests, opts.duration)
            .with_context(|| format!("trace {} with --trace-time {trace_time}", path.display()))?;
        opts.trace = Some(path);
    }
    if recommend {
        opts.recommend = true;
        if !shapes_given {
            // The trace's shape, unless the user named others.
            opts.shapes = vec![Shape::Conversation];
        }
        if !out_dir_given {
            opts.out_dir = bench::results_dir().join("llm-recommend");
        }
        llm::recommend_options(&mut opts, reps.is_some(), max_reps);
    }
    check_llm_options(&opts)?;
    Ok(opts)
}

/// `--reps auto`'s repetitions before the first look at the targets: fewer pairs leave every
/// interval too wide to decide.
const AUTO_MIN_REPS: usize = 3;

/// Each option of the routing benchmark within its range.
fn check_llm_options(opts: &llm::Options) -> Result<()> {
    if opts.requests.is_some_and(|r| !(1..=100_000).contains(&r))
        || !(1.0..=3600.0).contains(&opts.duration)
        || !(1..=20).contains(&opts.reps)
        || opts.max_reps.is_some_and(|m| !(2..=20).contains(&m))
        || !(1..=1_000_000).contains(&opts.first_seed)
        || opts.loads.is_empty()
        || opts.loads.iter().any(|l| !(*l > 0.0 && *l <= 5.0))
        || !(opts.knee_ttft > 0.0 && opts.slo.ttft > 0.0 && opts.slo.itl > 0.0)
        || opts
            .scrape_ms
            .is_some_and(|ms| !(10..=60_000).contains(&ms))
    {
        anyhow::bail!(
            "--requests must be in 1..=100000, --duration in [1, 3600], --reps and --max-reps in 1..=20 (2..=20 with auto), --first-seed in 1..=1000000, --loads in (0, 5], the SLOs and --knee-ttft positive, --scrape-ms in 10..=60000"
        );
    }
    if !(1..=16).contains(&opts.gpus.len()) {
        anyhow::bail!("--gpus: 1 to 16 servers, {} given", opts.gpus.len());
    }
    Ok(())
}

/// One server's GPU of `--gpus`: a profile as `sim-llm --profile` reads it, checked, from the
/// argument or from the file `@FILE` names (its first line that is not blank or a `#` comment).
fn gpu_profile(arg: &str) -> Result<String> {
    let spec = match arg.strip_prefix('@') {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--gpus: reading the profile in {path}"))?;
            text.lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with('#'))
                .ok_or_else(|| anyhow::anyhow!("--gpus: {path} holds no profile"))?
                .to_string()
        }
        None => arg.to_string(),
    };
    balancer_sim::engine::Profile::parse(&spec).map_err(|e| anyhow::anyhow!("--gpus: {e}"))?;
    Ok(spec)
}

/// `balancer-bench calibrate`: against the CPU vLLM it starts, or a server of the user's.
fn calibrate_bench(a: CalibrateArgs, page: Option<&std::path::Path>) -> Result<()> {
    let CalibrateArgs {
        server,
        model,
        batch,
        kv_tokens,
        step_tokens,
        name,
        profile_out,
    } = a;
    let Some(addr) = server else {
        let root = workspace_root();
        let figures = bench::calibrate::run(&root.join("docs/results/llm"))?;
        return publish("calibrate", &figures, None, page);
    };
    let batch = batch.context(
        "--server needs --batch: the most requests in its batch (vLLM's --max-num-seqs)",
    )?;
    if !(1..=4096).contains(&batch) {
        anyhow::bail!("--batch must be in 1..=4096");
    }
    let opts = bench::calibrate::ServerOptions {
        addr,
        model,
        batch,
        kv_tokens,
        step_tokens,
        name,
    };
    let (profile, times) = bench::calibrate::measure_server(&opts)?;
    let out =
        profile_out.unwrap_or_else(|| bench::results_dir().join(format!("{}.profile", opts.name)));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    bench::calibrate::write_profile(&out, &format!("{addr}"), &profile, &times)
}

/// `balancer-bench client`.
fn client_bench(a: ClientArgs) -> Result<()> {
    let ClientArgs { rate, seconds } = a;
    if !(rate > 0.0 && rate <= 100.0 && (1..=3600).contains(&seconds)) {
        anyhow::bail!("--rate must be in (0, 100] and --seconds in 1..=3600");
    }
    let root = workspace_root();
    client::run(&root, rate, seconds)?;
    Ok(())
}

/// The workspace's root: the bench crate's parent folder.
fn workspace_root() -> std::path::PathBuf {
    let bench = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    bench.parent().unwrap_or(bench).to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llm(args: &[&str]) -> Result<llm::Options> {
        let all = ["balancer-bench", "llm"].iter().chain(args);
        match Args::try_parse_from(all)?.bench {
            Bench::Llm(a) => llm_options(*a),
            _ => unreachable!("parsed as llm"),
        }
    }

    #[test]
    fn reps_auto_starts_at_three_and_stops_at_its_cap() {
        let o = llm(&["--reps", "auto", "--max-reps", "8"]).unwrap();
        assert_eq!((o.reps, o.max_reps), (3, Some(8)));
        let o = llm(&["--reps", "5"]).unwrap();
        assert_eq!((o.reps, o.max_reps), (5, None));
        let o = llm(&["--reps", "auto", "--max-reps", "2"]).unwrap();
        assert_eq!((o.reps, o.max_reps), (2, Some(2)));
        for bad in [
            &["--reps", "many"][..],
            &["--reps", "0"],
            &["--reps", "auto", "--max-reps", "1"],
            &["--reps", "auto", "--max-reps", "50"],
            &["--max-reps", "5"],
            &["--reps", "4", "--max-reps", "5"],
        ] {
            let e = llm(bad).unwrap_err();
            assert!(format!("{e:#}").contains("--reps"), "{bad:?}: {e:#}");
        }
    }

    #[test]
    fn a_trace_as_recorded_is_checked_against_the_duration() {
        let trace = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/data/azure-llm-conv-excerpt.csv"
        );
        let o = llm(&["--trace", trace, "--trace-time", "recorded:2"]).unwrap();
        assert_eq!(o.trace_time, workload::TraceTime::Recorded { speed: 2.0 });
        // The excerpt spans about 507 s.
        for (args, want) in [
            (
                &[
                    "--trace",
                    trace,
                    "--trace-time",
                    "recorded",
                    "--duration",
                    "600",
                ][..],
                "shorter than the 600 s of arrivals asked (--duration)",
            ),
            (&["--trace-time", "asap"], "--trace-time"),
            (
                &["--trace-time", "recorded", "--requests", "50"],
                "--requests: a trace replayed as recorded",
            ),
        ] {
            let e = format!("{:#}", llm(args).unwrap_err());
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    #[test]
    fn recommend_sweeps_the_candidates_on_the_trace_shape_until_decided() {
        let o = llm(&["--recommend"]).unwrap();
        assert!(o.recommend);
        assert_eq!(o.shapes, [Shape::Conversation]);
        assert_eq!(o.loads, [0.5, 0.75, 1.0]);
        let c = ["round-robin", "least-conn", "composite"]
            .map(String::from)
            .to_vec();
        assert_eq!(o.sweep.as_ref(), Some(&c));
        assert_eq!(o.at_knee.as_ref(), Some(&c));
        assert_eq!((o.reps, o.max_reps), (3, Some(6)));
        assert!(o.out_dir.ends_with("llm-recommend"));
        // Clients grouped by session: persistence is a candidate; repetitions as given.
        let o = llm(&["--recommend", "--trace-clients", "behind:4", "--reps", "4"]).unwrap();
        assert!(o.sweep.unwrap().contains(&"persistence".to_string()));
        assert_eq!((o.reps, o.max_reps), (4, None));
        // Its cap, as given.
        let o = llm(&["--recommend", "--max-reps", "9"]).unwrap();
        assert_eq!((o.reps, o.max_reps), (3, Some(9)));
        assert!(llm(&["--recommend", "--quick"]).is_err());
    }

    #[test]
    fn gpus_take_names_numbers_or_a_file_and_name_what_is_wrong() {
        let file = std::env::temp_dir().join(format!("gpus-test-{}.profile", std::process::id()));
        std::fs::write(
            &file,
            "# written by balancer-bench calibrate\n\ncpu:kv=4096:prefill=900:decode=20:batch=4\n",
        )
        .unwrap();
        let at = format!(
            "large,h100:kv=65536:prefill=8000:decode=33:batch=64,@{}",
            file.display()
        );
        let o = llm(&["--gpus", &at]).unwrap();
        assert_eq!(
            o.gpus,
            [
                "large",
                "h100:kv=65536:prefill=8000:decode=33:batch=64",
                "cpu:kv=4096:prefill=900:decode=20:batch=4"
            ]
        );
        std::fs::remove_file(&file).unwrap();
        for (bad, says) in [
            ("huge", "--gpus: GPU profile \"huge\""),
            ("h100:kv=65536:prefill=8000:decode=33", "batch= is missing"),
            (
                "@/nonexistent/gpu.profile",
                "reading the profile in /nonexistent",
            ),
        ] {
            let e = format!("{:#}", llm(&["--gpus", bad]).unwrap_err());
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
