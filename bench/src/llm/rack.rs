//! The rack of the routing benchmark: simulated GPU servers behind the balancer or a router, each
//! run's servers started afresh, and what a run costs (CPU, the daemon's counters).

use super::*;

/// The rack: a simulated server per backend, the client with 150 addresses, the balancer.
pub struct LlmRack {
    pub topo: Topology,
    pub(super) gpus: Vec<String>,
    /// The L7 router, while one is the contender.
    pub(super) router: Option<Process>,
    /// Each backend's `balancer report --passive-latency`, while a contender reads them.
    pub(super) reporters: Vec<Process>,
    /// The CPU time of the contender's processes during a run.
    pub(super) account: CpuAccount,
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
            // Named by the profile's name (a profile written as numbers starts with it).
            let kind = profile.split(':').next().unwrap_or(profile);
            let served_by = format!("gpu{}-{kind}", i + 1);
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
    pub(super) fn prepare(&mut self, c: &Contender) -> Result<SocketAddr> {
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
    pub(super) fn start_reporters(&mut self) -> Result<()> {
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
    pub(super) fn start_accounting(&mut self, c: &Contender) -> Result<CpuUse> {
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
    pub(super) fn cpu_use(&self, c: &Contender) -> Result<CpuUse> {
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
    pub(super) fn check_router_inputs(&self, c: &Contender) -> Result<()> {
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
    pub(super) fn metrics_page_in_lb(&self, port: u16) -> Result<String> {
        let addr = SocketAddr::new([127, 0, 0, 1].into(), port);
        self.topo.lb.run_in(move || {
            balancer_tests::traffic::http_get_path(addr, "/metrics", Duration::from_secs(5))
        })?
    }

    /// The daemon's counters a run reads before and after: its rebuilds of the LLM VIP's
    /// table (`balancer_table_rebuilds_total`) and session persistence's outcomes
    /// (`balancer_persistence_choices_total`); None for a router.
    pub(super) fn daemon_counts(&self, c: &Contender) -> Result<Option<DaemonCounts>> {
        if c.is_router() {
            return Ok(None);
        }
        let page = self.metrics_page_in_lb(METRICS_PORT)?;
        DaemonCounts::from_page(&page).map(Some)
    }

    /// Prompt tokens the servers found in their prefix caches, and looked up, since they
    /// started.
    pub(super) fn prefix_counts(&self) -> Result<(f64, f64)> {
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

    /// One run of `work` through `c`, stopped early where `give_up` says.
    pub(super) fn run(
        &mut self,
        c: &Contender,
        work: &[workload::Conversation],
        opts: &Options,
        give_up: Option<GiveUp>,
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
            give_up,
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
pub(super) struct CpuUse {
    pub(super) processes_ns: u64,
    pub(super) bpf_ns: u64,
    /// Times the BPF programs ran (packets seen).
    pub(super) bpf_runs: u64,
}

impl CpuUse {
    /// What was used since `earlier`.
    pub(super) fn since(&self, earlier: &CpuUse) -> CpuUse {
        CpuUse {
            processes_ns: self.processes_ns.saturating_sub(earlier.processes_ns),
            bpf_ns: self.bpf_ns.saturating_sub(earlier.bpf_ns),
            bpf_runs: self.bpf_runs.saturating_sub(earlier.bpf_runs),
        }
    }
}

/// What a run gave, before it is summed up.
pub(super) struct RunOutput {
    pub(super) outcomes: Vec<Outcome>,
    pub(super) cpu_per_1k: f64,
    /// The balancer's BPF programs' part of `cpu_per_1k`.
    pub(super) bpf_cpu_per_1k: Option<f64>,
    /// BPF program runs (packets) per request.
    pub(super) bpf_runs_per_request: Option<f64>,
    pub(super) table_rebuilds_per_min: Option<f64>,
    pub(super) persistence: Option<PersistenceChoices>,
    pub(super) prefix_hit_rate: Option<f64>,
    pub(super) wall: f64,
}

/// Counters of the balancer's daemon (from its metrics page).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct DaemonCounts {
    /// Rebuilds of the LLM VIP's table.
    pub(super) table_rebuilds: f64,
    pub(super) persistence: PersistenceChoices,
}

impl DaemonCounts {
    /// The counts on a metrics page of the daemon.
    pub(super) fn from_page(page: &str) -> Result<DaemonCounts> {
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
    pub(super) fn since(&self, earlier: &DaemonCounts) -> DaemonCounts {
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

/// Run time (ns) and runs of every loaded passive latency program (the backends'
/// reporters'), from the kernel's BPF statistics.
pub(super) fn tc_latency_runs() -> Result<(u64, u64)> {
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
    build_config(topo, settings.fair, |llm| settings.apply(llm))
}

/// Like [`config`], with the LLM VIP's settings made by `edit`.
pub fn config_with(topo: &Topology, edit: impl FnOnce(&mut RawVip)) -> String {
    build_config(topo, false, edit)
}

/// The config, with the noisy-tenant shape's tenants as tiers if `tenants`.
fn build_config(topo: &Topology, tenants: bool, edit: impl FnOnce(&mut RawVip)) -> String {
    let mut config = rack_config(topo, "l2-dsr", AttachMode::Native);
    config.metrics.listen = Some(format!("127.0.0.1:{METRICS_PORT}"));
    // The premium clients, a tier for the contenders with admission control (the others
    // never look it up: their VIP dedicates no backends to it).
    config.tier.push(balancer::base::config::RawTier {
        name: Some(contenders::PREMIUM_TIER.into()),
        prefixes: vec![workload::PREMIUM_PREFIX.into()],
        ..Default::default()
    });
    if tenants {
        // Fair admission: the noisy-tenant shape's tenants, a tier each (share 1; more
        // specific than the premium prefix where they overlap).
        for (t, prefix) in workload::noisy_tenant_prefixes().into_iter().enumerate() {
            config.tier.push(balancer::base::config::RawTier {
                name: Some(format!("tenant-{t}")),
                prefixes: vec![prefix],
                ..Default::default()
            });
        }
    }
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
