//! End-to-end through network namespaces (needs root): a client, the balancer and three
//! backends on one bridge; real TCP and UDP through the VIP in every forwarding mode, in
//! native and skb attach modes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use balancer::base::config::AttachMode;
use balancer::state::wire::Status;
use balancer_tests::configs::to_toml;
use balancer_tests::topology::*;
use balancer_tests::traffic::{echo_stream, http_get, udp_request};

const TIMEOUT: Duration = Duration::from_secs(5);
/// A UDP port of the NAT racks' VIPs that no backend listens on.
const CLOSED_UDP_PORT: u16 = 5399;

struct Case {
    tag: &'static str,
    forwarding: &'static str,
    mode: AttachMode,
    /// The client on a link of its own (the balancer's `eth1`), the backends on `eth0`
    /// (`[nat] interface`).
    two_links: bool,
}

/// Builds the rack for `case` and starts the balancer (and decap for encapsulating modes).
fn rack(case: &Case) -> Topology {
    let mut opts = TopologyOptions::new(case.tag);
    opts.client_link = case.two_links;
    let encapsulates = matches!(case.forwarding, "ipip" | "gue");
    if encapsulates {
        // Room for the outer headers on the balancer's 1500-byte link.
        opts.client_mtu = 1400;
    }
    let mut topo = Topology::build(opts).expect("building the test rack");
    if case.mode == AttachMode::Native {
        topo.attach_peer_pass(case.mode)
            .expect("pass program on the balancer's peer");
    }
    if encapsulates {
        topo.start_decap(case.mode)
            .expect("starting decap on the backends");
    }
    if case.forwarding == "nat" {
        topo.unmodified_backends()
            .expect("backends without the VIP, routing replies through the balancer");
    }
    if case.forwarding == "snat" {
        topo.source_nat_backends()
            .expect("backends without the VIP and without a way to the client");
    }
    let mut config = rack_config(&topo, case.forwarding, case.mode);
    config.encap = rack_encap();
    if matches!(case.forwarding, "nat" | "snat") {
        // A UDP port no backend listens on: their port-unreachable errors must reach the
        // client translated (see `refused_udp_is_reported`).
        for (name, address) in [("closed4", IpAddr::from(VIP4)), ("closed6", VIP6.into())] {
            let mut v = config
                .vip
                .iter()
                .find(|v| {
                    v.name.as_deref() == Some(if address.is_ipv4() { "udp4" } else { "udp6" })
                })
                .expect("the rack's UDP VIP")
                .clone();
            v.name = Some(name.into());
            v.address = Some(address.to_string());
            v.port = Some(CLOSED_UDP_PORT.into());
            config.vip.push(v);
        }
    }
    topo.start_balancer(&to_toml(&config))
        .expect("starting the balancer");
    topo
}

/// 300 fresh connections: all succeed and every backend serves 20%..47% of them.
fn spread_over_backends(topo: &Topology, vip: IpAddr) {
    let addr = SocketAddr::new(vip, HTTP_PORT);
    let served = topo
        .client
        .run_in(move || -> Result<BTreeMap<String, usize>, String> {
            let mut served = BTreeMap::new();
            for i in 0..300 {
                let name =
                    http_get(addr, TIMEOUT).map_err(|e| format!("request {i} to {addr}: {e:#}"))?;
                *served.entry(name).or_insert(0) += 1;
            }
            Ok(served)
        })
        .expect("client thread")
        .unwrap_or_else(|e| panic!("{e}\n{}", topo.logs()));
    assert_eq!(
        served.len(),
        3,
        "expected 3 backends to serve {addr}, got {served:?}"
    );
    for (name, n) in &served {
        let share = *n as f64 / 300.0;
        assert!(
            (0.20..=0.47).contains(&share),
            "{name} served {n} of 300 requests to {addr} ({share:.2}): {served:?}"
        );
    }
    // The daemon's traffic counters (read once a second, every VIP's and backend's at once)
    // saw those connections: the VIP's new flows are its backends', each with its share.
    let mut counted = (0, Vec::new());
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let (code, out, err) = topo.cli(&["status", "--json"]).expect("balancer status");
        assert_eq!(code, 0, "balancer status failed: {err}");
        let status: Status = serde_json::from_str(&out).expect("status JSON");
        let v = status
            .vips
            .iter()
            .find(|v| v.address == vip && v.port == HTTP_PORT)
            .expect("the HTTP VIP in status");
        counted = (
            v.new_flows,
            v.backends.iter().map(|b| b.new_flows).collect::<Vec<u64>>(),
        );
        if counted.0 >= 300 && counted.1.iter().sum::<u64>() == counted.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (flows, per_backend) = counted;
    assert!(
        flows >= 300 && per_backend.iter().sum::<u64>() == flows,
        "{addr}: {flows} new flows counted, its backends {per_backend:?}"
    );
    assert!(
        per_backend.iter().all(|n| *n >= 60),
        "{addr}: backends' new flows {per_backend:?} of {flows}"
    );
}

