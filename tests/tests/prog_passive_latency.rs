//! Passive request latency (`balancer report --passive-latency`): the tc programs through
//! BPF_PROG_TEST_RUN (needs root), fed a request and its streamed answer packet by packet with
//! real pauses between them: time to first token from the request's last packet to the first
//! data after the response headers, inter-token latency between later data packets, the
//! chunked encoding's end, whole answers sent with their headers, keep-alive requests, FIN and
//! RST, IPv6, and packets that are not measured (other ports, unknown flows, UDP). Then in the
//! rack (network namespaces): `balancer report --passive-latency` on two backends running the
//! simulated server, streamed requests through the balancer's VIP, each request's passive TTFT
//! against the simulator's own (median error at most 10%), and the daemon scraping it as its
//! least-latency policy's input.

use std::net::{IpAddr, SocketAddr};
use std::thread::sleep;
use std::time::{Duration, Instant};

use aya::programs::{TestRun, TestRunOptions};
use balancer::base::config::{AttachMode, RawPolicy, RawTelemetry};
use balancer::dataplane::ebpf::{LATENCY_EGRESS_PROGRAM, LATENCY_INGRESS_PROGRAM};
use balancer::serve::report::passive::{ITL_FAMILY, PassiveLatency, TTFT_FAMILY};
use balancer::state::wire::VipWeights;
use balancer::steering::telemetry::page;
use balancer_common::latency::LatencyStats;
use balancer_tests::configs::{backend, to_toml, vip};
use balancer_tests::openai::stream_completion;
use balancer_tests::packet::{tcp_flags_frame, tcp_frame, udp_frame};
use balancer_tests::rack::{binary, spawn_passive_reporter};
use balancer_tests::topology::*;
use balancer_tests::traffic::http_get_path;

const TC_ACT_UNSPEC: u32 = u32::MAX;
const PORT: u16 = 8000;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct Host {
    latency: PassiveLatency,
    server: IpAddr,
}

impl Host {
    fn new(server: &str) -> Host {
        Host {
            latency: PassiveLatency::load(&[PORT, 8443]).expect("load the latency programs"),
            server: ip(server),
        }
    }

    fn run(&mut self, program: &'static str, frame: &[u8]) {
        let prog = self.latency.classifier(program).unwrap();
        let result = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                ..TestRunOptions::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        assert_eq!(
            result.return_value, TC_ACT_UNSPEC,
            "{program} must pass every packet on"
        );
    }

    /// A data packet from the client to the server's `port`.
    fn client(&mut self, client: IpAddr, sport: u16, port: u16, payload: &[u8]) {
        let frame = tcp_frame(client, sport, self.server, port, false, payload);
        self.run(LATENCY_INGRESS_PROGRAM, &frame);
    }

    /// A data packet from the server's `port` to the client.
    fn server(&mut self, client: IpAddr, sport: u16, port: u16, payload: &[u8]) {
        let frame = tcp_frame(self.server, port, client, sport, false, payload);
        self.run(LATENCY_EGRESS_PROGRAM, &frame);
    }

    fn stats(&self) -> LatencyStats {
        self.latency.stats().unwrap()
    }
}

const REQUEST: &[u8] = b"POST /v1/completions HTTP/1.1\r\nhost: vip\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n";
const BODY: &[u8] = b"{\"prompt\": \"hello\", \"stream\": true}\r\n\r\n";
const HEADERS: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
const CHUNK: &[u8] = b"2b\r\ndata: {\"choices\":[{\"text\":\" tok1\"}]}\n\n\r\n";
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// `ns` lies within [`at_least`, `at_least` + 150 ms) (the test's own pauses, and the time
/// a loaded CI machine may add).
fn close_to(ns: u64, at_least: Duration) -> bool {
    let d = Duration::from_nanos(ns);
    d >= at_least && d < at_least + Duration::from_millis(150)
}

