//! The daemon's TOML configuration: parsed into raw serde structs ([`raw`]), then validated
//! into [`Config`] with errors that name the offending key and value ([`ConfigError`]).
//! Nothing binds, loads or attaches until a config has passed [`Config::parse`].
//!
//! One module per concern: [`daemon`] (interface, attach mode, connection table, encapsulation,
//! API, metrics), [`vip`] (VIPs and their backends), [`health`], [`telemetry`] (with the weight
//! policy), [`pools`], [`tiers`], [`fleet`] (etcd and BGP); [`fields`] reads single values;
//! network value types live in [`crate::base::net`]. Defaults are the `DEFAULT_*` constants here.

mod admission;
mod backends;
mod daemon;
#[cfg(test)]
mod defaults_tests;
mod error;
mod fields;
mod fleet;
mod health;
mod nat;
mod policy;
mod pools;
mod raw;
pub mod service;
mod telemetry;
#[cfg(test)]
mod tests;
mod tiers;
mod vip;

pub use admission::{AdmissionConfig, RawAdmission, Refusal};
pub use backends::{BackendConfig, validate_backend};
pub use balancer_common::maps::Scheduler;
pub use daemon::{ApiConfig, ApiTls, AttachMode, ConntrackConfig, EncapConfig, MetricsConfig};
pub use error::ConfigError;
pub(crate) use error::invalid;
pub use fleet::{BgpConfig, EtcdAuth, EtcdTls, FleetConfig, RawBgp, RawFleet};
pub use health::{HealthCheckKind, HealthConfig, HealthTls};
pub use nat::{NatConfig, NatSource};
pub use policy::{Factors, MAX_POLICY_WEIGHT, PolicyConfig, PolicyKind, StaleMode};
pub use pools::PoolConfig;
pub use raw::{
    RawApi, RawBackend, RawConfig, RawConntrack, RawEncap, RawHealth, RawMetrics, RawNat,
    RawPolicy, RawPool, RawTelemetry, RawTier, RawVip,
};
pub use telemetry::{RECENT_HALF_LIFE, ScrapeAccess, TelemetryConfig, TelemetrySource};
pub use tiers::TierConfig;
pub use vip::{
    Discovery, Forwarding, VipConfig, check_files_under, check_vip_set, files_named, valid_name,
    validate_vip,
};

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use balancer_common::maps::MAX_VIPS;

use crate::base::net::Prefix;

use fields::{check_interface_name, int_in, parse_field, parse_socket_addr, required};
use fleet::{validate_bgp, validate_fleet};
use pools::validate_pools;
use tiers::validate_tiers;
use vip::parse_source;

