//! Admission control at SYN time in the XDP program through BPF_PROG_TEST_RUN (needs root):
//! while a VIP's pool is held saturated, new flows of the tiers not admitted are refused (a
//! TCP RST built in the program, a UDP drop, or a plain drop), sent to the overflow tier's
//! backends when the VIP has some, and an admitted tier is admitted up to its cap; established
//! flows and clients of admitted tiers are untouched, and each outcome is counted per tier.

use std::net::IpAddr;

use balancer::base::config::{RawAdmission, RawPolicy, RawTelemetry, RawTier, RawVip};
use balancer_tests::configs::{backend, harness_settings, to_toml, vip};
use balancer_tests::packet::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const B1: &str = "10.111.0.11";
const B2: &str = "10.111.0.12";
const B3: &str = "10.111.0.13";
const B6: [&str; 2] = ["fd00:111::11", "fd00:111::12"];

const TCP4: &str = "10.111.1.1";
const TCP6: &str = "fd00:111:1::1";
const UDP4: &str = "10.111.1.2";
const DROP4: &str = "10.111.1.3";
const OVERFLOW4: &str = "10.111.1.4";
const CAPPED4: &str = "10.111.1.5";
const FAIR4: &str = "10.111.1.6";
const FAIR_OVERFLOW4: &str = "10.111.1.7";

/// A premium client (its /24 is the premium tier's), a free one (no tier).
const PREMIUM: &str = "10.9.5.7";
const FREE: &str = "10.9.0.1";
const PREMIUM6: &str = "2001:db8:5::9";
const FREE6: &str = "2001:db8:1::1";

/// A VIP with admission control over a composite policy fed by pushed reports.
fn admitted_vip(name: &str, address: &str, admission: RawAdmission, backends: &[&str]) -> RawVip {
    let mut v = vip(name, address, 80);
    v.telemetry = Some(RawTelemetry {
        source: Some("push".into()),
        ..RawTelemetry::default()
    });
    v.policy = Some(RawPolicy {
        kind: Some("composite".into()),
        ..RawPolicy::default()
    });
    v.admission = Some(admission);
    v.backend = backends.iter().map(|b| backend(b, None)).collect();
    v
}

fn admit(tiers: &[(&str, i64)]) -> RawAdmission {
    RawAdmission {
        admit: tiers.iter().map(|(t, c)| (t.to_string(), *c)).collect(),
        ..RawAdmission::default()
    }
}

/// Fair admission, with an overflow tier if given.
fn fair(overflow: Option<&str>) -> RawAdmission {
    RawAdmission {
        fair: Some(true),
        overflow: overflow.map(String::from),
        ..RawAdmission::default()
    }
}

/// Tiers "premium" (10.9.5.0/24, 2001:db8:5::/48, DSCP 46) and "spare" (no clients: the
/// overflow pool); VIPs on TCP (both families), UDP, with refusal by drop, with an overflow
/// tier, with a capped premium tier, and with fair admission (premium limited to 4 new flows
/// a second), without and with an overflow tier.
fn config() -> String {
    let mut config = harness_settings(65_536);
    config.tier = vec![
        RawTier {
            name: Some("premium".into()),
            prefixes: vec!["10.9.5.0/24".into(), "2001:db8:5::/48".into()],
            dscp: vec![46],
            spillover: Some(true),
            // Its own limit in fair admission: one new flow per 250 ms.
            max_new_flows_per_sec: Some(4),
            ..RawTier::default()
        },
        RawTier {
            name: Some("spare".into()),
            ..RawTier::default()
        },
    ];
    config.vip = vec![
        admitted_vip("tcp4", TCP4, admit(&[("premium", 0)]), &[B1, B2]),
        admitted_vip("tcp6", TCP6, admit(&[("premium", 0)]), &B6),
        {
            let mut v = admitted_vip("udp4", UDP4, admit(&[("premium", 0)]), &[B1, B2]);
            v.protocol = Some("udp".into());
            v
        },
        admitted_vip(
            "drop4",
            DROP4,
            RawAdmission {
                refuse: Some("drop".into()),
                ..admit(&[("premium", 0)])
            },
            &[B1, B2],
        ),
        {
            let mut v = admitted_vip(
                "overflow4",
                OVERFLOW4,
                RawAdmission {
                    overflow: Some("spare".into()),
                    ..admit(&[])
                },
                &[B1, B2, B3],
            );
            v.backend[2].tier = Some("spare".into());
            v
        },
        admitted_vip("capped4", CAPPED4, admit(&[("premium", 3)]), &[B1, B2]),
        admitted_vip("fair4", FAIR4, fair(None), &[B1, B2]),
        {
            let mut v = admitted_vip(
                "fairoverflow4",
                FAIR_OVERFLOW4,
                fair(Some("spare")),
                &[B1, B2, B3],
            );
            v.backend[2].tier = Some("spare".into());
            v
        },
    ];
    to_toml(&config)
}

