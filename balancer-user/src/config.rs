//! The daemon's TOML configuration: parsed into raw serde structs, then validated into
//! [`Config`] with errors that name the offending key and value. Nothing binds, loads or
//! attaches until a config has passed [`Config::parse`].

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use balancer_common::maglev::is_prime;
pub use balancer_common::maps::Scheduler;
use balancer_common::maps::{DEFAULT_TABLE_SIZE, MAX_BACKENDS, MAX_TABLE_SIZE, MAX_VIPS};
use serde::{Deserialize, Serialize};

use crate::policy::{
    Factors, MAX_WEIGHT as MAX_POLICY_WEIGHT, PolicyConfig, PolicyKind, StaleMode,
};

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
/// Root of the default pin directory (`<root>/<interface>`).
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/balancer";
/// Directory of the default state file (`<dir>/<interface>.state.json`).
pub const DEFAULT_STATE_DIR: &str = "/run/balancer";
/// Default control socket.
pub const DEFAULT_API_SOCKET: &str = "/run/balancer/balancer.sock";
/// Default GUE destination port.
pub const DEFAULT_GUE_PORT: u16 = 6080;

/// A configuration error. `Invalid` names the key (as a path such as
/// `vip[0].backend[2].weight`), the offending value, and why it is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config is not valid TOML or has an unknown key: {0}")]
    Syntax(String),
    #[error("{key} = {value}: {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
}

pub(crate) fn invalid(
    key: impl Into<String>,
    value: impl fmt::Display,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// How the XDP program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver (fastest; veth needs an XDP program on the peer to receive `XDP_TX`).
    Native,
    /// Generic XDP on the kernel's skb path (works everywhere, slower).
    Skb,
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttachMode::Native => "native",
            AttachMode::Skb => "skb",
        })
    }
}

impl FromStr for AttachMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "native" => Ok(AttachMode::Native),
            "skb" => Ok(AttachMode::Skb),
            _ => Err("expected \"native\" or \"skb\"".into()),
        }
    }
}

/// Transport protocol of a VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub const fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tcp" => Ok(Protocol::Tcp),
            "udp" => Ok(Protocol::Udp),
            _ => Err("expected \"tcp\" or \"udp\"".into()),
        }
    }
}

/// How a VIP's packets reach the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forwarding {
    /// Rewrite MAC addresses; backends share the link and hold the VIP (LVS-DR style).
    L2Dsr,
    /// IP-in-IP; backends decapsulate (`balancer decap`) and hold the VIP.
    Ipip,
    /// IP-in-UDP (GUE variant 1); backends decapsulate and hold the VIP.
    Gue,
}

impl fmt::Display for Forwarding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Forwarding::L2Dsr => "l2-dsr",
            Forwarding::Ipip => "ipip",
            Forwarding::Gue => "gue",
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
            _ => Err("expected \"l2-dsr\", \"ipip\" or \"gue\"".into()),
        }
    }
}

/// An Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts
                .next()
                .ok_or("expected six hex bytes like 02:00:00:00:00:01")?;
            if part.len() != 2 {
                return Err("expected six hex bytes like 02:00:00:00:00:01".into());
            }
            *byte =
                u8::from_str_radix(part, 16).map_err(|_| format!("{part:?} is not a hex byte"))?;
        }
        if parts.next().is_some() {
            return Err("expected six hex bytes like 02:00:00:00:00:01".into());
        }
        Ok(MacAddr(out))
    }
}

/// An address prefix such as `172.16.0.0/16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("prefix length {l:?} is not 0..={max}"))?,
        };
        Ok(Prefix { addr, len })
    }
}

impl Prefix {
    /// Whether `ip` lies inside the prefix.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Connection tracking.
#[derive(Clone, Debug, PartialEq)]
pub struct ConntrackConfig {
    /// Connection-table capacity.
    pub max_flows: u32,
    /// A UDP flow idle longer than this is chosen afresh (zero: never).
    pub udp_idle_timeout: Duration,
    /// New flows per second per CPU before flood mode (zero: no limit).
    pub flood_threshold: u32,
    /// A backend removed from a VIP keeps its established flows this long (it takes no new
    /// ones); then they are re-hashed. Zero: at once.
    pub removal_grace: Duration,
}

/// Encapsulation (ipip and gue VIPs).
#[derive(Clone, Debug, PartialEq)]
pub struct EncapConfig {
    /// Outer IPv4 source; host bits below the prefix length take per-flow entropy. Default:
    /// the interface's first IPv4 address, fixed.
    pub source_v4: Option<Prefix>,
    /// Outer IPv6 source, likewise (entropy in at most the last 32 bits).
    pub source_v6: Option<Prefix>,
    /// Largest packet the link carries; bigger encapsulated packets are answered with ICMP
    /// fragmentation-needed / packet-too-big. Default: the interface's MTU.
    pub mtu: Option<u32>,
}

/// One backend of a VIP.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendConfig {
    pub address: IpAddr,
    /// Relative share of new flows; 0 takes none (established flows continue).
    pub weight: u32,
    /// Drained: no new flows, established ones continue; the weight is kept for undrain.
    pub drained: bool,
    /// Next-hop MAC; default: looked up in the neighbour table (the backend's own when on
    /// the link, else its gateway's).
    pub mac: Option<MacAddr>,
    /// Dedicated to this priority tier's clients (a `[[tier]]` name); `None`: the shared pool.
    pub tier: Option<String>,
    /// Joined from this `[[pool]]` (model routing), not listed in the VIP itself.
    pub from_pool: Option<String>,
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

/// Backends grouped for model routing: a VIP with `pool` and `model` gets the pool's backends
/// that serve the model (a backend serving several models joins several VIPs).
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    pub name: String,
    pub discovery: Discovery,
    /// Between discovery rounds.
    pub interval: Duration,
    pub backends: Vec<BackendConfig>,
}

/// A priority tier: clients from its prefixes, or marked with its DSCP values, go to the
/// backends a VIP dedicates to it; other clients never do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierConfig {
    pub name: String,
    /// 1..=7, in the order of the config file.
    pub id: u8,
    pub prefixes: Vec<Prefix>,
    pub dscp: Vec<u8>,
    /// When none of a VIP's backends for the tier can take a new flow (all down, drained or
    /// saturated), it goes to the shared pool; else it is dropped.
    pub spillover: bool,
}

