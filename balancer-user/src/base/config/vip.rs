//! `[[vip]]`: a virtual service (address, port, protocol, forwarding, scheduler) and its
//! backends, validated one by one and as a set.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use balancer_common::maglev::is_prime;
use balancer_common::maps::{
    DEFAULT_TABLE_SIZE, MAX_BACKENDS, MAX_TABLE_SIZE, MAX_VIPS, Scheduler, SourcePrefix,
};

use super::policy::PolicyConfig;
use crate::base::net::{Prefix, Protocol};

use super::DEFAULT_GUE_PORT;
use super::admission::{AdmissionConfig, validate_admission};
use super::backends::{BackendConfig, validate_backends};
use super::error::{ConfigError, invalid};
use super::fields::{float_in, int_in, parse_field, parse_ip, required};
use super::health::{HealthConfig, validate_health};
use super::nat::{NatSource, validate_nat_source};
use super::raw::RawVip;
use super::telemetry::{
    TelemetryConfig, TelemetrySource, policy_to_raw, telemetry_to_raw, validate_policy,
    validate_telemetry,
};

/// How a VIP's packets reach the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forwarding {
    /// Rewrite MAC addresses; backends share the link and hold the VIP (LVS-DR style).
    L2Dsr,
    /// IP-in-IP; backends decapsulate (`balancer decap`) and hold the VIP.
    Ipip,
    /// IP-in-UDP (GUE variant 1); backends decapsulate and hold the VIP.
    Gue,
    /// Destination NAT: the backend's address replaces the VIP's; backends need nothing, but
    /// must route their replies to clients through the balancer (their gateway).
    Nat,
}

impl fmt::Display for Forwarding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Forwarding::L2Dsr => "l2-dsr",
            Forwarding::Ipip => "ipip",
            Forwarding::Gue => "gue",
            Forwarding::Nat => "nat",
        })
    }
}

impl FromStr for Forwarding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "l2-dsr" => Ok(Forwarding::L2Dsr),
            "ipip" => Ok(Forwarding::Ipip),
            "gue" => Ok(Forwarding::Gue),
            "nat" => Ok(Forwarding::Nat),
            _ => Err("expected \"l2-dsr\", \"ipip\", \"gue\" or \"nat\"".into()),
        }
    }
}

/// How a pool learns which models its backends serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// Not at all: every backend of the pool joins every VIP that uses the pool.
    None,
    /// `GET http://BACKEND:port/path` in the OpenAI format (`{"data": [{"id": MODEL}]}`).
    Models { port: u16, path: String },
    /// The `model_name` labels of the backend's Prometheus page (vLLM, SGLang).
    Metrics { port: u16, path: String },
}

/// One virtual service.
#[derive(Clone, Debug, PartialEq)]
pub struct VipConfig {
    pub name: String,
    pub address: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub forwarding: Forwarding,
    /// Outer UDP destination port (gue only).
    pub gue_port: u16,
    /// Source NAT (nat only): flows leave from this address, so backends reply to us.
    pub nat_source: Option<NatSource>,
    /// Maglev table size (prime).
    pub table_size: u32,
    pub health: HealthConfig,
    pub telemetry: TelemetryConfig,
    pub policy: PolicyConfig,
    /// How new flows pick a backend (in the data plane).
    pub scheduler: Scheduler,
    /// Session persistence: a client's new flows go to its previous backend while it returns
    /// within this time. Zero = off.
    pub persistence: Duration,
    /// Bounded load: a backend over `(100 + this)`% of its weighted share of the VIP's active
    /// flows takes no new clients by hash or persistence. 0 = no bound.
    pub load_bound_pct: u8,
    /// Tenant affinity: the source prefix lengths source hash and session persistence key on
    /// (whole addresses by default), so every client of one network lands on one backend.
    pub affinity_prefix: SourcePrefix,
    /// Admission control while the pool is saturated (`None`: every new flow is admitted).
    pub admission: Option<AdmissionConfig>,
    /// Model routing (see [`PoolConfig`]).
    pub pool: Option<String>,
    pub model: Option<String>,
    pub backends: Vec<BackendConfig>,
    /// The service (a `[[vip]]` block of several endpoints) this VIP is one endpoint of.
    pub service: Option<String>,
}

impl VipConfig {
    /// Session persistence in flow-clock ticks (rounded up; 0 = off).
    pub fn persistence_ticks(&self) -> u16 {
        let ns = self.persistence.as_nanos();
        if ns == 0 {
            return 0;
        }
        ns.div_ceil(u128::from(balancer_common::flow_cache::TICK_NS))
            .clamp(1, u128::from(u16::MAX)) as u16
    }

    /// The (address, port, protocol) that identifies the VIP.
    pub fn endpoint(&self) -> (IpAddr, u16, Protocol) {
        (self.address, self.port, self.protocol)
    }

