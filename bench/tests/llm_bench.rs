//! The routing benchmark's `--quick` mode inside the test suite, so the benchmark never rots
//! (needs root and the routers' environment `cargo xtask setup` builds): the conversation shape,
//! 60 requests at 3 requests/s, round robin, the composite policy and vllm-router's
//! power_of_two, through the same rack, client and report as `cargo xtask bench llm`. It checks
//! that every contender served every request, that the figures the report is made of were
//! measured (TTFTs, CPU, prefix hits, idle latency) and that the report, JSON keys and plots were
//! written. Routing quality itself is not asserted here: it is a benchmark figure.

use std::path::PathBuf;

use balancer_bench::llm::contenders::Contender;
use balancer_bench::llm::{self, Options};

/// The report's directory, removed at the end (also when the test fails).
struct OutDir(PathBuf);

impl Drop for OutDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
#[ignore = "needs root (namespaces, XDP) and the routers' environment; run by cargo xtask test"]
fn the_quick_benchmark_runs_every_contender_to_the_end() {
    let out =
        OutDir(std::env::temp_dir().join(format!("balancer-llm-quick-{}", std::process::id())));
    let opts = Options::quick(out.0.clone());
    let (results, figures) = llm::run(&opts).expect("the quick benchmark");

    let expected: Vec<String> = opts.sweep.clone().expect("--quick names its contenders");
    assert_eq!(results.shapes.len(), 1, "one shape");
    let shape = &results.shapes[0];
    assert_eq!(shape.knee, 3.0, "the given knee");
    let ran: Vec<&str> = shape.runs.iter().map(|r| r.contender.as_str()).collect();
    assert_eq!(ran, expected.iter().map(String::as_str).collect::<Vec<_>>());
    for run in &shape.runs {
        let s = &run.summary;
        assert_eq!(s.requests, 60, "{}: requests played", run.contender);
        assert_eq!(
            (s.completed, s.failed),
            (60, 0),
            "{}: every request completes with an intact stream",
            run.contender
        );
        assert_eq!(run.ttfts.len(), 60, "{}: a TTFT per request", run.contender);
        assert!(
            s.ttft_p50 > 0.0 && s.ttft_p50 <= s.ttft_p99,
            "{}: TTFT p50 {} p99 {}",
            run.contender,
            s.ttft_p50,
            s.ttft_p99
        );
        assert!(
            s.throughput > 0.0 && s.tokens_per_s > 0.0,
            "{}: throughput",
            run.contender
        );
        let shares: f64 = s.shares.values().sum();
        assert!(
            (shares - 1.0).abs() < 1e-6 && s.shares.len() >= 2,
            "{}: requests spread over the pool: {:?}",
            run.contender,
            s.shares
        );
        let cpu = run.cpu_per_1k.unwrap_or(-1.0);
        assert!(
            cpu > 0.0,
            "{}: CPU per 1k requests measured ({cpu})",
            run.contender
        );
        let contender = Contender::parse(&run.contender, opts.scrape_ms).expect("a contender");
        match (contender.is_router(), run.table_rebuilds_per_min) {
            (true, None) => {}
            (false, Some(r)) if r >= 0.0 => {
                // The composite policy's weights follow the load: under 20 s of it they move.
                assert!(
                    run.contender != "composite" || r > 0.0,
                    "composite: its weights never reached the table during the run"
                );
            }
            (_, r) => panic!("{}: table rebuilds per minute {r:?}", run.contender),
        }
        let hits = run.prefix_hit_rate.unwrap_or(-1.0);
        assert!(
            (0.0..=1.0).contains(&hits),
            "{}: prefix-cache hit rate read from the servers ({hits})",
            run.contender
        );
    }
    // Round robin spreads evenly: a check that the rack's four servers all take traffic.
    let rr = &shape.runs[0].summary.shares;
    assert_eq!(rr.len(), 4, "round robin reaches all four servers: {rr:?}");
    assert!(
        rr.values().all(|s| (*s - 0.25).abs() < 0.1),
        "round robin's shares: {rr:?}"
    );
    assert!(
        results.idle_added.contains_key("balancer")
            && results.idle_added.contains_key("vllm:power_of_two"),
        "latency added on an idle pool, per contender: {:?}",
        results.idle_added
    );

    for c in &expected {
        let key = format!("conversation/{c}/1.00/median/ttft_p99_s");
        assert!(
            figures.get(&key).is_some_and(|v| *v > 0.0),
            "JSON key {key}: {:?}",
            figures.get(&key)
        );
    }
    let report = std::fs::read_to_string(out.0.as_path().join("report.md")).expect("report.md");
    for c in &expected {
        assert!(report.contains(c.as_str()), "the report names {c}");
    }
    let plots: Vec<_> = std::fs::read_dir(out.0.as_path())
        .expect("the output directory")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "svg"))
        .collect();
    assert!(!plots.is_empty(), "SVG plots written");
}
