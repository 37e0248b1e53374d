//! Telemetry end to end (needs root): simulated inference servers whose `/metrics` pages the
//! tests rewrite, the daemon scraping them and turning them into weights, traffic following
//! those weights, a burst of connections bringing a quiet VIP's scrape forward, established
//! connections surviving weights that change every 100 ms,
//! `balancer report` pushing and serving GPU figures, and admission control refusing a free
//! tier's connections while every backend is saturated.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use balancer::base::config::{AttachMode, RawConfig, RawPolicy, RawTelemetry};
use balancer::serve::api::client::{Client, Endpoint};
use balancer::state::wire::{ChangeResult, VipWeights};
use balancer_tests::configs::{to_toml, vip_mut};
use balancer_tests::pages::{dcgm_page, vllm_page, write_atomically};
use balancer_tests::rack::binary;
use balancer_tests::topology::*;
use balancer_tests::traffic::{echo_stream, http_get, udp_request};

const TIMEOUT: Duration = Duration::from_secs(5);
const GIB: u64 = 1 << 30;

/// A rack whose balancer runs the rack config as `edit` changes it.
fn rack(tag: &str, edit: impl FnOnce(&Topology, &mut RawConfig)) -> Topology {
    let mut topo = Topology::build(TopologyOptions::new(tag)).expect("building the test rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    let mut config = rack_config(&topo, "l2-dsr", AttachMode::Native);
    edit(&topo, &mut config);
    topo.start_balancer(&to_toml(&config))
        .expect("starting the balancer");
    topo
}

/// Scrapes of `port` (at `path`, else the default) every `interval_ms` (not paced by the
/// requests: these tests send few, which would slow the scrapes to `max_interval_ms`).
fn scrape(port: i64, path: Option<&str>, interval_ms: i64) -> Option<RawTelemetry> {
    Some(RawTelemetry {
        source: Some("scrape".into()),
        port: Some(port),
        path: path.map(str::to_string),
        interval_ms: Some(interval_ms),
        requests_per_scrape: Some(0),
        ..RawTelemetry::default()
    })
}

/// Policy `kind`, its weights taken as computed (no smoothing).
fn unsmoothed(kind: &str) -> RawPolicy {
    RawPolicy {
        kind: Some(kind.into()),
        ewma_alpha: Some(1.0),
        ..RawPolicy::default()
    }
}

fn weights(topo: &Topology, vip: &str) -> VipWeights {
    let (code, out, err) = topo.cli(&["weights", vip, "--json"]).expect("cli");
    assert_eq!(code, 0, "balancer weights failed: {err}");
    let mut all: Vec<VipWeights> = serde_json::from_str(&out).expect("weights JSON");
    assert_eq!(all.len(), 1);
    all.remove(0)
}

/// Weight per backend address.
fn weight_map(w: &VipWeights) -> BTreeMap<String, u32> {
    w.backends
        .iter()
        .map(|b| (b.address.to_string(), b.weight))
        .collect()
}

/// Waits until the VIP's weights satisfy `ok`.
fn wait_for_weights(
    topo: &Topology,
    vip: &str,
    what: &str,
    ok: impl Fn(&BTreeMap<String, u32>) -> bool,
) -> VipWeights {
    wait_for(topo, vip, what, |w| ok(&weight_map(w)))
}

/// Polls `vip`'s weights until `ok` holds for one reading (5 s at most); that reading.
fn wait_for(
    topo: &Topology,
    vip: &str,
    what: &str,
    ok: impl Fn(&VipWeights) -> bool,
) -> VipWeights {
    let started = Instant::now();
    loop {
        let w = weights(topo, vip);
        if ok(&w) {
            return w;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "weights of {vip} never became {what}: {w:#?}\n{}",
            topo.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `requests` fresh HTTP connections to `vip`: the share each backend served. All must succeed.
fn http_shares(topo: &Topology, vip: IpAddr, requests: usize) -> BTreeMap<String, f64> {
    let served = topo
        .client
        .run_in(move || {
            let mut served = BTreeMap::new();
            for i in 0..requests {
                let name = http_get(SocketAddr::new(vip, HTTP_PORT), TIMEOUT)
                    .map_err(|e| format!("request {i}: {e:#}"))?;
                *served.entry(name).or_insert(0usize) += 1;
            }
            Ok::<_, String>(served)
        })
        .expect("client thread")
        .unwrap_or_else(|e| panic!("a connection failed: {e}\n{}", topo.logs()));
    served
        .into_iter()
        .map(|(k, v)| (k, v as f64 / requests as f64))
        .collect()
}

/// Expected shares of new flows: weight over the sum of weights, by backend name (b1, b2, ...).
fn weight_shares(w: &VipWeights) -> BTreeMap<String, f64> {
    let total: u32 = w.backends.iter().map(|b| b.weight).sum();
    w.backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            (
                format!("b{}", i + 1),
                f64::from(b.weight) / f64::from(total),
            )
        })
        .collect()
}

fn assert_shares_follow(
    observed: &BTreeMap<String, f64>,
    expected: &BTreeMap<String, f64>,
    tolerance: f64,
) {
    for (name, want) in expected {
        let got = observed.get(name).copied().unwrap_or(0.0);
        assert!(
            (got - want).abs() <= tolerance,
            "{name} served {:.1}% of new connections, its weight share is {:.1}% (tolerance {:.0} points): observed {observed:?}, expected {expected:?}",
            got * 100.0,
            want * 100.0,
            tolerance * 100.0
        );
    }
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn traffic_follows_the_weights_backends_report() {
    // http4 is weighted by free GPU memory from DCGM-style pages, scraped every 100 ms.
    let topo = rack("tw", |_, config| {
        let http4 = vip_mut(config, "http4");
        http4.telemetry = scrape(80, Some("/metrics"), 100);
        http4.policy = Some(RawPolicy {
            stale_after_ms: Some(600),
            ..unsmoothed("gpu")
        });
    });
    for (i, used) in [20, 50, 70].into_iter().enumerate() {
        write_atomically(&topo.metrics_file(i), &dcgm_page(used, 80));
    }
    // Scores 0.75, 0.375, 0.125 of free memory: 1000, 500, 170 (quantum 10).
    let w = wait_for_weights(&topo, "http4", "1000/500/170", |m| {
        m.get("10.111.0.11") == Some(&1000)
            && m.get("10.111.0.12") == Some(&500)
            && m.get("10.111.0.13") == Some(&170)
    });
    assert!(w.backends[0].reason.contains("memory 25% used"), "{w:#?}");
    // Scraped at a fixed interval: the VIP shows it as the wait to its next scrape.
    assert_eq!(w.scrape_interval_ms, Some(100), "{w:#?}");
    let (code, table, _) = topo.cli(&["weights", "http4"]).unwrap();
    assert_eq!(code, 0);
    assert!(table.contains("gpu: memory 88% used"), "{table}");
    assert!(
        table.contains("next scrape 0.1 s after the last"),
        "{table}"
    );
    let observed = http_shares(&topo, VIP4.into(), 900);
    println!("gpu weights 1000/500/170: shares {observed:?}");
    assert_shares_follow(&observed, &weight_shares(&w), 0.06);

    // b1's KV cache fills up: it takes no new flows (the saturation cut-off applies to every
    // policy), and its weight share goes to the others.
    write_atomically(
        &topo.metrics_file(0),
        &format!("{}{}", dcgm_page(20, 80), vllm_page(0.97, 40, 12)),
    );
    let w = wait_for_weights(&topo, "http4", "b1 at 0", |m| {
        m.get("10.111.0.11") == Some(&0)
    });
    assert!(
        w.backends[0].reason.contains("saturated: KV cache 97%"),
        "{w:#?}"
    );
    assert_eq!(w.backends[0].signals.as_ref().unwrap().running, Some(40.0));
    assert_eq!(
        w.backends[0].signals.as_ref().unwrap().models,
        vec!["llama".to_string()]
    );
    let observed = http_shares(&topo, VIP4.into(), 600);
    println!("b1 saturated: shares {observed:?}");
    assert!(
        !observed.contains_key("b1"),
        "a saturated backend got new flows: {observed:?}"
    );
    assert_shares_follow(&observed, &weight_shares(&w), 0.08);

    // b3's page disappears (404): its report goes stale and it is treated as saturated.
    write_atomically(&topo.metrics_file(0), &dcgm_page(20, 80));
    std::fs::remove_file(topo.metrics_file(2)).unwrap();
    let w = wait_for_weights(&topo, "http4", "b1 back, b3 at 0", |m| {
        m.get("10.111.0.11") == Some(&1000) && m.get("10.111.0.13") == Some(&0)
    });
    let b3 = &w.backends[2];
    assert!(b3.reason.contains("stale report"), "{b3:#?}");
    assert!(
        b3.errors > 0 && b3.last_error.as_deref().unwrap_or("").contains("404"),
        "{b3:#?}"
    );
    let observed = http_shares(&topo, VIP4.into(), 200);
    assert!(
        !observed.contains_key("b3"),
        "a stale backend got new flows: {observed:?}"
    );

    // The other VIPs stay static.
    let echo = weights(&topo, "echo4");
    assert_eq!(echo.policy, "static");
    assert!(echo.backends.iter().all(|b| b.weight == 1), "{echo:#?}");
}

/// Reports received from each of the VIP's backends, summed.
fn reports(topo: &Topology, vip: &str) -> u64 {
    weights(topo, vip).backends.iter().map(|b| b.reports).sum()
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn a_burst_of_connections_brings_a_quiet_vips_scrape_forward() {
    // http4's scrapes paced by its requests: one per backend between scrapes (3 new flows),
    // every 100 ms at the fastest, every 60 s while quiet.
    let topo = rack("tb", |_, config| {
        let http4 = vip_mut(config, "http4");
        http4.telemetry = Some(RawTelemetry {
            source: Some("scrape".into()),
            port: Some(80),
            path: Some("/metrics".into()),
            interval_ms: Some(100),
            max_interval_ms: Some(60_000),
            requests_per_scrape: Some(1),
            ..RawTelemetry::default()
        });
        http4.policy = Some(unsmoothed("gpu"));
    });
    for i in 0..3 {
        write_atomically(&topo.metrics_file(i), &dcgm_page(20, 80));
    }
    // The first scrapes (the second sets where counting starts), then quiet: the next one
    // 60 s away.
    let started = Instant::now();
    loop {
        let w = weights(&topo, "http4");
        if w.scrape_interval_ms == Some(60_000) && w.backends.iter().all(|b| b.reports > 0) {
            break;
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "http4 never went quiet: {w:#?}\n{}",
            topo.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let quiet = reports(&topo, "http4");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(reports(&topo, "http4"), quiet, "a scrape while quiet");
    // Three new connections: the XDP program counts them down to the scrape and wakes the
    // daemon, which scrapes at once.
    http_shares(&topo, VIP4.into(), 3);
    let burst = Instant::now();
    while reports(&topo, "http4") == quiet {
        assert!(
            burst.elapsed() < TIMEOUT,
            "no scrape within {TIMEOUT:?} of the burst\n{}",
            topo.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("scraped {:?} after the burst", burst.elapsed());
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn established_connections_survive_weights_changing_every_100ms() {
    let topo = rack("tc", |_, config| {
        config.metrics.listen = Some("127.0.0.1:9183".into());
        for name in ["echo4", "echo6"] {
            let v = vip_mut(config, name);
            v.telemetry = scrape(80, None, 100);
            v.policy = Some(RawPolicy {
                hysteresis: Some(0.0),
                quantum: Some(1),
                ..unsmoothed("composite")
            });
        }
    });
    let files: Vec<_> = (0..3).map(|i| topo.metrics_file(i)).collect();
    let page = |round: usize, backend: usize| -> String {
        // Every round moves each backend's load; every fifth saturates one backend in turn.
        let kv = if round.is_multiple_of(5) && (round / 5) % 3 == backend {
            0.98
        } else {
            0.1 + 0.08 * ((round + backend * 4) % 10) as f64
        };
        vllm_page(kv, (round % 7) as u32 * 3, ((round + backend) % 4) as u32)
    };
    for (i, f) in files.iter().enumerate() {
        write_atomically(f, &page(1, i));
    }
    wait_for_weights(&topo, "echo4", "scraped", |m| m.values().all(|w| *w > 0));
    // Every backend of both VIPs scraped at least once.
    let started = Instant::now();
    let changes_before = loop {
        match weight_changes(&topo) {
            Ok(n) => break n,
            Err(e) if started.elapsed() > Duration::from_secs(10) => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };

    const STREAMS: usize = 30;
    const SECONDS: u64 = 4;
    let until = Instant::now() + Duration::from_secs(SECONDS);
    let streams = topo
        .echo_streams(STREAMS, until, TIMEOUT)
        .expect("client threads");
    // New connections keep arriving while the weights move.
    let newcomers = topo
        .client
        .spawn_in(move || {
            let mut served = BTreeMap::new();
            let mut i = 0;
            while Instant::now() < until {
                let vip = if i % 2 == 0 {
                    IpAddr::from(VIP4)
                } else {
                    IpAddr::from(VIP6)
                };
                let name = echo_stream(SocketAddr::new(vip, ECHO_PORT), 4096, TIMEOUT)
                    .map_err(|e| format!("new connection {i}: {e:#}"))?;
                *served.entry(name).or_insert(0usize) += 1;
                i += 1;
            }
            Ok::<_, String>(served)
        })
        .expect("client thread");
    let mut seen = std::collections::BTreeSet::new();
    // The weights are read in-process through the API: a CLI process per round would set the
    // rounds' pace on a loaded machine.
    let api = Client::new(Endpoint::Unix(topo.api_socket()));
    let mut round = 2;
    while Instant::now() < until {
        for (i, f) in files.iter().enumerate() {
            write_atomically(f, &page(round, i));
        }
        if let Ok(all) = api.get::<Vec<VipWeights>>("/v1/weights")
            && let Some(w) = all.iter().find(|v| v.vip == "echo4")
        {
            seen.insert(format!("{:?}", weight_map(w)));
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let per_backend = join_streams(streams, "while the weights changed")
        .unwrap_or_else(|e| panic!("{e:#}\n{}", topo.logs()))
        .per_backend;
    let newcomers = newcomers
        .join()
        .expect("client thread")
        .expect("client namespace")
        .unwrap_or_else(|e| panic!("{e}\n{}", topo.logs()));
    let changes = weight_changes(&topo).unwrap() - changes_before;
    let rounds = round - 2;
    println!(
        "{rounds} page rounds, {changes} weight publications, {} distinct weight sets seen; streams per backend {per_backend:?}; new connections {newcomers:?}",
        seen.len()
    );
    assert!(
        per_backend.len() >= 2,
        "all streams on one backend: {per_backend:?}"
    );
    // Every round moves every backend's page: the weights follow in most of them (a round
    // takes 100 ms plus a status read; a slow machine runs fewer in the same time).
    assert!(rounds >= 8, "only {rounds} rounds of pages in {SECONDS} s");
    assert!(
        changes >= (rounds / 2) as f64,
        "the weights changed only {changes} times in {rounds} rounds of new pages"
    );
    assert!(
        seen.len() >= (rounds / 4).min(10),
        "weights barely moved in {rounds} rounds: {seen:?}"
    );
    assert!(
        newcomers.values().sum::<usize>() > 20,
        "too few new connections: {newcomers:?}"
    );
}

/// The daemon's count of weight publications for echo4 and echo6, once the metrics page shows
/// every backend's scraped figures (an error names the first one missing).
fn weight_changes(topo: &Topology) -> Result<f64, String> {
    let text = topo
        .lb
        .run_in(|| -> Result<String, String> {
            use std::io::{Read, Write};
            let mut s =
                std::net::TcpStream::connect("127.0.0.1:9183").map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(TIMEOUT))
                .map_err(|e| e.to_string())?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .map_err(|e| e.to_string())?;
            let mut out = String::new();
            s.read_to_string(&mut out).map_err(|e| e.to_string())?;
            Ok(out)
        })
        .expect("lb thread")
        .expect("metrics page");
    let total: f64 = text
        .lines()
        .filter(|l| l.starts_with("balancer_weight_changes_total{vip=\"echo"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    for name in [
        "balancer_backend_table_weight{vip=\"echo4\",backend=\"10.111.0.11\"}",
        "balancer_backend_kv_cache_usage{vip=\"echo4\",backend=\"10.111.0.11\"}",
        "balancer_backend_requests_waiting{vip=\"echo6\",backend=\"fd00:111::11\"}",
        "balancer_backend_report_age_seconds{vip=\"echo4\",backend=\"10.111.0.12\"}",
        "balancer_backend_reports_total{backend=\"10.111.0.13\",result=\"success\",vip=\"echo4\"}",
        "# TYPE balancer_weight_publish_seconds histogram",
    ] {
        if !text.contains(name) {
            return Err(format!("metrics page lacks {name}:\n{text}"));
        }
    }
    Ok(total)
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn reporters_push_and_serve_gpu_figures() {
    const TOKEN: &str = "report-token-0123456789abcdef";
    let mut topo = rack("tr", |topo, config| {
        let token_file = topo.rack.log_dir.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        config.api.listen = Some(format!("{LB4}:9180"));
        config.api.token_file = Some(token_file.display().to_string());
        // udp4 takes pushed reports; http6 scrapes the reporters' pages (over IPv6).
        let udp4 = vip_mut(config, "udp4");
        udp4.telemetry = Some(RawTelemetry {
            source: Some("push".into()),
            ..RawTelemetry::default()
        });
        udp4.policy = Some(RawPolicy {
            stale_after_ms: Some(1000),
            ..unsmoothed("gpu")
        });
        let http6 = vip_mut(config, "http6");
        http6.telemetry = scrape(9400, None, 100);
        http6.policy = Some(unsmoothed("gpu"));
    });
    let bin = binary("balancer").unwrap().to_string_lossy().to_string();
    let log_dir = topo.rack.log_dir.clone();
    let gpu_file = |i: usize| log_dir.join(format!("gpu-b{}.csv", i + 1));
    let smi = |used_gib: u64| {
        format!(
            "0, NVIDIA H100 80GB HBM3, {}, {}, 55\n",
            used_gib * 1024,
            80 * 1024
        )
    };
    for (i, used) in [10, 40, 70].into_iter().enumerate() {
        write_atomically(&gpu_file(i), &smi(used));
    }
    let token_file = topo
        .rack
        .log_dir
        .join("token")
        .to_string_lossy()
        .to_string();
    let lb_api = format!("{LB4}:9180");
    for i in 0..3 {
        let file = gpu_file(i).to_string_lossy().to_string();
        let serve = [
            bin.as_str(),
            "report",
            "--serve",
            "[::]:9400",
            "--gpu-stats-file",
            &file,
        ];
        topo.rack
            .spawn(&topo.backends[i], &format!("serve-b{}", i + 1), &serve)
            .unwrap()
            .wait_for_log("serving GPU figures", Duration::from_secs(10))
            .unwrap();
        if i < 2 {
            // b3 pushes nothing.
            let backend = backend4(i).to_string();
            let push = [
                bin.as_str(),
                "report",
                "--push",
                "--backend",
                &backend,
                "--gpu-stats-file",
                &file,
                "--interval-ms",
                "100",
                "--connect",
                &lb_api,
                "--token-file",
                &token_file,
            ];
            topo.rack
                .spawn(&topo.backends[i], &format!("push-b{}", i + 1), &push)
                .unwrap();
        }
    }

    // Served pages, scraped over IPv6: used 10, 40, 70 of 80 GiB -> 1000, 570, 140.
    let w = wait_for_weights(&topo, "http6", "1000/570/140", |m| {
        m.get("fd00:111::11") == Some(&1000)
            && m.get("fd00:111::12") == Some(&570)
            && m.get("fd00:111::13") == Some(&140)
    });
    let s = w.backends[1].signals.clone().unwrap();
    assert_eq!(s.gpu_memory_total_bytes, Some((80 * GIB) as f64));
    assert_eq!(s.gpu_utilization, Some(0.55));
    // Pushed reports: b3 never reports and gets nothing.
    let w = wait_for_weights(&topo, "udp4", "1000/570/0", |m| {
        m.get("10.111.0.11") == Some(&1000)
            && m.get("10.111.0.12") == Some(&570)
            && m.get("10.111.0.13") == Some(&0)
    });
    assert!(w.backends[2].reason.contains("no report yet"), "{w:#?}");
    assert_eq!(
        w.scrape_interval_ms, None,
        "pushed reports have no scrapes: {w:#?}"
    );
    let served = topo
        .client
        .run_in(|| {
            let mut served = BTreeMap::new();
            for i in 0..150 {
                let reply = udp_request(
                    SocketAddr::new(VIP4.into(), UDP_PORT),
                    &format!("q{i}"),
                    TIMEOUT,
                )
                .map_err(|e| format!("{e:#}"))?;
                let name = reply.split(':').next().unwrap_or_default().to_string();
                *served.entry(name).or_insert(0usize) += 1;
            }
            Ok::<_, String>(served)
        })
        .expect("client thread")
        .expect("UDP requests");
    println!("pushed weights 1000/570/0: UDP flows per backend {served:?}");
    assert!(
        !served.contains_key("b3"),
        "a backend without reports got flows: {served:?}"
    );
    assert!(served.get("b1") > served.get("b2"), "{served:?}");

    // b2's GPU fills up: both its served page and its pushes say so.
    write_atomically(&gpu_file(1), &smi(79));
    wait_for_weights(&topo, "http6", "b2 at the floor", |m| {
        m.get("fd00:111::12") == Some(&10)
    });
    wait_for_weights(&topo, "udp4", "b2 at the floor", |m| {
        m.get("10.111.0.12") == Some(&10)
    });

    // Reports are checked and authenticated.
    let refused = topo.backends[0]
        .run_in(move || {
            let client = |token: &str| {
                Client::new(Endpoint::Tcp {
                    addr: format!("{LB4}:9180"),
                    token: token.into(),
                    tls: None,
                })
            };
            let bad = serde_json::json!({ "kv_usage": 1.5 });
            let path = "/v1/backends/10.111.0.11/report";
            let e1 = client(TOKEN)
                .call::<_, ChangeResult>("POST", path, Some(&bad))
                .unwrap_err();
            let unknown = serde_json::json!({ "kv_usage": 0.5, "bogus": 1 });
            let e2 = client(TOKEN)
                .call::<_, ChangeResult>("POST", path, Some(&unknown))
                .unwrap_err();
            let ok = serde_json::json!({ "kv_usage": 0.5 });
            let e3 = client("wrong-token-0123456789")
                .call::<_, ChangeResult>("POST", path, Some(&ok))
                .unwrap_err();
            let e4 = client(TOKEN)
                .call::<_, ChangeResult>("POST", "/v1/backends/10.111.0.99/report", Some(&ok))
                .unwrap_err();
            [e1, e2, e3, e4].map(|e| (e.status(), e.to_string()))
        })
        .expect("backend thread");
    assert_eq!(refused[0].0, Some(400), "{:?}", refused[0]);
    assert!(refused[0].1.contains("kv_usage = 1.5"), "{:?}", refused[0]);
    assert_eq!(refused[1].0, Some(422), "{:?}", refused[1]);
    assert!(refused[1].1.contains("bogus"), "{:?}", refused[1]);
    assert_eq!(refused[2].0, Some(401), "{:?}", refused[2]);
    assert_eq!(refused[3].0, Some(404), "{:?}", refused[3]);

    // b1's reporter stops: its report goes stale and it is treated as saturated.
    let p = topo.process("push-b1").unwrap();
    p.signal_and_wait(libc::SIGTERM, Duration::from_secs(5))
        .unwrap();
    let w = wait_for_weights(&topo, "udp4", "b1 at 0", |m| {
        m.get("10.111.0.11") == Some(&0)
    });
    assert!(w.backends[0].reason.contains("stale report"), "{w:#?}");
}

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn a_saturated_pool_refuses_free_tier_connections_while_premium_ones_succeed() {
    use balancer::base::config::{RawAdmission, RawTier};
    use balancer::state::wire::Status;
    use balancer_tests::traffic::http_get_from;
    // The client's own address is premium; 10.111.0.50 (also on the client) has no tier.
    let premium: IpAddr = CLIENT4.into();
    let free: IpAddr = "10.111.0.50".parse().unwrap();
    let topo = rack("tadm", |_, config| {
        config.tier.push(RawTier {
            name: Some("premium".into()),
            prefixes: vec![format!("{premium}/32")],
            ..RawTier::default()
        });
        let http4 = vip_mut(config, "http4");
        http4.telemetry = scrape(80, Some("/metrics"), 100);
        http4.policy = Some(RawPolicy {
            stale_after_ms: Some(600),
            ..unsmoothed("composite")
        });
        http4.admission = Some(RawAdmission {
            admit: [("premium".to_string(), 0)].into_iter().collect(),
            ..RawAdmission::default()
        });
    });
    topo.client
        .sh(&format!("ip addr add {free}/24 dev eth0"))
        .expect("free-tier address");
    let pages = |kv: f64, running: u32, waiting: u32| {
        for i in 0..3 {
            write_atomically(&topo.metrics_file(i), &vllm_page(kv, running, waiting));
        }
    };
    let saturated = |topo: &Topology| weights(topo, "http4").pool_saturated;
    let wait_until = |want: bool| {
        let started = Instant::now();
        while saturated(&topo) != Some(want) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the pool never became {}: {:#?}\n{}",
                if want { "saturated" } else { "open" },
                weights(&topo, "http4"),
                topo.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // From `src`: how many of `n` fresh connections were served, and the slowest failure.
    let attempts = |src: IpAddr, n: usize| -> (usize, Duration) {
        topo.client
            .run_in(move || {
                let (mut ok, mut slowest) = (0, Duration::ZERO);
                for _ in 0..n {
                    let started = Instant::now();
                    match http_get_from(src, SocketAddr::new(VIP4.into(), HTTP_PORT), TIMEOUT) {
                        Ok(_) => ok += 1,
                        Err(_) => slowest = slowest.max(started.elapsed()),
                    }
                }
                (ok, slowest)
            })
            .expect("client thread")
    };

    pages(0.3, 2, 0);
    wait_until(false);
    assert_eq!(attempts(free, 30).0, 30, "an open pool served every client");
    assert_eq!(attempts(premium, 30).0, 30);

    // Every backend's KV cache full: free-tier connections are refused at once (a RST from
    // the balancer, not a timeout), premium ones still succeed.
    pages(0.99, 40, 12);
    wait_until(true);
    let (served, slowest) = attempts(free, 20);
    assert_eq!(served, 0, "a saturated pool served a free-tier client");
    assert!(
        slowest < Duration::from_secs(1),
        "a refusal took {slowest:?}: not a RST"
    );
    assert_eq!(
        attempts(premium, 20).0,
        20,
        "a premium connection failed\n{}",
        topo.logs()
    );
    let (code, out, err) = topo.cli(&["status", "--json"]).unwrap();
    assert_eq!(code, 0, "{err}");
    let status: Status = serde_json::from_str(&out).unwrap();
    let http4 = status.vips.iter().find(|v| v.name == "http4").unwrap();
    let admission = http4.admission.as_ref().expect("admission in status");
    assert!(admission.saturated);
    let tier = |name: &str| admission.tiers.iter().find(|t| t.tier == name).unwrap();
    assert!(tier("none").shed_saturated >= 20, "{admission:#?}");
    assert!(tier("premium").admitted_flows >= 20, "{admission:#?}");
    let (_, text, _) = topo.cli(&["status"]).unwrap();
    assert!(text.contains("admission: pool SATURATED"), "{text}");

    // The caches drain: everyone is served again.
    pages(0.3, 2, 0);
    wait_until(false);
    assert_eq!(attempts(free, 20).0, 20, "free-tier clients still refused");
}

/// One backend serves hostile pages, one after another, beside a healthy one behind the same
/// VIP, and a second VIP: every page is that backend's error (named in `balancer weights`),
/// while the API and `/metrics` keep answering, the healthy backend's reports stay fresh and its
/// weight on top, the other VIP's rounds go on, a change still applies, and nothing panics.
#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn a_hostile_backend_is_its_own_error_and_nobody_elses() {
    let topo = rack("hst", |_, config| {
        config.metrics.listen = Some("127.0.0.1:9181".into());
        let http4 = vip_mut(config, "http4");
        http4.telemetry = scrape(80, Some("/metrics"), 100);
        http4.policy = Some(RawPolicy {
            stale_after_ms: Some(600),
            ..unsmoothed("composite")
        });
        let echo4 = vip_mut(config, "echo4");
        echo4.policy = Some(RawPolicy {
            kind: Some("least-conn".into()),
            ..RawPolicy::default()
        });
    });
    let healthy = vllm_page(0.3, 4, 0);
    write_atomically(&topo.metrics_file(0), &healthy);
    write_atomically(&topo.metrics_file(2), &healthy);
    write_atomically(&topo.metrics_file(1), &healthy);
    wait_for_weights(&topo, "http4", "every backend reporting", |m| {
        m.values().all(|w| *w > 0)
    });
    let twice = |name: &str, value: &str| {
        format!("{name}{{model_name=\"a\"}} {value}\n{name}{{model_name=\"b\"}} {value}\n")
    };
    let overflow = [
        "vllm:time_to_first_token_seconds_sum",
        "vllm:time_to_first_token_seconds_count",
        "vllm:request_prompt_tokens_sum",
        "vllm:request_prompt_tokens_count",
    ]
    .iter()
    .map(|n| twice(n, "1e308"))
    .collect::<String>();
    let models: String = (0..40_000)
        .map(|i| format!("vllm:num_requests_running{{model_name=\"m{i}\"}} 0\n"))
        .collect();
    let pages: Vec<(&str, String, &str)> = vec![
        (
            "overflowing sums",
            format!("{healthy}{overflow}"),
            "ttft_sum_count = inf",
        ),
        (
            "NaN",
            "vllm:num_requests_running NaN\n".into(),
            "running = NaN",
        ),
        (
            "a negative count",
            "vllm:num_requests_waiting -7\n".into(),
            "waiting = -7",
        ),
        (
            "KV use of 1e9",
            "vllm:kv_cache_usage_perc 1e9\n".into(),
            "kv_usage = 1000000000",
        ),
        ("countless models", models, "models: 40000 names"),
        (
            "garbage",
            "<html>not a metrics page</html>\n".into(),
            "does not start with a metric name",
        ),
        (
            "an oversized page",
            "# padding\n".repeat(500_000),
            "larger than",
        ),
    ];
    let reports_of = |w: &VipWeights, a: &str| {
        w.backends
            .iter()
            .find(|b| b.address.to_string() == a)
            .map(|b| (b.reports, b.report_age_ms, b.weight))
            .unwrap()
    };
    let metrics_addr: SocketAddr = "127.0.0.1:9181".parse().unwrap();
    for (what, page, error) in pages {
        let before = reports_of(&weights(&topo, "http4"), "10.111.0.11").0;
        write_atomically(&topo.metrics_file(1), &page);
        // b2 refused with the page's problem, and b1 reported again since it was served.
        let w = wait_for(&topo, "http4", what, |w| {
            let b2 = &w.backends[1];
            b2.weight == 0
                && b2.last_error.as_deref().unwrap_or("").contains(error)
                && reports_of(w, "10.111.0.11").0 > before
        });
        // The healthy backends: fresh reports, on top.
        let (_, age, weight) = reports_of(&w, "10.111.0.11");
        assert!(
            age.unwrap_or(u64::MAX) < 600,
            "{what}: b1's report {age:?} ms old"
        );
        assert!(
            weight > 0 && weight >= w.backends[1].weight,
            "{what}: {w:#?}"
        );
        assert!(w.backends[1].reason.contains("stale"), "{what}: {w:#?}");
        // The API and /metrics answer.
        let (code, _, err) = topo.cli(&["status"]).unwrap();
        assert_eq!(code, 0, "{what}: status: {err}");
        let page = topo
            .lb
            .spawn_in(move || {
                balancer_tests::traffic::http_get_path(metrics_addr, "/metrics", TIMEOUT)
            })
            .unwrap()
            .join()
            .unwrap()
            .unwrap()
            .unwrap_or_else(|e| panic!("{what}: /metrics: {e:#}"));
        assert!(page.contains("balancer_backend_weight"), "{what}");
        assert!(
            page.contains("balancer_telemetry_round_seconds_count{vip=\"http4\"}"),
            "{what}: the rounds' time per VIP"
        );
    }
    // The other VIP's rounds went on, and a change still applies.
    let echo = weights(&topo, "echo4");
    assert_eq!(echo.policy, "least-conn", "{echo:#?}");
    let (code, _, err) = topo
        .cli(&["backend", "set-weight", "echo4", "10.111.0.12", "5"])
        .unwrap();
    assert_eq!(code, 0, "{err}");
    // Served well again, the backend comes back.
    write_atomically(&topo.metrics_file(1), &healthy);
    wait_for_weights(&topo, "http4", "b2 back", |m| {
        m.get("10.111.0.12").is_some_and(|w| *w > 0)
    });
    let log = topo.logs();
    assert!(!log.contains("panicked"), "{log}");
}
