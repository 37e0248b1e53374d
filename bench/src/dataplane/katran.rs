//! `--katran-object PATH`: Katran's XDP balancer, an object the user built from Katran's public
//! source (`katran/lib/bpf/balancer.bpf.c`, default features), timed beside this program in the
//! same rounds. Both are configured alike: the same three IPIP VIPs (TCP 10.111.1.2:80, UDP
//! 10.111.1.2:53, TCP 10.111.1.4:443) over the same two IPv4 backends, no NAT, no persistence,
//! no telemetry; this program also has one L2 DSR VIP (Katran has no such mode). Every path runs
//! as single runs on both (Katran's forwarded packets are encapsulated, which the kernel's
//! `repeat` cannot replay), and the figure that matters is each path's cost net of the bare
//! `XDP_PASS` floor timed the same way: ours / Katran's.
//!
//! The maps written are those of Katran's default build (commit 19f08fe and its neighbours):
//! `vip_map` (`vip_definition` → `vip_meta`), `reals`, `ch_rings` (65,537 slots per VIP) and
//! `ctl_array` (the gateway MAC). An object whose maps differ is refused by name.

use std::net::Ipv4Addr;

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData},
    programs::Xdp,
};
use balancer_tests::configs::{backends, vip};
use balancer_tests::packet::{Harness, XDP_PASS, XDP_TX, tcp_frame, udp_frame};

use super::{Figures, ip, median};
use anyhow::{Context as _, Result, bail};

/// Katran's program in its object.
const PROGRAM: &str = "balancer_ingress";
/// Slots of one VIP's consistent-hash ring in Katran's default build.
const RING_SIZE: u32 = 65_537;
/// The VIPs both programs forward by IPIP: address, port, IP protocol.
const VIPS: [(&str, u16, u8); 3] = [
    ("10.111.1.2", 80, 6),
    ("10.111.1.2", 53, 17),
    ("10.111.1.4", 443, 6),
];
/// Their backends.
const BACKENDS: [&str; 2] = ["10.111.0.11", "10.111.0.12"];

/// The compared paths: key, what, and the target for ours / Katran's net cost.
pub(super) const PATHS: [(&str, &str, f64); 4] = [
    ("non_vip", "TCP to the host's own address (passes)", 0.20),
    ("established", "established TCP, IPIP", 0.45),
    (
        "new_flow",
        "TCP SYN, a new flow by consistent hash, IPIP",
        0.50,
    ),
    ("udp", "UDP of a known flow, IPIP", 0.45),
];

/// A frame per path, in [`PATHS`]' order, with the action both programs must answer.
fn frames() -> [(Vec<u8>, u32); 4] {
    let payload = [0x42u8; 64];
    let c4 = ip("10.9.0.1");
    [
        (
            tcp_frame(c4, 2000, ip("10.111.0.2"), 22, false, &payload),
            XDP_PASS,
        ),
        (
            tcp_frame(c4, 1001, ip("10.111.1.2"), 80, false, &payload),
            XDP_TX,
        ),
        (
            tcp_frame(c4, 3000, ip("10.111.1.2"), 80, true, &payload),
            XDP_TX,
        ),
        (udp_frame(c4, 1500, ip("10.111.1.2"), 53, &payload), XDP_TX),
    ]
}

/// The two programs, configured alike, with their flows opened.
pub(super) struct Pair {
    ours: Harness,
    katran: Ebpf,
    frames: [(Vec<u8>, u32); 4],
}

impl Pair {
    pub(super) fn load(object: &[u8]) -> Result<Pair> {
        let mut pair = Pair {
            ours: Harness::new(&our_config()).context("this program, Katran's config")?,
            katran: load_katran(object)?,
            frames: frames(),
        };
        // Open the established flows on both: a SYN pins ours; Katran's first packet of a flow
        // fills its LRU.
        let c4 = ip("10.9.0.1");
        let syn = tcp_frame(c4, 1001, ip("10.111.1.2"), 80, true, b"");
        pair.ours.run(&syn)?;
        for (frame, _) in &pair.frames[1..] {
            pair.ours.run_raw(frame, 1)?;
            run_katran(&mut pair.katran, frame)?;
        }
        Ok(pair)
    }

