//! The control plane against a running daemon in the test rack (needs root): the API and CLI
//! for every command with their error paths, health-check transitions, and restarts (SIGKILL,
//! SIGTERM, `--replace`) while traffic flows.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use balancer::base::config::AttachMode;
use balancer::serve::api::client::{Client, ClientTls, Endpoint};
use balancer::state::wire::{ChangeResult, Status, Table};
use balancer_tests::configs::{tcp_health, to_toml, vip_mut};
use balancer_tests::netns::PREFIX;
use balancer_tests::pki::TestPki;
use balancer_tests::rack::poll;
use balancer_tests::topology::*;
use balancer_tests::traffic::http_get;

const TIMEOUT: Duration = Duration::from_secs(5);
const TOKEN: &str = "test-token-0123456789abcdef";

fn rack(tag: &str) -> Topology {
    rack_forwarding(tag, "l2-dsr")
}

/// The rack with its VIPs forwarding as `forwarding` says (`nat`: the backends unmodified).
fn rack_forwarding(tag: &str, forwarding: &str) -> Topology {
    rack_forwarding_on(TopologyOptions::new(tag), forwarding)
}

/// Like [`rack_forwarding`] on the rack `opts` describes.
fn rack_forwarding_on(opts: TopologyOptions, forwarding: &str) -> Topology {
    let mut topo = Topology::build(opts).expect("building the test rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    if forwarding == "nat" {
        topo.unmodified_backends().expect("unmodified backends");
    }
    if forwarding == "snat" {
        topo.source_nat_backends()
            .expect("backends without a way to the client");
    }
    let config = rack_config(&topo, forwarding, AttachMode::Native);
    topo.start_balancer(&to_toml(&config))
        .expect("starting the balancer");
    topo
}

