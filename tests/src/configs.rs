//! Test configurations built from the daemon's own typed config values
//! ([`balancer::base::config::RawConfig`], the file's shape as serde reads it), not by pasting TOML
//! text together: a misspelt key is a compile error, and an edit names the VIP it changes.
//! The packet fixtures and the per-packet benchmark share their forwarding VIPs from here;
//! the racks build theirs in `topology`.

use balancer::base::config::{RawBackend, RawConfig, RawConntrack, RawEncap, RawHealth, RawVip};

/// The config as the daemon reads it from a file.
pub fn to_toml(config: &RawConfig) -> String {
    toml::to_string(config).expect("a RawConfig always serialises")
}

/// A TCP VIP on `port` without backends.
pub fn vip(name: &str, address: impl ToString, port: u16) -> RawVip {
    RawVip {
        name: Some(name.to_string()),
        address: Some(address.to_string()),
        port: Some(port.into()),
        ..RawVip::default()
    }
}

/// A backend at `address`, with `weight` (the default weight when `None`).
pub fn backend(address: impl ToString, weight: Option<u32>) -> RawBackend {
    RawBackend {
        address: Some(address.to_string()),
        weight: weight.map(i64::from),
        ..RawBackend::default()
    }
}

/// Backends at `addresses`, default weights.
pub fn backends(addresses: &[&str]) -> Vec<RawBackend> {
    addresses.iter().map(|a| backend(a, None)).collect()
}

/// The VIP called `name` in `config`, to change it; panics naming it if there is none.
pub fn vip_mut<'a>(config: &'a mut RawConfig, name: &str) -> &'a mut RawVip {
    config
        .vip
        .iter_mut()
        .find(|v| v.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no VIP {name} in the config"))
}

/// The encapsulation sources of the packet fixtures: a /16 and a /96, so the outer source
/// takes per-flow entropy in both families.
pub fn entropy_sources() -> RawEncap {
    RawEncap {
        source_v4: Some("172.16.0.0/16".into()),
        source_v6: Some("fd00:e::/96".into()),
        mtu: None,
    }
}

/// One VIP per forwarding mode and family that the packet fixtures and the per-packet
/// benchmark share: `l2dsr4` (3 backends), `ipip4`, `gue4`, `l2dsr6` (2 each).
pub fn forwarding_vips() -> Vec<RawVip> {
    let with = |mut v: RawVip, forwarding: Option<&str>, addresses: &[&str]| {
        v.forwarding = forwarding.map(str::to_string);
        v.backend = backends(addresses);
        v
    };
    let v4 = ["10.111.0.11", "10.111.0.12", "10.111.0.13"];
    vec![
        with(vip("l2dsr4", "10.111.1.1", 80), None, &v4),
        with(vip("ipip4", "10.111.1.2", 80), Some("ipip"), &v4[..2]),
        with(vip("gue4", "10.111.1.3", 80), Some("gue"), &v4[..2]),
        with(
            vip("l2dsr6", "fd00:111:1::1", 80),
            None,
            &["fd00:111::11", "fd00:111::12"],
        ),
    ]
}

/// `nat4`: TCP port 80 of 10.111.1.5 by NAT to two backends (the packet fixtures' and the
/// per-packet benchmark's).
pub fn nat4() -> RawVip {
    let mut v = vip("nat4", "10.111.1.5", 80);
    v.forwarding = Some("nat".into());
    v.backend = backends(&["10.111.0.21", "10.111.0.22"]);
    v
}

