//! The data plane's global settings, derived from the config and the interface.

use std::net::IpAddr;

use std::collections::HashMap;

use balancer_common::addr::raw_from_ip;
use balancer_common::flow_cache::TICK_NS;
use balancer_common::maps::{GlobalConfig, NAT_GATEWAY, NAT_SNAT, SnatSource};

use crate::base::config::{Config, Forwarding, NatSource};
use crate::base::net::Endpoint;
use crate::base::net::{entropy_mask, network_v4, network_v6};
use crate::dataplane::ebpf::flow_buckets;
use crate::dataplane::netinfo::Interface;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "VIP {vip} encapsulates to {family} backend {backend}, but there is no outer {family} source: set encap.source_{short} or give {interface} an {family} address"
    )]
    NoEncapSource {
        vip: String,
        backend: IpAddr,
        family: &'static str,
        short: &'static str,
        interface: String,
    },
    #[error(
        "VIP {vip} takes its NAT source from the interface, but {interface} has no {family} address: give it one or set nat_source to an address"
    )]
    NoNatSource {
        vip: String,
        family: &'static str,
        interface: String,
    },
    #[error(
        "nat.ports {first}-{last} overlaps the kernel's ephemeral ports {eph_first}-{eph_last} (net.ipv4.ip_local_port_range): the host's own connections could take a port a translated flow holds; pick ports outside it"
    )]
    NatPortsOverlapEphemeral {
        first: u16,
        last: u16,
        eph_first: u16,
        eph_last: u16,
    },
}

/// Builds the [`GlobalConfig`] for `config` on `iface`. `flow_seed` seeds the connection
/// table's hash (random per host; kept across reloads, which keep the table).
pub fn data_plane_settings(
    config: &Config,
    iface: &Interface,
    flow_seed: u64,
) -> Result<GlobalConfig, SettingsError> {
    let idle = config.conntrack.udp_idle_timeout.as_nanos() as u64;
    let mut settings = GlobalConfig {
        mtu: config.encap.mtu.unwrap_or(iface.mtu),
        flow_seed,
        flow_bucket_mask: flow_buckets(config.conntrack.max_flows) - 1,
        udp_idle_ticks: idle.div_ceil(TICK_NS) as u32,
        flood_threshold: config.conntrack.flood_threshold,
        ..GlobalConfig::default()
    };
    let v4 = match &config.encap.source_v4 {
        Some(p) => network_v4(p).map(|a| (a, entropy_mask(p))),
        None => iface.first_v4().map(|a| (a, 0)),
    };
    let v6 = match &config.encap.source_v6 {
        Some(p) => network_v6(p).map(|a| (a, entropy_mask(p))),
        None => iface.first_v6().map(|a| (a, 0)),
    };
    if let Some((addr, mask)) = v4 {
        settings.encap_src_v4 = raw_from_ip(addr.into()).0[0];
        settings.encap_src_v4_hash_mask = mask;
    }
    if let Some((addr, mask)) = v6 {
        settings.encap_src_v6 = raw_from_ip(addr.into()).0;
        settings.encap_src_v6_hash_mask = mask;
    }
    let nat = config
        .vips
        .iter()
        .filter(|v| v.forwarding == Forwarding::Nat);
    for vip in nat {
        settings.nat |= if vip.nat_source.is_some() {
            NAT_SNAT
        } else {
            NAT_GATEWAY
        };
    }
    for vip in config
        .vips
        .iter()
        .filter(|v| matches!(v.forwarding, Forwarding::Ipip | Forwarding::Gue))
    {
        for b in &vip.backends {
            let missing = match b.address {
                IpAddr::V4(_) if v4.is_none() => Some(("IPv4", "v4")),
                IpAddr::V6(_) if v6.is_none() => Some(("IPv6", "v6")),
                _ => None,
            };
            if let Some((family, short)) = missing {
                return Err(SettingsError::NoEncapSource {
                    vip: vip.name.clone(),
                    backend: b.address,
                    family,
                    short,
                    interface: iface.name.clone(),
                });
            }
        }
    }
    Ok(settings)
}

