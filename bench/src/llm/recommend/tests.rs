//! Tests of `recommend`.

use super::*;
use crate::llm::Run;
use crate::load::stats::Summary;
use crate::load::workload::Shape;

fn run(contender: &str, load: f64, rep: usize, p99: f64, goodput: f64) -> Run {
    Run {
        shape: Shape::Conversation,
        contender: contender.into(),
        load,
        rate: load * 4.0,
        rep,
        summary: Summary {
            ttft_p99: p99,
            goodput,
            ..Summary::default()
        },
        cpu_per_1k: None,
        bpf_cpu_per_1k: None,
        bpf_runs_per_request: None,
        table_rebuilds_per_min: None,
        persistence: None,
        prefix_hit_rate: None,
        ttfts: Vec::new(),
        premium: Summary::default(),
        others: Summary::default(),
        tenants: None,
        wall: 1.0,
    }
}

/// Each contender's (p99, goodput) by repetition, the same at every load.
fn shape(rows: &[(&str, &[(f64, f64)])]) -> ShapeResult {
    let mut runs = Vec::new();
    for load in LOADS {
        for (name, reps) in rows {
            for (rep, (p99, goodput)) in reps.iter().enumerate() {
                runs.push(run(name, load, rep, *p99, *goodput));
            }
        }
    }
    ShapeResult {
        shape: Shape::Conversation,
        knee: 4.0,
        knee_how: "given".into(),
        probes: Vec::new(),
        runs,
    }
}

#[test]
fn the_lowest_p99_that_keeps_round_robin_s_goodput_is_recommended() {
    let s = shape(&[
        ("round-robin", &[(4.0, 3.0), (5.0, 3.0), (4.5, 3.1)]),
        // The lowest p99, but its goodput is clearly lower: left out.
        ("least-conn", &[(1.0, 2.0), (1.1, 2.1), (0.9, 2.0)]),
        ("composite", &[(1.5, 3.2), (1.6, 3.3), (1.4, 3.1)]),
    ]);
    let r = recommend(&s).unwrap();
    assert_eq!(r.policy, "composite");
    let text = r.because.join("\n");
    assert!(
        text.contains("p99 TTFT / round robin's at the knee: 0.33x"),
        "{text}"
    );
    assert!(
        text.contains("`least-conn` left out: its goodput is lower"),
        "{text}"
    );
}

#[test]
fn without_a_candidate_that_keeps_goodput_round_robin_is_recommended() {
    let s = shape(&[
        ("round-robin", &[(4.0, 3.0), (5.0, 3.0), (4.5, 3.1)]),
        ("composite", &[(1.5, 2.0), (1.6, 2.1), (1.4, 2.0)]),
    ]);
    assert_eq!(recommend(&s).unwrap().policy, "round-robin");
    // Without round robin there is nothing to compare with.
    let s = shape(&[("composite", &[(1.5, 2.0)])]);
    assert!(recommend(&s).is_none());
}

#[test]
fn the_config_snippet_is_a_vip_the_daemon_accepts() {
    for policy in ["composite", "persistence", "least-conn", "round-robin"] {
        let vip = snippet(policy, 4).unwrap();
        assert!(vip.starts_with("[[vip]]"), "{vip}");
        let config = format!("interface = \"eth0\"\n\n{vip}");
        balancer::base::config::Config::parse(&config)
            .unwrap_or_else(|e| panic!("{policy}: {e}\n{config}"));
    }
    assert!(snippet("vllm:cache_aware", 4).is_err());
}
