//! A VIP's `telemetry` (where backend reports come from) and `policy` (how they become
//! weights) tables.

use std::path::PathBuf;
use std::time::Duration;

use super::policy::{Factors, MAX_POLICY_WEIGHT, PolicyConfig, PolicyKind, StaleMode};

/// Default half-life of the recent window of a [`DecayedRatio`](crate::steering::telemetry::store::DecayedRatio) (a VIP's
/// `telemetry.derived_half_life_ms`), whatever the scrape interval: two scrapes at the fastest
/// interval, the last interval's requests alone at slower ones. A prefill time measured under
/// the current batch is news, not noise, so the figure follows the latest requests.
pub const RECENT_HALF_LIFE: Duration = Duration::from_millis(200);

use super::error::{ConfigError, invalid};
use super::fields::{cert_and_key, float_in, int_in, optional_path, required};
use super::raw::{RawPolicy, RawTelemetry};
use super::{
    DEFAULT_MAX_SCRAPE_INTERVAL_MS, DEFAULT_REQUESTS_PER_SCRAPE, DEFAULT_SCRAPE_INTERVAL_MS,
};

impl TelemetryConfig {
    /// The longest a scrape waits for the next: `max_interval` when the requests pace the
    /// scrapes, else `interval`.
    pub fn slowest(&self) -> Duration {
        if self.requests_per_scrape == 0 {
            self.interval
        } else {
            self.max_interval.max(self.interval)
        }
    }

    /// Whether the VIP's requests pace its scrapes ([`crate::steering::telemetry::pace`]): scraped pages,
    /// requests per scrape set, and a slowest interval above the fastest.
    pub fn paced(&self) -> bool {
        matches!(self.source, TelemetrySource::Scrape(_))
            && self.requests_per_scrape > 0
            && self.slowest() > self.interval
    }
}

/// Where a VIP's backends report their load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TelemetrySource {
    /// No reports.
    None,
    /// Metrics pages scraped from each backend: `(port, path)` pairs (an inference server's
    /// page, a GPU exporter's).
    Scrape(Vec<(u16, String)>),
    /// Reports pushed to the API (`balancer report --push`).
    Push,
}

/// Telemetry of a VIP's backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelemetryConfig {
    pub source: TelemetrySource,
    /// The fastest scrapes (and weight rounds) follow each other; pushed reports' rounds run
    /// at this interval.
    pub interval: Duration,
    /// The slowest: how long a scrape waits while the VIP takes few requests.
    pub max_interval: Duration,
    /// Requests per backend between two scrapes, which paces them between `interval` and
    /// `max_interval` ([`crate::steering::telemetry::pace`]); 0: every `interval`.
    pub requests_per_scrape: u32,
    /// Per scrape.
    pub timeout: Duration,
    /// Largest page accepted.
    pub max_body: usize,
    /// Half-life of the recent window of the figures derived from counter pairs (see
    /// [`DecayedRatio`](crate::steering::telemetry::store::DecayedRatio)); default
    /// [`RECENT_HALF_LIFE`] at any interval.
    pub derived_half_life: Duration,
    /// How the pages are reached: HTTP or HTTPS, certificates, a token.
    pub access: ScrapeAccess,
}

/// How a VIP's metrics pages are fetched. A backend's certificate is checked against its
/// address (it must hold it as an IP SAN).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScrapeAccess {
    pub https: bool,
    /// The CA (PEM) of the backends' certificates; None: the system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate and key (PEM).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// A file holding the bearer token of every scrape (read when the client is made).
    pub bearer_token_file: Option<PathBuf>,
}

/// The access settings as written: `scheme`, `ca`, `cert`, `key`, `bearer_token_file`.
#[derive(Default)]
pub(super) struct RawAccess {
    pub scheme: Option<String>,
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub bearer_token_file: Option<String>,
}