impl BackendConfig {
    /// The weight the table is built with: 0 while drained.
    pub fn effective_weight(&self) -> u32 {
        if self.drained { 0 } else { self.weight }
    }
}

/// How backends of a VIP are checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthCheckKind {
    /// Not checked: always healthy.
    None,
    /// A TCP connection to the backend's address and the check port must open.
    Tcp,
    /// `GET path` on the backend's address and the check port must answer `expect_status`.
    Http { path: String, expect_status: u16 },
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
    /// Model routing (see [`PoolConfig`]).
    pub pool: Option<String>,
    pub model: Option<String>,
    pub backends: Vec<BackendConfig>,
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
    /// Scrape (and weight) interval.
    pub interval: Duration,
    /// Per scrape.
    pub timeout: Duration,
    /// Largest page accepted.
    pub max_body: usize,
}

/// The daemon's control API.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiConfig {
    /// Unix socket (mode 0600, root only).
    pub socket: PathBuf,
    /// Optional TCP listener; only with `token_file`.
    pub listen: Option<SocketAddr>,
    /// File holding the bearer token the TCP listener requires.
    pub token_file: Option<PathBuf>,
}

/// The Prometheus exporter.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsConfig {
    /// Where `/metrics` is served; `None` = off.
    pub listen: Option<SocketAddr>,
}

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
    pub fleet: Option<crate::fleet::config::FleetConfig>,
    /// VIP announcement over BGP through BIRD (`None`: not announced).
    pub bgp: Option<crate::fleet::config::BgpConfig>,
}

