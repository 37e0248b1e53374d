//! A fleet of balancers behind a router's ECMP, announced by BIRD over BGP, agreeing on one
//! table through etcd (see `balancer_tests::fleet` for the topology).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use balancer::steering::fleet::{EtcdHealth, FleetRole};
use balancer_tests::fleet::{EtcdSecurity, Fleet, HOLD, backend_addr, lb_addr};
use balancer_tests::topology::{ECHO_PORT, HTTP_PORT, VIP4};
use balancer_tests::traffic::http_get;

const TIMEOUT: Duration = Duration::from_secs(10);

fn fleet(tag: &str, balancers: usize) -> Fleet {
    Fleet::build(tag, balancers, 3).unwrap_or_else(|e| panic!("building the fleet: {e:#}"))
}

/// A fleet whose etcd wants TLS with client certificates and a password.
fn secured_fleet(tag: &str, balancers: usize) -> Fleet {
    Fleet::build_with(tag, balancers, 3, EtcdSecurity::MutualTlsAndPassword)
        .unwrap_or_else(|e| panic!("building the fleet: {e:#}"))
}

/// Connections to the VIP through the router (spread over every balancer): how many of `n`
/// were served.
fn served(f: &Fleet, n: usize) -> usize {
    f.client
        .run_in(move || {
            (0..n)
                .filter(|_| http_get(SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT).is_ok())
                .count()
        })
        .unwrap()
}

/// Both balancers hold the same table for every VIP (and it is not empty).
fn same_tables(f: &Fleet, lbs: &[usize]) -> Duration {
    f.wait_for_status(lbs, Duration::from_secs(10), "on the same tables", |_| {
        ["http4", "echo4"].iter().all(|vip| {
            let prints: Vec<Option<String>> = lbs.iter().map(|i| f.fingerprint(*i, vip)).collect();
            prints[0].is_some() && prints.iter().all(|p| *p == prints[0])
        })
    })
    .unwrap()
}

#[test]
#[ignore = "needs root, network namespaces, BIRD and etcd; run by cargo xtask test"]
fn ecmp_spreads_flows_and_a_dead_balancer_is_routed_around_without_breaking_connections() {
    let mut f = fleet("fecmp", 2);
    same_tables(&f, &[0, 1]);
    assert_eq!(f.router_paths().unwrap(), vec![lb_addr(0), lb_addr(1)]);
    // New connections from many source ports: the router spreads them over both balancers.
    let served = f
        .client
        .run_in(|| {
            (0..200)
                .map(|_| {
                    http_get(SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT)
                        .map_err(|e| format!("{e:#}"))
                })
                .collect::<Result<Vec<String>, String>>()
        })
        .unwrap()
        .expect("200 connections through the fleet");
    let per_lb: Vec<u64> = (0..2).map(|i| f.new_flows(i, "http4")).collect();
    println!(
        "200 connections: per balancer {per_lb:?}, backends {:?}",
        count(&served)
    );
    assert!(
        per_lb.iter().all(|n| *n >= 40),
        "ECMP did not spread: {per_lb:?}"
    );

    // Long-lived conversations, then balancer 1's host dies.
    let addr = SocketAddr::new(VIP4.into(), ECHO_PORT);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let talkers = f
        .client
        .spawn_in(move || -> Result<usize, String> {
            let mut streams = Vec::new();
            for _ in 0..20 {
                let mut s =
                    TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(15)))
                    .map_err(|e| e.to_string())?;
                let mut name = [0u8; 3];
                s.read_exact(&mut name)
                    .map_err(|e| format!("greeting: {e}"))?;
                streams.push(s);
            }
            let round = |streams: &mut Vec<TcpStream>, r: usize| -> Result<(), String> {
                for (i, s) in streams.iter_mut().enumerate() {
                    let msg = format!("stream {i} round {r}\n");
                    s.write_all(msg.as_bytes())
                        .map_err(|e| format!("stream {i} round {r}: {e}"))?;
                    let mut back = vec![0u8; msg.len()];
                    s.read_exact(&mut back)
                        .map_err(|e| format!("stream {i} round {r}: {e}"))?;
                    if back != msg.as_bytes() {
                        return Err(format!("stream {i} round {r}: echo differs"));
                    }
                }
                Ok(())
            };
            round(&mut streams, 0)?;
            rx.recv_timeout(Duration::from_secs(30))
                .map_err(|_| "no signal".to_string())?;
            // Through the surviving balancer now (after the BGP hold time).
            for r in 1..6 {
                round(&mut streams, r)?;
            }
            Ok(streams.len())
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let before = f.new_flows(1, "echo4");
    f.kill_balancer_host(0).unwrap();
    let died = Instant::now();
    let withdrawn = f.wait_for_paths(1, Duration::from_secs(HOLD * 3)).unwrap();
    assert_eq!(f.router_paths().unwrap(), vec![lb_addr(1)]);
    println!(
        "balancer 1's host died: the router withdrew its path after {withdrawn:?} (hold time {HOLD} s)"
    );
    tx.send(()).unwrap();
    let survived = talkers
        .join()
        .unwrap()
        .expect("client namespace")
        .unwrap_or_else(|e| {
            panic!(
                "a connection broke when its balancer died: {e}\n{}",
                f.logs()
            )
        });
    assert_eq!(survived, 20);
    // The survivor took over flows it had never seen, and sent them to the same backends
    // (else the echo servers would have reset them).
    assert!(f.new_flows(1, "echo4") >= before, "counters went backwards");
    println!(
        "20 conversations continued through balancer 2 {:?} after the first one died",
        died.elapsed()
    );
}

