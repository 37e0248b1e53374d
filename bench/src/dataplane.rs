//! `cargo xtask bench dataplane`: nanoseconds per packet of the XDP program through
//! BPF_PROG_TEST_RUN, per path, in interleaved rounds, against a bare `XDP_PASS` program
//! measured in the same run.
//!
//! Paths that leave the frame reusable run with the kernel's `repeat` (one syscall, many runs,
//! the kernel's average). Encapsulating paths cannot: `repeat` does not restore the frame
//! between repetitions, so each repetition would add another outer header. They are timed as
//! many single runs instead, and compared with the bare program timed the same way (a single
//! run's figure includes the kernel's per-call timing overhead, so only same-method ratios mean
//! anything).

use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::{Context as _, Result};
use aya::programs::{TestRun, TestRunOptions};
use balancer::base::config::RawConfig;
use balancer::dataplane::ebpf;

use balancer_tests::configs::{
    Extra, entropy_sources, forwarding_vips, harness_settings, scheduled_vip, to_toml,
};
use balancer_tests::packet::{Harness, XDP_PASS, XDP_TX, tcp_frame};

use super::{Figures, median};

/// Bootstrap resamples of the per-round ratios behind each path's 95% interval.
const BOOTSTRAP_RESAMPLES: usize = 10_000;

/// Its page: ns per packet by path (`docs/benchmarks/dataplane.md`).
pub const PAGE: super::page::Page = super::page::Page {
    name: "dataplane",
    title: "Data plane: cost per packet",
    about: "Nanoseconds per packet of the XDP program per path, through `BPF_PROG_TEST_RUN`, \
            in 9 interleaved rounds (median), against a bare `XDP_PASS` program timed in the \
            same rounds. Paths that leave the frame reusable run with the kernel's `repeat` \
            (1,000,000 runs a call); encapsulating paths as 20,000 single runs a round, \
            compared with `xdp_pass_single`. Compare \"ns over XDP_PASS\" across machines, not \
            absolute figures. An old build beside a new one: `cargo xtask bench dataplane -- \
            --baseline OBJECT` (each path's new / old ratio with its bootstrap 95% interval).",
    columns: &[
        ("_ns", "ns"),
        ("_over_pass_ns", "ns over XDP_PASS"),
        ("_ratio_to_pass", "x XDP_PASS"),
    ],
    flat: &[],
};

