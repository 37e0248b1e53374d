//! Malformed-input sweep (needs root): over a million generated frames — every truncation of
//! valid frames, corrupted bytes, random header lengths and fragment fields, random IPv6
//! extension chains, garbage — through the XDP program with BPF_PROG_TEST_RUN.
//!
//! Invariants, judged independently of the program's parser:
//! - never `XDP_ABORTED` (the harness fails on it);
//! - a frame not addressed to a VIP address passes, byte for byte unchanged;
//! - `XDP_PASS` never changes a frame;
//! - `XDP_TX` is a well-formed forward: only the MACs changed (L2 DSR), or an outer header with a
//!   valid checksum to a backend in front of the unchanged inner packet (IPIP/GUE), or an echo
//!   reply to the sender.

use std::collections::HashSet;
use std::net::IpAddr;

use balancer_tests::configs::{packet_fixture, to_toml};
use balancer_tests::packet::*;
use etherparse::PacketBuilder;

const FRAMES: usize = 1 << 20;

/// xorshift64*: a fixed, dependency-free generator so every run sweeps the same frames.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Valid frames of every kind the sweep mutates.
fn base_frames() -> Vec<Vec<u8>> {
    let c4 = ip("10.9.0.1");
    let c6 = ip("2001:db8::5");
    let mut frames = vec![
        tcp_frame(
            c4,
            1000,
            ip("10.111.1.1"),
            80,
            true,
            b"GET / HTTP/1.1\r\n\r\n",
        ),
        tcp_frame(c4, 1001, ip("10.111.1.2"), 80, false, &[0x55; 64]),
        tcp_frame(c4, 1002, ip("10.111.1.3"), 80, true, b""),
        udp_frame(c4, 1003, ip("10.111.1.1"), 53, b"query"),
        tcp_frame(c6, 1004, ip("fd00:111:1::1"), 80, true, b"hello"),
        tcp_frame(c6, 1005, ip("fd00:111:1::2"), 80, false, &[0xaa; 32]),
        udp_frame(c6, 1006, ip("fd00:111:1::3"), 443, b"quic"),
        tcp_frame(c4, 1007, ip("10.111.0.2"), 22, false, b"ssh"),
        tcp_frame(c6, 1008, ip("fd00:111::2"), 22, false, b"ssh"),
        with_vlan(&tcp_frame(c4, 1009, ip("10.111.1.2"), 80, true, b"vlan"), 9),
        tcp_frame(c4, 1010, ip("10.111.1.9"), 80, true, b""),
        // NAT: client to VIP, and the backends' replies (one of each pair is the flow's).
        tcp_frame(c4, 1011, ip("10.111.1.5"), 80, true, b"nat"),
        udp_frame(c4, 1012, ip("10.111.1.5"), 53, b"nat query"),
        tcp_frame(c6, 1013, ip("fd00:111:1::5"), 80, false, b"nat6"),
        // Source NAT (their replies: `source_nat_replies`).
        tcp_frame(c4, 1014, ip("10.111.1.6"), 80, true, b"snat"),
        udp_frame(c4, 1015, ip("10.111.1.6"), 53, b"snat query"),
        tcp_frame(c6, 1016, ip("fd00:111:1::6"), 80, true, b"snat"),
    ];
    for (backend, sport, client, dport) in [
        ("10.111.0.21", 80, c4, 1011),
        ("10.111.0.22", 80, c4, 1011),
        ("fd00:111::21", 80, c6, 1013),
        ("fd00:111::22", 80, c6, 1013),
    ] {
        let mut reply = tcp_frame(ip(backend), sport, client, dport, false, b"reply");
        reply[6..12].copy_from_slice(&backend_mac(ip(backend)));
        frames.push(reply);
    }
    let mut answer = udp_frame(ip("10.111.0.23"), 53, c4, 1012, b"nat answer");
    answer[6..12].copy_from_slice(&backend_mac(ip("10.111.0.23")));
    frames.push(answer);
    let mut ping = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv4([10, 9, 0, 1], [10, 111, 1, 1], 64)
        .icmpv4_echo_request(1, 2)
        .write(&mut ping, b"ping")
        .unwrap();
    frames.push(ping);
    let mut quoted = Vec::new();
    PacketBuilder::ipv4([10, 111, 1, 2], [10, 9, 0, 1], 63)
        .tcp(80, 1001, 1, 100)
        .write(&mut quoted, &[])
        .unwrap();
    let mut err = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv4([192, 0, 2, 1], [10, 111, 1, 2], 64)
        .icmpv4_raw(3, 4, [0, 0, 5, 0xdc])
        .write(&mut err, &quoted[..28])
        .unwrap();
    frames.push(err);
    // ICMP errors about NAT flows: a router's about a reply, to the VIP (flow 1011); the
    // backend's port unreachable about a client's query, to the client (flow 1012).
    let mut quoted = Vec::new();
    PacketBuilder::ipv4([10, 111, 1, 5], [10, 9, 0, 1], 63)
        .tcp(80, 1011, 1, 100)
        .write(&mut quoted, &[])
        .unwrap();
    let mut err = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv4([192, 0, 2, 1], [10, 111, 1, 5], 64)
        .icmpv4_raw(3, 4, [0, 0, 5, 0xdc])
        .write(&mut err, &quoted)
        .unwrap();
    frames.push(err);
    let mut quoted = Vec::new();
    PacketBuilder::ipv4([10, 9, 0, 1], [10, 111, 0, 23], 63)
        .udp(1012, 53)
        .write(&mut quoted, b"nat query")
        .unwrap();
    let mut err = Vec::new();
    PacketBuilder::ethernet2(backend_mac(ip("10.111.0.23")), LB_MAC)
        .ipv4([10, 111, 0, 23], [10, 9, 0, 1], 64)
        .icmpv4_raw(3, 3, [0; 4])
        .write(&mut err, &quoted)
        .unwrap();
    frames.push(err);
    frames
}

