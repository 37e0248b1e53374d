//! The `[fleet]` (etcd) and `[bgp]` (BIRD) config tables.
//!
//! ```toml
//! [fleet]
//! etcd = ["10.111.0.9:2379"]     # client endpoints of the etcd cluster (gRPC)
//! prefix = "/balancer/edge1"     # keys of this fleet
//! instance = "lb1"               # this balancer's name in the fleet (default: host name)
//! lease_secs = 3                 # leader lease; a leader silent this long is replaced
//! poll_ms = 200                  # how often leadership is checked (the state itself is watched)
//! # TLS (etcd's --cert-file/--key-file): the CA that signed etcd's certificate turns it on;
//! # a client certificate and key for etcd's --client-cert-auth; the name etcd's certificate
//! # is checked against (default: the endpoint's address, which it must then hold as an IP SAN).
//! ca = "/etc/balancer/etcd/ca.pem"
//! cert = "/etc/balancer/etcd/client.pem"
//! key = "/etc/balancer/etcd/client-key.pem"
//! server_name = "etcd.example.net"
//! # etcd's own authentication (`etcdctl auth enable`): a user and a file holding its password.
//! username = "balancer"
//! password_file = "/etc/balancer/etcd/password"
//!
//! [bgp]
//! routes_v4 = "/run/balancer/bird-vips4.conf"  # included by a BIRD `protocol static` (ipv4)
//! routes_v6 = "/run/balancer/bird-vips6.conf"  # ... and by one for ipv6
//! birdc = "birdc"                               # BIRD's client
//! socket = "/run/bird/bird.ctl"                 # BIRD's control socket
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::fields::{absolute_path, cert_and_key, optional_path};
use super::{ConfigError, invalid};
use crate::base::net::Prefix;

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawFleet {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etcd: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_secs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
}

/// TLS to etcd: the CA that signed its certificate, and optionally this balancer's own
/// certificate and key (for etcd's `--client-cert-auth`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: PathBuf,
    /// (certificate, key), both PEM.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name etcd's certificate is checked against (None: the endpoint's address).
    pub server_name: Option<String>,
}

/// etcd's own authentication: a user and the file its password is read from (at connect).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdAuth {
    pub username: String,
    pub password_file: PathBuf,
}

/// A fleet of balancers sharing their desired state through etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetConfig {
    pub etcd: Vec<SocketAddr>,
    pub prefix: String,
    pub instance: String,
    pub lease: Duration,
    pub poll: Duration,
    pub tls: Option<EtcdTls>,
    pub auth: Option<EtcdAuth>,
}

