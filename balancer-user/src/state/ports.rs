//! The daemon as its workers reach it: each worker (health checks, telemetry loops, model
//! discovery, the fleet agent) names what it needs as a trait of its own, and the shared daemon implements them
//! here, so no worker imports the daemon.

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use super::Daemon;
use crate::base::config::{Discovery, FleetConfig, HealthConfig, RawVip};
use crate::dataplane::ScrapeDue;
use crate::steering::discovery::{DiscoveryPort, PoolDiscovery};
use crate::steering::fleet::agent::FleetPort;
use crate::steering::fleet::{FleetState, FleetStatus, FleetWeights, local_weights, vip_config};
use crate::steering::health::HealthPort;
use crate::steering::telemetry::loops::{ScrapeTarget, TelemetryPort};
use crate::steering::telemetry::signals::Valid;
use crate::vips::Endpoint;

impl HealthPort for Mutex<Daemon> {
    fn health_targets(&self) -> Vec<(Endpoint, String, IpAddr, HealthConfig)> {
        self.lock().map(|d| d.health_targets()).unwrap_or_default()
    }

    fn believed_healthy(&self, vip_name: &str, backend: IpAddr) -> Option<bool> {
        let d = self.lock().ok()?;
        d.balancer
            .vip(vip_name)
            .and_then(|v| v.backends.get(&backend).map(|b| b.healthy))
    }

    fn count_probe(&self, vip_name: &str, backend: IpAddr, outcome: &str) {
        if let Ok(d) = self.lock() {
            d.metrics
                .health_checks
                .with_label_values(&[vip_name, &backend.to_string(), outcome])
                .inc();
        }
    }

    fn set_health(&self, vip: &Endpoint, vip_name: &str, backend: IpAddr, healthy: bool) {
        if let Ok(mut d) = self.lock() {
            d.set_health(vip, vip_name, backend, healthy);
        }
    }
}

impl crate::steering::ticker::TickerPort for Mutex<Daemon> {
    fn every_second(&self) {
        if let Ok(mut d) = self.lock() {
            d.tick();
            d.sample_if_due();
            d.announce();
        }
        Daemon::sweep_nat(self);
    }

    fn config_generation(&self) -> u64 {
        self.lock().map(|d| d.config_generation()).unwrap_or(0)
    }
}

impl TelemetryPort for Mutex<Daemon> {
    fn scrape_targets(&self) -> Vec<ScrapeTarget> {
        self.lock().map(|d| d.scrape_targets()).unwrap_or_default()
    }

    fn new_flows(&self, name: &str) -> Option<u64> {
        let d = self.lock().ok()?;
        let vip = d.balancer.vip(name)?;
        d.balancer.vip_stats(vip).ok().map(|t| t.new_flows)
    }

    fn record_round(
        &self,
        vip: &Endpoint,
        name: &str,
        results: Vec<(IpAddr, Result<Valid, String>)>,
        next_scrape: Option<Duration>,
    ) {
        let Ok(mut d) = self.lock() else {
            return;
        };
        let started = std::time::Instant::now();
        if let Some(next) = next_scrape {
            match d.scrape_intervals.get_mut(name) {
                Some(at) => *at = next,
                None => {
                    d.scrape_intervals.insert(name.to_string(), next);
                }
            }
        }
        for (backend, result) in results {
            d.record_scrape(vip, name, backend, result);
        }
        if let Err(e) = d.weight_round(name) {
            if e.is_publish_failure() {
                d.metrics
                    .publish_errors
                    .with_label_values(&["weights"])
                    .inc();
            }
            tracing::error!(vip = %name, "weight round: {e}");
        }
        d.metrics
            .round_seconds
            .with_label_values(&[name])
            .observe(started.elapsed().as_secs_f64());
    }

    fn take_scrape_due(&self) -> Option<ScrapeDue> {
        self.lock().ok()?.balancer.take_scrape_due()
    }
}

impl DiscoveryPort for Mutex<Daemon> {
    fn discovery_targets(&self) -> Vec<(String, PoolDiscovery)> {
        let Ok(d) = self.lock() else {
            return Vec::new();
        };
        d.config
            .pools
            .iter()
            .filter(|p| p.discovery != Discovery::None)
            .map(|p| {
                let target = PoolDiscovery {
                    backends: p.backends.iter().map(|b| b.address).collect(),
                    how: p.discovery.clone(),
                    interval: p.interval,
                    access: p.access.clone(),
                };
                (p.name.clone(), target)
            })
            .collect()
    }

    fn record_models(&self, pool: &str, results: Vec<(IpAddr, Result<Vec<String>, String>)>) {
        if let Ok(mut d) = self.lock() {
            d.record_models(pool, results);
        }
    }
}

impl FleetPort for Mutex<Daemon> {
    fn fleet_config(&self) -> Option<FleetConfig> {
        self.lock().ok()?.config.fleet.clone()
    }

    fn use_local_weights(&self) -> bool {
        self.lock().is_ok_and(|mut d| d.apply_fleet(None))
    }

    fn adopt(&self, state: &FleetState) -> Option<Option<std::time::Instant>> {
        self.lock().ok()?.adopt_fleet(state)
    }

    fn local_view(&self) -> Option<(FleetWeights, Vec<RawVip>)> {
        let d = self.lock().ok()?;
        Some((local_weights(&d.balancer), vip_config(&d.config)))
    }

    fn local_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        match self.lock() {
            Ok(d) => d.subscribe_local_changes(),
            // A daemon that panicked: a channel that is already closed (the agent stops).
            Err(_) => tokio::sync::watch::channel(0).1,
        }
    }

    fn set_status(&self, status: FleetStatus) {
        if let Ok(mut d) = self.lock() {
            d.fleet = status;
        }
    }
}
