//! What routes the requests in a run: the balancer with one of its policies (its settings of
//! the VIP), or an L7 router from PyPI with one of its policies, started in the balancer's
//! namespace in front of the same servers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use balancer::base::config::{RawPolicy, RawTelemetry, RawVip};

use super::LLM_PORT;
use balancer_tests::rack::Process;
use balancer_tests::topology::{LB4, Topology, backend4};

/// The port a router listens on (the balancer's VIP serves the servers' port).
pub const ROUTER_PORT: u16 = 8100;
/// Its Prometheus port.
pub const ROUTER_METRICS_PORT: u16 = 8101;
/// The port of each backend's `balancer report --serve` page (passive latency).
pub const REPORT_PORT: u16 = 9400;

/// An L7 router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Router {
    Vllm,
    Sglang,
}

impl Router {
    pub const fn key(self) -> &'static str {
        match self {
            Router::Vllm => "vllm",
            Router::Sglang => "sglang",
        }
    }

    /// Its policies that work with vLLM-compatible workers.
    pub const fn policies(self) -> &'static [&'static str] {
        match self {
            Router::Vllm => &[
                "round_robin",
                "random",
                "power_of_two",
                "cache_aware",
                "consistent_hash",
                "sticky_least_loaded",
            ],
            Router::Sglang => &["round_robin", "random", "power_of_two", "cache_aware"],
        }
    }
}

/// One contender.
#[derive(Clone, Debug, PartialEq)]
pub enum Contender {
    /// The balancer, with these settings of the LLM VIP.
    Balancer {
        name: String,
        settings: VipSettings,
    },
    Router {
        router: Router,
        policy: String,
    },
}

/// How the balancer serves the LLM VIP for one of its contenders.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VipSettings {
    pub scheduler: &'static str,
    /// Bounded load, if any.
    pub max_load_factor: Option<f64>,
    /// Weights from a policy (`policy`) over the servers' scraped metrics (every
    /// `scrape_ms`), else static.
    pub composite: bool,
    /// The weight policy when `composite`: "composite", or "least-latency".
    pub policy: &'static str,
    /// Where the policy's TTFT comes from.
    pub passive_latency: PassiveLatency,
    /// Tenant affinity: source hash keyed on this IPv4 prefix length.
    pub affinity_prefix_v4: Option<u8>,
    /// The composite policy's saturation cut-off on waiting requests (`queue_saturation`),
    /// if any (KV cache 95% is always one).
    pub queue_saturation: Option<u32>,
    /// Admission control: while every server is saturated, only the premium tier's new
    /// connections are admitted, the others are refused with a RST.
    pub admission: bool,
    /// Fair admission between the `noisy-tenant` shape's tenants (each a `[[tier]]`, share
    /// 1): while every server is saturated, each tenant's new connections are admitted at its
    /// fair share of what the pool finishes; the rest get a RST.
    pub fair: bool,
    /// Session persistence: a client's new flows go to its previous server for this long
    /// after its last one (while that server has room under bounded load).
    pub persistence_secs: Option<u32>,
    /// A fixed scrape interval, ms (None: the daemon's default, paced by the VIP's requests).
    pub scrape_ms: Option<u64>,
}

impl VipSettings {
    /// Round robin, static weights: the baseline (and the VIP's settings between runs).
    pub const ROUND_ROBIN: VipSettings = VipSettings::new("round-robin", None, false);

    const fn new(scheduler: &'static str, max_load_factor: Option<f64>, composite: bool) -> Self {
        VipSettings {
            scheduler,
            max_load_factor,
            composite,
            policy: "composite",
            passive_latency: PassiveLatency::Off,
            affinity_prefix_v4: None,
            queue_saturation: None,
            admission: false,
            fair: false,
            persistence_secs: None,
            scrape_ms: None,
        }
    }

    const fn persistent(self, secs: u32) -> Self {
        VipSettings {
            persistence_secs: Some(secs),
            ..self
        }
    }

    const fn queue_cutoff(self, waiting: u32) -> Self {
        VipSettings {
            queue_saturation: Some(waiting),
            ..self
        }
    }

    const fn admitting_premium(self) -> Self {
        VipSettings {
            admission: true,
            ..self
        }
    }

    const fn fair_share(self) -> Self {
        VipSettings { fair: true, ..self }
    }

    const fn by_prefix(self, v4: u8) -> Self {
        VipSettings {
            affinity_prefix_v4: Some(v4),
            ..self
        }
    }

    const fn least_latency(self) -> Self {
        VipSettings {
            policy: "least-latency",
            ..self
        }
    }

    const fn passive(self, how: PassiveLatency) -> Self {
        VipSettings {
            passive_latency: how,
            ..self
        }
    }

