//! Backend reports (scraped, pushed, models discovered) and the weight rounds that turn
//! them into each VIP's table.

use std::net::IpAddr;
use std::time::Instant;

use crate::balancer::Endpoint;
use crate::config::TelemetrySource;
use crate::policy::PolicyKind;
use crate::telemetry::round;
use crate::telemetry::signals::Signals;

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
        (
            "prefill_seconds_per_token",
            s.prefill_seconds_per_token,
            None,
        ),
        ("prompt_tokens_mean", s.prompt_tokens_mean, None),
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