/// The config file's shape, as serde reads and writes it. Validation turns it into [`Config`];
/// [`Config::to_raw`] turns a [`Config`] back into it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_file: Option<String>,
    #[serde(default)]
    pub conntrack: RawConntrack,
    #[serde(default)]
    pub encap: RawEncap,
    #[serde(default)]
    pub api: RawApi,
    #[serde(default)]
    pub metrics: RawMetrics,
    #[serde(default)]
    pub fleet: crate::fleet::config::RawFleet,
    #[serde(default)]
    pub bgp: crate::fleet::config::RawBgp,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tier: Vec<RawTier>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pool: Vec<RawPool>,
    #[serde(default)]
    pub vip: Vec<RawVip>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConntrack {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_flows: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp_idle_timeout_secs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood_threshold: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removal_grace_secs: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawEncap {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_v4: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_v6: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawApi {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rise: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fall: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawVip {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gue_port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_size: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<RawHealth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<RawTelemetry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<RawPolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistence_secs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_load_factor: Option<f64>,
    /// Model routing: take backends from this `[[pool]]`...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// ...those serving this model (all of the pool's when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default)]
    pub backend: Vec<RawBackend>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPool {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// none | models | metrics
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discover: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<i64>,
    #[serde(default)]
    pub backend: Vec<RawBackend>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// More pages, as "port/path" (e.g. "9400/metrics" for a DCGM exporter).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_kib: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_memory_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ewma_alpha: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hysteresis: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_saturation: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_saturation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_free_gpu_memory_mib: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_after_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantum: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackend {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drained: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTier {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dscp: Vec<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spillover: Option<bool>,
}

fn required<T>(value: Option<T>, key: &str) -> Result<T, ConfigError> {
    value.ok_or_else(|| invalid(key, "(missing)", "this key is required"))
}

fn parse_field<T: FromStr<Err = String>>(text: &str, key: &str) -> Result<T, ConfigError> {
    text.parse()
        .map_err(|reason| invalid(key, format!("{text:?}"), reason))
}

fn parse_ip(text: &str, key: &str) -> Result<IpAddr, ConfigError> {
    text.parse()
        .map_err(|_| invalid(key, format!("{text:?}"), "not an IPv4 or IPv6 address"))
}

fn parse_socket_addr(text: &str, key: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| {
        invalid(
            key,
            format!("{text:?}"),
            "not an address and port like 127.0.0.1:9180 or [::1]:9180",
        )
    })
}

fn int_in<T: TryFrom<i64>>(value: i64, min: i64, max: i64, key: &str) -> Result<T, ConfigError> {
    if value < min || value > max {
        return Err(invalid(
            key,
            value,
            format!("must be between {min} and {max}"),
        ));
    }
    T::try_from(value).map_err(|_| invalid(key, value, "out of range"))
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text)
    }

    /// Validates config text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| ConfigError::Syntax(e.to_string().trim().to_string()))?;
        Config::from_raw(raw)
    }

    /// Validates a config's raw form.
    pub fn from_raw(raw: RawConfig) -> Result<Config, ConfigError> {
        let interface = required(raw.interface, "interface")?;
        if interface.is_empty() || interface.len() > 15 || interface.contains(['/', ' ']) {
            return Err(invalid(
                "interface",
                format!("{interface:?}"),
                "not a network interface name (1-15 characters, no '/' or spaces)",
            ));
        }
        let attach_mode = match raw.attach_mode {
            Some(m) => parse_field(&m, "attach_mode")?,
            None => AttachMode::Native,
        };
        let pin_dir = match raw.pin_dir {
            Some(d) if d.starts_with('/') && !d.contains("..") => PathBuf::from(d),
            Some(d) => {
                return Err(invalid(
                    "pin_dir",
                    format!("{d:?}"),
                    "must be an absolute path (on a bpffs mount) without '..'",
                ));
            }
            None => Path::new(DEFAULT_PIN_ROOT).join(&interface),
        };
        let state_file = match raw.state_file {
            Some(f) if f.starts_with('/') => PathBuf::from(f),
            Some(f) => {
                return Err(invalid(
                    "state_file",
                    format!("{f:?}"),
                    "must be an absolute path",
                ));
            }
            None => Path::new(DEFAULT_STATE_DIR).join(format!("{interface}.state.json")),
        };
        let conntrack = ConntrackConfig {
            max_flows: match raw.conntrack.max_flows {
                Some(v) => int_in(v, MIN_MAX_FLOWS.into(), 1 << 28, "conntrack.max_flows")?,
                None => DEFAULT_MAX_FLOWS,
            },
            udp_idle_timeout: Duration::from_secs(match raw.conntrack.udp_idle_timeout_secs {
                Some(v) => int_in(v, 0, 86_400, "conntrack.udp_idle_timeout_secs")?,
                None => DEFAULT_UDP_IDLE_TIMEOUT_SECS,
            }),
            flood_threshold: match raw.conntrack.flood_threshold {
                Some(v) => int_in(v, 0, u32::MAX.into(), "conntrack.flood_threshold")?,
                None => DEFAULT_FLOOD_THRESHOLD,
            },
            removal_grace: Duration::from_secs(match raw.conntrack.removal_grace_secs {
                Some(v) => int_in(v, 0, 86_400, "conntrack.removal_grace_secs")?,
                None => DEFAULT_REMOVAL_GRACE_SECS,
            }),
        };
        let encap = EncapConfig {
            source_v4: raw
                .encap
                .source_v4
                .map(|s| parse_source(&s, "encap.source_v4", true))
                .transpose()?,
            source_v6: raw
                .encap
                .source_v6
                .map(|s| parse_source(&s, "encap.source_v6", false))
                .transpose()?,
            mtu: raw
                .encap
                .mtu
                .map(|v| int_in(v, 576, 65_535, "encap.mtu"))
                .transpose()?,
        };
        let api = ApiConfig {
            socket: match raw.api.socket {
                Some(s) if s.starts_with('/') => PathBuf::from(s),
                Some(s) => {
                    return Err(invalid(
                        "api.socket",
                        format!("{s:?}"),
                        "must be an absolute path",
                    ));
                }
                None => PathBuf::from(DEFAULT_API_SOCKET),
            },
            listen: raw
                .api
                .listen
                .as_deref()
                .map(|l| parse_socket_addr(l, "api.listen"))
                .transpose()?,
            token_file: raw.api.token_file.map(PathBuf::from),
        };
        if let (Some(listen), None) = (&api.listen, &api.token_file) {
            return Err(invalid(
                "api.listen",
                format!("{:?}", listen.to_string()),
                "a TCP listener needs api.token_file (a bearer token); refusing to serve the API unauthenticated",
            ));
        }
        let metrics = MetricsConfig {
            listen: raw
                .metrics
                .listen
                .as_deref()
                .map(|l| parse_socket_addr(l, "metrics.listen"))
                .transpose()?,
        };

        if raw.vip.len() > MAX_VIPS as usize {
            return Err(invalid(
                "vip",
                format!("{} entries", raw.vip.len()),
                format!("at most {MAX_VIPS} VIPs are supported"),
            ));
        }
        let fleet = crate::fleet::config::validate_fleet(raw.fleet)?;
        let bgp = crate::fleet::config::validate_bgp(raw.bgp)?;
        let tiers = validate_tiers(raw.tier)?;
        let pools = validate_pools(raw.pool)?;
        let mut vips = Vec::with_capacity(raw.vip.len());
        for (i, raw_vip) in raw.vip.into_iter().enumerate() {
            let vip = validate_vip(raw_vip, &format!("vip[{i}]"))?;
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
            match (&vip.pool, &vip.model) {
                (Some(p), _) if !pools.iter().any(|x| &x.name == p) => {
                    return Err(invalid(
                        format!("vip[{i}].pool"),
                        format!("{p:?}"),
                        "no [[pool]] has this name",
                    ));
                }
                (None, Some(m)) => {
                    return Err(invalid(
                        format!("vip[{i}].model"),
                        format!("{m:?}"),
                        "model routing needs a pool",
                    ));
                }
                _ => {}
            }
            vips.push(vip);
        }
        check_vip_set(&vips)?;
        let mut config = Config {
            interface,
            attach_mode,
            pin_dir,
            state_file,
            conntrack,
            encap,
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
    /// its models are known. A backend the VIP lists itself keeps its own settings.
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

    /// The config in its file form, every setting spelled out.
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
            api: RawApi {
                socket: Some(self.api.socket.display().to_string()),
                listen: self.api.listen.map(|l| l.to_string()),
                token_file: self
                    .api
                    .token_file
                    .as_ref()
                    .map(|p| p.display().to_string()),
            },
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
                })
                .collect(),
            vip: self.vips.iter().map(VipConfig::to_raw).collect(),
        }
    }

    /// The config as TOML that [`Config::parse`] reads back to an equal config.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(&self.to_raw()).unwrap_or_default();
        format!(
            "# Managed by balancer: changes made through its API (balancer vip/backend ...) are\n\
             # written here. Edit by hand, then `balancer reload`.\n\n{body}"
        )
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
            table_size: Some(self.table_size.into()),
            health: Some(self.health.to_raw()),
            telemetry: Some(telemetry_to_raw(&self.telemetry)),
            policy: Some(policy_to_raw(&self.policy)),
            scheduler: Some(self.scheduler.name().to_string()),
            persistence_secs: Some(self.persistence.as_secs() as i64),
            max_load_factor: (self.load_bound_pct > 0)
                .then(|| 1.0 + f64::from(self.load_bound_pct) / 100.0),
            pool: self.pool.clone(),
            model: self.model.clone(),
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