/// Validates access settings; `prefix` names their table (`vip[0].telemetry`, `pool[1]`).
pub(super) fn validate_access(raw: RawAccess, prefix: &str) -> Result<ScrapeAccess, ConfigError> {
    let key = |k: &str| format!("{prefix}.{k}");
    let https = match raw.scheme.as_deref().unwrap_or("http") {
        "http" => false,
        "https" => true,
        other => {
            return Err(invalid(
                key("scheme"),
                format!("{other:?}"),
                "expected \"http\" or \"https\"",
            ));
        }
    };
    let ca = optional_path(raw.ca, &key("ca"))?;
    let cert = optional_path(raw.cert, &key("cert"))?;
    let tls_key = optional_path(raw.key, &key("key"))?;
    if !https {
        for (k, v) in [("ca", &ca), ("cert", &cert), ("key", &tls_key)] {
            if v.is_some() {
                return Err(invalid(
                    key(k),
                    "(set)",
                    "applies to scheme = \"https\" only",
                ));
            }
        }
    }
    let identity = cert_and_key(cert, tls_key, &key("cert"), &key("key"))?;
    let bearer_token_file = optional_path(raw.bearer_token_file, &key("bearer_token_file"))?;
    Ok(ScrapeAccess {
        https,
        ca,
        identity,
        bearer_token_file,
    })
}

impl ScrapeAccess {
    /// The first setting that differs from plain HTTP without a token, if any (`ca`, `cert`
    /// and `key` come only with `scheme = "https"`).
    pub(super) fn first_set(&self) -> Option<&'static str> {
        if self.https {
            Some("scheme")
        } else if self.bearer_token_file.is_some() {
            Some("bearer_token_file")
        } else {
            None
        }
    }

    pub(super) fn to_raw(&self) -> RawAccess {
        let path = |p: &std::path::PathBuf| p.display().to_string();
        RawAccess {
            scheme: self.https.then(|| "https".into()),
            ca: self.ca.as_ref().map(path),
            cert: self.identity.as_ref().map(|(c, _)| path(c)),
            key: self.identity.as_ref().map(|(_, k)| path(k)),
            bearer_token_file: self.bearer_token_file.as_ref().map(path),
        }
    }
}

pub(super) fn validate_telemetry(
    raw: Option<RawTelemetry>,
    label: &str,
) -> Result<TelemetryConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let key = |k: &str| format!("{label}.telemetry.{k}");
    let Intervals {
        interval,
        max_interval,
        requests_per_scrape,
        timeout,
    } = validate_intervals(&raw, &key)?;
    let max_body = match raw.max_body_kib {
        Some(v) => int_in::<usize>(v, 1, 64 * 1024, &key("max_body_kib"))? * 1024,
        None => 4 * 1024 * 1024,
    };
    let derived_half_life: u64 = match raw.derived_half_life_ms {
        Some(v) => int_in(v, 10, 3_600_000, &key("derived_half_life_ms"))?,
        None => RECENT_HALF_LIFE.as_millis() as u64,
    };
    let source = validate_source(&raw, &key)?;
    if !matches!(source, TelemetrySource::Scrape(_))
        && (raw.port.is_some() || !raw.extra.is_empty())
    {
        return Err(invalid(
            key("port"),
            format!("{:?}", raw.port),
            "port and extra apply to source = \"scrape\" only",
        ));
    }
    let access = validate_access(
        RawAccess {
            scheme: raw.scheme.clone(),
            ca: raw.ca.clone(),
            cert: raw.cert.clone(),
            key: raw.key.clone(),
            bearer_token_file: raw.bearer_token_file.clone(),
        },
        &format!("{label}.telemetry"),
    )?;
    if let Some(set) = access.first_set()
        && !matches!(source, TelemetrySource::Scrape(_))
    {
        return Err(invalid(
            key(set),
            "(set)",
            "scheme, ca, cert, key and bearer_token_file apply to source = \"scrape\" only",
        ));
    }
    Ok(TelemetryConfig {
        source,
        interval: Duration::from_millis(interval),
        max_interval: Duration::from_millis(max_interval),
        requests_per_scrape,
        timeout: Duration::from_millis(timeout),
        max_body,
        derived_half_life: Duration::from_millis(derived_half_life),
        access,
    })
}

