//! The whole daemon on the in-memory data plane, driven through its API by the real `balancer`
//! binary over a Unix socket: every CLI command and API route, error paths included, in a plain
//! `cargo test` (no root, no kernel). The root tests in `tests/` cover what needs the kernel.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use balancer::base::config::Config;
use balancer::base::net::MacAddr;
use balancer::dataplane::memory::MemoryDataplane;
use balancer::dataplane::netinfo::{DerivedNextHops, Interface, Links};
use balancer::dataplane::pinning::Pins;
use balancer::serve::api::client::{Client, Endpoint};
use balancer::serve::api::server::{ApiState, router};
use balancer::state::metrics::Metrics;
use balancer::state::wire::{Status, Table, VipWeights};
use balancer::state::{Daemon, Host};
use balancer::steering::fleet::bgp::RecordedRoutes;

/// A daemon serving its API on `<dir>/api.sock`, on its own runtime thread.
struct Rig {
    dir: PathBuf,
    socket: PathBuf,
    config_path: PathBuf,
    daemon: Arc<Mutex<Daemon>>,
    stop: tokio::sync::watch::Receiver<Option<bool>>,
    /// The routes the daemon announced (`[bgp]` set), in place of BIRD.
    routes: RecordedRoutes,
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config_text(dir: &Path) -> String {
    format!(
        r#"
interface = "lb0"
pin_dir = "{dir}/pins"
state_file = "{dir}/state.json"

[api]
socket = "{dir}/api.sock"

[bgp]
prefixes = ["10.111.0.0/16", "fd00:111::/64"]
routes_v4 = "{dir}/vips4.conf"
routes_v6 = "{dir}/vips6.conf"
socket = "{dir}/bird.ctl"

[[vip]]
name = "http4"
address = "10.111.0.100"
port = 80

  [[vip.backend]]
  address = "10.111.0.11"
  [[vip.backend]]
  address = "10.111.0.12"
  [[vip.backend]]
  address = "10.111.0.13"

[[vip]]
name = "llm"
address = "10.111.0.101"
port = 8000
telemetry = {{ source = "push" }}
policy = {{ kind = "composite" }}

  [[vip.backend]]
  address = "10.111.0.21"
  [[vip.backend]]
  address = "10.111.0.22"

[[vip]]
name = "echo6"
address = "fd00:111::100"
port = 7
protocol = "udp"

  [[vip.backend]]
  address = "fd00:111::11"
"#,
        dir = dir.display()
    )
}

fn rig(tag: &str) -> Rig {
    rig_with(tag, &config_text)
}

/// A rig whose config file is `text(dir)`.
fn rig_with(tag: &str, text: &dyn Fn(&Path) -> String) -> Rig {
    let dir = std::env::temp_dir().join(format!("balancer-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("balancer.toml");
    std::fs::write(&config_path, text(&dir)).unwrap();
    let config = Config::load(&config_path).unwrap();
    let routes = RecordedRoutes::default();
    let host = Host {
        links: Links::one(Interface {
            name: "lb0".into(),
            index: 7,
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            mtu: 1500,
            addresses: vec![("10.111.0.1".parse().unwrap(), 24)],
        }),
        pins: Pins::new(dir.join("pins")),
        next_hops: Box::new(DerivedNextHops),
        neighbour_timeout: Duration::from_secs(1),
        routes: Box::new(routes.clone()),
    };
    let daemon = Daemon::publish(
        config,
        config_path.clone(),
        host,
        Box::new(MemoryDataplane::default()),
        Metrics::new().unwrap(),
    )
    .unwrap();
    let daemon = Arc::new(Mutex::new(daemon));
    let (stop_tx, stop) = tokio::sync::watch::channel(None);
    let socket = dir.join("api.sock");
    let state = ApiState {
        daemon: daemon.clone(),
        stop: stop_tx,
    };
    let path = socket.clone();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                axum::serve(listener, router(state)).await.unwrap();
            })
    });
    for _ in 0..200 {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Rig {
        dir,
        socket,
        config_path,
        daemon,
        stop,
        routes,
    }
}

impl Rig {
    /// Runs `balancer <args>` against the daemon: (exit code, stdout, stderr).
    fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_balancer"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .env_remove("BALANCER_SOCKET")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.cli(args);
        assert_eq!(code, 0, "{args:?}: stdout {out:?}, stderr {err:?}");
        out
    }

    fn json<T: serde::de::DeserializeOwned>(&self, args: &[&str]) -> T {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.ok(&all);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}\n{out}"))
    }

    fn client(&self) -> Client {
        Client::new(Endpoint::Unix(self.socket.clone()))
    }
}