/// The frame's L3 offset and ether type as an Ethernet parser following the same VLAN rules
/// sees them (outer 802.1Q or 802.1ad, inner 802.1Q).
fn l3_of(f: &[u8]) -> Option<(usize, u16)> {
    let be = |i: usize| u16::from_be_bytes([f[i], f[i + 1]]);
    if f.len() < 14 {
        return None;
    }
    let mut et = be(12);
    let mut l3 = 14;
    if et == 0x8100 || et == 0x88a8 {
        if f.len() < 18 {
            return None;
        }
        et = be(16);
        l3 = 18;
        if et == 0x8100 {
            if f.len() < 22 {
                return None;
            }
            et = be(20);
            l3 = 22;
        }
    }
    Some((l3, et))
}

/// Whether `out` is a TCP RST answering `input` to its sender (admission control refusing a
/// SYN, source NAT refusing a segment of a flow it never saw): Ethernet and IP addresses and
/// ports swapped, a bare 20-byte TCP header with RST set, a valid IP header.
fn is_reset_to_sender(input: &[u8], out: &[u8]) -> bool {
    let (Some((l3, et)), Some((ol3, oet))) = (l3_of(input), l3_of(out)) else {
        return false;
    };
    if out[0..6] != input[6..12] || out[6..12] != input[0..6] || et != oet || l3 != ol3 {
        return false;
    }
    let (ip_len, src, dst) = match et {
        0x0800 => (20, 12..16, 16..20),
        0x86dd => (40, 8..24, 24..40),
        _ => return false,
    };
    // The output has no options or extension headers; the input's TCP header follows its own.
    let l4 = l3 + ip_len;
    let Some(in_l4) = tcp_offset(input, l3, et) else {
        return false;
    };
    if out.len() != l4 + 20 || input.len() < in_l4 + 20 {
        return false;
    }
    let (i, o) = (&input[l3..], &out[l3..]);
    let header_ok = et != 0x0800 || ones_complement_sum(&out[l3..l4]) == 0xffff;
    header_ok
        && o[src.clone()] == i[dst.clone()]
        && o[dst] == i[src]
        && out[l4..l4 + 2] == input[in_l4 + 2..in_l4 + 4]
        && out[l4 + 2..l4 + 4] == input[in_l4..in_l4 + 2]
        && out[l4 + 13] & 0x04 != 0
}