/// The per-scheduler VIPs (10.111.2.1, 10.111.2.2, ... in this order), each over the same
/// three backends weighted 3:1:2: (key, scheduler, extra VIP setting, description).
const SCHEDULER_CASES: [(&str, &str, Extra, &str); 11] = [
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
fn scheduler_vip(i: usize) -> IpAddr {
    ip(&format!("10.111.2.{}", i + 1))
}

/// The packet fixtures' forwarding VIPs (the packet tests' other VIPs left out: the set of
/// VIPs shapes the VIP index's probe lengths, and the fixture's extra VIPs would move these
/// figures, new flow 91 ns instead of 82 ns), then a VIP per scheduler case; a table of a
/// million flows, no flood mode.
fn config() -> String {
    config_with(true)
}

/// [`config`], or (`tenant_prefix` false) with the tenant case's VIP hashing whole addresses:
/// for a baseline program older than tenant affinity, which then times that case as plain
/// bounded source hash.
fn config_with(tenant_prefix: bool) -> String {
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
fn nat_config(tenant_prefix: bool) -> String {
    let mut config: RawConfig =
        toml::from_str(&config_with(tenant_prefix)).expect("the benchmark's config");
    config.vip.push(balancer_tests::configs::nat4());
    to_toml(&config)
}

/// [`nat_config`] with a source-NAT VIP beside (TCP 10.111.1.6:80 from 10.111.0.2): the
/// non-VIP path then looks in both reply tables.
fn snat_config(tenant_prefix: bool) -> String {
    let mut config: RawConfig =
        toml::from_str(&nat_config(tenant_prefix)).expect("the benchmark's config");
    let mut v = balancer_tests::configs::vip("snat4", "10.111.1.6", 80);
    v.forwarding = Some("nat".into());
    v.nat_source = vec!["10.111.0.2".into()];
    v.backend = balancer_tests::configs::backends(&["10.111.0.24", "10.111.0.25"]);
    config.vip.push(v);
    to_toml(&config)
}

/// The admission-control paths' program: a premium tier (10.9.5.0/24) and three Maglev VIPs
/// (10.111.3.1-3) with admission control admitting it: one left open, one saturated, one
/// saturated with a (never reached) cap on the tier. Without `admission` (a baseline older
/// than it), the same VIPs without admission control.
fn admission_config(admission: bool) -> String {
    let mut config = RawConfig {
        encap: entropy_sources(),
        ..harness_settings(1_000_000)
    };
    config.conntrack.removal_grace_secs = None;
    config.tier = vec![balancer::base::config::RawTier {
        name: Some("premium".into()),
        prefixes: vec!["10.9.5.0/24".into()],
        ..Default::default()
    }];
    for (i, (name, cap)) in [
        ("adm_open", 0),
        ("adm_saturated", 0),
        ("adm_capped", 100_000_000),
    ]
    .into_iter()
    .enumerate()
    {
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
            v.admission = Some(balancer::base::config::RawAdmission {
                admit: [("premium".to_string(), cap)].into_iter().collect(),
                ..Default::default()
            });
        }
        config.vip.push(v);
    }
    to_toml(&config)
}

/// The admission paths on `h` (a program with [`admission_config`]`(true)`): a new flow of an
/// open pool, of an admitted tier while saturated (without and with a cap), and a SYN refused
/// with a RST. The first also runs on the baseline (as a plain Maglev new flow).
fn admission_setup(mut h: Harness, payload: &[u8]) -> Result<(Harness, Vec<Case>)> {
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

/// How a case is timed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    /// One syscall with `repeat` runs.
    Repeat,
    /// Many syscalls of one run each.
    Single,
}

struct Case {
    key: &'static str,
    what: &'static str,
    method: Method,
    /// The frame; `Single` cases with `fresh_ports` vary its TCP source port per run.
    frame: Vec<u8>,
    fresh_ports: bool,
    expect: u32,
    /// Target from the issue, in ns (for the printout; never a pass/fail).
    target: Option<&'static str>,
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

/// The bare `XDP_PASS` program, for the baseline.
struct Bare {
    object: aya::Ebpf,
}

impl Bare {
    fn load() -> Result<Bare> {
        Ok(Bare {
            object: ebpf::load_decap()?,
        })
    }

    fn run(&mut self, frame: &[u8], repeat: u32) -> Result<f64> {
        let program = ebpf::program(&mut self.object, ebpf::PASS_PROGRAM)?;
        let mut out = vec![0u8; 4096];
        let r = program
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                repeat,
                ..TestRunOptions::default()
            })
            .context("test run of the pass program")?;
        Ok(r.duration.as_nanos() as f64)
    }
}

fn time_case(h: &mut Harness, case: &Case, repeat: u32, singles: u32) -> Result<f64> {
    match case.method {
        Method::Repeat => {
            let (action, _, per_run) = h.run_raw(&case.frame, repeat)?;
            anyhow::ensure!(
                action == case.expect,
                "{}: action {action}, expected {}",
                case.key,
                case.expect
            );
            Ok(per_run.as_nanos() as f64)
        }
        Method::Single => {
            let mut total = 0u128;
            let mut frame = case.frame.clone();
            for i in 0..singles {
                if case.fresh_ports {
                    set_tcp_source_port(&mut frame, i);
                }
                let (action, _, t) = h.run_raw(&frame, 1)?;
                anyhow::ensure!(
                    action == case.expect,
                    "{}: action {action}, expected {}",
                    case.key,
                    case.expect
                );
                total += t.as_nanos();
            }
            Ok(total as f64 / f64::from(singles))
        }
    }
}