/// The source NAT of each VIP that has one: its address (the interface's where the config
/// says so) and the configured ports.
pub fn snat_sources(
    config: &Config,
    iface: &Interface,
) -> Result<HashMap<Endpoint, SnatSource>, SettingsError> {
    let mut out = HashMap::new();
    for vip in &config.vips {
        let Some(source) = &vip.nat_source else {
            continue;
        };
        let v4 = vip.address.is_ipv4();
        let addr = match source {
            NatSource::Interface if v4 => iface.first_v4().map(IpAddr::from),
            NatSource::Interface => iface.first_v6().map(IpAddr::from),
            NatSource::Addresses(_) => source.address(v4),
        };
        let addr = addr.ok_or_else(|| SettingsError::NoNatSource {
            vip: vip.name.clone(),
            family: if v4 { "IPv4" } else { "IPv6" },
            interface: iface.name.clone(),
        })?;
        let (addr, family) = raw_from_ip(addr);
        out.insert(
            vip.endpoint(),
            SnatSource {
                addr,
                port_min: *config.nat.ports.start(),
                port_count: config.nat.port_count(),
                family,
                _pad: 0,
                client_ports: config.nat.client_ports,
            },
        );
    }
    Ok(out)
}

/// Refuses source-NAT ports inside the kernel's ephemeral range `ephemeral` (read from
/// `/proc/sys/net/ipv4/ip_local_port_range` by [`ephemeral_ports`]), while a VIP translates
/// sources.
pub fn check_nat_ports(
    config: &Config,
    ephemeral: Option<std::ops::RangeInclusive<u16>>,
) -> Result<(), SettingsError> {
    let (Some(eph), true) = (
        ephemeral,
        config.vips.iter().any(|v| v.nat_source.is_some()),
    ) else {
        return Ok(());
    };
    let ports = &config.nat.ports;
    if ports.start() <= eph.end() && eph.start() <= ports.end() {
        return Err(SettingsError::NatPortsOverlapEphemeral {
            first: *ports.start(),
            last: *ports.end(),
            eph_first: *eph.start(),
            eph_last: *eph.end(),
        });
    }
    Ok(())
}