/// Where the TCP header of an IPv4 or IPv6 packet at `l3` starts (IPv4 options, IPv6
/// hop-by-hop, routing, fragment and destination options headers skipped); None if it is not
/// TCP.
fn tcp_offset(f: &[u8], l3: usize, et: u16) -> Option<usize> {
    if et == 0x0800 {
        let ihl = usize::from(*f.get(l3)? & 0x0f) * 4;
        return (*f.get(l3 + 9)? == 6).then_some(l3 + ihl);
    }
    let (mut next, mut at) = (*f.get(l3 + 6)?, l3 + 40);
    for _ in 0..8 {
        match next {
            6 => return Some(at),
            0 | 43 | 60 => {
                let len = (usize::from(*f.get(at + 1)?) + 1) * 8;
                next = *f.get(at)?;
                at += len;
            }
            44 => {
                next = *f.get(at)?;
                at += 8;
            }
            _ => return None,
        }
    }
    None
}

struct Vips {
    v4: HashSet<[u8; 4]>,
    v6: HashSet<[u8; 16]>,
    backend_macs: HashSet<[u8; 6]>,
    backends: HashSet<IpAddr>,
    /// The source-NAT VIPs' source addresses.
    nat_sources: HashSet<IpAddr>,
}

impl Vips {
    fn new() -> Vips {
        let v4 = [
            "10.111.1.1",
            "10.111.1.2",
            "10.111.1.3",
            "10.111.1.5",
            "10.111.1.6",
            "10.111.1.9",
        ]
        .iter()
        .map(|s| s.parse::<std::net::Ipv4Addr>().unwrap().octets())
        .collect();
        let v6 = [
            "fd00:111:1::1",
            "fd00:111:1::2",
            "fd00:111:1::3",
            "fd00:111:1::5",
            "fd00:111:1::6",
        ]
        .iter()
        .map(|s| s.parse::<std::net::Ipv6Addr>().unwrap().octets())
        .collect();
        let backends: HashSet<IpAddr> = [
            "10.111.0.11",
            "10.111.0.12",
            "10.111.0.13",
            "fd00:111::11",
            "fd00:111::12",
            // The NAT VIPs' backends.
            "10.111.0.21",
            "10.111.0.22",
            "10.111.0.23",
            "fd00:111::21",
            "fd00:111::22",
            // The source-NAT VIPs' backends.
            "10.111.0.24",
            "10.111.0.25",
            "10.111.0.26",
            "fd00:111::24",
        ]
        .iter()
        .map(|s| ip(s))
        .collect();
        let nat_sources = [ip("10.111.0.2"), ip("fd00:111::3")].into_iter().collect();
        let backend_macs = backends.iter().map(|b| backend_mac(*b)).collect();
        Vips {
            v4,
            v6,
            backend_macs,
            backends,
            nat_sources,
        }
    }

    /// Whether the frame's IP destination is a VIP address (the fixed header must be present).
    fn addressed(&self, f: &[u8]) -> bool {
        matches!(self.addrs(f), Some((_, dst)) if self.is_vip(dst))
    }

    /// The frame's IP source and destination, if its fixed header is present.
    fn addrs(&self, f: &[u8]) -> Option<(IpAddr, IpAddr)> {
        let a4 = |at: usize| IpAddr::from(<[u8; 4]>::try_from(&f[at..at + 4]).unwrap());
        let a6 = |at: usize| IpAddr::from(<[u8; 16]>::try_from(&f[at..at + 16]).unwrap());
        match l3_of(f) {
            Some((l3, 0x0800)) if f.len() >= l3 + 20 => Some((a4(l3 + 12), a4(l3 + 16))),
            Some((l3, 0x86dd)) if f.len() >= l3 + 40 => Some((a6(l3 + 8), a6(l3 + 24))),
            _ => None,
        }
    }