/// The backend side's passive latency programs (`balancer report --passive-latency`, tc):
/// ns per packet with the kernel's `repeat`, the skb test run's own cost included (a tc
/// program's test run allocates an skb; only the program's runs are timed).
fn passive_latency_cost(rounds: usize, repeat: u32, figures: &mut Figures) -> Result<()> {
    use balancer::dataplane::ebpf::{LATENCY_EGRESS_PROGRAM, LATENCY_INGRESS_PROGRAM};
    use balancer::serve::report::passive::PassiveLatency;
    let mut p = PassiveLatency::load(&[8000])?;
    let (client, server) = (ip("10.9.0.1"), ip("10.111.1.1"));
    let request = tcp_frame(client, 40000, server, 8000, false, &[b'x'; 64]);
    let token = tcp_frame(server, 8000, client, 40000, false, &[b'y'; 64]);
    let other = tcp_frame(client, 40001, server, 22, false, &[b'z'; 64]);
    // (key, program, frame, what); the flow is answering when the token case runs.
    let cases: [(&str, &'static str, &[u8], &str); 3] = [
        (
            "tc_latency_request",
            LATENCY_INGRESS_PROGRAM,
            &request,
            "client data packet of a watched flow (ingress: flow lookup, request time)",
        ),
        (
            "tc_latency_token",
            LATENCY_EGRESS_PROGRAM,
            &token,
            "server data packet of an answer (egress: flow lookup, inter-token histogram)",
        ),
        (
            "tc_latency_unwatched",
            LATENCY_INGRESS_PROGRAM,
            &other,
            "TCP to a port not watched (ingress: port lookup only)",
        ),
    ];
    let mut run = |program: &'static str, frame: &[u8], repeat: u32| -> Result<f64> {
        let r = p
            .classifier(program)?
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..TestRunOptions::default()
            })
            .with_context(|| format!("test run of {program}"))?;
        Ok(r.duration.as_nanos() as f64)
    };
    // A request, then its first answer packet: the flow is answering.
    run(LATENCY_INGRESS_PROGRAM, &request, 1)?;
    run(LATENCY_EGRESS_PROGRAM, &token, 1)?;
    let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _ in 0..rounds {
        // Token first: a repeated request packet keeps the flow waiting for its answer.
        for (key, program, frame, _) in [cases[1], cases[0], cases[2]] {
            samples
                .entry(key)
                .or_default()
                .push(run(program, frame, repeat)?);
        }
    }
    println!(
        "\nPassive latency programs on a backend (tc, BPF_PROG_TEST_RUN with repeat), median [min..max]"
    );
    for (key, _, _, what) in cases {
        let s = &samples[key];
        let med = median(s);
        let min = s.iter().copied().fold(f64::INFINITY, f64::min);
        let max = s.iter().copied().fold(0.0, f64::max);
        println!("{key:<28} {med:>8.1} {min:>8.1}..{max:<8.1}\n    {what}");
        figures.insert(format!("{key}_ns"), med);
    }
    Ok(())
}