/// `POST path` with `body` over the socket by hand, as a client without a size limit sends
/// it; the daemon may answer and close before the whole body is written.
fn oversized_post(socket: &std::path::Path, path: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: balancer\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body));
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn backend_weight(s: &Status, vip: &str, addr: &str) -> (u32, bool, f64) {
    let v = s.vips.iter().find(|v| v.name == vip).expect("VIP");
    let b = v
        .backends
        .iter()
        .find(|b| b.address.to_string() == addr)
        .unwrap_or_else(|| panic!("{vip} has no {addr}: {:?}", v.backends));
    (b.weight, b.drained, b.table_share)
}

#[test]
fn every_command_round_trips_and_errors_change_nothing() {
    let rig = rig("commands");

    // Reads.
    let out = rig.ok(&["status"]);
    assert!(
        out.contains("VIP http4 10.111.0.100:80/tcp") && out.contains("[fd00:111::100]:7/udp"),
        "{out}"
    );
    let s: Status = rig.json(&["status"]);
    assert_eq!(s.vips.len(), 3);
    let out = rig.ok(&["vip", "list"]);
    assert!(
        out.contains("http4") && out.contains("[fd00:111::100]:7"),
        "{out}"
    );
    let out = rig.ok(&["backend", "list", "http4"]);
    assert!(out.contains("10.111.0.12"), "{out}");
    let out = rig.ok(&["table", "http4"]);
    assert!(out.contains("33.33%"), "equal shares expected:\n{out}");
    let out = rig.ok(&["stats"]);
    assert!(out.contains("conntrack_hit"), "{out}");
    let out = rig.ok(&["weights"]);
    assert!(out.contains("llm") && out.contains("10.111.0.21"), "{out}");

    // Changes, each visible in status, in the data plane and in the config file.
    rig.ok(&[
        "vip",
        "add",
        "web",
        "--address",
        "10.111.1.1",
        "--port",
        "8080",
    ]);
    rig.ok(&["backend", "add", "web", "10.111.0.11", "--weight", "3"]);
    rig.ok(&["backend", "add", "web", "10.111.0.12"]);
    rig.ok(&["backend", "set-weight", "web", "10.111.0.12", "2"]);
    rig.ok(&["backend", "drain", "web", "10.111.0.11"]);
    let s: Status = rig.json(&["status"]);
    assert_eq!(backend_weight(&s, "web", "10.111.0.11"), (3, true, 0.0));
    assert_eq!(backend_weight(&s, "web", "10.111.0.12"), (2, false, 1.0));
    rig.ok(&["backend", "undrain", "web", "10.111.0.11"]);
    let table: Table = rig.json(&["table", "web"]);
    let share = |a: &str| {
        table
            .backends
            .iter()
            .find(|b| b.address.to_string() == a)
            .unwrap()
            .slot_share
    };
    assert!((share("10.111.0.11") - 0.6).abs() < 0.001, "{table:?}");
    assert!((share("10.111.0.12") - 0.4).abs() < 0.001, "{table:?}");
    let out = rig.ok(&["vip", "set-scheduler", "web", "least-conn"]);
    assert!(out.contains("web"), "{out}");
    let listed: Vec<serde_json::Value> = rig.json(&["vip", "list"]);
    let web = listed.iter().find(|v| v["name"] == "web").unwrap();
    assert_eq!(web["scheduler"], "least-conn", "{web}");
    // Drained from BGP: its route goes (the routing daemon is told the rest), then returns.
    let web: IpAddr = "10.111.1.1".parse().unwrap();
    let announced = || rig.routes.installed().last().cloned().unwrap_or_default();
    rig.ok(&["vip", "drain", "web"]);
    assert!(rig.daemon.lock().unwrap().drained_vips.contains("web"));
    assert!(
        !announced().contains(&web) && announced().contains(&"10.111.0.100".parse().unwrap()),
        "{:?}",
        announced()
    );
    rig.ok(&["vip", "undrain", "web"]);
    assert!(!rig.daemon.lock().unwrap().drained_vips.contains("web"));
    assert!(announced().contains(&web), "{:?}", announced());
    let file = std::fs::read_to_string(&rig.config_path).unwrap();
    assert!(
        file.contains("name = \"web\"")
            && file.contains("weight = 3")
            && file.contains("least-conn"),
        "config file not written back:\n{file}"
    );
    assert!(
        rig.dir.join("state.json").exists(),
        "the state file goes with every change"
    );

    // Errors: a clear message, a meaningful exit code, and no change anywhere.
    let before = std::fs::read_to_string(&rig.config_path).unwrap();
    let before_status = serde_json::to_string(&rig.json::<Status>(&["status"]).vips).unwrap();
    let cases: &[(&[&str], i32, &str)] = &[
        (&["backend", "list", "nosuch"], 3, "no VIP named \"nosuch\""),
        (&["vip", "del", "nosuch"], 3, "no VIP named"),
        (&["table", "nosuch"], 3, "no VIP named"),
        (&["weights", "nosuch"], 3, "nosuch"),
        (
            &["backend", "add", "web", "10.111.0.11"],
            4,
            "already in VIP",
        ),
        (
            &[
                "vip",
                "add",
                "web",
                "--address",
                "10.111.1.1",
                "--port",
                "8081",
            ],
            4,
            "a VIP named \"web\" exists",
        ),
        (
            &[
                "vip",
                "add",
                "dup",
                "--address",
                "10.111.1.1",
                "--port",
                "8080",
            ],
            4,
            "already serves 10.111.1.1:8080/tcp",
        ),
        (
            &[
                "vip",
                "add",
                "dup6",
                "--address",
                "fd00:111::100",
                "--port",
                "7",
                "--protocol",
                "udp",
            ],
            4,
            "already serves [fd00:111::100]:7/udp",
        ),
        (
            &["backend", "set-weight", "web", "10.111.0.11", "70000"],
            2,
            "weight = 70000: must be between 0 and 65535",
        ),
        (
            &["backend", "set-weight", "web", "10.111.0.11", "-1"],
            2,
            "must be between 0 and 65535",
        ),
        (
            &["backend", "drain", "web", "10.111.0.99"],
            3,
            "has no backend 10.111.0.99",
        ),
        (
            &[
                "vip",
                "add",
                "bad",
                "--address",
                "10.111.1.1",
                "--port",
                "81",
                "--protocol",
                "sctp",
            ],
            2,
            "vip.protocol = \"sctp\"",
        ),
        (
            &[
                "vip",
                "add",
                "bad",
                "--address",
                "10.111.1.1",
                "--port",
                "81",
                "--table-size",
                "1000",
            ],
            2,
            "must be a prime",
        ),
        (&["vip", "set-scheduler", "web", "fastest"], 2, "fastest"),
        (
            &["--connect", "127.0.0.1:1", "status"],
            2,
            "needs --token-file",
        ),
    ];
    for (args, want_code, want_msg) in cases {
        let (code, out, err) = rig.cli(args);
        assert_eq!(
            code, *want_code,
            "{args:?}: exit {code}, stdout {out:?}, stderr {err:?}"
        );
        assert!(
            err.contains(want_msg),
            "{args:?}: expected {want_msg:?} in {err:?}"
        );
    }
    // Raw HTTP: malformed JSON, wrong shapes, oversized bodies, unknown endpoints, bad reports.
    let client = rig.client();
    let raw = |method: &str, path: &str, body: &[u8]| {
        let (status, body) = client.raw(method, path, Some(body)).expect("request");
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    let (status, body) = raw("POST", "/v1/vips", b"{not json");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid request body"), "{body}");
    let (status, body) = raw("POST", "/v1/vips", br#"{"address": 5}"#);
    assert!(status == 422 || status == 400, "{status} {body}");
    let (status, _) = raw(
        "POST",
        "/v1/vips",
        br#"{"address": "10.111.1.1", "port": 1, "bogus": true}"#,
    );
    assert!(status == 422 || status == 400);
    let huge = vec![b' '; 2 * 1024 * 1024];
    // The client refuses it itself; the daemon, sent it by hand, answers 413.
    let refused = client.raw("POST", "/v1/vips", Some(&huge)).unwrap_err();
    assert_eq!(refused.status(), Some(413), "{refused}");
    let (status, body) = oversized_post(&rig.socket, "/v1/vips", &huge);
    assert_eq!(status, 413, "{body}");
    let (status, _) = raw("GET", "/v1/nothing", b"");
    assert_eq!(status, 404);
    let (status, body) = raw(
        "POST",
        "/v1/backends/10.111.0.21/report",
        br#"{"kv_usage": 1.5}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("kv_usage"), "{body}");
    let (status, body) = raw(
        "POST",
        "/v1/backends/10.111.0.11/report",
        br#"{"kv_usage": 0.5}"#,
    );
    assert_eq!(status, 404, "no VIP takes pushed reports from it: {body}");
    let (status, body) = raw(
        "POST",
        "/v1/backends/not-an-address/report",
        br#"{"kv_usage": 0.5}"#,
    );
    assert_eq!(status, 400, "{body}");
    let (status, body) = raw("PUT", "/v1/vips/web/backends/10.111.0.11/weight", b"{}");
    assert!(status == 422 || status == 400, "{status} {body}");
    assert_eq!(
        std::fs::read_to_string(&rig.config_path).unwrap(),
        before,
        "an error changed the config file"
    );
    assert_eq!(
        serde_json::to_string(&rig.json::<Status>(&["status"]).vips).unwrap(),
        before_status,
        "an error changed the state"
    );

    // Removal, reload of a hand edit, and a refused reload.
    rig.ok(&["backend", "del", "web", "10.111.0.12"]);
    rig.ok(&["vip", "del", "web"]);
    let edited = std::fs::read_to_string(&rig.config_path)
        .unwrap()
        .replace("name = \"echo6\"", "name = \"dns6\"");
    std::fs::write(&rig.config_path, &edited).unwrap();
    rig.ok(&["reload"]);
    let s: Status = rig.json(&["status"]);
    assert!(s.vips.iter().any(|v| v.name == "dns6"), "{:?}", s.vips);
    std::fs::write(
        &rig.config_path,
        edited.replace("table_size = 65537", "table_size = 65536"),
    )
    .unwrap();
    let (code, _, err) = rig.cli(&["reload"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("must be a prime"), "{err}");
    let s: Status = rig.json(&["status"]);
    assert!(
        s.vips.iter().any(|v| v.name == "dns6"),
        "a refused reload changed the state"
    );
}

#[test]
fn pushed_reports_move_the_weights_and_stop_reaches_the_main_loop() {
    let mut rig = rig("push");
    let client = rig.client();
    // One backend full, one idle: after a weight round the idle one takes the new flows.
    for (addr, kv, waiting) in [("10.111.0.21", 0.99, 8.0), ("10.111.0.22", 0.1, 0.0)] {
        let body = serde_json::json!({"kv_usage": kv, "running": 4.0, "waiting": waiting});
        let (status, reply) = client
            .raw(
                "POST",
                &format!("/v1/backends/{addr}/report"),
                Some(body.to_string().as_bytes()),
            )
            .unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    }
    rig.daemon.lock().unwrap().weight_round("llm").unwrap();
    let weights: Vec<VipWeights> = rig.json(&["weights"]);
    let llm = weights.iter().find(|v| v.vip == "llm").unwrap();
    let weight = |a: &str| {
        llm.backends
            .iter()
            .find(|b| b.address == a.parse::<IpAddr>().unwrap())
            .unwrap()
            .weight
    };
    assert_eq!(weight("10.111.0.21"), 0, "saturated: {llm:?}");
    assert!(weight("10.111.0.22") > 0, "{llm:?}");
    let table: Table = rig.json(&["table", "llm"]);
    let share = |a: &str| {
        table
            .backends
            .iter()
            .find(|b| b.address.to_string() == a)
            .map_or(0.0, |b| b.slot_share)
    };
    assert_eq!(share("10.111.0.21"), 0.0, "{table:?}");
    assert_eq!(share("10.111.0.22"), 1.0, "{table:?}");
    let metrics = rig.daemon.lock().unwrap().render_metrics();
    assert!(
        metrics
            .contains("balancer_backend_kv_cache_usage{vip=\"llm\",backend=\"10.111.0.21\"} 0.99"),
        "{metrics}"
    );

    let out = rig.ok(&["stop", "--detach"]);
    assert!(out.contains("detached"), "{out}");
    assert_eq!(*rig.stop.borrow_and_update(), Some(true));
}

#[test]
fn check_config_and_report_run_without_the_kernel() {
    let rig = rig("report");
    // check-config: the rig's file, then a broken copy (refused, naming the key).
    let path = rig.config_path.to_str().unwrap();
    let out = rig.ok(&["check-config", path]);
    assert!(
        out.contains("http4") && out.contains("[fd00:111::100]:7/udp"),
        "{out}"
    );
    let bad = rig.dir.join("bad.toml");
    std::fs::write(
        &bad,
        config_text(&rig.dir).replace("port = 80", "port = 80000"),
    )
    .unwrap();
    let (code, _, err) = rig.cli(&["check-config", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("vip[0].port = 80000"), "{err}");

    // report --once from a GPU stats file, then --push of the same to the daemon.
    let gpus = rig.dir.join("gpus.csv");
    std::fs::write(&gpus, "0, NVIDIA H100, 20480, 81920, 37\n").unwrap();
    let out = rig.ok(&[
        "report",
        "--once",
        "--gpu-stats-file",
        gpus.to_str().unwrap(),
    ]);
    let once: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        once["signals"]["gpu_memory_used_bytes"],
        20480.0 * 1024.0 * 1024.0,
        "{once}"
    );
    let mut push = Command::new(env!("CARGO_BIN_EXE_balancer"))
        .args([
            "report",
            "--push",
            "--backend",
            "10.111.0.22",
            "--interval-ms",
            "50",
        ])
        .arg("--gpu-stats-file")
        .arg(&gpus)
        .arg("--socket")
        .arg(&rig.socket)
        .spawn()
        .unwrap();
    let endpoint = rig
        .daemon
        .lock()
        .unwrap()
        .config
        .vip("llm")
        .unwrap()
        .endpoint();
    let backend: IpAddr = "10.111.0.22".parse().unwrap();
    let mut reports = 0;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        reports = rig
            .daemon
            .lock()
            .unwrap()
            .telemetry
            .get(&endpoint, backend)
            .map_or(0, |t| t.reports);
        if reports >= 2 {
            break;
        }
    }
    let _ = push.kill();
    let _ = push.wait();
    assert!(reports >= 2, "pushed reports arrived: {reports}");
    let d = rig.daemon.lock().unwrap();
    let (signals, _) = d
        .telemetry
        .get(&endpoint, backend)
        .unwrap()
        .latest
        .clone()
        .unwrap();
    assert_eq!(
        signals.gpu_memory_total_bytes,
        Some(81920.0 * 1024.0 * 1024.0)
    );
}

/// The rig's config with a service beside its VIPs: `api` on an IPv4 and an IPv6 address, TCP
/// ports 80 and 443, one backend list that shares a host (10.111.0.11) with `http4`.
fn service_config_text(dir: &Path) -> String {
    config_text(dir)
        + r#"
[[vip]]
name = "api"
addresses = ["10.111.3.1", "fd00:111::3:1"]
ports = [80, 443]

  [[vip.backend]]
  address = "10.111.0.11"
  [[vip.backend]]
  address = "10.111.0.14"
"#
}

#[test]
fn a_service_is_one_block_and_a_host_drains_in_one_command() {
    let rig = rig_with("service", &service_config_text);
    let path = rig.config_path.to_str().unwrap();
    let out = rig.ok(&["check-config", path]);
    assert!(
        out.contains("service api expands to 4 VIPs: api-80-v4, api-443-v4, api-80-v6, api-443-v6")
            && out.contains("[fd00:111::3:1]:443/tcp"),
        "{out}"
    );
    let s: Status = rig.json(&["status"]);
    assert_eq!(s.vips.len(), 7);
    let out = rig.ok(&["vip", "list"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("api-443-v6") && l.ends_with("api")),
        "{out}"
    );
    let holding = [
        "http4",
        "api-80-v4",
        "api-443-v4",
        "api-80-v6",
        "api-443-v6",
    ];

    // One command drains the host everywhere, in one change; undrain brings it back.
    let out = rig.ok(&["backend", "drain", "--everywhere", "10.111.0.11"]);
    assert!(
        out.contains("backend 10.111.0.11 drained in 5 VIP(s)"),
        "{out}"
    );
    let s: Status = rig.json(&["status"]);
    for vip in holding {
        assert_eq!(
            backend_weight(&s, vip, "10.111.0.11"),
            (1, true, 0.0),
            "{vip}"
        );
    }
    assert_eq!(
        backend_weight(&s, "api-80-v6", "10.111.0.14"),
        (1, false, 1.0)
    );
    // The file still holds the service as one block, the backend drained in it.
    let file = std::fs::read_to_string(&rig.config_path).unwrap();
    assert_eq!(file.matches("[[vip]]").count(), 4, "{file}");
    assert!(
        file.contains("ports = [80, 443]") && file.contains("drained = true"),
        "{file}"
    );
    rig.ok(&["reload"]);
    let s: Status = rig.json(&["status"]);
    assert_eq!(
        backend_weight(&s, "api-443-v4", "10.111.0.11"),
        (1, true, 0.0)
    );
    rig.ok(&["backend", "undrain", "--everywhere", "10.111.0.11"]);
    let s: Status = rig.json(&["status"]);
    for vip in holding {
        assert!(!backend_weight(&s, vip, "10.111.0.11").1, "{vip}");
    }

    // Errors change nothing.
    let before = std::fs::read_to_string(&rig.config_path).unwrap();
    let (code, _, err) = rig.cli(&["backend", "drain", "--everywhere", "10.111.9.9"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no VIP has backend 10.111.9.9"), "{err}");
    let (code, _, err) = rig.cli(&["backend", "drain", "--everywhere", "10.111.0.11", "http4"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = rig.cli(&["backend", "drain", "http4"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("<ADDRESS>"), "{err}");
    let (status, body) = rig
        .client()
        .raw("POST", "/v1/backends/not-an-ip/drain", None)
        .unwrap();
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    assert_eq!(std::fs::read_to_string(&rig.config_path).unwrap(), before);

    // A member changed on its own: the file lists the members one by one, and reads back.
    rig.ok(&["backend", "drain", "api-443-v6", "10.111.0.14"]);
    let file = std::fs::read_to_string(&rig.config_path).unwrap();
    assert_eq!(file.matches("[[vip]]").count(), 7, "{file}");
    rig.ok(&["reload"]);
    let s: Status = rig.json(&["status"]);
    assert!(backend_weight(&s, "api-443-v6", "10.111.0.14").1);
    assert!(!backend_weight(&s, "api-80-v6", "10.111.0.14").1);

    // Removed everywhere; then a service added by the CLI (all VIPs or none).
    let out = rig.ok(&["backend", "del", "--everywhere", "10.111.0.11"]);
    assert!(out.contains("removed in 5 VIP(s)"), "{out}");
    // Out of every table; status shows it removed while its flows' grace period runs.
    let s: Status = rig.json(&["status"]);
    for v in &s.vips {
        for b in v
            .backends
            .iter()
            .filter(|b| b.address.to_string() == "10.111.0.11")
        {
            assert_eq!(
                (b.health.as_str(), b.table_share),
                ("removed", 0.0),
                "{}",
                v.name
            );
        }
    }
    let listed: Vec<serde_json::Value> = rig.json(&["backend", "list", "api-80-v6"]);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let out = rig.ok(&[
        "vip",
        "add",
        "chat",
        "--address",
        "10.111.4.1",
        "--address",
        "fd00:111::4:1",
        "--port",
        "8000",
        "--protocol",
        "tcp",
        "--protocol",
        "udp",
    ]);
    assert!(
        out.contains("4 VIPs added: chat-tcp-v4, chat-udp-v4, chat-tcp-v6, chat-udp-v6"),
        "{out}"
    );
    let (code, _, err) = rig.cli(&[
        "vip",
        "add",
        "clash",
        "--address",
        "10.111.5.1",
        "--address",
        "10.111.3.1",
        "--port",
        "80",
    ]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("already serves 10.111.3.1:80/tcp"), "{err}");
    let s: Status = rig.json(&["status"]);
    assert_eq!(s.vips.len(), 11, "a refused service adds none of its VIPs");
}

/// The commands that need the kernel or a terminal (`run`, `decap`, `top`) refuse bad input
/// before touching either: a clear error and exit code 2.
#[test]
fn run_decap_and_top_refuse_bad_input_before_the_kernel() {
    let rig = rig("refusals");
    let bad = rig.dir.join("bad.toml");
    std::fs::write(
        &bad,
        config_text(&rig.dir).replace("port = 80", "port = 80000"),
    )
    .unwrap();
    let missing = rig.dir.join("missing.toml");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "--config", bad.to_str().unwrap()],
            "vip[0].port = 80000: must be between 1 and 65535",
        ),
        (
            vec!["run", "--config", missing.to_str().unwrap()],
            "cannot read config file",
        ),
        (
            vec!["decap", "--interface", "eth0", "--mode", "turbo"],
            "expected \"native\" or \"skb\"",
        ),
        (vec!["decap"], "--interface"),
        (
            vec!["top", "--json"],
            "for JSON use `balancer status --json`",
        ),
        (vec!["top"], "top needs a terminal"),
    ];
    for (args, want) in cases {
        let (code, out, err) = rig.cli(&args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(want), "{args:?}: {err}");
        // The reason once, not again as its own cause.
        if want == "cannot read config file" {
            assert_eq!(err.matches("No such file").count(), 1, "{err}");
        }
    }
    // Nothing the daemon holds changed.
    let s: Status = rig.json(&["status"]);
    assert_eq!(s.vips.len(), 3);
}

/// The TCP listener's roles, route by route: the admin token reaches every route, the read
/// token only the GET ones, the push token only a report for the backend it connects from; no
/// known token, none.
#[test]
fn each_role_reaches_only_its_routes() {
    use balancer::serve::api::listener::{API_LIMITS, serve};
    use balancer::serve::api::server::{Tokens, router_with_tokens};
    let rig = rig("roles");
    // A backend on loopback in the pushed VIP: the push token's own address.
    let (status, reply) = rig
        .client()
        .raw(
            "POST",
            "/v1/vips/llm/backends",
            Some(br#"{"address": "127.0.0.1"}"#),
        )
        .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    let (admin, read, push) = (
        "admin-token-0123456789",
        "read-token-0123456789",
        "push-token-0123456789",
    );
    let (stop_tx, _stop) = tokio::sync::watch::channel(None);
    let state = ApiState {
        daemon: rig.daemon.clone(),
        stop: stop_tx,
    };
    let app = router_with_tokens(
        state,
        Tokens {
            admin: admin.into(),
            read: Some(read.into()),
            push: Some(push.into()),
        },
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                serve(listener, None, app, API_LIMITS, "API").await
            })
    });
    let client = |token: &str| {
        Client::new(Endpoint::Tcp {
            addr: addr.to_string(),
            token: token.into(),
            tls: None,
        })
    };
    let status = |token: &str, method: &str, path: &str| {
        let body: &[u8] = if method == "GET" { b"" } else { b"{}" };
        client(token)
            .raw(method, path, (method != "GET").then_some(body))
            .unwrap()
            .0
    };
    // Every route the API has (paths as the router writes them), a change in each.
    let routes = [
        ("GET", "/v1/status"),
        ("GET", "/v1/stats"),
        ("GET", "/v1/vips"),
        ("POST", "/v1/vips"),
        ("GET", "/v1/vips/http4"),
        ("DELETE", "/v1/vips/nope"),
        ("GET", "/v1/vips/http4/table"),
        ("POST", "/v1/vips/nope/drain"),
        ("POST", "/v1/vips/nope/undrain"),
        ("PUT", "/v1/vips/nope/scheduler"),
        ("GET", "/v1/vips/http4/backends"),
        ("POST", "/v1/vips/nope/backends"),
        ("DELETE", "/v1/vips/nope/backends/10.111.0.11"),
        ("PUT", "/v1/vips/nope/backends/10.111.0.11/weight"),
        ("POST", "/v1/vips/nope/backends/10.111.0.11/drain"),
        ("POST", "/v1/vips/nope/backends/10.111.0.11/undrain"),
        ("GET", "/v1/weights"),
        ("DELETE", "/v1/backends/10.9.9.9"),
        ("POST", "/v1/backends/10.9.9.9/drain"),
        ("POST", "/v1/backends/10.9.9.9/undrain"),
        ("POST", "/v1/backends/10.111.0.22/report"),
        ("POST", "/v1/reload"),
        ("POST", "/v1/stop"),
    ];
    for (method, path) in routes {
        let what = format!("{method} {path}");
        assert_eq!(
            status("not-a-token-0123456789", method, path),
            401,
            "{what}"
        );
        let by_admin = status(admin, method, path);
        assert!(
            by_admin != 401 && by_admin != 403,
            "admin: {what}: {by_admin}"
        );
        let by_read = status(read, method, path);
        if method == "GET" {
            assert_eq!(by_read, 200, "read: {what}");
        } else {
            assert_eq!(by_read, 403, "read: {what}");
        }
        // The push token: no route but its own backend's report.
        assert_eq!(status(push, method, path), 403, "push: {what}");
    }
    assert_eq!(*rig.stop.borrow(), None, "a forbidden stop stopped nothing");
    // Its own backend's report goes through, and lands there.
    let (code, reply) = client(push)
        .raw(
            "POST",
            "/v1/backends/127.0.0.1/report",
            Some(br#"{"kv_usage": 0.25, "running": 2}"#),
        )
        .unwrap();
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&reply));
    let (code, reply) = client(push)
        .raw(
            "POST",
            "/v1/backends/10.111.0.22/report",
            Some(br#"{"kv_usage": 0.25}"#),
        )
        .unwrap();
    let reply = String::from_utf8_lossy(&reply);
    assert_eq!(code, 403, "{reply}");
    assert!(
        reply.contains("only for the backend it connects from (127.0.0.1), not 10.111.0.22"),
        "{reply}"
    );
}

/// A VIP added over the API may name files only under `api.file_dir`: without one, none (the
/// daemon, root, would read any file it is told and send it as a bearer token).
#[test]
fn a_vip_added_at_run_time_names_files_only_under_the_file_dir() {
    let rig = rig("files");
    let vip = |token_file: &str| {
        serde_json::json!({
            "name": "stolen",
            "address": "10.111.0.150",
            "port": 8000,
            "telemetry": {"source": "scrape", "port": 9400, "bearer_token_file": token_file},
            "backend": [{"address": "10.111.0.31"}],
        })
        .to_string()
    };
    let add = |body: String| {
        let (code, reply) = rig
            .client()
            .raw("POST", "/v1/vips", Some(body.as_bytes()))
            .unwrap();
        let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
        let error = reply["error"].as_str().unwrap_or_default().to_string();
        (code, error)
    };
    let (code, reply) = add(vip("/etc/shadow"));
    assert_eq!(code, 400, "{reply}");
    assert!(
        reply.contains("telemetry.bearer_token_file = \"/etc/shadow\": a VIP added at run time may name files only under api.file_dir"),
        "{reply}"
    );
    // With a directory: a file there is taken, one outside (or reached by a link out) is not.
    let dir = rig.dir.join("vip-files");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), "scrape-token\n").unwrap();
    std::os::unix::fs::symlink("/etc/hostname", dir.join("escape")).unwrap();
    rig.daemon.lock().unwrap().config.api.file_dir = Some(dir.clone());
    let (code, reply) = add(vip(dir.join("escape").to_str().unwrap()));
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("not under api.file_dir"), "{reply}");
    let (code, reply) = add(vip(dir.join("token").to_str().unwrap()));
    assert_eq!(code, 200, "{reply:?}");
}

