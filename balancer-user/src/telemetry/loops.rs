//! The daemon's telemetry loops: one task per VIP that, every interval, scrapes its backends
//! concurrently (when it scrapes), records the reports, and runs a weight round right after, so
//! a report reaches the table within one policy round.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::scrape::scrape;
use super::signals::Signals;
use crate::balancer::Endpoint;
use crate::config::{TelemetryConfig, TelemetrySource};
use crate::http_client::{AccessNames, HttpClient};

type Key = (Endpoint, Vec<IpAddr>, TelemetryConfig);

/// The daemon as the telemetry loops reach it. (Implemented by the daemon; the loops know
/// nothing else of it.)
pub trait TelemetryPort: Send + Sync + 'static {
    /// The VIPs whose backends report: (endpoint, VIP name, backends, telemetry settings).
    fn scrape_targets(&self) -> Vec<(Endpoint, String, Vec<IpAddr>, TelemetryConfig)>;
    /// Records one round's results (an empty list for pushed reports) and runs the VIP's
    /// weight round; blocking.
    fn record_round(
        &self,
        vip: &Endpoint,
        name: &str,
        results: Vec<(IpAddr, Result<Signals, String>)>,
    );
}

/// The running loops, by VIP name.
#[derive(Default)]
pub struct TelemetryLoops {
    tasks: crate::tasks::Tasks<String, Key>,
}

impl TelemetryLoops {
    /// Brings the loops in line with the daemon's config.
    pub fn reconcile<P: TelemetryPort>(&mut self, daemon: &Arc<P>) {
        let targets: HashMap<String, Key> = daemon
            .scrape_targets()
            .into_iter()
            .map(|(vip, name, backends, cfg)| (name, (vip, backends, cfg)))
            .collect();
        self.tasks.reconcile(targets, |name, key| {
            tokio::spawn(run(daemon.clone(), name.clone(), key.clone()))
        });
    }

    pub fn stop(&mut self) {
        self.tasks.stop();
    }
}

async fn run<P: TelemetryPort>(daemon: Arc<P>, name: String, (vip, backends, cfg): Key) {
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One pooled client for this VIP's pages (its scheme, CA, certificate and token); a
    // setting that cannot be used fails every scrape with its reason, which status shows.
    let client = HttpClient::with_access(&cfg.access, &AccessNames::TELEMETRY);
    if let Err(e) = &client {
        tracing::error!(vip = %name, "telemetry: {e}");
    }
    loop {
        tick.tick().await;
        let mut results = Vec::new();
        if let TelemetrySource::Scrape(pages) = &cfg.source {
            let mut set = JoinSet::new();
            for backend in &backends {
                let (backend, pages, timeout, max_body) =
                    (*backend, pages.clone(), cfg.timeout, cfg.max_body);
                let client = client.clone();
                set.spawn(async move {
                    let result = match &client {
                        Ok(c) => scrape(c, backend, &pages, timeout, max_body).await,
                        Err(e) => Err(e.clone()),
                    };
                    (backend, result)
                });
            }
            while let Some(done) = set.join_next().await {
                if let Ok(result) = done {
                    results.push(result);
                }
            }
        }
        let d = daemon.clone();
        let name = name.clone();
        let _ = tokio::task::spawn_blocking(move || d.record_round(&vip, &name, results)).await;
    }
}
