//! Backend reports (scraped, pushed, models discovered) and the weight rounds that turn
//! them into each VIP's table.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::base::config::RECENT_HALF_LIFE;
use crate::base::config::TelemetrySource;
use crate::steering::policy::PolicyKind;
use crate::steering::telemetry::loops::ScrapeTarget;
use crate::steering::telemetry::round;
use crate::steering::telemetry::signals::{Signals, Valid};
use crate::vips::Endpoint;

use super::{ChangeError, Daemon};

impl Daemon {
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
        result: Result<Valid, String>,
    ) {
        let outcome = if result.is_ok() { "success" } else { "failure" };
        self.metrics
            .reports
            .with_label_values(&[name, &backend.to_string(), outcome])
            .inc();
        let half_life = self
            .config
            .vip(name)
            .map_or(RECENT_HALF_LIFE, |v| v.telemetry.derived_half_life);
        let entry = self.telemetry.entry(vip, backend);
        match result {
            Ok(signals) => {
                if entry.failing {
                    tracing::info!(vip = name, %backend, "the backend's pages read again");
                    entry.failing = false;
                }
                entry.record(signals, Instant::now(), half_life)
            }
            Err(why) => {
                // Logged once per change of reason: a backend that keeps serving a bad page
                // is one line, not one a scrape.
                if entry.last_error.as_deref() != Some(why.as_str()) || !entry.failing {
                    tracing::warn!(vip = name, %backend, "scrape failed: {why}");
                } else {
                    tracing::debug!(vip = name, %backend, "scrape failed: {why}");
                }
                entry.failing = true;
                entry.error(why);
            }
        }
    }

    /// Records a pushed report for `backend` in every VIP that takes pushed reports from it.
    pub fn record_push(&mut self, backend: IpAddr, signals: Signals) -> Result<usize, ChangeError> {
        let signals = signals
            .validate()
            .map_err(|e| ChangeError::Invalid(e.to_string()))?;
        let vips: Vec<(Endpoint, String, Duration)> = self
            .config
            .vips
            .iter()
            .filter(|v| v.telemetry.source == TelemetrySource::Push && v.backend(backend).is_some())
            .map(|v| (v.endpoint(), v.name.clone(), v.telemetry.derived_half_life))
            .collect();
        if vips.is_empty() {
            return Err(ChangeError::NotFound(format!(
                "no VIP takes pushed reports from backend {backend} (telemetry.source = \"push\")"
            )));
        }
        let now = Instant::now();
        for (vip, name, half_life) in &vips {
            self.telemetry
                .entry(vip, backend)
                .record(signals.clone(), now, *half_life);
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
        #[cfg(debug_assertions)]
        injected_panic("weight-round");
        let started = Instant::now();
        let Some(vip) = self.config.vip(name).cloned() else {
            return Ok(());
        };
        // Connection-aware policies read the data plane's active-flow counts (kept for their
        // VIPs: a read of their backends' slots in one small array, not a scan of the
        // connection table).
        let active = if vip.policy.reads_flows() {
            match crate::dataplane::Dataplane::active_flows(
                self.balancer.dataplane(),
                &self.backend_ids(name),
            ) {
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
        )?;
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

    /// The data plane's ids of the backends of the VIP `name`.
    fn backend_ids(&self, name: &str) -> Vec<u32> {
        self.balancer
            .vip(name)
            .map(|v| v.backends.values().map(|b| b.id).collect())
            .unwrap_or_default()
    }

    /// VIPs whose backends report (scraped or pushed) or whose policy reads them.
    pub fn scrape_targets(&self) -> Vec<ScrapeTarget> {
        self.config
            .vips
            .iter()
            .filter(|v| {
                v.telemetry.source != TelemetrySource::None || v.policy.kind != PolicyKind::Static
            })
            .map(|v| ScrapeTarget {
                vip: v.endpoint(),
                name: v.name.clone(),
                vip_id: self.balancer.vip(&v.name).map(|state| state.id),
                backends: v.backends.iter().map(|b| b.address).collect(),
                telemetry: v.telemetry.clone(),
            })
            .collect()
    }
}

/// A panic injected for the tests that show what [`abort_on_panic`](crate::serve::daemon::abort_on_panic) does: debug builds only,
/// where `BALANCER_INJECT_PANIC=weight-round:N` panics in the Nth weight round (with the
/// daemon's state locked, as a bug there would).
#[cfg(debug_assertions)]
pub(crate) fn injected_panic(site: &str) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static AT: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let at = AT.get_or_init(|| {
        let spec = std::env::var("BALANCER_INJECT_PANIC").ok()?;
        let (name, n) = spec.split_once(':')?;
        Some((name.to_string(), n.parse().ok()?))
    });
    if let Some((name, n)) = at
        && name == site
        && SEEN.fetch_add(1, Ordering::Relaxed) + 1 == *n
    {
        panic!("injected panic in {site} {n} (BALANCER_INJECT_PANIC)");
    }
}
