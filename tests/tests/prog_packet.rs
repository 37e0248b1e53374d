//! Packet-exact tests of the XDP program through BPF_PROG_TEST_RUN (needs root): fixtures of
//! {input frame, expected action, expected output bytes}, with maps filled by the daemon's code.

use std::net::IpAddr;
use std::time::Duration;

use balancer_common::stats::Counter;
use balancer_tests::configs::{packet_fixture, to_toml, vip_mut};
use balancer_tests::packet::*;
use etherparse::PacketBuilder;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The fixtures' config as the daemon reads it.
fn fixture() -> String {
    to_toml(&packet_fixture())
}

fn harness() -> Harness {
    Harness::new(&fixture())
        .expect("loading the balancer needs root and BPF: run through cargo xtask test")
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn l2_dsr_rewrites_only_the_macs() {
    let mut h = harness();
    for (client, vip, name) in [
        ("10.9.0.1", "10.111.1.1", "l2dsr4"),
        ("2001:db8::5", "fd00:111:1::1", "l2dsr6"),
    ] {
        for sport in [1000u16, 40000, 65535] {
            let frame = tcp_frame(ip(client), sport, ip(vip), 80, true, b"hello");
            let backend = h.table_backend(name, ip(client), sport).unwrap();
            let (action, out) = h.run(&frame).unwrap();
            assert_eq!(action_name(action), "XDP_TX", "{name} sport {sport}");
            assert_eq!(out, expect_l2dsr(&frame, backend), "{name} sport {sport}");
        }
    }
}

fn counter(h: &Harness, c: Counter) -> u64 {
    h.balancer.global_stats().unwrap().get(c)
}

/// The IPv4 and IPv6 encapsulation sources of the fixtures (`configs::entropy_sources`).
fn encap(backend: IpAddr, gue_port: Option<u16>) -> Encap {
    match backend {
        IpAddr::V4(_) => Encap {
            backend,
            source: ip("172.16.0.0"),
            entropy_mask: 0xffff,
            gue_port,
        },
        IpAddr::V6(_) => Encap {
            backend,
            source: ip("fd00:e::"),
            entropy_mask: u32::MAX,
            gue_port,
        },
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn ipip_and_gue_push_exact_outer_headers() {
    let mut h = harness();
    // (vip name, client, vip, port, udp, gue port)
    type EncapCase<'a> = (&'a str, &'a str, &'a str, u16, bool, Option<u16>);
    let cases: &[EncapCase<'_>] = &[
        ("ipip4", "10.9.0.1", "10.111.1.2", 80, false, None),
        ("gue4", "10.9.0.1", "10.111.1.3", 80, false, Some(6080)),
        ("ipip6", "2001:db8::5", "fd00:111:1::2", 80, false, None),
        (
            "gue6",
            "2001:db8::5",
            "fd00:111:1::3",
            443,
            true,
            Some(6081),
        ),
        ("dns4", "10.9.0.7", "10.111.1.1", 53, true, None),
    ];
    for &(name, client, vip, port, udp, gue) in cases {
        for sport in [1u16, 1234, 50000, 65535] {
            let frame = if udp {
                udp_frame(ip(client), sport, ip(vip), port, b"query")
            } else {
                tcp_frame(ip(client), sport, ip(vip), port, true, b"")
            };
            let backend = h.table_backend(name, ip(client), sport).unwrap();
            let (action, out) = h.run(&frame).unwrap();
            assert_eq!(action_name(action), "XDP_TX", "{name} sport {sport}");
            let want = expect_encap(&frame, 14, ip(client), sport, encap(backend, gue));
            assert_eq!(
                out, want,
                "{name} sport {sport}: output differs from the expected encapsulation"
            );
        }
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn vlan_tags_are_kept() {
    let mut h = harness();
    // (VIP, client, client port, VIP address, tags outermost first with their TPID)
    type VlanCase<'a> = (&'a str, &'a str, u16, &'a str, &'a [(u16, u16)]);
    let cases: &[VlanCase<'_>] = &[
        // One 802.1Q tag, L2 DSR.
        ("l2dsr4", "10.9.0.1", 2000, "10.111.1.1", &[(0x8100, 42)]),
        // 802.1ad outer and 802.1Q inner, IPIP: the tags stay in front of the outer header.
        (
            "ipip4",
            "10.9.0.1",
            2001,
            "10.111.1.2",
            &[(0x88a8, 100), (0x8100, 7)],
        ),
        // IPv6 with one tag, IPIP6.
        (
            "ipip6",
            "2001:db8::9",
            3000,
            "fd00:111:1::2",
            &[(0x8100, 5)],
        ),
    ];
    for &(name, client, sport, vip, tags) in cases {
        let mut frame = tcp_frame(ip(client), sport, ip(vip), 80, true, b"x");
        for &(tpid, vid) in tags.iter().rev() {
            frame = with_vlan(&frame, vid);
            frame[12..14].copy_from_slice(&tpid.to_be_bytes());
        }
        let backend = h.table_backend(name, ip(client), sport).unwrap();
        let (action, out) = h.run(&frame).unwrap();
        assert_eq!(action_name(action), "XDP_TX", "{name}");
        let want = if name.starts_with("l2dsr") {
            expect_l2dsr(&frame, backend)
        } else {
            let l3_off = 14 + 4 * tags.len();
            expect_encap(&frame, l3_off, ip(client), sport, encap(backend, None))
        };
        assert_eq!(out, want, "{name} with {} tag(s)", tags.len());
    }
}

/// The fixtures with the l2dsr4 VIP's backend `backend` given weight `weight` (or removed).
fn l2dsr4_with(backend: IpAddr, weight: Option<u32>) -> String {
    let mut config = packet_fixture();
    let vip = vip_mut(&mut config, "l2dsr4");
    let at = vip
        .backend
        .iter()
        .position(|b| b.address.as_deref() == Some(backend.to_string().as_str()))
        .unwrap_or_else(|| panic!("{backend} is not an l2dsr4 backend"));
    match weight {
        Some(w) => vip.backend[at].weight = Some(w.into()),
        None => {
            vip.backend.remove(at);
        }
    }
    to_toml(&config)
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn established_flows_keep_their_backend_across_table_changes() {
    let mut h = harness();
    let client = ip("10.9.1.1");
    let vip = ip("10.111.1.1");
    // Find a flow whose backend changes when that backend is drained.
    let sport = 7000;
    let first = h.table_backend("l2dsr4", client, sport).unwrap();
    let (_, out) = h
        .run(&tcp_frame(client, sport, vip, 80, true, b""))
        .unwrap();
    assert_eq!(out[0..6], backend_mac(first));
    let misses = counter(&h, Counter::ConntrackMiss);

    // Drain `first` (weight 0): the table no longer holds it, the tracked flow keeps it.
    h.reconfigure(&l2dsr4_with(first, Some(0))).unwrap();
    assert_ne!(h.table_backend("l2dsr4", client, sport).unwrap(), first);
    let hits = counter(&h, Counter::ConntrackHit);
    for _ in 0..3 {
        let (action, out) = h
            .run(&tcp_frame(client, sport, vip, 80, false, b"data"))
            .unwrap();
        assert_eq!(action_name(action), "XDP_TX");
        assert_eq!(
            out[0..6],
            backend_mac(first),
            "established flow moved off its drained backend"
        );
    }
    assert_eq!(counter(&h, Counter::ConntrackHit), hits + 3);
    assert_eq!(counter(&h, Counter::ConntrackMiss), misses);
    // New flows never reach the drained backend.
    for p in 0..200u16 {
        let (_, out) = h
            .run(&tcp_frame(client, 20000 + p, vip, 80, true, b""))
            .unwrap();
        assert_ne!(
            out[0..6],
            backend_mac(first),
            "new flow sent to a drained backend"
        );
    }

    // Remove it: the tracked flow is re-hashed onto the table's choice.
    h.reconfigure(&l2dsr4_with(first, None)).unwrap();
    let rehashed = counter(&h, Counter::FlowRehashed);
    let now = h.table_backend("l2dsr4", client, sport).unwrap();
    assert_ne!(now, first);
    let (_, out) = h
        .run(&tcp_frame(client, sport, vip, 80, false, b"data"))
        .unwrap();
    assert_eq!(out[0..6], backend_mac(now));
    assert_eq!(counter(&h, Counter::FlowRehashed), rehashed + 1);
    // And it is tracked on its new backend from then on.
    h.reconfigure(&fixture()).unwrap();
    let (_, out) = h
        .run(&tcp_frame(client, sport, vip, 80, false, b"data"))
        .unwrap();
    assert_eq!(
        out[0..6],
        backend_mac(now),
        "re-hashed flow did not stay on its new backend"
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn new_flows_follow_each_table_in_force_as_replaced_tables_are_refilled() {
    // A publish refills, in place, the table the one before it replaced (no program reads it
    // once the swap has returned). Through a run of weight changes, back to earlier ones
    // too, new flows land where the table in force says, never where a stale one would.
    let mut h = harness();
    let client = ip("10.9.3.3");
    let vip = ip("10.111.1.1");
    let [a, b, c] = ["10.111.0.11", "10.111.0.12", "10.111.0.13"].map(ip);
    let steps = [
        l2dsr4_with(a, Some(6)),
        l2dsr4_with(b, Some(9)),
        fixture(),
        l2dsr4_with(a, Some(6)),
        l2dsr4_with(c, Some(4)),
        l2dsr4_with(b, None),
        fixture(),
    ];
    let mut before: Option<Vec<IpAddr>> = None;
    for (step, config) in steps.iter().enumerate() {
        h.reconfigure(config).unwrap();
        // The premise: each step moves some of the same 256 probe flows.
        let probes: Vec<IpAddr> = (0..256u16)
            .map(|p| h.table_backend("l2dsr4", client, p).unwrap())
            .collect();
        if let Some(before) = &before {
            assert_ne!(
                &probes, before,
                "step {step}: the weights moved none of the probe flows (the test proves nothing)"
            );
        }
        before = Some(probes);
        // New flows (ports of their own each step, so none is tracked yet).
        for p in 0..64u16 {
            let sport = 10_000 + 100 * step as u16 + p;
            let want = h.table_backend("l2dsr4", client, sport).unwrap();
            let (action, out) = h
                .run(&tcp_frame(client, sport, vip, 80, true, b""))
                .unwrap();
            assert_eq!(action_name(action), "XDP_TX");
            assert_eq!(
                out[0..6],
                backend_mac(want),
                "step {step}: flow from port {sport} not sent where the table in force says"
            );
        }
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn idle_udp_flows_are_chosen_afresh() {
    let mut h = Harness::with_settings(&fixture(), |s| s.udp_idle_ticks = 1).unwrap();
    // One tick of idle time (about 1.07 s).
    let client = ip("10.9.2.2");
    let vip = ip("10.111.1.1");
    let sport = 5555;
    // dns4 has one backend; use a two-backend UDP flow on l2dsr4's address instead: port 53
    // goes to dns4 (ipip, one backend), so check expiry by its counter.
    let frame = udp_frame(client, sport, vip, 53, b"q");
    h.run(&frame).unwrap();
    let hits = counter(&h, Counter::ConntrackHit);
    std::thread::sleep(Duration::from_millis(500));
    h.run(&frame).unwrap();
    assert_eq!(
        counter(&h, Counter::ConntrackHit),
        hits + 1,
        "second packet within the idle time"
    );
    // The flow clock ticks every 2^30 ns; idle more than one tick expires.
    std::thread::sleep(Duration::from_millis(2300));
    let expired = counter(&h, Counter::UdpFlowExpired);
    let (action, _) = h.run(&frame).unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    assert_eq!(
        counter(&h, Counter::UdpFlowExpired),
        expired + 1,
        "idle UDP flow not expired"
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn flood_mode_stops_inserting_and_uses_the_hash() {
    // The flood window is per CPU.
    pin_to_current_cpu();
    let mut h = Harness::with_settings(&fixture(), |s| s.flood_threshold = 10).unwrap();
    let client = ip("10.9.3.3");
    let vip = ip("10.111.1.1");
    for p in 0..30u16 {
        let sport = 30000 + p;
        let backend = h.table_backend("l2dsr4", client, sport).unwrap();
        let (action, out) = h
            .run(&tcp_frame(client, sport, vip, 80, true, b""))
            .unwrap();
        assert_eq!(action_name(action), "XDP_TX");
        assert_eq!(
            out[0..6],
            backend_mac(backend),
            "flood mode must still forward by the table"
        );
    }
    // test_run runs on the calling thread's CPU: 10 inserts, then flood mode.
    assert_eq!(counter(&h, Counter::FloodActivations), 1);
    assert_eq!(counter(&h, Counter::FloodInsertsSkipped), 20);
    // Flows past the threshold were not tracked: after a drain they follow the new table.
    let late = 30029u16;
    let backend = h.table_backend("l2dsr4", client, late).unwrap();
    h.reconfigure(&l2dsr4_with(backend, Some(0))).unwrap();
    let (_, out) = h
        .run(&tcp_frame(client, late, vip, 80, false, b""))
        .unwrap();
    assert_ne!(
        out[0..6],
        backend_mac(backend),
        "a flow inserted during flood mode"
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn not_for_a_vip_passes_untouched() {
    let mut h = harness();
    let frames: Vec<(&str, Vec<u8>)> = vec![
        (
            "TCP to the balancer's own address",
            tcp_frame(ip("10.9.0.1"), 40000, ip("10.111.0.2"), 22, false, b"ssh"),
        ),
        (
            "VIP address, other port",
            tcp_frame(ip("10.9.0.1"), 40000, ip("10.111.1.1"), 81, true, b""),
        ),
        (
            "VIP address and port, other protocol",
            udp_frame(ip("10.9.0.1"), 40000, ip("10.111.1.1"), 80, b""),
        ),
        (
            "IPv6 to another host",
            tcp_frame(ip("2001:db8::1"), 1, ip("2001:db8::2"), 80, true, b""),
        ),
        ("ARP", {
            let mut f = vec![0xffu8; 6];
            f.extend_from_slice(&CLIENT_MAC);
            f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
            f.extend_from_slice(&[0u8; 28]);
            f
        }),
        ("ping to the balancer", {
            let mut f = Vec::new();
            PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
                .ipv4([10, 9, 0, 1], [10, 111, 0, 2], 64)
                .icmpv4_echo_request(1, 1)
                .write(&mut f, b"ping")
                .unwrap();
            f
        }),
        ("IPv4 fragment to another host", {
            let mut f = udp_frame(ip("10.9.0.1"), 1, ip("10.111.0.2"), 53, b"frag");
            f[20] = 0x20; // more fragments
            f
        }),
        (
            "bare Ethernet header, unknown type",
            vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 0x10, 0x88, 0xb5],
        ),
        ("IPv4 type, header cut off", {
            let mut f = tcp_frame(ip("10.9.0.1"), 1, ip("10.111.1.1"), 80, true, b"");
            f.truncate(14 + 19);
            f
        }),
    ];
    for (what, frame) in frames {
        let (action, out) = h.run(&frame).unwrap();
        assert_eq!(action_name(action), "XDP_PASS", "{what}");
        assert_eq!(out, frame, "{what}: frame changed");
    }
}

/// Rewrites the IPv4 header checksum of a frame after a test edited the header.
fn fix_ipv4_checksum(frame: &mut [u8], l3: usize) {
    frame[l3 + 10] = 0;
    frame[l3 + 11] = 0;
    let ihl = (frame[l3] & 0xf) as usize * 4;
    let sum = !ones_complement_sum(&frame[l3..l3 + ihl]);
    frame[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn fragments_options_and_malformed_vip_packets_are_dropped_and_counted() {
    let mut h = harness();
    let vip = ip("10.111.1.1");
    let client = ip("10.9.0.1");
    let base = tcp_frame(client, 1000, vip, 80, true, b"0123456789abcdef");

    let mut fragment = base.clone();
    fragment[20] = 0x20; // MF
    fix_ipv4_checksum(&mut fragment, 14);
    let mut later_fragment = base.clone();
    later_fragment[20] = 0x00;
    later_fragment[21] = 0x10; // offset 16 * 8
    fix_ipv4_checksum(&mut later_fragment, 14);

    // IPv4 with 4 bytes of options (NOPs + end): IHL 6.
    let mut options = base[..34].to_vec();
    options.extend_from_slice(&[1, 1, 1, 0]);
    options.extend_from_slice(&base[34..]);
    options[14] = 0x46;
    let total = (options.len() - 14) as u16;
    options[16..18].copy_from_slice(&total.to_be_bytes());
    fix_ipv4_checksum(&mut options, 14);

    let mut too_long = base.clone();
    too_long[16..18].copy_from_slice(&2000u16.to_be_bytes());
    fix_ipv4_checksum(&mut too_long, 14);
    let cut_ports = base[..14 + 20 + 2].to_vec();

    let v6 = tcp_frame(ip("2001:db8::5"), 1000, ip("fd00:111:1::1"), 80, true, b"x");
    let mut v6_fragment = v6[..54].to_vec();
    v6_fragment[20] = 44; // next header: fragment
    v6_fragment.extend_from_slice(&[6, 0, 0, 0x01, 0, 0, 0, 1]); // next TCP, offset 0, MF
    v6_fragment.extend_from_slice(&v6[54..]);
    let payload = (v6_fragment.len() - 54) as u16;
    v6_fragment[18..20].copy_from_slice(&payload.to_be_bytes());

    let cases: Vec<(&str, Vec<u8>, Counter)> = vec![
        ("first IPv4 fragment", fragment, Counter::DropFragment),
        ("later IPv4 fragment", later_fragment, Counter::DropFragment),
        ("IPv6 fragment", v6_fragment, Counter::DropFragment),
        ("IPv4 options", options, Counter::DropIpOptions),
        (
            "total length past the frame",
            too_long,
            Counter::DropMalformed,
        ),
        ("ports cut off", cut_ports, Counter::DropMalformed),
        (
            "VIP without backends",
            tcp_frame(client, 1000, ip("10.111.1.9"), 80, true, b""),
            Counter::DropNoBackend,
        ),
    ];
    for (what, frame, reason) in cases {
        let before = counter(&h, reason);
        let (action, _) = h.run(&frame).unwrap();
        assert_eq!(action_name(action), "XDP_DROP", "{what}");
        assert_eq!(
            counter(&h, reason),
            before + 1,
            "{what}: {} not counted",
            reason.name()
        );
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn ipv6_extension_headers_are_followed() {
    let mut h = harness();
    let client = ip("2001:db8::7");
    let plain = tcp_frame(client, 4242, ip("fd00:111:1::1"), 80, true, b"hi");
    // Insert hop-by-hop (8 bytes) and destination options (16 bytes) before TCP.
    let mut frame = plain[..54].to_vec();
    frame[20] = 0; // hop-by-hop
    frame.extend_from_slice(&[60, 0, 1, 4, 0, 0, 0, 0]); // next: dest opts, len 0 (8 bytes), PadN
    frame.extend_from_slice(&[6, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // next: TCP, 16 bytes
    frame.extend_from_slice(&plain[54..]);
    let payload = (frame.len() - 54) as u16;
    frame[18..20].copy_from_slice(&payload.to_be_bytes());
    let backend = h.table_backend("l2dsr6", client, 4242).unwrap();
    let (action, out) = h.run(&frame).unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    assert_eq!(out, expect_l2dsr(&frame, backend));
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn pings_to_a_vip_address_are_answered() {
    let mut h = harness();
    let mut v4 = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv4([10, 9, 0, 1], [10, 111, 1, 1], 64)
        .icmpv4_echo_request(7, 3)
        .write(&mut v4, b"are you there")
        .unwrap();
    let (action, out) = h.run(&v4).unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    assert_eq!(out[0..6], CLIENT_MAC);
    assert_eq!(out[6..12], LB_MAC);
    assert_eq!(out[26..30], [10, 111, 1, 1], "reply source is the VIP");
    assert_eq!(out[30..34], [10, 9, 0, 1]);
    assert_eq!(out[34], 0, "echo reply type");
    assert_eq!(
        ones_complement_sum(&out[34..]),
        0xffff,
        "ICMP checksum invalid"
    );
    assert_eq!(
        ones_complement_sum(&out[14..34]),
        0xffff,
        "IPv4 checksum invalid"
    );

    let mut v6 = Vec::new();
    let (src, dst) = (ip("2001:db8::1"), ip("fd00:111:1::2"));
    let (IpAddr::V6(s), IpAddr::V6(d)) = (src, dst) else {
        unreachable!()
    };
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv6(s.octets(), d.octets(), 64)
        .icmpv6_echo_request(7, 3)
        .write(&mut v6, b"are you there")
        .unwrap();
    let (action, out) = h.run(&v6).unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    assert_eq!(out[54], 129, "echo reply type");
    assert_eq!(out[22..38], d.octets());
    assert_eq!(out[38..54], s.octets());
    assert_eq!(icmpv6_sum(&out), 0xffff, "ICMPv6 checksum invalid");
}

/// One's-complement sum of an IPv6 frame's ICMPv6 message with its pseudo-header.
fn icmpv6_sum(frame: &[u8]) -> u16 {
    let body = &frame[54..];
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&frame[22..54]);
    pseudo.extend_from_slice(&(body.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(body);
    ones_complement_sum(&pseudo)
}

/// A router's ICMP error about the packet `vip:80 -> client:sport` (a backend's reply was too
/// big): fragmentation-needed for IPv4, packet-too-big for IPv6, quoting the offending
/// packet's headers and the first 8 bytes after them.
fn icmp_error_about(client: IpAddr, sport: u16, vip: IpAddr) -> Vec<u8> {
    let mut quoted = Vec::new();
    let mut frame = Vec::new();
    match (client, vip) {
        (IpAddr::V4(c), IpAddr::V4(v)) => {
            PacketBuilder::ipv4(v.octets(), c.octets(), 63)
                .tcp(80, sport, 1, 100)
                .write(&mut quoted, &[0u8; 100])
                .unwrap();
            PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
                .ipv4([192, 0, 2, 254], v.octets(), 64)
                .icmpv4_raw(3, 4, [0, 0, 0x05, 0xdc])
                .write(&mut frame, &quoted[..28])
                .unwrap();
        }
        (IpAddr::V6(c), IpAddr::V6(v)) => {
            PacketBuilder::ipv6(v.octets(), c.octets(), 63)
                .tcp(80, sport, 1, 100)
                .write(&mut quoted, &[0u8; 40])
                .unwrap();
            let router = [
                0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xfe,
            ];
            PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
                .ipv6(router, v.octets(), 64)
                .icmpv6_raw(2, 0, 1400u32.to_be_bytes())
                .write(&mut frame, &quoted[..48])
                .unwrap();
        }
        _ => panic!("{client} and {vip} are of different families"),
    }
    frame
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn icmp_errors_about_a_vip_flow_reach_its_backend() {
    let mut h = harness();
    // (VIP, its address, client, client port, whether the flow is in the connection table
    // first; if not, the Maglev table decides)
    let cases = [
        ("ipip4", "10.111.1.2", "10.9.0.20", 43210, true),
        ("l2dsr6", "fd00:111:1::1", "2001:db8::20", 43210, false),
        // Encapsulated like the flow's own packets: the outer source's entropy comes from
        // the quoted client's whole address (both of its 32-bit ends) and port.
        ("ipip6", "fd00:111:1::2", "2001:db8::21:7", 43211, true),
    ];
    for (name, vip, client, sport, tracked) in cases {
        let (vip, client) = (ip(vip), ip(client));
        if tracked {
            h.run(&tcp_frame(client, sport, vip, 80, true, b""))
                .unwrap();
        }
        let backend = h.table_backend(name, client, sport).unwrap();
        let frame = icmp_error_about(client, sport, vip);
        let before = counter(&h, Counter::IcmpErrorForwarded);
        let (action, out) = h.run(&frame).unwrap();
        assert_eq!(action_name(action), "XDP_TX", "{name}");
        assert_eq!(
            counter(&h, Counter::IcmpErrorForwarded),
            before + 1,
            "{name}"
        );
        let want = if name.starts_with("l2dsr") {
            expect_l2dsr(&frame, backend)
        } else {
            expect_encap(&frame, 14, client, sport, encap(backend, None))
        };
        assert_eq!(
            out, want,
            "the error about {name}'s flow from {client}:{sport}"
        );
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn oversize_packets_get_fragmentation_needed_or_packet_too_big() {
    let mut h = Harness::with_settings(&fixture(), |s| s.mtu = 1400).unwrap();
    // IPv4: 1390-byte IP packet + 20 bytes IPIP > 1400.
    let client = ip("10.9.0.30");
    let frame = tcp_frame(
        client,
        1111,
        ip("10.111.1.2"),
        80,
        false,
        &vec![7u8; 1390 - 40],
    );
    let before = counter(&h, Counter::IcmpTooBigSent);
    let (action, out) = h.run(&frame).unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    assert_eq!(counter(&h, Counter::IcmpTooBigSent), before + 1);
    assert_eq!(
        out.len(),
        14 + 20 + 8 + 28,
        "IP header + ICMP + quote of 28 bytes"
    );
    assert_eq!(out[0..6], CLIENT_MAC);
    assert_eq!(out[6..12], LB_MAC);
    assert_eq!(out[14], 0x45);
    assert_eq!(out[23], 1, "protocol ICMP");
    assert_eq!(out[26..30], [10, 111, 1, 2], "from the VIP");
    assert_eq!(out[30..34], [10, 9, 0, 30], "to the client");
    assert_eq!(
        ones_complement_sum(&out[14..34]),
        0xffff,
        "IPv4 checksum invalid"
    );
    assert_eq!((out[34], out[35]), (3, 4), "type 3 code 4");
    assert_eq!(
        u16::from_be_bytes([out[40], out[41]]),
        1380,
        "next-hop MTU = 1400 - 20"
    );
    assert_eq!(
        ones_complement_sum(&out[34..]),
        0xffff,
        "ICMP checksum invalid"
    );
    assert_eq!(
        out[42..70],
        frame[14..42],
        "quote = original IP header + 8 bytes"
    );
    // A packet that fits is forwarded.
    let fits = tcp_frame(
        client,
        1111,
        ip("10.111.1.2"),
        80,
        false,
        &vec![7u8; 1380 - 40],
    );
    assert_eq!(action_name(h.run(&fits).unwrap().0), "XDP_TX");
    assert_eq!(h.run(&fits).unwrap().1.len(), fits.len() + 20);

    // IPv6 GUE: 1400-byte packet + 48 > 1400; advertised 1352.
    let client6 = ip("2001:db8::30");
    let frame = udp_frame(
        client6,
        2222,
        ip("fd00:111:1::3"),
        443,
        &vec![1u8; 1400 - 48],
    );
    let (action, out) = h.run(&frame).unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    assert_eq!(out.len(), 14 + 40 + 8 + 48);
    assert_eq!(out[20], 58, "next header ICMPv6");
    assert_eq!(out[54], 2, "packet too big");
    assert_eq!(
        u32::from_be_bytes([out[58], out[59], out[60], out[61]]),
        1352
    );
    assert_eq!(icmpv6_sum(&out), 0xffff, "ICMPv6 checksum invalid");
    assert_eq!(
        out[62..110],
        frame[14..62],
        "quote = original IPv6 header + 8 bytes"
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn a_syn_on_a_reused_port_is_a_new_connection() {
    let mut h = harness();
    let client = ip("10.9.4.4");
    let vip = ip("10.111.1.1");
    let sport = 8080;
    let first = h.table_backend("l2dsr4", client, sport).unwrap();
    h.run(&tcp_frame(client, sport, vip, 80, true, b""))
        .unwrap();
    h.run(&tcp_frame(client, sport, vip, 80, false, b"data"))
        .unwrap();
    // Drain the backend; the old connection's packets still reach it...
    h.reconfigure(&l2dsr4_with(first, Some(0))).unwrap();
    let (_, out) = h
        .run(&tcp_frame(client, sport, vip, 80, false, b"more"))
        .unwrap();
    assert_eq!(out[0..6], backend_mac(first));
    // ...but a new connection from the same port is chosen from the table, and its later
    // packets follow it.
    let now = h.table_backend("l2dsr4", client, sport).unwrap();
    let (_, out) = h
        .run(&tcp_frame(client, sport, vip, 80, true, b""))
        .unwrap();
    assert_eq!(
        out[0..6],
        backend_mac(now),
        "SYN on a reused port went to the drained backend"
    );
    let (_, out) = h
        .run(&tcp_frame(client, sport, vip, 80, false, b"data"))
        .unwrap();
    assert_eq!(out[0..6], backend_mac(now));
}

mod decap {
    use super::*;
    use aya::programs::{TestRun, TestRunOptions};
    use balancer::dataplane::decap::Decapsulator;

    fn run(d: &mut Decapsulator, frame: &[u8]) -> (u32, Vec<u8>) {
        let mut out = vec![0u8; 4096];
        let r = d
            .program()
            .unwrap()
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                repeat: 1,
                ..TestRunOptions::default()
            })
            .unwrap();
        out.truncate(r.data_size_out as usize);
        (r.return_value, out)
    }

    #[test]
    #[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
    fn strips_ipip_and_gue_for_local_addresses_only() {
        let local = [ip("10.111.0.11"), ip("fd00:111::11")];
        let mut d = Decapsulator::load(&local, Some(6080), &[]).unwrap();
        let client = ip("10.9.0.1");
        let inner4 = tcp_frame(client, 1234, ip("10.111.1.2"), 80, false, b"inner");
        let inner6 = tcp_frame(
            ip("2001:db8::1"),
            1234,
            ip("fd00:111:1::2"),
            80,
            false,
            b"inner6",
        );
        for (inner, backend, gue) in [
            (&inner4, ip("10.111.0.11"), None),
            (&inner4, ip("10.111.0.11"), Some(6080)),
            (&inner6, ip("fd00:111::11"), None),
            (&inner6, ip("fd00:111::11"), Some(6080)),
            // Mixed: IPv6 inside IPv4.
            (&inner6, ip("10.111.0.11"), None),
        ] {
            let source = if backend.is_ipv4() {
                ip("10.111.0.2")
            } else {
                ip("fd00:111::2")
            };
            let mut wrapped = expect_encap(
                inner,
                14,
                client,
                1234,
                Encap {
                    backend,
                    source,
                    entropy_mask: 0,
                    gue_port: gue,
                },
            );
            // As the backend receives it: from the balancer's MAC to its own.
            wrapped[0..6].copy_from_slice(&backend_mac(backend));
            let (action, out) = run(&mut d, &wrapped);
            assert_eq!(action_name(action), "XDP_PASS");
            assert_eq!(
                out[14..],
                inner[14..],
                "inner packet to {backend} (gue {gue:?}) not restored"
            );
            assert_eq!(out[12..14], inner[12..14], "ether type of the inner packet");
            assert_eq!(out[0..12], wrapped[0..12], "Ethernet addresses kept");
        }
        // Not ours: another address, another UDP port, plain traffic — untouched.
        let foreign = expect_encap(
            &inner4,
            14,
            client,
            1234,
            Encap {
                backend: ip("10.111.0.99"),
                source: ip("10.111.0.2"),
                entropy_mask: 0,
                gue_port: None,
            },
        );
        let other_port = expect_encap(
            &inner4,
            14,
            client,
            1234,
            Encap {
                backend: ip("10.111.0.11"),
                source: ip("10.111.0.2"),
                entropy_mask: 0,
                gue_port: Some(9999),
            },
        );
        for frame in [foreign, other_port, inner4.clone()] {
            let (action, out) = run(&mut d, &frame);
            assert_eq!(action_name(action), "XDP_PASS");
            assert_eq!(out, frame, "a packet not for the decapsulator changed");
        }
        let stats = d.stats().unwrap();
        assert_eq!((stats.ipip, stats.gue, stats.foreign), (3, 2, 1));
    }

    /// `balancer decap --allow`: a tunnelled packet for this host from an outer source not
    /// allowed is dropped (and counted), one from an allowed source stripped as before; traffic
    /// that is not tunnelled, or not for this host, is left alone whatever its source.
    #[test]
    #[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
    fn drops_tunnelled_packets_from_outer_sources_not_allowed() {
        let local = [ip("10.111.0.11"), ip("fd00:111::11")];
        let allowed: Vec<balancer::base::net::Prefix> = ["10.111.0.0/30", "fd00:111::2"]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
        let mut d = Decapsulator::load(&local, Some(6080), &allowed).unwrap();
        let client = ip("10.9.0.1");
        let inner4 = tcp_frame(client, 1234, ip("10.111.1.2"), 80, false, b"inner");
        let wrap = |backend: IpAddr, source: IpAddr, gue_port: Option<u16>| {
            let mut w = expect_encap(
                &inner4,
                14,
                client,
                1234,
                Encap {
                    backend,
                    source,
                    entropy_mask: 0,
                    gue_port,
                },
            );
            w[0..6].copy_from_slice(&backend_mac(backend));
            w
        };
        // (outer destination, outer source, GUE port, what happens)
        let cases = [
            (ip("10.111.0.11"), ip("10.111.0.2"), None, "XDP_PASS", true),
            (
                ip("10.111.0.11"),
                ip("10.111.0.3"),
                Some(6080),
                "XDP_PASS",
                true,
            ),
            (
                ip("fd00:111::11"),
                ip("fd00:111::2"),
                None,
                "XDP_PASS",
                true,
            ),
            (
                ip("10.111.0.11"),
                ip("10.111.0.66"),
                None,
                "XDP_DROP",
                false,
            ),
            (
                ip("10.111.0.11"),
                ip("10.9.0.1"),
                Some(6080),
                "XDP_DROP",
                false,
            ),
            (
                ip("fd00:111::11"),
                ip("fd00:111::3"),
                None,
                "XDP_DROP",
                false,
            ),
            // Not for this host: left alone, whatever its source.
            (
                ip("10.111.0.99"),
                ip("10.111.0.66"),
                None,
                "XDP_PASS",
                false,
            ),
        ];
        for (backend, source, gue, want, stripped) in cases {
            let frame = wrap(backend, source, gue);
            let (action, out) = run(&mut d, &frame);
            let what = format!("to {backend} from {source} (gue {gue:?})");
            assert_eq!(action_name(action), want, "{what}");
            if want == "XDP_PASS" {
                if stripped {
                    assert_eq!(out[14..], inner4[14..], "{what}: not stripped");
                } else {
                    assert_eq!(out, frame, "{what}: changed");
                }
            }
        }
        // Plain traffic from anywhere is not the decapsulator's business.
        let (action, out) = run(&mut d, &inner4);
        assert_eq!((action_name(action), out), ("XDP_PASS", inner4.clone()));
        let s = d.stats().unwrap();
        assert_eq!((s.ipip, s.gue, s.refused, s.foreign), (2, 1, 3, 1));
    }
}

/// `frame` with its Ethernet addresses replaced: to `dst`, from `src`.
fn with_macs(mut frame: Vec<u8>, dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn nat_rewrites_the_destination_and_the_replies_source() {
    let mut h = harness();
    // Expected frames are built whole by etherparse (checksums computed afresh), not patched.
    for (client, vip, name, backends) in [
        (
            "10.9.0.1",
            "10.111.1.5",
            "nat4",
            ["10.111.0.21", "10.111.0.22"],
        ),
        (
            "2001:db8::5",
            "fd00:111:1::5",
            "nat6",
            ["fd00:111::21", "fd00:111::22"],
        ),
    ] {
        let sports = [1000, 40000, 65535];
        tcp_both_ways(&mut h, name, ip(client), ip(vip), &backends, None, &sports);
    }

    // UDP over IPv4, with a checksum and without one (zero stays zero).
    udp_both_ways(
        &mut h,
        ip("10.9.0.7"),
        ip("10.111.1.5"),
        ip("10.111.0.23"),
        None,
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn nat_on_two_links_sends_each_way_out_of_the_other_link() {
    use balancer::dataplane::Dataplane as _;
    use balancer_common::maps::NatLinks;
    // `BPF_PROG_TEST_RUN` runs every frame as if it came in on `lo` (index 1): it plays the
    // clients' link, then the backends'. Index 7777 is the other link (the test run only
    // returns the verdict; nothing is sent).
    const LO: u32 = 1;
    const OTHER: u32 = 7777;
    const CLIENT_LINK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xc1, 0x01];
    const BACKEND_LINK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xb1, 0x01];
    let links = |client_ifindex, backend_ifindex| NatLinks {
        client_ifindex,
        backend_ifindex,
        client_mac: CLIENT_LINK_MAC,
        backend_mac: BACKEND_LINK_MAC,
    };
    let mut h = harness();
    for (client, vip, name, source) in [
        ("10.9.0.1", "10.111.1.5", "nat4", None),
        ("2001:db8::5", "fd00:111:1::5", "nat6", None),
        ("10.9.0.1", "10.111.1.6", "snat4", Some(ip("10.111.0.2"))),
    ] {
        let (client, vip, sport) = (ip(client), ip(vip), 4321);
        let backend = h.table_backend(name, client, sport).unwrap();
        // A client's packet, in on the clients' link: out on the backends', from its MAC.
        h.balancer.set_nat_links(&links(LO, OTHER)).unwrap();
        let frame = tcp_frame(client, sport, vip, 80, true, b"");
        let (action, out) = h.run(&frame).unwrap();
        assert_eq!(
            action_name(action),
            "XDP_REDIRECT",
            "{name}: to the backend"
        );
        let from = match source {
            Some(s) => (s, source_port(&out)),
            None => (client, sport),
        };
        let want = with_macs(
            tcp_frame(from.0, from.1, backend, 80, true, b""),
            backend_mac(backend),
            BACKEND_LINK_MAC,
        );
        assert_eq!(out, want, "{name}: client to backend");
        // Its reply, in on the backends' link: out on the clients', from its MAC.
        h.balancer.set_nat_links(&links(OTHER, LO)).unwrap();
        let reply = with_macs(
            tcp_frame(backend, 80, from.0, from.1, false, b"ok"),
            BACKEND_LINK_MAC,
            backend_mac(backend),
        );
        let (action, out) = h.run(&reply).unwrap();
        assert_eq!(action_name(action), "XDP_REDIRECT", "{name}: to the client");
        let want = with_macs(
            tcp_frame(vip, 80, client, sport, false, b"ok"),
            CLIENT_MAC,
            CLIENT_LINK_MAC,
        );
        assert_eq!(out, want, "{name}: reply to client");
        // A reply that came in on the clients' link already goes back out there (XDP_TX).
        h.balancer.set_nat_links(&links(LO, OTHER)).unwrap();
        let (action, out) = h.run(&reply).unwrap();
        assert_eq!(
            action_name(action),
            "XDP_TX",
            "{name}: reply on the clients' link"
        );
        assert_eq!(out, with_macs(want, CLIENT_MAC, BACKEND_LINK_MAC));
    }
    let sent = h.balancer.dataplane().nat_link_stats().unwrap();
    assert_eq!((sent.to_backends, sent.to_clients), (3, 3));
    // Not NAT: a DSR VIP's packet stays on its link whatever the NAT links are.
    let frame = tcp_frame(ip("10.9.0.1"), 1000, ip("10.111.1.1"), 80, true, b"");
    let (action, _) = h.run(&frame).unwrap();
    assert_eq!(action_name(action), "XDP_TX", "l2dsr4");
}

/// The source port of a frame's TCP or UDP header (no VLAN tags).
fn source_port(frame: &[u8]) -> u16 {
    let l4 = if frame[12..14] == [0x08, 0x00] {
        34
    } else {
        54
    };
    u16::from_be_bytes([frame[l4], frame[l4 + 1]])
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn source_nat_rewrites_both_addresses_and_a_port_and_replies_find_their_client() {
    let mut h = harness();
    // snat4: from the interface's address; snat6: from the configured IPv6 source.
    for (client, vip, name, source, backends) in [
        (
            "10.9.0.1",
            "10.111.1.6",
            "snat4",
            "10.111.0.2",
            &["10.111.0.24", "10.111.0.25"][..],
        ),
        (
            "2001:db8::5",
            "fd00:111:1::6",
            "snat6",
            "fd00:111::3",
            &["fd00:111::24"][..],
        ),
    ] {
        let sports = [1000, 40000, 65535, 1001, 1002];
        let source = Some(ip(source));
        tcp_both_ways(&mut h, name, ip(client), ip(vip), backends, source, &sports);
    }

    // UDP, with a checksum and without one (zero stays zero).
    udp_both_ways(
        &mut h,
        ip("10.9.0.7"),
        ip("10.111.1.6"),
        ip("10.111.0.26"),
        Some(ip("10.111.0.2")),
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn source_nat_ports_run_out_counted_and_come_back_when_flows_expire() {
    // Four ports for the one backend of snatdns4.
    let mut config = packet_fixture();
    config.nat.ports = Some("20000-20003".into());
    let mut h = Harness::new(&to_toml(&config)).unwrap();
    let (vip, backend) = (ip("10.111.1.6"), ip("10.111.0.26"));
    let send = |h: &mut Harness, sport: u16| {
        let (action, out) = h
            .run(&udp_frame(ip("10.9.0.8"), sport, vip, 53, b"q"))
            .unwrap();
        (action_name(action), source_port(&out))
    };
    let mut ports = std::collections::BTreeSet::new();
    let mut first = 0;
    for sport in 1..=4 {
        let (action, port) = send(&mut h, sport);
        assert_eq!(action, "XDP_TX");
        ports.insert(port);
        if sport == 1 {
            first = port;
        }
    }
    assert_eq!(ports, (20000..=20003).collect(), "four flows, four ports");
    // A fifth flow finds no port: dropped and counted, the four keep theirs.
    assert_eq!(send(&mut h, 5).0, "XDP_DROP");
    assert_eq!(send(&mut h, 6).0, "XDP_DROP");
    let now = balancer::dataplane::nat_expiry::now_ticks();
    let swept = h.sweep_nat(now).unwrap();
    assert_eq!((swept.flows, swept.expired), (4, 0));
    assert_eq!((swept.stats.no_port, swept.stats.table_full), (2, 0));
    assert_eq!(
        send(&mut h, 1),
        ("XDP_TX", first),
        "a live flow keeps its port"
    );
    // Past the UDP timeout (120 s = 112 ticks) the flows give their ports back.
    let swept = h.sweep_nat(now + 200).unwrap();
    assert_eq!((swept.flows, swept.expired), (0, 4));
    let reply = with_macs(
        udp_frame(backend, 53, ip("10.111.0.2"), 20000, b"late"),
        LB_MAC,
        backend_mac(backend),
    );
    let (action, _) = h.run(&reply).unwrap();
    assert_eq!(
        action_name(action),
        "XDP_PASS",
        "an expired flow's port is the host's again"
    );
    let (action, port) = send(&mut h, 5);
    assert_eq!(action, "XDP_TX", "a new flow finds a port again");
    assert!(ports.contains(&port));
}

/// One client address holds at most `nat.client_ports` source-NAT ports: its further new
/// flows are dropped and counted while other clients' go on, and a sweep writes the true
/// counts back, so ports given back make room again.
#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn one_client_address_holds_at_most_its_quota_of_source_nat_ports() {
    let mut config = packet_fixture();
    config.nat.client_ports = Some(3);
    let mut h = Harness::new(&to_toml(&config)).unwrap();
    let vip = ip("10.111.1.6");
    let send = |h: &mut Harness, client: &str, sport: u16| {
        let (action, _) = h.run(&udp_frame(ip(client), sport, vip, 53, b"q")).unwrap();
        action_name(action)
    };
    for sport in 1..=3 {
        assert_eq!(send(&mut h, "10.9.0.8", sport), "XDP_TX", "flow {sport}");
    }
    // Over the quota: new flows dropped; the client's live flows and others' new ones go on.
    assert_eq!(send(&mut h, "10.9.0.8", 4), "XDP_DROP");
    assert_eq!(send(&mut h, "10.9.0.8", 5), "XDP_DROP");
    assert_eq!(send(&mut h, "10.9.0.8", 2), "XDP_TX", "a live flow");
    assert_eq!(send(&mut h, "10.9.0.9", 4), "XDP_TX", "another client");
    let now = balancer::dataplane::nat_expiry::now_ticks();
    let swept = h.sweep_nat(now).unwrap();
    assert_eq!((swept.flows, swept.stats.client_quota), (4, 2));
    assert_eq!(
        (swept.stats.no_port, swept.stats.table_full),
        (0, 0),
        "counted as the quota's"
    );
    // The sweep's counts (the same as the program's) keep the quota.
    assert_eq!(send(&mut h, "10.9.0.8", 6), "XDP_DROP");
    // Past the UDP timeout the ports come back, and with them the client's room.
    let swept = h.sweep_nat(now + 200).unwrap();
    assert_eq!((swept.flows, swept.expired), (0, 4));
    for sport in 7..=9 {
        assert_eq!(send(&mut h, "10.9.0.8", sport), "XDP_TX", "flow {sport}");
    }
    assert_eq!(send(&mut h, "10.9.0.8", 10), "XDP_DROP");
}

/// Source NAT takes a port only for a SYN: a TCP segment of a flow the balancer never saw (a
/// spoofed one, or a connection another balancer served) is answered with a RST at its
/// acknowledgement and takes no port; a SYN's port is embryonic — the closed flows' timeout —
/// until the client's ACK, then the idle timeout.
#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn source_nat_takes_a_port_only_for_a_syn_and_frees_a_handshake_never_completed() {
    let mut h = harness();
    let (client, vip) = (ip("10.9.0.1"), ip("10.111.1.6"));
    // Spoofed segments with ACK, from 200 client ports: RSTs, and no port taken.
    for sport in 3000..3200 {
        let frame = tcp_frame(client, sport, vip, 80, false, b"data");
        let (action, out) = h.run(&frame).unwrap();
        assert_eq!(action_name(action), "XDP_TX", "sport {sport}");
        let reset = etherparse::SlicedPacket::from_ethernet(&out).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ipv4)) = &reset.net else {
            panic!("not IPv4: {out:?}");
        };
        assert_eq!(
            (
                IpAddr::from(ipv4.header().source()),
                IpAddr::from(ipv4.header().destination())
            ),
            (vip, client)
        );
        let Some(etherparse::TransportSlice::Tcp(tcp)) = &reset.transport else {
            panic!("not TCP: {out:?}");
        };
        assert!(
            tcp.rst() && !tcp.ack() && !tcp.syn(),
            "sport {sport}: {tcp:?}"
        );
        assert_eq!(
            (
                tcp.sequence_number(),
                tcp.source_port(),
                tcp.destination_port()
            ),
            (1, 80, sport),
            "a RST at the segment's acknowledgement"
        );
    }
    let now = balancer::dataplane::nat_expiry::now_ticks();
    let swept = h.sweep_nat(now).unwrap();
    assert_eq!(swept.flows, 0, "a segment without SYN took a port");
    assert_eq!(swept.stats.not_syn, 200, "each refused segment counted");
    // Two SYNs take a port each; one handshake completes.
    for sport in [4000, 4001] {
        let (action, _) = h
            .run(&tcp_frame(client, sport, vip, 80, true, b""))
            .unwrap();
        assert_eq!(action_name(action), "XDP_TX");
    }
    let (action, _) = h
        .run(&tcp_frame(client, 4001, vip, 80, false, b""))
        .unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    assert_eq!(h.sweep_nat(now).unwrap().flows, 2);
    // Past the closed flows' timeout (30 s) and within the idle one (900 s): the flow
    // without its ACK gives its port back, the established one keeps it.
    let swept = h.sweep_nat(now + 100).unwrap();
    assert_eq!((swept.flows, swept.expired), (1, 1));
    let (action, _) = h
        .run(&tcp_frame(client, 4001, vip, 80, false, b"more"))
        .unwrap();
    assert_eq!(
        action_name(action),
        "XDP_TX",
        "the established flow goes on"
    );
}

/// A TCP (`udp` false) or UDP packet as an ICMP error quotes it, whole (checksums computed).
fn quoted(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, udp: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let b = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 61),
        (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 61),
        _ => unreachable!("one family"),
    };
    if udp {
        b.udp(sport, dport).write(&mut out, b"quoted").unwrap();
    } else {
        b.tcp(sport, dport, 7, 1000).write(&mut out, &[]).unwrap();
    }
    out
}

/// An ICMP error frame (destination unreachable of `code`, or IPv6 packet too big when
/// `code` is `None`) from `src` to `dst` quoting `quote`.
fn icmp_error(
    macs: ([u8; 6], [u8; 6]),
    src: IpAddr,
    dst: IpAddr,
    code: Option<u8>,
    quote: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    let eth = PacketBuilder::ethernet2(macs.1, macs.0);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .icmpv4_raw(3, code.unwrap_or(4), [0, 0, 5, 0xdc])
            .write(&mut out, quote)
            .unwrap(),
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let (kind, code, rest) = match code {
                Some(c) => (1, c, [0; 4]),
                None => (2, 0, 1400u32.to_be_bytes()),
            };
            eth.ipv6(s.octets(), d.octets(), 64)
                .icmpv6_raw(kind, code, rest)
                .write(&mut out, quote)
                .unwrap()
        }
        _ => unreachable!("one family"),
    }
    out
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn icmp_errors_about_nat_flows_are_translated_like_the_flows() {
    let mut h = harness();
    let from_client = (LB_MAC, CLIENT_MAC);
    let to_backend = |b: IpAddr| (backend_mac(b), LB_MAC);
    let from_backend = |b: IpAddr| (LB_MAC, backend_mac(b));
    let to_client = (CLIENT_MAC, LB_MAC);
    let first_port = |h: &mut Harness, frame: Vec<u8>| {
        let (action, out) = h.run(&frame).unwrap();
        assert_eq!(action_name(action), "XDP_TX");
        let l4 = if out[12..14] == [0x08, 0x00] { 34 } else { 54 };
        u16::from_be_bytes([out[l4], out[l4 + 1]])
    };
    let check = |h: &mut Harness, what: &str, input: Vec<u8>, want: Vec<u8>| {
        let (action, out) = h.run(&input).unwrap();
        assert_eq!(action_name(action), "XDP_TX", "{what}");
        assert_eq!(out, want, "{what}");
    };

    // Errors about replies, from a router on the clients' side to the VIP: to the backend,
    // quoting what the backend sent.
    let (client, vip) = (ip("10.9.0.40"), ip("10.111.1.5"));
    first_port(&mut h, tcp_frame(client, 4000, vip, 80, true, b""));
    let backend = h.table_backend("nat4", client, 4000).unwrap();
    let router = ip("192.0.2.1");
    check(
        &mut h,
        "gateway NAT, IPv4 fragmentation needed",
        icmp_error(
            from_client,
            router,
            vip,
            None,
            &quoted(vip, 80, client, 4000, false),
        ),
        icmp_error(
            to_backend(backend),
            router,
            backend,
            None,
            &quoted(backend, 80, client, 4000, false),
        ),
    );
    let (client, vip, source) = (ip("2001:db8::40"), ip("fd00:111:1::6"), ip("fd00:111::3"));
    let port = first_port(&mut h, tcp_frame(client, 4001, vip, 80, true, b""));
    let backend = ip("fd00:111::24");
    let router = ip("2001:db8::1");
    check(
        &mut h,
        "source NAT, IPv6 packet too big",
        icmp_error(
            from_client,
            router,
            vip,
            None,
            &quoted(vip, 80, client, 4001, false),
        ),
        icmp_error(
            to_backend(backend),
            router,
            backend,
            None,
            &quoted(backend, 80, source, port, false),
        ),
    );

    // Errors about a client's packets, from the backend (port unreachable) to the client or
    // the NAT source: to the client, from the VIP, quoting what the client sent.
    let (client, vip, backend) = (ip("10.9.0.41"), ip("10.111.1.5"), ip("10.111.0.23"));
    first_port(&mut h, udp_frame(client, 5000, vip, 53, b"q"));
    check(
        &mut h,
        "gateway NAT, IPv4 port unreachable",
        icmp_error(
            from_backend(backend),
            backend,
            client,
            Some(3),
            &quoted(client, 5000, backend, 53, true),
        ),
        icmp_error(
            to_client,
            vip,
            client,
            Some(3),
            &quoted(client, 5000, vip, 53, true),
        ),
    );
    let (client, vip, backend, source) = (
        ip("10.9.0.42"),
        ip("10.111.1.6"),
        ip("10.111.0.26"),
        ip("10.111.0.2"),
    );
    let port = first_port(&mut h, udp_frame(client, 5001, vip, 53, b"q"));
    check(
        &mut h,
        "source NAT, IPv4 port unreachable",
        icmp_error(
            from_backend(backend),
            backend,
            source,
            Some(3),
            &quoted(source, port, backend, 53, true),
        ),
        icmp_error(
            to_client,
            vip,
            client,
            Some(3),
            &quoted(client, 5001, vip, 53, true),
        ),
    );
    // From a router between us and the backend: its address stays the source.
    let (client, vip, backend, source) = (
        ip("2001:db8::42"),
        ip("fd00:111:1::6"),
        ip("fd00:111::24"),
        ip("fd00:111::3"),
    );
    let port = first_port(&mut h, tcp_frame(client, 5002, vip, 80, true, b""));
    let router = ip("fd00:111::99");
    check(
        &mut h,
        "source NAT, IPv6 unreachable from a router",
        icmp_error(
            from_backend(backend),
            router,
            source,
            Some(0),
            &quoted(source, port, backend, 80, false),
        ),
        icmp_error(
            to_client,
            router,
            client,
            Some(0),
            &quoted(client, 5002, vip, 80, false),
        ),
    );

    // An error quoting no NAT flow is the host's: untouched.
    let stray = icmp_error(
        from_backend(backend),
        backend,
        source,
        Some(4),
        &quoted(source, 999, backend, 80, false),
    );
    let (action, out) = h.run(&stray).unwrap();
    assert_eq!((action_name(action), out), ("XDP_PASS", stray));
}

/// A UDP flow from `client` port 5353 to `vip` port 53 by NAT to `backend` (from `source` and a
/// port of its choosing with source NAT), its answer back, and a datagram without a checksum
/// (zero stays zero); expected frames built whole by etherparse.
fn udp_both_ways(
    h: &mut Harness,
    client: IpAddr,
    vip: IpAddr,
    backend: IpAddr,
    source: Option<IpAddr>,
) {
    let (action, out) = h.run(&udp_frame(client, 5353, vip, 53, b"query")).unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    let (from, port) = match source {
        Some(s) => (s, source_port(&out)),
        None => (client, 5353),
    };
    let want = with_macs(
        udp_frame(from, port, backend, 53, b"query"),
        backend_mac(backend),
        LB_MAC,
    );
    assert_eq!(out, want, "UDP client to backend");
    let answer = with_macs(
        udp_frame(backend, 53, from, port, b"answer"),
        LB_MAC,
        backend_mac(backend),
    );
    let (action, out) = h.run(&answer).unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    let want = with_macs(
        udp_frame(vip, 53, client, 5353, b"answer"),
        CLIENT_MAC,
        LB_MAC,
    );
    assert_eq!(out, want, "UDP reply to client");
    let no_sum = |mut f: Vec<u8>| {
        f[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
        f
    };
    let (action, out) = h
        .run(&no_sum(udp_frame(client, 5354, vip, 53, b"q")))
        .unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    let (from, port) = match source {
        Some(s) => (s, source_port(&out)),
        None => (client, 5354),
    };
    let want = no_sum(with_macs(
        udp_frame(from, port, backend, 53, b"q"),
        backend_mac(backend),
        LB_MAC,
    ));
    assert_eq!(out, want, "UDP without a checksum keeps none");
}

/// TCP flows from `client` ports `sports` to `vip` port 80 by NAT (from `source` and a port of
/// the program's choosing with source NAT): a SYN and a request each, checked against frames
/// built whole by etherparse (checksums computed afresh, not patched), then the backend's
/// reply back to the client; with source NAT each flow keeps its port, within `nat.ports`, and
/// no two live flows to one backend share one. A packet from a backend that no NAT flow
/// expects passes untouched.
fn tcp_both_ways(
    h: &mut Harness,
    name: &str,
    client: IpAddr,
    vip: IpAddr,
    backends: &[&str],
    source: Option<IpAddr>,
    sports: &[u16],
) {
    let mut taken = std::collections::HashMap::new();
    for &sport in sports {
        let backend = h.table_backend(name, client, sport).unwrap();
        assert!(backends.contains(&backend.to_string().as_str()));
        let mut port = None;
        for (syn, payload) in [(true, &b""[..]), (false, &b"GET / HTTP/1.1\r\n\r\n"[..])] {
            let frame = tcp_frame(client, sport, vip, 80, syn, payload);
            let (action, out) = h.run(&frame).unwrap();
            assert_eq!(action_name(action), "XDP_TX", "{name} sport {sport}");
            let from = match source {
                Some(s) => {
                    let p = source_port(&out);
                    assert!((1024..=32767).contains(&p), "{name}: port {p} in nat.ports");
                    assert_eq!(*port.get_or_insert(p), p, "{name}: a flow keeps its port");
                    (s, p)
                }
                None => (client, sport),
            };
            let want = with_macs(
                tcp_frame(from.0, from.1, backend, 80, syn, payload),
                backend_mac(backend),
                LB_MAC,
            );
            assert_eq!(out, want, "{name} sport {sport}: client to backend");
        }
        // The backend's reply, to the client (via us, its gateway) or to the NAT source.
        let to = match (source, port) {
            (Some(s), Some(port)) => {
                assert_eq!(
                    taken.insert((backend, port), sport),
                    None,
                    "{name}: port {port} twice"
                );
                (s, port)
            }
            _ => (client, sport),
        };
        let reply = with_macs(
            tcp_frame(backend, 80, to.0, to.1, false, b"HTTP/1.1 200 OK\r\n"),
            LB_MAC,
            backend_mac(backend),
        );
        let (action, out) = h.run(&reply).unwrap();
        assert_eq!(
            action_name(action),
            "XDP_TX",
            "{name} reply to port {}",
            to.1
        );
        let want = with_macs(
            tcp_frame(vip, 80, client, sport, false, b"HTTP/1.1 200 OK\r\n"),
            CLIENT_MAC,
            LB_MAC,
        );
        assert_eq!(out, want, "{name} sport {sport}: reply to client");
    }
    let stray_to = source.unwrap_or(client);
    let stray = with_macs(
        tcp_frame(ip(backends[0]), 80, stray_to, 999, false, b"x"),
        LB_MAC,
        backend_mac(ip(backends[0])),
    );
    let (action, out) = h.run(&stray).unwrap();
    assert_eq!((action_name(action), out), ("XDP_PASS", stray), "{name}");
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn a_paced_vips_new_flows_count_down_to_its_scrape_and_say_so() {
    // l2dsr4's scrapes paced by its requests (the defaults: 8 per backend, 100 ms to 4 s);
    // ipip4 scraped every 100 ms (not paced): its flows count nothing.
    let mut config = packet_fixture();
    vip_mut(&mut config, "l2dsr4").telemetry = Some(balancer::base::config::RawTelemetry {
        source: Some("scrape".into()),
        port: Some(9000),
        ..Default::default()
    });
    vip_mut(&mut config, "ipip4").telemetry = Some(balancer::base::config::RawTelemetry {
        source: Some("scrape".into()),
        port: Some(9000),
        requests_per_scrape: Some(0),
        ..Default::default()
    });
    let mut h = Harness::new(&to_toml(&config)).expect("loading the balancer");
    let paced = h.balancer.vip("l2dsr4").unwrap().id;
    let fixed = h.balancer.vip("ipip4").unwrap().id;
    let balancer::dataplane::ScrapeDue {
        mut counts,
        mut events,
    } = h
        .balancer
        .take_scrape_due()
        .expect("the program's scrape-due maps");
    assert!(h.balancer.take_scrape_due().is_none(), "handed over once");
    let heard = |events: &mut balancer::dataplane::scrape_due::ScrapeEvents| {
        let mut ids = Vec::new();
        events.drain(|id| ids.push(id));
        ids
    };
    let client = ip("10.9.5.5");
    counts.set(paced, 3).unwrap();
    counts.set(fixed, 1).unwrap();
    let sport = std::cell::Cell::new(2000u16);
    let syn = |h: &mut Harness, vip: &str| {
        sport.set(sport.get() + 1);
        let frame = tcp_frame(client, sport.get(), ip(vip), 80, true, b"");
        let (action, _) = h.run(&frame).unwrap();
        assert_eq!(action_name(action), "XDP_TX");
    };
    // Two new flows of three, and the established flow's later packets: nothing yet.
    syn(&mut h, "10.111.1.1");
    syn(&mut h, "10.111.1.1");
    h.run(&tcp_frame(
        client,
        sport.get(),
        ip("10.111.1.1"),
        80,
        false,
        b"data",
    ))
    .unwrap();
    assert_eq!(heard(&mut events), Vec::<u32>::new());
    // The third: the VIP's id, once.
    syn(&mut h, "10.111.1.1");
    assert_eq!(heard(&mut events), [paced]);
    // The few after it tell again (for CPUs that raced), then no more until the count is set
    // again.
    for _ in 0..10 {
        syn(&mut h, "10.111.1.1");
    }
    let after = heard(&mut events);
    assert_eq!(
        after.len() as i64,
        balancer_common::maps::SCRAPE_DUE_WINDOW - 1,
        "{after:?}"
    );
    assert!(after.iter().all(|id| *id == paced));
    counts.set(paced, 1).unwrap();
    syn(&mut h, "10.111.1.1");
    assert_eq!(heard(&mut events), [paced]);
    // A VIP not paced by its requests counts nothing, whatever its count says.
    syn(&mut h, "10.111.1.2");
    syn(&mut h, "10.111.1.2");
    assert_eq!(heard(&mut events), Vec::<u32>::new());
}
