//! The shipped Prometheus rules and Grafana dashboard (`packaging/`): the rules valid for
//! Debian's promtool, each alert firing on the synthetic series that should raise it and quiet
//! on the others (`balancer.rules.test.yml`); then Debian's Prometheus server scraping a real
//! daemon in the rack, loading the rules, and answering every expression of the rules and of
//! the dashboard with series, which move when a backend saturates.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use balancer::base::config::{AttachMode, RawPolicy, RawTelemetry};
use balancer_tests::configs::{to_toml, vip_mut};
use balancer_tests::fleet::{Fleet, lb_addr};
use balancer_tests::netns::Netns;
use balancer_tests::pages::{dcgm_page, vllm_page, write_atomically};
use balancer_tests::rack::Rack;
use balancer_tests::topology::*;
use balancer_tests::traffic::{http_get, http_get_status};

const TIMEOUT: Duration = Duration::from_secs(5);
const PROMETHEUS: &str = "127.0.0.1:9090";

fn dir(sub: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging")
        .join(sub)
}

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir("prometheus"))
        .output()
        .expect("promtool (Debian's prometheus package; cargo xtask setup installs it)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
#[ignore = "needs promtool; run by cargo xtask test"]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    let (ok, out) = promtool(&["check", "rules", "balancer.rules.yml"]);
    assert!(ok, "promtool check rules:\n{out}");
    assert!(out.contains("SUCCESS: 14 rules found"), "{out}");
    let (ok, out) = promtool(&["test", "rules", "balancer.rules.test.yml"]);
    assert!(ok, "promtool test rules:\n{out}");
}

/// What must return series: each recording rule's own series (it evaluated), each metric an
/// alert reads, and each dashboard panel's expression (`$vip` as every VIP); with where each
/// comes from.
fn queries() -> Vec<(String, String)> {
    let rules = std::fs::read_to_string(dir("prometheus/balancer.rules.yml")).unwrap();
    let mut out = Vec::new();
    let mut alert: Option<String> = None;
    let mut in_expr = false;
    for line in rules.lines() {
        let item = line.trim_start().trim_start_matches("- ");
        if let Some(name) = item.strip_prefix("record:") {
            out.push((
                format!("recording rule {}", name.trim()),
                name.trim().to_string(),
            ));
            alert = None;
            continue;
        }
        if let Some(name) = item.strip_prefix("alert:") {
            alert = Some(name.trim().to_string());
            continue;
        }
        if item.starts_with("expr:") {
            in_expr = true;
        } else if item.contains(':') && !item.starts_with('(') && !item.contains("balancer") {
            in_expr = false;
        }
        let Some(name) = alert.as_ref().filter(|_| in_expr) else {
            continue;
        };
        for token in item.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
            if token.starts_with("balancer_") || token.starts_with("balancer:") {
                let source = format!("alert {name}");
                if !out.iter().any(|(s, q)| *s == source && q == token) {
                    out.push((source, token.to_string()));
                }
            }
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir("grafana/balancer-dashboard.json")).unwrap(),
    )
    .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap().replace("$vip", ".+");
            out.push((
                format!(
                    "dashboard panel {:?}",
                    panel["title"].as_str().unwrap_or("")
                ),
                expr,
            ));
        }
    }
    out
}