    /// `singles` single runs of path `i` on ours (`katran` false) or Katran's: mean ns per run.
    pub(super) fn time(&mut self, i: usize, katran: bool, singles: u32) -> Result<f64> {
        let (frame, expect) = &self.frames[i];
        let mut total = 0.0;
        for _ in 0..singles {
            let (action, ns) = if katran {
                run_katran(&mut self.katran, frame)?
            } else {
                let (action, _, t) = self.ours.run_raw(frame, 1)?;
                (action, t.as_nanos() as f64)
            };
            if action != *expect {
                bail!(
                    "{} ({}): action {action}, expected {expect}",
                    PATHS[i].0,
                    if katran { "Katran" } else { "ours" }
                );
            }
            total += ns;
        }
        Ok(total / f64::from(singles))
    }
}

/// This program's side: the three IPIP VIPs and one L2 DSR VIP.
fn our_config() -> String {
    let mut vips: Vec<_> = VIPS
        .iter()
        .enumerate()
        .map(|(i, (addr, port, proto))| {
            let mut v = vip(&format!("ipip{i}"), addr, *port);
            v.protocol = Some(if *proto == 17 { "udp" } else { "tcp" }.into());
            v.forwarding = Some("ipip".into());
            v.backend = backends(&BACKENDS);
            v
        })
        .collect();
    let mut dsr = vip("l2dsr", "10.111.1.1", 80);
    dsr.backend = backends(&BACKENDS);
    vips.push(dsr);
    super::cases::bench_config(vips)
}

/// Loads Katran's object and writes its VIPs, backends, rings and gateway MAC.
fn load_katran(object: &[u8]) -> Result<Ebpf> {
    let mut ebpf = EbpfLoader::new()
        .load(object)
        .context("loading the Katran object (creating its maps)")?;
    let program: &mut Xdp = ebpf
        .program_mut(PROGRAM)
        .with_context(|| format!("the Katran object has no program {PROGRAM}"))?
        .try_into()
        .with_context(|| format!("{PROGRAM} is not an XDP program"))?;
    program
        .load()
        .with_context(|| format!("the kernel refused Katran's {PROGRAM}"))?;

    let mut vip_map: HashMap<&mut MapData, [u8; 20], [u8; 8]> = katran_map(&mut ebpf, "vip_map")?;
    for (num, (addr, port, proto)) in VIPS.iter().enumerate() {
        let mut key = [0u8; 20];
        key[..4].copy_from_slice(&addr.parse::<Ipv4Addr>()?.octets());
        key[16..18].copy_from_slice(&port.to_be_bytes());
        key[18] = *proto;
        let mut meta = [0u8; 8];
        // flags 0: the connection table on, the hash over the client and both ports.
        meta[4..].copy_from_slice(&(num as u32).to_le_bytes());
        vip_map.insert(key, meta, 0).context("vip_map")?;
    }
    let mut reals: Array<&mut MapData, [u8; 20]> = katran_map(&mut ebpf, "reals")?;
    for (i, addr) in BACKENDS.iter().enumerate() {
        let mut real = [0u8; 20];
        real[..4].copy_from_slice(&addr.parse::<Ipv4Addr>()?.octets());
        // Real 0 means "none" to Katran.
        reals.set(i as u32 + 1, real, 0).context("reals")?;
    }
    let mut rings: Array<&mut MapData, u32> = katran_map(&mut ebpf, "ch_rings")?;
    for num in 0..VIPS.len() as u32 {
        for slot in 0..RING_SIZE {
            let real = 1 + slot % BACKENDS.len() as u32;
            rings
                .set(num * RING_SIZE + slot, real, 0)
                .context("ch_rings")?;
        }
    }
    let mut ctl: Array<&mut MapData, [u8; 8]> = katran_map(&mut ebpf, "ctl_array")?;
    ctl.set(0, [0x02, 0, 0, 0, 0, 0x02, 0, 0], 0)
        .context("ctl_array")?;
    Ok(ebpf)
}

/// One of Katran's maps, with the key and value sizes of its default build.
fn katran_map<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .map_mut(name)
        .with_context(|| format!("the Katran object has no map {name}"))?;
    T::try_from(map).with_context(|| {
        format!("Katran's map {name} is not laid out as in Katran's default build")
    })
}

