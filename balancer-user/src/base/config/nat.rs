//! `[nat]` and a VIP's `nat_source`: the link `nat` VIPs' backends are on, and source NAT
//! (the backends then need nothing at all: their replies come back to the balancer's address).

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use super::error::{ConfigError, invalid};
use super::fields::{check_interface_name, int_in};
use super::raw::RawNat;
use super::vip::Forwarding;

/// Default source ports: below Linux's default ephemeral range (32768-60999), so the host's
/// own connections (health checks, scrapes) never take a port a translated flow holds.
pub const DEFAULT_NAT_PORTS: RangeInclusive<u16> = 1024..=32767;
/// A TCP flow with no packet either way for this long is forgotten (IPVS's default).
pub const DEFAULT_NAT_TCP_IDLE_SECS: u64 = 900;
/// A TCP flow that sent FIN or RST is forgotten this long after its last packet.
pub const DEFAULT_NAT_TCP_CLOSED_SECS: u64 = 30;
/// A UDP flow with no packet either way for this long is forgotten.
pub const DEFAULT_NAT_UDP_IDLE_SECS: u64 = 120;
/// Most source-NAT ports one client address holds at once: no limit unless set. A closed
/// connection holds its port for `tcp_closed_timeout_secs`, so a quota of Q ports lets one
/// address open about Q / 30 connections a second: any default low enough to matter would
/// cut off a proxy or a client NAT in front of the balancer.
pub const DEFAULT_NAT_CLIENT_PORTS: u16 = 0;

/// NAT settings: the backends' link, and source NAT's ports and timeouts (shared by every VIP
/// with a `nat_source`).
#[derive(Clone, Debug, PartialEq)]
pub struct NatConfig {
    /// The interface `nat` VIPs' backends are on and their replies arrive on, when it is not
    /// `interface` (the clients'): the program runs on both and moves frames between them.
    pub interface: Option<String>,
    /// The source ports flows take, per backend address and port.
    pub ports: RangeInclusive<u16>,
    pub tcp_idle_timeout: Duration,
    pub tcp_closed_timeout: Duration,
    pub udp_idle_timeout: Duration,
    /// Most ports one client address's flows hold at once (0: no limit).
    pub client_ports: u16,
}

impl Default for NatConfig {
    fn default() -> Self {
        NatConfig {
            interface: None,
            ports: DEFAULT_NAT_PORTS,
            tcp_idle_timeout: Duration::from_secs(DEFAULT_NAT_TCP_IDLE_SECS),
            tcp_closed_timeout: Duration::from_secs(DEFAULT_NAT_TCP_CLOSED_SECS),
            udp_idle_timeout: Duration::from_secs(DEFAULT_NAT_UDP_IDLE_SECS),
            client_ports: DEFAULT_NAT_CLIENT_PORTS,
        }
    }
}

impl NatConfig {
    /// How many ports the range holds (at most 65,535: port 0 is never one).
    pub fn port_count(&self) -> u16 {
        (u32::from(*self.ports.end()) - u32::from(*self.ports.start()) + 1) as u16
    }

    pub fn to_raw(&self) -> RawNat {
        RawNat {
            interface: self.interface.clone(),
            ports: Some(format!("{}-{}", self.ports.start(), self.ports.end())),
            tcp_idle_timeout_secs: Some(self.tcp_idle_timeout.as_secs() as i64),
            tcp_closed_timeout_secs: Some(self.tcp_closed_timeout.as_secs() as i64),
            udp_idle_timeout_secs: Some(self.udp_idle_timeout.as_secs() as i64),
            client_ports: Some(i64::from(self.client_ports)),
        }
    }
}

/// The address a `nat` VIP's flows leave from, so the backends reply to the balancer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NatSource {
    /// The interface's first address of the VIP's family.
    Interface,
    /// These addresses: one per family at most; the VIP's family's is used.
    Addresses(Vec<IpAddr>),
}

impl NatSource {
    /// The configured address of `family`'s (IPv4 when `v4`), if any; `None` for
    /// [`NatSource::Interface`] (resolved against the interface by the daemon).
    pub fn address(&self, v4: bool) -> Option<IpAddr> {
        match self {
            NatSource::Interface => None,
            NatSource::Addresses(a) => a.iter().copied().find(|a| a.is_ipv4() == v4),
        }
    }

