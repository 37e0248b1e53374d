//! Backend reports (scraped, pushed, models discovered) and the weight rounds that turn
//! them into each VIP's table.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::balancer::Endpoint;
use crate::config::{TelemetrySource, VipConfig};
use crate::dataplane::Dataplane as _;
use crate::policy::{FlowsSince, PolicyKind};
use crate::telemetry::loops::{ROUNDS_BETWEEN_SCRAPES, ScrapeTarget};
use crate::telemetry::round;
use crate::telemetry::signals::{Signals, Valid};
use crate::telemetry::store::RECENT_HALF_LIFE;

use super::{ChangeError, Daemon};

/// What the data plane had counted for a backend at a moment: the flows it ever gave it, and
/// those active then.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowMark {
    pub new: u64,
    pub active: u64,
}

impl FlowMark {
    /// The flows given and ended between `then` and this mark: every flow active then or
    /// given since that is no longer active has ended. (A counter that went back — the
    /// backend's id given to another — reads as nothing since.)
    pub fn since(&self, then: &FlowMark) -> FlowsSince {
        let new = self.new.saturating_sub(then.new);
        FlowsSince {
            new,
            ended: (then.active + new).saturating_sub(self.active),
        }
    }
}

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

    /// Records a scrape of a backend (signals, or why it failed); `mark`: what the data plane
    /// had counted for it then (see [`Daemon::flow_marks`]).
    pub fn record_scrape(
        &mut self,
        vip: &Endpoint,
        name: &str,
        backend: IpAddr,
        result: Result<Valid, String>,
        mark: Option<FlowMark>,
    ) {
        if let (Ok(_), Some(mark)) = (&result, mark) {
            self.report_marks.insert((*vip, backend), mark);
        }
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
        crate::daemon::injected_panic("weight-round");
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
        let since = self.flows_since_reports(&vip, active.as_ref());
        let policy = self.policies.entry(name.to_string()).or_default();
        let outcome = round::weight_round(
            &vip,
            &mut self.balancer,
            &self.telemetry,
            active.as_ref().unwrap_or(&self.flows),
            &since,
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

    /// What the data plane has counted for each backend of `vip` now (by address): empty
    /// unless its policy corrects reports by it ([`PolicyConfig::fresher_load`]). `active`:
    /// the active-flow counts by backend id when the caller has just read them.
    ///
    /// [`PolicyConfig::fresher_load`]: crate::policy::PolicyConfig::fresher_load
    pub fn flow_marks(
        &self,
        vip: &VipConfig,
        active: Option<&HashMap<u32, u64>>,
    ) -> HashMap<IpAddr, FlowMark> {
        let Some(state) = self
            .balancer
            .vip(&vip.name)
            .filter(|_| vip.policy.fresher_load)
        else {
            return HashMap::new();
        };
        let dataplane = self.balancer.dataplane();
        let read;
        let active = match active {
            Some(a) => a,
            None => {
                read = dataplane
                    .active_flows(&self.backend_ids(&vip.name))
                    .unwrap_or_default();
                &read
            }
        };
        state
            .backends
            .iter()
            .filter_map(|(address, b)| {
                let new = dataplane.backend_stats(b.id).ok()?.new_flows;
                let active = active.get(&b.id).copied().unwrap_or(0);
                Some((*address, FlowMark { new, active }))
            })
            .collect()
    }

    /// What the data plane saw of each backend of `vip` since its newest report.
    fn flows_since_reports(
        &self,
        vip: &VipConfig,
        active: Option<&HashMap<u32, u64>>,
    ) -> HashMap<IpAddr, FlowsSince> {
        let endpoint = vip.endpoint();
        self.flow_marks(vip, active)
            .into_iter()
            .filter_map(|(address, now)| {
                let then = self.report_marks.get(&(endpoint, address))?;
                Some((address, now.since(then)))
            })
            .collect()
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
                rounds_every: v.policy.fresher_load.then_some(ROUNDS_BETWEEN_SCRAPES),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_since_a_mark_are_the_new_ones_and_those_that_ended() {
        let then = FlowMark {
            new: 100,
            active: 6,
        };
        // 5 new since; 3 active now: of the 11 active then or new since, 8 ended.
        let now = FlowMark {
            new: 105,
            active: 3,
        };
        assert_eq!(now.since(&then), FlowsSince { new: 5, ended: 8 });
        assert_eq!(then.since(&then), FlowsSince::default());
        // A counter that went back (the id given to another backend): nothing since.
        let reset = FlowMark { new: 2, active: 9 };
        assert_eq!(reset.since(&then), FlowsSince { new: 0, ended: 0 });
    }
}
