//! The host-wide sections: how the program attaches, the connection table (`[conntrack]`),
//! encapsulation (`[encap]`), the control API (`[api]`) and the metrics listener (`[metrics]`).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::net::Prefix;

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