#[test]
#[ignore = "needs root, network namespaces, BIRD and etcd; run by cargo xtask test"]
fn a_weight_change_published_once_is_applied_by_every_balancer() {
    // Over TLS with client certificates and etcd's authentication.
    let f = secured_fleet("fweight", 3);
    same_tables(&f, &[0, 1, 2]);
    let leader = f.wait_for_leader(TIMEOUT).unwrap();
    let follower = (leader + 1) % 3;
    let epoch_before = f.status(follower).unwrap().fleet.unwrap().epoch;
    // One change, on the leader.
    let started = Instant::now();
    let applied = set_weight_everywhere(&f, leader, 0, 300, &[0, 1, 2], Duration::from_secs(5));
    // The followers report the epoch with their next poll after applying it.
    let epochs = || -> Vec<Option<u64>> {
        (0..3)
            .map(|i| f.status(i).ok().and_then(|s| s.fleet).map(|x| x.epoch))
            .collect()
    };
    f.rack
        .wait_until(TIMEOUT, "on one new epoch", || {
            let e = epochs();
            e.iter()
                .all(|x| *x == e[0] && x.is_some_and(|x| x > epoch_before))
        })
        .unwrap_or_else(|err| panic!("{err:#}: {:?}", epochs()));
    let statuses: Vec<_> = (0..3)
        .map(|i| f.status(i).unwrap().fleet.unwrap())
        .collect();
    assert_eq!(
        statuses
            .iter()
            .filter(|s| s.role == FleetRole::Leader)
            .count(),
        1,
        "{statuses:?}"
    );
    println!(
        "weight change on the leader lb{}: every balancer on the new table (epoch {}) within {applied:?} of the CLI's answer ({:?} in all)",
        leader + 1,
        statuses[0].epoch,
        started.elapsed()
    );
    // The follower's table gives backend 1 three fifths of the slots.
    let table: balancer::state::wire::Table = f.api(follower).get("/v1/vips/http4/table").unwrap();
    let share = table
        .backends
        .iter()
        .find(|b| b.address == std::net::IpAddr::from(backend_addr(0)))
        .unwrap()
        .slot_share;
    assert!((share - 0.6).abs() < 0.01, "backend 1 holds {share}");

    // A VIP and its backends added on the leader reach every balancer, with the same table.
    let (b1, b2) = (backend_addr(1).to_string(), backend_addr(2).to_string());
    for args in [
        vec![
            "vip",
            "add",
            "web8080",
            "--address",
            "10.111.1.1",
            "--port",
            "8080",
        ],
        vec!["backend", "add", "web8080", &b1],
        vec!["backend", "add", "web8080", &b2],
    ] {
        let (code, out, err) = cli(&f, leader, &args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
    }
    let joined = f
        .wait_for_status(
            &[0, 1, 2],
            Duration::from_secs(5),
            "serving the new VIP",
            |s| {
                s.vips.iter().any(|v| {
                    v.name == "web8080"
                        && v.backends.len() == 2
                        && v.backends
                            .iter()
                            .all(|b| [&b1, &b2].contains(&&b.address.to_string()))
                })
            },
        )
        .unwrap();
    let prints: Vec<Option<String>> = (0..3).map(|i| f.fingerprint(i, "web8080")).collect();
    assert!(
        prints.iter().all(|p| p.is_some() && *p == prints[0]),
        "{prints:?}"
    );
    println!(
        "a VIP added on the leader: on every balancer within {joined:?}, same table {:?}",
        prints[0]
    );
    // The followers' config files hold it too (a restart keeps it).
    let text = std::fs::read_to_string(
        f.rack
            .log_dir
            .join(format!("balancer-lb{}.toml", follower + 1)),
    )
    .unwrap();
    assert!(text.contains("web8080"), "{text}");
}

#[test]
#[ignore = "needs root, network namespaces, BIRD and etcd; run by cargo xtask test"]
fn losing_etcd_leaves_every_balancer_forwarding_with_its_last_table() {
    let mut f = fleet("fnoetcd", 2);
    same_tables(&f, &[0, 1]);
    let prints: Vec<String> = (0..2).map(|i| f.fingerprint(i, "http4").unwrap()).collect();
    f.kill_etcd().unwrap();
    // The leader steps down (its lease cannot be renewed), nobody can lead, and both notice.
    let noticed = f
        .wait_for_status(
            &[0, 1],
            Duration::from_secs(10),
            "without etcd and without a leader",
            |s| {
                s.fleet
                    .as_ref()
                    .is_some_and(|x| !x.etcd.is_ok() && x.role != FleetRole::Leader)
            },
        )
        .unwrap();
    // Longer than a lease (3 s) after etcd went: the tables stay.
    std::thread::sleep(Duration::from_secs(4).saturating_sub(noticed));
    for (i, print) in prints.iter().enumerate() {
        let fleet = f.status(i).unwrap().fleet.unwrap();
        assert_ne!(
            fleet.role,
            FleetRole::Leader,
            "lb{} leads without etcd",
            i + 1
        );
        assert_eq!(&f.fingerprint(i, "http4").unwrap(), print);
    }
    assert_eq!(served(&f, 50), 50, "connections failed without etcd");
    println!("etcd gone: both balancers keep their tables and 50/50 connections succeed");
    // etcd back (same data): a leader again, the follower's broken watch opened again, and a
    // change on the leader reaches it.
    f.start_etcd().unwrap();
    let leader = f.wait_for_leader(Duration::from_secs(15)).unwrap();
    f.wait_for_status(&[0, 1], TIMEOUT, "etcd ok again", |s| {
        s.fleet.as_ref().is_some_and(|x| x.etcd.is_ok())
    })
    .unwrap();
    let took = set_weight_everywhere(&f, leader, 2, 250, &[0, 1], TIMEOUT);
    println!(
        "etcd restarted: lb{} leads, and a weight change reaches both in {took:?}",
        leader + 1
    );
}

#[test]
#[ignore = "needs root, network namespaces, BIRD and etcd; run by cargo xtask test"]
fn a_wrong_ca_a_missing_client_certificate_and_a_wrong_password_are_named() {
    let mut f = secured_fleet("fsecure", 2);
    same_tables(&f, &[0, 1]);
    let leader = f.wait_for_leader(TIMEOUT).unwrap();
    let other = 1 - leader;
    let print = f.fingerprint(other, "http4").unwrap();
    let pki = f.pki.clone().unwrap();
    let text = |p: &std::path::PathBuf| Some(p.display().to_string());
    type Edit = Box<dyn FnOnce(&mut balancer::base::config::RawFleet)>;
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        (
            "a CA that did not sign etcd's certificate",
            Box::new({
                let ca = text(&pki.other_ca);
                move |r| r.ca = ca
            }),
            &["TLS with etcd failed", "fleet.ca"],
        ),
        (
            "no client certificate",
            Box::new(|r| {
                r.cert = None;
                r.key = None;
            }),
            &["TLS with etcd failed", "client certificate", "fleet.cert"],
        ),
        (
            "a wrong password",
            Box::new({
                let pw = text(&pki.wrong_password_file);
                move |r| r.password_file = pw
            }),
            &["etcd authentication failed", "\"balancer\""],
        ),
    ];
    for (what, edit, want) in cases {
        f.start_balancer_with(other, edit).unwrap();
        f.wait_for_status(&[other], TIMEOUT, what, |s| {
            s.fleet.as_ref().is_some_and(
                |x| matches!(&x.etcd, EtcdHealth::Failing(e) if want.iter().all(|w| e.contains(w))),
            )
        })
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        let status = f.status(other).unwrap().fleet.unwrap();
        assert_ne!(status.role, FleetRole::Leader, "{what}: leads without etcd");
        // It keeps forwarding with the table it had.
        assert_eq!(f.fingerprint(other, "http4").unwrap(), print, "{what}");
        assert_eq!(served(&f, 30), 30, "{what}: connections failed");
        println!(
            "{what}: lb{} says {:?}; 30/30 connections served",
            other + 1,
            status.etcd
        );
    }
    // The right settings again: it follows the leader.
    f.start_balancer(other).unwrap();
    f.wait_for_status(&[other], TIMEOUT, "following again", |s| {
        s.fleet
            .as_ref()
            .is_some_and(|x| x.etcd.is_ok() && x.role == FleetRole::Follower)
    })
    .unwrap();
}

