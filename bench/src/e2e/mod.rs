//! `bench e2e`: the balancer against the peers an operator already runs, in the same rack.
//!
//! One peer at a time sits between the client and three backends: the balancer's XDP program
//! (L2 DSR in native and generic/skb mode, NAT, source NAT in both modes), the kernel's
//! nftables DNAT load balancing as kube-proxy's nftables mode writes it (`numgen random` for
//! TCP, `jhash` for UDP, replies routed back through the balancer namespace for un-NAT),
//! HAProxy in TCP mode, and a
//! baseline without a balancer: the client talks to the backends directly, spreading itself
//! over the same three (one backend alone would have a third of the servers' capacity, and
//! the baseline would lose to every balancer). Each round builds a
//! fresh rack per peer, interleaving the peers so drift on a shared machine hits all alike, and
//! measures:
//!
//! - new TCP connections per second, one HTTP request per connection (closed loop);
//! - requests per second on keep-alive HTTP connections;
//! - small UDP datagrams per second through the VIP (request/reply, windowed);
//! - p50/p99 latency of both TCP phases;
//! - the same two rates from independent generators (Debian's `wrk` for new connections, one
//!   request each with `Connection: close`; `trafgen` from netsniff-ng blasting small UDP
//!   packets over many source ports, counted where they arrive: the backends' links), so the
//!   ratios do not rest on the project's own client alone;
//! - CPU: the whole host's busy time per client packet (everything: generator, servers,
//!   kernel; the difference to the baseline is what the peer adds), and the peer's own cost
//!   where it is separable: the XDP program's run time per packet (BPF run-time stats, on only
//!   in a one-second run of each phase after the measured one: they read the clock twice per
//!   program run, which slowed our peers alone) and HAProxy's process time per packet.
//!   nftables' cost is spread over softirqs and only shows in the host figure.
//!
//! On a 2-core machine the generator, the servers and the forwarding all share the CPUs: the
//! output says how busy the host was, which is what saturates first. `--pin` puts the
//! generator on the last CPU and servers, HAProxy and receive processing (RPS) on the others.
//! XDP on veth runs in the sending CPU's softirq, so pinning cannot move the XDP program off
//! the generator's CPU; that is said in the output too.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

mod load;
mod peers;
mod report;

use load::*;
use peers::*;
use report::*;

use anyhow::{Context as _, Result, bail};
use balancer::base::config::AttachMode;

use super::{Figures, median};
use balancer_tests::configs::to_toml;
use balancer_tests::netns::Netns;
use balancer_tests::rack::Process;
use balancer_tests::topology::{
    CLIENT4, HTTP_PORT, LB4, Topology, TopologyOptions, UDP_PORT, VIP4, backend4, rack_config,
};

/// Its page: the balancer against the peers, per phase (`docs/benchmarks/e2e.md`).
pub const PAGE: super::page::Page = super::page::Page {
    name: "e2e",
    title: "End to end: the balancer against nftables and HAProxy",
    about: "One peer at a time between a client and three backends in the same rack of network \
            namespaces (veth, 2 vCPUs shared by everything): no balancer, a plain routing hop, \
            the balancer (XDP native and skb, L2 DSR; NAT; NAT with source NAT, native and \
            skb), nftables DNAT as kube-proxy writes it (and with masquerade), HAProxy in TCP \
            mode. Medians over interleaved rounds, a fresh rack each; ratios against another peer are listed below \
            the table. Each of our modes beside its fair peer (`balancer_snat` / `nftables_snat` \
            and the like) is the geometric mean of the per-round ratios, with its bootstrap 95% \
            interval in the `_lo95` and `_hi95` rows.",
    columns: &[
        ("_baseline", "no balancer"),
        ("_router", "router"),
        ("_balancer", "balancer"),
        ("_balancer_skb", "balancer skb"),
        ("_balancer_nat", "balancer NAT"),
        ("_balancer_snat", "balancer SNAT"),
        ("_balancer_snat_skb", "balancer SNAT skb"),
        ("_nftables", "nftables"),
        ("_nftables_snat", "nftables SNAT"),
        ("_haproxy", "HAProxy"),
    ],
    flat: &["_ratio_"],
};

