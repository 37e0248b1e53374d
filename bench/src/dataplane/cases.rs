//! The benchmark's cases: the configs the program is loaded with (schedulers, NAT, source NAT,
//! admission) and the frames each path is timed with.

use super::*;

/// The per-scheduler VIPs (10.111.2.1, 10.111.2.2, ... in this order), each over the same
/// three backends weighted 3:1:2: (key, scheduler, extra VIP setting, description).
pub(super) const SCHEDULER_CASES: [(&str, &str, Extra, &str); 11] = [
    (
        "source_hash",
        "source-hash",
        Extra::None,
        "new flow, source-hash scheduler",
    ),
    (
        "round_robin",
        "round-robin",
        Extra::None,
        "new flow, round-robin scheduler",
    ),
    (
        "weighted_round_robin",
        "weighted-round-robin",
        Extra::None,
        "new flow, weighted-round-robin scheduler",
    ),
    (
        "random",
        "random",
        Extra::None,
        "new flow, random scheduler",
    ),
    (
        "weighted_random",
        "weighted-random",
        Extra::None,
        "new flow, weighted-random scheduler",
    ),
    (
        "least_conn",
        "least-conn",
        Extra::None,
        "new flow, least-conn scheduler (3 backends)",
    ),
    (
        "power_of_two",
        "power-of-two",
        Extra::None,
        "new flow, power-of-two scheduler",
    ),
    (
        "source_hash_bounded",
        "source-hash",
        Extra::MaxLoadFactor(1.25),
        "new flow, source-hash with bounded load (1.25)",
    ),
    (
        "source_hash_tenant",
        "source-hash",
        Extra::TenantAffinity {
            prefix_v4: 24,
            max_load_factor: 1.25,
        },
        "new flow, tenant affinity: source-hash of the client's /24, bounded load (1.25)",
    ),
    (
        "maglev_persistent",
        "maglev",
        Extra::PersistenceSecs(300),
        "new flow, maglev with session persistence (affinity hit)",
    ),
    (
        "maglev_paced",
        "maglev",
        Extra::PacedScrapes,
        "new flow, maglev on a VIP whose scrapes its requests pace (counted down to the next)",
    ),
];

/// The address of scheduler case `i`'s VIP.
pub(super) fn scheduler_vip(i: usize) -> IpAddr {
    ip(&format!("10.111.2.{}", i + 1))
}

/// The packet fixtures' forwarding VIPs (the packet tests' other VIPs left out: the set of
/// VIPs shapes the VIP index's probe lengths, and the fixture's extra VIPs would move these
/// figures, new flow 91 ns instead of 82 ns), then a VIP per scheduler case; a table of a
/// million flows, no flood mode.
pub(super) fn config() -> String {
    config_with(true)
}

/// [`config`], or (`tenant_prefix` false) with the tenant case's VIP hashing whole addresses:
/// for a baseline program older than tenant affinity, which then times that case as plain
/// bounded source hash.
pub(super) fn config_with(tenant_prefix: bool) -> String {
    let mut vips = forwarding_vips();
    for (i, (key, scheduler, extra, _)) in SCHEDULER_CASES.iter().enumerate() {
        let extra = match extra {
            Extra::TenantAffinity {
                max_load_factor, ..
            } if !tenant_prefix => &Extra::MaxLoadFactor(*max_load_factor),
            e => e,
        };
        let weighted = [("10.111.0.11", 3), ("10.111.0.12", 1), ("10.111.0.13", 2)];
        vips.push(scheduled_vip(
            key,
            scheduler_vip(i),
            scheduler,
            &weighted,
            *extra,
        ));
    }
    bench_config(vips)
}

/// The benchmark's settings with `vips`: encapsulation sources, a table of a million flows,
/// no flood mode.
pub(super) fn bench_config(vips: Vec<balancer::base::config::RawVip>) -> String {
    let mut config = RawConfig {
        encap: entropy_sources(),
        vip: vips,
        ..harness_settings(1_000_000)
    };
    // The benchmark's table keeps removed backends' flows as the daemon's default does.
    config.conntrack.removal_grace_secs = None;
    to_toml(&config)
}

/// [`config`] with a NAT VIP beside: with one, the non-VIP path also looks for NAT replies, so
/// the NAT paths run on a program of their own (the baseline's too, where it knows NAT).
pub(super) fn nat_config(tenant_prefix: bool) -> String {
    let mut config: RawConfig =
        toml::from_str(&config_with(tenant_prefix)).expect("the benchmark's config");
    config.vip.push(balancer_tests::configs::nat4());
    to_toml(&config)
}

