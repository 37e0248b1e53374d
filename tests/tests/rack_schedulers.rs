//! Schedulers in the rack (needs root): the daemon's API and CLI switch a VIP's scheduler, and
//! real TCP connections from the client namespace show the distribution each promises.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use balancer::base::config::{AttachMode, RawPool, RawTier};
use balancer::state::wire::{Status, VipStatus};
use balancer_tests::configs::{backends, to_toml, vip, vip_mut};
use balancer_tests::topology::*;
use balancer_tests::traffic::{echo_open, http_get, http_get_from};

const TIMEOUT: Duration = Duration::from_secs(5);

fn rack(tag: &str) -> Topology {
    let mut topo = Topology::build(TopologyOptions::new(tag)).expect("building the test rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    let config = rack_config(&topo, "l2-dsr", AttachMode::Native);
    topo.start_balancer(&to_toml(&config))
        .expect("starting the balancer");
    topo
}

fn cli_ok(topo: &Topology, args: &[&str]) {
    let (code, out, err) = topo.cli(args).expect("cli");
    assert_eq!(code, 0, "balancer {args:?} failed: {out}{err}");
}

/// Sets http4's scheduler (`balancer vip set-scheduler http4 ARGS`); its status after.
fn set_http4_scheduler(topo: &Topology, args: &[&str]) -> VipStatus {
    let mut all = vec!["vip", "set-scheduler", "http4"];
    all.extend_from_slice(args);
    cli_ok(topo, &all);
    let s: Status = serde_json::from_str(&topo.cli(&["status", "--json"]).unwrap().1).unwrap();
    s.vips
        .into_iter()
        .find(|v| v.name == "http4")
        .expect("http4 in status")
}

/// `n` fresh HTTP connections to the IPv4 HTTP VIP: how many each backend served.
fn served(topo: &Topology, n: usize) -> BTreeMap<String, usize> {
    topo.client
        .run_in(move || {
            let mut served = BTreeMap::new();
            for i in 0..n {
                let name = http_get(SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT)
                    .map_err(|e| format!("connection {i}: {e:#}"))?;
                *served.entry(name).or_insert(0) += 1;
            }
            Ok::<_, String>(served)
        })
        .expect("client thread")
        .unwrap_or_else(|e| panic!("{e}\n{}", topo.logs()))
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn round_robin_and_weighted_round_robin_distribute_exactly() {
    let topo = rack("srr");
    let http4 = set_http4_scheduler(&topo, &["round-robin"]);
    assert_eq!(http4.scheduler, "round-robin");
    let n = 300;
    let got = served(&topo, n);
    println!("round robin, {n} connections: {got:?}");
    // A cursor per CPU: each backend is within one flow per CPU of its exact share.
    for (b, count) in &got {
        assert!(
            count.abs_diff(n / 3) <= cpus(),
            "round robin gave {b} {count} of {n} connections: {got:?}"
        );
    }

    cli_ok(
        &topo,
        &["vip", "set-scheduler", "http4", "weighted-round-robin"],
    );
    for (b, w) in [
        ("10.111.0.11", "3"),
        ("10.111.0.12", "1"),
        ("10.111.0.13", "2"),
    ] {
        cli_ok(&topo, &["backend", "set-weight", "http4", b, w]);
    }
    let n = 3000;
    let got = served(&topo, n);
    println!("weighted round robin 3:1:2, {n} connections: {got:?}");
    for (b, want) in [("b1", 0.5), ("b2", 1.0 / 6.0), ("b3", 1.0 / 3.0)] {
        let share = got.get(b).copied().unwrap_or(0) as f64 / n as f64;
        assert!(
            (share - want).abs() <= 0.03 * want,
            "{b} served {share:.4} of new flows, its weight share is {want:.4}: {got:?}"
        );
    }
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn least_conn_fills_the_backend_with_fewest_active_connections() {
    let topo = rack("slc");
    cli_ok(&topo, &["vip", "set-scheduler", "echo4", "least-conn"]);
    let addr = SocketAddr::new(VIP4.into(), ECHO_PORT);
    let (names, kept) = topo
        .client
        .run_in(move || {
            // Six open connections: two per backend.
            let open: Vec<_> = (0..6).map(|_| echo_open(addr, TIMEOUT).unwrap()).collect();
            let mut per = BTreeMap::new();
            for (name, _) in &open {
                *per.entry(name.clone()).or_insert(0) += 1;
            }
            // Close b1's two; the next two connections go to b1.
            let kept: Vec<_> = open.into_iter().filter(|(n, _)| n != "b1").collect();
            std::thread::sleep(Duration::from_millis(200));
            let next: Vec<String> = (0..2)
                .map(|_| echo_open(addr, TIMEOUT).unwrap().0)
                .collect();
            ((per, next), kept.len())
        })
        .expect("client thread");
    let (per, next) = names;
    assert_eq!(
        per.values().copied().collect::<Vec<_>>(),
        vec![2, 2, 2],
        "{per:?}"
    );
    assert_eq!(kept, 4);
    assert_eq!(
        next,
        vec!["b1".to_string(), "b1".to_string()],
        "after b1's connections closed"
    );
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn source_hash_and_persistence_keep_clients_together() {
    let topo = rack("ssh");
    cli_ok(&topo, &["vip", "set-scheduler", "http4", "source-hash"]);
    let got = served(&topo, 100);
    assert_eq!(
        got.len(),
        1,
        "one client's 100 connections split over {got:?}"
    );

    // 500 clients (addresses 10.111.2.0/23 on the client; the backends route back to it).
    let clients: Vec<IpAddr> = (0..500u32)
        .map(|i| {
            IpAddr::V4(Ipv4Addr::new(
                10,
                111,
                2 + (i / 250) as u8,
                (i % 250 + 1) as u8,
            ))
        })
        .collect();
    let batch: String = clients
        .iter()
        .map(|c| format!("addr add {c}/32 dev eth0\n"))
        .collect();
    let batch_file = topo.rack.log_dir.join("client-addrs.batch");
    std::fs::write(&batch_file, batch).unwrap();
    topo.client
        .sh(&format!("ip -batch {}", batch_file.display()))
        .expect("client addresses");
    for b in &topo.backends {
        b.sh(&format!("ip route add 10.111.2.0/23 via {CLIENT4}"))
            .expect("route back");
    }
    let list = clients.clone();
    let got = topo
        .client
        .run_in(move || {
            let mut served = BTreeMap::new();
            for c in &list {
                let name = http_get_from(*c, SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT)
                    .map_err(|e| format!("{e:#}"))?;
                *served.entry(name).or_insert(0usize) += 1;
            }
            Ok::<_, String>(served)
        })
        .expect("client thread")
        .unwrap_or_else(|e| panic!("{e}\n{}", topo.logs()));
    println!("500 clients by source hash: {got:?}");
    for (b, n) in &got {
        let share = *n as f64 / 500.0;
        assert!(
            (share - 1.0 / 3.0).abs() <= 0.1 / 3.0,
            "{b} got {n} of 500 clients: {got:?}"
        );
    }

    // Round robin with session persistence: each client stays on its backend.
    cli_ok(
        &topo,
        &[
            "vip",
            "set-scheduler",
            "http4",
            "round-robin",
            "--persistence-secs",
            "30",
        ],
    );
    let list: Vec<IpAddr> = clients[..20].to_vec();
    let per_client = topo
        .client
        .run_in(move || {
            list.iter()
                .map(|c| {
                    (0..10)
                        .map(|_| {
                            http_get_from(*c, SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT)
                                .unwrap()
                        })
                        .collect::<std::collections::BTreeSet<String>>()
                })
                .collect::<Vec<_>>()
        })
        .expect("client thread");
    assert!(
        per_client.iter().all(|s| s.len() == 1),
        "a persistent client moved: {per_client:?}"
    );
    let backends: std::collections::BTreeSet<&String> = per_client.iter().flatten().collect();
    assert_eq!(
        backends.len(),
        3,
        "round robin still spreads clients: {per_client:?}"
    );

    // Tenant affinity: source hash by /24 puts every client of each network on one backend
    // (the two networks' backends as the hash gives them).
    let http4 = set_http4_scheduler(
        &topo,
        &[
            "source-hash",
            "--persistence-secs",
            "0",
            "--affinity-prefix-v4",
            "24",
        ],
    );
    assert_eq!(http4.scheduler, "source-hash, by /24 and /128");
    let list: Vec<IpAddr> = clients.iter().step_by(5).copied().collect();
    let per_network = topo
        .client
        .run_in(move || {
            let mut served: BTreeMap<u8, std::collections::BTreeSet<String>> = BTreeMap::new();
            for c in &list {
                let IpAddr::V4(v4) = c else { unreachable!() };
                let name = http_get_from(*c, SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT)
                    .map_err(|e| format!("{c}: {e:#}"))?;
                served.entry(v4.octets()[2]).or_default().insert(name);
            }
            Ok::<_, String>(served)
        })
        .expect("client thread")
        .unwrap_or_else(|e| panic!("{e}\n{}", topo.logs()));
    println!("100 clients of two /24s by source hash on the /24: {per_network:?}");
    assert_eq!(per_network.len(), 2);
    assert!(
        per_network.values().all(|s| s.len() == 1),
        "a network's clients split: {per_network:?}"
    );

    // Bounded load: each backend's averaged weight share is written and shown (equal weights:
    // a third each, summing to one).
    let http4 = set_http4_scheduler(&topo, &["source-hash", "--max-load-factor", "1.25"]);
    assert!(
        http4.scheduler.starts_with("source-hash, max load 1.25x"),
        "{}",
        http4.scheduler
    );
    let shares: Vec<f64> = http4
        .backends
        .iter()
        .map(|b| {
            b.bound_share
                .expect("a bounded VIP's backend has an averaged share")
        })
        .collect();
    assert_eq!(shares.len(), 3, "{shares:?}");
    assert!(
        shares.iter().all(|s| (s - 1.0 / 3.0).abs() < 0.001),
        "{shares:?}"
    );
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn a_premium_tier_keeps_its_backends_and_spills_when_they_are_drained() {
    let mut topo = rack("stier");
    // The client's own address is premium; 10.111.0.50 (also on the client) is not. b3 is
    // http4's premium backend.
    topo.client
        .sh("ip addr add 10.111.0.50/24 dev eth0")
        .expect("free-tier address");
    let free: IpAddr = "10.111.0.50".parse().unwrap();
    let premium: IpAddr = CLIENT4.into();
    let base = rack_config(&topo, "l2-dsr", AttachMode::Native);
    let with_tier = |drained: bool| -> String {
        let mut config = base.clone();
        config.tier.push(RawTier {
            name: Some("premium".into()),
            prefixes: vec![format!("{premium}/32")],
            ..RawTier::default()
        });
        let b3 = vip_mut(&mut config, "http4")
            .backend
            .iter_mut()
            .find(|b| b.address.as_deref() == Some("10.111.0.13"))
            .expect("b3 serves http4");
        b3.tier = Some("premium".into());
        b3.drained = Some(drained);
        to_toml(&config)
    };
    let from = |topo: &Topology, src: IpAddr, n: usize| -> BTreeMap<String, usize> {
        topo.client
            .run_in(move || {
                let mut served = BTreeMap::new();
                for _ in 0..n {
                    let name = http_get_from(src, SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT)
                        .unwrap();
                    *served.entry(name).or_insert(0usize) += 1;
                }
                served
            })
            .expect("client thread")
    };
    let config = with_tier(false);
    topo.reload_balancer(&config).expect("tiered config");
    let got = from(&topo, premium, 60);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        vec!["b3"],
        "premium client: {got:?}"
    );
    let got = from(&topo, free, 60);
    assert!(
        !got.contains_key("b3"),
        "a free-tier client reached the premium backend: {got:?}"
    );
    assert_eq!(got.len(), 2, "{got:?}");
    // The premium backend drained: premium clients spill into the shared pool.
    let config = with_tier(true);
    topo.reload_balancer(&config)
        .expect("drain the premium backend");
    let got = from(&topo, premium, 60);
    assert!(
        !got.contains_key("b3") && got.values().sum::<usize>() == 60,
        "{got:?}"
    );
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn model_routing_places_backends_by_the_models_they_serve() {
    let tag = "smodel";
    let mut topo = Topology::build(TopologyOptions::new(tag)).expect("building the test rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    // b1 serves llama, b2 mistral, b3 both (their /v1/models answers).
    for (i, models) in ["llama", "mistral", "llama,mistral"].iter().enumerate() {
        std::fs::write(topo.models_file(i), models).unwrap();
    }
    // The rack's global settings; two VIPs that take their backends from one pool by model.
    let mut config = rack_config(&topo, "l2-dsr", AttachMode::Native);
    config.pool = vec![RawPool {
        name: Some("gpus".into()),
        discover: Some("models".into()),
        port: Some(80),
        interval_ms: Some(200),
        backend: backends(&["10.111.0.11", "10.111.0.12", "10.111.0.13"]),
        ..RawPool::default()
    }];
    config.vip = [("llama", HTTP_PORT), ("mistral", ECHO_PORT)]
        .into_iter()
        .map(|(model, port)| {
            let mut v = vip(model, VIP4, port);
            v.pool = Some("gpus".into());
            v.model = Some(model.into());
            v
        })
        .collect();
    let config = to_toml(&config);
    topo.start_balancer(&config).expect("starting the balancer");
    let members = |topo: &Topology, vip: &str| -> Vec<String> {
        let s: Status = serde_json::from_str(&topo.cli(&["status", "--json"]).unwrap().1).unwrap();
        let mut m: Vec<String> = s
            .vips
            .iter()
            .find(|v| v.name == vip)
            .map(|v| {
                v.backends
                    .iter()
                    .filter(|b| !b.retiring)
                    .map(|b| b.address.to_string())
                    .collect()
            })
            .unwrap_or_default();
        m.sort();
        m
    };
    let wait_for = |topo: &Topology, vip: &str, want: &[&str]| {
        let started = std::time::Instant::now();
        while members(topo, vip) != want {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{vip} has {:?}, wanted {want:?}\n{}",
                members(topo, vip),
                topo.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for(&topo, "llama", &["10.111.0.11", "10.111.0.13"]);
    wait_for(&topo, "mistral", &["10.111.0.12", "10.111.0.13"]);
    let llama = served(&topo, 60);
    assert_eq!(
        llama.keys().collect::<Vec<_>>(),
        vec!["b1", "b3"],
        "llama requests: {llama:?}"
    );
    let addr = SocketAddr::new(VIP4.into(), ECHO_PORT);
    let mistral: BTreeMap<String, usize> = topo
        .client
        .run_in(move || {
            let mut m = BTreeMap::new();
            for _ in 0..60 {
                *m.entry(echo_open(addr, TIMEOUT).unwrap().0).or_insert(0) += 1;
            }
            m
        })
        .expect("client thread");
    assert_eq!(
        mistral.keys().collect::<Vec<_>>(),
        vec!["b2", "b3"],
        "mistral requests: {mistral:?}"
    );
    // b1 starts serving mistral too: it joins that VIP as well; the config file is unchanged.
    std::fs::write(topo.models_file(0), "llama,mistral").unwrap();
    wait_for(
        &topo,
        "mistral",
        &["10.111.0.11", "10.111.0.12", "10.111.0.13"],
    );
    let written = std::fs::read_to_string(topo.rack.log_dir.join("balancer.toml")).unwrap();
    assert_eq!(written, config, "discovery rewrote the config file");
}