/// A VIP's scrape intervals (ms): fixed or paced by its requests, and the timeout of one
/// scrape.
struct Intervals {
    interval: u64,
    max_interval: u64,
    requests_per_scrape: u32,
    timeout: u64,
}

fn validate_intervals(
    raw: &RawTelemetry,
    key: &dyn Fn(&str) -> String,
) -> Result<Intervals, ConfigError> {
    let interval: u64 = match raw.interval_ms {
        Some(v) => int_in(v, 10, 60_000, &key("interval_ms"))?,
        None => DEFAULT_SCRAPE_INTERVAL_MS,
    };
    let max_interval: u64 = match raw.max_interval_ms {
        Some(v) => int_in(v, 10, 600_000, &key("max_interval_ms"))?,
        None => interval.max(DEFAULT_MAX_SCRAPE_INTERVAL_MS),
    };
    if max_interval < interval {
        return Err(invalid(
            key("max_interval_ms"),
            max_interval,
            format!("must not be below interval_ms ({interval})"),
        ));
    }
    let requests_per_scrape: u32 = match raw.requests_per_scrape {
        Some(v) => int_in(v, 0, 1_000_000, &key("requests_per_scrape"))?,
        None => DEFAULT_REQUESTS_PER_SCRAPE,
    };
    let timeout: u64 = match raw.timeout_ms {
        Some(v) => int_in(v, 1, 60_000, &key("timeout_ms"))?,
        None => (interval * 8 / 10).max(1),
    };
    if timeout > interval {
        return Err(invalid(
            key("timeout_ms"),
            timeout,
            format!("must not exceed interval_ms ({interval})"),
        ));
    }
    Ok(Intervals {
        interval,
        max_interval,
        requests_per_scrape,
        timeout,
    })
}

/// Where a VIP's reports come from; a scrape's pages (`port`/`path`, then each `extra`).
fn validate_source(
    raw: &RawTelemetry,
    key: &dyn Fn(&str) -> String,
) -> Result<TelemetrySource, ConfigError> {
    let source = match raw.source.as_deref().unwrap_or("none") {
        "none" => TelemetrySource::None,
        "push" => TelemetrySource::Push,
        "scrape" => {
            let port: u16 = int_in(required(raw.port, &key("port"))?, 1, 65_535, &key("port"))?;
            let path = raw.path.clone().unwrap_or_else(|| "/metrics".into());
            if !path.starts_with('/') || path.contains(char::is_whitespace) {
                return Err(invalid(
                    key("path"),
                    format!("{path:?}"),
                    "an HTTP path starts with '/' and has no spaces",
                ));
            }
            let mut pages = vec![(port, path)];
            for (i, e) in raw.extra.iter().enumerate() {
                let k = format!("{}[{i}]", key("extra"));
                let (p, path) = e.split_once('/').ok_or_else(|| {
                    invalid(
                        &k,
                        format!("{e:?}"),
                        "expected \"port/path\", e.g. \"9400/metrics\"",
                    )
                })?;
                let p: u16 = p
                    .parse()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| invalid(&k, format!("{e:?}"), "the port is not 1-65535"))?;
                pages.push((p, format!("/{path}")));
            }
            TelemetrySource::Scrape(pages)
        }
        other => {
            return Err(invalid(
                key("source"),
                format!("{other:?}"),
                "expected \"none\", \"scrape\" or \"push\"",
            ));
        }
    };
    Ok(source)
}