/// [`nat_config`] with a source-NAT VIP beside (TCP 10.111.1.6:80 from 10.111.0.2): the
/// non-VIP path then looks in both reply tables.
pub(super) fn snat_config(tenant_prefix: bool) -> String {
    let mut config: RawConfig =
        toml::from_str(&nat_config(tenant_prefix)).expect("the benchmark's config");
    let mut v = balancer_tests::configs::vip("snat4", "10.111.1.6", 80);
    v.forwarding = Some("nat".into());
    v.nat_source = vec!["10.111.0.2".into()];
    v.backend = balancer_tests::configs::backends(&["10.111.0.24", "10.111.0.25"]);
    config.vip.push(v);
    to_toml(&config)
}

/// How much of admission control a program knows (a baseline may be older than some of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum AdmissionLevel {
    None,
    Plain,
    Fair,
}

/// The admission-control paths' program: a premium tier (10.9.5.0/24) and three Maglev VIPs
/// (10.111.3.1-3) with admission control admitting it: one left open, one saturated, one
/// saturated with a (never reached) cap on the tier; and at [`AdmissionLevel::Fair`] a fourth
/// (10.111.3.4) with fair admission, where premium has its own (never reached) limit. At
/// [`AdmissionLevel::None`] (a baseline older than it), the same VIPs without admission
/// control.
pub(super) fn admission_config(level: AdmissionLevel) -> String {
    let admission = level >= AdmissionLevel::Plain;
    let fair = level == AdmissionLevel::Fair;
    let mut config = RawConfig {
        encap: entropy_sources(),
        ..harness_settings(1_000_000)
    };
    config.conntrack.removal_grace_secs = None;
    config.tier = vec![balancer::base::config::RawTier {
        name: Some("premium".into()),
        prefixes: vec!["10.9.5.0/24".into()],
        max_new_flows_per_sec: fair.then_some(100_000_000),
        ..Default::default()
    }];
    let vips: &[(&str, i64)] = &[
        ("adm_open", 0),
        ("adm_saturated", 0),
        ("adm_capped", 100_000_000),
        ("adm_fair", 0),
    ];
    for (i, (name, cap)) in vips[..if fair { 4 } else { 3 }].iter().copied().enumerate() {
        let weighted = [("10.111.0.11", 3), ("10.111.0.12", 1), ("10.111.0.13", 2)];
        let mut v = scheduled_vip(
            name,
            format!("10.111.3.{}", i + 1),
            "maglev",
            &weighted,
            Extra::None,
        );
        if admission {
            v.telemetry = Some(balancer::base::config::RawTelemetry {
                source: Some("push".into()),
                ..Default::default()
            });
            v.policy = Some(balancer::base::config::RawPolicy {
                kind: Some("composite".into()),
                ..Default::default()
            });
            v.admission = Some(if name == "adm_fair" {
                balancer::base::config::RawAdmission {
                    fair: Some(true),
                    ..Default::default()
                }
            } else {
                balancer::base::config::RawAdmission {
                    admit: [("premium".to_string(), cap)].into_iter().collect(),
                    ..Default::default()
                }
            });
        }
        config.vip.push(v);
    }
    to_toml(&config)
}