fn harness() -> Harness {
    pin_to_current_cpu();
    Harness::new(&config())
        .expect("loading the balancer needs root and BPF: run through cargo xtask test")
}

fn saturate(h: &mut Harness, vip: &str, saturated: bool) {
    let endpoint = h.config.vip(vip).expect("configured VIP").endpoint();
    assert!(
        h.balancer.set_saturated(&endpoint, saturated).unwrap(),
        "{vip}: saturation did not change"
    );
}

/// What became of a packet.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Forwarded (L2 DSR) to this backend.
    To(IpAddr),
    /// Answered with a RST|ACK acknowledging this sequence number.
    Reset {
        ack: u32,
    },
    Dropped,
}

const BACKENDS: [&str; 5] = [B1, B2, B3, B6[0], B6[1]];

/// Runs `frame` (sent by `client` to `vip`:`dport`) and checks a RST in full: addresses,
/// ports, flags, sequence 0, and both checksums.
fn outcome(h: &mut Harness, frame: &[u8], client: IpAddr, vip: IpAddr, sport: u16) -> Outcome {
    let (action, out) = h.run(frame).unwrap();
    match action_name(action) {
        "XDP_DROP" => Outcome::Dropped,
        "XDP_TX" => {
            let backends: Vec<IpAddr> = BACKENDS.iter().map(|b| ip(b)).collect();
            if let Some(b) = backend_of_output(&out, &backends) {
                return Outcome::To(b);
            }
            Outcome::Reset {
                ack: check_reset(&out, client, vip, sport),
            }
        }
        other => panic!("unexpected {other}"),
    }
}

/// Checks that `out` is a valid RST|ACK from `vip`:80 to `client`:`sport`; its ACK number.
fn check_reset(out: &[u8], client: IpAddr, vip: IpAddr, sport: u16) -> u32 {
    assert_eq!(
        out[0..6],
        CLIENT_MAC,
        "RST not addressed to the client's MAC"
    );
    assert_eq!(out[6..12], LB_MAC, "RST not from the balancer's MAC");
    let (l4, pseudo): (usize, Vec<u8>) = match (client, vip) {
        (IpAddr::V4(c), IpAddr::V4(v)) => {
            assert_eq!(out.len(), 14 + 20 + 20, "RST frame length");
            assert_eq!(out[14], 0x45);
            assert_eq!(u16::from_be_bytes([out[16], out[17]]), 40, "total length");
            assert_eq!(out[23], 6, "protocol");
            assert_eq!(out[26..30], v.octets(), "RST source is not the VIP");
            assert_eq!(out[30..34], c.octets(), "RST destination is not the client");
            assert_eq!(ones_complement_sum(&out[14..34]), 0xffff, "IPv4 checksum");
            let mut p = out[26..34].to_vec();
            p.extend_from_slice(&[0, 6, 0, 20]);
            (34, p)
        }
        (IpAddr::V6(c), IpAddr::V6(v)) => {
            assert_eq!(out.len(), 14 + 40 + 20, "RST frame length");
            assert_eq!(out[14] >> 4, 6);
            assert_eq!(u16::from_be_bytes([out[18], out[19]]), 20, "payload length");
            assert_eq!(out[20], 6, "next header");
            assert_eq!(out[22..38], v.octets(), "RST source is not the VIP");
            assert_eq!(out[38..54], c.octets(), "RST destination is not the client");
            let mut p = out[22..54].to_vec();
            p.extend_from_slice(&[0, 0, 0, 20, 0, 0, 0, 6]);
            (54, p)
        }
        _ => panic!("mixed families"),
    };
    let tcp = &out[l4..l4 + 20];
    assert_eq!(u16::from_be_bytes([tcp[0], tcp[1]]), 80, "RST source port");
    assert_eq!(
        u16::from_be_bytes([tcp[2], tcp[3]]),
        sport,
        "RST destination port"
    );
    assert_eq!(tcp[4..8], [0, 0, 0, 0], "a RST to a SYN has sequence 0");
    assert_eq!(tcp[12], 5 << 4, "data offset");
    assert_eq!(tcp[13], 0x14, "flags are RST|ACK");
    let mut summed = pseudo;
    summed.extend_from_slice(tcp);
    assert_eq!(ones_complement_sum(&summed), 0xffff, "TCP checksum");
    u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]])
}