/// The L2 DSR rack with its config as `edit` changes it.
fn rack_edited(tag: &str, edit: impl FnOnce(&mut balancer::base::config::RawConfig)) -> Topology {
    let mut topo = Topology::build(TopologyOptions::new(tag)).expect("building the test rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    let mut config = rack_config(&topo, "l2-dsr", AttachMode::Native);
    edit(&mut config);
    topo.start_balancer(&to_toml(&config))
        .expect("starting the balancer");
    topo
}

/// Stops the rack's daemon cleanly (SIGTERM: the program keeps forwarding) and starts it
/// again through `prefix` (see [`Topology::restart_balancer_with`]).
fn stop_and_restart_through(topo: &mut Topology, prefix: &[&str]) {
    let code = topo
        .process("balancer")
        .unwrap()
        .signal_and_wait(libc::SIGTERM, TIMEOUT)
        .unwrap();
    assert!(code.success(), "SIGTERM exit {code}");
    topo.restart_balancer_with(prefix, &[])
        .unwrap_or_else(|e| panic!("restarting the daemon through {prefix:?}: {e:#}"));
}

fn status(topo: &Topology) -> Status {
    let (code, out, err) = topo.cli(&["status", "--json"]).expect("cli");
    assert_eq!(code, 0, "balancer status failed: {err}");
    serde_json::from_str(&out).expect("status JSON")
}

fn served_by(topo: &Topology, requests: usize) -> BTreeMap<String, usize> {
    topo.client
        .run_in(move || {
            let mut served = BTreeMap::new();
            for _ in 0..requests {
                if let Ok(name) = http_get(SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT) {
                    *served.entry(name).or_insert(0) += 1;
                }
            }
            served
        })
        .expect("client thread")
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn every_command_round_trips_through_the_kernel() {
    let topo = rack("api");
    let dir = topo.rack.log_dir.clone();
    let config_path = dir.join("balancer.toml");
    let cli = |args: &[&str]| topo.cli(args).expect("cli");

    // Reads.
    let (code, out, _) = cli(&["vip", "list"]);
    assert_eq!(code, 0);
    assert!(out.contains("http4") && out.contains("echo6"), "{out}");
    let (code, out, _) = cli(&["backend", "list", "http4"]);
    assert_eq!(code, 0);
    assert!(out.contains("10.111.0.12"), "{out}");
    let (code, out, _) = cli(&["table", "http4"]);
    assert_eq!(code, 0);
    assert!(out.contains("33.33%"), "equal shares expected:\n{out}");
    let (code, out, _) = cli(&["stats"]);
    assert_eq!(code, 0);
    assert!(out.contains("conntrack_hit"), "{out}");

    // Changes, each visible in status and in the config file.
    let (code, out, err) = cli(&[
        "vip",
        "add",
        "web",
        "--address",
        "10.111.1.1",
        "--port",
        "8080",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = cli(&["backend", "add", "web", "10.111.0.11", "--weight", "3"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = cli(&["backend", "add", "web", "10.111.0.12"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(&["backend", "set-weight", "web", "10.111.0.12", "2"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(&["backend", "drain", "web", "10.111.0.11"]);
    assert_eq!(code, 0, "{err}");
    let s = status(&topo);
    let web = s.vips.iter().find(|v| v.name == "web").expect("web VIP");
    let b11 = web
        .backends
        .iter()
        .find(|b| b.address.to_string() == "10.111.0.11")
        .expect("b11");
    let b12 = web
        .backends
        .iter()
        .find(|b| b.address.to_string() == "10.111.0.12")
        .expect("b12");
    assert!(
        b11.drained && b11.weight == 3 && b11.table_share == 0.0,
        "{b11:?}"
    );
    assert!(b12.weight == 2 && b12.table_share == 1.0, "{b12:?}");
    let (code, _, err) = cli(&["backend", "undrain", "web", "10.111.0.11"]);
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = cli(&["table", "web", "--json"]);
    let table: Table = serde_json::from_str(&out).expect("table JSON");
    let share = |a: &str| {
        table
            .backends
            .iter()
            .find(|b| b.address.to_string() == a)
            .unwrap()
            .slot_share
    };
    assert!(
        (share("10.111.0.11") - 0.6).abs() < 0.001 && (share("10.111.0.12") - 0.4).abs() < 0.001
    );
    let file = std::fs::read_to_string(&config_path).expect("config file");
    assert!(
        file.contains("name = \"web\"") && file.contains("weight = 3"),
        "config file not written back:\n{file}"
    );

    // The error paths (unknown VIPs and backends, duplicates, invalid weights, malformed and
    // oversized bodies: a clear message, the right exit code, nothing changed) need no kernel:
    // balancer-user/tests/cli_without_root.rs runs them against the in-memory data plane.

    // Removal, reload of a hand edit, and a refused reload.
    let (code, _, err) = cli(&["backend", "del", "web", "10.111.0.12"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(&["vip", "del", "web"]);
    assert_eq!(code, 0, "{err}");
    let edited = std::fs::read_to_string(&config_path)
        .unwrap()
        .replace("name = \"udp6\"", "name = \"dns6\"");
    std::fs::write(&config_path, &edited).unwrap();
    let (code, out, err) = cli(&["reload"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(status(&topo).vips.iter().any(|v| v.name == "dns6"));
    std::fs::write(
        &config_path,
        edited.replace("table_size = 65537", "table_size = 65536"),
    )
    .unwrap();
    let (code, _, err) = cli(&["reload"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("must be a prime"), "{err}");
    assert!(
        status(&topo).vips.iter().any(|v| v.name == "dns6"),
        "a refused reload changed the state"
    );

    // Traffic still flows through what is left.
    assert_eq!(served_by(&topo, 30).values().sum::<usize>(), 30);
}

/// A directory of `tag` in the temporary directory with the API token in its `token` file
/// (0600, as an operator keeps it).
fn token_file(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("{PREFIX}-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    (dir, file)
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn the_tcp_listener_serves_tls_and_requires_a_client_certificate_and_its_token() {
    // The token and certificates must exist before the daemon starts.
    let (token_dir, token_file) = token_file("tok");
    let pki = TestPki::make(&token_dir.join("pki"), [127, 0, 0, 1].into()).expect("certificates");
    let topo = {
        let mut topo = Topology::build(TopologyOptions::new("tok")).expect("rack");
        topo.attach_peer_pass(AttachMode::Native).expect("pass");
        let mut config = rack_config(&topo, "l2-dsr", AttachMode::Native);
        config.metrics.listen = Some("127.0.0.1:9181".into());
        config.api.listen = Some("127.0.0.1:9180".into());
        config.api.token_file = Some(token_file.display().to_string());
        config.api.cert = Some(pki.server_cert.display().to_string());
        config.api.key = Some(pki.server_key.display().to_string());
        config.api.client_ca = Some(pki.ca.display().to_string());
        topo.start_balancer(&to_toml(&config)).expect("balancer");
        topo
    };
    let tls = |ca: &std::path::Path, identity: bool| ClientTls {
        ca: Some(ca.to_path_buf()),
        identity: identity.then(|| (pki.client_cert.clone(), pki.client_key.clone())),
    };
    let client = |token: &str, tls: ClientTls| {
        Client::new(Endpoint::Tcp {
            addr: "127.0.0.1:9180".into(),
            token: token.into(),
            tls: Some(tls),
        })
    };
    let (good, no_cert, wrong_ca) = (
        client(TOKEN, tls(&pki.ca, true)),
        client(TOKEN, tls(&pki.ca, false)),
        client(TOKEN, tls(&pki.other_ca, true)),
    );
    let wrong_token = client("wrong-token-0123456789", tls(&pki.ca, true));
    let plain = Client::new(Endpoint::Tcp {
        addr: "127.0.0.1:9180".into(),
        token: TOKEN.into(),
        tls: None,
    });
    let bin = balancer_tests::rack::binary("balancer").expect("balancer binary");
    let cli_args: Vec<String> = [
        "--connect",
        "127.0.0.1:9180",
        "--token-file",
        &token_file.display().to_string(),
        "--ca",
        &pki.ca.display().to_string(),
        "--cert",
        &pki.client_cert.display().to_string(),
        "--key",
        &pki.client_key.display().to_string(),
        "--json",
        "status",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let results = topo
        .lb
        .run_in(move || {
            let ok = good
                .get::<Status>("/v1/status")
                .map(|s| s.vips.len())
                .map_err(|e| e.to_string());
            let wrong = wrong_token
                .call::<(), ChangeResult>("DELETE", "/v1/vips/http4", None)
                .map_err(|e| (e.status(), e.to_string()));
            let refused: Vec<String> = [no_cert, wrong_ca, plain]
                .iter()
                .map(|c| match c.get::<Status>("/v1/status") {
                    Ok(_) => "answered".to_string(),
                    Err(e) => e.to_string(),
                })
                .collect();
            let cli = std::process::Command::new(&bin).args(&cli_args).output();
            let text = fetch_metrics("127.0.0.1:9181");
            (ok, wrong, refused, cli, text)
        })
        .expect("lb thread");
    let cli = results.3.expect("run the CLI");
    assert!(
        cli.status.success() && String::from_utf8_lossy(&cli.stdout).contains("\"http4\""),
        "the CLI over TLS: {cli:?}"
    );
    let refused = &results.2;
    assert!(
        refused[0].contains("TLS") && refused[0].contains("--cert"),
        "no client certificate: {}",
        refused[0]
    );
    assert!(
        refused[1].contains("TLS") && refused[1].contains("UnknownIssuer"),
        "the wrong CA: {}",
        refused[1]
    );
    assert_ne!(refused[2], "answered", "plain HTTP to the TLS listener");
    assert_eq!(results.0, Ok(6));
    let (code, message) = results.1.expect_err("a wrong token must be refused");
    assert_eq!(code, Some(401), "{message}");
    assert!(message.contains("bearer token"), "{message}");
    assert_eq!(
        status(&topo).vips.len(),
        6,
        "a refused request changed the state"
    );
    let text = results.4.expect("metrics page");
    for name in [
        "balancer_vip_packets_total{vip=\"http4\"}",
        "balancer_backend_weight{vip=\"http4\",backend=\"10.111.0.11\"} 1",
        "balancer_backend_healthy{vip=\"http4\",backend=\"10.111.0.11\"} 1",
        "balancer_conntrack_lookups_total{result=\"hit\"}",
        "balancer_drops_total{reason=\"malformed\"}",
        "balancer_table_rebuilds_total",
        "# TYPE balancer_table_publish_seconds histogram",
    ] {
        assert!(text.contains(name), "metrics page lacks {name}:\n{text}");
    }
    let _ = std::fs::remove_dir_all(token_dir);
}

/// `GET /metrics` over plain TCP.
/// The value of the series (its name and labels, up to the value) on a metrics page.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

fn fetch_metrics(addr: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn unhealthy_backends_leave_the_table_and_return() {
    let mut topo = rack("hc");
    // Turn on TCP checks of the HTTP port: every 100 ms, 3 failures to fall, 2 to rise.
    let mut config = rack_config(&topo, "l2-dsr", AttachMode::Native);
    vip_mut(&mut config, "http4").health = Some(tcp_health(100, 50, 3, 2));
    topo.reload_balancer(&to_toml(&config))
        .expect("enable health checks");
    let healthy_of = |topo: &Topology| -> BTreeMap<String, bool> {
        status(topo)
            .vips
            .into_iter()
            .find(|v| v.name == "http4")
            .map(|v| {
                v.backends
                    .iter()
                    .map(|b| (b.address.to_string(), b.healthy))
                    .collect()
            })
            .unwrap_or_default()
    };
    let wait_for = |topo: &Topology, want: bool, limit: Duration| -> Duration {
        let started = Instant::now();
        loop {
            if healthy_of(topo).get("10.111.0.13") == Some(&want) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < limit,
                "b3 did not become healthy={want} within {limit:?}: {:?}",
                healthy_of(topo)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(&topo, true, Duration::from_secs(5));
    assert!(served_by(&topo, 60).contains_key("b3"));

    topo.kill_backend_server(2).expect("stop b3's server");
    // Detection within interval x fall (300 ms) plus one check's timeout and scheduling slack.
    let detected = wait_for(&topo, false, Duration::from_millis(300 + 50 + 650));
    println!("b3 unhealthy after {detected:?} (interval 100 ms x fall 3)");
    let s = status(&topo);
    let b3 = s
        .vips
        .iter()
        .find(|v| v.name == "http4")
        .unwrap()
        .backends
        .iter()
        .find(|b| b.address.to_string() == "10.111.0.13")
        .unwrap()
        .clone();
    assert_eq!(b3.table_share, 0.0, "an unhealthy backend kept table slots");
    let served = served_by(&topo, 60);
    assert!(
        !served.contains_key("b3"),
        "new connections reached a dead backend: {served:?}"
    );
    assert_eq!(
        served.values().sum::<usize>(),
        60,
        "connections failed while b3 was out: {served:?}"
    );

    topo.start_backend_server(2).expect("restart b3's server");
    let recovered = wait_for(&topo, true, Duration::from_millis(200 + 50 + 750));
    println!("b3 healthy again after {recovered:?} (interval 100 ms x rise 2)");
    assert!(
        served_by(&topo, 60).contains_key("b3"),
        "b3 did not get traffic back"
    );
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn restarts_lose_nothing() {
    restarts_lose_nothing_when(rack("rst"));
}

/// The same with NAT: the pinned NAT_REPLIES keep every flow's way back across the restarts.
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn restarts_lose_no_nat_flow() {
    restarts_lose_nothing_when(rack_forwarding("rstnat", "nat"));
}

/// The same with source NAT: the pinned SNAT_FLOWS and SNAT_PORTS keep every flow's port, and
/// the restarted daemon's expiry sweeps leave live flows alone.
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn restarts_lose_no_source_nat_flow() {
    restarts_lose_nothing_when(rack_forwarding("rstsnat", "snat"));
}

/// The same with NAT's backends on another link than the clients (`[nat] interface`): both
/// pinned links are adopted and replaced; `balancer stop --detach` then takes the program off
/// both interfaces.
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn restarts_lose_nothing_on_two_links() {
    let mut opts = TopologyOptions::new("rst2l");
    opts.client_link = true;
    let mut topo = rack_forwarding_on(opts, "nat");
    let xdp_on = |topo: &Topology| -> Vec<String> {
        ["eth0", "eth1"]
            .into_iter()
            .filter(|dev| {
                let out = topo.lb.exec(&["ip", "-d", "link", "show", "dev", dev]);
                String::from_utf8_lossy(&out.expect("ip link").stdout).contains("prog/xdp")
            })
            .map(String::from)
            .collect()
    };
    assert_eq!(xdp_on(&topo), ["eth0", "eth1"], "attached to both links");
    topo = restarts_lose_nothing_when(topo);
    let log = topo.process("balancer").unwrap().log_text();
    assert!(log.contains("program replaced atomically"), "{log}");
    let (code, _, err) = topo.cli(&["stop", "--detach"]).expect("cli");
    assert_eq!(code, 0, "{err}");
    let detached = poll(Duration::from_secs(10), || {
        xdp_on(&topo).is_empty().then_some(())
    });
    assert!(
        detached.is_some(),
        "still attached after stop --detach: {:?}",
        xdp_on(&topo)
    );
}

/// A panic inside a weight round, with the daemon's state locked (injected: debug builds read
/// `BALANCER_INJECT_PANIC`), ends the process at once with SIGABRT rather than leaving it up
/// with a poisoned lock; the restarted daemon adopts the pinned program, no echo stream breaks
/// and the API works again.
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn a_panic_ends_the_daemon_and_its_restart_loses_nothing() {
    use std::os::unix::process::ExitStatusExt as _;
    // echo4 under least-conn: a weight round every telemetry interval (100 ms).
    let mut topo = rack_edited("pnc", |config| {
        vip_mut(config, "echo4").policy = Some(balancer::base::config::RawPolicy {
            kind: Some("least-conn".into()),
            ..Default::default()
        });
    });
    let until = Instant::now() + Duration::from_secs(14);
    let streams = topo
        .echo_streams(8, until, TIMEOUT)
        .expect("client threads");
    std::thread::sleep(Duration::from_secs(2));
    // A clean stop, then a daemon that adopts the program and panics 5 s into its rounds.
    stop_and_restart_through(&mut topo, &["env", "BALANCER_INJECT_PANIC=weight-round:50"]);
    let status = topo
        .process("balancer")
        .unwrap()
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", topo.logs()));
    let log = topo.process("balancer").unwrap().log_text();
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}\n{log}");
    assert!(
        log.contains("injected panic in weight-round 50") && log.contains("aborting"),
        "{log}"
    );
    // Forwarding went on meanwhile; the service manager's restart adopts the program.
    topo.restart_balancer(&[]).expect("restart after the panic");
    let log = topo.process("balancer").unwrap().log_text();
    assert!(log.contains("adopted the pinned program"), "{log}");
    let (code, _, err) = topo
        .cli(&["backend", "set-weight", "echo4", "10.111.0.11", "3"])
        .unwrap();
    assert_eq!(code, 0, "{err}");
    let joined = join_streams(streams, "across the panic and the restart")
        .unwrap_or_else(|e| panic!("{e:#}\n{}", topo.logs()));
    assert!(joined.fewest_bytes > 0, "a stream moved nothing");
}

/// A flood of connections to the API's TCP listener, held open and silent, by more than the
/// daemon's descriptors: the listener takes at most its cap, so the health checks still find
/// descriptors and every backend stays up; the API answers again once the flood ends.
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn a_connection_flood_leaves_the_health_checks_their_descriptors() {
    let (_, token_file) = token_file("fld");
    let mut topo = rack_edited("fld", |config| {
        config.api.listen = Some("127.0.0.1:9180".into());
        config.api.token_file = Some(token_file.display().to_string());
        for v in config
            .vip
            .iter_mut()
            .filter(|v| v.protocol.as_deref() == Some("tcp"))
        {
            v.health = Some(tcp_health(200, 150, 2, 1));
        }
    });
    // The same daemon again with 512 descriptors (its own use: a few dozen): a flood of
    // connections past them would take them all without the listener's cap of 256.
    stop_and_restart_through(&mut topo, &["prlimit", "--nofile=512:512"]);
    let pid = topo.process("balancer").unwrap().pid();
    let descriptors = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let all_healthy = |topo: &Topology| {
        status(topo)
            .vips
            .iter()
            .flat_map(|v| v.backends.iter())
            .all(|b| b.healthy)
    };
    poll(Duration::from_secs(10), || all_healthy(&topo).then_some(()))
        .expect("every backend healthy before the flood");
    let before = descriptors();
    let flood = topo
        .lb
        .spawn_in(|| {
            let mut held = Vec::new();
            let addr: SocketAddr = "127.0.0.1:9180".parse().unwrap();
            for _ in 0..1500 {
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(50)) {
                    Ok(s) => held.push(s),
                    // The backlog is full: past the daemon's descriptors already.
                    Err(_) if held.len() > 600 => break,
                    Err(_) => {}
                }
            }
            let n = held.len();
            std::thread::sleep(Duration::from_secs(6));
            n
        })
        .unwrap();
    let started = Instant::now();
    let mut most = 0;
    while started.elapsed() < Duration::from_secs(6) {
        most = most.max(descriptors());
        assert!(
            all_healthy(&topo),
            "a backend went down under the flood ({} descriptors):\n{}",
            descriptors(),
            topo.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let opened = flood.join().unwrap().unwrap();
    println!(
        "flood: {opened} connections opened; the daemon held {before} descriptors before, at most {most} during"
    );
    assert!(opened > 512, "the flood opened only {opened} connections");
    assert!(most < 512, "the daemon ran out of descriptors: {most}");
    // The API over TCP (in the balancer's namespace) answers once the flood is gone.
    let answered = topo
        .lb
        .spawn_in(|| {
            let client = Client::new(Endpoint::Tcp {
                addr: "127.0.0.1:9180".into(),
                token: TOKEN.into(),
                tls: None,
            });
            let started = Instant::now();
            loop {
                match client.call::<(), Status>("GET", "/v1/status", None) {
                    Ok(_) => return Ok(started.elapsed()),
                    Err(e) if started.elapsed() > Duration::from_secs(15) => {
                        return Err(e.to_string());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        })
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
    match answered {
        Ok(after) => println!("the API answered {after:?} after the flood"),
        Err(e) => panic!(
            "the API did not answer after the flood: {e}\n{}",
            topo.logs()
        ),
    }
}

/// 20 TCP streams and a UDP probe every 10 ms through a SIGKILL, a restart, a SIGTERM and a
/// `--replace`: no stream breaks, no probe goes unanswered.
fn restarts_lose_nothing_when(mut topo: Topology) -> Topology {
    const STREAMS: usize = 20;
    let run_for = Duration::from_secs(20);
    let until = Instant::now() + run_for;
    // Long-lived TCP streams, and a UDP probe every 10 ms that records each answer's time.
    let streams = topo
        .echo_streams(STREAMS, until, TIMEOUT)
        .expect("client threads");
    let udp = topo
        .client
        .spawn_in(move || -> Result<(usize, usize, Duration), String> {
            let sock = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
            sock.connect(SocketAddr::new(VIP4.into(), UDP_PORT))
                .map_err(|e| e.to_string())?;
            sock.set_read_timeout(Some(Duration::from_millis(500)))
                .map_err(|e| e.to_string())?;
            let (mut sent, mut answered) = (0, 0);
            let mut last = Instant::now();
            let mut longest = Duration::ZERO;
            let mut buf = [0u8; 256];
            while Instant::now() < until {
                sent += 1;
                sock.send(format!("probe {sent}").as_bytes())
                    .map_err(|e| e.to_string())?;
                if sock.recv(&mut buf).is_ok() {
                    answered += 1;
                    longest = longest.max(last.elapsed());
                    last = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok((sent, answered, longest))
        })
        .unwrap();

    let started = Instant::now();
    let at = |secs: u64| {
        let target = Duration::from_secs(secs);
        if let Some(rest) = target.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    };
    at(4);
    // SIGKILL: no cleanup at all; the pinned program keeps forwarding.
    topo.process("balancer")
        .unwrap()
        .signal_and_wait(libc::SIGKILL, TIMEOUT)
        .unwrap();
    at(7);
    topo.restart_balancer(&[]).expect("restart after SIGKILL");
    let log = topo.process("balancer").unwrap().log_text();
    assert!(
        log.contains("adopted the pinned program"),
        "the restarted daemon did not adopt:\n{log}"
    );
    at(10);
    // SIGTERM: a clean stop that leaves the program forwarding.
    let code = topo
        .process("balancer")
        .unwrap()
        .signal_and_wait(libc::SIGTERM, TIMEOUT)
        .unwrap();
    assert!(code.success(), "SIGTERM exit {code}");
    at(12);
    // An upgrade in place: the program is swapped inside the pinned link.
    topo.restart_balancer(&["--replace"])
        .expect("restart with --replace");
    let log = topo.process("balancer").unwrap().log_text();
    assert!(log.contains("program replaced atomically"), "{log}");
    at(14);
    // A change through the API after all that still works, and traffic follows it.
    let (code, _, err) = topo
        .cli(&["backend", "set-weight", "echo4", "10.111.0.11", "4"])
        .unwrap();
    assert_eq!(code, 0, "{err}");

    let joined = join_streams(streams, "across the restarts")
        .unwrap_or_else(|e| panic!("{e:#}\n{}", topo.logs()));
    assert!(
        joined.fewest_bytes > 1 << 20,
        "a stream moved only {} bytes in {run_for:?}",
        joined.fewest_bytes
    );
    let per_backend = joined.per_backend;
    let (sent, answered, longest) = udp.join().unwrap().unwrap().unwrap();
    println!(
        "{STREAMS} TCP streams over {run_for:?} on {per_backend:?}: none broke; UDP: {answered}/{sent} answered, longest gap between answers {longest:?}"
    );
    assert_eq!(
        answered, sent,
        "UDP probes went unanswered: forwarding paused"
    );
    assert!(
        longest < Duration::from_millis(500),
        "forwarding paused for {longest:?}"
    );
    topo
}

/// A tmux server of its own for one test, killed when the test ends (also when it fails).
struct Tmux {
    server: String,
}

impl Tmux {
    fn new(tag: &str) -> Tmux {
        let tmux = Tmux {
            server: format!("{PREFIX}-{tag}"),
        };
        let _ = tmux.run(&["kill-server"]);
        tmux
    }

    fn run(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        std::process::Command::new("tmux")
            .args(["-L", &self.server])
            .args(args)
            .output()
    }

    /// The screen of `session` as text.
    fn screen(&self, session: &str) -> String {
        self.run(&["capture-pane", "-p", "-t", session])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Waits until the screen holds every one of `wanted`; returns the last screen.
    fn wait_for(&self, session: &str, wanted: &[&str], limit: Duration) -> Result<String, String> {
        let started = Instant::now();
        loop {
            let screen = self.screen(session);
            if wanted.iter().all(|w| screen.contains(w)) {
                return Ok(screen);
            }
            if started.elapsed() > limit {
                return Err(screen);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn top_shows_the_vips_and_backends_live_and_quits_on_q() {
    let topo = rack("top");
    let bin = balancer_tests::rack::binary("balancer").expect("balancer binary");
    let tmux = Tmux::new("top");
    let command = format!(
        "{} --socket {} top --interval-ms 200",
        bin.display(),
        topo.api_socket().display()
    );
    let started = tmux
        .run(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "160",
            "-y",
            "70",
            &command,
        ])
        .expect("tmux");
    assert!(started.status.success(), "tmux: {started:?}");
    let screen = tmux
        .wait_for(
            "top",
            &[
                "balancer top",
                "http4",
                // The last VIP's box: a capture taken while top draws its first frame
                // can hold only the boxes above it.
                "udp6",
                "10.111.0.11",
                "WEIGHT",
                "SHARE",
                "KV",
                "HEALTH",
            ],
            Duration::from_secs(15),
        )
        .unwrap_or_else(|s| panic!("top never showed every VIP of the rack:\n{s}"));
    println!("{screen}");
    // A change shows within a refresh or two.
    let (code, _, err) = topo
        .cli(&["backend", "set-weight", "http4", "10.111.0.11", "7"])
        .unwrap();
    assert_eq!(code, 0, "{err}");
    // The backend's row in http4's box (it serves other VIPs too).
    let row = |screen: &str| {
        screen
            .lines()
            .skip_while(|l| !l.contains(" http4 "))
            .find(|l| l.contains("10.111.0.11"))
            .map(str::to_string)
            .unwrap_or_default()
    };
    let started = Instant::now();
    while !row(&tmux.screen("top"))
        .split_whitespace()
        .any(|w| w == "7")
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the new weight never showed:\n{}",
            tmux.screen("top")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    tmux.run(&["send-keys", "-t", "top", "q"]).unwrap();
    let started = Instant::now();
    while tmux
        .run(&["has-session", "-t", "top"])
        .is_ok_and(|o| o.status.success())
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "top did not quit on q:\n{}",
            tmux.screen("top")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn a_dual_stack_multi_port_service_is_one_block_and_a_host_drains_in_one_command() {
    use balancer::base::config::RawVip;
    use balancer_tests::traffic::echo_open;

    let mut topo = Topology::build(TopologyOptions::new("service")).expect("building the rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    let mut config = rack_config(&topo, "l2-dsr", AttachMode::Native);
    // The rack's HTTP and echo VIPs, v4 and v6, as one service: one block, one backend list
    // (the backends' IPv4 addresses: l2-dsr reaches the same hosts for both families).
    let template = config.vip[0].clone();
    config.vip.retain(|v| v.protocol.as_deref() == Some("udp"));
    config.vip.push(RawVip {
        name: Some("web".into()),
        address: None,
        addresses: vec![VIP4.to_string(), VIP6.to_string()],
        port: None,
        ports: vec![HTTP_PORT.into(), ECHO_PORT.into()],
        protocol: None,
        ..template
    });
    let text = to_toml(&config);
    assert_eq!(text.matches("[[vip]]").count(), 3, "{text}");
    topo.start_balancer(&text).expect("starting the balancer");
    let config_path = topo.rack.log_dir.join("balancer.toml");
    let (code, out, err) = topo
        .cli(&["check-config", config_path.to_str().unwrap()])
        .expect("cli");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "service web expands to 4 VIPs: web-80-v4, web-9000-v4, web-80-v6, web-9000-v6"
        ),
        "{out}"
    );

    // Which backends serve 30 fresh connections to each of the four endpoints.
    let endpoints: Vec<SocketAddr> = [IpAddr::from(VIP4), IpAddr::from(VIP6)]
        .into_iter()
        .flat_map(|a| [SocketAddr::new(a, HTTP_PORT), SocketAddr::new(a, ECHO_PORT)])
        .collect();
    let served = |topo: &Topology| -> Vec<BTreeMap<String, usize>> {
        let endpoints = endpoints.clone();
        topo.client
            .run_in(move || {
                endpoints
                    .iter()
                    .map(|&addr| {
                        let mut served = BTreeMap::new();
                        for _ in 0..30 {
                            let name = if addr.port() == HTTP_PORT {
                                http_get(addr, TIMEOUT).ok()
                            } else {
                                echo_open(addr, TIMEOUT).ok().map(|(name, _)| name)
                            };
                            *served
                                .entry(name.unwrap_or_else(|| "failed".into()))
                                .or_insert(0) += 1;
                        }
                        served
                    })
                    .collect()
            })
            .expect("client thread")
    };
    for (addr, s) in endpoints.iter().zip(served(&topo)) {
        assert!(
            !s.contains_key("failed") && s.contains_key("b1"),
            "{addr}: {s:?}"
        );
    }

    // One command drains host b1 in the four VIPs of the service and in udp4 at once; the
    // file keeps one block for the service.
    let b1 = backend4(0).to_string();
    let (code, out, err) = topo
        .cli(&["backend", "drain", "--everywhere", &b1])
        .expect("cli");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("drained in 5 VIP(s): udp4, web-80-v4, web-9000-v4, web-80-v6, web-9000-v6"),
        "{out}"
    );
    for (addr, s) in endpoints.iter().zip(served(&topo)) {
        assert!(
            !s.contains_key("failed") && !s.contains_key("b1") && s.len() == 2,
            "{addr} after the drain: {s:?}"
        );
    }
    let file = std::fs::read_to_string(&config_path).unwrap();
    assert_eq!(file.matches("[[vip]]").count(), 3, "{file}");
    assert!(
        file.contains("ports = [80, 9000]") && file.contains("drained = true"),
        "{file}"
    );
    let (code, _, err) = topo
        .cli(&["backend", "undrain", "--everywhere", &b1])
        .expect("cli");
    assert_eq!(code, 0, "{err}");
    for (addr, s) in endpoints.iter().zip(served(&topo)) {
        assert!(
            !s.contains_key("failed") && s.contains_key("b1"),
            "{addr}: {s:?}"
        );
    }
}

/// Source NAT with two ports per backend service: of 12 concurrent connections to one VIP
/// port at most 6 (three backends) are admitted; the rest are dropped, and the metric and the
/// log say so. Once the admitted ones close, their ports come back.
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn source_nat_port_exhaustion_is_counted_and_logged_and_ports_come_back() {
    let mut topo = Topology::build(TopologyOptions::new("snatx")).expect("building the test rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    topo.source_nat_backends()
        .expect("backends without a way to the client");
    let mut config = rack_config(&topo, "snat", AttachMode::Native);
    config.nat.ports = Some("20000-20001".into());
    config.nat.tcp_closed_timeout_secs = Some(1);
    config.metrics.listen = Some("127.0.0.1:9181".into());
    topo.start_balancer(&to_toml(&config))
        .expect("starting the balancer");

    let addr = SocketAddr::new(VIP4.into(), ECHO_PORT);
    let held = topo
        .client
        .spawn_in(move || {
            let tries: Vec<_> = (0..12)
                .map(|_| {
                    std::thread::spawn(move || {
                        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(2500))
                    })
                })
                .collect();
            let streams: Vec<_> = tries
                .into_iter()
                .filter_map(|t| t.join().ok().and_then(Result::ok))
                .collect();
            let admitted = streams.len();
            // Held open while the metrics are read.
            std::thread::sleep(Duration::from_secs(4));
            drop(streams);
            admitted
        })
        .expect("client thread");
    std::thread::sleep(Duration::from_secs(4));
    let text = topo
        .lb
        .run_in(|| fetch_metrics("127.0.0.1:9181"))
        .expect("lb thread")
        .expect("metrics page");
    let admitted = held.join().expect("client thread").expect("client");
    let value = |series: &str| metric(&text, series);
    assert!(
        (1..=6).contains(&admitted),
        "{admitted} of 12 connections admitted with 2 ports for each of 3 backends\n{}",
        topo.logs()
    );
    assert_eq!(value("balancer_nat_source_flows "), admitted as f64);
    assert!(
        value("balancer_nat_source_dropped_total{reason=\"no_port\"} ") >= (12 - admitted) as f64,
        "every refused connection's SYN counted"
    );
    let log = topo.process("balancer").unwrap().log_text();
    assert!(
        log.contains("new flows found no free source port for their backend (nat.ports 20000-20001, 2 per backend address and port)"),
        "no log line about the exhausted ports:\n{log}"
    );
    // Closed (FIN both ways) and past the 1 s closed timeout: every port is free again.
    std::thread::sleep(Duration::from_secs(4));
    let text = topo
        .lb
        .run_in(|| fetch_metrics("127.0.0.1:9181"))
        .expect("lb thread")
        .expect("metrics page");
    let value = |series: &str| metric(&text, series);
    assert_eq!(value("balancer_nat_source_flows "), 0.0, "ports given back");
    assert!(value("balancer_nat_source_flows_expired_total ") >= admitted as f64);
    let name = topo
        .client
        .run_in(move || {
            balancer_tests::traffic::http_get(SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT)
                .map_err(|e| format!("{e:#}"))
        })
        .expect("client thread")
        .expect("a new connection after the ports came back");
    assert!(name.starts_with('b'));
}