/// Largest backend weight. Weights are relative; the table builder is exact for any of them.
pub const MAX_WEIGHT: u32 = 65_535;
/// Default connection-table capacity (entries; about 90 bytes each in the kernel).
pub const DEFAULT_MAX_FLOWS: u32 = 2_000_000;
/// Smallest connection table accepted.
pub const MIN_MAX_FLOWS: u32 = 1024;
/// Default idle time after which a UDP flow is chosen afresh.
pub const DEFAULT_UDP_IDLE_TIMEOUT_SECS: u64 = 30;
/// Default new flows per second per CPU before flood mode.
pub const DEFAULT_FLOOD_THRESHOLD: u32 = 250_000;
/// Default time a removed backend keeps its established flows.
pub const DEFAULT_REMOVAL_GRACE_SECS: u64 = 60;
/// Default interval between health checks of a backend.
pub const DEFAULT_HEALTH_INTERVAL_MS: u64 = 1000;
/// Longest default health-check timeout (half the interval, at most this).
pub const DEFAULT_HEALTH_TIMEOUT_MS: u64 = 500;
/// A VIP's fastest scrape interval (`telemetry.interval_ms`), ms.
pub const DEFAULT_SCRAPE_INTERVAL_MS: u64 = 100;
/// Its slowest (`telemetry.max_interval_ms`, unless `interval_ms` is slower), ms.
pub const DEFAULT_MAX_SCRAPE_INTERVAL_MS: u64 = 4000;
/// Requests per backend between two scrapes (`telemetry.requests_per_scrape`).
pub const DEFAULT_REQUESTS_PER_SCRAPE: u32 = 8;
/// Root of the default pin directory (`<root>/<interface>`).
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/balancer";
/// Directory of the default state file (`<dir>/<interface>.state.json`).
pub const DEFAULT_STATE_DIR: &str = "/run/balancer";
/// Default control socket.
pub const DEFAULT_API_SOCKET: &str = "/run/balancer/balancer.sock";
/// Default GUE destination port.
pub const DEFAULT_GUE_PORT: u16 = 6080;

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Interface the XDP program attaches to.
    pub interface: String,
    pub attach_mode: AttachMode,
    /// bpffs directory where the program, its link and its maps are pinned, so forwarding and
    /// the connection table outlive the daemon.
    pub pin_dir: PathBuf,
    /// The daemon's bookkeeping for the pinned maps (JSON), rewritten on every change.
    pub state_file: PathBuf,
    pub conntrack: ConntrackConfig,
    pub encap: EncapConfig,
    /// Source NAT of `nat` VIPs with a `nat_source`.
    pub nat: NatConfig,
    pub api: ApiConfig,
    pub metrics: MetricsConfig,
    /// Priority tiers (ids 1..=7 in order).
    pub tiers: Vec<TierConfig>,
    /// Backend pools for model routing.
    pub pools: Vec<PoolConfig>,
    /// The VIPs, with the backends they take from pools (per the models discovered so far,
    /// see [`Config::place_pool_backends`]).
    pub vips: Vec<VipConfig>,
    /// A fleet sharing its desired state through etcd (`None`: this balancer alone).
    pub fleet: Option<FleetConfig>,
    /// VIP announcement over BGP through BIRD (`None`: not announced).
    pub bgp: Option<BgpConfig>,
}

