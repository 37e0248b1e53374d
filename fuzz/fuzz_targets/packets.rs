//! Packets through the real, kernel-verified XDP program (BPF_PROG_TEST_RUN; needs root):
//! never `XDP_ABORTED`, and a frame passed is passed unchanged.
//!
//! libFuzzer sees no coverage inside the kernel, so raw mutation would rarely get past the
//! Ethernet header. Inputs are therefore mostly edits of valid frames to the fixture's VIPs
//! (TCP/UDP, IPv4/IPv6, with and without VLAN tags): the first byte picks a template (or raw
//! bytes), the second a truncation, and the rest are (offset, xor) edits.
#![no_main]

use std::net::IpAddr;
use std::sync::{Mutex, OnceLock};

use balancer_tests::configs::{packet_fixture, to_toml};
use balancer_tests::packet::{Harness, XDP_PASS, tcp_flags_frame, tcp_frame, udp_frame, with_vlan};
use libfuzzer_sys::fuzz_target;

fn harness() -> &'static Mutex<Harness> {
    static H: OnceLock<Mutex<Harness>> = OnceLock::new();
    H.get_or_init(|| {
        let config = to_toml(&packet_fixture());
        Mutex::new(Harness::new(&config).expect("loading the balancer needs root and BPF"))
    })
}

fn templates() -> &'static Vec<Vec<u8>> {
    static T: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    T.get_or_init(|| {
        let ip = |s: &str| s.parse::<IpAddr>().expect("fixture address");
        let (c4, c6) = (ip("10.111.0.100"), ip("fd00:111::100"));
        let mut t = vec![
            tcp_frame(c4, 40000, ip("10.111.1.1"), 80, true, b""),
            tcp_frame(
                c4,
                40001,
                ip("10.111.1.2"),
                80,
                false,
                b"GET / HTTP/1.1\r\n\r\n",
            ),
            tcp_frame(c4, 40002, ip("10.111.1.3"), 80, true, b""),
            tcp_frame(c6, 40003, ip("fd00:111:1::1"), 80, true, b""),
            tcp_frame(c6, 40004, ip("fd00:111:1::2"), 80, false, b"payload"),
            udp_frame(c6, 40005, ip("fd00:111:1::3"), 443, b"quic-ish"),
            udp_frame(c4, 40006, ip("10.111.1.1"), 53, b"dns-ish"),
            tcp_flags_frame(c4, 40000, ip("10.111.1.1"), 80, true, false),
            tcp_frame(c4, 40007, ip("10.111.1.9"), 80, true, b""),
        ];
        let tagged: Vec<Vec<u8>> = t.iter().map(|f| with_vlan(f, 7)).collect();
        t.extend(tagged);
        t
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let templates = templates();
    let frame = match usize::from(pick) % (templates.len() + 1) {
        0 => rest.to_vec(),
        n => {
            let mut frame = templates[n - 1].clone();
            let (cut, edits) = rest.split_first().map_or((0, &[][..]), |(c, e)| (*c, e));
            for edit in edits.chunks_exact(2) {
                let at = usize::from(edit[0]) % frame.len();
                frame[at] ^= edit[1];
            }
            // Truncation: 0 keeps the frame whole, else cut that many bytes off the end.
            let keep = frame.len().saturating_sub(usize::from(cut) % frame.len());
            frame.truncate(keep);
            frame
        }
    };
    // BPF_PROG_TEST_RUN wants at least an Ethernet header.
    if frame.len() < 14 || frame.len() > 4000 {
        return;
    }
    let mut h = harness().lock().expect("harness");
    let (action, out) = h.run(&frame).expect("test run (XDP_ABORTED is an error)");
    if action == XDP_PASS {
        assert_eq!(out, frame, "a passed frame was changed");
    }
});
