//! A VIP's `health` table: the check each backend must pass to stay in the table.

use std::time::Duration;

use super::error::{ConfigError, invalid};
use super::fields::{int_in, optional_path};
use super::raw::RawHealth;
use super::{DEFAULT_HEALTH_INTERVAL_MS, DEFAULT_HEALTH_TIMEOUT_MS};

/// How backends of a VIP are checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthCheckKind {
    /// Not checked: always healthy.
    None,
    /// A TCP connection to the backend's address and the check port must open.
    Tcp,
    /// `GET path` on the backend's address and the check port must answer `expect_status`;
    /// over HTTPS when `tls` is set.
    Http {
        path: String,
        expect_status: u16,
        tls: Option<HealthTls>,
    },
}

/// HTTPS checks: the backend's certificate must hold its address (an IP SAN) and be signed by
/// `ca` (PEM), or by one of the system's roots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthTls {
    pub ca: Option<std::path::PathBuf>,
}

/// Health checking of a VIP's backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    pub kind: HealthCheckKind,
    /// Port checked on each backend (default: the VIP's port).
    pub port: u16,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive successes that make an unhealthy backend healthy again.
    pub rise: u32,
    /// Consecutive failures that make a healthy backend unhealthy.
    pub fall: u32,
}

impl HealthConfig {
    pub(super) fn to_raw(&self) -> RawHealth {
        let (check, path, expect_status, ca) = match &self.kind {
            HealthCheckKind::None => ("none", None, None, None),
            HealthCheckKind::Tcp => ("tcp", None, None, None),
            HealthCheckKind::Http {
                path,
                expect_status,
                tls,
            } => (
                if tls.is_some() { "https" } else { "http" },
                Some(path.clone()),
                Some(i64::from(*expect_status)),
                tls.as_ref()
                    .and_then(|t| t.ca.as_ref())
                    .map(|p| p.display().to_string()),
            ),
        };
        RawHealth {
            check: Some(check.into()),
            ca,
            port: Some(self.port.into()),
            path,
            expect_status,
            interval_ms: Some(self.interval.as_millis() as i64),
            timeout_ms: Some(self.timeout.as_millis() as i64),
            rise: Some(self.rise.into()),
            fall: Some(self.fall.into()),
        }
    }
}

/// An HTTP(S) check: its path, the status it expects, and for HTTPS the CA to trust.
fn validate_http(
    raw: &RawHealth,
    https: bool,
    key: &dyn Fn(&str) -> String,
) -> Result<HealthCheckKind, ConfigError> {
    let path = raw.path.clone().unwrap_or_else(|| "/".into());
    if !path.starts_with('/') || path.contains(char::is_whitespace) || path.len() > 1024 {
        return Err(invalid(
            key("path"),
            format!("{path:?}"),
            "an HTTP path starts with '/' and has no spaces",
        ));
    }
    let expect_status = match raw.expect_status {
        Some(v) => int_in(v, 100, 599, &key("expect_status"))?,
        None => 200,
    };
    let ca = optional_path(raw.ca.clone(), &key("ca"))?;
    let tls = if https {
        Some(HealthTls { ca })
    } else if ca.is_some() {
        return Err(invalid(
            key("ca"),
            "(set)",
            "applies to check = \"https\" only",
        ));
    } else {
        None
    };
    Ok(HealthCheckKind::Http {
        path,
        expect_status,
        tls,
    })
}

pub(super) fn validate_health(
    raw: Option<RawHealth>,
    vip_port: u16,
    label: &str,
) -> Result<HealthConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let key = |k: &str| format!("{label}.health.{k}");
    let check = raw.check.clone().unwrap_or_else(|| "none".into());
    let kind = match check.as_str() {
        "none" => HealthCheckKind::None,
        "tcp" => HealthCheckKind::Tcp,
        "http" | "https" => validate_http(&raw, check == "https", &key)?,
        other => {
            return Err(invalid(
                key("check"),
                format!("{other:?}"),
                "expected \"none\", \"tcp\", \"http\" or \"https\"",
            ));
        }
    };
    if !matches!(kind, HealthCheckKind::Http { .. })
        && (raw.path.is_some() || raw.expect_status.is_some() || raw.ca.is_some())
    {
        return Err(invalid(
            key("check"),
            format!("{check:?}"),
            "path, expect_status and ca apply to check = \"http\" or \"https\" only",
        ));
    }
    let port = match raw.port {
        Some(0) | None => vip_port,
        Some(p) => int_in(p, 1, 65_535, &key("port"))?,
    };
    let interval: u64 = match raw.interval_ms {
        Some(v) => int_in(v, 10, 3_600_000, &key("interval_ms"))?,
        None => DEFAULT_HEALTH_INTERVAL_MS,
    };
    let timeout: u64 = match raw.timeout_ms {
        Some(v) => int_in(v, 1, 600_000, &key("timeout_ms"))?,
        None => (interval / 2).clamp(1, DEFAULT_HEALTH_TIMEOUT_MS),
    };
    if timeout > interval {
        return Err(invalid(
            key("timeout_ms"),
            timeout,
            format!("must not exceed interval_ms ({interval})"),
        ));
    }
    Ok(HealthConfig {
        kind,
        port,
        interval: Duration::from_millis(interval),
        timeout: Duration::from_millis(timeout),
        rise: match raw.rise {
            Some(v) => int_in(v, 1, 100, &key("rise"))?,
            None => 2,
        },
        fall: match raw.fall {
            Some(v) => int_in(v, 1, 100, &key("fall"))?,
            None => 3,
        },
    })
}