#[test]
#[ignore = "needs root, network namespaces, BIRD and etcd; run by cargo xtask test"]
fn partitioning_the_leader_hands_over_without_two_leaders() {
    let f = secured_fleet("fpart", 2);
    same_tables(&f, &[0, 1]);
    let old = f.wait_for_leader(TIMEOUT).unwrap();
    let new = 1 - old;
    // Cut the leader off etcd (and only etcd).
    f.lbs[old]
        .sh(&format!(
            "ip route add prohibit {}/32",
            balancer_tests::fleet::ETCD
        ))
        .unwrap();
    let cut = Instant::now();
    f.wait_for_status(&[new], Duration::from_secs(10), "leading", |s| {
        s.fleet
            .as_ref()
            .is_some_and(|x| x.role == FleetRole::Leader)
    })
    .unwrap();
    let handed = cut.elapsed();
    let old_role = f.status(old).unwrap().fleet.unwrap().role;
    assert_ne!(old_role, FleetRole::Leader, "two leaders at once");
    // The old leader stepped down before the new one was elected (log times).
    let stepped = log_time(&f, old, "stepping down").expect("the old leader stepped down");
    let elected = log_time(&f, new, "elected leader").expect("the new leader was elected");
    assert!(
        stepped < elected,
        "lb{} stepped down at {stepped}, lb{} elected at {elected}",
        old + 1,
        new + 1
    );
    println!(
        "leader lb{} cut off etcd: lb{} leads {handed:?} later; the old one stepped down first",
        old + 1,
        new + 1
    );
    // Healed: the old leader follows and both agree; a change on the new leader reaches it.
    f.lbs[old]
        .sh(&format!(
            "ip route del prohibit {}/32",
            balancer_tests::fleet::ETCD
        ))
        .unwrap();
    set_weight_everywhere(&f, new, 1, 50, &[0, 1], TIMEOUT);
    f.wait_for_status(&[old], TIMEOUT, "following the new leader", |s| {
        s.fleet.as_ref().is_some_and(|x| {
            x.role == FleetRole::Follower
                && x.leader.as_deref() == Some(format!("lb{}", new + 1).as_str())
        })
    })
    .unwrap();
}