/// Percent-encodes a query for a URL.
fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The number of series `query` returns now (through `count(...)`, so that the answer is
/// small), from the Prometheus in namespace `ns`.
fn series(ns: &Netns, query: &str) -> Result<f64, String> {
    let path = format!("/api/v1/query?query={}", encode(&format!("count({query})")));
    let addr: SocketAddr = PROMETHEUS.parse().unwrap();
    let (status, body) = ns
        .run_in(move || http_get_status(addr, &path, TIMEOUT).map_err(|e| format!("{e:#}")))
        .map_err(|e| e.to_string())??;
    let value: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{status} {body:?}: {e}"))?;
    if value["status"] != "success" {
        return Err(format!("{status}: {body}"));
    }
    Ok(value["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0))
}

/// Waits until `query` returns `want` series (or, with `want` None, any).
fn wait_for(ns: &Netns, query: &str, want: Option<f64>, limit: Duration) -> Result<f64, String> {
    let started = Instant::now();
    loop {
        let got = series(ns, query);
        match &got {
            Ok(n) if want.map_or(*n > 0.0, |w| *n == w) => return Ok(*n),
            _ if started.elapsed() > limit => {
                return Err(format!("{query}: {got:?} after {limit:?}"));
            }
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// Starts Debian's Prometheus in `ns`, scraping `targets` every second with the shipped rules.
fn start_prometheus(rack: &mut Rack, ns: &Netns, targets: &[&str]) {
    let prometheus_yml = rack.log_dir.join("prometheus.yml");
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    std::fs::write(
        &prometheus_yml,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: balancer\n    static_configs:\n      - targets: [{}]\n",
            dir("prometheus/balancer.rules.yml").display(),
            targets.join(", ")
        ),
    )
    .unwrap();
    let (config_arg, storage_arg) = (
        format!("--config.file={}", prometheus_yml.display()),
        format!(
            "--storage.tsdb.path={}",
            rack.log_dir.join("tsdb").display()
        ),
    );
    rack.spawn(
        ns,
        "prometheus",
        &[
            "/usr/bin/prometheus",
            &config_arg,
            &storage_arg,
            &format!("--web.listen-address={PROMETHEUS}"),
        ],
    )
    .expect("starting Prometheus");
}

/// Names only a fleet (`[fleet]`) or BGP (`[bgp]`) balancer exposes: the rack has neither, the
/// fleet test below checks them.
const FLEET_OR_BGP: &[&str] = &[
    "balancer_fleet_leader",
    "balancer_fleet_epoch",
    "balancer_fleet_etcd_up",
    "balancer_vip_announced",
];

#[test]
#[ignore = "needs root, network namespaces and Debian's prometheus; run by cargo xtask test"]
fn a_real_prometheus_finds_every_series_the_rules_and_the_dashboard_read() {
    // http4 weighted by the backends' pages (GPU memory, KV cache, queue), scraped every 100 ms.
    let mut topo = Topology::build(TopologyOptions::new("prom")).expect("rack");
    topo.attach_peer_pass(AttachMode::Native).expect("pass");
    let mut config = rack_config(&topo, "l2-dsr", AttachMode::Native);
    config.metrics.listen = Some("127.0.0.1:9181".into());
    {
        let http4 = vip_mut(&mut config, "http4");
        http4.telemetry = Some(RawTelemetry {
            source: Some("scrape".into()),
            port: Some(80),
            path: Some("/metrics".into()),
            // Every 100 ms, not paced by this test's few requests.
            interval_ms: Some(100),
            requests_per_scrape: Some(0),
            ..RawTelemetry::default()
        });
        http4.policy = Some(RawPolicy {
            kind: Some("gpu".into()),
            ewma_alpha: Some(1.0),
            ..RawPolicy::default()
        });
        // Fair admission (the pool never saturates at these pages' KV use; the client's
        // tenant has a rate limit it never reaches): its series exist.
        http4.admission = Some(balancer::base::config::RawAdmission {
            fair: Some(true),
            ..Default::default()
        });
    }
    config.tier.push(balancer::base::config::RawTier {
        name: Some("clients".into()),
        prefixes: vec![format!("{CLIENT4}/32")],
        max_new_flows_per_sec: Some(10_000),
        ..Default::default()
    });
    let page = |used: u64, kv: f64| format!("{}{}", dcgm_page(used, 80), vllm_page(kv, 3, 1));
    for (i, used) in [20, 40, 60].into_iter().enumerate() {
        write_atomically(&topo.metrics_file(i), &page(used, 0.3));
    }
    topo.start_balancer(&to_toml(&config)).expect("balancer");

    start_prometheus(&mut topo.rack, &topo.lb, &["127.0.0.1:9181"]);
    wait_for(
        &topo.lb,
        "up{job=\"balancer\"} == 1",
        Some(1.0),
        Duration::from_secs(40),
    )
    .unwrap_or_else(|e| panic!("Prometheus never scraped the daemon: {e}\n{}", topo.logs()));
    // Some traffic through the VIP, so that the rates have something to say.
    topo.client
        .run_in(|| {
            for _ in 0..30 {
                let _ = http_get(SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT);
            }
        })
        .unwrap();

    let mut checked = 0;
    for (source, query) in queries() {
        if FLEET_OR_BGP.iter().any(|n| query.contains(n)) {
            continue;
        }
        wait_for(&topo.lb, &query, None, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{source}: no series for {query}: {e}"));
        checked += 1;
    }
    // 3 recording rules, 9 metrics the alerts read, 19 panels (the fleet and BGP ones aside).
    assert!(checked >= 31, "only {checked} queries checked");

    // b1's KV cache fills: Prometheus sees it saturated, its weight at 0, two backends left
    // taking new flows, and the saturation alert pending.
    write_atomically(&topo.metrics_file(0), &page(20, 0.97));
    let b1 = "vip=\"http4\",backend=\"10.111.0.11\"";
    for (query, want) in [
        (format!("balancer_backend_saturated{{{b1}}} == 1"), 1.0),
        (format!("balancer_backend_table_weight{{{b1}}} == 0"), 1.0),
        (
            format!("balancer_backend_kv_cache_usage{{{b1}}} > 0.9"),
            1.0,
        ),
        (
            "balancer:vip_serving_backends{vip=\"http4\"} == 2".to_string(),
            1.0,
        ),
        (
            "ALERTS{alertname=\"BalancerBackendSaturated\",vip=\"http4\",backend=\"10.111.0.11\"}"
                .to_string(),
            1.0,
        ),
    ] {
        wait_for(&topo.lb, &query, Some(want), Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("after b1 saturated: {e}"));
    }
}

#[test]
#[ignore = "needs root, network namespaces, BIRD, etcd and Debian's prometheus; run by cargo xtask test"]
fn a_real_prometheus_sees_the_fleet_and_bgp_series_move() {
    // Two balancers with [fleet] and [bgp]; Prometheus on the router scrapes both.
    let mut f = Fleet::build("fprom", 2, 3).unwrap_or_else(|e| panic!("building the fleet: {e:#}"));
    let targets: Vec<String> = (0..2).map(|i| format!("{}:9181", lb_addr(i))).collect();
    let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
    start_prometheus(&mut f.rack, &f.router, &targets);
    let ns = &f.router;
    wait_for(
        ns,
        "up{job=\"balancer\"} == 1",
        Some(2.0),
        Duration::from_secs(40),
    )
    .unwrap_or_else(|e| panic!("Prometheus never scraped both balancers: {e}\n{}", f.logs()));

    // Every rule and panel expression that reads a fleet or BGP series returns series.
    let mut checked = 0;
    for (source, query) in queries() {
        if !FLEET_OR_BGP.iter().any(|n| query.contains(n)) {
            continue;
        }
        wait_for(ns, &query, None, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{source}: no series for {query}: {e}"));
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} fleet and BGP queries checked");
    for (query, want) in [
        ("balancer_fleet_leader == 1", 1.0),
        ("balancer_fleet_etcd_up == 1", 2.0),
        ("balancer_fleet_epoch > 0", 2.0),
        ("balancer_vip_announced == 1", 4.0),
    ] {
        wait_for(ns, query, Some(want), Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("the fleet at rest: {e}"));
    }

    // lb1 drains http4 from BGP: its announcement goes, the withdrawal alert is pending.
    let lb1 = format!("instance=\"{}\"", targets[0]);
    let drained = f.api(0).call::<(), balancer::state::wire::ChangeResult>(
        "POST",
        "/v1/vips/http4/drain",
        None,
    );
    assert!(drained.is_ok(), "{drained:?}");
    for (query, want) in [
        (
            format!("balancer_vip_announced{{vip=\"http4\",{lb1}}} == 0"),
            1.0,
        ),
        ("balancer_vip_announced == 1".to_string(), 3.0),
        (
            format!("ALERTS{{alertname=\"BalancerVipWithdrawn\",vip=\"http4\",{lb1}}}"),
            1.0,
        ),
    ] {
        wait_for(ns, &query, Some(want), Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("after lb1 drained http4: {e}"));
    }

    // etcd goes: no leader, etcd down on both, both alerts pending.
    f.kill_etcd().unwrap();
    let ns = &f.router;
    for (query, want) in [
        ("balancer_fleet_etcd_up == 0", 2.0),
        ("max(balancer_fleet_leader) == 0", 1.0),
        ("ALERTS{alertname=\"BalancerEtcdUnreachable\"}", 2.0),
        ("ALERTS{alertname=\"BalancerFleetNoLeader\"}", 1.0),
    ] {
        wait_for(ns, query, Some(want), Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("after etcd went: {e}"));
    }
}