fn udp_works(topo: &Topology, vip: IpAddr) {
    let addr = SocketAddr::new(vip, UDP_PORT);
    let reply = topo
        .client
        .run_in(move || udp_request(addr, "ping", TIMEOUT).map_err(|e| format!("{e:#}")))
        .expect("client thread")
        .unwrap_or_else(|e| panic!("UDP to {addr}: {e}\n{}", topo.logs()));
    assert!(
        reply.ends_with(":ping") && reply.starts_with('b'),
        "unexpected UDP reply {reply:?}"
    );
}

fn long_stream_works(topo: &Topology, vip: IpAddr) {
    let addr = SocketAddr::new(vip, ECHO_PORT);
    topo.client
        .run_in(move || {
            echo_stream(addr, 4 << 20, Duration::from_secs(20)).map_err(|e| format!("{e:#}"))
        })
        .expect("client thread")
        .unwrap_or_else(|e| panic!("4 MiB each way through {addr}: {e}\n{}", topo.logs()));
}

/// A TCP service on the balancer's own address still answers (not for a VIP: passed).
fn own_address_works(topo: &Topology) {
    let lb4 = topo.lb4();
    let listener = topo
        .lb
        .run_in(move || TcpListener::bind((lb4, 8080)))
        .expect("lb thread")
        .expect("bind on the balancer's address");
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).expect("read");
        s.write_all(b"pong!").expect("write");
    });
    let reply = topo
        .client
        .run_in(move || -> std::io::Result<String> {
            let mut s = TcpStream::connect_timeout(&SocketAddr::from((lb4, 8080)), TIMEOUT)?;
            s.set_read_timeout(Some(TIMEOUT))?;
            s.write_all(b"ping!")?;
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf).to_string())
        })
        .expect("client thread")
        .expect("TCP to the balancer's own address");
    assert_eq!(reply, "pong!");
    server.join().expect("server thread");
}

/// A NAT flow's ICMP error comes back translated: the backend's port unreachable, about a
/// datagram the client sent to the VIP, reaches the client's connected socket as "connection
/// refused" (the kernel matches the quoted packet to the socket: untranslated, it would not).
fn refused_udp_is_reported(topo: &Topology, vip: IpAddr) {
    let addr = SocketAddr::new(vip, CLOSED_UDP_PORT);
    let outcome = topo
        .client
        .run_in(move || match udp_request(addr, "anyone?", TIMEOUT) {
            Ok(reply) => format!("a reply {reply:?}"),
            Err(e) => match e.downcast_ref::<std::io::Error>().map(std::io::Error::kind) {
                Some(std::io::ErrorKind::ConnectionRefused) => "refused".into(),
                _ => format!("{e:#}"),
            },
        })
        .expect("client thread");
    assert_eq!(
        outcome,
        "refused",
        "UDP to {addr} (no listener behind it)\n{}",
        topo.logs()
    );
}

fn full_check(case: Case) {
    let mut topo = rack(&case);
    for vip in [IpAddr::from(VIP4), IpAddr::from(VIP6)] {
        spread_over_backends(&topo, vip);
        udp_works(&topo, vip);
        long_stream_works(&topo, vip);
        if matches!(case.forwarding, "nat" | "snat") {
            refused_udp_is_reported(&topo, vip);
        }
    }
    own_address_works(&topo);
    ping_works(&topo);
    churn_breaks_nothing(&mut topo, &case);
    if case.two_links {
        frames_crossed_between_the_links(&topo);
    }
}