    /// The backend with this address.
    pub fn backend(&self, address: IpAddr) -> Option<&BackendConfig> {
        self.backends.iter().find(|b| b.address == address)
    }
}

impl VipConfig {
    /// The VIP in its file form.
    pub fn to_raw(&self) -> RawVip {
        RawVip {
            name: Some(self.name.clone()),
            address: Some(self.address.to_string()),
            port: Some(self.port.into()),
            protocol: Some(self.protocol.to_string()),
            forwarding: Some(self.forwarding.to_string()),
            gue_port: Some(self.gue_port.into()),
            nat_source: self
                .nat_source
                .as_ref()
                .map(NatSource::to_raw)
                .unwrap_or_default(),
            table_size: Some(self.table_size.into()),
            health: Some(self.health.to_raw()),
            telemetry: Some(telemetry_to_raw(&self.telemetry)),
            policy: Some(policy_to_raw(&self.policy)),
            scheduler: Some(self.scheduler.name().to_string()),
            persistence_secs: Some(self.persistence.as_secs() as i64),
            max_load_factor: (self.load_bound_pct > 0)
                .then(|| 1.0 + f64::from(self.load_bound_pct) / 100.0),
            affinity_prefix_v4: (self.affinity_prefix.v4 != SourcePrefix::WHOLE.v4)
                .then_some(i64::from(self.affinity_prefix.v4)),
            affinity_prefix_v6: (self.affinity_prefix.v6 != SourcePrefix::WHOLE.v6)
                .then_some(i64::from(self.affinity_prefix.v6)),
            admission: self.admission.as_ref().map(AdmissionConfig::to_raw),
            pool: self.pool.clone(),
            model: self.model.clone(),
            addresses: Vec::new(),
            ports: Vec::new(),
            protocols: Vec::new(),
            service: self.service.clone(),
            // Backends joined from a pool are the pool's, not the VIP's.
            backend: self
                .backends
                .iter()
                .filter(|b| b.from_pool.is_none())
                .map(BackendConfig::to_raw)
                .collect(),
        }
    }
}

/// Checks what only the whole set of VIPs can tell: endpoints and names unique, backends
/// within capacity.
pub fn check_vip_set(vips: &[VipConfig]) -> Result<(), ConfigError> {
    let mut endpoints = HashSet::new();
    let mut names = HashSet::new();
    let mut total_backends = 0usize;
    for (i, vip) in vips.iter().enumerate() {
        if !endpoints.insert(vip.endpoint()) {
            return Err(invalid(
                format!("vip[{i}]"),
                format!(
                    "{}/{}",
                    std::net::SocketAddr::new(vip.address, vip.port),
                    vip.protocol
                ),
                "the same address, port and protocol appear in an earlier VIP",
            ));
        }
        if !names.insert(vip.name.clone()) {
            return Err(invalid(
                format!("vip[{i}].name"),
                format!("{:?}", vip.name),
                "an earlier VIP has this name",
            ));
        }
        total_backends += vip.backends.len();
    }
    if vips.len() > MAX_VIPS as usize {
        return Err(invalid(
            "vip",
            format!("{} entries", vips.len()),
            format!("at most {MAX_VIPS} VIPs are supported"),
        ));
    }
    if total_backends > MAX_BACKENDS as usize {
        return Err(invalid(
            "vip[].backend",
            format!("{total_backends} entries"),
            format!("at most {MAX_BACKENDS} backends over all VIPs are supported"),
        ));
    }
    Ok(())
}

pub(super) fn parse_source(text: &str, key: &str, v4: bool) -> Result<Prefix, ConfigError> {
    let prefix: Prefix = parse_field(text, key)?;
    match prefix.addr {
        IpAddr::V4(_) if v4 => Ok(prefix),
        IpAddr::V6(_) if !v4 && prefix.len >= 96 => Ok(prefix),
        IpAddr::V6(_) if !v4 => Err(invalid(
            key,
            format!("{text:?}"),
            "at most the last 32 bits take entropy: use a prefix length of 96 or more",
        )),
        _ => Err(invalid(
            key,
            format!("{text:?}"),
            if v4 {
                "expected an IPv4 address or prefix"
            } else {
                "expected an IPv6 address or prefix"
            },
        )),
    }
}

