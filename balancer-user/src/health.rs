//! Backend health checks: a task per checked backend probes it (TCP connect, or HTTP GET with
//! an expected status) every interval; `fall` consecutive failures make it unhealthy (it leaves
//! its VIP's table and its flows are re-hashed), `rise` consecutive successes bring it back.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::balancer::Endpoint;
use crate::config::{HealthCheckKind, HealthConfig};

/// One probe of `addr`; `Err` says why it failed.
pub async fn probe(addr: SocketAddr, check: &HealthConfig) -> Result<(), String> {
    let attempt = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let HealthCheckKind::Http {
            path,
            expect_status,
        } = &check.kind
        else {
            return Ok(());
        };
        let host = match addr.ip() {
            IpAddr::V4(a) => a.to_string(),
            IpAddr::V6(a) => format!("[{a}]"),
        };
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: balancer-health-check\r\nConnection: close\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("send: {e}"))?;
        let mut head = Vec::with_capacity(256);
        let mut buf = [0u8; 256];
        while !head.contains(&b'\n') && head.len() < 4096 {
            let n = stream
                .read(&mut buf)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let line = String::from_utf8_lossy(&head);
        let status: Option<u16> = line
            .lines()
            .next()
            .filter(|l| l.starts_with("HTTP/"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok());
        match status {
            Some(s) if s == *expect_status => Ok(()),
            Some(s) => Err(format!("status {s}, expected {expect_status}")),
            None => Err("no HTTP status line".to_string()),
        }
    };
    tokio::time::timeout(check.timeout, attempt)
        .await
        .map_err(|_| format!("no answer within {:?}", check.timeout))?
}

/// The daemon as the health checks reach it: the checks to run, what it believes of a
/// backend, and where probe counts and verdicts go. (Implemented by the daemon; the checks
/// know nothing else of it.)
pub trait HealthPort: Send + Sync + 'static {
    /// Backends to check: (VIP endpoint, VIP name, backend, check settings).
    fn health_targets(&self) -> Vec<(Endpoint, String, IpAddr, HealthConfig)>;
    /// The verdict the balancer holds for a backend, if it has the backend.
    fn believed_healthy(&self, vip_name: &str, backend: IpAddr) -> Option<bool>;
    /// Counts one probe (`outcome`: success or failure).
    fn count_probe(&self, vip_name: &str, backend: IpAddr, outcome: &str);
    /// Records a verdict; blocking (it may rebuild a table).
    fn set_health(&self, vip: &Endpoint, vip_name: &str, backend: IpAddr, healthy: bool);
}

/// What one checker task checks.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    vip_name: String,
    check: HealthConfig,
}

/// The running checker tasks.
#[derive(Default)]
pub struct HealthChecks {
    tasks: crate::tasks::Tasks<(Endpoint, IpAddr), Target>,
}

impl HealthChecks {
    /// Brings the tasks in line with the daemon's config: stops checks of backends gone or
    /// changed, starts new ones.
    pub fn reconcile<P: HealthPort>(&mut self, daemon: &Arc<P>) {
        let targets: HashMap<(Endpoint, IpAddr), Target> = daemon
            .health_targets()
            .into_iter()
            .map(|(vip, vip_name, backend, check)| ((vip, backend), Target { vip_name, check }))
            .collect();
        self.tasks.reconcile(targets, |key, target| {
            tokio::spawn(check_loop(daemon.clone(), key.0, key.1, target.clone()))
        });
    }

    pub fn stop(&mut self) {
        self.tasks.stop();
    }
}

async fn check_loop<P: HealthPort>(daemon: Arc<P>, vip: Endpoint, backend: IpAddr, target: Target) {
    let check = target.check;
    let addr = SocketAddr::new(backend, check.port);
    // Start from what the balancer believes (a restarted daemon keeps its verdicts).
    let mut healthy = daemon
        .believed_healthy(&target.vip_name, backend)
        .unwrap_or(true);
    let (mut successes, mut failures) = (0u32, 0u32);
    let mut reported = false;
    // Spread the first probes of many backends over one interval.
    let jitter = u64::from(
        backend
            .to_string()
            .bytes()
            .fold(0u8, |a, b| a.wrapping_add(b)),
    ) % 100;
    tokio::time::sleep(check.interval.mul_f64(jitter as f64 / 100.0)).await;
    loop {
        let result = probe(addr, &check).await;
        let outcome = if result.is_ok() { "success" } else { "failure" };
        daemon.count_probe(&target.vip_name, backend, outcome);
        match &result {
            Ok(()) => {
                successes += 1;
                failures = 0;
            }
            Err(why) => {
                failures += 1;
                successes = 0;
                tracing::debug!(vip = %target.vip_name, %backend, "health check failed: {why}");
            }
        }
        let verdict = if healthy && failures >= check.fall {
            Some(false)
        } else if !healthy && successes >= check.rise {
            Some(true)
        } else if !reported {
            Some(healthy)
        } else {
            None
        };
        if let Some(now_healthy) = verdict {
            if now_healthy != healthy {
                let why = result.as_ref().err().cloned().unwrap_or_default();
                tracing::warn!(vip = %target.vip_name, %backend, healthy = now_healthy, "backend health changed {why}");
            }
            healthy = now_healthy;
            reported = true;
            let daemon = daemon.clone();
            let name = target.vip_name.clone();
            let _ = tokio::task::spawn_blocking(move || {
                daemon.set_health(&vip, &name, backend, now_healthy);
            })
            .await;
        }
        tokio::time::sleep(check.interval).await;
    }
}