/// The admission paths on `h` (a program with [`admission_config`]`(Fair)`): a new flow of an
/// open pool, of an admitted tier while saturated (without and with a cap), of a tenant under
/// its rate in fair admission, and a SYN refused with a RST. The first also runs on the
/// baseline (as a plain Maglev new flow).
pub(super) fn admission_setup(mut h: Harness, payload: &[u8]) -> Result<(Harness, Vec<Case>)> {
    for name in ["adm_saturated", "adm_capped"] {
        let endpoint = h.config.vip(name).context("admission VIP")?.endpoint();
        h.balancer.set_saturated(&endpoint, true)?;
    }
    let (free, premium) = (ip("10.9.0.1"), ip("10.9.5.7"));
    let syn = |client, vip: &str| tcp_frame(client, 3000, ip(vip), 80, true, payload);
    let cases = vec![
        Case {
            key: "new_flow_admission_open",
            what: "new flow, admission control with the pool open (baseline: a plain Maglev new flow)",
            method: Method::Repeat,
            frame: syn(free, "10.111.3.1"),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
        Case {
            key: "new_flow_admission_admitted",
            what: "new flow of an admitted tier while saturated (a tier lookup)",
            method: Method::Repeat,
            frame: syn(premium, "10.111.3.2"),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
        Case {
            key: "new_flow_admission_capped",
            what: "new flow of an admitted tier under its cap while saturated",
            method: Method::Repeat,
            frame: syn(premium, "10.111.3.3"),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
        Case {
            key: "new_flow_admission_fair",
            what: "new flow of a tenant under its rate in fair admission (a tier lookup and a pace check on a word shared by all CPUs)",
            method: Method::Repeat,
            frame: syn(premium, "10.111.3.4"),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
        Case {
            key: "admission_reset",
            what: "SYN refused while saturated: answered with a RST (single runs: a run rewrites its input)",
            method: Method::Single,
            frame: syn(free, "10.111.3.2"),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
    ];
    Ok((h, cases))
}

#[derive(Clone)]
pub(super) struct Case {
    pub(super) key: &'static str,
    pub(super) what: &'static str,
    pub(super) method: Method,
    /// The frame; `Single` cases with `fresh_ports` vary its TCP source port per run.
    pub(super) frame: Vec<u8>,
    pub(super) fresh_ports: bool,
    pub(super) expect: u32,
    /// Target from the issue, in ns (for the printout; never a pass/fail).
    pub(super) target: Option<&'static str>,
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

/// Rewrites the TCP source port of an IPv4 frame (no VLAN) and fixes its TCP checksum, so each
/// run is a flow the connection table has not seen. Ports cycle through 1024..65535 and the
/// client address's last byte through 256 values.
pub(super) fn set_tcp_source_port(frame: &mut [u8], i: u32) {
    let port = 1024 + (i % 64_000) as u16;
    frame[14 + 15] = (i / 64_000) as u8;
    frame[34..36].copy_from_slice(&port.to_be_bytes());
    // The program does not check checksums; keep them right anyway.
    frame[14 + 10] = 0;
    frame[14 + 11] = 0;
    let sum = !balancer_tests::packet::ones_complement_sum(&frame[14..34]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
}

/// Pins the benchmark's established flows (a SYN inserts each into the connection table).
pub(super) fn pin_flows(h: &mut Harness) -> Result<()> {
    let (c4, c6) = (ip("10.9.0.1"), ip("2001:db8::5"));
    for (vip, port) in [
        ("10.111.1.1", 1000),
        ("10.111.1.2", 1001),
        ("10.111.1.3", 1002),
    ] {
        h.run(&tcp_frame(c4, port, ip(vip), 80, true, b""))?;
    }
    h.run(&tcp_frame(c6, 1003, ip("fd00:111:1::1"), 80, true, b""))?;
    Ok(())
}

/// Non-VIP TCP to the balancer's own address (`key`: on a program with NAT VIPs).
pub(super) fn non_vip_case(key: &'static str, what: &'static str, payload: &[u8]) -> Case {
    Case {
        key,
        what,
        method: Method::Repeat,
        frame: tcp_frame(ip("10.9.0.1"), 2000, ip("10.111.0.2"), 22, false, payload),
        expect: XDP_PASS,
        fresh_ports: false,
        target: None,
    }
}

/// The NAT paths on `h` (a program with [`nat_config`]): non-VIP traffic while NAT is on, and
/// an established flow both ways.
pub(super) fn nat_setup(mut h: Harness, payload: &[u8]) -> Result<(Harness, Vec<Case>)> {
    let c4 = ip("10.9.0.1");
    let nat_vip = ip("10.111.1.5");
    h.run(&tcp_frame(c4, 1004, nat_vip, 80, true, b""))?;
    let nat_backend = h.table_backend("nat4", c4, 1004)?;
    let mut reply = tcp_frame(nat_backend, 80, c4, 1004, false, payload);
    reply[6..12].copy_from_slice(&balancer_tests::packet::backend_mac(nat_backend));
    let cases = vec![
        non_vip_case(
            "non_vip_nat_on",
            "non-VIP TCP while a VIP forwards by NAT (a NAT_REPLIES miss)",
            payload,
        ),
        Case {
            key: "established_nat",
            what: "established TCP, NAT to the backend (single runs: a run rewrites its input)",
            method: Method::Single,
            frame: tcp_frame(c4, 1004, nat_vip, 80, false, payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
        Case {
            key: "nat_reply",
            what: "a NAT flow's reply, the VIP written back (single runs)",
            method: Method::Single,
            frame: reply,
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
    ];
    Ok((h, cases))
}

/// The source-NAT paths on `h` (a program with [`snat_config`]): non-VIP traffic with both
/// reply tables in use, and an established flow both ways (its port is the program's choice:
/// the first packet's output tells it).
pub(super) fn snat_setup(mut h: Harness, payload: &[u8]) -> Result<(Harness, Vec<Case>)> {
    let c4 = ip("10.9.0.1");
    let snat_vip = ip("10.111.1.6");
    let (_, first) = h.run(&tcp_frame(c4, 1005, snat_vip, 80, true, b""))?;
    let snat_port = u16::from_be_bytes([first[34], first[35]]);
    let snat_backend = h.table_backend("snat4", c4, 1005)?;
    let mut snat_reply = tcp_frame(
        snat_backend,
        80,
        ip("10.111.0.2"),
        snat_port,
        false,
        payload,
    );
    snat_reply[6..12].copy_from_slice(&balancer_tests::packet::backend_mac(snat_backend));
    let cases = vec![
        non_vip_case(
            "non_vip_snat_on",
            "non-VIP TCP while VIPs forward by NAT and source NAT (two reply-table misses)",
            payload,
        ),
        Case {
            key: "established_snat",
            what: "established TCP, NAT and source NAT to the backend (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1005, snat_vip, 80, false, payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
        Case {
            key: "snat_reply",
            what: "a source-NAT flow's reply, the VIP and the client written back (single runs)",
            method: Method::Single,
            frame: snat_reply,
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
    ];
    Ok((h, cases))
}

/// The main program's cases: the non-VIP path, established flows by forwarding mode, new
/// flows (warm and cold), and a new flow per scheduler.
pub(super) fn main_cases(payload: &[u8]) -> Vec<Case> {
    let c4 = ip("10.9.0.1");
    let c6 = ip("2001:db8::5");
    let mut cases = vec![
        Case {
            key: "non_vip",
            what: "non-VIP TCP (to the balancer's own address)",
            method: Method::Repeat,
            frame: tcp_frame(c4, 2000, ip("10.111.0.2"), 22, false, payload),
            expect: XDP_PASS,
            fresh_ports: false,
            target: Some("<= xdp_pass + 20"),
        },
        Case {
            key: "established_l2dsr",
            what: "established TCP, L2 DSR (conntrack hit)",
            method: Method::Repeat,
            frame: tcp_frame(c4, 1000, ip("10.111.1.1"), 80, false, payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60"),
        },
        Case {
            key: "established_ipv6",
            what: "established TCP over IPv6, L2 DSR",
            method: Method::Repeat,
            frame: tcp_frame(c6, 1003, ip("fd00:111:1::1"), 80, false, payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60"),
        },
        Case {
            key: "new_flow",
            what: "new flow: TCP SYN, Maglev lookup + connection-table write (repeat: warm cache)",
            method: Method::Repeat,
            frame: tcp_frame(c4, 3000, ip("10.111.1.1"), 80, true, payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 105"),
        },
        Case {
            key: "new_flow_fresh_single",
            what: "new flow from a new client port every run into a 1M-flow table (single runs: cold cache)",
            method: Method::Single,
            frame: tcp_frame(c4, 3000, ip("10.111.1.1"), 80, true, payload),
            expect: XDP_TX,
            fresh_ports: true,
            target: None,
        },
        Case {
            key: "established_ipip",
            what: "established TCP, IPIP encapsulation (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1001, ip("10.111.1.2"), 80, false, payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60 over single-run xdp_pass"),
        },
        Case {
            key: "established_gue",
            what: "established TCP, GUE encapsulation (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1002, ip("10.111.1.3"), 80, false, payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60 over single-run xdp_pass"),
        },
        Case {
            key: "established_l2dsr_single",
            what: "established TCP, L2 DSR (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1000, ip("10.111.1.1"), 80, false, payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
    ];
    for (i, (key, _, _, what)) in SCHEDULER_CASES.iter().enumerate() {
        cases.push(Case {
            key: scheduler_case_key(i, key),
            what,
            method: Method::Repeat,
            frame: tcp_frame(c4, 3000, scheduler_vip(i), 80, true, payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        });
    }
    cases
}

/// `new_flow_<scheduler case>`, made once per case (the programs are loaded again and again).
fn scheduler_case_key(i: usize, key: &str) -> &'static str {
    static KEYS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let keys = KEYS.get_or_init(|| {
        SCHEDULER_CASES
            .iter()
            .map(|(key, ..)| &*Box::leak(format!("new_flow_{key}").into_boxed_str()))
            .collect()
    });
    debug_assert!(keys[i].ends_with(key));
    keys[i]
}
