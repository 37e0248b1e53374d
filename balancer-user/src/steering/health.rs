//! Backend health checks: a task per checked backend probes it (TCP connect, or HTTP(S) GET
//! with an expected status, through the shared HTTP client) every interval; `fall`
//! consecutive failures make it unhealthy (it leaves its VIP's table and its flows are
//! re-hashed), `rise` consecutive successes bring it back.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::base::config::{HealthCheckKind, HealthConfig};
use crate::base::http_client::{HttpClient, ProbeError, is_local_io_shortage};
use crate::base::net::Endpoint;

/// How one backend is probed: the check, and for HTTP(S) checks the client (made once per
/// checker; it opens a new connection per probe).
pub struct Prober {
    check: HealthConfig,
    http: Option<Result<HttpClient, String>>,
}

impl Prober {
    pub fn new(check: &HealthConfig) -> Prober {
        let http = match &check.kind {
            HealthCheckKind::Http { tls, .. } => Some(HttpClient::for_health(
                tls.is_some(),
                tls.as_ref().and_then(|t| t.ca.as_deref()),
            )),
            _ => None,
        };
        Prober {
            check: check.clone(),
            http,
        }
    }

    /// One probe of `addr`; `Err` says why it failed, and whether the backend or this host
    /// (out of descriptors, say) was the cause.
    pub async fn probe(&self, addr: SocketAddr) -> Result<(), ProbeError> {
        let check = &self.check;
        match (&check.kind, &self.http) {
            (
                HealthCheckKind::Http {
                    path,
                    expect_status,
                    ..
                },
                Some(client),
            ) => {
                // Settings that cannot be used fail every probe (a check that cannot run does
                // not pass).
                let client = client.as_ref().map_err(|e| ProbeError::Failed(e.clone()))?;
                match client.status(addr, path, check.timeout).await? {
                    s if s == *expect_status => Ok(()),
                    s => Err(ProbeError::Failed(format!(
                        "status {s}, expected {expect_status}"
                    ))),
                }
            }
            _ => tokio::time::timeout(check.timeout, TcpStream::connect(addr))
                .await
                .map_err(|_| ProbeError::Failed(format!("no answer within {:?}", check.timeout)))?
                .map(drop)
                .map_err(|e| {
                    if is_local_io_shortage(&e) {
                        ProbeError::NotMade(format!("connect: {e}"))
                    } else {
                        ProbeError::Failed(format!("connect: {e}"))
                    }
                }),
        }
    }
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
    tasks: crate::steering::tasks::Tasks<(Endpoint, IpAddr), Target>,
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
    let prober = Prober::new(&check);
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
        let result = prober.probe(addr).await;
        if let Err(ProbeError::NotMade(why)) = &result {
            // Says nothing of the backend: neither a failure nor a success.
            daemon.count_probe(&target.vip_name, backend, "not_made");
            tracing::warn!(vip = %target.vip_name, %backend, "health check not made: {why}");
            tokio::time::sleep(check.interval).await;
            continue;
        }
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
                let why = result
                    .as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::config::HealthTls;
    use crate::base::tls::test_pki::{Pki, write};

    #[test]
    fn this_hosts_shortages_are_not_the_backends_failures() {
        let os = std::io::Error::from_raw_os_error;
        for errno in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::EADDRNOTAVAIL,
        ] {
            assert!(is_local_io_shortage(&os(errno)), "{}", os(errno));
        }
        for errno in [libc::ECONNREFUSED, libc::ETIMEDOUT, libc::EHOSTUNREACH] {
            assert!(!is_local_io_shortage(&os(errno)), "{}", os(errno));
        }
    }

    fn http_check(expect_status: u16, tls: Option<HealthTls>) -> HealthConfig {
        HealthConfig {
            kind: HealthCheckKind::Http {
                path: "/health".into(),
                expect_status,
                tls,
            },
            port: 0,
            interval: std::time::Duration::from_millis(200),
            timeout: std::time::Duration::from_secs(2),
            rise: 1,
            fall: 1,
        }
    }

    /// HTTP and HTTPS checks against servers made here: the status is compared, the
    /// certificate is verified against `health.ca`, and a refused connection is a failure.
    #[tokio::test]
    async fn http_and_https_checks_compare_the_status_and_verify_the_certificate() {
        let pki = Pki::new("health");
        let other = Pki::new("health-other");
        let (cert, key) = pki.leaf("127.0.0.1", false);
        let files = crate::base::config::ApiTls {
            cert: write(&pki.dir, "server.pem", &cert),
            key: write(&pki.dir, "server-key.pem", &key),
            client_ca: None,
        };
        let ca = write(&pki.dir, "ca.pem", &pki.ca_pem);
        let other_ca = write(&pki.dir, "other-ca.pem", &other.ca_pem);
        let _ = std::fs::remove_dir_all(&other.dir);
        let app = axum::Router::new().route("/health", axum::routing::get(|| async { "ok" }));
        let tls_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tls_addr = tls_listener.local_addr().unwrap();
        let server_config = crate::serve::api::listener::server_config(&files).unwrap();
        tokio::spawn(crate::serve::api::listener::serve(
            tls_listener,
            Some(server_config),
            app.clone(),
            crate::serve::api::listener::API_LIMITS,
            "test",
        ));
        let plain_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain_addr = plain_listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(plain_listener, app).await });

        let https = |ca: &std::path::Path| {
            http_check(
                200,
                Some(HealthTls {
                    ca: Some(ca.to_path_buf()),
                }),
            )
        };
        Prober::new(&http_check(200, None))
            .probe(plain_addr)
            .await
            .unwrap();
        let wrong_status = Prober::new(&http_check(204, None))
            .probe(plain_addr)
            .await
            .unwrap_err();
        assert_eq!(
            wrong_status,
            ProbeError::Failed("status 200, expected 204".into())
        );
        // One prober, probing again: each probe is a request of its own.
        let prober = Prober::new(&https(&ca));
        prober.probe(tls_addr).await.unwrap();
        prober.probe(tls_addr).await.unwrap();
        let untrusted = Prober::new(&https(&other_ca))
            .probe(tls_addr)
            .await
            .unwrap_err();
        assert!(untrusted.to_string().contains("certificate"), "{untrusted}");
        let missing = Prober::new(&https(&pki.dir.join("none.pem")))
            .probe(tls_addr)
            .await
            .unwrap_err();
        assert!(
            missing.to_string().contains("health.ca") && missing.to_string().contains("none.pem"),
            "{missing}"
        );
        assert!(
            Prober::new(&http_check(200, None))
                .probe(tls_addr)
                .await
                .is_err()
        );
        // Nothing listens on the port of a dropped listener.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let refused = Prober::new(&http_check(200, None))
            .probe(closed)
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("onnect"), "{refused}");
        let tcp = HealthConfig {
            kind: HealthCheckKind::Tcp,
            ..http_check(200, None)
        };
        Prober::new(&tcp).probe(plain_addr).await.unwrap();
        assert!(
            Prober::new(&tcp)
                .probe(closed)
                .await
                .unwrap_err()
                .to_string()
                .contains("connect")
        );
        let _ = std::fs::remove_dir_all(&pki.dir);
    }
}
