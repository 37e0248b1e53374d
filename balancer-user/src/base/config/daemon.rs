//! The host-wide sections: how the program attaches, the connection table (`[conntrack]`),
//! encapsulation (`[encap]`), the control API (`[api]`) and the metrics listener (`[metrics]`).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::DEFAULT_API_SOCKET;
use super::error::{ConfigError, invalid};
use super::fields::{absolute_path, cert_and_key, optional_path, parse_socket_addr};
use super::raw::RawApi;
use crate::base::net::Prefix;

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
    /// File holding the bearer token of the TCP listener's admin role (every route).
    pub token_file: Option<PathBuf>,
    /// File holding the token of the read role (GET routes only).
    pub read_token_file: Option<PathBuf>,
    /// File holding the token of the push role: `POST /v1/backends/{addr}/report` only, for
    /// the backend whose address the connection comes from.
    pub push_token_file: Option<PathBuf>,
    /// The directory under which the files that VIPs added at run time (over the API, or by
    /// the fleet) name must lie; None: they may name none.
    pub file_dir: Option<PathBuf>,
    /// TLS on the TCP listener.
    pub tls: Option<ApiTls>,
}

impl ApiConfig {
    pub(super) fn to_raw(&self) -> RawApi {
        let path = |p: &PathBuf| p.display().to_string();
        RawApi {
            socket: Some(path(&self.socket)),
            listen: self.listen.map(|l| l.to_string()),
            token_file: self.token_file.as_ref().map(path),
            read_token_file: self.read_token_file.as_ref().map(path),
            push_token_file: self.push_token_file.as_ref().map(path),
            file_dir: self.file_dir.as_ref().map(path),
            cert: self.tls.as_ref().map(|t| path(&t.cert)),
            key: self.tls.as_ref().map(|t| path(&t.key)),
            client_ca: self
                .tls
                .as_ref()
                .and_then(|t| t.client_ca.as_ref())
                .map(path),
        }
    }
}

/// TLS of the API's TCP listener: its certificate and key (PEM), and optionally the CA whose
/// client certificates it requires (beside the bearer token).
#[derive(Clone, Debug, PartialEq)]
pub struct ApiTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// The Prometheus exporter.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsConfig {
    /// Where `/metrics` is served; `None` = off.
    pub listen: Option<SocketAddr>,
}

/// The `[api]` section: the socket, and a TCP listener only with a token (and TLS only on it).
pub(super) fn validate_api(raw: RawApi) -> Result<ApiConfig, ConfigError> {
    let socket = match raw.socket {
        Some(s) => absolute_path(s, "api.socket")?,
        None => PathBuf::from(DEFAULT_API_SOCKET),
    };
    let listen = raw
        .listen
        .as_deref()
        .map(|l| parse_socket_addr(l, "api.listen"))
        .transpose()?;
    let token_file = optional_path(raw.token_file, "api.token_file")?;
    let read_token_file = optional_path(raw.read_token_file, "api.read_token_file")?;
    let push_token_file = optional_path(raw.push_token_file, "api.push_token_file")?;
    let file_dir = optional_path(raw.file_dir, "api.file_dir")?;
    if listen.is_none() {
        for (key, set) in [
            ("api.read_token_file", read_token_file.is_some()),
            ("api.push_token_file", push_token_file.is_some()),
        ] {
            if set {
                return Err(invalid(
                    key,
                    "(set)",
                    "roles apply to the TCP listener: set api.listen too",
                ));
            }
        }
    }
    let cert = optional_path(raw.cert, "api.cert")?;
    let key = optional_path(raw.key, "api.key")?;
    let client_ca = optional_path(raw.client_ca, "api.client_ca")?;
    if let (Some(listen), None) = (&listen, &token_file) {
        return Err(invalid(
            "api.listen",
            format!("{:?}", listen.to_string()),
            "a TCP listener needs api.token_file (a bearer token); refusing to serve the API unauthenticated",
        ));
    }
    let identity = cert_and_key(cert, key, "api.cert", "api.key")?;
    if listen.is_none() && (identity.is_some() || client_ca.is_some()) {
        let k = if identity.is_some() {
            "api.cert"
        } else {
            "api.client_ca"
        };
        return Err(invalid(
            k,
            "(set)",
            "TLS applies to the TCP listener: set api.listen too",
        ));
    }
    let tls = match (identity, client_ca) {
        (Some((cert, key)), client_ca) => Some(ApiTls {
            cert,
            key,
            client_ca,
        }),
        (None, Some(_)) => {
            return Err(invalid(
                "api.client_ca",
                "(set)",
                "client certificates are checked in TLS: set api.cert and api.key too",
            ));
        }
        (None, None) => None,
    };
    Ok(ApiConfig {
        socket,
        listen,
        token_file,
        read_token_file,
        push_token_file,
        file_dir,
        tls,
    })
}