    fn is_vip(&self, a: IpAddr) -> bool {
        match a {
            IpAddr::V4(a) => self.v4.contains(&a.octets()),
            IpAddr::V6(a) => self.v6.contains(&a.octets()),
        }
    }

    /// Whether the frame comes from a backend (a NAT flow's reply may be one).
    fn sent_by_a_backend(&self, f: &[u8]) -> bool {
        matches!(self.addrs(f), Some((src, _)) if self.backends.contains(&src))
    }

    /// Whether the frame is an ICMP error (of any sender) quoting a packet to a backend: a
    /// NAT flow's, which goes to the flow's client.
    fn quotes_a_packet_to_a_backend(&self, f: &[u8]) -> bool {
        let Some((l3, et)) = l3_of(f) else {
            return false;
        };
        let inner = match et {
            0x0800 if f.len() > l3 + 9 && f[l3 + 9] == 1 => l3 + usize::from(f[l3] & 0xf) * 4 + 8,
            0x86dd if f.len() > l3 + 6 && f[l3 + 6] == 58 => l3 + 48,
            _ => return false,
        };
        let dst = match et {
            0x0800 if f.len() >= inner + 20 => {
                IpAddr::from(<[u8; 4]>::try_from(&f[inner + 16..inner + 20]).unwrap())
            }
            0x86dd if f.len() >= inner + 40 => {
                IpAddr::from(<[u8; 16]>::try_from(&f[inner + 24..inner + 40]).unwrap())
            }
            _ => return false,
        };
        self.backends.contains(&dst)
    }
}

/// Checks an `XDP_TX` output; `Err` says what is wrong.
fn check_tx(vips: &Vips, input: &[u8], out: &[u8]) -> Result<(), String> {
    let (l3, _) = l3_of(input).ok_or("TX of a frame without an L3 header")?;
    if out.len() == input.len() {
        let to_backend = vips
            .backend_macs
            .contains(&<[u8; 6]>::try_from(&out[0..6]).unwrap());
        if to_backend && out[6..12] == input[0..6] && out[12..] == input[12..] {
            return Ok(());
        }
        if nat_rewrite(vips, l3, input, out) || icmp_nat_rewrite(vips, l3, input, out) {
            return Ok(());
        }
        // An echo reply: MACs and IP addresses swapped, ICMP type changed, nothing else.
        if out[0..6] == input[6..12] && out[6..12] == input[0..6] && out[12..l3] == input[12..l3] {
            return Ok(());
        }
        return Err(
            "same-length TX that is neither an L2 DSR rewrite, a NAT rewrite nor an answer to the sender"
                .into(),
        );
    }
    if out.len() < input.len() {
        if is_reset_to_sender(input, out) {
            return Ok(());
        }
        return Err("TX shrank the frame".into());
    }
    if !vips
        .backend_macs
        .contains(&<[u8; 6]>::try_from(&out[0..6]).unwrap())
        || out[6..12] != input[0..6]
    {
        return Err("encapsulated frame not addressed from us to a backend".into());
    }
    if out[12..l3 - 2] != input[12..l3 - 2] {
        return Err("VLAN tags changed".into());
    }
    let outer_type = u16::from_be_bytes([out[l3 - 2], out[l3 - 1]]);
    let (overhead, proto, dst) = match outer_type {
        0x0800 => {
            let h = &out[l3..l3 + 20];
            if ones_complement_sum(h) != 0xffff {
                return Err("outer IPv4 checksum invalid".into());
            }
            (
                20,
                h[9],
                IpAddr::from(<[u8; 4]>::try_from(&h[16..20]).unwrap()),
            )
        }
        0x86dd => {
            let h = &out[l3..l3 + 40];
            (
                40,
                h[6],
                IpAddr::from(<[u8; 16]>::try_from(&h[24..40]).unwrap()),
            )
        }
        other => return Err(format!("outer ether type {other:#x}")),
    };
    if !vips.backends.contains(&dst) {
        return Err(format!("outer destination {dst} is not a backend"));
    }
    let overhead = match proto {
        4 | 41 => overhead,
        17 => overhead + 8,
        p => return Err(format!("outer protocol {p}")),
    };
    if out.len() != input.len() + overhead || out[l3 + overhead..] != input[l3..] {
        return Err("inner packet changed".into());
    }
    Ok(())
}