fn syn(h: &mut Harness, client: &str, vip: &str, sport: u16) -> Outcome {
    let (c, v) = (ip(client), ip(vip));
    let frame = tcp_frame(c, sport, v, 80, true, b"");
    outcome(h, &frame, c, v, sport)
}

/// The sequence number of the SYNs `tcp_frame` builds.
const SYN_SEQ: u32 = 1000;

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn a_saturated_pool_refuses_new_flows_of_tiers_not_admitted_with_a_reset() {
    let mut h = harness();
    for (vip, premium, free) in [(TCP4, PREMIUM, FREE), (TCP6, PREMIUM6, FREE6)] {
        // Not saturated: every client is served.
        assert!(matches!(syn(&mut h, free, vip, 4000), Outcome::To(_)));
        // An established free-tier flow, opened before the pool saturates.
        let Outcome::To(established) = syn(&mut h, free, vip, 4001) else {
            panic!("not forwarded");
        };
        let name = if ip(vip).is_ipv4() { "tcp4" } else { "tcp6" };
        saturate(&mut h, name, true);
        for p in 0..20 {
            assert_eq!(
                syn(&mut h, free, vip, 5000 + p),
                Outcome::Reset { ack: SYN_SEQ + 1 },
                "a free-tier SYN to {vip} while saturated"
            );
            assert!(
                matches!(syn(&mut h, premium, vip, 5000 + p), Outcome::To(_)),
                "a premium SYN to {vip} was refused"
            );
        }
        // A SYN carrying data (TCP Fast Open): the RST acknowledges it too.
        let (c, v) = (ip(free), ip(vip));
        let frame = tcp_frame(c, 5100, v, 80, true, b"hello");
        assert_eq!(
            outcome(&mut h, &frame, c, v, 5100),
            Outcome::Reset {
                ack: SYN_SEQ + 1 + 5
            }
        );
        // Established flows are never touched: the one opened before, and an ACK of a flow the
        // connection table does not know.
        let frame = tcp_frame(c, 4001, v, 80, false, b"data");
        assert_eq!(
            outcome(&mut h, &frame, c, v, 4001),
            Outcome::To(established)
        );
        let frame = tcp_frame(c, 4999, v, 80, false, b"data");
        assert!(matches!(
            outcome(&mut h, &frame, c, v, 4999),
            Outcome::To(_)
        ));
        // A client RST of an unknown flow is not answered.
        let frame = tcp_flags_frame(c, 4998, v, 80, false, true);
        assert!(!matches!(
            outcome(&mut h, &frame, c, v, 4998),
            Outcome::Reset { .. }
        ));
        let id = h.balancer.vip(name).unwrap().id;
        let counts = h.balancer.admission_counts(id).unwrap();
        assert_eq!(counts[0].shed_saturated, 21, "free-tier SYNs shed");
        assert_eq!(counts[1].admitted, 20, "premium SYNs admitted");
        assert_eq!(counts[0].overflowed + counts[1].shed_saturated, 0);
        // No longer saturated: free clients are served again.
        saturate(&mut h, name, false);
        assert!(matches!(syn(&mut h, free, vip, 6000), Outcome::To(_)));
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn a_premium_tier_by_dscp_is_admitted_and_udp_and_drop_vips_drop() {
    let mut h = harness();
    saturate(&mut h, "tcp4", true);
    // DSCP 46 makes a free address premium.
    let (c, v) = (ip(FREE), ip(TCP4));
    let mut frame = tcp_frame(c, 7000, v, 80, true, b"");
    frame[15] = 46 << 2;
    frame[24] = 0;
    frame[25] = 0;
    let sum = !ones_complement_sum(&frame[14..34]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
    assert!(matches!(
        outcome(&mut h, &frame, c, v, 7000),
        Outcome::To(_)
    ));

    // UDP: a new flow of a free client is dropped, a premium one's goes through, a flow
    // established before the pool saturated continues.
    let u = ip(UDP4);
    let udp = |client: &str, sport: u16| udp_frame(ip(client), sport, u, 80, b"q");
    let Outcome::To(established) = outcome(&mut h, &udp(FREE, 53), c, u, 53) else {
        panic!("UDP not forwarded");
    };
    saturate(&mut h, "udp4", true);
    assert_eq!(outcome(&mut h, &udp(FREE, 54), c, u, 54), Outcome::Dropped);
    assert_eq!(
        outcome(&mut h, &udp(FREE, 53), c, u, 53),
        Outcome::To(established)
    );
    assert!(matches!(
        outcome(&mut h, &udp(PREMIUM, 55), ip(PREMIUM), u, 55),
        Outcome::To(_)
    ));

    // Refusal by drop: no RST.
    saturate(&mut h, "drop4", true);
    assert_eq!(syn(&mut h, FREE, DROP4, 7100), Outcome::Dropped);
    assert!(matches!(syn(&mut h, PREMIUM, DROP4, 7100), Outcome::To(_)));
    let id = h.balancer.vip("drop4").unwrap().id;
    assert_eq!(
        h.balancer.admission_counts(id).unwrap()[0].shed_saturated,
        1
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn flows_not_admitted_go_to_the_overflow_tier_and_only_then() {
    let mut h = harness();
    for p in 0..50 {
        assert_ne!(
            syn(&mut h, FREE, OVERFLOW4, 8000 + p),
            Outcome::To(ip(B3)),
            "the overflow backend took a flow while the pool was not saturated"
        );
    }
    saturate(&mut h, "overflow4", true);
    for (client, p) in [(FREE, 0), (PREMIUM, 1)] {
        for q in 0..20 {
            assert_eq!(
                syn(&mut h, client, OVERFLOW4, 8100 + 100 * p + q),
                Outcome::To(ip(B3)),
                "{client}: no tier is admitted, every new flow overflows"
            );
        }
    }
    let id = h.balancer.vip("overflow4").unwrap().id;
    let counts = h.balancer.admission_counts(id).unwrap();
    assert_eq!((counts[0].shed_saturated, counts[0].overflowed), (20, 20));
    assert_eq!((counts[1].shed_saturated, counts[1].overflowed), (20, 20));
}

/// The flow clock's tick now (the kernel's coarse monotonic clock in 2^30 ns ticks, as the
/// program reads it).
fn tick() -> u64 {
    coarse_ns() >> 30
}

/// The kernel's coarse monotonic clock, nanoseconds (the clock the program reads).
fn coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) },
        0
    );
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn an_admitted_tier_is_admitted_up_to_its_cap() {
    let mut h = harness();
    saturate(&mut h, "capped4", true);
    let first = tick();
    let outcomes: Vec<Outcome> = (0..12)
        .map(|p| syn(&mut h, PREMIUM, CAPPED4, 9000 + p))
        .collect();
    // The cap (3 per tick on this CPU) may have started afresh once per tick crossed.
    let ticks = tick() - first + 1;
    let admitted = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::To(_)))
        .count() as u64;
    let reset = outcomes
        .iter()
        .filter(|o| **o == Outcome::Reset { ack: SYN_SEQ + 1 })
        .count() as u64;
    assert_eq!(admitted + reset, 12, "{outcomes:?}");
    assert!(
        (3..=3 * ticks).contains(&admitted),
        "{admitted} admitted over {ticks} tick(s): {outcomes:?}"
    );
    assert_eq!(
        outcomes[..3]
            .iter()
            .filter(|o| matches!(o, Outcome::To(_)))
            .count(),
        3
    );
    let id = h.balancer.vip("capped4").unwrap().id;
    let counts = h.balancer.admission_counts(id).unwrap();
    assert_eq!(
        (counts[1].admitted, counts[1].shed_over_cap),
        (admitted, reset)
    );
}

