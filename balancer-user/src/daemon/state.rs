//! The running daemon's state and every operation on it: configuration changes (from the
//! file or the API), health transitions, statistics and their rates, persistence of the
//! config file and of the state file that goes with the pinned maps.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use balancer_common::stats::{Counter, TrafficStats};

use crate::api::types::{
    BackendStatus, ChangeResult, Stats, Status, Table, TableShare, VipStatus, VipWeights, WeightRow,
};
use crate::balancer::{ApplyReport, Balancer, Endpoint};
use crate::config::TelemetrySource;
use crate::config::{Config, ConfigError, HealthCheckKind, MacAddr, RawConfig};
use crate::dataplane::kernel::KernelDataplane;
use crate::metrics::{Families, Metrics};
use crate::netinfo::{Interface, resolve_next_hops};
use crate::pinning::{Pins, write_atomically};
use crate::policy::{Decision, PolicyKind, PolicyState};
use crate::settings::data_plane_settings;
use crate::telemetry::round;
use crate::telemetry::signals::Signals;
use crate::telemetry::store::TelemetryStore;

/// Why a change was refused; maps onto an HTTP status and a CLI exit code.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The request or the resulting config is invalid (400).
    #[error("{0}")]
    Invalid(String),
    /// No such VIP or backend (404).
    #[error("{0}")]
    NotFound(String),
    /// Already exists (409).
    #[error("{0}")]
    Conflict(String),
    /// The change was valid but applying it failed (500).
    #[error("{0}")]
    Failed(String),
}

impl From<ConfigError> for ChangeError {
    fn from(e: ConfigError) -> Self {
        ChangeError::Invalid(e.to_string())
    }
}

/// Traffic counters of one VIP or backend at the last reading, and the rates over the last
/// rate interval (which started at `rate_base`).
#[derive(Clone, Copy, Debug, Default)]
struct Sampled {
    totals: TrafficStats,
    rate_base: TrafficStats,
    pps: f64,
    bps: f64,
}

/// The shortest interval rates are computed over (shorter ones are mostly noise); counters
/// themselves are read afresh on every request.
const RATE_INTERVAL: Duration = Duration::from_millis(100);

impl Sampled {
    /// A reading inside the rate interval: new totals, the last rates.
    fn with_totals(self, totals: TrafficStats) -> Sampled {
        Sampled { totals, ..self }
    }

    /// A reading that ends a rate interval of `seconds` (`None`: the first reading, rates 0)
    /// and starts the next one.
    fn with_rates(self, totals: TrafficStats, seconds: Option<f64>) -> Sampled {
        let base = self.rate_base;
        let (pps, bps) = match seconds {
            Some(s) if totals.packets >= base.packets && totals.bytes >= base.bytes => (
                (totals.packets - base.packets) as f64 / s,
                (totals.bytes - base.bytes) as f64 * 8.0 / s,
            ),
            _ => (0.0, 0.0),
        };
        Sampled {
            totals,
            rate_base: totals,
            pps,
            bps,
        }
    }
}

/// The daemon.
pub struct Daemon {
    pub config: Config,
    pub config_path: PathBuf,
    pub iface: Interface,
    pub balancer: Balancer<KernelDataplane>,
    pub pins: Pins,
    pub metrics: Metrics,
    pub neighbour_timeout: Duration,
    pub started: Instant,
    /// Per VIP id / backend id.
    vip_traffic: HashMap<u32, Sampled>,
    backend_traffic: HashMap<u32, Sampled>,
    rates_at: Option<Instant>,
    /// Connection-table entries per backend id (refreshed by `count_flows`).
    flows: HashMap<u32, u64>,
    /// Backends under health checks: latest verdict known to the checker.
    pub checked: HashMap<(Endpoint, IpAddr), bool>,
    /// Backend reports (scraped or pushed).
    pub telemetry: TelemetryStore,
    /// Per VIP name: the weight policy's memory and its last decisions.
    policies: HashMap<String, PolicyState>,
    decisions: HashMap<String, Vec<Decision>>,
    /// Model routing: per pool, the models each backend was found serving, and the last
    /// discovery error per backend.
    pub served: HashMap<String, HashMap<IpAddr, Vec<String>>>,
    pub discovery_errors: HashMap<(String, IpAddr), String>,
    /// The fleet agent's view (see [`crate::fleet`]).
    pub fleet: crate::fleet::FleetStatus,
    /// VIPs drained from BGP announcement by name.
    pub drained_vips: std::collections::BTreeSet<String>,
    announcer: crate::fleet::bgp::Announcer,
}

impl Daemon {
    pub fn new(
        config: Config,
        config_path: PathBuf,
        iface: Interface,
        balancer: Balancer<KernelDataplane>,
        pins: Pins,
        metrics: Metrics,
        neighbour_timeout: Duration,
    ) -> Daemon {
        Daemon {
            config,
            config_path,
            iface,
            balancer,
            pins,
            metrics,
            neighbour_timeout,
            started: Instant::now(),
            vip_traffic: HashMap::new(),
            backend_traffic: HashMap::new(),
            rates_at: None,
            flows: HashMap::new(),
            checked: HashMap::new(),
            telemetry: TelemetryStore::default(),
            policies: HashMap::new(),
            decisions: HashMap::new(),
            served: HashMap::new(),
            discovery_errors: HashMap::new(),
            fleet: crate::fleet::FleetStatus::default(),
            drained_vips: Default::default(),
            announcer: Default::default(),
        }
    }