#[test]
#[ignore = "needs root, network namespaces, BIRD and etcd; run by cargo xtask test"]
fn drain_shutdown_and_a_bird_restart_move_the_announcement() {
    let mut f = fleet("fbgp", 2);
    // Drain: lb1 withdraws, lb2 still announces.
    let (code, out, err) = cli(&f, 0, &["vip", "drain", "http4"]);
    assert_eq!(code, 0, "{out}{err}");
    // Both VIPs share the address: drain the other one too to withdraw it.
    let (code, out, err) = cli(&f, 0, &["vip", "drain", "echo4"]);
    assert_eq!(code, 0, "{out}{err}");
    let t = f.wait_for_paths(1, Duration::from_secs(5)).unwrap();
    assert_eq!(f.router_paths().unwrap(), vec![lb_addr(1)]);
    println!("vip drain: the router dropped lb1's path after {t:?}");
    let (code, _, _) = cli(&f, 0, &["vip", "undrain", "http4"]);
    assert_eq!(code, 0);
    let t = f.wait_for_paths(2, Duration::from_secs(5)).unwrap();
    println!("vip undrain: lb1's path back after {t:?}");
    // A draining an unknown VIP is a clear error.
    let (code, _, err) = cli(&f, 0, &["vip", "drain", "nope"]);
    assert_ne!(code, 0);
    assert!(err.contains("nope"), "{err}");
    // BIRD restarts: it reads the daemon's route file and announces again.
    f.kill("bird-lb1").unwrap();
    f.wait_for_paths(1, Duration::from_secs(HOLD * 3)).unwrap();
    f.start_lb_bird(0).unwrap();
    let t = f.wait_for_paths(2, Duration::from_secs(10)).unwrap();
    println!("BIRD on lb1 restarted: path back after {t:?}");
    // The daemon stops (SIGTERM): it withdraws its routes.
    f.process("balancer-lb1")
        .unwrap()
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(10))
        .unwrap();
    let t = f.wait_for_paths(1, Duration::from_secs(5)).unwrap();
    assert_eq!(f.router_paths().unwrap(), vec![lb_addr(1)]);
    println!("daemon shut down: lb1's path withdrawn after {t:?}");
}