    /// Sets these on `vip`.
    pub fn apply(&self, vip: &mut RawVip) {
        vip.scheduler = Some(self.scheduler.to_string());
        vip.max_load_factor = self.max_load_factor;
        vip.affinity_prefix_v4 = self.affinity_prefix_v4.map(i64::from);
        vip.persistence_secs = self.persistence_secs.map(i64::from);
        vip.admission = if self.fair {
            Some(balancer::base::config::RawAdmission {
                fair: Some(true),
                ..Default::default()
            })
        } else {
            self.admission
                .then(|| balancer::base::config::RawAdmission {
                    admit: [(PREMIUM_TIER.to_string(), 0)].into_iter().collect(),
                    ..Default::default()
                })
        };
        if self.composite {
            // The reporter's page first: its TTFT is taken before a later page's.
            let (port, extra) = match self.passive_latency {
                PassiveLatency::Off => (LLM_PORT, vec![]),
                PassiveLatency::WithServerMetrics => {
                    (REPORT_PORT, vec![format!("{LLM_PORT}/metrics")])
                }
                PassiveLatency::Only => (REPORT_PORT, vec![]),
            };
            vip.telemetry = Some(RawTelemetry {
                source: Some("scrape".into()),
                port: Some(i64::from(port)),
                extra,
                // A fixed interval: every scrape_ms, whatever the requests.
                interval_ms: self.scrape_ms.map(|ms| ms as i64),
                requests_per_scrape: self.scrape_ms.map(|_| 0),
                ..RawTelemetry::default()
            });
            vip.policy = Some(RawPolicy {
                kind: Some(self.policy.into()),
                // stale_after_ms: the daemon's default, three scrapes (at least a second),
                // so slower scrapes are compared, not taken for stale.
                queue_saturation: self.queue_saturation.map(i64::from),
                ..RawPolicy::default()
            });
        }
    }
}

/// Whether a contender's policy reads the TTFT each backend's `balancer report
/// --passive-latency` measures on its interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassiveLatency {
    /// No: the servers' own metrics (their TTFT histogram).
    Off,
    /// The passive TTFT, and every other signal from the servers' metrics.
    WithServerMetrics,
    /// The passive TTFT alone (a server that exports no metrics).
    Only,
}

/// The name of the benchmark's premium tier of clients (`load::workload::PREMIUM_PREFIX`).
pub const PREMIUM_TIER: &str = "premium";

/// The balancer's policies compared: name, what it is, and its settings of the VIP (the
/// scrape interval is filled in).
const OURS: [(&str, &str, VipSettings); 13] = [
    (
        "round-robin",
        "each backend in turn",
        VipSettings::ROUND_ROBIN,
    ),
    (
        "least-conn",
        "fewest active connections per weight",
        VipSettings::new("least-conn", None, false),
    ),
    (
        "maglev",
        "consistent hash of address and port, static weights",
        VipSettings::new("maglev", None, false),
    ),
    (
        "composite",
        "Maglev with weights from the servers' metrics (composite policy)",
        VipSettings::new("maglev", None, true),
    ),
    (
        "least-latency",
        "Maglev with weights from the least-latency policy over the servers' own TTFT histograms",
        VipSettings::new("maglev", None, true).least_latency(),
    ),
    (
        "least-latency-passive",
        "least-latency with the TTFT each backend's `balancer report --passive-latency` measures on its interface instead of the server's own (the servers' other metrics as before)",
        VipSettings::new("maglev", None, true)
            .least_latency()
            .passive(PassiveLatency::WithServerMetrics),
    ),
    (
        "least-latency-passive-only",
        "least-latency over the passive TTFT alone, no server metrics read (as for a server that exports none)",
        VipSettings::new("maglev", None, true)
            .least_latency()
            .passive(PassiveLatency::Only),
    ),
    (
        "affinity",
        "source hash (a client's requests to one server) with bounded load 1.25, weights from the composite policy",
        AFFINITY,
    ),
    (
        "persistence",
        "session persistence (60 s) over Maglev with the composite weights and bounded load 1.25: a client's first request placed by load, its later ones to the same server while that server has room and the policy does not expect another to serve them sooner (their cached prompt counted)",
        PERSISTENCE,
    ),
    (
        "persistence-unbounded",
        "session persistence (60 s) over Maglev with the composite weights, no load bound: a client's later requests go to its server until the policy gives that server no weight (saturated, stale) or expects another to serve them sooner, their cached prompt counted",
        VipSettings::new("maglev", None, true).persistent(60),
    ),
    (
        "composite-cutoff",
        "composite with a saturation cut-off at 5 waiting requests (llm-d's queue threshold) besides KV cache 95%: a server over either takes no new connections while another is under both",
        CUTOFF,
    ),
    (
        "composite-admission",
        "composite-cutoff with admission control: while every server is over a cut-off, only the premium clients' new connections (10.111.0.96/27: 28 of the 100 client addresses) are admitted; the others get a TCP RST from the balancer",
        CUTOFF.admitting_premium(),
    ),
    (
        "composite-fair",
        "composite-cutoff with fair admission: each tenant of the noisy-tenant shape (a /28 of client addresses, a `[[tier]]` of share 1) is admitted while every server is over a cut-off at its max-min fair share of the new connections the pool finishes; the rest get a TCP RST from the balancer",
        CUTOFF.fair_share(),
    ),
];