/// Validates one VIP; `label` prefixes the keys in errors (e.g. `vip[3]`).
pub fn validate_vip(raw: RawVip, label: &str) -> Result<VipConfig, ConfigError> {
    let key = |k: &str| format!("{label}.{k}");
    if super::service::is_service(&raw) {
        return Err(invalid(
            label,
            format!("{:?}", raw.name.as_deref().unwrap_or_default()),
            "lists several addresses, ports or protocols: expand the service first",
        ));
    }
    let address = validate_address(raw.address, &key("address"))?;
    let port: u16 = int_in(required(raw.port, &key("port"))?, 1, 65_535, &key("port"))?;
    let protocol = match raw.protocol {
        Some(p) => parse_field(&p, &key("protocol"))?,
        None => Protocol::Tcp,
    };
    let forwarding = match raw.forwarding {
        Some(f) => parse_field(&f, &key("forwarding"))?,
        None => Forwarding::L2Dsr,
    };
    let gue_port = match raw.gue_port {
        Some(p) => int_in(p, 1, 65_535, &key("gue_port"))?,
        None => DEFAULT_GUE_PORT,
    };
    let nat_source = validate_nat_source(raw.nat_source, forwarding, address, label)?;
    let table_size = validate_table_size(raw.table_size, &key("table_size"))?;
    let name = match raw.name {
        Some(n) => checked_name(n, &key("name"))?,
        None => format!("{protocol}-{address}-{port}"),
    };
    let health = validate_health(raw.health, port, label)?;
    let telemetry = validate_telemetry(raw.telemetry, label)?;
    let policy = validate_policy(raw.policy, &telemetry, label)?;
    reports_for_policy(&policy, &telemetry, label)?;
    let scheduler = validate_scheduler(raw.scheduler.as_deref(), &key("scheduler"))?;
    let persistence = match raw.persistence_secs {
        Some(v) => Duration::from_secs(int_in(v, 0, 65_535, &key("persistence_secs"))?),
        None => Duration::ZERO,
    };
    let load_bound_pct = validate_load_bound(
        raw.max_load_factor,
        scheduler,
        persistence,
        &key("max_load_factor"),
    )?;
    let affinity_prefix = validate_affinity_prefix(
        [raw.affinity_prefix_v4, raw.affinity_prefix_v6],
        scheduler,
        persistence,
        &key,
    )?;
    let admission = raw
        .admission
        .map(|a| validate_admission(a, &key))
        .transpose()?;
    if admission.is_some() {
        needs_reports_for_admission(&policy, label)?;
    }
    let backends = validate_backends(raw.backend, forwarding, address, label)?;
    if backends.len() >= table_size as usize {
        return Err(invalid(
            key("table_size"),
            table_size,
            format!("must exceed the number of backends ({})", backends.len()),
        ));
    }
    Ok(VipConfig {
        name,
        address,
        port,
        protocol,
        forwarding,
        gue_port,
        nat_source,
        table_size,
        health,
        telemetry,
        policy,
        scheduler,
        persistence,
        load_bound_pct,
        affinity_prefix,
        admission,
        pool: raw.pool,
        model: raw.model,
        backends,
        service: raw.service,
    })
}

/// A name given in the config: 1-64 letters, digits, '-', '_' or '.'.
fn checked_name(name: String, key: &str) -> Result<String, ConfigError> {
    if !valid_name(&name) {
        return Err(invalid(
            key,
            format!("{name:?}"),
            "a name is 1-64 letters, digits, '-', '_' or '.'",
        ));
    }
    Ok(name)
}

/// A policy that reads backend reports needs a telemetry source.
fn reports_for_policy(
    policy: &PolicyConfig,
    telemetry: &TelemetryConfig,
    label: &str,
) -> Result<(), ConfigError> {
    if policy.kind.needs_reports() && telemetry.source == TelemetrySource::None {
        return Err(invalid(
            format!("{label}.policy.kind"),
            format!("{:?}", policy.kind.name()),
            "this policy needs backend reports: set telemetry.source to \"scrape\" or \"push\"",
        ));
    }
    Ok(())
}

/// Admission control needs a policy that reads backend reports (saturation comes from them).
fn needs_reports_for_admission(policy: &PolicyConfig, label: &str) -> Result<(), ConfigError> {
    if !policy.kind.needs_reports() {
        return Err(invalid(
            format!("{label}.admission"),
            "(set)",
            format!(
                "saturation comes from backend reports, which the {:?} policy does not read: use gpu, tokens, least-latency or composite",
                policy.kind.name()
            ),
        ));
    }
    Ok(())
}

/// A VIP's address: unicast, not loopback.
fn validate_address(raw: Option<String>, key: &str) -> Result<IpAddr, ConfigError> {
    let text = required(raw, key)?;
    let address = parse_ip(&text, key)?;
    if address.is_unspecified() || address.is_multicast() || address.is_loopback() {
        return Err(invalid(
            key,
            format!("{text:?}"),
            "a VIP must be a unicast, non-loopback address",
        ));
    }
    Ok(address)
}