/// Runs Katran's program once on `frame`: its action and the kernel's ns.
fn run_katran(ebpf: &mut Ebpf, frame: &[u8]) -> Result<(u32, f64)> {
    let program: &mut Xdp = ebpf
        .program_mut(PROGRAM)
        .context("Katran's program")?
        .try_into()?;
    super::test_run(program, frame, 1).context("Katran's program")
}

/// Each path's times over the rounds, ours and Katran's.
#[derive(Default)]
pub(super) struct Samples {
    ours: [Vec<f64>; 4],
    katran: [Vec<f64>; 4],
}

impl Samples {
    /// Every path once on each program, the two taking turns going first.
    pub(super) fn time_round(&mut self, pair: &mut Pair, round: usize, singles: u32) -> Result<()> {
        for i in 0..PATHS.len() {
            let katran_first = round % 2 == 1;
            for katran in [katran_first, !katran_first] {
                let ns = pair.time(i, katran, singles)?;
                let side = if katran {
                    &mut self.katran
                } else {
                    &mut self.ours
                };
                side[i].push(ns);
            }
        }
        Ok(())
    }

    /// Each path: medians, and ours / Katran's cost net of the pass floor (`pass`: the bare
    /// program's single runs, same rounds) with its bootstrap 95% interval over the rounds,
    /// read against the target.
    pub(super) fn print(&self, pass: &[f64], figures: &mut Figures) {
        println!(
            "\nBeside Katran (single runs, same rounds): median ns, and ours / Katran's per-packet cost net of the bare XDP_PASS floor, with its bootstrap 95% interval over the rounds"
        );
        println!(
            "{:<12} {:>8} {:>8} {:>10} {:>16} {:>8}  verdict",
            "path", "ours", "Katran", "net ratio", "95% interval", "target"
        );
        for (i, (key, what, target)) in PATHS.iter().enumerate() {
            let net = |s: &[f64]| -> Vec<f64> { s.iter().zip(pass).map(|(t, p)| t - p).collect() };
            let (ours, katran) = (net(&self.ours[i]), net(&self.katran[i]));
            let (ratio, (lo, hi)) =
                crate::ratio_of_means_with_95(&ours, &katran, super::BOOTSTRAP_RESAMPLES);
            let verdict = if hi <= *target {
                "met"
            } else if lo > *target {
                "missed"
            } else {
                "undecided"
            };
            println!(
                "{:<12} {:>8.1} {:>8.1} {:>10.3} {:>7.3}..{:<7.3} {:>8.2}  {verdict}",
                key,
                median(&self.ours[i]),
                median(&self.katran[i]),
                ratio,
                lo,
                hi,
                target
            );
            println!("    {what}");
            // One row of the page per path (its columns: `super::PAGE`).
            let k = format!("vs_katran_{key}");
            figures.insert(format!("{k}_ns"), median(&self.ours[i]));
            figures.insert(format!("{k}_over_pass_ns"), median(&ours));
            figures.insert(format!("{k}_katran_ns"), median(&self.katran[i]));
            figures.insert(format!("{k}_net_over_katran"), ratio);
            figures.insert(format!("{k}_net_over_katran_low"), lo);
            figures.insert(format!("{k}_net_over_katran_high"), hi);
            figures.insert(format!("{k}_net_over_katran_target"), *target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use balancer::base::config::{Config, Forwarding};

    #[test]
    fn both_sides_forward_the_same_vips_to_the_same_backends() {
        let c = Config::parse(&our_config()).expect("a valid config");
        for (addr, port, proto) in VIPS {
            let v = c
                .vips
                .iter()
                .find(|v| v.address == ip(addr) && v.port == port)
                .unwrap_or_else(|| panic!("no VIP {addr}:{port}"));
            assert_eq!(v.forwarding, Forwarding::Ipip, "{addr}:{port}");
            assert_eq!(v.protocol.number(), proto, "{addr}:{port}");
            let ours: Vec<std::net::IpAddr> = v.backends.iter().map(|b| b.address).collect();
            assert_eq!(ours, BACKENDS.map(ip), "{addr}:{port}");
        }
        // Every path's frame goes where its case says: the host's address is no VIP's.
        assert!(c.vips.iter().all(|v| v.address != ip("10.111.0.2")));
    }
}