/// On two links every NAT frame crossed to the other one: `balancer stats` counts them both
/// ways, and nothing went back out where it came in (`xdp_tx` stays 0: no VIP forwards
/// otherwise in this rack).
fn frames_crossed_between_the_links(topo: &Topology) {
    let (code, out, err) = topo.cli(&["stats", "--json"]).expect("cli");
    assert_eq!(code, 0, "{err}");
    let stats: serde_json::Value = serde_json::from_str(&out).expect("stats JSON");
    let counter = |name: &str| stats["counters"][name].as_u64().unwrap_or(0);
    for name in ["nat_redirect_to_backends", "nat_redirect_to_clients"] {
        assert!(counter(name) > 1000, "{name} = {}: {out}", counter(name));
    }
    assert_eq!(counter("xdp_tx"), 0, "{out}");
}

/// 50 long-lived TCP connections keep streaming (every byte checked) while the weights change,
/// a backend is removed and another is drained: none breaks — connections on other backends
/// keep theirs (connection table), those on the removed one keep it through its grace period,
/// those on the drained one keep it (a drain takes only new flows away).
fn churn_breaks_nothing(topo: &mut Topology, case: &Case) {
    const STREAMS: usize = 50;
    let until = std::time::Instant::now() + Duration::from_secs(4);
    let streams = topo
        .echo_streams(STREAMS, until, TIMEOUT)
        .expect("client threads");
    std::thread::sleep(Duration::from_millis(1000));
    let weighted = |topo: &Topology, weights: &[Option<u32>]| {
        let mut config = rack_config_weighted(topo, case.forwarding, case.mode, weights);
        config.encap = rack_encap();
        to_toml(&config)
    };
    let reweighted = weighted(topo, &[Some(5), Some(1), Some(2)]);
    topo.reload_balancer(&reweighted).expect("weight change");
    std::thread::sleep(Duration::from_millis(1000));
    let removed = weighted(topo, &[Some(5), Some(1), None]);
    topo.reload_balancer(&removed).expect("backend removal");
    std::thread::sleep(Duration::from_millis(500));
    // The operator's drain of host b2: both its addresses, every VIP, one command each.
    for address in [backend4(1).to_string(), backend6(1).to_string()] {
        let (code, _, err) = topo
            .cli(&["backend", "drain", "--everywhere", &address])
            .expect("cli");
        assert_eq!(code, 0, "draining {address}: {err}");
    }
    let per_backend = join_streams(streams, "during weight change / backend removal / drain")
        .unwrap_or_else(|e| panic!("{e:#}\n{}", topo.logs()))
        .per_backend;
    for (backend, what) in [("b3", "removed"), ("b2", "drained")] {
        assert!(
            per_backend.contains_key(backend),
            "no stream was on the {what} backend {backend}: {per_backend:?}"
        );
    }
    // New connections avoid the removed and the drained backend.
    for _ in 0..30 {
        let name = topo
            .client
            .run_in(|| {
                http_get(SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT)
                    .map_err(|e| format!("{e:#}"))
            })
            .expect("client thread")
            .expect("request after removal");
        assert!(
            name != "b3" && name != "b2",
            "a new connection reached {name}, removed or drained"
        );
    }
}