/// Rewrites the TCP source port of an IPv4 frame (no VLAN) and fixes its TCP checksum, so each
/// run is a flow the connection table has not seen. Ports cycle through 1024..65535 and the
/// client address's last byte through 256 values.
fn set_tcp_source_port(frame: &mut [u8], i: u32) {
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
fn pin_flows(h: &mut Harness) -> Result<()> {
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
fn non_vip_case(key: &'static str, what: &'static str, payload: &[u8]) -> Case {
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
fn nat_setup(mut h: Harness, payload: &[u8]) -> Result<(Harness, Vec<Case>)> {
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
fn snat_setup(mut h: Harness, payload: &[u8]) -> Result<(Harness, Vec<Case>)> {
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

/// Runs the benchmark; returns the figures (also printed). With `baseline` (the ELF bytes of
/// another build of the balancer object, e.g. an earlier commit's), that program runs every
/// path in the same rounds, interleaved, and each path's new / baseline ratio is reported.
pub fn run(rounds: usize, repeat: u32, singles: u32, baseline: Option<&[u8]>) -> Result<Figures> {
    let mut h = Harness::new(&config())?;
    pin_flows(&mut h)?;
    // Whether the baseline program knows tenant affinity (else its configs leave it out).
    let mut baseline_prefix = true;
    let mut old = baseline
        .map(|object| -> Result<Harness> {
            let mut b = match Harness::with_object(&config(), object) {
                Ok(b) => b,
                Err(e) => {
                    println!(
                        "the baseline takes no tenant affinity ({e:#}): its source_hash_tenant case hashes whole addresses"
                    );
                    baseline_prefix = false;
                    Harness::with_object(&config_with(false), object)?
                }
            };
            pin_flows(&mut b)?;
            Ok(b)
        })
        .transpose()?;
    let mut bare = Bare::load()?;
    let c4 = ip("10.9.0.1");
    let c6 = ip("2001:db8::5");
    let payload = [0x42u8; 64];
    let cases = vec![
        Case {
            key: "non_vip",
            what: "non-VIP TCP (to the balancer's own address)",
            method: Method::Repeat,
            frame: tcp_frame(c4, 2000, ip("10.111.0.2"), 22, false, &payload),
            expect: XDP_PASS,
            fresh_ports: false,
            target: Some("<= xdp_pass + 20"),
        },
        Case {
            key: "established_l2dsr",
            what: "established TCP, L2 DSR (conntrack hit)",
            method: Method::Repeat,
            frame: tcp_frame(c4, 1000, ip("10.111.1.1"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60"),
        },
        Case {
            key: "established_ipv6",
            what: "established TCP over IPv6, L2 DSR",
            method: Method::Repeat,
            frame: tcp_frame(c6, 1003, ip("fd00:111:1::1"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60"),
        },
        Case {
            key: "new_flow",
            what: "new flow: TCP SYN, Maglev lookup + connection-table write (repeat: warm cache)",
            method: Method::Repeat,
            frame: tcp_frame(c4, 3000, ip("10.111.1.1"), 80, true, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 105"),
        },
        Case {
            key: "new_flow_fresh_single",
            what: "new flow from a new client port every run into a 1M-flow table (single runs: cold cache)",
            method: Method::Single,
            frame: tcp_frame(c4, 3000, ip("10.111.1.1"), 80, true, &payload),
            expect: XDP_TX,
            fresh_ports: true,
            target: None,
        },
        Case {
            key: "established_ipip",
            what: "established TCP, IPIP encapsulation (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1001, ip("10.111.1.2"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60 over single-run xdp_pass"),
        },
        Case {
            key: "established_gue",
            what: "established TCP, GUE encapsulation (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1002, ip("10.111.1.3"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60 over single-run xdp_pass"),
        },
        Case {
            key: "established_l2dsr_single",
            what: "established TCP, L2 DSR (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1000, ip("10.111.1.1"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
    ];
    let mut cases = cases;
    for (i, (key, _, _, what)) in SCHEDULER_CASES.iter().enumerate() {
        cases.push(Case {
            key: Box::leak(format!("new_flow_{key}").into_boxed_str()),
            what,
            method: Method::Repeat,
            frame: tcp_frame(c4, 3000, scheduler_vip(i), 80, true, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        });
    }
    // NAT and source NAT, each on a program of its own; the baseline's too where it knows NAT.
    let (mut nat, nat_cases) = nat_setup(Harness::new(&nat_config(true))?, &payload)?;
    let (mut snat, snat_cases) = snat_setup(Harness::new(&snat_config(true))?, &payload)?;
    let mut old_nat = baseline
        .and_then(|o| Harness::with_object(&nat_config(baseline_prefix), o).ok())
        .map(|h| nat_setup(h, &payload))
        .transpose()?;
    let mut old_snat = baseline
        .and_then(|o| Harness::with_object(&snat_config(baseline_prefix), o).ok())
        .map(|h| snat_setup(h, &payload))
        .transpose()?;
    let (mut adm, adm_cases) = admission_setup(Harness::new(&admission_config(true))?, &payload)?;
    let mut old_adm = baseline
        .map(|o| Harness::with_object(&admission_config(false), o))
        .transpose()?;
    let pass_frame = tcp_frame(c4, 2000, ip("10.111.0.2"), 22, false, &payload);
    let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut baseline_samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        samples
            .entry("xdp_pass")
            .or_default()
            .push(bare.run(&pass_frame, repeat)?);
        let mut single = 0.0;
        for _ in 0..singles {
            single += bare.run(&pass_frame, 1)?;
        }
        samples
            .entry("xdp_pass_single")
            .or_default()
            .push(single / f64::from(singles));
        for case in &cases {
            // With a baseline, the two programs take turns going first (drift within a
            // round falls on both alike).
            let baseline_first = round % 2 == 1;
            if let (Some(b), true) = (old.as_mut(), baseline_first) {
                let ns = time_case(b, case, repeat, singles)?;
                baseline_samples.entry(case.key).or_default().push(ns);
            }
            let ns = time_case(&mut h, case, repeat, singles)?;
            samples.entry(case.key).or_default().push(ns);
            if let (Some(b), false) = (old.as_mut(), baseline_first) {
                let ns = time_case(b, case, repeat, singles)?;
                baseline_samples.entry(case.key).or_default().push(ns);
            }
        }
        for ((h, cases), mut old) in [
            ((&mut nat, &nat_cases), old_nat.as_mut()),
            ((&mut snat, &snat_cases), old_snat.as_mut()),
        ] {
            for (i, case) in cases.iter().enumerate() {
                let baseline_first = round % 2 == 1;
                let mut old = old.as_deref_mut().map(|(b, c)| (b, &c[i]));
                if let (Some((b, c)), true) = (old.as_mut(), baseline_first) {
                    let ns = time_case(b, c, repeat, singles)?;
                    baseline_samples.entry(case.key).or_default().push(ns);
                }
                let ns = time_case(h, case, repeat, singles)?;
                samples.entry(case.key).or_default().push(ns);
                if let (Some((b, c)), false) = (old.as_mut(), baseline_first) {
                    let ns = time_case(b, c, repeat, singles)?;
                    baseline_samples.entry(case.key).or_default().push(ns);
                }
            }
        }
        // Admission control; the baseline runs its first case only (an open pool's new flow
        // is a plain Maglev new flow there).
        for (i, case) in adm_cases.iter().enumerate() {
            let baseline_first = round % 2 == 1;
            let mut old = old_adm.as_mut().filter(|_| i == 0);
            if let (Some(b), true) = (old.as_mut(), baseline_first) {
                let ns = time_case(b, case, repeat, singles)?;
                baseline_samples.entry(case.key).or_default().push(ns);
            }
            let ns = time_case(&mut adm, case, repeat, singles)?;
            samples.entry(case.key).or_default().push(ns);
            if let (Some(b), false) = (old.as_mut(), baseline_first) {
                let ns = time_case(b, case, repeat, singles)?;
                baseline_samples.entry(case.key).or_default().push(ns);
            }
        }
    }

    let base = median(&samples["xdp_pass"]);
    let base_single = median(&samples["xdp_pass_single"]);
    let mut figures = Figures::default();
    println!(
        "XDP program cost per packet (BPF_PROG_TEST_RUN, {rounds} interleaved rounds, median [min..max])"
    );
    println!(
        "{:<28} {:>8} {:>18} {:>8} {:>9}  target",
        "path", "ns", "spread", "x pass", "+ns"
    );
    let mut row = |key: &str, what: &str, single: bool, target: Option<&str>| {
        let s = &samples[key];
        let med = median(s);
        let min = s.iter().copied().fold(f64::INFINITY, f64::min);
        let max = s.iter().copied().fold(0.0, f64::max);
        let reference = if single { base_single } else { base };
        println!(
            "{:<28} {:>8.1} {:>8.1}..{:<8.1} {:>8.2} {:>+9.1}  {}",
            key,
            med,
            min,
            max,
            med / reference,
            med - reference,
            target.unwrap_or("")
        );
        println!("    {what}");
        figures.insert(format!("{key}_ns"), med);
        figures.insert(format!("{key}_ratio_to_pass"), med / reference);
        figures.insert(format!("{key}_over_pass_ns"), med - reference);
    };
    row("xdp_pass", "bare XDP_PASS program (repeat)", false, None);
    row(
        "xdp_pass_single",
        "bare XDP_PASS program (single runs)",
        true,
        None,
    );
    for case in cases
        .iter()
        .chain(&nat_cases)
        .chain(&snat_cases)
        .chain(&adm_cases)
    {
        row(
            case.key,
            case.what,
            case.method == Method::Single,
            case.target,
        );
    }
    if !baseline_samples.is_empty() {
        println!(
            "\nThis program against the baseline object, same rounds: median ns, the geometric mean of the rounds' new / baseline ratios, its bootstrap 95% interval, and the rounds' range"
        );
        println!(
            "{:<28} {:>8} {:>10} {:>8} {:>16} {:>16}  verdict",
            "path", "new", "baseline", "ratio", "95% interval", "range"
        );
        for case in cases
            .iter()
            .chain(&nat_cases)
            .chain(&snat_cases)
            .chain(&adm_cases)
        {
            let Some(base) = baseline_samples.get(case.key) else {
                continue;
            };
            let new = &samples[case.key];
            let ratios: Vec<f64> = new.iter().zip(base).map(|(n, b)| n / b).collect();
            let (ratio, ci) = super::geomean_with_95(&ratios, BOOTSTRAP_RESAMPLES);
            let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().copied().fold(0.0, f64::max);
            println!(
                "{:<28} {:>8.1} {:>10.1} {:>8.3} {:>7.3}..{:<7.3} {:>7.3}..{:<7.3}  {}",
                case.key,
                median(new),
                median(base),
                ratio,
                ci.0,
                ci.1,
                lo,
                hi,
                super::verdict(ci)
            );
            figures.insert(format!("{}_baseline_ns", case.key), median(base));
            figures.insert(format!("{}_new_over_baseline", case.key), ratio);
            figures.insert(format!("{}_new_over_baseline_ci_low", case.key), ci.0);
            figures.insert(format!("{}_new_over_baseline_ci_high", case.key), ci.1);
        }
    }
    passive_latency_cost(rounds, repeat, &mut figures)?;
    figures.insert("rounds".into(), rounds as f64);
    figures.insert("repeat".into(), f64::from(repeat));
    println!(
        "Targets from the data-plane issue: established <= 60 ns, new flow <= 105 ns, non-VIP <= 20 ns over bare XDP_PASS.\n\
         Single-run figures include the kernel's per-call timing overhead; compare them with xdp_pass_single."
    );
    Ok(figures)
}