impl Config {
    /// The backends (of every VIP, each once, sorted) whose next-hop MAC the config does not
    /// give: the daemon resolves theirs. Each with whether it serves a `nat` VIP (those are
    /// reached on `nat.interface` when it is set).
    pub fn backends_without_mac(&self) -> Vec<(IpAddr, bool)> {
        let mut wanted: Vec<(IpAddr, bool)> = self
            .vips
            .iter()
            .flat_map(|v| {
                let nat = v.forwarding == Forwarding::Nat;
                v.backends.iter().map(move |b| (b, nat))
            })
            .filter(|(b, _)| b.mac.is_none())
            .map(|(b, nat)| (b.address, nat))
            .collect();
        wanted.sort();
        wanted.dedup();
        wanted
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|reason| ConfigError::Read {
            path: path.to_path_buf(),
            reason,
        })?;
        Config::parse(&text)
    }

    /// Validates config text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| ConfigError::Syntax(e.to_string().trim().to_string()))?;
        if let Some((i, v)) = raw
            .vip
            .iter()
            .enumerate()
            .find(|(_, v)| v.service.is_some())
        {
            return Err(invalid(
                format!("vip[{i}].service"),
                format!("{:?}", v.service.as_deref().unwrap_or_default()),
                "is set by the daemon; a service is a [[vip]] with a name and several addresses, ports or protocols",
            ));
        }
        Config::from_raw(raw)
    }

    /// Validates a config's raw form, section by section (the first error found is the one
    /// reported, in this order).
    pub fn from_raw(raw: RawConfig) -> Result<Config, ConfigError> {
        let interface = required(raw.interface, "interface")?;
        check_interface_name(&interface, "interface")?;
        let attach_mode = match raw.attach_mode {
            Some(m) => parse_field(&m, "attach_mode")?,
            None => AttachMode::Native,
        };
        let pin_dir = validate_pin_dir(raw.pin_dir, &interface)?;
        let state_file = validate_state_file(raw.state_file, &interface)?;
        let conntrack = validate_conntrack(raw.conntrack)?;
        let encap = validate_encap(raw.encap)?;
        let nat = nat::validate_nat(raw.nat, &interface)?;
        let api = daemon::validate_api(raw.api)?;
        let metrics = validate_metrics(raw.metrics)?;
        if raw.vip.len() > MAX_VIPS as usize {
            return Err(invalid(
                "vip",
                format!("{} entries", raw.vip.len()),
                format!("at most {MAX_VIPS} VIPs are supported"),
            ));
        }
        let fleet = validate_fleet(raw.fleet)?;
        let bgp = validate_bgp(raw.bgp)?;
        let tiers = validate_tiers(raw.tier)?;
        let pools = validate_pools(raw.pool)?;
        let vips = validate_vips(raw.vip, &tiers, &pools)?;
        check_vip_set(&vips)?;
        check_tiers_used(&tiers, &vips)?;
        let mut config = Config {
            interface,
            attach_mode,
            pin_dir,
            state_file,
            conntrack,
            encap,
            nat,
            api,
            metrics,
            tiers,
            pools,
            vips,
            fleet,
            bgp,
        };
        config.place_pool_backends(&Default::default());
        check_vip_set(&config.vips)?;
        Ok(config)
    }

    /// Gives each VIP with a `pool` the pool's backends that serve its `model` according to
    /// `served` (pool -> backend -> models discovered), replacing those it had from the pool.
    /// A pool without discovery gives all its backends; with discovery, a backend joins once
    /// its models are known. A backend the VIP lists itself keeps its own settings. A `nat` VIP
    /// takes only the pool's backends of its own address family.
    pub fn place_pool_backends(
        &mut self,
        served: &std::collections::HashMap<String, std::collections::HashMap<IpAddr, Vec<String>>>,
    ) {
        for vip in &mut self.vips {
            vip.backends.retain(|b| b.from_pool.is_none());
            let Some(pool) = vip
                .pool
                .as_ref()
                .and_then(|p| self.pools.iter().find(|x| &x.name == p))
            else {
                continue;
            };
            for b in &pool.backends {
                if vip.backends.iter().any(|x| x.address == b.address) {
                    continue;
                }
                // NAT writes the backend's address over the VIP's: only its own family serves.
                if vip.forwarding == Forwarding::Nat && b.address.is_ipv4() != vip.address.is_ipv4()
                {
                    continue;
                }
                let serves = match (&pool.discovery, &vip.model) {
                    (Discovery::None, _) | (_, None) => true,
                    (_, Some(model)) => served
                        .get(&pool.name)
                        .and_then(|m| m.get(&b.address))
                        .is_some_and(|models| models.iter().any(|x| x == model)),
                };
                if serves {
                    vip.backends.push(BackendConfig {
                        from_pool: Some(pool.name.clone()),
                        ..b.clone()
                    });
                }
            }
        }
    }

    /// The id of the tier with this name (0: none, the shared pool).
    pub fn tier_id(&self, name: Option<&str>) -> u8 {
        name.and_then(|n| self.tiers.iter().find(|t| t.name == n))
            .map_or(0, |t| t.id)
    }

    /// The VIP with this name.
    pub fn vip(&self, name: &str) -> Option<&VipConfig> {
        self.vips.iter().find(|v| v.name == name)
    }

    /// The VIP with this name, mutably.
    pub fn vip_mut(&mut self, name: &str) -> Option<&mut VipConfig> {
        self.vips.iter_mut().find(|v| v.name == name)
    }

    /// The config in its raw form, every setting spelled out, one VIP per entry (each member
    /// of a service marked with it): what the API's edits change.
    pub fn to_raw(&self) -> RawConfig {
        RawConfig {
            interface: Some(self.interface.clone()),
            attach_mode: Some(self.attach_mode.to_string()),
            pin_dir: Some(self.pin_dir.display().to_string()),
            state_file: Some(self.state_file.display().to_string()),
            conntrack: RawConntrack {
                max_flows: Some(self.conntrack.max_flows.into()),
                udp_idle_timeout_secs: Some(self.conntrack.udp_idle_timeout.as_secs() as i64),
                flood_threshold: Some(self.conntrack.flood_threshold.into()),
                removal_grace_secs: Some(self.conntrack.removal_grace.as_secs() as i64),
            },
            encap: RawEncap {
                source_v4: self.encap.source_v4.map(|p| p.to_string()),
                source_v6: self.encap.source_v6.map(|p| p.to_string()),
                mtu: self.encap.mtu.map(i64::from),
            },
            nat: self.nat.to_raw(),
            api: self.api.to_raw(),
            metrics: RawMetrics {
                listen: self.metrics.listen.map(|l| l.to_string()),
            },
            fleet: self.fleet.as_ref().map(|f| f.to_raw()).unwrap_or_default(),
            bgp: self.bgp.as_ref().map(|b| b.to_raw()).unwrap_or_default(),
            pool: self.pools.iter().map(PoolConfig::to_raw).collect(),
            tier: self
                .tiers
                .iter()
                .map(|t| RawTier {
                    name: Some(t.name.clone()),
                    prefixes: t.prefixes.iter().map(Prefix::to_string).collect(),
                    dscp: t.dscp.iter().map(|d| i64::from(*d)).collect(),
                    spillover: Some(t.spillover),
                    share: Some(i64::from(t.share)),
                    max_new_flows_per_sec: t.max_new_flows_per_sec.map(i64::from),
                })
                .collect(),
            vip: self.vips.iter().map(VipConfig::to_raw).collect(),
        }
    }

    /// The config as TOML that [`Config::parse`] reads back to an equal config.
    pub fn to_toml(&self) -> String {
        let raw = RawConfig {
            vip: service::fold(&self.vips),
            ..self.to_raw()
        };
        let body = toml::to_string(&raw).unwrap_or_default();
        format!(
            "# Managed by balancer: changes made through its API (balancer vip/backend ...) are\n\
             # written here. Edit by hand, then `balancer reload`.\n\n{body}"
        )
    }
}

