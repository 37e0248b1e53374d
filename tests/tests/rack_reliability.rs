//! The reliability suite (needs root; `cargo xtask test --reliability` runs it with the restart
//! and million-frame tests): weight churn under 100 live streams, backend death, two balancers
//! computing one table, and hostile API input. Daemon death mid-stream is
//! `control::restarts_lose_nothing`; a million malformed frames is `sweep`.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use balancer::base::config::AttachMode;
use balancer::serve::api::client::{Client, Endpoint};
use balancer::state::wire::{ChangeResult, Status};
use balancer_tests::configs::{tcp_health, to_toml, vip_mut};
use balancer_tests::topology::*;
use balancer_tests::traffic::{echo_open, http_get};

const TIMEOUT: Duration = Duration::from_secs(5);

fn rack(tag: &str, backends: usize, weights: &[Option<u32>]) -> Topology {
    let mut opts = TopologyOptions::new(tag);
    opts.backends = backends;
    let mut topo = Topology::build(opts).expect("building the test rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    let config = rack_config_weighted(&topo, "l2-dsr", AttachMode::Native, weights);
    topo.start_balancer(&to_toml(&config))
        .expect("starting the balancer");
    topo
}

fn api(topo: &Topology) -> Client {
    Client::new(Endpoint::Unix(topo.api_socket()))
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn weight_churn_and_backend_churn_lose_no_byte() {
    // Five servers; b4 and b5 join and leave during the run.
    let topo = rack("rchurn", 5, &[Some(1), Some(1), Some(1), None, None]);
    const STREAMS: usize = 100;
    let until = Instant::now() + Duration::from_secs(12);
    let streams = topo
        .echo_streams(STREAMS, until, TIMEOUT)
        .expect("client threads");
    std::thread::sleep(Duration::from_millis(500));
    let client = api(&topo);
    let mut changes = 0;
    for round in 0..200u32 {
        for (vip, b) in [
            ("echo4", backend4((round % 3) as usize).to_string()),
            ("echo6", backend6((round % 3) as usize).to_string()),
        ] {
            let weight = 1 + (round * 7 + 3) % 9;
            let body = balancer::state::wire::WeightBody {
                weight: i64::from(weight),
            };
            client
                .call::<_, ChangeResult>(
                    "PUT",
                    &format!("/v1/vips/{vip}/backends/{b}/weight"),
                    Some(&body),
                )
                .unwrap_or_else(|e| panic!("weight change {round}: {e}"));
        }
        changes += 1;
        match round {
            50 | 60 => {
                // b4 then b5 join both echo VIPs.
                let i = if round == 50 { 3 } else { 4 };
                for (vip, addr) in [
                    ("echo4", backend4(i).to_string()),
                    ("echo6", backend6(i).to_string()),
                ] {
                    let body = balancer::base::config::RawBackend {
                        address: Some(addr),
                        weight: Some(2),
                        ..Default::default()
                    };
                    client
                        .call::<_, ChangeResult>(
                            "POST",
                            &format!("/v1/vips/{vip}/backends"),
                            Some(&body),
                        )
                        .unwrap_or_else(|e| panic!("adding a backend: {e}"));
                }
            }
            150 | 160 => {
                let i = if round == 150 { 3 } else { 4 };
                for (vip, addr) in [
                    ("echo4", backend4(i).to_string()),
                    ("echo6", backend6(i).to_string()),
                ] {
                    client
                        .call::<(), ChangeResult>(
                            "DELETE",
                            &format!("/v1/vips/{vip}/backends/{addr}"),
                            None,
                        )
                        .unwrap_or_else(|e| panic!("removing a backend: {e}"));
                }
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    let StreamsJoined {
        per_backend, bytes, ..
    } = join_streams(streams, "during the churn")
        .unwrap_or_else(|e| panic!("{e:#}\n{}", topo.logs()));
    println!(
        "{STREAMS} streams, {changes} weight changes per VIP, 2 backends added and removed: 0 errors, {} MiB echoed and verified; streams per backend {per_backend:?}",
        bytes >> 20
    );
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn a_flow_moved_to_another_balancer_keeps_its_backend() {
    let mut topo = rack("rtwo", 3, &[Some(1), Some(2), Some(3)]);
    topo.start_second_balancer().expect("second balancer");
    // Both balancers built the same table.
    let table = |socket: std::path::PathBuf| -> String {
        let s: Status = Client::new(Endpoint::Unix(socket))
            .get("/v1/status")
            .expect("status");
        s.vips
            .iter()
            .find(|v| v.name == "echo4")
            .map(|v| v.table_fingerprint.clone())
            .unwrap_or_default()
    };
    let first = table(topo.api_socket());
    assert_eq!(
        first,
        table(topo.rack.log_dir.join("api2.sock")),
        "the two balancers disagree on the table"
    );
    // A live connection through the first balancer; then the client's route moves to the second
    // (what ECMP does when the first fails) and the conversation goes on.
    let addr = SocketAddr::new(VIP4.into(), ECHO_PORT);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let conversation = topo
        .client
        .spawn_in(move || -> Result<(String, usize), String> {
            use std::io::{Read, Write};
            let (backend, mut stream) = echo_open(addr, TIMEOUT).map_err(|e| format!("{e:#}"))?;
            let mut echoed = 0;
            let mut exchange =
                |stream: &mut std::net::TcpStream, round: usize| -> Result<(), String> {
                    let msg = format!("round {round} of the conversation\n");
                    stream
                        .write_all(msg.as_bytes())
                        .map_err(|e| format!("send {round}: {e}"))?;
                    let mut back = vec![0u8; msg.len()];
                    stream
                        .read_exact(&mut back)
                        .map_err(|e| format!("echo {round}: {e}"))?;
                    if back != msg.as_bytes() {
                        return Err(format!("round {round}: echo differs"));
                    }
                    echoed += msg.len();
                    Ok(())
                };
            for round in 0..20 {
                exchange(&mut stream, round)?;
            }
            // Wait for the route change, then carry on.
            rx.recv_timeout(Duration::from_secs(10))
                .map_err(|_| "no route change".to_string())?;
            for round in 20..40 {
                exchange(&mut stream, round)?;
            }
            Ok((backend, echoed))
        })
        .expect("client thread");
    std::thread::sleep(Duration::from_millis(300));
    let before = balancer2_packets(&topo);
    topo.client
        .sh("ip route replace 10.111.1.0/24 via 10.111.0.3")
        .expect("route change");
    tx.send(()).unwrap();
    let (backend, echoed) = conversation
        .join()
        .expect("client thread")
        .expect("client namespace")
        .unwrap_or_else(|e| panic!("the moved connection broke: {e}\n{}", topo.logs()));
    // Status counters are sampled at most every 100 ms.
    std::thread::sleep(Duration::from_millis(200));
    let after = balancer2_packets(&topo);
    assert!(
        after > before,
        "the second balancer forwarded nothing ({before} -> {after})"
    );
    println!(
        "connection on {backend} moved to the second balancer mid-conversation: {echoed} bytes echoed, none lost"
    );
    // New connections through the second balancer land by the same table.
    let via_second = topo
        .client
        .run_in(|| {
            (0..30)
                .filter(|_| http_get(SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT).is_ok())
                .count()
        })
        .unwrap();
    assert_eq!(via_second, 30);
}

/// Packets the second balancer forwarded to the echo4 VIP.
fn balancer2_packets(topo: &Topology) -> u64 {
    let s: Status = Client::new(Endpoint::Unix(topo.rack.log_dir.join("api2.sock")))
        .get("/v1/status")
        .expect("status");
    s.vips
        .iter()
        .find(|v| v.name == "echo4")
        .map_or(0, |v| v.packets)
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn a_dead_backend_is_avoided_within_the_detection_time() {
    let mut topo = rack("rdead", 3, &[Some(1), Some(1), Some(1)]);
    let mut config = rack_config_weighted(
        &topo,
        "l2-dsr",
        AttachMode::Native,
        &[Some(1), Some(1), Some(1)],
    );
    vip_mut(&mut config, "http4").health = Some(tcp_health(100, 50, 3, 2));
    topo.reload_balancer(&to_toml(&config))
        .expect("health checks on");
    std::thread::sleep(Duration::from_millis(500));
    // The server dies and its address goes away (the host is gone).
    topo.kill_backend_server(2).expect("kill b3");
    topo.backends[2]
        .sh(&format!("ip addr del {}/24 dev eth0", backend4(2)))
        .expect("remove b3's address");
    let killed = Instant::now();
    let detected = loop {
        let s: Status = api(&topo).get("/v1/status").expect("status");
        let b3 = s
            .vips
            .iter()
            .find(|v| v.name == "http4")
            .and_then(|v| {
                v.backends
                    .iter()
                    .find(|b| b.address == IpAddr::from(backend4(2)))
                    .cloned()
            })
            .expect("b3 listed");
        if !b3.healthy {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "b3 never marked unhealthy"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let served = topo
        .client
        .run_in(|| {
            (0..60)
                .map(|_| {
                    http_get(SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT)
                        .map_err(|e| format!("{e:#}"))
                })
                .collect::<Result<Vec<String>, String>>()
        })
        .unwrap()
        .expect("every new connection after detection succeeds");
    assert!(
        !served.iter().any(|b| b == "b3"),
        "a new flow reached the dead backend: {served:?}"
    );
    println!(
        "b3 (server killed, address removed) left the table after {detected:?}; 60 new connections all succeeded elsewhere"
    );
    assert!(
        detected < Duration::from_millis(100 * 3 + 50 + 500),
        "detection took {detected:?}"
    );
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn hostile_api_input_changes_nothing_and_costs_no_memory() {
    let topo = rack("rhost", 3, &[Some(1), Some(1), Some(1)]);
    let pid = topo
        .rack
        .processes
        .iter()
        .find(|p| p.name == "balancer")
        .unwrap()
        .pid();
    let rss = || -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let before_config = std::fs::read_to_string(topo.rack.log_dir.join("balancer.toml")).unwrap();
    let status_before: Status = api(&topo).get("/v1/status").unwrap();
    let rss_before = rss();
    let client = api(&topo);
    let big = vec![b'x'; 1 << 20];
    let mut refused = 0;
    for i in 0..600usize {
        let (method, path, body): (&str, String, Vec<u8>) = match i % 6 {
            0 => ("POST", "/v1/vips".into(), b"{not json".to_vec()),
            1 => ("POST", "/v1/vips".into(), big.clone()),
            2 => (
                "PUT",
                "/v1/vips/http4/backends/10.111.0.11/weight".into(),
                br#"{"weight": -5}"#.to_vec(),
            ),
            3 => (
                "POST",
                format!("/v1/vips/http4/backends/{}", "9".repeat(i)),
                b"{}".to_vec(),
            ),
            4 => (
                "POST",
                "/v1/backends/10.111.0.11/report".into(),
                br#"{"kv_usage": "lots"}"#.to_vec(),
            ),
            _ => ("DELETE", "/v1/vips/%ff%00".into(), Vec::new()),
        };
        match client.raw(method, &path, Some(&body)) {
            Ok((status, _)) if status >= 400 => refused += 1,
            Ok((status, reply)) => panic!(
                "{method} {path} was accepted ({status}): {}",
                String::from_utf8_lossy(&reply)
            ),
            Err(_) => refused += 1,
        }
    }
    let status_after: Status = api(&topo).get("/v1/status").unwrap();
    let growth = rss().saturating_sub(rss_before);
    println!("600 hostile requests, {refused} refused; daemon RSS grew {growth} KiB");
    assert_eq!(refused, 600);
    assert_eq!(
        std::fs::read_to_string(topo.rack.log_dir.join("balancer.toml")).unwrap(),
        before_config
    );
    let fingerprints = |s: &Status| {
        s.vips
            .iter()
            .map(|v| (v.name.clone(), v.table_fingerprint.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(fingerprints(&status_before), fingerprints(&status_after));
    assert!(
        growth < 16 * 1024,
        "the daemon grew {growth} KiB on refused requests"
    );
}
