//! The daemon's TOML configuration: parsed into raw serde structs, then validated into
//! [`Config`] with errors that name the offending key and value. Nothing binds, loads or
//! attaches until a config has passed [`Config::parse`].

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use balancer_common::maglev::is_prime;
use balancer_common::maps::{DEFAULT_TABLE_SIZE, MAX_BACKENDS, MAX_TABLE_SIZE, MAX_VIPS};
use serde::Deserialize;

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

fn invalid(
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
    /// Relative share of new flows; 0 drains (no new flows, established ones continue).
    pub weight: u32,
    /// Next-hop MAC; default: looked up in the neighbour table (the backend's own when on
    /// the link, else its gateway's).
    pub mac: Option<MacAddr>,
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
    pub backends: Vec<BackendConfig>,
}

impl VipConfig {
    /// The (address, port, protocol) that identifies the VIP.
    pub fn endpoint(&self) -> (IpAddr, u16, Protocol) {
        (self.address, self.port, self.protocol)
    }
}

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Interface the XDP program attaches to.
    pub interface: String,
    pub attach_mode: AttachMode,
    pub conntrack: ConntrackConfig,
    pub encap: EncapConfig,
    pub vips: Vec<VipConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    interface: Option<String>,
    attach_mode: Option<String>,
    #[serde(default)]
    conntrack: RawConntrack,
    #[serde(default)]
    encap: RawEncap,
    #[serde(default)]
    vip: Vec<RawVip>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConntrack {
    max_flows: Option<i64>,
    udp_idle_timeout_secs: Option<i64>,
    flood_threshold: Option<i64>,
    removal_grace_secs: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEncap {
    source_v4: Option<String>,
    source_v6: Option<String>,
    mtu: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVip {
    name: Option<String>,
    address: Option<String>,
    port: Option<i64>,
    protocol: Option<String>,
    forwarding: Option<String>,
    gue_port: Option<i64>,
    table_size: Option<i64>,
    #[serde(default)]
    backend: Vec<RawBackend>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    address: Option<String>,
    weight: Option<i64>,
    mac: Option<String>,
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

        if raw.vip.len() > MAX_VIPS as usize {
            return Err(invalid(
                "vip",
                format!("{} entries", raw.vip.len()),
                format!("at most {MAX_VIPS} VIPs are supported"),
            ));
        }
        let mut vips = Vec::with_capacity(raw.vip.len());
        let mut endpoints = HashSet::new();
        let mut names = HashSet::new();
        let mut total_backends = 0usize;
        for (i, raw_vip) in raw.vip.into_iter().enumerate() {
            let vip = validate_vip(raw_vip, i)?;
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
            vips.push(vip);
        }
        if total_backends > MAX_BACKENDS as usize {
            return Err(invalid(
                "vip[].backend",
                format!("{total_backends} entries"),
                format!("at most {MAX_BACKENDS} backends over all VIPs are supported"),
            ));
        }
        Ok(Config {
            interface,
            attach_mode,
            conntrack,
            encap,
            vips,
        })
    }

    /// The VIP with this name.
    pub fn vip(&self, name: &str) -> Option<&VipConfig> {
        self.vips.iter().find(|v| v.name == name)
    }
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

fn validate_vip(raw: RawVip, i: usize) -> Result<VipConfig, ConfigError> {
    let key = |k: &str| format!("vip[{i}].{k}");
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
        Some(n) if n.is_empty() || n.len() > 64 || n.contains(char::is_whitespace) => {
            return Err(invalid(
                key("name"),
                format!("{n:?}"),
                "a name is 1-64 characters without spaces",
            ));
        }
        Some(n) => n,
        None => format!("{protocol}-{address}-{port}"),
    };
    let mut backends = Vec::with_capacity(raw.backend.len());
    let mut seen = HashSet::new();
    for (j, b) in raw.backend.into_iter().enumerate() {
        let bkey = |k: &str| format!("vip[{i}].backend[{j}].{k}");
        let text = required(b.address, &bkey("address"))?;
        let address = parse_ip(&text, &bkey("address"))?;
        if address.is_unspecified() || address.is_multicast() {
            return Err(invalid(
                bkey("address"),
                format!("{text:?}"),
                "a backend must be a unicast address",
            ));
        }
        if !seen.insert(address) {
            return Err(invalid(
                bkey("address"),
                format!("{text:?}"),
                "this backend is listed twice for the VIP",
            ));
        }
        let weight = match b.weight {
            Some(w) => int_in(w, 0, MAX_WEIGHT.into(), &bkey("weight"))?,
            None => 1,
        };
        let mac = b
            .mac
            .map(|m| parse_field::<MacAddr>(&m, &bkey("mac")))
            .transpose()?;
        backends.push(BackendConfig {
            address,
            weight,
            mac,
        });
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
        backends,
    })
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
