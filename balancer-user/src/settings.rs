//! The data plane's global settings, derived from the config and the interface.

use std::net::IpAddr;

use balancer_common::addr::raw_from_ip;
use balancer_common::flow_cache::TICK_NS;
use balancer_common::maps::GlobalConfig;

use crate::config::{Config, Forwarding};
use crate::ebpf::flow_buckets;
use crate::net::{entropy_mask, network_v4, network_v6};
use crate::netinfo::Interface;

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
    settings.nat = u32::from(config.vips.iter().any(|v| v.forwarding == Forwarding::Nat));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::MacAddr;

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
        assert_eq!(data_plane_settings(&vip("nat"), &iface, 1).unwrap().nat, 1);
        assert_eq!(
            data_plane_settings(&vip("l2-dsr"), &iface, 1).unwrap().nat,
            0
        );
        // NAT needs no encapsulation source.
        assert!(data_plane_settings(&vip("nat"), &super::tests::iface(vec![]), 1).is_ok());
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