/// A config with two tenants and a VIP with fair admission.
fn fair_config_text(dir: &Path) -> String {
    format!(
        r#"interface = "lb0"
pin_dir = "{dir}/pins"
state_file = "{dir}/state.json"

[api]
socket = "{dir}/api.sock"

[[tier]]
name = "team-a"
prefixes = ["10.9.1.0/24"]
[[tier]]
name = "team-b"
prefixes = ["10.9.2.0/24"]
share = 2

[[vip]]
name = "llm"
address = "10.111.0.101"
port = 8000
telemetry = {{ source = "push" }}
policy = {{ kind = "composite" }}
admission = {{ fair = true }}

  [[vip.backend]]
  address = "10.111.0.21"
"#,
        dir = dir.display()
    )
}

#[test]
fn a_tenant_s_share_and_limit_change_live_and_bad_changes_change_nothing() {
    let rig = rig_with("tenants", &fair_config_text);
    let tenants = |rig: &Rig| {
        let s: Status = rig.json(&["status"]);
        let a = s.vips[0].admission.clone().expect("admission in status");
        assert!(a.fair);
        a.tiers
            .iter()
            .map(|t| (t.tier.clone(), t.share, t.rate))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        tenants(&rig),
        vec![
            ("none".into(), Some(1), None),
            ("team-a".into(), Some(1), None),
            ("team-b".into(), Some(2), None),
        ]
    );
    let out = rig.ok(&["status"]);
    assert!(out.contains("fair admission: pool open"), "{out}");
    assert!(out.contains("TENANT"), "{out}");
    rig.ok(&["tier", "set", "team-a", "--share", "3"]);
    rig.ok(&["tier", "set", "team-b", "--max-new-flows-per-sec", "50"]);
    assert_eq!(
        tenants(&rig),
        vec![
            ("none".into(), Some(1), None),
            ("team-a".into(), Some(3), None),
            ("team-b".into(), Some(2), Some(50.0)),
        ]
    );
    // Written to the file, and read back the same.
    let saved = Config::load(&rig.config_path).unwrap();
    assert_eq!(
        (saved.tiers[0].share, saved.tiers[1].max_new_flows_per_sec),
        (3, Some(50))
    );
    rig.ok(&["tier", "set", "team-b", "--max-new-flows-per-sec", "0"]);
    assert_eq!(tenants(&rig)[2], ("team-b".into(), Some(2), None));
    // Errors name the problem and change nothing.
    let (code, _, err) = rig.cli(&["tier", "set", "team-c", "--share", "2"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no tier named \"team-c\""), "{err}");
    let (code, _, err) = rig.cli(&["tier", "set", "team-a"]);
    assert_ne!(code, 0);
    assert!(err.contains("nothing to change"), "{err}");
    let (code, _, err) = rig.cli(&["tier", "set", "team-a", "--share", "0"]);
    assert_eq!(code, 2, "{err}");
    let (code, reply) = rig
        .client()
        .raw("PUT", "/v1/tiers/team-a", Some(br#"{"share": 20000}"#))
        .unwrap();
    let reply = String::from_utf8_lossy(&reply);
    assert_eq!(code, 400, "{reply}");
    assert!(
        reply.contains("tier[0].share = 20000: must be between 1 and 10000"),
        "{reply}"
    );
    let (code, reply) = rig
        .client()
        .raw("PUT", "/v1/tiers/team-a", Some(br#"{"weight": 2}"#))
        .unwrap();
    let reply = String::from_utf8_lossy(&reply);
    assert_eq!(code, 422, "an unknown field: {reply}");
    assert!(reply.contains("unknown field `weight`"), "{reply}");
    assert_eq!(tenants(&rig)[1], ("team-a".into(), Some(3), None));
}
