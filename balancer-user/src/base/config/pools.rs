//! `[[vip.pool]]`: model pools, each a share of a VIP's backends that serves some models.

use std::time::Duration;

use super::backends::{BackendConfig, validate_backend};
use super::error::{ConfigError, invalid};
use super::fields::{int_in, required};
use super::raw::{RawBackend, RawPool};
use super::telemetry::{RawAccess, ScrapeAccess, validate_access};
use super::vip::{Discovery, valid_name};

/// Backends grouped for model routing: a VIP with `pool` and `model` gets the pool's backends
/// that serve the model (a backend serving several models joins several VIPs).
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    pub name: String,
    pub discovery: Discovery,
    /// Between discovery rounds.
    pub interval: Duration,
    /// How the discovery requests reach the backends (HTTP or HTTPS, certificates, a token).
    pub access: ScrapeAccess,
    pub backends: Vec<BackendConfig>,
}

/// Validates the `[[pool]]` tables (model routing).
pub(super) fn validate_pools(raw: Vec<RawPool>) -> Result<Vec<PoolConfig>, ConfigError> {
    let mut pools: Vec<PoolConfig> = Vec::new();
    for (i, p) in raw.into_iter().enumerate() {
        let key = |k: &str| format!("pool[{i}].{k}");
        let name = required(p.name.clone(), &key("name"))?;
        if !valid_name(&name) || pools.iter().any(|x| x.name == name) {
            return Err(invalid(
                key("name"),
                format!("{name:?}"),
                "a unique name of 1-64 letters, digits, '-', '_' or '.'",
            ));
        }
        let discovery = validate_discovery(&p, &key)?;
        let access = validate_access(
            RawAccess {
                scheme: p.scheme.clone(),
                ca: p.ca.clone(),
                cert: p.cert.clone(),
                key: p.key.clone(),
                bearer_token_file: p.bearer_token_file.clone(),
            },
            &format!("pool[{i}]"),
        )?;
        if let Some(set) = access.first_set()
            && discovery == Discovery::None
        {
            return Err(invalid(
                key(set),
                "(set)",
                "scheme, ca, cert, key and bearer_token_file apply to discover = \"models\" or \"metrics\" only",
            ));
        }
        let interval = Duration::from_millis(match p.interval_ms {
            Some(v) => int_in(v, 100, 3_600_000, &key("interval_ms"))?,
            None => 2000,
        });
        let backends = validate_pool_backends(p.backend, i)?;
        pools.push(PoolConfig {
            name,
            discovery,
            interval,
            access,
            backends,
        });
    }
    Ok(pools)
}

/// How a pool's models are discovered: from a backend's `/v1/models`, from its metrics
/// page, or not at all.
fn validate_discovery(p: &RawPool, key: &dyn Fn(&str) -> String) -> Result<Discovery, ConfigError> {
    let port = |default: u16| -> Result<u16, ConfigError> {
        p.port
            .map_or(Ok(default), |v| int_in(v, 1, 65_535, &key("port")))
    };
    let path = |default: &str| -> Result<String, ConfigError> {
        let path = p.path.clone().unwrap_or_else(|| default.to_string());
        if !path.starts_with('/') || path.contains(char::is_whitespace) {
            return Err(invalid(
                key("path"),
                format!("{path:?}"),
                "an HTTP path starts with '/' and has no spaces",
            ));
        }
        Ok(path)
    };
    Ok(match p.discover.as_deref().unwrap_or("none") {
        "none" => Discovery::None,
        "models" => Discovery::Models {
            port: port(8000)?,
            path: path("/v1/models")?,
        },
        "metrics" => Discovery::Metrics {
            port: port(8000)?,
            path: path("/metrics")?,
        },
        other => {
            return Err(invalid(
                key("discover"),
                format!("{other:?}"),
                "expected \"none\", \"models\" or \"metrics\"",
            ));
        }
    })
}

/// A pool's backends: each valid, each once, none with a tier.
fn validate_pool_backends(
    raw: Vec<RawBackend>,
    i: usize,
) -> Result<Vec<BackendConfig>, ConfigError> {
    let mut backends: Vec<BackendConfig> = Vec::new();
    for (j, b) in raw.into_iter().enumerate() {
        let label = format!("pool[{i}].backend[{j}]");
        let b = validate_backend(b, &label)?;
        if b.tier.is_some() {
            return Err(invalid(
                format!("{label}.tier"),
                "(set)",
                "tiers are set on a VIP's own backends, not in pools",
            ));
        }
        if backends.iter().any(|x| x.address == b.address) {
            return Err(invalid(
                format!("{label}.address"),
                format!("{:?}", b.address.to_string()),
                "listed twice in the pool",
            ));
        }
        backends.push(b);
    }
    Ok(backends)
}

impl PoolConfig {
    pub(super) fn to_raw(&self) -> RawPool {
        let (discover, port, path) = match &self.discovery {
            Discovery::None => ("none", None, None),
            Discovery::Models { port, path } => {
                ("models", Some(i64::from(*port)), Some(path.clone()))
            }
            Discovery::Metrics { port, path } => {
                ("metrics", Some(i64::from(*port)), Some(path.clone()))
            }
        };
        let access = self.access.to_raw();
        RawPool {
            name: Some(self.name.clone()),
            discover: Some(discover.into()),
            port,
            path,
            interval_ms: Some(self.interval.as_millis() as i64),
            scheme: access.scheme,
            ca: access.ca,
            cert: access.cert,
            key: access.key,
            bearer_token_file: access.bearer_token_file,
            backend: self.backends.iter().map(BackendConfig::to_raw).collect(),
        }
    }
}
