//! `bench e2e`: the balancer against the peers an operator already runs, in the same rack.
//!
//! One peer at a time sits between the client and three backends: the balancer's XDP program
//! (native and generic/skb mode, L2 DSR), the kernel's nftables DNAT load balancing as
//! kube-proxy's nftables mode writes it (`numgen random` for TCP, `jhash` for UDP, replies
//! routed back through the balancer namespace for un-NAT), HAProxy in TCP mode, and a
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
//!   where it is separable: the XDP program's run time per packet (BPF run-time stats) and
//!   HAProxy's process time per packet. nftables' cost is spread over softirqs and only shows
//!   in the host figure.
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
            the balancer (XDP native and skb, L2 DSR; NAT; NAT with source NAT), nftables DNAT \
            as kube-proxy writes it (and with masquerade), HAProxy in TCP mode. Medians over \
            interleaved rounds, a fresh rack each; ratios against another peer are listed below \
            the table.",
    columns: &[
        ("_baseline", "no balancer"),
        ("_router", "router"),
        ("_balancer", "balancer"),
        ("_balancer_skb", "balancer skb"),
        ("_balancer_nat", "balancer NAT"),
        ("_balancer_snat", "balancer SNAT"),
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
    Nftables,
    /// nftables DNAT plus masquerade (source NAT), the backends routing nothing through it.
    NftablesSnat,
    Haproxy,
}

