//! Health-check verdicts and the checks to run.

use std::net::IpAddr;

use crate::base::config::HealthCheckKind;
use crate::vips::Endpoint;

use super::Daemon;

impl Daemon {
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
                self.local_view_changed();
            }
            Ok(false) => {}
            Err(e) => tracing::error!(vip = name, %backend, "applying a health change: {e}"),
        }
    }

    pub(super) fn health_label(
        &self,
        vip: &Endpoint,
        backend: IpAddr,
        kind: &HealthCheckKind,
    ) -> String {
        if *kind == HealthCheckKind::None {
            return "unchecked".into();
        }
        match self.checked.get(&(*vip, backend)) {
            Some(true) => "healthy".into(),
            Some(false) => "unhealthy".into(),
            None => "pending".into(),
        }
    }

    /// Backends to health-check: (VIP endpoint, VIP name, backend, check settings).
    pub fn health_targets(
        &self,
    ) -> Vec<(Endpoint, String, IpAddr, crate::base::config::HealthConfig)> {
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