/// ICMP to the balancer's own addresses still gets answers (and ARP/ND resolved them): one
/// answer within 5 s (IPv6 duplicate address detection may hold the first echo back).
fn ping_works(topo: &Topology) {
    for target in [topo.lb4().to_string(), topo.lb6().to_string()] {
        topo.client
            .exec(&["ping", "-c", "1", "-w", "5", "-i", "0.2", &target])
            .unwrap_or_else(|e| panic!("ping {target} from the client: {e:#}"));
    }
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn source_nat_native() {
    full_check(Case {
        tag: "snatn",
        forwarding: "snat",
        mode: AttachMode::Native,
        two_links: false,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn source_nat_skb() {
    full_check(Case {
        tag: "snats",
        forwarding: "snat",
        mode: AttachMode::Skb,
        two_links: false,
    });
}

/// NAT with the backends on another link than the clients (`[nat] interface`): the program
/// runs on both and moves each frame to the other link; both return-path variants, native
/// mode (each link's peer has a pass program, as `XDP_REDIRECT` into a veth needs).
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn nat_on_two_links_native() {
    full_check(Case {
        tag: "nat2l",
        forwarding: "nat",
        mode: AttachMode::Native,
        two_links: true,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn source_nat_on_two_links_skb() {
    full_check(Case {
        tag: "snat2l",
        forwarding: "snat",
        mode: AttachMode::Skb,
        two_links: true,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn nat_native() {
    full_check(Case {
        tag: "natn",
        forwarding: "nat",
        mode: AttachMode::Native,
        two_links: false,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn nat_skb() {
    full_check(Case {
        tag: "nats",
        forwarding: "nat",
        mode: AttachMode::Skb,
        two_links: false,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn l2_dsr_native() {
    full_check(Case {
        tag: "dsrn",
        forwarding: "l2-dsr",
        mode: AttachMode::Native,
        two_links: false,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn l2_dsr_skb() {
    full_check(Case {
        tag: "dsrs",
        forwarding: "l2-dsr",
        mode: AttachMode::Skb,
        two_links: false,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn ipip_native() {
    full_check(Case {
        tag: "ipipn",
        forwarding: "ipip",
        mode: AttachMode::Native,
        two_links: false,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn ipip_skb() {
    full_check(Case {
        tag: "ipips",
        forwarding: "ipip",
        mode: AttachMode::Skb,
        two_links: false,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn gue_native() {
    full_check(Case {
        tag: "guen",
        forwarding: "gue",
        mode: AttachMode::Native,
        two_links: false,
    });
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn gue_skb() {
    full_check(Case {
        tag: "gues",
        forwarding: "gue",
        mode: AttachMode::Skb,
        two_links: false,
    });
}

/// With the client on a full 1500-byte link, its full-size segments no longer fit once
/// encapsulated: the balancer answers with ICMP fragmentation-needed / packet-too-big, the
/// client lowers its path MTU, and a 4 MiB-each-way stream still completes.
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn path_mtu_discovery_through_an_encapsulating_balancer() {
    let mut topo = Topology::build(TopologyOptions::new("pmtu")).expect("building the test rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    topo.start_decap(AttachMode::Native).expect("decap");
    let mut config = rack_config(&topo, "ipip", AttachMode::Native);
    config.encap = rack_encap();
    topo.start_balancer(&to_toml(&config))
        .expect("starting the balancer");
    for vip in [IpAddr::from(VIP4), IpAddr::from(VIP6)] {
        long_stream_works(&topo, vip);
    }
    // The daemon logs its counters at exit: the client can only have learnt the smaller path
    // MTU from the balancer's ICMP answers.
    let balancer = topo.process("balancer").expect("balancer process");
    balancer
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(10))
        .expect("balancer exit");
    let log = balancer.log_text();
    let sent: u64 = log
        .split_whitespace()
        .find_map(|w| w.strip_prefix("icmp_too_big_sent="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        sent > 0,
        "no ICMP too-big was sent, yet the stream passed:\n{log}"
    );
}

/// The benchmark's independent generators (`bench e2e`) work through the balancer, so they do
/// not rot between benchmark runs: wrk's new connections all answered, trafgen's small UDP
/// packets reach the backends.
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn independent_generators_drive_the_balancer() {
    use balancer_tests::generators::{UdpTarget, trafgen, trafgen_config, wrk};
    let topo = rack(&Case {
        tag: "gens",
        forwarding: "l2-dsr",
        mode: AttachMode::Native,
        two_links: false,
    });
    let r = wrk(&topo.client, VIP4.into(), HTTP_PORT, 4, 1.0).expect("wrk");
    assert!(
        r.requests_per_s > 10.0 && r.errors == 0,
        "wrk through the balancer: {r:?}"
    );
    let rx = |topo: &Topology| -> u64 {
        topo.backends
            .iter()
            .map(|b| {
                let out = b
                    .exec(&["cat", "/sys/class/net/eth0/statistics/rx_packets"])
                    .unwrap();
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum()
    };
    let mac = |ns: &balancer_tests::netns::Netns, what: &str| -> [u8; 6] {
        let out = ns.sh(what).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        text.parse::<balancer::base::net::MacAddr>().unwrap().0
    };
    let own = mac(&topo.client, "cat /sys/class/net/eth0/address");
    let lb = mac(&topo.lb, "cat /sys/class/net/eth0/address");
    let config = trafgen_config(
        own,
        CLIENT4,
        &[UdpTarget { mac: lb, dst: VIP4 }],
        UDP_PORT,
        18,
    );
    let path = topo.rack.log_dir.join("trafgen.cfg");
    std::fs::write(&path, config).unwrap();
    let before = rx(&topo);
    trafgen(&topo.client, "eth0", &path, Duration::from_secs(1)).expect("trafgen");
    let arrived = rx(&topo) - before;
    assert!(arrived > 1000, "{arrived} packets reached the backends");
}