/// Sets backend `backend`'s weight in http4 through balancer `on`'s CLI, and waits until
/// every balancer of `lbs` has a new http4 table (within `within`), all the same one; returns
/// how long that took.
fn set_weight_everywhere(
    f: &Fleet,
    on: usize,
    backend: usize,
    weight: u32,
    lbs: &[usize],
    within: Duration,
) -> Duration {
    let before = f.fingerprint(on, "http4").unwrap();
    let (code, out, err) = cli(
        f,
        on,
        &[
            "backend",
            "set-weight",
            "http4",
            &backend_addr(backend).to_string(),
            &weight.to_string(),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let applied = f
        .wait_for_status(lbs, within, "on the new weight", |s| {
            s.vips
                .iter()
                .any(|v| v.name == "http4" && v.table_fingerprint != before)
        })
        .unwrap();
    same_tables(f, lbs);
    applied
}

fn cli(f: &Fleet, lb: usize, args: &[&str]) -> (i32, String, String) {
    let bin = balancer_tests::rack::binary("balancer").unwrap();
    let socket = f.api_socket(lb);
    let out = std::process::Command::new(bin)
        .args(args)
        .arg("--socket")
        .arg(&socket)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The timestamp (RFC 3339 text, which sorts) of balancer `lb`'s last log line containing
/// `needle`.
fn log_time(f: &Fleet, lb: usize, needle: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(f.rack.log_dir.join(format!("balancer-lb{}.log", lb + 1))).ok()?;
    text.lines()
        .rfind(|l| l.contains(needle))
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_string)
}

fn count(served: &[String]) -> std::collections::BTreeMap<&str, usize> {
    let mut m = std::collections::BTreeMap::new();
    for s in served {
        *m.entry(s.as_str()).or_insert(0) += 1;
    }
    m
}

/// With source NAT a flow's source port lives on the balancer that chose it. When ECMP moves
/// the flow to another balancer (here: its balancer's host dies), that one has never seen it:
/// it gives the flow a port of its own, the backend knows no connection from there and resets
/// it, and the reset reaches the client. So every conversation of the dead balancer ends at
/// once with a reset (none hangs), every one of the survivor's continues, and new connections
/// work. (docs/user/operating.md: source NAT in a fleet.)
#[test]
#[ignore = "needs root, network namespaces, BIRD and etcd; run by cargo xtask test"]
fn source_nat_flows_moved_to_another_balancer_are_reset_and_the_rest_continue() {
    let mut f = Fleet::build_source_nat("fsnat", 2, 3)
        .unwrap_or_else(|e| panic!("building the fleet: {e:#}"));
    same_tables(&f, &[0, 1]);
    let addr = SocketAddr::new(VIP4.into(), ECHO_PORT);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let talkers = f
        .client
        .spawn_in(move || -> Result<Vec<Result<(), String>>, String> {
            let mut streams = Vec::new();
            for _ in 0..20 {
                let mut s =
                    TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(20)))
                    .map_err(|e| e.to_string())?;
                let mut name = [0u8; 3];
                s.read_exact(&mut name)
                    .map_err(|e| format!("greeting: {e}"))?;
                streams.push(s);
            }
            let talk = |s: &mut TcpStream, r: usize| -> Result<(), std::io::Error> {
                let msg = format!("round {r}\n");
                s.write_all(msg.as_bytes())?;
                let mut back = vec![0u8; msg.len()];
                s.read_exact(&mut back)?;
                if back != msg.as_bytes() {
                    return Err(std::io::Error::other("echo differs"));
                }
                Ok(())
            };
            for (i, s) in streams.iter_mut().enumerate() {
                talk(s, 0).map_err(|e| format!("stream {i} before: {e}"))?;
            }
            rx.recv_timeout(Duration::from_secs(30))
                .map_err(|_| "no signal".to_string())?;
            Ok(streams
                .iter_mut()
                .map(|s| {
                    (1..4).try_for_each(|r| talk(s, r)).map_err(|e| {
                        let reset = e.kind() == std::io::ErrorKind::ConnectionReset;
                        if reset {
                            "reset".into()
                        } else {
                            format!("{e}")
                        }
                    })
                })
                .collect())
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let on = [f.new_flows(0, "echo4"), f.new_flows(1, "echo4")];
    assert_eq!(
        on[0] + on[1],
        20,
        "each conversation counted by one balancer"
    );
    f.kill_balancer_host(0).unwrap();
    f.wait_for_paths(1, Duration::from_secs(HOLD * 3)).unwrap();
    tx.send(()).unwrap();
    let outcomes = talkers
        .join()
        .unwrap()
        .expect("client namespace")
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    let survived = outcomes.iter().filter(|o| o.is_ok()).count() as u64;
    let reset = outcomes
        .iter()
        .filter(|o| o.as_ref().is_err_and(|e| e == "reset"))
        .count() as u64;
    println!(
        "balancer 1 died holding {} of 20 conversations: {reset} reset, {survived} continued through balancer 2",
        on[0]
    );
    assert_eq!(
        (reset, survived),
        (on[0], on[1]),
        "the dead balancer's conversations are reset, the survivor's continue: {outcomes:?}"
    );
    assert_eq!(served(&f, 20), 20, "new connections through the survivor");
}