/// A NAT rewrite: from us (the input's destination MAC), either a client's packet for a VIP
/// now addressed to a backend (and its MAC), or a backend's reply now from a VIP; the frames
/// differ in that address, the IPv4 header checksum (valid if it was) and one more 16-bit word
/// (the TCP or UDP checksum), nothing else. With source NAT the other address differs too (the
/// NAT source for the client, or back), and one more word (the port it takes or gives back).
fn nat_rewrite(vips: &Vips, l3: usize, input: &[u8], out: &[u8]) -> bool {
    if out[6..12] != input[0..6] || out[12..l3] != input[12..l3] {
        return false;
    }
    let (Some((in_src, in_dst)), Some((out_src, out_dst))) = (vips.addrs(input), vips.addrs(out))
    else {
        return false;
    };
    let to_mac = <[u8; 6]>::try_from(&out[0..6]).unwrap();
    let forward_snat = vips.nat_sources.contains(&out_src) && in_src != out_src;
    let forward = (in_src == out_src || forward_snat)
        && vips.is_vip(in_dst)
        && vips.backends.contains(&out_dst)
        && vips.backend_macs.contains(&to_mac);
    // A reply goes to the MAC the flow's client frames came from: mutated ones too, so any
    // (the packet fixtures check the exact one).
    let reply_snat = vips.nat_sources.contains(&in_dst) && in_dst != out_dst;
    let reply = (in_dst == out_dst || reply_snat)
        && vips.backends.contains(&in_src)
        && vips.is_vip(out_src);
    if !forward && !reply {
        return false;
    }
    let snat = (forward && forward_snat) || (reply && reply_snat);
    let v4 = out[l3] >> 4 == 4;
    let (src, dst) = if v4 {
        (l3 + 12..l3 + 16, l3 + 16..l3 + 20)
    } else {
        (l3 + 8..l3 + 24, l3 + 24..l3 + 40)
    };
    let check = v4.then_some(l3 + 10);
    // The incremental update keeps a valid IPv4 header checksum valid (and a broken one broken).
    let valid = |f: &[u8]| ones_complement_sum(&f[l3..l3 + 20]) == 0xffff;
    if check.is_some() && valid(out) != valid(input) {
        return false;
    }
    let rewritten =
        |i: usize| (forward || snat) && dst.contains(&i) || (!forward || snat) && src.contains(&i);
    let mut other_words = std::collections::BTreeSet::new();
    for i in 12..out.len() {
        if out[i] != input[i] && !rewritten(i) && check.is_none_or(|c| i != c && i != c + 1) {
            other_words.insert(i / 2);
        }
    }
    other_words.len() <= if snat { 2 } else { 1 }
}

/// An ICMP error about a NAT flow, translated: from us, to a backend (outer destination a
/// backend) or to a client (outer source a VIP or unchanged); the ICMP checksum (with IPv6's
/// pseudo-header) valid if it was, and the outer IPv4 header checksum too.
fn icmp_nat_rewrite(vips: &Vips, l3: usize, input: &[u8], out: &[u8]) -> bool {
    if out[6..12] != input[0..6] || out[12..l3] != input[12..l3] {
        return false;
    }
    let (Some((in_src, _)), Some((out_src, out_dst))) = (vips.addrs(input), vips.addrs(out)) else {
        return false;
    };
    let v4 = out[l3] >> 4 == 4;
    let (proto, l4) = if v4 {
        (out[l3 + 9], l3 + usize::from(out[l3] & 0xf) * 4)
    } else {
        (out[l3 + 6], l3 + 40)
    };
    if proto != if v4 { 1 } else { 58 } || l4 > out.len() {
        return false;
    }
    let to_mac = <[u8; 6]>::try_from(&out[0..6]).unwrap();
    let to_backend = vips.backend_macs.contains(&to_mac) && vips.backends.contains(&out_dst);
    let to_client = out_src == in_src || vips.is_vip(out_src);
    if !to_backend && !to_client {
        return false;
    }
    let icmp_valid = |f: &[u8]| {
        let (src, dst) = vips.addrs(f).unwrap();
        let mut bytes = Vec::new();
        if !v4 {
            for a in [src, dst] {
                if let IpAddr::V6(a) = a {
                    bytes.extend_from_slice(&a.octets());
                }
            }
            bytes.extend_from_slice(&((f.len() - l4) as u32).to_be_bytes());
            bytes.extend_from_slice(&[0, 0, 0, 58]);
        }
        bytes.extend_from_slice(&f[l4..]);
        ones_complement_sum(&bytes) == 0xffff
    };
    let header_valid = |f: &[u8]| !v4 || ones_complement_sum(&f[l3..l3 + 20]) == 0xffff;
    icmp_valid(out) == icmp_valid(input) && header_valid(out) == header_valid(input)
}