/// `pin_dir`: an absolute path without `..`; by default under the pin root, named for the
/// interface.
fn validate_pin_dir(raw: Option<String>, interface: &str) -> Result<PathBuf, ConfigError> {
    match raw {
        Some(d) if d.starts_with('/') && !d.contains("..") => Ok(PathBuf::from(d)),
        Some(d) => Err(invalid(
            "pin_dir",
            format!("{d:?}"),
            "must be an absolute path (on a bpffs mount) without '..'",
        )),
        None => Ok(Path::new(DEFAULT_PIN_ROOT).join(interface)),
    }
}

/// `state_file`: an absolute path; by default in the state directory, named for the interface.
fn validate_state_file(raw: Option<String>, interface: &str) -> Result<PathBuf, ConfigError> {
    match raw {
        Some(f) if f.starts_with('/') => Ok(PathBuf::from(f)),
        Some(f) => Err(invalid(
            "state_file",
            format!("{f:?}"),
            "must be an absolute path",
        )),
        None => Ok(Path::new(DEFAULT_STATE_DIR).join(format!("{interface}.state.json"))),
    }
}

/// `[conntrack]`: each setting within its range, or its default.
fn validate_conntrack(raw: RawConntrack) -> Result<ConntrackConfig, ConfigError> {
    Ok(ConntrackConfig {
        max_flows: match raw.max_flows {
            Some(v) => int_in(v, MIN_MAX_FLOWS.into(), 1 << 28, "conntrack.max_flows")?,
            None => DEFAULT_MAX_FLOWS,
        },
        udp_idle_timeout: Duration::from_secs(match raw.udp_idle_timeout_secs {
            Some(v) => int_in(v, 0, 86_400, "conntrack.udp_idle_timeout_secs")?,
            None => DEFAULT_UDP_IDLE_TIMEOUT_SECS,
        }),
        flood_threshold: match raw.flood_threshold {
            Some(v) => int_in(v, 0, u32::MAX.into(), "conntrack.flood_threshold")?,
            None => DEFAULT_FLOOD_THRESHOLD,
        },
        removal_grace: Duration::from_secs(match raw.removal_grace_secs {
            Some(v) => int_in(v, 0, 86_400, "conntrack.removal_grace_secs")?,
            None => DEFAULT_REMOVAL_GRACE_SECS,
        }),
    })
}