pub(super) fn telemetry_to_raw(t: &TelemetryConfig) -> RawTelemetry {
    let (source, port, path, extra) = match &t.source {
        TelemetrySource::None => ("none", None, None, Vec::new()),
        TelemetrySource::Push => ("push", None, None, Vec::new()),
        TelemetrySource::Scrape(pages) => (
            "scrape",
            Some(i64::from(pages[0].0)),
            Some(pages[0].1.clone()),
            pages[1..]
                .iter()
                .map(|(p, path)| format!("{p}{path}"))
                .collect(),
        ),
    };
    let access = t.access.to_raw();
    RawTelemetry {
        source: Some(source.into()),
        port,
        path,
        extra,
        interval_ms: Some(t.interval.as_millis() as i64),
        max_interval_ms: Some(t.max_interval.as_millis() as i64),
        requests_per_scrape: Some(i64::from(t.requests_per_scrape)),
        timeout_ms: Some(t.timeout.as_millis() as i64),
        max_body_kib: Some((t.max_body / 1024) as i64),
        derived_half_life_ms: Some(t.derived_half_life.as_millis() as i64),
        scheme: access.scheme,
        ca: access.ca,
        cert: access.cert,
        key: access.key,
        bearer_token_file: access.bearer_token_file,
    }
}

/// The policy of a VIP whose backends report through `telemetry` (a scrape's slowest interval
/// sets the default `stale_after`: three scrapes, at least the second of [`PolicyConfig`]'s
/// default, so a report is not stale just because the next scrape has not come yet; one set
/// below that interval is refused).
pub(super) fn validate_policy(
    raw: Option<RawPolicy>,
    telemetry: &TelemetryConfig,
    label: &str,
) -> Result<PolicyConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let key = |k: &str| format!("{label}.policy.{k}");
    let d = PolicyConfig::default();
    let kind = match raw.kind.as_deref() {
        None => PolicyKind::Static,
        Some(k) => PolicyKind::parse(k).ok_or_else(|| {
            invalid(
                key("kind"),
                format!("{k:?}"),
                "expected static, least-conn, least-latency, gpu, tokens or composite",
            )
        })?,
    };
    let factors = validate_factors(&raw, &key)?;
    let unit = |v: Option<f64>, default: f64, min: f64, k: &str| -> Result<f64, ConfigError> {
        v.map(|v| float_in(v, min, 1.0, &key(k)))
            .transpose()
            .map(|v| v.unwrap_or(default))
    };
    if raw.fresher_load == Some(true) {
        return Err(invalid(
            key("fresher_load"),
            "true",
            "was removed: it measured no better than the composite policy alone; delete the line",
        ));
    }
    Ok(PolicyConfig {
        kind,
        factors,
        ewma_alpha: unit(raw.ewma_alpha, d.ewma_alpha, 0.01, "ewma_alpha")?,
        hysteresis: unit(raw.hysteresis, d.hysteresis, 0.0, "hysteresis")?,
        floor: unit(raw.floor, d.floor, 0.0, "floor")?,
        kv_saturation: unit(raw.kv_saturation, d.kv_saturation, 0.01, "kv_saturation")?,
        queue_saturation: match raw.queue_saturation {
            Some(v) => int_in(v, 0, 1_000_000, &key("queue_saturation"))?,
            None => d.queue_saturation,
        },
        min_free_gpu_memory_bytes: match raw.min_free_gpu_memory_mib {
            Some(v) => {
                int_in::<i64>(v, 0, 1 << 30, &key("min_free_gpu_memory_mib"))? as f64 * 1048576.0
            }
            None => d.min_free_gpu_memory_bytes,
        },
        stale_after: validate_stale_after(raw.stale_after_ms, telemetry, &key("stale_after_ms"))?,
        stale: match raw.stale.as_deref() {
            None | Some("saturated") => StaleMode::Saturated,
            Some("keep") => StaleMode::Keep,
            Some(other) => {
                return Err(invalid(
                    key("stale"),
                    format!("{other:?}"),
                    "expected \"saturated\" or \"keep\"",
                ));
            }
        },
        quantum: match raw.quantum {
            Some(v) => int_in(v, 1, i64::from(MAX_POLICY_WEIGHT), &key("quantum"))?,
            None => d.quantum,
        },
        max_ratio: match raw.max_ratio {
            Some(v) => float_in(v, 1.0, 1000.0, &key("max_ratio"))?,
            None => d.max_ratio,
        },
        max_share: match raw.max_share {
            Some(v) => float_in(v, 1.0, 1000.0, &key("max_share"))?,
            None => d.max_share,
        },
    })
}

