//! The peers' setup in the rack: nftables DNAT (with masquerade for source NAT), the return route,
//! HAProxy, the host's tuning and CPU pinning.

use super::*;

/// The rack's config with a connection table of a production size: the rack's own (64 Ki
/// flows, small for tests) would thrash under trafgen's 64,000 flows, a limit none of the
/// peers has (nftables' conntrack holds 256 Ki).
pub(super) fn bench_config(
    mut config: balancer::base::config::RawConfig,
) -> balancer::base::config::RawConfig {
    config.conntrack.max_flows = Some(1 << 20);
    config
}

pub(super) fn peer_tag(peer: Peer) -> &'static str {
    match peer {
        Peer::Baseline => "base",
        Peer::Router => "rtr",
        Peer::XdpNative => "xdp",
        Peer::XdpSkb => "skb",
        Peer::XdpNat => "nat",
        Peer::XdpSnat => "snat",
        Peer::XdpSnatSkb => "snats",
        Peer::Nftables => "nft",
        Peer::NftablesSnat => "nfts",
        Peer::Haproxy => "hap",
    }
}

/// Connection limits no peer should hit: a wide ephemeral range and TIME_WAIT reuse.
pub(super) fn tune(topo: &Topology) -> Result<()> {
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
pub(super) fn setup_nftables(topo: &Topology, masquerade: bool) -> Result<()> {
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
pub(super) fn setup_router(topo: &Topology) -> Result<()> {
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
pub(super) fn start_haproxy(topo: &mut Topology) -> Result<u32> {
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
pub(super) fn pin(topo: &Topology, cpus: usize) -> Result<()> {
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