/// Milliseconds on the coarse clock the program reads.
fn coarse_ms() -> u64 {
    coarse_ns() / 1_000_000
}

/// How many of `outcomes` went to a backend, and how many were refused with a RST.
fn tally(outcomes: &[Outcome]) -> (u64, u64) {
    let admitted = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::To(_)))
        .count() as u64;
    let reset = outcomes
        .iter()
        .filter(|o| **o == Outcome::Reset { ack: SYN_SEQ + 1 })
        .count() as u64;
    (admitted, reset)
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn fair_admission_holds_a_tenant_to_its_own_limit_at_all_times() {
    let mut h = harness();
    let id = h.balancer.vip("fair4").unwrap().id;
    // Not saturated: the clients of no tier have no limit; premium is held to 4 a second
    // (one per 250 ms, with 500 ms of burst: three at once, then one per 250 ms).
    let started = coarse_ms();
    let outcomes: Vec<Outcome> = (0..12)
        .map(|p| syn(&mut h, PREMIUM, FAIR4, 9100 + p))
        .collect();
    let elapsed = coarse_ms() - started;
    let (admitted, reset) = tally(&outcomes);
    assert_eq!(admitted + reset, 12, "{outcomes:?}");
    assert!(
        (3..=3 + elapsed / 250 + 1).contains(&admitted),
        "{admitted} admitted in {elapsed} ms: {outcomes:?}"
    );
    assert!(matches!(outcomes[0], Outcome::To(_)), "{outcomes:?}");
    for p in 0..12 {
        assert!(
            matches!(syn(&mut h, FREE, FAIR4, 9200 + p), Outcome::To(_)),
            "a client of no tier (no limit) refused"
        );
    }
    let counts = h.balancer.admission_counts(id).unwrap();
    assert_eq!(
        (counts[1].admitted, counts[1].shed_over_cap),
        (admitted, reset)
    );
    assert_eq!((counts[0].admitted, counts[0].shed_over_cap), (12, 0));
    // A premium flow admitted earlier is established: its packets pass whatever the pace.
    let first = ip(PREMIUM);
    let data = tcp_frame(first, 9100, ip(FAIR4), 80, false, b"more");
    for _ in 0..5 {
        assert!(matches!(
            outcome(&mut h, &data, first, ip(FAIR4), 9100),
            Outcome::To(_)
        ));
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn a_saturated_pool_admits_every_tenant_at_its_fair_rate_and_overflows_the_rest() {
    let mut h = harness();
    // Before any round has measured the pool, a saturated pool admits a trickle shared by
    // the tenants (the clients of no tier and premium, share 1 each: about one flow per 2 s
    // each): the first SYN of each tenant is admitted, the next ones refused.
    saturate(&mut h, "fair4", true);
    let id = h.balancer.vip("fair4").unwrap().id;
    let entry = h.balancer.fair_rates(
        id,
        h.config.vip("fair4").unwrap().admission.as_ref().unwrap(),
        true,
    );
    assert!(
        entry[0].is_some_and(|r| r < 1.0) && entry[1].is_some_and(|r| r < 1.0),
        "{entry:?}"
    );
    for (client, sport) in [(FREE, 9300), (PREMIUM, 9400)] {
        let outcomes: Vec<Outcome> = (0..6)
            .map(|p| syn(&mut h, client, FAIR4, sport + p))
            .collect();
        assert!(
            matches!(outcomes[0], Outcome::To(_)),
            "{client}: {outcomes:?}"
        );
        assert_eq!(tally(&outcomes), (1, 5), "{client}: {outcomes:?}");
    }
    let counts = h.balancer.admission_counts(id).unwrap();
    assert_eq!((counts[0].admitted, counts[0].shed_over_cap), (1, 5));
    assert_eq!((counts[1].admitted, counts[1].shed_over_cap), (1, 5));
    // With an overflow tier, what is over a tenant's rate goes to its backend.
    saturate(&mut h, "fairoverflow4", true);
    let outcomes: Vec<Outcome> = (0..6)
        .map(|p| syn(&mut h, FREE, FAIR_OVERFLOW4, 9500 + p))
        .collect();
    assert!(
        outcomes[1..].iter().all(|o| *o == Outcome::To(ip(B3))),
        "{outcomes:?}"
    );
    let id = h.balancer.vip("fairoverflow4").unwrap().id;
    let counts = h.balancer.admission_counts(id).unwrap();
    assert_eq!((counts[0].shed_over_cap, counts[0].overflowed), (5, 5));
    // No longer saturated: the clients of no tier are admitted again, at once.
    saturate(&mut h, "fair4", false);
    for p in 0..6 {
        assert!(matches!(syn(&mut h, FREE, FAIR4, 9600 + p), Outcome::To(_)));
    }
}