impl HealthConfig {
    fn to_raw(&self) -> RawHealth {
        let (check, path, expect_status) = match &self.kind {
            HealthCheckKind::None => ("none", None, None),
            HealthCheckKind::Tcp => ("tcp", None, None),
            HealthCheckKind::Http {
                path,
                expect_status,
            } => ("http", Some(path.clone()), Some(i64::from(*expect_status))),
        };
        RawHealth {
            check: Some(check.into()),
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

impl BackendConfig {
    /// The backend in its file form.
    pub fn to_raw(&self) -> RawBackend {
        RawBackend {
            address: Some(self.address.to_string()),
            weight: Some(self.weight.into()),
            drained: self.drained.then_some(true),
            mac: self.mac.map(|m| m.to_string()),
            tier: self.tier.clone(),
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
                format!("{}:{}/{}", vip.address, vip.port, vip.protocol),
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

fn parse_source(text: &str, key: &str, v4: bool) -> Result<Prefix, ConfigError> {
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

fn validate_health(
    raw: Option<RawHealth>,
    vip_port: u16,
    label: &str,
) -> Result<HealthConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let key = |k: &str| format!("{label}.health.{k}");
    let check = raw.check.unwrap_or_else(|| "none".into());
    let kind = match check.as_str() {
        "none" => HealthCheckKind::None,
        "tcp" => HealthCheckKind::Tcp,
        "http" => {
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
            HealthCheckKind::Http {
                path,
                expect_status,
            }
        }
        other => {
            return Err(invalid(
                key("check"),
                format!("{other:?}"),
                "expected \"none\", \"tcp\" or \"http\"",
            ));
        }
    };
    if !matches!(kind, HealthCheckKind::Http { .. })
        && (raw.path.is_some() || raw.expect_status.is_some())
    {
        return Err(invalid(
            key("check"),
            format!("{check:?}"),
            "path and expect_status apply to check = \"http\" only",
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

/// Validates one backend; `label` prefixes the keys in errors (e.g. `vip[0].backend[2]`).
pub fn validate_backend(raw: RawBackend, label: &str) -> Result<BackendConfig, ConfigError> {
    let key = |k: &str| format!("{label}.{k}");
    let text = required(raw.address, &key("address"))?;
    let address = parse_ip(&text, &key("address"))?;
    if address.is_unspecified() || address.is_multicast() {
        return Err(invalid(
            key("address"),
            format!("{text:?}"),
            "a backend must be a unicast address",
        ));
    }
    let weight = match raw.weight {
        Some(w) => int_in(w, 0, MAX_WEIGHT.into(), &key("weight"))?,
        None => 1,
    };
    let mac = raw
        .mac
        .map(|m| parse_field::<MacAddr>(&m, &key("mac")))
        .transpose()?;
    let tier = match raw.tier {
        Some(t) if !valid_name(&t) => {
            return Err(invalid(key("tier"), format!("{t:?}"), "not a tier name"));
        }
        t => t,
    };
    Ok(BackendConfig {
        address,
        weight,
        drained: raw.drained.unwrap_or(false),
        mac,
        tier,
        from_pool: None,
    })
}

/// Validates the `[[pool]]` tables (model routing).
fn validate_pools(raw: Vec<RawPool>) -> Result<Vec<PoolConfig>, ConfigError> {
    let mut pools: Vec<PoolConfig> = Vec::new();
    for (i, p) in raw.into_iter().enumerate() {
        let key = |k: &str| format!("pool[{i}].{k}");
        let name = required(p.name, &key("name"))?;
        if !valid_name(&name) || pools.iter().any(|x| x.name == name) {
            return Err(invalid(
                key("name"),
                format!("{name:?}"),
                "a unique name of 1-64 letters, digits, '-', '_' or '.'",
            ));
        }
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
        let discovery = match p.discover.as_deref().unwrap_or("none") {
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
        };
        let interval = Duration::from_millis(match p.interval_ms {
            Some(v) => int_in(v, 100, 3_600_000, &key("interval_ms"))?,
            None => 2000,
        });
        let mut backends: Vec<BackendConfig> = Vec::new();
        for (j, b) in p.backend.into_iter().enumerate() {
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
        pools.push(PoolConfig {
            name,
            discovery,
            interval,
            backends,
        });
    }
    Ok(pools)
}

impl PoolConfig {
    fn to_raw(&self) -> RawPool {
        let (discover, port, path) = match &self.discovery {
            Discovery::None => ("none", None, None),
            Discovery::Models { port, path } => {
                ("models", Some(i64::from(*port)), Some(path.clone()))
            }
            Discovery::Metrics { port, path } => {
                ("metrics", Some(i64::from(*port)), Some(path.clone()))
            }
        };
        RawPool {
            name: Some(self.name.clone()),
            discover: Some(discover.into()),
            port,
            path,
            interval_ms: Some(self.interval.as_millis() as i64),
            backend: self.backends.iter().map(BackendConfig::to_raw).collect(),
        }
    }
}

/// Validates the `[[tier]]` tables: names unique, at most 7, prefixes and DSCP values in range
/// and each claimed by one tier.
fn validate_tiers(raw: Vec<RawTier>) -> Result<Vec<TierConfig>, ConfigError> {
    let max = balancer_common::maps::MAX_TIERS as usize;
    if raw.len() > max {
        return Err(invalid(
            "tier",
            format!("{} entries", raw.len()),
            format!("at most {max} tiers"),
        ));
    }
    let mut tiers: Vec<TierConfig> = Vec::new();
    let mut prefixes = 0;
    for (i, t) in raw.into_iter().enumerate() {
        let key = |k: &str| format!("tier[{i}].{k}");
        let name = required(t.name, &key("name"))?;
        if !valid_name(&name) {
            return Err(invalid(
                key("name"),
                format!("{name:?}"),
                "a name is 1-64 letters, digits, '-', '_' or '.'",
            ));
        }
        if tiers.iter().any(|x| x.name == name) {
            return Err(invalid(
                key("name"),
                format!("{name:?}"),
                "another tier has this name",
            ));
        }
        let mut tier = TierConfig {
            name,
            id: (i + 1) as u8,
            prefixes: Vec::new(),
            dscp: Vec::new(),
            spillover: t.spillover.unwrap_or(true),
        };
        for (j, p) in t.prefixes.iter().enumerate() {
            let k = format!("{}[{j}]", key("prefixes"));
            let prefix: Prefix = p
                .parse()
                .map_err(|e: String| invalid(&k, format!("{p:?}"), e))?;
            if tiers.iter().any(|x| x.prefixes.contains(&prefix)) {
                return Err(invalid(k, format!("{p:?}"), "another tier has this prefix"));
            }
            tier.prefixes.push(prefix);
            prefixes += 1;
        }
        for (j, d) in t.dscp.iter().enumerate() {
            let k = format!("{}[{j}]", key("dscp"));
            let d: u8 = int_in(*d, 0, 63, &k)?;
            if tiers.iter().any(|x| x.dscp.contains(&d)) {
                return Err(invalid(k, d, "another tier has this DSCP value"));
            }
            tier.dscp.push(d);
        }
        if tier.prefixes.is_empty() && tier.dscp.is_empty() {
            return Err(invalid(
                key("prefixes"),
                "(none)",
                "a tier needs client prefixes or DSCP values",
            ));
        }
        tiers.push(tier);
    }
    if prefixes > balancer_common::maps::MAX_TIER_PREFIXES as usize {
        return Err(invalid(
            "tier",
            format!("{prefixes} prefixes"),
            "too many client prefixes (at most 4096)",
        ));
    }
    Ok(tiers)
}

/// Validates one VIP; `label` prefixes the keys in errors (e.g. `vip[3]`).
pub fn validate_vip(raw: RawVip, label: &str) -> Result<VipConfig, ConfigError> {
    let key = |k: &str| format!("{label}.{k}");
    let address_text = required(raw.address, &key("address"))?;
    let address = parse_ip(&address_text, &key("address"))?;
    if address.is_unspecified() || address.is_multicast() || address.is_loopback() {
        return Err(invalid(
            key("address"),
            format!("{address_text:?}"),
            "a VIP must be a unicast, non-loopback address",
        ));
    }
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
    let table_size: u32 = match raw.table_size {
        Some(v) => int_in(v, 2, MAX_TABLE_SIZE.into(), &key("table_size"))?,
        None => DEFAULT_TABLE_SIZE,
    };
    if !is_prime(table_size) {
        return Err(invalid(
            key("table_size"),
            table_size,
            "must be a prime number (e.g. 65537 or 655373)",
        ));
    }
    let name = match raw.name {
        Some(n) if !valid_name(&n) => {
            return Err(invalid(
                key("name"),
                format!("{n:?}"),
                "a name is 1-64 letters, digits, '-', '_' or '.'",
            ));
        }
        Some(n) => n,
        None => format!("{protocol}-{address}-{port}"),
    };
    let health = validate_health(raw.health, port, label)?;
    let telemetry = validate_telemetry(raw.telemetry, label)?;
    let policy = validate_policy(raw.policy, label)?;
    if policy.kind.needs_reports() && telemetry.source == TelemetrySource::None {
        return Err(invalid(
            format!("{label}.policy.kind"),
            format!("{:?}", policy.kind.name()),
            "this policy needs backend reports: set telemetry.source to \"scrape\" or \"push\"",
        ));
    }
    let scheduler = match raw.scheduler.as_deref() {
        None => Scheduler::Maglev,
        Some(name) => Scheduler::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Scheduler::ALL.iter().map(|s| s.name()).collect();
                invalid(
                    key("scheduler"),
                    format!("{name:?}"),
                    format!("expected one of {}", names.join(", ")),
                )
            })?,
    };
    let persistence = match raw.persistence_secs {
        Some(v) => Duration::from_secs(int_in(v, 0, 65_535, &key("persistence_secs"))?),
        None => Duration::ZERO,
    };
    let load_bound_pct = match raw.max_load_factor {
        Some(f) => {
            let f = float_in(f, 1.01, 3.55, &key("max_load_factor"))?;
            let hashed = matches!(scheduler, Scheduler::Maglev | Scheduler::SourceHash);
            if !hashed && persistence.is_zero() {
                return Err(invalid(
                    key("max_load_factor"),
                    f,
                    "bounds the load of the hashing schedulers (maglev, source-hash) and of session persistence",
                ));
            }
            ((f - 1.0) * 100.0).round().clamp(1.0, 255.0) as u8
        }
        None => 0,
    };
    let mut backends = Vec::with_capacity(raw.backend.len());
    let mut seen = HashSet::new();
    for (j, b) in raw.backend.into_iter().enumerate() {
        let blabel = format!("{label}.backend[{j}]");
        let backend = validate_backend(b, &blabel)?;
        if !seen.insert(backend.address) {
            return Err(invalid(
                format!("{blabel}.address"),
                format!("{:?}", backend.address.to_string()),
                "this backend is listed twice for the VIP",
            ));
        }
        backends.push(backend);
    }
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
        table_size,
        health,
        telemetry,
        policy,
        scheduler,
        persistence,
        load_bound_pct,
        pool: raw.pool,
        model: raw.model,
        backends,
    })
}

fn float_in(value: f64, min: f64, max: f64, key: &str) -> Result<f64, ConfigError> {
    if !value.is_finite() || value < min || value > max {
        return Err(invalid(
            key,
            value,
            format!("must be between {min} and {max}"),
        ));
    }
    Ok(value)
}

fn validate_telemetry(
    raw: Option<RawTelemetry>,
    label: &str,
) -> Result<TelemetryConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let key = |k: &str| format!("{label}.telemetry.{k}");
    let interval: u64 = match raw.interval_ms {
        Some(v) => int_in(v, 10, 60_000, &key("interval_ms"))?,
        None => 100,
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
    let max_body = match raw.max_body_kib {
        Some(v) => int_in::<usize>(v, 1, 64 * 1024, &key("max_body_kib"))? * 1024,
        None => 4 * 1024 * 1024,
    };
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
    if !matches!(source, TelemetrySource::Scrape(_))
        && (raw.port.is_some() || !raw.extra.is_empty())
    {
        return Err(invalid(
            key("port"),
            format!("{:?}", raw.port),
            "port and extra apply to source = \"scrape\" only",
        ));
    }
    Ok(TelemetryConfig {
        source,
        interval: Duration::from_millis(interval),
        timeout: Duration::from_millis(timeout),
        max_body,
    })
}

fn telemetry_to_raw(t: &TelemetryConfig) -> RawTelemetry {
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
    RawTelemetry {
        source: Some(source.into()),
        port,
        path,
        extra,
        interval_ms: Some(t.interval.as_millis() as i64),
        timeout_ms: Some(t.timeout.as_millis() as i64),
        max_body_kib: Some((t.max_body / 1024) as i64),
    }
}

fn validate_policy(raw: Option<RawPolicy>, label: &str) -> Result<PolicyConfig, ConfigError> {
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
    let factor = |v: Option<f64>, default: f64, k: &str| -> Result<f64, ConfigError> {
        v.map(|v| float_in(v, 0.0, 1000.0, &key(k)))
            .transpose()
            .map(|v| v.unwrap_or(default))
    };
    let factors = Factors {
        delay: factor(raw.delay_factor, d.factors.delay, "delay_factor")?,
        kv: factor(raw.kv_factor, d.factors.kv, "kv_factor")?,
        gpu_memory: factor(
            raw.gpu_memory_factor,
            d.factors.gpu_memory,
            "gpu_memory_factor",
        )?,
        queue: factor(raw.queue_factor, d.factors.queue, "queue_factor")?,
        tokens: factor(raw.tokens_factor, d.factors.tokens, "tokens_factor")?,
        connections: factor(
            raw.connections_factor,
            d.factors.connections,
            "connections_factor",
        )?,
        ttft: factor(raw.ttft_factor, d.factors.ttft, "ttft_factor")?,
    };
    let unit = |v: Option<f64>, default: f64, min: f64, k: &str| -> Result<f64, ConfigError> {
        v.map(|v| float_in(v, min, 1.0, &key(k)))
            .transpose()
            .map(|v| v.unwrap_or(default))
    };
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
        stale_after: match raw.stale_after_ms {
            Some(v) => Duration::from_millis(int_in(v, 1, 3_600_000, &key("stale_after_ms"))?),
            None => d.stale_after,
        },
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
    })
}

fn policy_to_raw(p: &PolicyConfig) -> RawPolicy {
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
    }
}

/// Whether a VIP name is usable in URLs, metrics labels and the CLI.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// The host part of `prefix` as a mask in host order over the last 32 bits (entropy bits).
pub fn entropy_mask(prefix: &Prefix) -> u32 {
    let host_bits = match prefix.addr {
        IpAddr::V4(_) => 32 - u32::from(prefix.len),
        IpAddr::V6(_) => 128 - u32::from(prefix.len),
    };
    if host_bits >= 32 {
        u32::MAX
    } else {
        (1u32 << host_bits) - 1
    }
}

/// The network part of an IPv4 prefix.
pub fn network_v4(prefix: &Prefix) -> Option<Ipv4Addr> {
    match prefix.addr {
        IpAddr::V4(a) => Some(Ipv4Addr::from(u32::from(a) & !entropy_mask(prefix))),
        IpAddr::V6(_) => None,
    }
}

/// The network part of an IPv6 prefix (at most the last 32 bits cleared).
pub fn network_v6(prefix: &Prefix) -> Option<Ipv6Addr> {
    match prefix.addr {
        IpAddr::V6(a) => Some(Ipv6Addr::from(
            u128::from(a) & !u128::from(entropy_mask(prefix)),
        )),
        IpAddr::V4(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
interface = "eth0"
attach_mode = "skb"

[conntrack]
max_flows = 65536
udp_idle_timeout_secs = 10
flood_threshold = 0

[encap]
source_v4 = "172.16.0.0/16"
mtu = 1500

[[vip]]
name = "web"
address = "10.100.0.1"
port = 80
forwarding = "ipip"

  [[vip.backend]]
  address = "10.0.0.11"
  weight = 2

  [[vip.backend]]
  address = "10.0.0.12"
  mac = "02:00:00:00:00:12"

[[vip]]
address = "2001:db8::1"
port = 53
protocol = "udp"
table_size = 655373
"#;

    #[test]
    fn parses_a_full_config() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.interface, "eth0");
        assert_eq!(c.attach_mode, AttachMode::Skb);
        assert_eq!(c.conntrack.max_flows, 65_536);
        assert_eq!(c.conntrack.udp_idle_timeout, Duration::from_secs(10));
        assert_eq!(c.encap.source_v4, Some("172.16.0.0/16".parse().unwrap()));
        assert_eq!(c.vips.len(), 2);
        let web = c.vip("web").unwrap();
        assert_eq!(web.forwarding, Forwarding::Ipip);
        assert_eq!(web.table_size, DEFAULT_TABLE_SIZE);
        assert_eq!(web.backends[0].weight, 2);
        assert_eq!(web.backends[1].weight, 1);
        assert_eq!(web.backends[1].mac, Some(MacAddr([2, 0, 0, 0, 0, 0x12])));
        let dns = &c.vips[1];
        assert_eq!(dns.name, "udp-2001:db8::1-53");
        assert_eq!(dns.protocol, Protocol::Udp);
        assert_eq!(dns.table_size, 655_373);
        assert!(dns.backends.is_empty());
    }

    #[test]
    fn defaults_apply() {
        let c = Config::parse("interface = \"lo0\"").unwrap();
        assert_eq!(c.attach_mode, AttachMode::Native);
        assert_eq!(c.conntrack.max_flows, DEFAULT_MAX_FLOWS);
        assert_eq!(c.conntrack.flood_threshold, DEFAULT_FLOOD_THRESHOLD);
        assert!(c.vips.is_empty());
    }

    fn error_of(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    fn with_vip(vip_body: &str) -> String {
        format!("interface = \"eth0\"\n[[vip]]\n{vip_body}\n")
    }

    #[test]
    fn pools_give_vips_the_backends_serving_their_model() {
        let text = "interface = \"eth0\"\n\
            [[pool]]\nname = \"gpus\"\ndiscover = \"models\"\n\
            [[pool.backend]]\naddress = \"10.0.0.1\"\n[[pool.backend]]\naddress = \"10.0.0.2\"\nweight = 3\n\
            [[pool]]\nname = \"all\"\n[[pool.backend]]\naddress = \"10.0.0.9\"\n\
            [[vip]]\nname = \"llama\"\naddress = \"10.1.0.1\"\nport = 80\npool = \"gpus\"\nmodel = \"llama\"\n\
            [[vip.backend]]\naddress = \"10.0.0.5\"\n\
            [[vip]]\nname = \"any\"\naddress = \"10.1.0.2\"\nport = 80\npool = \"all\"\nmodel = \"whatever\"\n";
        let mut c = Config::parse(text).unwrap();
        let addrs = |c: &Config, vip: &str| -> Vec<String> {
            c.vip(vip)
                .unwrap()
                .backends
                .iter()
                .map(|b| b.address.to_string())
                .collect()
        };
        // Nothing discovered yet: only the VIP's own backend; a pool without discovery gives all.
        assert_eq!(addrs(&c, "llama"), vec!["10.0.0.5"]);
        assert_eq!(addrs(&c, "any"), vec!["10.0.0.9"]);
        let mut served = std::collections::HashMap::new();
        served.insert(
            "gpus".to_string(),
            [
                ("10.0.0.1".parse().unwrap(), vec!["mistral".to_string()]),
                (
                    "10.0.0.2".parse().unwrap(),
                    vec!["llama".to_string(), "mistral".to_string()],
                ),
            ]
            .into_iter()
            .collect(),
        );
        c.place_pool_backends(&served);
        assert_eq!(addrs(&c, "llama"), vec!["10.0.0.5", "10.0.0.2"]);
        assert_eq!(
            c.vip("llama").unwrap().backends[1].weight,
            3,
            "the pool's settings come along"
        );
        // The file form keeps pool members in the pool.
        let raw = c.to_raw();
        assert_eq!(raw.vip[0].backend.len(), 1);
        assert_eq!(raw.pool[0].backend.len(), 2);
        for (bad, want) in [
            (
                text.replace("pool = \"gpus\"", "pool = \"gpu\""),
                "vip[0].pool = \"gpu\": no [[pool]] has this name",
            ),
            (
                text.replace("discover = \"models\"", "discover = \"dns\""),
                "pool[0].discover = \"dns\"",
            ),
            (
                text.replace("pool = \"all\"\n", ""),
                "vip[1].model = \"whatever\": model routing needs a pool",
            ),
        ] {
            let err = Config::parse(&bad).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn schedulers_and_tiers_are_checked() {
        let tier = "interface = \"eth0\"\n[[tier]]\nname = \"premium\"\nprefixes = [\"10.9.0.0/16\"]\ndscp = [46]\n";
        let ok = format!(
            "{tier}[[vip]]\naddress = \"10.0.0.1\"\nport = 80\nscheduler = \"source-hash\"\nmax_load_factor = 1.25\npersistence_secs = 600\n[[vip.backend]]\naddress = \"10.0.0.2\"\ntier = \"premium\"\n"
        );
        let c = Config::parse(&ok).unwrap();
        assert_eq!(c.tiers[0].id, 1);
        assert!(c.tiers[0].spillover);
        assert_eq!(c.vips[0].scheduler, Scheduler::SourceHash);
        assert_eq!(c.vips[0].load_bound_pct, 25);
        assert_eq!(
            c.vips[0].persistence_ticks(),
            559,
            "600 s in 1.07 s ticks, rounded up"
        );
        // Round trip through the file form.
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        let cases: &[(String, &str)] = &[
            (
                with_vip("address = \"10.0.0.1\"\nport = 80\nscheduler = \"fastest\""),
                "vip[0].scheduler = \"fastest\": expected one of maglev, source-hash",
            ),
            (
                with_vip(
                    "address = \"10.0.0.1\"\nport = 80\nscheduler = \"round-robin\"\nmax_load_factor = 1.5",
                ),
                "vip[0].max_load_factor = 1.5: bounds the load of the hashing schedulers",
            ),
            (
                with_vip("address = \"10.0.0.1\"\nport = 80\nmax_load_factor = 0.9"),
                "vip[0].max_load_factor = 0.9: must be between 1.01 and 3.55",
            ),
            (
                with_vip(
                    "address = \"10.0.0.1\"\nport = 80\n[[vip.backend]]\naddress = \"10.0.0.2\"\ntier = \"gold\"",
                ),
                "vip[0].backend[0].tier = \"gold\": no [[tier]] has this name",
            ),
            (
                format!("{tier}[[tier]]\nname = \"premium\"\ndscp = [10]\n"),
                "tier[1].name = \"premium\": another tier has this name",
            ),
            (
                format!("{tier}[[tier]]\nname = \"gold\"\nprefixes = [\"10.9.0.0/16\"]\n"),
                "tier[1].prefixes[0] = \"10.9.0.0/16\": another tier has this prefix",
            ),
            (
                "interface = \"eth0\"\n[[tier]]\nname = \"x\"\ndscp = [64]\n".into(),
                "tier[0].dscp[0] = 64: must be between 0 and 63",
            ),
            (
                "interface = \"eth0\"\n[[tier]]\nname = \"x\"\n".into(),
                "tier[0].prefixes = (none): a tier needs client prefixes or DSCP values",
            ),
        ];
        for (text, want) in cases {
            let err = Config::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}\n=> {err}\nwanted {want}");
        }
    }

    #[test]
    fn errors_name_the_key_and_the_value() {
        let cases: &[(String, &str)] = &[
            ("attach_mode = \"x\"".into(), "interface = (missing)"),
            (
                "interface = \"eth0\"\nattach_mode = \"fast\"".into(),
                "attach_mode = \"fast\": expected \"native\" or \"skb\"",
            ),
            (
                with_vip("address = \"10.0.0.300\"\nport = 80"),
                "vip[0].address = \"10.0.0.300\": not an IPv4 or IPv6 address",
            ),
            (
                with_vip("address = \"10.0.0.1\"\nport = 0"),
                "vip[0].port = 0: must be between 1 and 65535",
            ),
            (
                with_vip("address = \"10.0.0.1\"\nport = 80\nprotocol = \"sctp\""),
                "vip[0].protocol = \"sctp\"",
            ),
            (
                with_vip("address = \"10.0.0.1\"\nport = 80\ntable_size = 65536"),
                "vip[0].table_size = 65536: must be a prime number",
            ),
            (
                with_vip(
                    "address = \"10.0.0.1\"\nport = 80\n[[vip.backend]]\naddress = \"10.0.0.2\"\nweight = -1",
                ),
                "vip[0].backend[0].weight = -1: must be between 0 and 65535",
            ),
            (
                with_vip(
                    "address = \"10.0.0.1\"\nport = 80\n[[vip.backend]]\naddress = \"10.0.0.2\"\n[[vip.backend]]\naddress = \"10.0.0.2\"",
                ),
                "vip[0].backend[1].address = \"10.0.0.2\": this backend is listed twice",
            ),
            (
                with_vip(
                    "address = \"10.0.0.1\"\nport = 80\n[[vip.backend]]\naddress = \"10.0.0.2\"\nmac = \"02:00:00\"",
                ),
                "vip[0].backend[0].mac = \"02:00:00\"",
            ),
            (
                format!(
                    "{}[[vip]]\naddress = \"10.0.0.1\"\nport = 80\n",
                    with_vip("address = \"10.0.0.1\"\nport = 80")
                ),
                "vip[1] = 10.0.0.1:80/tcp: the same address, port and protocol",
            ),
            (
                "interface = \"eth0\"\n[encap]\nsource_v6 = \"fd00::/64\"".into(),
                "encap.source_v6 = \"fd00::/64\"",
            ),
            (
                "interface = \"eth0\"\nbogus = 1".into(),
                "unknown field `bogus`",
            ),
            (
                "interface = \"eth0\"\n[conntrack]\nmax_flows = 10".into(),
                "conntrack.max_flows = 10: must be between 1024",
            ),
            (
                "interface = \"eth0\"\n[api]\nlisten = \"0.0.0.0:9180\"".into(),
                "api.listen = \"0.0.0.0:9180\": a TCP listener needs api.token_file",
            ),
            (
                "interface = \"eth0\"\n[metrics]\nlisten = \"localhost\"".into(),
                "metrics.listen = \"localhost\": not an address and port",
            ),
            (
                with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.health]\ncheck = \"icmp\""),
                "vip[0].health.check = \"icmp\"",
            ),
            (
                with_vip(
                    "address = \"10.0.0.1\"\nport = 80\n[vip.health]\ncheck = \"tcp\"\ninterval_ms = 100\ntimeout_ms = 200",
                ),
                "vip[0].health.timeout_ms = 200: must not exceed interval_ms (100)",
            ),
            (
                with_vip("address = \"10.0.0.1\"\nport = 80\nname = \"a b\""),
                "vip[0].name = \"a b\"",
            ),
            (
                "interface = \"eth0\"\npin_dir = \"relative/dir\"".into(),
                "pin_dir = \"relative/dir\": must be an absolute path",
            ),
            (
                with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.policy]\nkind = \"gpu\""),
                "vip[0].policy.kind = \"gpu\": this policy needs backend reports",
            ),
            (
                with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.policy]\nkind = \"fastest\""),
                "vip[0].policy.kind = \"fastest\"",
            ),
            (
                with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\""),
                "vip[0].telemetry.port = (missing)",
            ),
            (
                with_vip(
                    "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\"\nport = 8000\nextra = [\"dcgm\"]",
                ),
                "vip[0].telemetry.extra[0] = \"dcgm\": expected \"port/path\"",
            ),
            (
                with_vip(
                    "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"push\"\n[vip.policy]\nkind = \"composite\"\nfloor = 1.5",
                ),
                "vip[0].policy.floor = 1.5: must be between 0 and 1",
            ),
        ];
        for (text, want) in cases {
            let got = error_of(text);
            assert!(
                got.contains(want),
                "config:\n{text}\nexpected an error containing {want:?}, got {got:?}"
            );
        }
    }

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../../config/balancer.example.toml");
        let c = Config::parse(text).unwrap();
        assert_eq!(
            c.vips[0].health.kind,
            HealthCheckKind::Http {
                path: "/health".into(),
                expect_status: 200
            }
        );
        assert_eq!(c.metrics.listen, Some("127.0.0.1:9181".parse().unwrap()));
    }

    #[test]
    fn a_config_survives_its_own_toml() {
        let mut c = Config::parse(GOOD).unwrap();
        c.vips[0].backends[1].drained = true;
        c.vips[0].health = HealthConfig {
            kind: HealthCheckKind::Http {
                path: "/health".into(),
                expect_status: 204,
            },
            port: 8080,
            interval: Duration::from_millis(200),
            timeout: Duration::from_millis(100),
            rise: 1,
            fall: 2,
        };
        let text = c.to_toml();
        assert_eq!(
            Config::parse(&text).unwrap(),
            c,
            "round trip through:\n{text}"
        );
    }

    #[test]
    fn telemetry_and_policy_settings() {
        let c = Config::parse(&with_vip(
            "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\"\nport = 8000\nextra = [\"9400/metrics\"]\ninterval_ms = 200\n[vip.policy]\nkind = \"composite\"\nqueue_factor = 3\nstale = \"keep\"",
        ))
        .unwrap();
        let v = &c.vips[0];
        assert_eq!(
            v.telemetry.source,
            TelemetrySource::Scrape(vec![(8000, "/metrics".into()), (9400, "/metrics".into())])
        );
        assert_eq!(
            (v.telemetry.interval, v.telemetry.timeout),
            (Duration::from_millis(200), Duration::from_millis(160))
        );
        assert_eq!(v.policy.kind, PolicyKind::Composite);
        assert_eq!(v.policy.factors.queue, 3.0);
        assert_eq!(v.policy.stale, StaleMode::Keep);
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn api_and_health_settings() {
        let c = Config::parse(
            "interface = \"eth0\"\n[api]\nlisten = \"127.0.0.1:9180\"\ntoken_file = \"/etc/balancer/token\"\n[metrics]\nlisten = \"[::1]:9181\"\n[[vip]]\naddress = \"10.0.0.1\"\nport = 80\n[vip.health]\ncheck = \"tcp\"\ninterval_ms = 100",
        )
        .unwrap();
        assert_eq!(c.api.listen, Some("127.0.0.1:9180".parse().unwrap()));
        assert_eq!(c.api.socket, PathBuf::from(DEFAULT_API_SOCKET));
        assert_eq!(c.metrics.listen, Some("[::1]:9181".parse().unwrap()));
        assert_eq!(c.pin_dir, PathBuf::from("/sys/fs/bpf/balancer/eth0"));
        let h = &c.vips[0].health;
        assert_eq!((h.kind.clone(), h.port), (HealthCheckKind::Tcp, 80));
        assert_eq!(
            (h.interval, h.timeout),
            (Duration::from_millis(100), Duration::from_millis(50))
        );
        assert_eq!((h.rise, h.fall), (2, 3));
    }

    #[test]
    fn prefixes_and_masks() {
        let p: Prefix = "172.16.0.0/16".parse().unwrap();
        assert_eq!(entropy_mask(&p), 0xffff);
        assert_eq!(network_v4(&p), Some(Ipv4Addr::new(172, 16, 0, 0)));
        assert!(p.contains("172.16.9.9".parse().unwrap()));
        assert!(!p.contains("172.17.0.1".parse().unwrap()));
        let fixed: Prefix = "10.0.0.2".parse().unwrap();
        assert_eq!(fixed.len, 32);
        assert_eq!(entropy_mask(&fixed), 0);
        let v6: Prefix = "fd00::5/96".parse().unwrap();
        assert_eq!(entropy_mask(&v6), u32::MAX);
        assert_eq!(network_v6(&v6), Some("fd00::".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Prefix>().is_err());
    }

    #[test]
    fn macs() {
        assert_eq!(
            "02:0a:FF:00:00:01".parse::<MacAddr>().unwrap().to_string(),
            "02:0a:ff:00:00:01"
        );
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:00:00",
            "0g:00:00:00:00:00",
            "2:00:00:00:00:00",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?} parsed");
        }
    }
}