    pub fn to_raw(&self) -> Vec<String> {
        match self {
            NatSource::Interface => vec!["interface".into()],
            NatSource::Addresses(a) => a.iter().map(IpAddr::to_string).collect(),
        }
    }
}

/// Validates `[nat]`; `interface` is the config's (the clients' link).
pub fn validate_nat(raw: RawNat, interface: &str) -> Result<NatConfig, ConfigError> {
    if let Some(name) = &raw.interface {
        check_interface_name(name, "nat.interface")?;
        if name == interface {
            return Err(invalid(
                "nat.interface",
                format!("{name:?}"),
                "is the clients' interface already; leave nat.interface out when the backends are on the same link",
            ));
        }
    }
    let secs = |v: Option<i64>, default: u64, key: &str| -> Result<Duration, ConfigError> {
        Ok(Duration::from_secs(match v {
            Some(v) => int_in(v, 1, 7 * 86_400, key)?,
            None => default,
        }))
    };
    let ports = match raw.ports {
        Some(text) => parse_ports(&text)?,
        None => DEFAULT_NAT_PORTS,
    };
    Ok(NatConfig {
        interface: raw.interface,
        ports,
        tcp_idle_timeout: secs(
            raw.tcp_idle_timeout_secs,
            DEFAULT_NAT_TCP_IDLE_SECS,
            "nat.tcp_idle_timeout_secs",
        )?,
        tcp_closed_timeout: secs(
            raw.tcp_closed_timeout_secs,
            DEFAULT_NAT_TCP_CLOSED_SECS,
            "nat.tcp_closed_timeout_secs",
        )?,
        udp_idle_timeout: secs(
            raw.udp_idle_timeout_secs,
            DEFAULT_NAT_UDP_IDLE_SECS,
            "nat.udp_idle_timeout_secs",
        )?,
        client_ports: match raw.client_ports {
            Some(v) => int_in(v, 0, 65_535, "nat.client_ports")?,
            None => DEFAULT_NAT_CLIENT_PORTS,
        },
    })
}

/// `"FIRST-LAST"`, both in 1..=65535, FIRST <= LAST.
fn parse_ports(text: &str) -> Result<RangeInclusive<u16>, ConfigError> {
    let bad = |why: &str| invalid("nat.ports", format!("{text:?}"), why.to_string());
    let (first, last) = text
        .split_once('-')
        .ok_or_else(|| bad("expected a range FIRST-LAST, e.g. \"1024-32767\""))?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("ports are 1-65535"))
    };
    let (first, last) = (port(first)?, port(last)?);
    if first > last {
        return Err(bad("the first port is above the last"));
    }
    Ok(first..=last)
}