/// The kernel's ephemeral port range, if readable.
pub fn ephemeral_ports() -> Option<std::ops::RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(|p| p.parse::<u16>().ok());
    Some(it.next()??..=it.next()??)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::net::MacAddr;
    use balancer_common::addr::{FAMILY_V4, FAMILY_V6};

    fn iface(addresses: Vec<(IpAddr, u8)>) -> Interface {
        Interface {
            name: "eth0".into(),
            index: 2,
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            mtu: 1500,
            addresses,
        }
    }

    #[test]
    fn replies_are_looked_up_only_while_a_vip_forwards_by_nat() {
        let vip = |forwarding: &str| {
            Config::parse(&format!(
                "interface = \"eth0\"\n[[vip]]\naddress = \"10.0.0.1\"\nport = 80\nforwarding = \"{forwarding}\"\n[[vip.backend]]\naddress = \"10.0.0.11\""
            ))
            .unwrap()
        };
        let iface = iface(vec![("10.0.0.2".parse().unwrap(), 24)]);
        assert_eq!(
            data_plane_settings(&vip("nat"), &iface, 1).unwrap().nat,
            NAT_GATEWAY
        );
        assert_eq!(
            data_plane_settings(&vip("l2-dsr"), &iface, 1).unwrap().nat,
            0
        );
        // NAT needs no encapsulation source.
        assert!(data_plane_settings(&vip("nat"), &super::tests::iface(vec![]), 1).is_ok());
    }

    #[test]
    fn source_nat_takes_the_configured_or_the_interfaces_address() {
        let cfg = |vips: &str, nat: &str| {
            Config::parse(&format!("interface = \"eth0\"\n{nat}\n{vips}")).unwrap()
        };
        let vips = "[[vip]]\nname = \"a\"\naddress = \"10.0.0.1\"\nport = 80\nforwarding = \"nat\"\nnat_source = \"interface\"\n[[vip.backend]]\naddress = \"10.0.0.11\"\n\
                    [[vip]]\nname = \"b\"\naddress = \"fd00::1\"\nport = 80\nforwarding = \"nat\"\nnat_source = [\"10.0.0.3\", \"fd00::3\"]\n[[vip.backend]]\naddress = \"fd00::11\"\n\
                    [[vip]]\nname = \"c\"\naddress = \"10.0.0.1\"\nport = 81\nforwarding = \"nat\"\n[[vip.backend]]\naddress = \"10.0.0.11\"";
        let config = cfg(vips, "[nat]\nports = \"2000-2999\"");
        let iface = iface(vec![("10.0.0.2".parse().unwrap(), 24)]);
        assert_eq!(
            data_plane_settings(&config, &iface, 1).unwrap().nat,
            NAT_GATEWAY | NAT_SNAT
        );
        let sources = snat_sources(&config, &iface).unwrap();
        assert_eq!(sources.len(), 2, "c has no source NAT");
        let a = &sources[&config.vip("a").unwrap().endpoint()];
        assert_eq!(
            (a.addr, a.port_min, a.port_count, a.family),
            (
                raw_from_ip("10.0.0.2".parse().unwrap()).0,
                2000,
                1000,
                FAMILY_V4
            )
        );
        let b = &sources[&config.vip("b").unwrap().endpoint()];
        assert_eq!(b.addr, raw_from_ip("fd00::3".parse().unwrap()).0);
        assert_eq!(b.family, FAMILY_V6);
        // The interface has no IPv4 address: named in the error.
        let e = snat_sources(&config, &super::tests::iface(vec![])).unwrap_err();
        assert!(
            e.to_string().contains(
                "VIP a takes its NAT source from the interface, but eth0 has no IPv4 address"
            ),
            "{e}"
        );
        // Ports inside the ephemeral range are refused while a VIP translates sources.
        assert!(check_nat_ports(&config, Some(32768..=60999)).is_ok());
        let e = check_nat_ports(&config, Some(2500..=60999))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nat.ports 2000-2999 overlaps the kernel's ephemeral ports 2500-60999"),
            "{e}"
        );
        let whole = cfg(vips, "[nat]\nports = \"1-65535\"");
        assert_eq!(
            snat_sources(&whole, &iface).unwrap()[&config.vip("a").unwrap().endpoint()].port_count,
            65535
        );
        assert!(
            check_nat_ports(
                &cfg(
                    &vips
                        .replace("nat_source = \"interface\"\n", "")
                        .replace("nat_source = [\"10.0.0.3\", \"fd00::3\"]\n", ""),
                    ""
                ),
                Some(1..=65535)
            )
            .is_ok(),
            "no source NAT: no check"
        );
    }

    #[test]
    fn encap_source_comes_from_config_or_interface() {
        let cfg = Config::parse(
            "interface = \"eth0\"\n[encap]\nsource_v4 = \"172.16.0.0/16\"\nmtu = 1400\n[conntrack]\nudp_idle_timeout_secs = 5",
        )
        .unwrap();
        let s = data_plane_settings(&cfg, &iface(vec![]), 7).unwrap();
        assert_eq!(s.encap_src_v4.to_ne_bytes(), [172, 16, 0, 0]);
        assert_eq!(s.encap_src_v4_hash_mask, 0xffff);
        assert_eq!(s.mtu, 1400);
        assert_eq!(
            s.udp_idle_ticks, 5,
            "5 s = 4.66 ticks of 2^30 ns, rounded up"
        );
        assert_eq!(s.flow_seed, 7);
        assert_eq!(
            s.flow_bucket_mask,
            (1 << 19) - 1,
            "2,000,000 flows / 4 ways -> 2^19 buckets"
        );

        let cfg = Config::parse("interface = \"eth0\"").unwrap();
        let s =
            data_plane_settings(&cfg, &iface(vec![("10.0.0.2".parse().unwrap(), 24)]), 0).unwrap();
        assert_eq!(s.encap_src_v4.to_ne_bytes(), [10, 0, 0, 2]);
        assert_eq!(s.encap_src_v4_hash_mask, 0);
        assert_eq!(s.mtu, 1500);
    }

    #[test]
    fn encapsulating_without_a_source_is_refused() {
        let cfg = Config::parse(
            "interface = \"eth0\"\n[[vip]]\naddress = \"2001:db8::1\"\nport = 80\nforwarding = \"ipip\"\n[[vip.backend]]\naddress = \"2001:db8::11\"",
        )
        .unwrap();
        let err = data_plane_settings(&cfg, &iface(vec![("10.0.0.2".parse().unwrap(), 24)]), 0)
            .unwrap_err();
        assert!(err.to_string().contains("encap.source_v6"), "{err}");
    }
}