/// The packet fixtures' config: [`forwarding_vips`], plus IPv6 IPIP, IPv6 UDP over GUE on
/// its own port, an IPv4 UDP VIP sharing `l2dsr4`'s address, NAT VIPs (TCP and UDP on IPv4,
/// TCP on IPv6; the same with source NAT from the interface's IPv4 address 10.111.0.2 and
/// from fd00:111::3), and a VIP without backends; a
/// small connection table, no flood mode, no removal grace.
pub fn packet_fixture() -> RawConfig {
    let mut vips = forwarding_vips();
    let mut ipip6 = vip("ipip6", "fd00:111:1::2", 80);
    ipip6.forwarding = Some("ipip".into());
    ipip6.backend = backends(&["fd00:111::11", "fd00:111::12"]);
    let mut gue6 = vip("gue6", "fd00:111:1::3", 443);
    gue6.protocol = Some("udp".into());
    gue6.forwarding = Some("gue".into());
    gue6.gue_port = Some(6081);
    gue6.backend = backends(&["fd00:111::11"]);
    let mut dns4 = vip("dns4", "10.111.1.1", 53);
    dns4.protocol = Some("udp".into());
    dns4.forwarding = Some("ipip".into());
    dns4.backend = backends(&["10.111.0.13"]);
    let mut natdns4 = vip("natdns4", "10.111.1.5", 53);
    natdns4.protocol = Some("udp".into());
    natdns4.forwarding = Some("nat".into());
    natdns4.backend = backends(&["10.111.0.23"]);
    let mut nat6 = vip("nat6", "fd00:111:1::5", 80);
    nat6.forwarding = Some("nat".into());
    nat6.backend = backends(&["fd00:111::21", "fd00:111::22"]);
    let snat = |name: &str, address: &str, port: u16, source: &[&str], to: &[&str]| {
        let mut v = vip(name, address, port);
        v.forwarding = Some("nat".into());
        v.nat_source = source.iter().map(|s| s.to_string()).collect();
        v.backend = backends(to);
        v
    };
    vips.extend([
        ipip6,
        gue6,
        dns4,
        nat4(),
        natdns4,
        nat6,
        snat(
            "snat4",
            "10.111.1.6",
            80,
            &["interface"],
            &["10.111.0.24", "10.111.0.25"],
        ),
        snat(
            "snat6",
            "fd00:111:1::6",
            80,
            &["10.111.0.3", "fd00:111::3"],
            &["fd00:111::24"],
        ),
        {
            let mut v = snat(
                "snatdns4",
                "10.111.1.6",
                53,
                &["interface"],
                &["10.111.0.26"],
            );
            v.protocol = Some("udp".into());
            v
        },
        vip("empty", "10.111.1.9", 80),
    ]);
    RawConfig {
        encap: entropy_sources(),
        vip: vips,
        ..harness_settings(4096)
    }
}

/// TCP health checks every `interval_ms` (timeout `timeout_ms`): `fall` failures take a
/// backend out, `rise` successes bring it back.
pub fn tcp_health(interval_ms: i64, timeout_ms: i64, fall: i64, rise: i64) -> RawHealth {
    RawHealth {
        check: Some("tcp".into()),
        interval_ms: Some(interval_ms),
        timeout_ms: Some(timeout_ms),
        fall: Some(fall),
        rise: Some(rise),
        ..RawHealth::default()
    }
}

/// A VIP setting some scheduler cases add.
#[derive(Clone, Copy, Debug)]
pub enum Extra {
    None,
    /// Bounded load (`max_load_factor`).
    MaxLoadFactor(f64),
    /// Session persistence (`persistence_secs`).
    PersistenceSecs(i64),
    /// Tenant affinity: an IPv4 source prefix (`affinity_prefix_v4`) and bounded load.
    TenantAffinity {
        prefix_v4: i64,
        max_load_factor: f64,
    },
    /// Scrapes of port 9000 paced by the VIP's requests (the defaults): its new flows count
    /// down toward its next scrape.
    PacedScrapes,
}

/// A VIP on port 80 with `scheduler` (and `extra`) over backends of the given weights.
pub fn scheduled_vip(
    name: &str,
    address: impl ToString,
    scheduler: &str,
    backends: &[(&str, u32)],
    extra: Extra,
) -> RawVip {
    let mut v = vip(name, address, 80);
    v.scheduler = Some(scheduler.to_string());
    match extra {
        Extra::None => {}
        Extra::MaxLoadFactor(f) => v.max_load_factor = Some(f),
        Extra::PersistenceSecs(s) => v.persistence_secs = Some(s),
        Extra::TenantAffinity {
            prefix_v4,
            max_load_factor,
        } => {
            v.affinity_prefix_v4 = Some(prefix_v4);
            v.max_load_factor = Some(max_load_factor);
        }
        Extra::PacedScrapes => {
            v.telemetry = Some(balancer::base::config::RawTelemetry {
                source: Some("scrape".into()),
                port: Some(9000),
                ..Default::default()
            })
        }
    }
    v.backend = backends
        .iter()
        .map(|(address, weight)| backend(address, Some(*weight)))
        .collect();
    v
}

/// Global settings for `BPF_PROG_TEST_RUN` harnesses: a table of `max_flows`, no flood mode,
/// no removal grace (a removed backend's flows are rehashed at once); no VIPs yet.
pub fn harness_settings(max_flows: i64) -> RawConfig {
    RawConfig {
        interface: Some("eth0".into()),
        conntrack: RawConntrack {
            max_flows: Some(max_flows),
            flood_threshold: Some(0),
            removal_grace_secs: Some(0),
            ..RawConntrack::default()
        },
        ..RawConfig::default()
    }
}