/// A Maglev table's size: a prime of 2..=`MAX_TABLE_SIZE`.
fn validate_table_size(raw: Option<i64>, key: &str) -> Result<u32, ConfigError> {
    let size: u32 = match raw {
        Some(v) => int_in(v, 2, MAX_TABLE_SIZE.into(), key)?,
        None => DEFAULT_TABLE_SIZE,
    };
    if !is_prime(size) {
        return Err(invalid(
            key,
            size,
            "must be a prime number (e.g. 65537 or 655373)",
        ));
    }
    Ok(size)
}

/// A scheduler by name (Maglev when unset).
fn validate_scheduler(raw: Option<&str>, key: &str) -> Result<Scheduler, ConfigError> {
    let Some(name) = raw else {
        return Ok(Scheduler::Maglev);
    };
    Scheduler::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = Scheduler::ALL.iter().map(|s| s.name()).collect();
            invalid(
                key,
                format!("{name:?}"),
                format!("expected one of {}", names.join(", ")),
            )
        })
}

/// `max_load_factor` as the percentage over 1 the data plane reads (0: no bound); only for
/// the hashing schedulers and session persistence.
fn validate_load_bound(
    raw: Option<f64>,
    scheduler: Scheduler,
    persistence: Duration,
    key: &str,
) -> Result<u8, ConfigError> {
    let Some(f) = raw else { return Ok(0) };
    let f = float_in(f, 1.01, 3.55, key)?;
    let hashed = matches!(scheduler, Scheduler::Maglev | Scheduler::SourceHash);
    if !hashed && persistence.is_zero() {
        return Err(invalid(
            key,
            f,
            "bounds the load of the hashing schedulers (maglev, source-hash) and of session persistence",
        ));
    }
    Ok(((f - 1.0) * 100.0).round().clamp(1.0, 255.0) as u8)
}

/// The source prefix lengths of tenant affinity: each within its family's address length, and
/// only where something keys on the source (source hash, session persistence).
fn validate_affinity_prefix(
    [v4, v6]: [Option<i64>; 2],
    scheduler: Scheduler,
    persistence: Duration,
    key: &dyn Fn(&str) -> String,
) -> Result<SourcePrefix, ConfigError> {
    let mut prefix = SourcePrefix::WHOLE;
    for (name, value, max, slot) in [
        ("affinity_prefix_v4", v4, 32, &mut prefix.v4),
        ("affinity_prefix_v6", v6, 128, &mut prefix.v6),
    ] {
        if let Some(v) = value {
            *slot = int_in(v, 1, max, &key(name))?;
        }
    }
    if prefix.is_prefix() && scheduler != Scheduler::SourceHash && persistence.is_zero() {
        let (name, value) = if prefix.v4 < SourcePrefix::WHOLE.v4 {
            ("affinity_prefix_v4", prefix.v4)
        } else {
            ("affinity_prefix_v6", prefix.v6)
        };
        return Err(invalid(
            key(name),
            value,
            "keys the affinity of source-hash and of session persistence: set scheduler = \"source-hash\" or persistence_secs",
        ));
    }
    Ok(prefix)
}

/// Whether a VIP name is usable in URLs, metrics labels and the CLI.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// The files a VIP's settings name: (key, path).
pub fn files_named(raw: &RawVip) -> Vec<(&'static str, &str)> {
    let mut files = Vec::new();
    if let Some(ca) = raw.health.as_ref().and_then(|h| h.ca.as_deref()) {
        files.push(("health.ca", ca));
    }
    if let Some(t) = &raw.telemetry {
        for (key, path) in [
            ("telemetry.ca", &t.ca),
            ("telemetry.cert", &t.cert),
            ("telemetry.key", &t.key),
            ("telemetry.bearer_token_file", &t.bearer_token_file),
        ] {
            if let Some(path) = path {
                files.push((key, path.as_str()));
            }
        }
    }
    files
}

/// Checks that every file a VIP arriving at run time (over the API, from the fleet) names lies
/// under `dir` (`api.file_dir`; None: it may name none). The daemon runs as root: without this,
/// whoever may add a VIP could have it read any file (`/etc/shadow` as a bearer token) and send
/// it to a host of their choosing. A path is taken as it resolves, links followed.
pub fn check_files_under(raw: &RawVip, dir: Option<&std::path::Path>) -> Result<(), String> {
    let files = files_named(raw);
    let Some((key, path)) = files.first() else {
        return Ok(());
    };
    let Some(dir) = dir else {
        return Err(format!(
            "{key} = {path:?}: a VIP added at run time may name files only under api.file_dir, which is not set"
        ));
    };
    let root =
        std::fs::canonicalize(dir).map_err(|e| format!("api.file_dir {}: {e}", dir.display()))?;
    for (key, path) in files {
        let resolved = std::fs::canonicalize(path).map_err(|e| format!("{key} = {path:?}: {e}"))?;
        if !resolved.starts_with(&root) {
            return Err(format!(
                "{key} = {path:?}: not under api.file_dir ({})",
                root.display()
            ));
        }
    }
    Ok(())
}
