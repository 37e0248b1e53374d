//! The daemon's telemetry loops: one task per VIP that, every interval, scrapes its backends
//! concurrently (when it scrapes), records the reports, and runs a weight round right after, so
//! a report reaches the table within one policy round.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;

use super::scrape::scrape;
use crate::balancer::Endpoint;
use crate::config::{TelemetryConfig, TelemetrySource};
use crate::daemon::state::Daemon;

type Key = (Endpoint, Vec<IpAddr>, TelemetryConfig);

/// The running loops, by VIP name.
#[derive(Default)]
pub struct TelemetryLoops {
    tasks: crate::tasks::Tasks<String, Key>,
}

impl TelemetryLoops {
    /// Brings the loops in line with the daemon's config.
    pub fn reconcile(&mut self, daemon: &Arc<Mutex<Daemon>>) {
        let targets: HashMap<String, Key> = match daemon.lock() {
            Ok(d) => d
                .scrape_targets()
                .into_iter()
                .map(|(vip, name, backends, cfg)| (name, (vip, backends, cfg)))
                .collect(),
            Err(_) => return,
        };
        self.tasks.reconcile(targets, |name, key| {
            tokio::spawn(run(daemon.clone(), name.clone(), key.clone()))
        });
    }

    pub fn stop(&mut self) {
        self.tasks.stop();
    }
}

async fn run(daemon: Arc<Mutex<Daemon>>, name: String, (vip, backends, cfg): Key) {
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut results = Vec::new();
        if let TelemetrySource::Scrape(pages) = &cfg.source {
            let mut set = JoinSet::new();
            for backend in &backends {
                let (backend, pages, timeout, max_body) =
                    (*backend, pages.clone(), cfg.timeout, cfg.max_body);
                set.spawn(
                    async move { (backend, scrape(backend, &pages, timeout, max_body).await) },
                );
            }
            while let Some(done) = set.join_next().await {
                if let Ok(result) = done {
                    results.push(result);
                }
            }
        }
        let d = daemon.clone();
        let name = name.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let Ok(mut d) = d.lock() else {
                return;
            };
            for (backend, result) in results {
                d.record_scrape(&vip, &name, backend, result);
            }
            if let Err(e) = d.weight_round(&name) {
                tracing::error!(vip = %name, "weight round: {e}");
            }
        })
        .await;
    }
}