/// A contender's name without the scrape interval it may carry (`composite@4000`:
/// `composite`).
pub fn without_interval(name: &str) -> &str {
    name.split_once('@').map_or(name, |(base, _)| base)
}

/// The balancer's contender `name`.
fn balancer_contender(name: &str) -> Option<&'static (&'static str, &'static str, VipSettings)> {
    OURS.iter().find(|(n, _, _)| *n == name)
}

/// Composite with a saturation cut-off at 5 waiting requests (the queue threshold of llm-d's
/// flow control), the policy admission control reads.
const CUTOFF: VipSettings = VipSettings::new("maglev", None, true).queue_cutoff(5);

/// Session affinity: source hash with bounded load 1.25 and the composite weights.
const AFFINITY: VipSettings = VipSettings::new("source-hash", Some(1.25), true);

/// Session persistence over the composite policy's weights, with bounded load.
const PERSISTENCE: VipSettings = VipSettings::new("maglev", Some(1.25), true).persistent(60);

/// The tenant-affinity contender keyed on a /`prefix_v4`: [`AFFINITY`] on the client's network.
pub fn tenant_affinity(prefix_v4: u8) -> String {
    format!("tenant-affinity/{prefix_v4}")
}

/// The prefix length of a tenant-affinity contender's name, as written.
fn tenant_prefix(name: &str) -> Option<&str> {
    name.strip_prefix("tenant-affinity/")
}

impl Contender {
    /// `round-robin`, `composite`, ... or `vllm:cache_aware`, `sglang:power_of_two`, ...; a
    /// balancer's contender may name its own fixed scrape interval, `composite@4000` (else
    /// `scrape_ms`; None: the daemon's paced default), so that two intervals run in one run.
    pub fn parse(name: &str, scrape_ms: Option<u64>) -> Result<Contender> {
        if let Some((base, ms)) = name.rsplit_once('@') {
            let ms: u64 = ms
                .parse()
                .ok()
                .filter(|ms| (10..=60_000).contains(ms))
                .with_context(|| {
                    format!("{name:?}: the scrape interval after '@' is 10-60000 (ms)")
                })?;
            if base.contains('@') {
                bail!("{name:?}: one scrape interval per contender");
            }
            return match Contender::parse(base, Some(ms))? {
                Contender::Balancer { settings, .. } => Ok(Contender::Balancer {
                    name: name.to_string(),
                    settings,
                }),
                Contender::Router { .. } => bail!(
                    "{name:?}: a router polls its workers on its own; '@ms' sets the balancer's scrape interval"
                ),
            };
        }
        if let Some((router, policy)) = name.split_once(':') {
            let router = match router {
                "vllm" => Router::Vllm,
                "sglang" => Router::Sglang,
                _ => bail!("unknown router {router:?} in {name:?} (vllm or sglang)"),
            };
            if !router.policies().contains(&policy) {
                bail!(
                    "{name:?}: {} has no policy {policy:?} that works with vLLM-compatible workers ({})",
                    router.key(),
                    router.policies().join(", ")
                );
            }
            return Ok(Contender::Router {
                router,
                policy: policy.to_string(),
            });
        }
        if let Some(len) = tenant_prefix(name) {
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| (1..=32).contains(l))
                .with_context(|| format!("{name:?}: the prefix length is 1-32"))?;
            return Ok(Contender::Balancer {
                name: name.to_string(),
                settings: VipSettings {
                    scrape_ms,
                    ..AFFINITY.by_prefix(len)
                },
            });
        }
        let (_, _, settings) = balancer_contender(name).with_context(|| {
            format!(
                "unknown contender {name:?}: one of {}, tenant-affinity/LEN, or vllm:POLICY / sglang:POLICY",
                OURS.map(|o| o.0).join(", "),
            )
        })?;
        Ok(Contender::Balancer {
            name: name.to_string(),
            settings: VipSettings {
                scrape_ms,
                ..*settings
            },
        })
    }

    pub fn name(&self) -> String {
        match self {
            Contender::Balancer { name, .. } => name.clone(),
            Contender::Router { router, policy } => format!("{}:{policy}", router.key()),
        }
    }

    pub fn is_router(&self) -> bool {
        matches!(self, Contender::Router { .. })
    }

    /// What it is, for the report.
    pub fn describe(name: &str) -> String {
        if let Some((variant, base)) = super::fairness::variant_of(name) {
            return format!("{} ({variant})", Contender::describe(base));
        }
        if let Some((base, ms)) = name.rsplit_once('@') {
            return format!("{}; scraping every {ms} ms", Contender::describe(base));
        }
        if let Some(len) = tenant_prefix(name) {
            return format!(
                "balancer: source hash of the client's /{len} (a tenant's network: its clients to one server) with bounded load 1.25, weights from the composite policy"
            );
        }
        match balancer_contender(name) {
            Some((_, what, _)) => format!("balancer: {what}"),
            None => match name.split_once(':') {
                Some(("vllm", p)) => format!("vllm-router 0.1.17, policy {p}"),
                Some(("sglang", p)) => format!("sglang-router 0.3.2, policy {p}"),
                _ => name.to_string(),
            },
        }
    }
}