/// One thing between the client and the backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Baseline,
    /// The balancer namespace as a plain IP router, no balancing: the cost of the extra hop
    /// every peer here adds (two more veth and bridge traversals), the floor for all of them.
    Router,
    XdpNative,
    XdpSkb,
    /// The balancer by NAT in front of unmodified backends (their replies come back through
    /// it): the mode to set beside nftables DNAT.
    XdpNat,
    /// The balancer by NAT with source NAT (backends with no route to the client): beside
    /// nftables DNAT with masquerade.
    XdpSnat,
    /// Source NAT as `XdpSnat`, the program attached in skb (generic) mode: on veth, native
    /// XDP turns every frame into an XDP buffer and back (copying it where the socket still
    /// holds it), which generic mode does not.
    XdpSnatSkb,
    Nftables,
    /// nftables DNAT plus masquerade (source NAT), the backends routing nothing through it.
    NftablesSnat,
    Haproxy,
}

impl Peer {
    pub const ALL: [Peer; 10] = [
        Peer::Baseline,
        Peer::Router,
        Peer::XdpNative,
        Peer::XdpSkb,
        Peer::XdpNat,
        Peer::XdpSnat,
        Peer::XdpSnatSkb,
        Peer::Nftables,
        Peer::NftablesSnat,
        Peer::Haproxy,
    ];

    /// The name in figures' keys and on the command line.
    pub fn key(self) -> &'static str {
        match self {
            Peer::Baseline => "baseline",
            Peer::Router => "router",
            Peer::XdpNative => "balancer",
            Peer::XdpSkb => "balancer_skb",
            Peer::XdpNat => "balancer_nat",
            Peer::XdpSnat => "balancer_snat",
            Peer::XdpSnatSkb => "balancer_snat_skb",
            Peer::Nftables => "nftables",
            Peer::NftablesSnat => "nftables_snat",
            Peer::Haproxy => "haproxy",
        }
    }

    pub fn by_key(key: &str) -> Option<Peer> {
        Peer::ALL.into_iter().find(|p| p.key() == key)
    }

    fn label(self) -> &'static str {
        match self {
            Peer::Baseline => "no balancer (client → backends)",
            Peer::Router => "plain routing hop, no balancing",
            Peer::XdpNative => "balancer, XDP native, L2 DSR",
            Peer::XdpSkb => "balancer, XDP skb (generic), L2 DSR",
            Peer::XdpNat => "balancer, XDP native, NAT (unmodified backends)",
            Peer::XdpSnat => "balancer, XDP native, NAT + source NAT",
            Peer::XdpSnatSkb => "balancer, XDP skb (generic), NAT + source NAT",
            Peer::Nftables => "nftables DNAT (numgen/jhash)",
            Peer::NftablesSnat => "nftables DNAT + masquerade",
            Peer::Haproxy => "HAProxy, TCP mode",
        }
    }
}

/// What `bench e2e` runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub rounds: usize,
    /// Seconds per phase.
    pub seconds: f64,
    /// Concurrent connections of the TCP phases (one thread each).
    pub connections: usize,
    /// UDP sockets, each with `udp_window` datagrams in flight.
    pub udp_sockets: usize,
    pub udp_window: usize,
    /// Generator on the last CPU, everything else on the others.
    pub pin: bool,
    pub peers: Vec<Peer>,
}

/// One phase's outcome.
#[derive(Clone, Debug, Default)]
struct Phase {
    rate: f64,
    errors: u64,
    p50_us: f64,
    p99_us: f64,
    /// Host busy CPU time per client packet, ns.
    host_ns_per_packet: f64,
    /// The peer's own CPU per packet it handled, ns (XDP run time, HAProxy process time).
    own_ns_per_packet: Option<f64>,
    /// Share of the host's CPU time that was busy, 0..1.
    busy: f64,
}