/// The composite policy's factors, each 0..=1000.
fn validate_factors(raw: &RawPolicy, key: &dyn Fn(&str) -> String) -> Result<Factors, ConfigError> {
    let d = Factors::default();
    let factor = |v: Option<f64>, default: f64, k: &str| -> Result<f64, ConfigError> {
        v.map(|v| float_in(v, 0.0, 1000.0, &key(k)))
            .transpose()
            .map(|v| v.unwrap_or(default))
    };
    Ok(Factors {
        delay: factor(raw.delay_factor, d.delay, "delay_factor")?,
        kv: factor(raw.kv_factor, d.kv, "kv_factor")?,
        gpu_memory: factor(raw.gpu_memory_factor, d.gpu_memory, "gpu_memory_factor")?,
        queue: factor(raw.queue_factor, d.queue, "queue_factor")?,
        tokens: factor(raw.tokens_factor, d.tokens, "tokens_factor")?,
        connections: factor(raw.connections_factor, d.connections, "connections_factor")?,
        ttft: factor(raw.ttft_factor, d.ttft, "ttft_factor")?,
    })
}

/// How old a report may be before it counts as stale: at least the slowest scrape interval
/// when set; by default three of them, at least [`PolicyConfig`]'s default.
fn validate_stale_after(
    raw: Option<i64>,
    telemetry: &TelemetryConfig,
    key: &str,
) -> Result<Duration, ConfigError> {
    let default = PolicyConfig::default().stale_after;
    let Some(v) = raw else {
        return Ok(match telemetry.source {
            TelemetrySource::Scrape(_) => default.max(3 * telemetry.slowest()),
            TelemetrySource::None | TelemetrySource::Push => default,
        });
    };
    let ms: u64 = int_in(v, 1, 3_600_000, key)?;
    let slowest = telemetry.slowest().as_millis() as u64;
    if matches!(telemetry.source, TelemetrySource::Scrape(_)) && ms < slowest {
        let which = if telemetry.requests_per_scrape == 0 {
            "interval_ms"
        } else {
            "max_interval_ms"
        };
        return Err(invalid(
            key,
            ms,
            format!(
                "must be at least the slowest scrape interval ({slowest} ms, \
                 telemetry.{which}): a quiet VIP's reports would go stale between \
                 two scrapes"
            ),
        ));
    }
    Ok(Duration::from_millis(ms))
}

pub(super) fn policy_to_raw(p: &PolicyConfig) -> RawPolicy {
    RawPolicy {
        kind: Some(p.kind.name().into()),
        delay_factor: Some(p.factors.delay),
        kv_factor: Some(p.factors.kv),
        gpu_memory_factor: Some(p.factors.gpu_memory),
        queue_factor: Some(p.factors.queue),
        tokens_factor: Some(p.factors.tokens),
        connections_factor: Some(p.factors.connections),
        ttft_factor: Some(p.factors.ttft),
        ewma_alpha: Some(p.ewma_alpha),
        hysteresis: Some(p.hysteresis),
        floor: Some(p.floor),
        kv_saturation: Some(p.kv_saturation),
        queue_saturation: Some(i64::from(p.queue_saturation)),
        min_free_gpu_memory_mib: Some((p.min_free_gpu_memory_bytes / 1048576.0) as i64),
        stale_after_ms: Some(p.stale_after.as_millis() as i64),
        stale: Some(match p.stale {
            StaleMode::Saturated => "saturated".into(),
            StaleMode::Keep => "keep".into(),
        }),
        quantum: Some(i64::from(p.quantum)),
        fresher_load: None,
        max_ratio: Some(p.max_ratio),
        max_share: Some(p.max_share),
    }
}
