//! The `[fleet]` (etcd) and `[bgp]` (BIRD) config tables.
//!
//! ```toml
//! [fleet]
//! etcd = ["10.111.0.9:2379"]     # client endpoints of the etcd cluster (its JSON gateway)
//! prefix = "/balancer/edge1"     # keys of this fleet
//! instance = "lb1"               # this balancer's name in the fleet (default: host name)
//! lease_secs = 3                 # leader lease; a leader silent this long is replaced
//! poll_ms = 200                  # how often the published state is read
//!
//! [bgp]
//! routes_v4 = "/run/balancer/bird-vips4.conf"  # included by a BIRD `protocol static` (ipv4)
//! routes_v6 = "/run/balancer/bird-vips6.conf"  # ... and by one for ipv6
//! birdc = "birdc"                               # BIRD's client
//! socket = "/run/bird/bird.ctl"                 # BIRD's control socket
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

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
}

/// A fleet of balancers sharing their desired state through etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetConfig {
    pub etcd: Vec<SocketAddr>,
    pub prefix: String,
    pub instance: String,
    pub lease: Duration,
    pub poll: Duration,
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
        }
    }
}

pub fn validate_fleet(raw: RawFleet) -> Result<Option<FleetConfig>, ConfigError> {
    if raw.etcd.is_empty() {
        if raw.prefix.is_some()
            || raw.instance.is_some()
            || raw.lease_secs.is_some()
            || raw.poll_ms.is_some()
        {
            return Err(invalid(
                "fleet.etcd",
                "[]",
                "a [fleet] needs at least one etcd endpoint",
            ));
        }
        return Ok(None);
    }
    let etcd = raw
        .etcd
        .iter()
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
        .collect::<Result<Vec<_>, _>>()?;
    let prefix = raw.prefix.unwrap_or_else(|| "/balancer".to_string());
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
    let instance = match raw.instance {
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
    Ok(Some(FleetConfig {
        etcd,
        prefix,
        instance,
        lease: Duration::from_secs(lease_secs as u64),
        poll: Duration::from_millis(poll_ms as u64),
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
}

/// VIP announcement through BIRD: route include files plus `birdc configure`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BgpConfig {
    pub routes_v4: PathBuf,
    pub routes_v6: PathBuf,
    pub birdc: String,
    pub socket: PathBuf,
}

impl BgpConfig {
    pub fn to_raw(&self) -> RawBgp {
        RawBgp {
            routes_v4: Some(self.routes_v4.display().to_string()),
            routes_v6: Some(self.routes_v6.display().to_string()),
            birdc: Some(self.birdc.clone()),
            socket: Some(self.socket.display().to_string()),
        }
    }
}

pub fn validate_bgp(raw: RawBgp) -> Result<Option<BgpConfig>, ConfigError> {
    if raw.routes_v4.is_none()
        && raw.routes_v6.is_none()
        && raw.birdc.is_none()
        && raw.socket.is_none()
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
    Ok(Some(BgpConfig {
        routes_v4,
        routes_v6,
        birdc,
        socket,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_defaults_and_errors() {
        assert_eq!(validate_fleet(RawFleet::default()).unwrap(), None);
        let f = validate_fleet(RawFleet {
            etcd: vec!["10.0.0.9:2379".into()],
            instance: Some("lb1".into()),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(f.prefix, "/balancer");
        assert_eq!(f.leader_key(), "/balancer/leader");
        assert_eq!(f.lease, Duration::from_secs(3));
        let err = |raw: RawFleet| validate_fleet(raw).unwrap_err().to_string();
        assert!(
            err(RawFleet {
                prefix: Some("/x".into()),
                ..Default::default()
            })
            .contains("fleet.etcd")
        );
        let base = RawFleet {
            etcd: vec!["10.0.0.9:2379".into()],
            instance: Some("lb1".into()),
            ..Default::default()
        };
        assert!(
            err(RawFleet {
                etcd: vec!["etcd:2379".into()],
                ..base.clone()
            })
            .contains("fleet.etcd[0]")
        );
        assert!(
            err(RawFleet {
                prefix: Some("balancer/".into()),
                ..base.clone()
            })
            .contains("fleet.prefix")
        );
        assert!(
            err(RawFleet {
                instance: Some("lb 1".into()),
                ..base.clone()
            })
            .contains("fleet.instance")
        );
        assert!(
            err(RawFleet {
                lease_secs: Some(1),
                ..base.clone()
            })
            .contains("fleet.lease_secs")
        );
        assert!(
            err(RawFleet {
                poll_ms: Some(2000),
                ..base
            })
            .contains("fleet.poll_ms")
        );
    }

    #[test]
    fn bgp_needs_both_route_files() {
        assert_eq!(validate_bgp(RawBgp::default()).unwrap(), None);
        let e = validate_bgp(RawBgp {
            routes_v4: Some("/run/v4.conf".into()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("bgp.routes_v6"), "{e}");
        let b = validate_bgp(RawBgp {
            routes_v4: Some("/run/v4.conf".into()),
            routes_v6: Some("/run/v6.conf".into()),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(b.birdc, "birdc");
        assert_eq!(validate_bgp(b.to_raw()).unwrap(), Some(b));
    }
}
