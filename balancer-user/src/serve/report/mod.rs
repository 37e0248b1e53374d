//! The backend-side reporter behind `balancer report`: it reads the local GPUs (NVML, or a
//! file of `nvidia-smi` output), optionally the local inference server's metrics page, and
//! optionally what its tc programs measure of the requests passing this host's interface
//! (time to first token, inter-token latency: [`passive`]), and turns them into a report for
//! the balancer: served as a DCGM-exporter-style page for the daemon to scrape, or pushed to
//! the daemon's API.

pub mod gpu;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod passive;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::base::config::RECENT_HALF_LIFE;
use crate::steering::telemetry::page;
use crate::steering::telemetry::scrape::http_get;
use crate::steering::telemetry::signals::{Signals, extract};
use crate::steering::telemetry::store::BackendTelemetry;
use gpu::{GpuSource, GpuStats};
use passive::PassiveLatency;

/// A local metrics page to include in the report: `http://HOST:PORT/PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPage {
    pub addr: SocketAddr,
    pub path: String,
}

impl std::str::FromStr for LocalPage {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("http://")
            .ok_or_else(|| format!("{s:?}: expected http://HOST:PORT/PATH (plain HTTP)"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/metrics"),
        };
        let addr = authority.parse::<SocketAddr>().map_err(|_| {
            format!("{s:?}: {authority:?} is not an IP address and port (e.g. 127.0.0.1:8000)")
        })?;
        Ok(LocalPage {
            addr,
            path: path.to_string(),
        })
    }
}

/// One round's report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub gpus: Vec<GpuStats>,
    pub signals: Signals,
}

/// Collects reports; keeps the counter readings that rates (tokens/s, TTFT) are derived from.
pub struct Reporter {
    gpu: GpuSource,
    pages: Vec<LocalPage>,
    timeout: Duration,
    max_body: usize,
    passive: Option<PassiveLatency>,
    history: BackendTelemetry,
}

impl Reporter {
    pub fn new(
        gpu: GpuSource,
        pages: Vec<LocalPage>,
        timeout: Duration,
        max_body: usize,
    ) -> Reporter {
        Reporter {
            gpu,
            pages,
            timeout,
            max_body,
            passive: None,
            history: BackendTelemetry::default(),
        }
    }

    /// Adds passive latency measurement (programs already attached) to every report.
    pub fn with_passive_latency(mut self, passive: PassiveLatency) -> Reporter {
        self.passive = Some(passive);
        self
    }

    /// The passive latency programs, when measured (for tests that feed them packets).
    pub fn passive_latency(&mut self) -> Option<&mut PassiveLatency> {
        self.passive.as_mut()
    }

    /// The page `balancer report --serve` serves: the GPUs named as the DCGM exporter names
    /// them, then the passive latency histograms when measured.
    pub fn page(&self, hostname: &str) -> Result<String, String> {
        let mut page = gpu::render_dcgm(&self.gpus()?, hostname);
        if let Some(p) = &self.passive {
            let stats = p.stats().map_err(|e| e.to_string())?;
            page.push_str(&passive::render(&stats, p.interface().unwrap_or_default()));
        }
        Ok(page)
    }

    /// Reads the GPUs alone (for the served page).
    pub fn gpus(&self) -> Result<Vec<GpuStats>, String> {
        self.gpu.read()
    }

    /// Reads every source. Any source failing fails the round: a partial report would read
    /// as an idle backend.
    pub async fn collect(&mut self) -> Result<Report, String> {
        let gpus = self.gpu.read()?;
        let mut signals = gpu::signals(&gpus);
        for page in &self.pages {
            let text = http_get(page.addr, &page.path, self.timeout, self.max_body).await?;
            let samples =
                page::parse(&text).map_err(|e| format!("{}{}: {e}", page.addr, page.path))?;
            let page_signals = extract(&samples)
                .validate()
                .map_err(|e| format!("{}{}: {e}", page.addr, page.path))?;
            signals.merge(page_signals.into_inner());
        }
        // A server's own TTFT, when its page has one, comes first.
        if let Some(p) = &self.passive {
            let stats = p.stats().map_err(|e| e.to_string())?;
            signals.merge(passive::signals(&stats));
        }
        let signals = signals.validate().map_err(|e| e.to_string())?;
        self.history
            .record(signals, Instant::now(), RECENT_HALF_LIFE);
        let signals = self
            .history
            .latest
            .as_ref()
            .map(|(s, _)| s.clone())
            .unwrap_or_default();
        Ok(Report { gpus, signals })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_pages_parse_or_say_what_is_wrong() {
        assert_eq!(
            "http://127.0.0.1:8000/metrics"
                .parse::<LocalPage>()
                .unwrap(),
            LocalPage {
                addr: "127.0.0.1:8000".parse().unwrap(),
                path: "/metrics".into()
            }
        );
        assert_eq!(
            "http://[::1]:9400".parse::<LocalPage>().unwrap().path,
            "/metrics"
        );
        assert!(
            "https://x:1/"
                .parse::<LocalPage>()
                .unwrap_err()
                .contains("plain HTTP")
        );
        assert!(
            "http://localhost:8000/"
                .parse::<LocalPage>()
                .unwrap_err()
                .contains("not an IP address")
        );
    }
}
