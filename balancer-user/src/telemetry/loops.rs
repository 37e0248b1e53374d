//! The daemon's telemetry loops: one task per VIP that, every interval, scrapes its backends
//! concurrently (when it scrapes), records the reports, and runs a weight round right after, so
//! a report reaches the table within one policy round; a policy that corrects reports by what
//! the data plane sees also runs between scrapes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::scrape::scrape;
use super::signals::Signals;
use crate::balancer::Endpoint;
use crate::config::{TelemetryConfig, TelemetrySource};
use crate::http_client::{AccessNames, HttpClient};

/// How often a VIP's policy runs between its scrapes when it corrects reports by what the
/// data plane sees ([`crate::policy::PolicyConfig::fresher_load`]).
pub const ROUNDS_BETWEEN_SCRAPES: std::time::Duration = std::time::Duration::from_millis(100);

/// One VIP whose backends report.
#[derive(Clone, Debug, PartialEq)]
pub struct ScrapeTarget {
    pub vip: Endpoint,
    pub name: String,
    pub backends: Vec<IpAddr>,
    pub telemetry: TelemetryConfig,
    /// Weight rounds between scrapes this often (None: one round after each scrape).
    pub rounds_every: Option<std::time::Duration>,
}

/// The daemon as the telemetry loops reach it. (Implemented by the daemon; the loops know
/// nothing else of it.)
pub trait TelemetryPort: Send + Sync + 'static {
    /// The VIPs whose backends report.
    fn scrape_targets(&self) -> Vec<ScrapeTarget>;
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
    tasks: crate::tasks::Tasks<String, ScrapeTarget>,
}

impl TelemetryLoops {
    /// Brings the loops in line with the daemon's config.
    pub fn reconcile<P: TelemetryPort>(&mut self, daemon: &Arc<P>) {
        let targets: HashMap<String, ScrapeTarget> = daemon
            .scrape_targets()
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        self.tasks.reconcile(targets, |_, target| {
            tokio::spawn(run(daemon.clone(), target.clone()))
        });
    }

    pub fn stop(&mut self) {
        self.tasks.stop();
    }
}

async fn run<P: TelemetryPort>(daemon: Arc<P>, target: ScrapeTarget) {
    let ScrapeTarget {
        vip,
        name,
        backends,
        telemetry: cfg,
        rounds_every,
    } = target;
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Rounds between scrapes (only while they are more frequent than the scrapes).
    let mut rounds = rounds_every
        .filter(|every| *every < cfg.interval)
        .map(tokio::time::interval);
    if let Some(r) = rounds.as_mut() {
        r.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    // One pooled client for this VIP's pages (its scheme, CA, certificate and token); a
    // setting that cannot be used fails every scrape with its reason, which status shows.
    let client = HttpClient::with_access(&cfg.access, &AccessNames::TELEMETRY);
    if let Err(e) = &client {
        tracing::error!(vip = %name, "telemetry: {e}");
    }
    loop {
        let scrape_now = match rounds.as_mut() {
            Some(r) => tokio::select! {
                _ = tick.tick() => true,
                _ = r.tick() => false,
            },
            None => {
                tick.tick().await;
                true
            }
        };
        if !scrape_now {
            let d = daemon.clone();
            let name = name.clone();
            let _ =
                tokio::task::spawn_blocking(move || d.record_round(&vip, &name, Vec::new())).await;
            continue;
        }
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