    /// Builds the tables from the weights a fleet's leader published, or (`None`) from this
    /// balancer's own view again. Whether it worked.
    pub fn apply_fleet(&mut self, weights: Option<&crate::fleet::FleetWeights>) -> bool {
        match self.balancer.set_fleet_weights(weights) {
            Ok(report) => {
                if report.tables_published > 0 {
                    self.record(&report);
                    self.persist_state();
                }
                true
            }
            Err(e) => {
                tracing::error!("applying the fleet's weights: {e}");
                false
            }
        }
    }

    /// Takes a state the fleet's leader published: its VIPs and backends (rewriting this
    /// balancer's config file to match), then its weights. Whether it was applied.
    pub fn adopt_fleet(&mut self, state: &crate::fleet::FleetState) -> bool {
        let ours = crate::fleet::vip_config(&self.config);
        if !state.vip_config.is_empty() && !crate::fleet::same_vips(&ours, &state.vip_config) {
            let theirs = state.vip_config.clone();
            match self.edit("fleet state", move |raw| {
                raw.vip = theirs;
                Ok(())
            }) {
                Ok(r) => tracing::info!(
                    epoch = state.epoch,
                    added = r.vips_added,
                    removed = r.vips_removed,
                    updated = r.vips_updated,
                    "fleet: took the leader's VIPs"
                ),
                // The weights still apply to the VIPs both have; the error repeats each epoch.
                Err(e) => tracing::error!(
                    epoch = state.epoch,
                    "fleet: the leader's VIPs do not apply here: {e}"
                ),
            }
        }
        self.apply_fleet(Some(&state.vips))
    }

    /// The addresses of the VIPs this balancer can serve: a backend in the table, not
    /// drained from announcement.
    pub fn announceable(&self) -> std::collections::BTreeSet<IpAddr> {
        self.balancer
            .vips()
            .filter(|v| !self.drained_vips.contains(&v.config.name))
            .filter(|v| v.backends.values().any(|b| b.table_weight() > 0))
            .map(|v| v.config.address)
            .collect()
    }

    /// Tells BIRD the VIPs to announce, when `[bgp]` is set (cheap when nothing changed).
    pub fn announce(&mut self) {
        if let Some(bgp) = self.config.bgp.clone() {
            let addresses = self.announceable();
            self.announcer.announce(&bgp, &addresses);
        }
    }

    /// Withdraws every route (shutdown).
    pub fn withdraw_all(&mut self) {
        if let Some(bgp) = self.config.bgp.clone() {
            self.announcer.announce(&bgp, &Default::default());
        }
    }

    /// The configured VIP `name`, or a not-found error naming it.
    pub fn vip_named(&self, name: &str) -> Result<&crate::config::VipConfig, ChangeError> {
        self.config
            .vip(name)
            .ok_or_else(|| ChangeError::NotFound(format!("no VIP named {name:?}")))
    }

    /// Drains a VIP from BGP announcement (`drain`) or returns it.
    pub fn drain_vip(&mut self, name: &str, drain: bool) -> Result<ChangeResult, ChangeError> {
        self.vip_named(name)?;
        let changed = if drain {
            self.drained_vips.insert(name.to_string())
        } else {
            self.drained_vips.remove(name)
        };
        self.announce();
        Ok(ChangeResult {
            message: format!(
                "VIP {name} {}{}",
                if drain {
                    "drained from announcement"
                } else {
                    "announced again"
                },
                if changed { "" } else { " (already)" }
            ),
            ..ChangeResult::default()
        })
    }

    /// Records a discovery round of `pool`; when a backend's models changed, the VIPs that
    /// route by model get their backends again.
    pub fn record_models(
        &mut self,
        pool: &str,
        results: Vec<(IpAddr, Result<Vec<String>, String>)>,
    ) {
        let mut changed = false;
        let known = self.served.entry(pool.to_string()).or_default();
        for (backend, result) in results {
            match result {
                Ok(models) => {
                    self.discovery_errors.remove(&(pool.to_string(), backend));
                    if known.get(&backend) != Some(&models) {
                        tracing::info!(pool, %backend, ?models, "models discovered");
                        known.insert(backend, models);
                        changed = true;
                    }
                }
                Err(why) => {
                    // What was known stays: a server busy for a moment keeps its VIPs.
                    if self
                        .discovery_errors
                        .insert((pool.to_string(), backend), why.clone())
                        .is_none()
                    {
                        tracing::warn!(pool, %backend, "model discovery failed: {why}");
                    }
                }
            }
        }
        if changed {
            let config = self.config.clone();
            if let Err(e) = self.apply_config(config, "discovery", false) {
                tracing::error!(pool, "placing backends by model: {e}");
            }
        }
    }