/// The replies of the source-NAT flows of `base_frames` (their ports are the program's
/// choice: the flows are sent first).
fn source_nat_replies(h: &mut Harness) -> Vec<Vec<u8>> {
    let c4 = ip("10.9.0.1");
    let c6 = ip("2001:db8::5");
    let mut replies = Vec::new();
    for (client, sport, vip, backends, source, udp) in [
        (
            c4,
            1014,
            "10.111.1.6",
            &["10.111.0.24", "10.111.0.25"][..],
            "10.111.0.2",
            false,
        ),
        (
            c4,
            1015,
            "10.111.1.6",
            &["10.111.0.26"][..],
            "10.111.0.2",
            true,
        ),
        (
            c6,
            1016,
            "fd00:111:1::6",
            &["fd00:111::24"][..],
            "fd00:111::3",
            false,
        ),
    ] {
        let frame = if udp {
            udp_frame(client, sport, ip(vip), 53, b"snat query")
        } else {
            tcp_frame(client, sport, ip(vip), 80, true, b"snat")
        };
        let (_, out) = h.run(&frame).unwrap();
        let l4 = if client.is_ipv4() { 34 } else { 54 };
        let port = u16::from_be_bytes([out[l4], out[l4 + 1]]);
        for backend in backends {
            let mut reply = if udp {
                udp_frame(ip(backend), 53, ip(source), port, b"snat answer")
            } else {
                tcp_frame(ip(backend), 80, ip(source), port, false, b"snat reply")
            };
            reply[6..12].copy_from_slice(&backend_mac(ip(backend)));
            replies.push(reply);
        }
    }
    replies
}

fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut f = base.to_vec();
    let l3 = l3_of(&f).map_or(14, |(l3, _)| l3);
    // Header edits need the first bytes of the IP header; short frames get byte flips.
    let kind = if f.len() < l3 + 8 {
        rng.below(2)
    } else {
        rng.below(8)
    };
    match kind {
        // Flip a few bytes, mostly in the headers.
        0 | 1 => {
            for _ in 0..1 + rng.below(4) {
                let at = if rng.below(4) == 0 {
                    rng.below(f.len())
                } else {
                    rng.below(f.len().min(l3 + 60))
                };
                f[at] = rng.byte();
            }
        }
        // Random IHL / version nibble.
        2 => f[l3] = rng.byte(),
        // Random length fields (IPv4 total length, IPv6 payload length).
        3 => {
            let at = if f[l3] >> 4 == 6 { l3 + 4 } else { l3 + 2 };
            if at + 1 < f.len() {
                f[at] = rng.byte();
                f[at + 1] = rng.byte();
            }
        }
        // Random fragment fields / IPv6 next header.
        4 => {
            if f[l3] >> 4 == 6 {
                f[l3 + 6] = [0u8, 43, 44, 51, 60, 6, 17, 58, 59][rng.below(9)];
            } else if l3 + 7 < f.len() {
                f[l3 + 6] = rng.byte();
                f[l3 + 7] = rng.byte();
            }
        }
        // Random tail cut.
        5 => f.truncate(14.max(rng.below(f.len() + 1))),
        // Random extension-header chain spliced into an IPv6 frame.
        6 if f[l3] >> 4 == 6 && f.len() >= l3 + 40 => {
            let mut chain = Vec::new();
            let mut next = f[l3 + 6];
            for _ in 0..rng.below(7) {
                let kind = [0u8, 43, 60, 51, 44][rng.below(5)];
                let len_field = rng.below(3) as u8;
                let len = if kind == 44 {
                    8
                } else if kind == 51 {
                    (len_field as usize + 2) * 4
                } else {
                    (len_field as usize + 1) * 8
                };
                let mut h = vec![next, if kind == 44 { 0 } else { len_field }];
                h.resize(len, rng.byte());
                chain.splice(0..0, h);
                next = kind;
            }
            f[l3 + 6] = next;
            f.splice(l3 + 40..l3 + 40, chain);
            let payload = (f.len() - l3 - 40) as u16;
            f[l3 + 4..l3 + 6].copy_from_slice(&payload.to_be_bytes());
        }
        // Garbage after a plausible Ethernet header, sometimes aimed at a VIP.
        _ => {
            let len = 14 + rng.below(120);
            f.resize(len, 0);
            for b in &mut f[12..] {
                *b = rng.byte();
            }
            if rng.below(2) == 0 {
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                if f.len() >= 34 {
                    f[14] = 0x45;
                    f[30..34].copy_from_slice(&[10, 111, 1, 1 + rng.below(3) as u8]);
                }
            }
        }
    }
    f
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn a_million_malformed_frames() {
    let mut h =
        Harness::new(&to_toml(&packet_fixture())).expect("loading the balancer needs root and BPF");
    let vips = Vips::new();
    let mut bases = base_frames();
    bases.extend(source_nat_replies(&mut h));
    let mut rng = Rng(0x005e_ed0f_ba1a_2ce5);
    let mut run = 0usize;
    let mut actions = [0usize; 4];
    let mut check = |h: &mut Harness, frame: &[u8]| {
        let (action, out) = h
            .run(frame)
            .unwrap_or_else(|e| panic!("frame {frame:02x?}: {e:#}"));
        actions[action.min(3) as usize] += 1;
        let addressed = vips.addressed(frame);
        let verdict = match action {
            XDP_PASS if out == frame => Ok(()),
            XDP_PASS => Err("XDP_PASS changed the frame".to_string()),
            XDP_TX
                if !addressed
                    && (vips.sent_by_a_backend(frame)
                        || vips.quotes_a_packet_to_a_backend(frame)) =>
            {
                check_tx(&vips, frame, &out)
            }
            _ if !addressed => Err(format!(
                "{} for a frame not addressed to a VIP",
                action_name(action)
            )),
            XDP_DROP => Ok(()),
            XDP_TX => check_tx(&vips, frame, &out),
            other => Err(format!("unexpected action {other}")),
        };
        if let Err(why) = verdict {
            panic!("{why}\ninput  {frame:02x?}\noutput {out:02x?}");
        }
    };
    // Every truncation of every base frame.
    for base in &bases {
        for len in 14..=base.len() {
            check(&mut h, &base[..len]);
            run += 1;
        }
    }
    while run < FRAMES {
        let base = &bases[rng.below(bases.len())];
        let mut frame = mutate(&mut rng, base);
        if rng.below(4) == 0 {
            frame = mutate(&mut rng, &frame);
        }
        if frame.len() >= 14 {
            check(&mut h, &frame);
            run += 1;
        }
    }
    println!(
        "{run} frames: {} passed, {} dropped, {} transmitted",
        actions[XDP_PASS as usize], actions[XDP_DROP as usize], actions[XDP_TX as usize]
    );
    assert!(run >= 1_000_000);
    assert!(
        actions[XDP_TX as usize] > 1000 && actions[XDP_DROP as usize] > 1000,
        "the sweep barely reached the VIP paths: {actions:?}"
    );
}