/// The phases of one peer in one round.
#[derive(Clone, Debug, Default)]
struct Round {
    conn: Phase,
    keepalive: Phase,
    udp: Option<Phase>,
    /// New connections per second by `wrk`.
    wrk: Phase,
    /// Small UDP packets per second by `trafgen`, as they reached the backends (`errors`:
    /// the ones sent that did not).
    trafgen: Option<Phase>,
}

pub fn run(opts: &Options) -> Result<Figures> {
    if opts.peers.is_empty() || opts.rounds == 0 {
        bail!("nothing to run: give at least one peer and one round");
    }
    if opts.peers.contains(&Peer::Haproxy) && which("haproxy").is_none() {
        bail!("haproxy is not installed: run `cargo xtask setup`");
    }
    let nft = opts.peers.contains(&Peer::Nftables) || opts.peers.contains(&Peer::NftablesSnat);
    if nft && which("nft").is_none() {
        bail!("nft is not installed: run `cargo xtask setup`");
    }
    for (tool, package) in [("wrk", "wrk"), ("trafgen", "netsniff-ng")] {
        if which(tool).is_none() {
            bail!("{tool} is not installed: run `cargo xtask setup` (Debian package {package})");
        }
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if opts.pin && cpus < 2 {
        bail!("--pin needs at least 2 CPUs (this machine has {cpus})");
    }
    println!(
        "bench e2e: {} round(s), {:.1} s per phase, {} TCP connections, {} UDP sockets × {} in flight, {} CPUs{}",
        opts.rounds,
        opts.seconds,
        opts.connections,
        opts.udp_sockets,
        opts.udp_window,
        cpus,
        if opts.pin {
            "; generator pinned to the last CPU"
        } else {
            ""
        }
    );
    let mut results: BTreeMap<&'static str, Vec<Round>> = BTreeMap::new();
    for round in 0..opts.rounds {
        for &peer in &opts.peers {
            let r = measure(peer, opts, cpus)
                .with_context(|| format!("round {} with {}", round + 1, peer.label()))?;
            println!(
                "  round {} {:<13} conn/s {:>8.0}  keep-alive req/s {:>8.0}  UDP pps {:>8}  busy {:>3.0}%  wrk conn/s {:>8.0}  trafgen pps {:>8}",
                round + 1,
                peer.key(),
                r.conn.rate,
                r.keepalive.rate,
                r.udp
                    .as_ref()
                    .map_or("n/a".to_string(), |u| format!("{:.0}", u.rate)),
                r.conn.busy * 100.0,
                r.wrk.rate,
                r.trafgen
                    .as_ref()
                    .map_or("n/a".to_string(), |u| format!("{:.0}", u.rate)),
            );
            results.entry(peer.key()).or_default().push(r);
        }
    }
    Ok(report(opts, &results))
}

/// Builds a rack with `peer` in the middle and runs the three phases.
fn measure(peer: Peer, opts: &Options, cpus: usize) -> Result<Round> {
    let tag = format!("e2e{}", peer_tag(peer));
    let mut topo = Topology::build(TopologyOptions::new(&tag))?;
    // The baseline spreads over the same backends itself, so that every peer has the same
    // server capacity behind it.
    let target: Vec<IpAddr> = match peer {
        Peer::Baseline | Peer::Router => (0..topo.backends.len())
            .map(|i| backend4(i).into())
            .collect(),
        _ => vec![VIP4.into()],
    };
    let process = start_peer(&mut topo, peer)?;
    tune(&topo)?;
    if opts.pin {
        pin(&topo, cpus)?;
    }
    let own = OwnCost {
        program: matches!(
            peer,
            Peer::XdpNative | Peer::XdpSkb | Peer::XdpNat | Peer::XdpSnat | Peer::XdpSnatSkb
        )
        .then(|| balancer::dataplane::pinning::Pins::new(topo.pin_dir()).program()),
        process,
    };
    // Warm up (ARP, caches, the balancer's neighbour entries).
    let warm = Options {
        seconds: 0.3,
        ..opts.clone()
    };
    run_phase(&topo, &warm, &target, Load::Connections)?;
    let mut phases = Vec::new();
    for load in [Load::Connections, Load::KeepAlive, Load::Udp] {
        if load == Load::Udp && peer == Peer::Haproxy {
            // HAProxy balances TCP only.
            phases.push(None);
            continue;
        }
        phases.push(Some(measured_phase(&topo, opts, &target, load, &own)?));
    }
    // The independent generators.
    let cpu0 = host_cpu()?;
    let pkts0 = client_tx_packets(&topo.client)?;
    let wrk = wrk_phase(&topo, opts, &target)?;
    let (cpu1, pkts1) = (host_cpu()?, client_tx_packets(&topo.client)?);
    let wrk = Phase {
        host_ns_per_packet: (cpu1.0 - cpu0.0) as f64 / pkts1.saturating_sub(pkts0).max(1) as f64,
        busy: (cpu1.0 - cpu0.0) as f64 / (cpu1.1 - cpu0.1).max(1) as f64,
        ..wrk
    };
    let trafgen = if peer == Peer::Haproxy {
        None
    } else {
        let mut phase = trafgen_phase(&topo, opts, peer, &target)?;
        phase.own_ns_per_packet = own
            .sample_program(|| trafgen_phase(&topo, &opts.sampling(), peer, &target).map(|_| ()))?;
        Some(phase)
    };
    drop(topo);
    let mut phases = phases.into_iter();
    Ok(Round {
        conn: phases.next().flatten().unwrap_or_default(),
        keepalive: phases.next().flatten().unwrap_or_default(),
        udp: phases.next().flatten(),
        wrk,
        trafgen,
    })
}

/// Puts `peer` between the client and the backends; HAProxy's process id.
fn start_peer(topo: &mut Topology, peer: Peer) -> Result<Option<u32>> {
    match peer {
        Peer::Baseline => {}
        Peer::Router => setup_router(topo)?,
        Peer::XdpNative | Peer::XdpSkb => {
            let mode = if peer == Peer::XdpNative {
                AttachMode::Native
            } else {
                AttachMode::Skb
            };
            if mode == AttachMode::Native {
                topo.attach_peer_pass(mode)?;
            }
            let config = bench_config(rack_config(topo, "l2-dsr", mode));
            topo.start_balancer(&to_toml(&config))?;
        }
        Peer::XdpNat => {
            topo.attach_peer_pass(AttachMode::Native)?;
            topo.unmodified_backends()?;
            let config = bench_config(rack_config(topo, "nat", AttachMode::Native));
            topo.start_balancer(&to_toml(&config))?;
        }
        Peer::XdpSnat | Peer::XdpSnatSkb => {
            let mode = if peer == Peer::XdpSnat {
                AttachMode::Native
            } else {
                AttachMode::Skb
            };
            if mode == AttachMode::Native {
                topo.attach_peer_pass(mode)?;
            }
            topo.source_nat_backends()?;
            let config = bench_config(rack_config(topo, "snat", mode));
            topo.start_balancer(&to_toml(&config))?;
        }
        Peer::Nftables => setup_nftables(topo, false)?,
        Peer::NftablesSnat => setup_nftables(topo, true)?,
        Peer::Haproxy => return Ok(Some(start_haproxy(topo)?)),
    }
    Ok(None)
}

/// The peer's own cost, where it is separable: the XDP program's run time (BPF statistics of
/// its pin), or HAProxy's process CPU.
struct OwnCost {
    program: Option<std::path::PathBuf>,
    process: Option<u32>,
}

/// Seconds of each phase run again with the BPF run-time statistics on, for the XDP
/// program's own cost.
const SAMPLE_SECONDS: f64 = 1.0;

impl Options {
    /// These options for a run that samples the XDP program's own cost.
    fn sampling(&self) -> Options {
        Options {
            seconds: self.seconds.min(SAMPLE_SECONDS),
            ..self.clone()
        }
    }
}

impl OwnCost {
    /// HAProxy's process CPU so far, ns.
    fn read_process(&self) -> Result<Option<u64>> {
        match (&self.program, self.process) {
            (None, Some(pid)) => Ok(Some(super::process_cpu_ns(pid)?)),
            _ => Ok(None),
        }
    }

    /// The XDP program's run time per run while `run` runs, with the kernel's BPF run-time
    /// statistics on only meanwhile. The statistics read the clock twice per program run,
    /// which on this VM's paravirtual clock took about 2% of the host's CPU under the
    /// connection load: on during the measured phases, they slowed our peers and no other.
    fn sample_program(&self, run: impl FnOnce() -> Result<()>) -> Result<Option<f64>> {
        let Some(path) = &self.program else {
            return Ok(None);
        };
        let read = || -> Result<(u64, u64)> {
            let info = aya::programs::ProgramInfo::from_pin(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Ok((info.run_time().as_nanos() as u64, info.run_count()))
        };
        // The fd turns the statistics off when dropped.
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .context("enabling BPF run-time statistics")?;
        let (t0, n0) = read()?;
        run()?;
        let (t1, n1) = read()?;
        drop(stats);
        Ok((n1 > n0).then(|| (t1 - t0) as f64 / (n1 - n0) as f64))
    }
}

/// One phase of the project's own load, with the host's and the peer's CPU per packet.
fn measured_phase(
    topo: &Topology,
    opts: &Options,
    target: &[IpAddr],
    load: Load,
    own: &OwnCost,
) -> Result<Phase> {
    let cpu0 = host_cpu()?;
    let pkts0 = client_tx_packets(&topo.client)?;
    let own0 = own.read_process()?;
    let (rate, errors, mut lat) = run_phase(topo, opts, target, load)?;
    let own1 = own.read_process()?;
    let pkts1 = client_tx_packets(&topo.client)?;
    let cpu1 = host_cpu()?;
    let packets = pkts1.saturating_sub(pkts0).max(1);
    let (busy_ns, total_ns) = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
    let own_ns_per_packet = match (own0, own1) {
        // HAProxy: process CPU over the client's packets it relayed.
        (Some(t0), Some(t1)) => Some((t1 - t0) as f64 / packets as f64),
        // XDP: run time over runs, sampled apart.
        _ => own.sample_program(|| run_phase(topo, &opts.sampling(), target, load).map(|_| ()))?,
    };
    lat.sort_unstable();
    Ok(Phase {
        rate,
        errors,
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        host_ns_per_packet: busy_ns as f64 / packets as f64,
        own_ns_per_packet,
        busy: busy_ns as f64 / total_ns.max(1) as f64,
    })
}

/// `wrk` with the phase's connections (split over the targets, one `wrk` each, at once): new
/// connections per second (summed), the worst p50 and p99, errors.
fn wrk_phase(topo: &Topology, opts: &Options, targets: &[IpAddr]) -> Result<Phase> {
    let per_target = (opts.connections / targets.len()).max(1);
    let client = &topo.client;
    let results: Vec<Result<balancer_tests::generators::WrkResult>> = std::thread::scope(|scope| {
        let runs: Vec<_> = targets
            .iter()
            .map(|&t| {
                scope.spawn(move || {
                    balancer_tests::generators::wrk(client, t, HTTP_PORT, per_target, opts.seconds)
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| {
                r.join()
                    .map_err(|_| anyhow::anyhow!("a wrk thread panicked"))?
            })
            .collect()
    });
    let mut phase = Phase::default();
    for r in results {
        let r = r?;
        phase.rate += r.requests_per_s;
        phase.errors += r.errors;
        phase.p50_us = phase.p50_us.max(r.p50_us);
        phase.p99_us = phase.p99_us.max(r.p99_us);
    }
    Ok(phase)
}

/// `trafgen` blasting 64-byte UDP frames (18 bytes of payload) at the targets for the phase's
/// length: the rate at which they reached the backends' links, and how many did not.
fn trafgen_phase(topo: &Topology, opts: &Options, peer: Peer, targets: &[IpAddr]) -> Result<Phase> {
    let mac_of = |ns: &Netns, addr: IpAddr| -> Result<[u8; 6]> {
        // One ping resolves it if the warm-up did not.
        ns.exec(&["ping", "-c", "1", "-W", "1", &addr.to_string()])?;
        let out = ns.exec(&["ip", "-j", "neigh", "show", &addr.to_string()])?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let text = v[0]["lladdr"]
            .as_str()
            .with_context(|| format!("no neighbour entry for {addr} in {}", ns.name()))?;
        Ok(text
            .parse::<balancer::base::net::MacAddr>()
            .map_err(anyhow::Error::msg)?
            .0)
    };
    let own_mac = {
        let out = topo.client.exec(&["ip", "-j", "link", "show", "eth0"])?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let text = v[0]["address"]
            .as_str()
            .context("the client's MAC")?
            .to_string();
        text.parse::<balancer::base::net::MacAddr>()
            .map_err(anyhow::Error::msg)?
            .0
    };
    // Direct to the backends (baseline), else through the balancer's address (the router
    // peer routes the backends' addresses, the rest the VIP).
    let mut udp_targets = Vec::new();
    for t in targets {
        let IpAddr::V4(dst) = *t else {
            bail!("trafgen targets are IPv4");
        };
        let mac = if peer == Peer::Baseline {
            mac_of(&topo.client, *t)?
        } else {
            mac_of(&topo.client, LB4.into())?
        };
        udp_targets.push(balancer_tests::generators::UdpTarget { mac, dst });
    }
    let config =
        balancer_tests::generators::trafgen_config(own_mac, CLIENT4, &udp_targets, UDP_PORT, 18);
    let path = topo.rack.log_dir.join("trafgen.cfg");
    std::fs::write(&path, config)?;
    let received = |topo: &Topology| -> Result<u64> {
        let mut sum = 0;
        for b in &topo.backends {
            sum += link_packets(b, "rx")?;
        }
        Ok(sum)
    };
    let (sent0, got0) = (client_tx_packets(&topo.client)?, received(topo)?);
    let cpu0 = host_cpu()?;
    let started = Instant::now();
    let restarts = balancer_tests::generators::trafgen(
        &topo.client,
        "eth0",
        &path,
        Duration::from_secs_f64(opts.seconds),
    )?;
    let elapsed = started.elapsed().as_secs_f64();
    if restarts > 0 {
        println!("    trafgen gave up and was started again {restarts} times");
    }
    let cpu1 = host_cpu()?;
    let (sent, got) = (
        client_tx_packets(&topo.client)?.saturating_sub(sent0),
        received(topo)?.saturating_sub(got0),
    );
    Ok(Phase {
        rate: got as f64 / elapsed,
        errors: sent.saturating_sub(got),
        host_ns_per_packet: (cpu1.0 - cpu0.0) as f64 / sent.max(1) as f64,
        busy: (cpu1.0 - cpu0.0) as f64 / (cpu1.1 - cpu0.1).max(1) as f64,
        ..Phase::default()
    })
}

/// (busy, total) CPU time of the host in ns, from /proc/stat.
fn host_cpu() -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 8 {
        bail!("unexpected /proc/stat line {line:?}");
    }
    let tick_ns = 1_000_000_000 / super::clock_ticks();
    // user nice system idle iowait irq softirq steal
    let idle = v[3] + v[4];
    let total: u64 = v[..8].iter().sum();
    Ok(((total - idle) * tick_ns, total * tick_ns))
}

/// Packets the client namespace's eth0 sent.
fn client_tx_packets(client: &Netns) -> Result<u64> {
    link_packets(client, "tx")
}

/// Packets `ns`'s eth0 sent (`"tx"`) or received (`"rx"`).
fn link_packets(ns: &Netns, way: &str) -> Result<u64> {
    let out =
        balancer_tests::netns::run("ip", &["-n", ns.name(), "-s", "-j", "link", "show", "eth0"])?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("ip -j link output")?;
    v[0]["stats64"][way]["packets"]
        .as_u64()
        .with_context(|| format!("no {way} packet count in `ip -s -j link`"))
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests;