    /// Records a scrape of a backend (signals, or why it failed).
    pub fn record_scrape(
        &mut self,
        vip: &Endpoint,
        name: &str,
        backend: IpAddr,
        result: Result<Signals, String>,
    ) {
        let outcome = if result.is_ok() { "success" } else { "failure" };
        self.metrics
            .reports
            .with_label_values(&[name, &backend.to_string(), outcome])
            .inc();
        let entry = self.telemetry.entry(vip, backend);
        match result {
            Ok(signals) => entry.record(signals, Instant::now()),
            Err(why) => {
                tracing::debug!(vip = name, %backend, "scrape failed: {why}");
                entry.error(why);
            }
        }
    }

    /// Records a pushed report for `backend` in every VIP that takes pushed reports from it.
    pub fn record_push(&mut self, backend: IpAddr, signals: Signals) -> Result<usize, ChangeError> {
        check_report(&signals)?;
        let vips: Vec<(Endpoint, String)> = self
            .config
            .vips
            .iter()
            .filter(|v| v.telemetry.source == TelemetrySource::Push && v.backend(backend).is_some())
            .map(|v| (v.endpoint(), v.name.clone()))
            .collect();
        if vips.is_empty() {
            return Err(ChangeError::NotFound(format!(
                "no VIP takes pushed reports from backend {backend} (telemetry.source = \"push\")"
            )));
        }
        let now = Instant::now();
        for (vip, name) in &vips {
            self.telemetry
                .entry(vip, backend)
                .record(signals.clone(), now);
            self.metrics
                .reports
                .with_label_values(&[name, &backend.to_string(), "pushed"])
                .inc();
        }
        Ok(vips.len())
    }

    /// One weight round for the VIP `name`: the policy turns its backends' latest reports and
    /// flows into weights, and the table is republished if they changed it.
    pub fn weight_round(&mut self, name: &str) -> Result<(), ChangeError> {
        let started = Instant::now();
        let Some(vip) = self.config.vip(name).cloned() else {
            return Ok(());
        };
        // Connection-aware policies read the data plane's active-flow counts (kept for their
        // VIPs: a read of one small array, not a scan of the connection table).
        let active = if vip.policy.reads_flows() {
            match crate::dataplane::Dataplane::active_flows(self.balancer.dataplane()) {
                Ok(a) => Some(a),
                Err(e) => {
                    tracing::warn!("reading the active-flow counts: {e}");
                    None
                }
            }
        } else {
            None
        };
        let policy = self.policies.entry(name.to_string()).or_default();
        let outcome = round::weight_round(
            &vip,
            &mut self.balancer,
            &self.telemetry,
            active.as_ref().unwrap_or(&self.flows),
            policy,
            started,
        )
        .map_err(|e| ChangeError::Failed(e.to_string()))?;
        self.decisions.insert(name.to_string(), outcome.decisions);
        let report = outcome.report;
        if report.tables_published > 0 {
            self.metrics.weight_changes.with_label_values(&[name]).inc();
            if let Some(live) = report.live_at {
                self.metrics
                    .weight_publish_seconds
                    .observe(live.duration_since(started).as_secs_f64());
            }
            self.record(&report);
            tracing::debug!(
                vip = name,
                slots_changed = report.slots_changed,
                "weights republished"
            );
        }
        Ok(())
    }