#[test]
#[ignore = "needs root (BPF); run by cargo xtask test"]
fn a_streamed_answer_gives_its_time_to_first_token_and_token_spacing() {
    let mut host = Host::new("10.111.0.11");
    let c = ip("10.9.0.1");
    // The handshake carries no data: nothing starts.
    let syn = tcp_frame(c, 40000, host.server, PORT, true, &[]);
    host.run(LATENCY_INGRESS_PROGRAM, &syn);
    assert_eq!(host.stats().requests, 0);

    // A request in two packets: its last one counts.
    host.client(c, 40000, PORT, REQUEST);
    sleep(Duration::from_millis(40));
    let sent = Instant::now();
    host.client(c, 40000, PORT, BODY);
    assert_eq!(host.stats().requests, 1, "one request, two packets");
    sleep(Duration::from_millis(30));
    // Headers alone are not the first token.
    host.server(c, 40000, PORT, HEADERS);
    assert_eq!(host.stats().ttft.count, 0);
    sleep(Duration::from_millis(30));
    host.server(c, 40000, PORT, CHUNK);
    let first = sent.elapsed();
    let s = host.stats();
    assert_eq!(s.ttft.count, 1);
    assert!(
        close_to(s.ttft.sum_ns, Duration::from_millis(60))
            && s.ttft.sum_ns <= first.as_nanos() as u64,
        "TTFT {} ns, the request's last packet was {first:?} before the first token",
        s.ttft.sum_ns
    );
    // Tokens: their spacing.
    for pause in [20, 10] {
        sleep(Duration::from_millis(pause));
        host.server(c, 40000, PORT, CHUNK);
    }
    let s = host.stats();
    assert_eq!(s.itl.count, 2);
    assert!(
        close_to(s.itl.sum_ns, Duration::from_millis(30)),
        "ITL sum {} ns",
        s.itl.sum_ns
    );
    let bucket_total: u64 = s.itl.buckets.iter().sum();
    assert_eq!(bucket_total, 2);
    // The chunked encoding's end is not a token; nor is anything after it.
    sleep(Duration::from_millis(5));
    host.server(c, 40000, PORT, LAST_CHUNK);
    host.server(c, 40000, PORT, CHUNK);
    assert_eq!(host.stats().itl.count, 2);

    // The next request on the same connection (keep-alive), answered whole with its headers.
    host.client(c, 40000, PORT, REQUEST);
    sleep(Duration::from_millis(25));
    host.server(
        c,
        40000,
        PORT,
        b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{\"ok\":true}",
    );
    let s = host.stats();
    assert_eq!((s.requests, s.ttft.count), (2, 2));
    assert!(close_to(s.ttft.sum_ns, Duration::from_millis(85)));

    // Headers, then the body in a packet of its own (an unstreamed answer): the body is the
    // first token.
    host.client(c, 40000, PORT, REQUEST);
    sleep(Duration::from_millis(10));
    host.server(
        c,
        40000,
        PORT,
        b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n",
    );
    sleep(Duration::from_millis(10));
    host.server(c, 40000, PORT, b"{\"ok\":true}");
    let s = host.stats();
    assert_eq!(s.ttft.count, 3);
    assert!(close_to(s.ttft.sum_ns, Duration::from_millis(105)));

    // Headers whose body never follows before the server closes: the headers were the answer.
    host.client(c, 40000, PORT, REQUEST);
    sleep(Duration::from_millis(15));
    host.server(
        c,
        40000,
        PORT,
        b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
    );
    let fin = tcp_flags_frame(host.server, PORT, c, 40000, true, false);
    host.run(LATENCY_EGRESS_PROGRAM, &fin);
    let s = host.stats();
    assert_eq!(s.ttft.count, 4);
    assert!(close_to(s.ttft.sum_ns, Duration::from_millis(120)));
    // The flow is forgotten: more data from the server matches no request.
    host.server(c, 40000, PORT, CHUNK);
    assert_eq!(host.stats().unmatched, 1);
}

#[test]
#[ignore = "needs root (BPF); run by cargo xtask test"]
fn flows_are_kept_apart_and_unwatched_traffic_is_not_measured() {
    let mut host = Host::new("fd00:111::11");
    let (a, b) = (ip("2001:db8:1::1"), ip("2001:db8:2::1"));
    // Two clients at once, on IPv6, one on the second watched port.
    host.client(a, 40000, PORT, REQUEST);
    sleep(Duration::from_millis(30));
    host.client(b, 40001, 8443, REQUEST);
    sleep(Duration::from_millis(20));
    host.server(b, 40001, 8443, CHUNK);
    let s = host.stats();
    assert_eq!((s.requests, s.ttft.count), (2, 1));
    assert!(
        close_to(s.ttft.sum_ns, Duration::from_millis(20)),
        "b waited 20 ms, not a's 50"
    );
    host.server(a, 40000, PORT, CHUNK);
    let s = host.stats();
    assert_eq!(s.ttft.count, 2);
    assert!(close_to(s.ttft.sum_ns, Duration::from_millis(70)));

    // A client's RST ends its request: the answer's later data is unmatched.
    host.client(a, 40002, PORT, REQUEST);
    let rst = tcp_flags_frame(a, 40002, host.server, PORT, false, true);
    host.run(LATENCY_INGRESS_PROGRAM, &rst);
    host.server(a, 40002, PORT, CHUNK);
    let s = host.stats();
    assert_eq!((s.ttft.count, s.unmatched), (2, 1));

    // Health checks and scrapes (GET, HEAD) are not requests to measure; a POST after one on
    // the same connection is.
    host.client(a, 40007, PORT, b"GET /metrics HTTP/1.1\r\nhost: b1\r\n\r\n");
    host.server(
        a,
        40007,
        PORT,
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    );
    host.client(a, 40007, PORT, b"HEAD /health HTTP/1.1\r\n\r\n");
    host.server(a, 40007, PORT, CHUNK);
    let s = host.stats();
    assert_eq!(
        (s.requests, s.skipped, s.ttft.count, s.itl.count),
        (3, 2, 2, 0)
    );
    host.client(a, 40007, PORT, REQUEST);
    host.server(a, 40007, PORT, CHUNK);
    let s = host.stats();
    assert_eq!((s.requests, s.skipped, s.ttft.count), (4, 2, 3));

    // Another port, answers to flows never seen, UDP: none measured.
    host.client(a, 40003, 9000, REQUEST);
    host.server(a, 40003, 9000, CHUNK);
    let udp = udp_frame(a, 40004, host.server, PORT, REQUEST);
    host.run(LATENCY_INGRESS_PROGRAM, &udp);
    let s = host.stats();
    assert_eq!(
        (s.requests, s.ttft.count, s.itl.count, s.unmatched),
        (4, 3, 0, 1)
    );
    host.server(ip("2001:db8:9::1"), 40005, PORT, CHUNK);
    assert_eq!(host.stats().unmatched, 2);
    // A frame cut inside its headers passes untouched.
    let cut = tcp_frame(a, 40006, host.server, PORT, false, REQUEST);
    host.run(LATENCY_INGRESS_PROGRAM, &cut[..60]);
    assert_eq!(host.stats().requests, 4);
}

#[test]
#[ignore = "needs root (BPF); run by cargo xtask test"]
fn the_report_carries_the_passive_ttft_and_the_page_its_histograms() {
    use balancer::serve::report::Reporter;
    use balancer::serve::report::gpu::GpuSource;
    let passive = PassiveLatency::load(&[PORT]).unwrap();
    let mut reporter = Reporter::new(GpuSource::None, vec![], Duration::from_secs(1), 1 << 20)
        .with_passive_latency(passive);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A first reading (nothing measured yet), then one request answered 40 ms later.
    let first = runtime.block_on(reporter.collect()).unwrap();
    assert_eq!(first.signals.ttft_seconds, None);
    let (c, server) = (ip("10.9.0.1"), ip("10.111.0.11"));
    let p = reporter.passive_latency().unwrap();
    let mut run = |program: &'static str, frame: Vec<u8>| {
        p.classifier(program)
            .unwrap()
            .test_run(TestRunOptions {
                data_in: Some(&frame),
                ..TestRunOptions::default()
            })
            .unwrap();
    };
    run(
        LATENCY_INGRESS_PROGRAM,
        tcp_frame(c, 40000, server, PORT, false, REQUEST),
    );
    sleep(Duration::from_millis(40));
    run(
        LATENCY_EGRESS_PROGRAM,
        tcp_frame(server, PORT, c, 40000, false, CHUNK),
    );
    // The report (what --push sends) carries the TTFT as its recent mean.
    let report = runtime.block_on(reporter.collect()).unwrap();
    let ttft = report.signals.ttft_seconds.expect("a TTFT in the report");
    assert!((0.04..0.19).contains(&ttft), "TTFT {ttft} s");
    // The served page: no GPU figures, the histograms with the interface (none: not attached).
    let page = reporter.page("host").unwrap();
    let (sum, count) = sum_count(&page, TTFT_FAMILY);
    assert_eq!(count, 1.0);
    assert!((sum - ttft).abs() < 1e-6, "{sum} vs {ttft}");
    let samples = page::parse(&page).unwrap();
    assert!(
        !samples.iter().any(|s| s.name.starts_with("DCGM_FI")),
        "{page}"
    );
}