impl FleetConfig {
    /// The key the leader holds (value: its instance name, under its lease).
    pub fn leader_key(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    /// The key of the published state (JSON, see [`super::FleetState`]).
    pub fn state_key(&self) -> String {
        format!("{}/state", self.prefix)
    }

    pub fn to_raw(&self) -> RawFleet {
        RawFleet {
            etcd: self.etcd.iter().map(SocketAddr::to_string).collect(),
            prefix: Some(self.prefix.clone()),
            instance: Some(self.instance.clone()),
            lease_secs: Some(self.lease.as_secs() as i64),
            poll_ms: Some(self.poll.as_millis() as i64),
            ca: self.tls.as_ref().map(|t| t.ca.display().to_string()),
            cert: (self.tls.as_ref())
                .and_then(|t| t.identity.as_ref())
                .map(|(c, _)| c.display().to_string()),
            key: (self.tls.as_ref())
                .and_then(|t| t.identity.as_ref())
                .map(|(_, k)| k.display().to_string()),
            server_name: self.tls.as_ref().and_then(|t| t.server_name.clone()),
            username: self.auth.as_ref().map(|a| a.username.clone()),
            password_file: (self.auth.as_ref()).map(|a| a.password_file.display().to_string()),
        }
    }
}

pub fn validate_fleet(raw: RawFleet) -> Result<Option<FleetConfig>, ConfigError> {
    if raw.etcd.is_empty() {
        if raw.prefix.is_some()
            || raw.instance.is_some()
            || raw.lease_secs.is_some()
            || raw.poll_ms.is_some()
            || raw.ca.is_some()
            || raw.cert.is_some()
            || raw.key.is_some()
            || raw.server_name.is_some()
            || raw.username.is_some()
            || raw.password_file.is_some()
        {
            return Err(invalid(
                "fleet.etcd",
                "[]",
                "a [fleet] needs at least one etcd endpoint",
            ));
        }
        return Ok(None);
    }
    let etcd = validate_endpoints(&raw.etcd)?;
    let prefix = validate_prefix(raw.prefix)?;
    let instance = validate_instance(raw.instance)?;
    let lease_secs = raw.lease_secs.unwrap_or(3);
    if !(2..=60).contains(&lease_secs) {
        return Err(invalid(
            "fleet.lease_secs",
            lease_secs,
            "must be 2-60 seconds",
        ));
    }
    let poll_ms = raw.poll_ms.unwrap_or(200);
    if !(50..=10_000).contains(&poll_ms) || poll_ms >= lease_secs * 1000 / 2 {
        return Err(invalid(
            "fleet.poll_ms",
            poll_ms,
            "must be 50-10000 ms and under half the lease",
        ));
    }
    let tls = validate_tls(raw.ca, raw.cert, raw.key, raw.server_name)?;
    let auth = validate_auth(raw.username, raw.password_file)?;
    if auth.is_some() && tls.is_none() {
        return Err(invalid(
            "fleet.username",
            "(set)",
            "etcd credentials need TLS (fleet.ca): without it the password crosses the network in the clear",
        ));
    }
    Ok(Some(FleetConfig {
        etcd,
        prefix,
        instance,
        lease: Duration::from_secs(lease_secs as u64),
        poll: Duration::from_millis(poll_ms as u64),
        tls,
        auth,
    }))
}

/// The etcd client endpoints, each an address and port.
fn validate_endpoints(raw: &[String]) -> Result<Vec<SocketAddr>, ConfigError> {
    raw.iter()
        .enumerate()
        .map(|(i, e)| {
            e.parse::<SocketAddr>().map_err(|_| {
                invalid(
                    format!("fleet.etcd[{i}]"),
                    format!("{e:?}"),
                    "not an etcd client endpoint like 10.0.0.9:2379 or [fd00::9]:2379",
                )
            })
        })
        .collect()
}

/// The key prefix of the fleet's state in etcd.
fn validate_prefix(raw: Option<String>) -> Result<String, ConfigError> {
    let prefix = raw.unwrap_or_else(|| "/balancer".to_string());
    if !prefix.starts_with('/')
        || prefix.ends_with('/')
        || prefix.len() > 200
        || prefix.chars().any(char::is_whitespace)
    {
        return Err(invalid(
            "fleet.prefix",
            format!("{prefix:?}"),
            "must start with '/', not end with one, have no spaces and be at most 200 characters",
        ));
    }
    Ok(prefix)
}

/// This balancer's name in the fleet (the host name by default).
fn validate_instance(raw: Option<String>) -> Result<String, ConfigError> {
    let instance = match raw {
        Some(i) => i,
        None => host_name().ok_or_else(|| {
            invalid(
                "fleet.instance",
                "(absent)",
                "no host name to default to; set one",
            )
        })?,
    };
    if instance.is_empty()
        || instance.len() > 64
        || !instance
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(invalid(
            "fleet.instance",
            format!("{instance:?}"),
            "1-64 characters of letters, digits, '-', '_' and '.'",
        ));
    }
    Ok(instance)
}

/// etcd credentials: a user and the file holding its password, both or neither.
fn validate_auth(
    username: Option<String>,
    password_file: Option<String>,
) -> Result<Option<EtcdAuth>, ConfigError> {
    let auth = match (username, password_file) {
        (None, None) => None,
        (Some(username), Some(file)) => {
            if username.is_empty() || username.len() > 128 || username.contains(char::is_whitespace)
            {
                return Err(invalid(
                    "fleet.username",
                    format!("{username:?}"),
                    "1-128 characters, no spaces",
                ));
            }
            Some(EtcdAuth {
                username,
                password_file: absolute_path(file, "fleet.password_file")?,
            })
        }
        (Some(_), None) => {
            return Err(invalid(
                "fleet.password_file",
                "(absent)",
                "fleet.username needs a file holding its password",
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "fleet.username",
                "(absent)",
                "fleet.password_file needs the user it is the password of",
            ));
        }
    };
    Ok(auth)
}