    /// The policy inputs and weights of every VIP.
    pub fn weights(&self) -> Vec<VipWeights> {
        let now = Instant::now();
        self.config
            .vips
            .iter()
            .map(|v| {
                let endpoint = v.endpoint();
                let state = self.balancer.vip(&v.name);
                let decisions = self.decisions.get(&v.name);
                VipWeights {
                    vip: v.name.clone(),
                    policy: v.policy.kind.name().to_string(),
                    telemetry: match &v.telemetry.source {
                        TelemetrySource::None => "none".into(),
                        TelemetrySource::Push => "push".into(),
                        TelemetrySource::Scrape(pages) => pages
                            .iter()
                            .map(|(p, path)| format!(":{p}{path}"))
                            .collect::<Vec<_>>()
                            .join(" "),
                    },
                    backends: v
                        .backends
                        .iter()
                        .map(|b| {
                            let t = self.telemetry.get(&endpoint, b.address);
                            let bs = state.and_then(|s| s.backends.get(&b.address));
                            let decision =
                                decisions.and_then(|d| d.iter().find(|d| d.address == b.address));
                            WeightRow {
                                address: b.address,
                                configured_weight: b.weight,
                                weight: bs.map(|s| s.table_weight()).unwrap_or(0),
                                reason: decision.map(|d| d.reason.clone()).unwrap_or_else(|| {
                                    if v.policy.kind == PolicyKind::Static {
                                        "static: configured weight".into()
                                    } else {
                                        "no round yet".into()
                                    }
                                }),
                                signals: t.and_then(|t| t.latest.as_ref().map(|(s, _)| s.clone())),
                                report_age_ms: t
                                    .and_then(|t| t.age(now))
                                    .map(|a| a.as_millis() as u64),
                                flows: bs.and_then(|s| self.flows.get(&s.id).copied()).unwrap_or(0),
                                reports: t.map(|t| t.reports).unwrap_or(0),
                                errors: t.map(|t| t.errors).unwrap_or(0),
                                last_error: t.and_then(|t| t.last_error.clone()),
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// VIPs whose backends are scraped: (endpoint, name, backends, pages, telemetry settings).
    pub fn scrape_targets(
        &self,
    ) -> Vec<(
        Endpoint,
        String,
        Vec<IpAddr>,
        crate::config::TelemetryConfig,
    )> {
        self.config
            .vips
            .iter()
            .filter(|v| {
                v.telemetry.source != TelemetrySource::None || v.policy.kind != PolicyKind::Static
            })
            .map(|v| {
                (
                    v.endpoint(),
                    v.name.clone(),
                    v.backends.iter().map(|b| b.address).collect(),
                    v.telemetry.clone(),
                )
            })
            .collect()
    }

    /// Saves the bookkeeping that goes with the pinned maps.
    pub fn persist_state(&self) {
        let snapshot = self.balancer.snapshot();
        match serde_json::to_vec_pretty(&snapshot) {
            Ok(bytes) => {
                if let Err(e) = write_atomically(&self.config.state_file, &bytes) {
                    tracing::error!(path = %self.config.state_file.display(), "writing the state file: {e}");
                }
            }
            Err(e) => tracing::error!("encoding the state file: {e}"),
        }
    }

    /// Makes `new` the configuration in force. Settings only a restart can change are refused.
    /// `origin` names the source for logs and metrics; with `write_file`, the config file is
    /// rewritten to match.
    pub fn apply_config(
        &mut self,
        new: Config,
        origin: &str,
        write_file: bool,
    ) -> Result<ApplyReport, ChangeError> {
        let result = self.try_apply(new, write_file);
        if let Err(e) = &result {
            self.metrics
                .change_errors
                .with_label_values(&[origin])
                .inc();
            tracing::warn!(origin, "change refused: {e}");
        }
        result
    }

    fn try_apply(&mut self, mut new: Config, write_file: bool) -> Result<ApplyReport, ChangeError> {
        new.place_pool_backends(&self.served);
        crate::config::check_vip_set(&new.vips)?;
        let old = &self.config;
        let fixed = [
            ("interface", old.interface != new.interface),
            ("attach_mode", old.attach_mode != new.attach_mode),
            ("pin_dir", old.pin_dir != new.pin_dir),
            ("state_file", old.state_file != new.state_file),
            (
                "conntrack.max_flows",
                old.conntrack.max_flows != new.conntrack.max_flows,
            ),
            ("api", old.api != new.api),
            ("metrics", old.metrics != new.metrics),
            ("fleet", old.fleet != new.fleet),
        ];
        if let Some((key, _)) = fixed.iter().find(|(_, changed)| *changed) {
            return Err(ChangeError::Invalid(format!(
                "{key} only changes with a restart of the daemon"
            )));
        }
        // Next hops of backends the kernel does not know yet.
        let mut unknown: Vec<IpAddr> = new
            .vips
            .iter()
            .flat_map(|v| {
                let current = self.balancer.vip(&v.name);
                v.backends
                    .iter()
                    .filter(move |b| {
                        b.mac.is_none()
                            && current.is_none_or(|c| !c.backends.contains_key(&b.address))
                    })
                    .map(|b| b.address)
            })
            .collect();
        unknown.sort();
        unknown.dedup();
        let macs: HashMap<IpAddr, MacAddr> = if unknown.is_empty() {
            HashMap::new()
        } else {
            resolve_next_hops(&self.iface, &unknown, self.neighbour_timeout).map_err(|e| {
                ChangeError::Invalid(format!("resolving backend MAC addresses: {e}"))
            })?
        };
        let mut settings =
            data_plane_settings(&new, &self.iface, self.balancer.settings().flow_seed)
                .map_err(|e| ChangeError::Invalid(e.to_string()))?;
        settings.flow_bucket_mask = self.balancer.settings().flow_bucket_mask;
        if settings != *self.balancer.settings() {
            self.balancer
                .set_settings(&settings)
                .map_err(|e| ChangeError::Failed(e.to_string()))?;
        }
        self.balancer.set_removal_grace(new.conntrack.removal_grace);
        self.balancer
            .set_tiers(&new.tiers)
            .map_err(|e| ChangeError::Failed(e.to_string()))?;
        let report = self
            .balancer
            .apply(&new.vips, &macs)
            .map_err(|e| ChangeError::Failed(e.to_string()));
        // Whatever happened, the kernel state is what the bookkeeping says: save it.
        self.persist_state();
        let report = report?;
        self.record(&report);
        if write_file {
            write_atomically(&self.config_path, new.to_toml().as_bytes()).map_err(|e| {
                ChangeError::Failed(format!(
                    "applied, but writing {} failed: {e}",
                    self.config_path.display()
                ))
            })?;
        }
        self.config = new;
        Ok(report)
    }

    /// Records a change's table work in the metrics.
    pub fn record(&self, report: &ApplyReport) {
        if report.tables_published > 0 {
            self.metrics
                .table_build_seconds
                .observe(report.table_build_time.as_secs_f64());
            self.metrics
                .table_publish_seconds
                .observe(report.table_publish_time.as_secs_f64());
        }
        for name in &report.rebuilt {
            self.metrics.table_rebuilds.with_label_values(&[name]).inc();
        }
    }

    /// Applies an edit of the config's file form (the API's changes), validated exactly like
    /// the file, and writes the config file.
    pub fn edit(
        &mut self,
        what: &str,
        edit: impl FnOnce(&mut RawConfig) -> Result<(), ChangeError>,
    ) -> Result<ChangeResult, ChangeError> {
        let mut raw = self.config.to_raw();
        edit(&mut raw)?;
        let new = Config::from_raw(raw)?;
        let report = self.apply_config(new, "api", true)?;
        Ok(change_result(what, &report))
    }

    /// Re-reads the config file.
    pub fn reload(&mut self, origin: &str) -> Result<ChangeResult, ChangeError> {
        let new = match Config::load(&self.config_path) {
            Ok(c) => c,
            Err(e) => {
                self.metrics
                    .change_errors
                    .with_label_values(&[origin])
                    .inc();
                return Err(e.into());
            }
        };
        let report = self.apply_config(new, origin, false)?;
        Ok(change_result("config reloaded", &report))
    }

    /// Records a health-check verdict for a backend (and rebuilds its VIP when it changed).
    pub fn set_health(&mut self, vip: &Endpoint, name: &str, backend: IpAddr, healthy: bool) {
        self.checked.insert((*vip, backend), healthy);
        match self.balancer.set_health(vip, backend, healthy) {
            Ok(true) => {
                let to = if healthy { "healthy" } else { "unhealthy" };
                self.metrics
                    .health_transitions
                    .with_label_values(&[name, &backend.to_string(), to])
                    .inc();
                self.persist_state();
            }
            Ok(false) => {}
            Err(e) => tracing::error!(vip = name, %backend, "applying a health change: {e}"),
        }
    }

    /// Retires removed backends whose grace period is over.
    pub fn tick(&mut self) {
        match self.balancer.expire_retired(Instant::now()) {
            Ok(0) => {}
            Ok(_) => self.persist_state(),
            Err(e) => tracing::error!("retiring removed backends: {e}"),
        }
    }

    /// Reads the traffic counters, and updates the rates when the last rate interval is at
    /// least [`RATE_INTERVAL`] old (else the last rates stand).
    pub fn sample(&mut self) {
        let now = Instant::now();
        let elapsed = self.rates_at.map(|t| now.duration_since(t));
        let new_rates = elapsed.is_none_or(|e| e >= RATE_INTERVAL);
        let seconds = elapsed.map(|e| e.as_secs_f64()).filter(|s| *s > 0.0);
        let update = |map: &mut HashMap<u32, Sampled>, id: u32, totals: TrafficStats| {
            let previous = map.get(&id).copied().unwrap_or_default();
            let sampled = if new_rates {
                previous.with_rates(totals, seconds)
            } else {
                previous.with_totals(totals)
            };
            map.insert(id, sampled);
        };
        let vips: Vec<(u32, Vec<u32>)> = self
            .balancer
            .vips()
            .map(|v| (v.id, v.backends.values().map(|b| b.id).collect()))
            .collect();
        let retiring: Vec<u32> = self
            .balancer
            .retiring()
            .iter()
            .map(|r| r.state.id)
            .collect();
        let dataplane = self.balancer.dataplane();
        let mut vip_traffic = std::mem::take(&mut self.vip_traffic);
        let mut backend_traffic = std::mem::take(&mut self.backend_traffic);
        for (vip, backends) in &vips {
            if let Ok(t) = crate::dataplane::Dataplane::vip_stats(dataplane, *vip) {
                update(&mut vip_traffic, *vip, t);
            }
            for id in backends.iter().chain(&retiring) {
                if let Ok(t) = crate::dataplane::Dataplane::backend_stats(dataplane, *id) {
                    update(&mut backend_traffic, *id, t);
                }
            }
        }
        self.vip_traffic = vip_traffic;
        self.backend_traffic = backend_traffic;
        if new_rates {
            self.rates_at = Some(now);
        }
    }

    /// Fresh counters and flow counts for an answer.
    pub fn refresh(&mut self) {
        self.sample();
        self.count_flows();
    }

    /// Counts the active flows per backend: connection-table entries not ended by the client
    /// (FIN/RST). (The data plane's own counters exist only for the VIPs whose scheduler reads
    /// them; this count covers every VIP.)
    pub fn count_flows(&mut self) {
        match self.balancer.dataplane().flow_counts() {
            Ok(counts) => {
                self.flows = counts;
            }
            Err(e) => tracing::warn!("counting flows: {e}"),
        }
    }

    fn health_label(&self, vip: &Endpoint, backend: IpAddr, kind: &HealthCheckKind) -> String {
        if *kind == HealthCheckKind::None {
            return "unchecked".into();
        }
        match self.checked.get(&(*vip, backend)) {
            Some(true) => "healthy".into(),
            Some(false) => "unhealthy".into(),
            None => "pending".into(),
        }
    }

    fn vip_statuses(&self) -> Vec<VipStatus> {
        let mut out = Vec::new();
        for vip in self.balancer.vips() {
            let endpoint = vip.config.endpoint();
            let shares = vip.slot_shares();
            let table_len = vip.table.len().max(1) as f64;
            let mut backends: Vec<BackendStatus> = vip
                .backends
                .values()
                .map(|b| {
                    let t = self.backend_traffic.get(&b.id).copied().unwrap_or_default();
                    let flows = self.flows.get(&b.id).copied().unwrap_or(0);
                    BackendStatus {
                        address: b.address,
                        weight: b.weight,
                        drained: b.drained,
                        healthy: b.healthy,
                        health: self.health_label(&endpoint, b.address, &vip.config.health.kind),
                        table_share: shares.get(&b.address).copied().unwrap_or(0) as f64
                            / table_len,
                        flows,
                        packets: t.totals.packets,
                        bytes: t.totals.bytes,
                        new_flows: t.totals.new_flows,
                        pps: t.pps,
                        bps: t.bps,
                        retiring: false,
                    }
                })
                .collect();
            for r in self
                .balancer
                .retiring()
                .iter()
                .filter(|r| r.vip == endpoint)
            {
                let t = self
                    .backend_traffic
                    .get(&r.state.id)
                    .copied()
                    .unwrap_or_default();
                backends.push(BackendStatus {
                    address: r.state.address,
                    weight: r.state.weight,
                    drained: true,
                    healthy: r.state.healthy,
                    health: "removed".into(),
                    table_share: 0.0,
                    flows: self.flows.get(&r.state.id).copied().unwrap_or(0),
                    packets: t.totals.packets,
                    bytes: t.totals.bytes,
                    new_flows: t.totals.new_flows,
                    pps: t.pps,
                    bps: t.bps,
                    retiring: true,
                });
            }
            let t = self.vip_traffic.get(&vip.id).copied().unwrap_or_default();
            let c = &vip.config;
            out.push(VipStatus {
                name: c.name.clone(),
                address: c.address,
                port: c.port,
                protocol: c.protocol.to_string(),
                forwarding: c.forwarding.to_string(),
                scheduler: {
                    let mut s = c.scheduler.name().to_string();
                    if !c.persistence.is_zero() {
                        s.push_str(&format!(", persistence {}s", c.persistence.as_secs()));
                    }
                    if c.load_bound_pct > 0 {
                        s.push_str(&format!(
                            ", max load {:.2}x",
                            1.0 + f64::from(c.load_bound_pct) / 100.0
                        ));
                    }
                    s
                },
                table_size: c.table_size,
                table_fingerprint: format!("{:016x}", vip.fingerprint),
                health_check: match &c.health.kind {
                    HealthCheckKind::None => "none".into(),
                    HealthCheckKind::Tcp => format!("tcp:{}", c.health.port),
                    HealthCheckKind::Http {
                        path,
                        expect_status,
                    } => {
                        format!("http:{}{} -> {expect_status}", c.health.port, path)
                    }
                },
                packets: t.totals.packets,
                bytes: t.totals.bytes,
                new_flows: t.totals.new_flows,
                pps: t.pps,
                bps: t.bps,
                flows: backends.iter().map(|b| b.flows).sum(),
                backends,
                announced: self.config.bgp.is_some()
                    && self.announcer.announced().contains(&c.address)
                    && !self.drained_vips.contains(&c.name),
            });
        }
        out
    }

    pub fn status(&self) -> Status {
        Status {
            interface: self.config.interface.clone(),
            attach_mode: self.config.attach_mode.to_string(),
            pin_dir: self.config.pin_dir.display().to_string(),
            uptime_secs: self.started.elapsed().as_secs(),
            vips: self.vip_statuses(),
            fleet: self.config.fleet.as_ref().map(|_| self.fleet.clone()),
            bgp: self
                .config
                .bgp
                .as_ref()
                .map(|_| crate::api::types::BgpStatus {
                    announced: self.announcer.announced().into_iter().collect(),
                    drained: self.drained_vips.iter().cloned().collect(),
                    last_error: self.announcer.last_error.clone(),
                }),
        }
    }

    pub fn stats(&self) -> Result<Stats, ChangeError> {
        let global = self
            .balancer
            .global_stats()
            .map_err(|e| ChangeError::Failed(e.to_string()))?;
        Ok(Stats {
            counters: Counter::ALL
                .iter()
                .map(|c| (c.name().to_string(), global.get(*c)))
                .collect(),
            vips: self.vip_statuses(),
        })
    }

    pub fn table(&self, name: &str) -> Result<Table, ChangeError> {
        self.vip_named(name)?;
        let vip = self
            .balancer
            .vip(name)
            .ok_or_else(|| ChangeError::Failed(format!("VIP {name:?} is not in the data plane")))?;
        let shares = vip.slot_shares();
        let total_weight: u64 = vip
            .backends
            .values()
            .map(|b| u64::from(b.table_weight()))
            .sum();
        let len = vip.table.len().max(1) as f64;
        Ok(Table {
            vip: name.to_string(),
            table_size: vip.config.table_size,
            fingerprint: format!("{:016x}", vip.fingerprint),
            backends: vip
                .backends
                .values()
                .map(|b| {
                    let slots = shares.get(&b.address).copied().unwrap_or(0);
                    TableShare {
                        address: b.address,
                        weight: b.table_weight(),
                        weight_share: if total_weight == 0 {
                            0.0
                        } else {
                            f64::from(b.table_weight()) / total_weight as f64
                        },
                        slots,
                        slot_share: slots as f64 / len,
                    }
                })
                .collect(),
        })
    }

    /// The Prometheus exposition.
    pub fn render_metrics(&self) -> String {
        let mut f = Families::default();
        if let Ok(global) = self.balancer.global_stats() {
            for (counter, action) in [
                (Counter::ActionPass, "pass"),
                (Counter::ActionTx, "tx"),
                (Counter::ActionDrop, "drop"),
            ] {
                f.counter(
                    "balancer_xdp_actions_total",
                    "Packets by XDP verdict.",
                    &[("action", action)],
                    global.get(counter) as f64,
                );
            }
            for (counter, result) in [
                (Counter::ConntrackHit, "hit"),
                (Counter::ConntrackMiss, "miss"),
                (Counter::FlowRehashed, "rehashed"),
                (Counter::UdpFlowExpired, "udp_expired"),
            ] {
                f.counter(
                    "balancer_conntrack_lookups_total",
                    "Connection-table lookups by result (a TCP SYN always counts as a miss).",
                    &[("result", result)],
                    global.get(counter) as f64,
                );
            }
            for (counter, reason) in [
                (Counter::DropNoBackend, "no_backend"),
                (Counter::DropFragment, "fragment"),
                (Counter::DropIpOptions, "ip_options"),
                (Counter::DropMalformed, "malformed"),
                (Counter::DropEncapFailed, "encap_failed"),
            ] {
                f.counter(
                    "balancer_drops_total",
                    "Packets for a VIP dropped, by reason.",
                    &[("reason", reason)],
                    global.get(counter) as f64,
                );
            }
            f.counter(
                "balancer_flood_activations_total",
                "Times a CPU entered flood mode.",
                &[],
                global.get(Counter::FloodActivations) as f64,
            );
            f.counter(
                "balancer_flood_inserts_skipped_total",
                "New flows not recorded because of flood mode.",
                &[],
                global.get(Counter::FloodInsertsSkipped) as f64,
            );
            f.counter(
                "balancer_icmp_errors_forwarded_total",
                "ICMP errors about VIP flows forwarded to their backend.",
                &[],
                global.get(Counter::IcmpErrorForwarded) as f64,
            );
            f.counter(
                "balancer_icmp_too_big_sent_total",
                "ICMP fragmentation-needed / packet-too-big answers sent.",
                &[],
                global.get(Counter::IcmpTooBigSent) as f64,
            );
        }
        for vip in self.vip_statuses() {
            let v = vip.name.as_str();
            f.counter(
                "balancer_vip_packets_total",
                "Packets to a VIP.",
                &[("vip", v)],
                vip.packets as f64,
            );
            f.counter(
                "balancer_vip_bytes_total",
                "Bytes to a VIP.",
                &[("vip", v)],
                vip.bytes as f64,
            );
            f.counter(
                "balancer_vip_new_flows_total",
                "Flows chosen from a VIP's Maglev table.",
                &[("vip", v)],
                vip.new_flows as f64,
            );
            f.gauge(
                "balancer_vip_flows",
                "Active flows of a VIP.",
                &[("vip", v)],
                vip.flows as f64,
            );
            for b in &vip.backends {
                let addr = b.address.to_string();
                let l = [("vip", v), ("backend", addr.as_str())];
                f.counter(
                    "balancer_backend_packets_total",
                    "Packets sent to a backend.",
                    &l,
                    b.packets as f64,
                );
                f.counter(
                    "balancer_backend_bytes_total",
                    "Bytes sent to a backend.",
                    &l,
                    b.bytes as f64,
                );
                f.counter(
                    "balancer_backend_new_flows_total",
                    "Flows a backend took from the Maglev table.",
                    &l,
                    b.new_flows as f64,
                );
                f.gauge(
                    "balancer_backend_flows",
                    "Active flows of a backend: recorded, not yet ended by the client (FIN/RST) or evicted.",
                    &l,
                    b.flows as f64,
                );
                f.gauge(
                    "balancer_backend_weight",
                    "A backend's configured weight.",
                    &l,
                    f64::from(b.weight),
                );
                f.gauge(
                    "balancer_backend_table_share",
                    "A backend's share of its VIP's Maglev table (0..1).",
                    &l,
                    b.table_share,
                );
                f.gauge(
                    "balancer_backend_healthy",
                    "1 if the backend passes its health checks (or is unchecked).",
                    &l,
                    if b.healthy { 1.0 } else { 0.0 },
                );
                f.gauge(
                    "balancer_backend_drained",
                    "1 if the backend is drained or being removed.",
                    &l,
                    if b.drained { 1.0 } else { 0.0 },
                );
            }
        }
        for v in self.weights() {
            for b in &v.backends {
                let addr = b.address.to_string();
                let l = [("vip", v.vip.as_str()), ("backend", addr.as_str())];
                f.gauge(
                    "balancer_backend_effective_weight",
                    "The weight in force: the policy's, or the configured one for static VIPs.",
                    &l,
                    f64::from(b.weight),
                );
                let Some(s) = &b.signals else { continue };
                let inputs = [
                    (
                        "balancer_backend_kv_cache_usage",
                        "KV-cache use a backend reported (0..1).",
                        s.kv_usage,
                    ),
                    (
                        "balancer_backend_requests_running",
                        "Requests a backend reported running.",
                        s.running,
                    ),
                    (
                        "balancer_backend_requests_waiting",
                        "Requests a backend reported queued.",
                        s.waiting,
                    ),
                    (
                        "balancer_backend_gpu_memory_free_bytes",
                        "Free GPU memory a backend reported.",
                        s.gpu_memory_free_bytes(),
                    ),
                    (
                        "balancer_backend_tokens_per_second",
                        "Token throughput of a backend.",
                        s.tokens_per_second,
                    ),
                    (
                        "balancer_backend_ttft_seconds",
                        "Mean time to first token of a backend.",
                        s.ttft_seconds,
                    ),
                    (
                        "balancer_backend_prefill_seconds",
                        "Mean prefill time of the requests a backend finished over the last report interval.",
                        s.prefill_seconds,
                    ),
                    (
                        "balancer_backend_prefix_cache_hit_rate",
                        "Share of a backend's prompt tokens found in its prefix cache over the last report interval (0..1).",
                        s.prefix_cache_hit_rate,
                    ),
                    (
                        "balancer_backend_report_age_seconds",
                        "Age of a backend's latest report.",
                        b.report_age_ms.map(|a| a as f64 / 1000.0),
                    ),
                ];
                for (name, help, value) in inputs {
                    if let Some(value) = value {
                        f.gauge(name, help, &l, value);
                    }
                }
            }
        }
        self.metrics.render(f)
    }

    /// Backends to health-check: (VIP endpoint, VIP name, backend, check settings).
    pub fn health_targets(&self) -> Vec<(Endpoint, String, IpAddr, crate::config::HealthConfig)> {
        self.config
            .vips
            .iter()
            .filter(|v| v.health.kind != HealthCheckKind::None)
            .flat_map(|v| {
                v.backends
                    .iter()
                    .map(move |b| (v.endpoint(), v.name.clone(), b.address, v.health.clone()))
            })
            .collect()
    }
}

fn change_result(what: &str, report: &ApplyReport) -> ChangeResult {
    ChangeResult {
        message: what.to_string(),
        vips_added: report.vips_added,
        vips_removed: report.vips_removed,
        vips_updated: report.vips_updated,
        tables_published: report.tables_published,
        slots_changed: report.slots_changed,
    }
}

/// Checks a pushed report's figures: finite, not negative, fractions within 0..1.
fn check_report(s: &Signals) -> Result<(), ChangeError> {
    let fields = [
        ("kv_usage", s.kv_usage, Some(1.0)),
        ("kv_capacity_tokens", s.kv_capacity_tokens, None),
        ("inflight_tokens", s.inflight_tokens, None),
        ("gpu_memory_used_bytes", s.gpu_memory_used_bytes, None),
        ("gpu_memory_total_bytes", s.gpu_memory_total_bytes, None),
        ("gpu_utilization", s.gpu_utilization, Some(1.0)),
        ("running", s.running, None),
        ("waiting", s.waiting, None),
        ("tokens_per_second", s.tokens_per_second, None),
        ("ttft_seconds", s.ttft_seconds, None),
        ("prefill_seconds", s.prefill_seconds, None),
        ("prefix_cache_hit_rate", s.prefix_cache_hit_rate, Some(1.0)),
    ];
    for (name, value, max) in fields {
        if let Some(v) = value
            && (!v.is_finite() || v < 0.0 || max.is_some_and(|m| v > m))
        {
            let range = max.map_or("a finite number >= 0".to_string(), |m| {
                format!("between 0 and {m}")
            });
            return Err(ChangeError::Invalid(format!(
                "{name} = {v}: must be {range}"
            )));
        }
    }
    if s.models.len() > 256 || s.models.iter().any(|m| m.len() > 256) {
        return Err(ChangeError::Invalid(
            "models: at most 256 names of at most 256 bytes".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(packets: u64, bytes: u64, new_flows: u64) -> TrafficStats {
        TrafficStats {
            packets,
            bytes,
            new_flows,
        }
    }

    #[test]
    fn counters_are_always_fresh_and_rates_move_only_at_a_new_interval() {
        // First reading: totals, no rate yet.
        let first = Sampled::default().with_rates(traffic(10, 1000, 2), None);
        assert_eq!(first.totals, traffic(10, 1000, 2));
        assert_eq!((first.pps, first.bps), (0.0, 0.0));
        // Half a second later: rates over the interval.
        let second = first.with_rates(traffic(60, 6000, 7), Some(0.5));
        assert_eq!((second.pps, second.bps), (100.0, 80_000.0));
        // A reading inside the rate interval: new totals (what a status right after
        // traffic must show), the last rates, the same rate base.
        let third = second.with_totals(traffic(80, 8000, 9));
        assert_eq!(third.totals.new_flows, 9);
        assert_eq!((third.pps, third.bps), (100.0, 80_000.0));
        assert_eq!(third.rate_base, traffic(60, 6000, 7));
        // The next interval counts from the rate base, not from the reading in between.
        let fourth = third.with_rates(traffic(110, 11_000, 9), Some(1.0));
        assert_eq!((fourth.pps, fourth.bps), (50.0, 40_000.0));
        // Counters that went backwards (a map recreated): no negative rate.
        let fifth = fourth.with_rates(traffic(5, 500, 1), Some(1.0));
        assert_eq!((fifth.pps, fifth.bps), (0.0, 0.0));
    }
}