impl Peer {
    pub const ALL: [Peer; 9] = [
        Peer::Baseline,
        Peer::Router,
        Peer::XdpNative,
        Peer::XdpSkb,
        Peer::XdpNat,
        Peer::XdpSnat,
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
    // BPF run-time statistics while the benchmark runs (the fd turns them off when dropped).
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enabling BPF run-time statistics")?;
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
    let mut own_process: Option<u32> = None;
    match peer {
        Peer::Baseline => {}
        Peer::Router => setup_router(&topo)?,
        Peer::XdpNative | Peer::XdpSkb => {
            let mode = if peer == Peer::XdpNative {
                AttachMode::Native
            } else {
                AttachMode::Skb
            };
            if mode == AttachMode::Native {
                topo.attach_peer_pass(mode)?;
            }
            let config = bench_config(rack_config(&topo, "l2-dsr", mode));
            topo.start_balancer(&to_toml(&config))?;
        }
        Peer::XdpNat => {
            topo.attach_peer_pass(AttachMode::Native)?;
            topo.unmodified_backends()?;
            let config = bench_config(rack_config(&topo, "nat", AttachMode::Native));
            topo.start_balancer(&to_toml(&config))?;
        }
        Peer::XdpSnat => {
            topo.attach_peer_pass(AttachMode::Native)?;
            topo.source_nat_backends()?;
            let config = bench_config(rack_config(&topo, "snat", AttachMode::Native));
            topo.start_balancer(&to_toml(&config))?;
        }
        Peer::Nftables => setup_nftables(&topo, false)?,
        Peer::NftablesSnat => setup_nftables(&topo, true)?,
        Peer::Haproxy => own_process = Some(start_haproxy(&mut topo)?),
    }
    tune(&topo)?;
    if opts.pin {
        pin(&topo, cpus)?;
    }
    let program = matches!(
        peer,
        Peer::XdpNative | Peer::XdpSkb | Peer::XdpNat | Peer::XdpSnat
    )
    .then(|| balancer::dataplane::pinning::Pins::new(topo.pin_dir()).program());
    // (CPU ns, runs) of the peer itself, where separable.
    let own = || -> Result<Option<(u64, u64)>> {
        match (&program, own_process) {
            (Some(path), _) => {
                let info = aya::programs::ProgramInfo::from_pin(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                Ok(Some((info.run_time().as_nanos() as u64, info.run_count())))
            }
            (None, Some(pid)) => Ok(Some((super::process_cpu_ns(pid)?, 0))),
            (None, None) => Ok(None),
        }
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
        let cpu0 = host_cpu()?;
        let pkts0 = client_tx_packets(&topo.client)?;
        let own0 = own()?;
        let (rate, errors, mut lat) = run_phase(&topo, opts, &target, load)?;
        let own1 = own()?;
        let pkts1 = client_tx_packets(&topo.client)?;
        let cpu1 = host_cpu()?;
        let packets = pkts1.saturating_sub(pkts0).max(1);
        let (busy_ns, total_ns) = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
        let own_ns_per_packet = match (own0, own1) {
            // XDP: run time over runs (packets the program saw, both directions it sees).
            (Some((t0, n0)), Some((t1, n1))) if program.is_some() && n1 > n0 => {
                Some((t1 - t0) as f64 / (n1 - n0) as f64)
            }
            // HAProxy: process CPU over the client's packets it relayed.
            (Some((t0, _)), Some((t1, _))) if program.is_none() => {
                Some((t1 - t0) as f64 / packets as f64)
            }
            _ => None,
        };
        lat.sort_unstable();
        phases.push(Some(Phase {
            rate,
            errors,
            p50_us: percentile(&lat, 0.50),
            p99_us: percentile(&lat, 0.99),
            host_ns_per_packet: busy_ns as f64 / packets as f64,
            own_ns_per_packet,
            busy: busy_ns as f64 / total_ns.max(1) as f64,
        }));
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
        let own0 = own()?;
        let mut phase = trafgen_phase(&topo, opts, peer, &target)?;
        if let (Some((t0, n0)), Some((t1, n1))) = (own0, own()?)
            && program.is_some()
            && n1 > n0
        {
            phase.own_ns_per_packet = Some((t1 - t0) as f64 / (n1 - n0) as f64);
        }
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

/// The rack's config with a connection table of a production size: the rack's own (64 Ki
/// flows, small for tests) would thrash under trafgen's 64,000 flows, a limit none of the
/// peers has (nftables' conntrack holds 256 Ki).
fn bench_config(
    mut config: balancer::base::config::RawConfig,
) -> balancer::base::config::RawConfig {
    config.conntrack.max_flows = Some(1 << 20);
    config
}

fn peer_tag(peer: Peer) -> &'static str {
    match peer {
        Peer::Baseline => "base",
        Peer::Router => "rtr",
        Peer::XdpNative => "xdp",
        Peer::XdpSkb => "skb",
        Peer::XdpNat => "nat",
        Peer::XdpSnat => "snat",
        Peer::Nftables => "nft",
        Peer::NftablesSnat => "nfts",
        Peer::Haproxy => "hap",
    }
}

/// Connection limits no peer should hit: a wide ephemeral range and TIME_WAIT reuse.
fn tune(topo: &Topology) -> Result<()> {
    for ns in [&topo.client, &topo.lb] {
        ns.sh(
            "sysctl -qw net.ipv4.ip_local_port_range='1024 65535' net.ipv4.tcp_tw_reuse=1 \
             net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096",
        )?;
    }
    for b in &topo.backends {
        b.sh("sysctl -qw net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096")?;
    }
    Ok(())
}

/// nftables DNAT in the balancer namespace, as kube-proxy's nftables mode balances: a random
/// backend per new TCP connection, a hash of the source for UDP. The backends route replies to
/// the client through the balancer namespace so conntrack can undo the NAT; with `masquerade`
/// the translated flows leave from the balancer's address instead (source NAT, as kube-proxy
/// does for traffic that would not come back), and the backends route nothing through it.
fn setup_nftables(topo: &Topology, masquerade: bool) -> Result<()> {
    let map = (0..topo.backends.len())
        .map(|i| format!("{i} : {}", backend4(i)))
        .collect::<Vec<_>>()
        .join(", ");
    let n = topo.backends.len();
    let ruleset = format!(
        "table ip blt_lb {{\n\
         \x20 chain prerouting {{\n\
         \x20   type nat hook prerouting priority dstnat; policy accept;\n\
         \x20   ip daddr {VIP4} tcp dport {{ {HTTP_PORT}, 9000 }} dnat to numgen random mod {n} map {{ {map} }}\n\
         \x20   ip daddr {VIP4} udp dport {UDP_PORT} dnat to jhash ip saddr . udp sport mod {n} seed 0x5eed map {{ {map} }}\n\
         \x20 }}\n\
         {postrouting}\
         }}\n",
        postrouting = if masquerade {
            "  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n    ct status dnat masquerade\n  }\n"
        } else {
            ""
        }
    );
    let path = topo.rack.log_dir.join("nftables.conf");
    std::fs::write(&path, ruleset)?;
    topo.lb.sh(&format!(
        "sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0 \
           net.ipv4.conf.eth0.send_redirects=0 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0; \
         nft -f {}",
        path.display()
    ))
    .context("loading the nftables ruleset")?;
    if masquerade {
        topo.source_nat_backends()?;
        return Ok(());
    }
    for b in &topo.backends {
        b.sh(&format!(
            "ip route add {CLIENT4}/32 via {LB4}; sysctl -qw net.ipv4.conf.all.accept_redirects=0"
        ))?;
    }
    Ok(())
}

/// The balancer namespace forwards the client's packets to the backends' own addresses; the
/// backends answer the client directly.
fn setup_router(topo: &Topology) -> Result<()> {
    topo.lb.sh(
        "sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0 \
           net.ipv4.conf.eth0.send_redirects=0 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0",
    )?;
    for i in 0..topo.backends.len() {
        topo.client
            .sh(&format!("ip route add {}/32 via {LB4}", backend4(i)))?;
    }
    topo.client.sh(
        "sysctl -qw net.ipv4.conf.all.accept_redirects=0 net.ipv4.conf.eth0.accept_redirects=0",
    )?;
    Ok(())
}

/// HAProxy in TCP mode on the VIP in the balancer namespace (round robin); returns its pid.
fn start_haproxy(topo: &mut Topology) -> Result<u32> {
    let servers = |port: u16| {
        (0..topo.backends.len())
            .map(|i| format!("  server b{} {}:{port}\n", i + 1, backend4(i)))
            .collect::<String>()
    };
    let config = format!(
        "global\n  maxconn 8000\n\n\
         defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 30s\n  timeout server 30s\n\n\
         frontend http\n  bind {VIP4}:{HTTP_PORT}\n  default_backend http\n\n\
         backend http\n  balance roundrobin\n{}\n\
         frontend echo\n  bind {VIP4}:9000\n  default_backend echo\n\n\
         backend echo\n  balance roundrobin\n{}",
        servers(HTTP_PORT),
        servers(9000)
    );
    let path = topo.rack.log_dir.join("haproxy.cfg");
    std::fs::write(&path, config)?;
    topo.lb.sh(&format!("ip addr add {VIP4}/32 dev lo"))?;
    let argv = ["haproxy", "-db", "-f", path.to_str().unwrap_or_default()];
    let p = Process::spawn(&topo.lb, "haproxy", &argv, &topo.rack.log_dir)?;
    let pid = p.pid();
    topo.rack.processes.push(p);
    // Ready when it accepts.
    let until = Instant::now() + Duration::from_secs(10);
    let addr = SocketAddr::new(VIP4.into(), HTTP_PORT);
    loop {
        let ok = topo.client.run_in(move || {
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        })?;
        if ok {
            break;
        }
        if Instant::now() > until {
            bail!("haproxy did not start:\n{}", topo.logs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // With -db HAProxy stays one foreground process (its threads included in its CPU time).
    Ok(pid)
}

/// `--pin`: servers, HAProxy and receive processing on CPUs 0..n-1, the generator on n-1.
fn pin(topo: &Topology, cpus: usize) -> Result<()> {
    let others = format!("0-{}", cpus - 2);
    let mask = format!("{:x}", (1u64 << (cpus - 1)) - 1);
    for p in &topo.rack.processes {
        balancer_tests::netns::run("taskset", &["-a", "-pc", &others, &p.pid().to_string()])?;
    }
    for ns in std::iter::once(&topo.lb).chain(topo.backends.iter()) {
        ns.sh(&format!(
            "for q in /sys/class/net/eth0/queues/rx-*; do echo {mask} > $q/rps_cpus; done"
        ))?;
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    Connections,
    KeepAlive,
    Udp,
}

/// Runs one phase from the client namespace: (operations per second, errors, latencies µs).
fn run_phase(
    topo: &Topology,
    opts: &Options,
    targets: &[IpAddr],
    load: Load,
) -> Result<(f64, u64, Vec<u32>)> {
    let duration = Duration::from_secs_f64(opts.seconds);
    let workers = match load {
        Load::Udp => opts.udp_sockets,
        _ => opts.connections,
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin_cpu = opts.pin.then_some(cpus - 1);
    let window = opts.udp_window;
    let start = Instant::now() + Duration::from_millis(50);
    let mut handles = Vec::new();
    for w in 0..workers {
        // Worker w starts on target w and (new connections) rotates through them.
        let mut targets = targets.to_vec();
        let first = w % targets.len();
        targets.rotate_left(first);
        handles.push(topo.client.spawn_in(move || {
            if let Some(cpu) = pin_cpu {
                pin_thread(cpu);
            }
            while Instant::now() < start {
                std::thread::sleep(Duration::from_millis(1));
            }
            let until = start + duration;
            match load {
                Load::Connections => connections(&targets, until),
                Load::KeepAlive => keepalive(targets[0], until),
                Load::Udp => udp(targets[0], until, window, w),
            }
        })?);
    }
    let (mut ops, mut errors, mut lat) = (0u64, 0u64, Vec::new());
    for h in handles {
        let w = h
            .join()
            .map_err(|_| anyhow::anyhow!("a generator thread panicked"))???;
        ops += w.ops;
        errors += w.errors;
        lat.extend(w.latencies_us);
    }
    Ok((ops as f64 / duration.as_secs_f64(), errors, lat))
}

#[derive(Default)]
struct Worker {
    ops: u64,
    errors: u64,
    latencies_us: Vec<u32>,
}

const REQUEST_CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n";
const REQUEST_KEEP: &[u8] = b"GET / HTTP/1.1\r\nHost: vip\r\n\r\n";
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// One request per connection until `until`, to each of `targets` in turn.
fn connections(targets: &[IpAddr], until: Instant) -> Result<Worker> {
    let mut w = Worker::default();
    let mut buf = [0u8; 1024];
    for target in targets.iter().cycle() {
        if Instant::now() >= until {
            break;
        }
        let addr = SocketAddr::new(*target, HTTP_PORT);
        let t = Instant::now();
        let ok = (|| -> std::io::Result<bool> {
            let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_nodelay(true)?;
            s.write_all(REQUEST_CLOSE)?;
            let mut got = Vec::new();
            loop {
                match s.read(&mut buf)? {
                    0 => break,
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
            Ok(got.starts_with(b"HTTP/1.1 200"))
        })();
        match ok {
            Ok(true) => {
                w.ops += 1;
                w.latencies_us.push(t.elapsed().as_micros() as u32);
            }
            _ => w.errors += 1,
        }
    }
    Ok(w)
}

/// Requests on one keep-alive connection until `until` (reconnecting after an error).
fn keepalive(target: IpAddr, until: Instant) -> Result<Worker> {
    let addr = SocketAddr::new(target, HTTP_PORT);
    let mut w = Worker::default();
    while Instant::now() < until {
        let Ok(mut s) = TcpStream::connect_timeout(&addr, IO_TIMEOUT) else {
            w.errors += 1;
            continue;
        };
        let _ = s.set_read_timeout(Some(IO_TIMEOUT));
        let _ = s.set_nodelay(true);
        let mut pending = Vec::with_capacity(1024);
        let mut buf = [0u8; 1024];
        while Instant::now() < until {
            let t = Instant::now();
            if s.write_all(REQUEST_KEEP).is_err() {
                w.errors += 1;
                break;
            }
            match read_response(&mut s, &mut pending, &mut buf) {
                Ok(()) => {
                    w.ops += 1;
                    w.latencies_us.push(t.elapsed().as_micros() as u32);
                }
                Err(_) => {
                    w.errors += 1;
                    break;
                }
            }
        }
        let _ = s.shutdown(Shutdown::Both);
    }
    Ok(w)
}

/// Reads one HTTP response (head with Content-Length, then the body).
fn read_response(s: &mut TcpStream, pending: &mut Vec<u8>, buf: &mut [u8]) -> std::io::Result<()> {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| std::io::Error::other("no content-length"))?;
            let total = end + 4 + length;
            if pending.len() >= total {
                if !pending.starts_with(b"HTTP/1.1 200") {
                    return Err(std::io::Error::other("not 200"));
                }
                pending.drain(..total);
                return Ok(());
            }
        }
        match s.read(buf)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// Small datagrams with `window` in flight; a reply releases the next one. Lost ones are
/// counted as errors when the socket goes quiet.
fn udp(target: IpAddr, until: Instant, window: usize, worker: usize) -> Result<Worker> {
    let sock = UdpSocket::bind(SocketAddr::new(CLIENT4.into(), 0))?;
    sock.connect(SocketAddr::new(target, UDP_PORT))?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    let payload = format!("e2e-{worker:04}-0123456789abcdef");
    let mut w = Worker::default();
    let mut buf = [0u8; 256];
    let mut in_flight = 0usize;
    while Instant::now() < until {
        while in_flight < window {
            sock.send(payload.as_bytes())?;
            in_flight += 1;
        }
        match sock.recv(&mut buf) {
            Ok(_) => {
                w.ops += 1;
                in_flight -= 1;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                w.errors += in_flight as u64;
                in_flight = 0;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(w)
}

fn pin_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET and sched_setaffinity on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)])
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

/// Median and spread (max − min) of one figure over the rounds.
fn stat(rounds: &[Round], f: impl Fn(&Round) -> Option<f64>) -> Option<(f64, f64)> {
    let v: Vec<f64> = rounds.iter().filter_map(&f).collect();
    if v.is_empty() {
        return None;
    }
    let (lo, hi) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    Some((median(&v), hi - lo))
}

fn report(opts: &Options, results: &BTreeMap<&'static str, Vec<Round>>) -> Figures {
    let mut figures = Figures::new();
    let base = results.get(Peer::Baseline.key());
    let base_of = |f: &dyn Fn(&Round) -> Option<f64>| base.and_then(|b| stat(b, f)).map(|s| s.0);
    type Getter = fn(&Round) -> Option<f64>;
    let columns: [(&str, &str, Getter); 12] = [
        ("conn_per_s", "conn/s", |r| Some(r.conn.rate)),
        ("keepalive_rps", "keep-alive req/s", |r| {
            Some(r.keepalive.rate)
        }),
        ("udp_pps", "UDP pps", |r| r.udp.as_ref().map(|u| u.rate)),
        ("conn_p50_us", "conn p50 µs", |r| Some(r.conn.p50_us)),
        ("conn_p99_us", "conn p99 µs", |r| Some(r.conn.p99_us)),
        ("keepalive_p50_us", "k-a p50 µs", |r| {
            Some(r.keepalive.p50_us)
        }),
        ("keepalive_p99_us", "k-a p99 µs", |r| {
            Some(r.keepalive.p99_us)
        }),
        ("host_cpu_ns_per_packet", "host CPU ns/pkt", |r| {
            Some(r.conn.host_ns_per_packet)
        }),
        ("own_cpu_ns_per_packet", "own ns/pkt", |r| {
            r.conn.own_ns_per_packet
        }),
        ("wrk_conn_per_s", "wrk conn/s", |r| Some(r.wrk.rate)),
        ("wrk_conn_p99_us", "wrk p99 µs", |r| Some(r.wrk.p99_us)),
        ("trafgen_udp_pps", "trafgen pps", |r| {
            r.trafgen.as_ref().map(|t| t.rate)
        }),
    ];
    println!();
    print!("{:<38}", "peer (median of rounds ± spread)");
    for (_, head, _) in &columns {
        print!(" {head:>18}");
    }
    println!();
    for peer in &opts.peers {
        let Some(rounds) = results.get(peer.key()) else {
            continue;
        };
        print!("{:<38}", peer.label());
        for (key, _, get) in &columns {
            match stat(rounds, get) {
                Some((m, spread)) => {
                    print!(" {:>18}", format!("{m:.0} ±{spread:.0}"));
                    figures.insert(format!("{key}_{}", peer.key()), m);
                }
                None => print!(" {:>18}", "n/a"),
            }
        }
        println!();
        if let Some(u) = stat(rounds, |r| r.udp.as_ref().and_then(|u| u.own_ns_per_packet)) {
            figures.insert(format!("udp_own_cpu_ns_per_packet_{}", peer.key()), u.0);
        }
        if let Some(u) = stat(rounds, |r| r.udp.as_ref().map(|u| u.host_ns_per_packet)) {
            figures.insert(format!("udp_host_cpu_ns_per_packet_{}", peer.key()), u.0);
        }
        let errors: u64 = rounds
            .iter()
            .map(|r| {
                r.conn.errors
                    + r.keepalive.errors
                    + r.udp.as_ref().map_or(0, |u| u.errors)
                    + r.wrk.errors
            })
            .sum();
        figures.insert(format!("errors_{}", peer.key()), errors as f64);
        if let Some(t) = stat(rounds, |r| {
            r.trafgen.as_ref().map(|t| {
                let sent = t.rate * opts.seconds + t.errors as f64;
                t.rate * opts.seconds / sent.max(1.0)
            })
        }) {
            figures.insert(format!("trafgen_delivered_fraction_{}", peer.key()), t.0);
        }
        if let Some(t) = stat(rounds, |r| {
            r.trafgen.as_ref().and_then(|t| t.own_ns_per_packet)
        }) {
            figures.insert(format!("trafgen_own_cpu_ns_per_packet_{}", peer.key()), t.0);
        }
        if let Some(b) = stat(rounds, |r| Some(r.conn.busy)) {
            figures.insert(format!("host_busy_fraction_{}", peer.key()), b.0);
        }
    }
    // Ratios to the baseline (higher is better for rates; for p99, baseline / peer so that
    // higher is better there too) and between peers.
    println!();
    println!(
        "ratios to the baseline (rates: peer / baseline; p99: baseline / peer; ≥ 0.95 is indistinguishable):"
    );
    for peer in opts.peers.iter().filter(|p| **p != Peer::Baseline) {
        // (the router row shows what the extra hop alone costs)
        let Some(rounds) = results.get(peer.key()) else {
            continue;
        };
        let mut line = format!("  {:<38}", peer.label());
        for (key, name, get, inverse) in [
            (
                "conn_per_s",
                "conn/s",
                (|r: &Round| Some(r.conn.rate)) as Getter,
                false,
            ),
            (
                "keepalive_rps",
                "keep-alive",
                |r| Some(r.keepalive.rate),
                false,
            ),
            ("udp_pps", "UDP", |r| r.udp.as_ref().map(|u| u.rate), false),
            ("conn_p99", "conn p99", |r| Some(r.conn.p99_us), true),
            ("wrk_conn_per_s", "wrk conn/s", |r| Some(r.wrk.rate), false),
            (
                "trafgen_udp_pps",
                "trafgen",
                |r| r.trafgen.as_ref().map(|t| t.rate),
                false,
            ),
        ] {
            match (stat(rounds, get), base_of(&get)) {
                (Some((m, _)), Some(b)) if m > 0.0 && b > 0.0 => {
                    let ratio = if inverse { b / m } else { m / b };
                    line.push_str(&format!(" {name} {ratio:.2}×"));
                    figures.insert(format!("{key}_ratio_{}_to_baseline", peer.key()), ratio);
                }
                _ => line.push_str(&format!(" {name} n/a")),
            }
        }
        println!("{line}");
    }
    // Each mode beside its fair peer.
    for (ours, theirs) in [
        (Peer::XdpNative, Peer::Nftables),
        (Peer::XdpNative, Peer::Haproxy),
        (Peer::XdpNat, Peer::Nftables),
        (Peer::XdpSnat, Peer::NftablesSnat),
    ] {
        for (key, name) in [
            ("conn_per_s", "conn/s"),
            ("udp_pps", "UDP pps"),
            ("wrk_conn_per_s", "wrk conn/s"),
            ("trafgen_udp_pps", "trafgen pps"),
        ] {
            if let (Some(&b), Some(&p)) = (
                figures.get(&format!("{key}_{}", ours.key())),
                figures.get(&format!("{key}_{}", theirs.key())),
            ) && p > 0.0
            {
                println!("  {} / {}: {name} {:.2}×", ours.key(), theirs.key(), b / p);
                figures.insert(
                    format!("{key}_ratio_{}_to_{}", ours.key(), theirs.key()),
                    b / p,
                );
            }
        }
    }
    println!();
    let busy = results
        .values()
        .flatten()
        .map(|r| r.conn.busy)
        .fold(0.0, f64::max);
    println!(
        "what saturates: the host was up to {:.0}% busy during the connection phase; the generator, \
         the backends' servers and all forwarding share {} CPU(s), so near 100% the machine, not the \
         balancer, is the limit.{}",
        busy * 100.0,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        if opts.pin {
            " Pinned: the generator ran on the last CPU; XDP on veth still runs in the sender's softirq, i.e. on the generator's CPU."
        } else {
            ""
        }
    );
    println!(
        "own ns/pkt: the XDP program's run time per run (BPF stats; it runs once per packet it sees) \
         or HAProxy's process CPU per client packet; nftables' cost is in softirqs and only shows \
         in host CPU ns/pkt (compare with the baseline)."
    );
    figures.insert("rounds".into(), opts.rounds as f64);
    figures.insert("pinned".into(), if opts.pin { 1.0 } else { 0.0 });
    figures.insert("seconds_per_phase".into(), opts.seconds);
    figures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_ranks() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn peers_round_trip_by_key() {
        for p in Peer::ALL {
            assert_eq!(Peer::by_key(p.key()), Some(p));
        }
        assert_eq!(Peer::by_key("ipvs"), None);
    }

    #[test]
    fn spread_is_max_minus_min() {
        let r = |rate| Round {
            conn: Phase {
                rate,
                ..Phase::default()
            },
            ..Round::default()
        };
        let (m, s) = stat(&[r(10.0), r(30.0), r(20.0)], |x| Some(x.conn.rate)).unwrap();
        assert_eq!((m, s), (20.0, 20.0));
    }
}