/// The sum of the samples called `name` on `page`.
fn page_sum(page: &str, name: &str) -> f64 {
    page::parse(page)
        .expect("a metrics page")
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

/// A histogram's running sum and count on a page.
fn sum_count(page: &str, family: &str) -> (f64, f64) {
    (
        page_sum(page, &format!("{family}_sum")),
        page_sum(page, &format!("{family}_count")),
    )
}

const SIM_TTFT: &str = "vllm:time_to_first_token_seconds";
const SIM_ITL: &str = "vllm:inter_token_latency_seconds";
const LLM_PORT: u16 = 8000;
const REPORT_PORT: u16 = 9400;

#[test]
#[ignore = "needs root and network namespaces; run by cargo xtask test"]
fn passive_ttft_matches_the_servers_own_and_feeds_least_latency() {
    let mut topo = Topology::build(TopologyOptions::new("pl")).expect("building the test rack");
    topo.attach_peer_pass(AttachMode::Native)
        .expect("pass program");
    let mut config = rack_config(&topo, "l2-dsr", AttachMode::Native);
    let mut llm = vip("llm", VIP4, LLM_PORT);
    llm.backend = (0..2).map(|i| backend(backend4(i), None)).collect();
    llm.telemetry = Some(RawTelemetry {
        source: Some("scrape".into()),
        port: Some(REPORT_PORT.into()),
        // Every 100 ms, not paced by this test's few requests.
        interval_ms: Some(100),
        requests_per_scrape: Some(0),
        ..RawTelemetry::default()
    });
    llm.policy = Some(RawPolicy {
        kind: Some("least-latency".into()),
        ewma_alpha: Some(1.0),
        ..RawPolicy::default()
    });
    config.vip.push(llm);
    topo.start_balancer(&to_toml(&config))
        .expect("starting the balancer");

    // b1 a small GPU, b2 a large one (its prefill 4x faster); each with the reporter
    // measuring its own interface.
    let sim = binary("sim-llm").unwrap().to_string_lossy().to_string();
    let listen = format!("0.0.0.0:{LLM_PORT}");
    for (i, profile) in ["small", "large"].into_iter().enumerate() {
        let name = format!("b{}", i + 1);
        let argv = [
            sim.as_str(),
            "--listen",
            &listen,
            "--name",
            &name,
            "--profile",
            profile,
        ];
        topo.rack
            .spawn(&topo.backends[i], &format!("sim-{name}"), &argv)
            .unwrap()
            .wait_for_log("listening", Duration::from_secs(10))
            .unwrap();
        let reporter = spawn_passive_reporter(
            &topo.backends[i],
            &format!("report-{name}"),
            REPORT_PORT,
            LLM_PORT,
            &topo.rack.log_dir,
        )
        .unwrap();
        topo.rack.processes.push(reporter);
    }

    // Streamed requests through the VIP, one at a time, prompts of 50 to 1,600 words: each
    // request's TTFT is the change in its backend's histogram sums. The simulator's page is
    // read outside the window the passive sums are read over (its own port is watched).
    let errors = topo
        .client
        .run_in(move || {
            let vip = SocketAddr::new(VIP4.into(), LLM_PORT);
            let get = |addr: SocketAddr| {
                http_get_path(addr, "/metrics", Duration::from_secs(5)).map_err(|e| format!("{addr}: {e:#}"))
            };
            let pages = |i: usize| -> Result<(String, String), String> {
                let sim = get(SocketAddr::new(backend4(i).into(), LLM_PORT))?;
                let passive = get(SocketAddr::new(backend4(i).into(), REPORT_PORT))?;
                Ok((sim, passive))
            };
            let mut rows = Vec::new();
            let (mut itl_sim, mut itl_passive) = ((0.0, 0.0), (0.0, 0.0));
            for n in 0..24u64 {
                let words = [50, 200, 400, 800, 1200, 1600][n as usize % 6];
                let prompt: Vec<String> = (0..words).map(|k| format!("r{n}w{k}")).collect();
                let body = serde_json::json!({"model": "llama-3-8b", "prompt": prompt.join(" "),
                    "max_tokens": 8, "stream": true, "stream_options": {"include_usage": true}});
                let before: Vec<(String, String)> = (0..2).map(pages).collect::<Result<_, _>>()?;
                let c = stream_completion(vip, "/v1/completions", &body, Duration::from_secs(30), |_| {})
                    .map_err(|e| format!("request {n}: {e:#}"))?;
                c.check_intact(8)?;
                let served = c
                    .headers
                    .iter()
                    .find(|(k, _)| k == "x-served-by")
                    .map(|(_, v)| v.clone())
                    .ok_or("no x-served-by")?;
                let i = if served == "b1" { 0 } else { 1 };
                // Passive page first: the simulator's page is a request to a watched port.
                let passive_after = get(SocketAddr::new(backend4(i).into(), REPORT_PORT))?;
                let sim_after = get(SocketAddr::new(backend4(i).into(), LLM_PORT))?;
                let (sim_before, passive_before) = &before[i];
                let d = |after: &str, before: &str, family: &str| {
                    let (s1, c1) = sum_count(after, family);
                    let (s0, c0) = sum_count(before, family);
                    (s1 - s0, c1 - c0)
                };
                let (sim_ttft, sim_n) = d(&sim_after, sim_before, SIM_TTFT);
                let (passive_ttft, passive_n) = d(&passive_after, passive_before, TTFT_FAMILY);
                if sim_n != 1.0 || passive_n != 1.0 {
                    return Err(format!(
                        "request {n} on {served}: {sim_n} TTFT samples by the server, {passive_n} passive"
                    ));
                }
                let (s, k) = d(&sim_after, sim_before, SIM_ITL);
                itl_sim = (itl_sim.0 + s, itl_sim.1 + k);
                let (s, k) = d(&passive_after, passive_before, ITL_FAMILY);
                itl_passive = (itl_passive.0 + s, itl_passive.1 + k);
                rows.push((served, words, sim_ttft, passive_ttft));
            }
            Ok::<_, String>((rows, itl_sim, itl_passive))
        })
        .expect("client thread");
    let (rows, itl_sim, itl_passive) = errors.unwrap_or_else(|e| panic!("{e}\n{}", topo.logs()));
    let mut errors: Vec<f64> = rows
        .iter()
        .map(|(_, _, sim, passive)| (passive - sim).abs() / sim)
        .collect();
    for (served, words, sim, passive) in &rows {
        println!(
            "{served} {words:>5} words: TTFT server {:.1} ms, passive {:.1} ms",
            sim * 1e3,
            passive * 1e3
        );
    }
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    let (sim_itl, passive_itl) = (itl_sim.0 / itl_sim.1, itl_passive.0 / itl_passive.1);
    println!(
        "median TTFT error {:.1}% (worst {:.1}%); mean ITL server {:.1} ms over {} gaps, passive {:.1} ms over {}",
        median * 100.0,
        errors[errors.len() - 1] * 100.0,
        sim_itl * 1e3,
        itl_sim.1,
        passive_itl * 1e3,
        itl_passive.1
    );
    assert!(
        median <= 0.10,
        "median TTFT error {:.1}% > 10%",
        median * 100.0
    );
    assert!(
        (passive_itl - sim_itl).abs() / sim_itl <= 0.25,
        "mean ITL passive {passive_itl} s vs the server's {sim_itl} s"
    );

    // The daemon reads the reporters' pages: least-latency weighs each backend by its
    // passive TTFT. Once requests stop, its figure settles on each backend's long-run mean
    // (see `telemetry::store::DecayedRatio`): that of the requests the backend served.
    sleep(Duration::from_millis(2500));
    let mean = |name: &str| {
        let v: Vec<f64> = rows.iter().filter(|r| r.0 == name).map(|r| r.3).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let w = loop {
        let (code, out, err) = topo.cli(&["weights", "llm", "--json"]).expect("cli");
        assert_eq!(code, 0, "balancer weights failed: {err}");
        let mut all: Vec<VipWeights> = serde_json::from_str(&out).expect("weights JSON");
        let w = all.remove(0);
        let ttft = |i: usize| w.backends[i].signals.as_ref().and_then(|s| s.ttft_seconds);
        if ttft(0).is_some() && ttft(1).is_some() {
            break w;
        }
        assert!(
            Instant::now() < deadline,
            "no passive TTFT in the weights: {w:#?}"
        );
        sleep(Duration::from_millis(200));
    };
    let ttft = |i: usize| {
        w.backends[i]
            .signals
            .as_ref()
            .unwrap()
            .ttft_seconds
            .unwrap()
    };
    let (m1, m2) = (mean("b1"), mean("b2"));
    println!(
        "daemon: TTFT b1 {:.3} s (its requests' mean {m1:.3}), b2 {:.3} s ({m2:.3}); weights {} / {}",
        ttft(0),
        ttft(1),
        w.backends[0].weight,
        w.backends[1].weight
    );
    for (i, m) in [(0, m1), (1, m2)] {
        assert!(
            (ttft(i) - m).abs() <= 0.2 * m,
            "b{}: {} s vs {m} s: {w:#?}",
            i + 1,
            ttft(i)
        );
    }
    let faster = if ttft(0) < ttft(1) { 0 } else { 1 };
    assert!(
        w.backends[faster].weight > w.backends[1 - faster].weight,
        "least-latency must favour the lower TTFT: {w:#?}"
    );
}