fn validate_tls(
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    server_name: Option<String>,
) -> Result<Option<EtcdTls>, ConfigError> {
    let Some(ca) = ca else {
        for (field, value) in [
            ("fleet.cert", &cert),
            ("fleet.key", &key),
            ("fleet.server_name", &server_name),
        ] {
            if value.is_some() {
                return Err(invalid(
                    field,
                    "(set)",
                    "TLS to etcd needs fleet.ca, the CA that signed etcd's certificate",
                ));
            }
        }
        return Ok(None);
    };
    let identity = cert_and_key(
        optional_path(cert, "fleet.cert")?,
        optional_path(key, "fleet.key")?,
        "fleet.cert",
        "fleet.key",
    )?;
    if let Some(name) = &server_name
        && (name.is_empty()
            || name.len() > 253
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-.".contains(c)))
    {
        return Err(invalid(
            "fleet.server_name",
            format!("{name:?}"),
            "a DNS name like etcd.example.net",
        ));
    }
    Ok(Some(EtcdTls {
        ca: absolute_path(ca, "fleet.ca")?,
        identity,
        server_name,
    }))
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBgp {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routes_v4: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routes_v6: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub birdc: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
}

/// VIP announcement through BIRD: route include files plus `birdc configure`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BgpConfig {
    pub routes_v4: PathBuf,
    pub routes_v6: PathBuf,
    pub birdc: String,
    pub socket: PathBuf,
    /// The prefixes this balancer may announce: a VIP outside every one is not announced,
    /// whoever added it.
    pub prefixes: Vec<Prefix>,
}

impl BgpConfig {
    /// Whether a VIP address may be announced.
    pub fn may_announce(&self, address: IpAddr) -> bool {
        self.prefixes.iter().any(|p| p.contains(address))
    }
}

impl BgpConfig {
    pub fn to_raw(&self) -> RawBgp {
        RawBgp {
            routes_v4: Some(self.routes_v4.display().to_string()),
            routes_v6: Some(self.routes_v6.display().to_string()),
            birdc: Some(self.birdc.clone()),
            socket: Some(self.socket.display().to_string()),
            prefixes: self.prefixes.iter().map(ToString::to_string).collect(),
        }
    }
}

pub fn validate_bgp(raw: RawBgp) -> Result<Option<BgpConfig>, ConfigError> {
    if raw.routes_v4.is_none()
        && raw.routes_v6.is_none()
        && raw.birdc.is_none()
        && raw.socket.is_none()
        && raw.prefixes.is_empty()
    {
        return Ok(None);
    }

    let path = |v: Option<String>, key: &str| -> Result<PathBuf, ConfigError> {
        match v {
            Some(p) if p.starts_with('/') && !p.contains("..") && !p.contains('"') => {
                Ok(PathBuf::from(p))
            }
            Some(p) => Err(invalid(
                key,
                format!("{p:?}"),
                "must be an absolute path without '..' or '\"'",
            )),
            None => Err(invalid(key, "(absent)", "required in [bgp]")),
        }
    };
    let routes_v4 = path(raw.routes_v4, "bgp.routes_v4")?;
    let routes_v6 = path(raw.routes_v6, "bgp.routes_v6")?;
    if routes_v4 == routes_v6 {
        return Err(invalid(
            "bgp.routes_v6",
            format!("{:?}", routes_v6.display().to_string()),
            "must differ from bgp.routes_v4 (a BIRD static protocol has one address family)",
        ));
    }
    let socket = path(
        raw.socket.or_else(|| Some("/run/bird/bird.ctl".into())),
        "bgp.socket",
    )?;
    let birdc = raw.birdc.unwrap_or_else(|| "birdc".into());
    if birdc.is_empty() || birdc.contains(char::is_whitespace) {
        return Err(invalid(
            "bgp.birdc",
            format!("{birdc:?}"),
            "a program name or path, no spaces",
        ));
    }
    if raw.prefixes.is_empty() {
        return Err(invalid(
            "bgp.prefixes",
            "(absent)",
            "required in [bgp]: the prefixes whose VIPs this balancer may announce",
        ));
    }
    let prefixes = raw
        .prefixes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            p.parse::<Prefix>()
                .map_err(|why| invalid(format!("bgp.prefixes[{i}]"), format!("{p:?}"), why))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(BgpConfig {
        routes_v4,
        routes_v6,
        birdc,
        socket,
        prefixes,
    }))
}

#[cfg(test)]
mod tests;