/// `[encap]`: the tunnel sources (of their own family) and the MTU.
fn validate_encap(raw: RawEncap) -> Result<EncapConfig, ConfigError> {
    Ok(EncapConfig {
        source_v4: raw
            .source_v4
            .map(|s| parse_source(&s, "encap.source_v4", true))
            .transpose()?,
        source_v6: raw
            .source_v6
            .map(|s| parse_source(&s, "encap.source_v6", false))
            .transpose()?,
        mtu: raw
            .mtu
            .map(|v| int_in(v, 576, 65_535, "encap.mtu"))
            .transpose()?,
    })
}

/// `[metrics]`: where the page listens; a port alone listens on loopback (the page is
/// unauthenticated).
fn validate_metrics(raw: RawMetrics) -> Result<MetricsConfig, ConfigError> {
    Ok(MetricsConfig {
        listen: raw
            .listen
            .as_deref()
            .map(|l| match l.parse::<u16>() {
                Ok(port) if port > 0 => Ok(SocketAddr::from(([127, 0, 0, 1], port))),
                _ => parse_socket_addr(l, "metrics.listen"),
            })
            .transpose()?,
    })
}

/// The `[[vip]]` blocks: each service expanded into its members, each member valid, its
/// backends' tiers, its admission's tiers and its pool known.
fn validate_vips(
    raw: Vec<RawVip>,
    tiers: &[TierConfig],
    pools: &[PoolConfig],
) -> Result<Vec<VipConfig>, ConfigError> {
    let mut vips = Vec::with_capacity(raw.len());
    let mut members = Vec::with_capacity(raw.len());
    for (i, block) in raw.into_iter().enumerate() {
        let label = format!("vip[{i}]");
        members.extend(service::expand(block, &label)?.into_iter().map(|m| (i, m)));
    }
    for (i, raw_vip) in members {
        let vip = validate_vip(raw_vip, &format!("vip[{i}]"))?;
        check_vip_references(&vip, i, tiers, pools)?;
        vips.push(vip);
    }
    Ok(vips)
}

/// What VIP `i` names outside itself: its backends' tiers, its admission's tiers, its pool (a
/// `model` needs one).
fn check_vip_references(
    vip: &VipConfig,
    i: usize,
    tiers: &[TierConfig],
    pools: &[PoolConfig],
) -> Result<(), ConfigError> {
    for (j, b) in vip.backends.iter().enumerate() {
        if let Some(t) = &b.tier
            && !tiers.iter().any(|x| &x.name == t)
        {
            return Err(invalid(
                format!("vip[{i}].backend[{j}].tier"),
                format!("{t:?}"),
                "no [[tier]] has this name",
            ));
        }
    }
    if let Some(a) = &vip.admission {
        admission::check_tiers(a, tiers, &vip.backends, &format!("vip[{i}]"))?;
    }
    match (&vip.pool, &vip.model) {
        (Some(p), _) if !pools.iter().any(|x| &x.name == p) => Err(invalid(
            format!("vip[{i}].pool"),
            format!("{p:?}"),
            "no [[pool]] has this name",
        )),
        (None, Some(m)) => Err(invalid(
            format!("vip[{i}].model"),
            format!("{m:?}"),
            "model routing needs a pool",
        )),
        _ => Ok(()),
    }
}

/// Each tier has client prefixes or DSCP values, or is some VIP's admission overflow.
fn check_tiers_used(tiers: &[TierConfig], vips: &[VipConfig]) -> Result<(), ConfigError> {
    for t in tiers {
        let overflow = |v: &VipConfig| {
            v.admission
                .as_ref()
                .is_some_and(|a| a.overflow.as_deref() == Some(t.name.as_str()))
        };
        if t.prefixes.is_empty() && t.dscp.is_empty() && !vips.iter().any(overflow) {
            return Err(invalid(
                format!("tier[{}].prefixes", t.id - 1),
                "(none)",
                "a tier needs client prefixes or DSCP values (or to be a VIP's admission overflow)",
            ));
        }
    }
    Ok(())
}