/// Every contender: the balancer's policies, then each router's.
pub fn all() -> Vec<String> {
    let mut v: Vec<String> = OURS.iter().map(|o| o.0.to_string()).collect();
    for r in [Router::Vllm, Router::Sglang] {
        v.extend(r.policies().iter().map(|p| format!("{}:{p}", r.key())));
    }
    v
}

/// The routers' environment `cargo xtask setup` built: `BALANCER_ROUTERS_ENV`, else
/// `<cache>/routers`.
pub fn routers_env() -> Result<PathBuf> {
    let dir = match std::env::var_os("BALANCER_ROUTERS_ENV") {
        Some(d) => PathBuf::from(d),
        None => balancer_tests::vllm::cache_dir().join("routers"),
    };
    if !dir.join("ready").exists() {
        bail!(
            "no L7 routers' environment at {} (run `cargo xtask setup`: it installs vllm-router and sglang-router from PyPI)",
            dir.display()
        );
    }
    Ok(dir)
}

/// Starts `router` with `policy` in the balancer's namespace, in front of the rack's
/// `workers` servers on `port`; waits until it routes.
pub fn start_router(
    topo: &Topology,
    router: Router,
    policy: &str,
    workers: usize,
    port: u16,
) -> Result<Process> {
    let env = routers_env()?;
    let bin = env.join("venv/bin");
    let urls: Vec<String> = (0..workers)
        .map(|i| format!("http://{}:{port}", backend4(i)))
        .collect();
    let host = LB4.to_string();
    let (listen, metrics) = (ROUTER_PORT.to_string(), ROUTER_METRICS_PORT.to_string());
    let mut argv: Vec<String> = match router {
        Router::Vllm => vec![bin.join("vllm-router").display().to_string()],
        Router::Sglang => vec![
            bin.join("python").display().to_string(),
            "-m".into(),
            "sglang_router.launch_router".into(),
        ],
    };
    argv.extend(
        [
            "--host",
            &host,
            "--port",
            &listen,
            "--policy",
            policy,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &metrics,
            "--worker-urls",
        ]
        .map(String::from),
    );
    argv.extend(urls);
    // Load polled every second (the default, 30 s, would leave the power-of-two policies
    // blind), logs at warnings only (sglang-router logs two lines per request at info).
    argv.extend(["--worker-startup-check-interval", "1"].map(String::from));
    match router {
        Router::Vllm => argv.extend(["--log-level", "warning"].map(String::from)),
        Router::Sglang => argv
            .extend(["--log-level", "warn", "--shutdown-grace-period-secs", "1"].map(String::from)),
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut p = Process::spawn(
        &topo.lb,
        &format!("router-{}-{policy}", router.key()),
        &argv,
        &topo.rack.log_dir,
    )?;
    let ready = match router {
        Router::Vllm => "/health",
        Router::Sglang => "/readiness",
    };
    let addr = std::net::SocketAddr::new(LB4.into(), ROUTER_PORT);
    let started = Instant::now();
    loop {
        let ok = topo.client.run_in(move || {
            balancer_tests::traffic::http_get_status(addr, ready, Duration::from_secs(2))
                .is_ok_and(|(s, _)| s == 200)
        })?;
        if ok {
            return Ok(p);
        }
        if !p.is_running() || started.elapsed() > Duration::from_secs(60) {
            bail!(
                "{} did not become ready on {addr}{ready}:\n{}",
                p.name,
                balancer_tests::vllm::tail(&p.log_text(), 40)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests;