/// Validates a VIP's `nat_source` (`label`: e.g. `vip[0]`).
pub fn validate_nat_source(
    raw: Vec<String>,
    forwarding: Forwarding,
    vip: IpAddr,
    label: &str,
) -> Result<Option<NatSource>, ConfigError> {
    if raw.is_empty() {
        return Ok(None);
    }
    let key = format!("{label}.nat_source");
    let shown = format!("{raw:?}");
    if forwarding != Forwarding::Nat {
        return Err(invalid(
            key,
            shown,
            "only a VIP with forwarding = \"nat\" translates sources",
        ));
    }
    if raw.len() == 1 && raw[0] == "interface" {
        return Ok(Some(NatSource::Interface));
    }
    let mut addresses: Vec<IpAddr> = Vec::with_capacity(raw.len());
    for text in &raw {
        let a: IpAddr = text.parse().map_err(|_| {
            invalid(
                key.clone(),
                shown.clone(),
                format!("{text:?} is neither \"interface\" nor an IP address"),
            )
        })?;
        if a.is_unspecified() || a.is_multicast() || a.is_loopback() {
            return Err(invalid(
                key,
                shown,
                format!("{a} is not a unicast address this host can receive on"),
            ));
        }
        if addresses.iter().any(|b| b.is_ipv4() == a.is_ipv4()) {
            return Err(invalid(key, shown, "at most one address per family"));
        }
        addresses.push(a);
    }
    if !addresses.iter().any(|a| a.is_ipv4() == vip.is_ipv4()) {
        return Err(invalid(
            key,
            shown,
            format!(
                "no {} address for VIP address {vip}",
                if vip.is_ipv4() { "IPv4" } else { "IPv6" }
            ),
        ));
    }
    Ok(Some(NatSource::Addresses(addresses)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn port_ranges_are_checked() {
        assert_eq!(parse_ports("2000-3000").unwrap(), 2000..=3000);
        assert_eq!(parse_ports(" 5 - 5 ").unwrap(), 5..=5);
        for (text, why) in [
            ("2000", "expected a range"),
            ("0-10", "ports are 1-65535"),
            ("10-70000", "ports are 1-65535"),
            ("3000-2000", "the first port is above the last"),
        ] {
            let e = parse_ports(text).unwrap_err().to_string();
            assert!(e.contains("nat.ports") && e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn a_clients_quota_of_ports_is_0_to_65535() {
        let nat = |v| {
            validate_nat(
                RawNat {
                    client_ports: v,
                    ..RawNat::default()
                },
                "eth0",
            )
        };
        assert_eq!(nat(None).unwrap().client_ports, DEFAULT_NAT_CLIENT_PORTS);
        assert_eq!(nat(Some(0)).unwrap().client_ports, 0);
        assert_eq!(nat(Some(65_535)).unwrap().client_ports, 65_535);
        for bad in [-1, 65_536] {
            let e = nat(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("nat.client_ports"), "{e}");
        }
        let config = nat(Some(9)).unwrap();
        assert_eq!(validate_nat(config.to_raw(), "eth0").unwrap(), config);
    }

    #[test]
    fn the_backends_link_is_another_interface() {
        let nat = |interface: &str| {
            crate::base::config::Config::parse(&format!(
                "interface = \"eth0\"\n[nat]\ninterface = \"{interface}\""
            ))
        };
        let config = nat("eth1.100").unwrap();
        assert_eq!(config.nat.interface.as_deref(), Some("eth1.100"));
        assert_eq!(
            crate::base::config::Config::parse(&config.to_toml()).unwrap(),
            config,
            "written back as read"
        );
        assert_eq!(
            crate::base::config::Config::parse("interface = \"eth0\"")
                .unwrap()
                .nat
                .interface,
            None
        );
        for (name, why) in [
            ("eth0", "is the clients' interface already"),
            ("a/b", "not a network interface name"),
            ("", "not a network interface name"),
        ] {
            let e = nat(name).unwrap_err().to_string();
            assert!(
                e.contains("nat.interface") && e.contains(why),
                "{name}: {e}"
            );
        }
    }

    #[test]
    fn a_nat_source_has_an_address_of_the_vips_family() {
        let v = |raw: &[&str], fwd, vip: &str| {
            validate_nat_source(
                raw.iter().map(|s| s.to_string()).collect(),
                fwd,
                ip(vip),
                "vip[0]",
            )
        };
        assert_eq!(v(&[], Forwarding::L2Dsr, "10.0.0.1").unwrap(), None);
        assert_eq!(
            v(&["interface"], Forwarding::Nat, "10.0.0.1").unwrap(),
            Some(NatSource::Interface)
        );
        let both = v(&["10.0.0.2", "fd00::2"], Forwarding::Nat, "fd00::1")
            .unwrap()
            .unwrap();
        assert_eq!(both.address(false), Some(ip("fd00::2")));
        assert_eq!(both.address(true), Some(ip("10.0.0.2")));
        for (raw, fwd, vip, why) in [
            (
                &["10.0.0.2"][..],
                Forwarding::L2Dsr,
                "10.0.0.1",
                "only a VIP with forwarding",
            ),
            (
                &["eth0"][..],
                Forwarding::Nat,
                "10.0.0.1",
                "neither \"interface\"",
            ),
            (
                &["fd00::2"][..],
                Forwarding::Nat,
                "10.0.0.1",
                "no IPv4 address",
            ),
            (
                &["10.0.0.2", "10.0.0.3"][..],
                Forwarding::Nat,
                "10.0.0.1",
                "one address per family",
            ),
            (
                &["0.0.0.0"][..],
                Forwarding::Nat,
                "10.0.0.1",
                "not a unicast",
            ),
        ] {
            let e = v(raw, fwd, vip).unwrap_err().to_string();
            assert!(
                e.contains("vip[0].nat_source") && e.contains(why),
                "{raw:?}: {e}"
            );
        }
    }
}
