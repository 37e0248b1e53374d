//! Tests of `verdicts`.

use super::*;

/// Figures of `shape` with `metric` per contender at `load`, one value per repetition.
fn figures(shape: &str, load: &str, rows: &[(&str, &str, &[f64])]) -> Figures {
    let mut f = Figures::new();
    for (name, metric, values) in rows {
        for (r, v) in values.iter().enumerate() {
            f.insert(format!("{shape}/{name}/{load}/r{r}/{metric}"), *v);
        }
        // Summaries beside them are not repetitions.
        f.insert(format!("{shape}/{name}/{load}/median/{metric}"), 99.0);
    }
    f
}

#[test]
fn a_ratio_pairs_repetitions_by_seed_and_ignores_those_one_side_lacks() {
    let mut f = figures(
        "mixed",
        "0.50",
        &[
            ("composite", "ttft_p99_s", &[1.0, 2.0, 3.0]),
            ("round-robin", "ttft_p99_s", &[2.0, 4.0]),
        ],
    );
    // A contender whose name holds a '/'.
    f.insert("mixed/tenant-affinity/24/0.50/r0/ttft_p99_s".into(), 5.0);
    let s = Samples::of_shape(&f, "mixed");
    let r = s
        .paired("composite", "round-robin", "0.50", "ttft_p99_s")
        .unwrap();
    assert_eq!(r.pairs, 2);
    assert!((r.value - 0.5).abs() < 1e-12);
    // Every pair has the same ratio: the interval is that point.
    assert!((r.lo - 0.5).abs() < 1e-12 && (r.hi - 0.5).abs() < 1e-12);
    assert_eq!(
        s.reps("tenant-affinity/24", "0.50", "ttft_p99_s"),
        BTreeMap::from([(0, 5.0)])
    );
    // Another shape's keys (a shape whose name the first's starts with) are not read.
    let other = Samples::of_shape(&f, "mix");
    assert!(other.names.is_empty());
}

#[test]
fn a_target_is_met_missed_or_undecided_by_where_its_interval_lies() {
    let r = |lo, hi| Ratio {
        value: (lo + hi) / 2.0,
        lo,
        hi,
        pairs: 3,
    };
    assert_eq!(Line::AtMost(0.5).verdict(&r(0.3, 0.45)), Verdict::Met);
    assert_eq!(Line::AtMost(0.5).verdict(&r(0.55, 0.7)), Verdict::Missed);
    assert_eq!(Line::AtMost(0.5).verdict(&r(0.4, 0.6)), Verdict::Undecided);
    assert_eq!(Line::AtLeast(1.5).verdict(&r(1.6, 2.0)), Verdict::Met);
    assert_eq!(Line::AtLeast(1.5).verdict(&r(1.0, 1.4)), Verdict::Missed);
    // One pair: no interval, nothing decided.
    let one = Ratio {
        value: 0.1,
        lo: f64::NAN,
        hi: f64::NAN,
        pairs: 1,
    };
    assert_eq!(Line::AtMost(0.5).verdict(&one), Verdict::Undecided);
    assert_eq!(
        Verdict::all([Verdict::Met, Verdict::Undecided]),
        Some(Verdict::Undecided)
    );
    assert_eq!(
        Verdict::all([Verdict::Undecided, Verdict::Missed, Verdict::Met]),
        Some(Verdict::Missed)
    );
    assert_eq!(
        Verdict::all([Verdict::Met, Verdict::Met]),
        Some(Verdict::Met)
    );
    assert_eq!(Verdict::all([]), None);
}

#[test]
fn the_best_policy_is_stated_against_round_robin_and_the_best_router() {
    let mut f = figures(
        "conversation",
        "1.00",
        &[
            ("round-robin", "ttft_p99_s", &[4.0, 5.0, 6.0, 5.0]),
            ("least-conn", "ttft_p99_s", &[3.0, 3.0, 3.0, 3.0]),
            ("composite", "ttft_p99_s", &[1.0, 1.2, 1.1, 1.0]),
            ("vllm:cache_aware", "ttft_p99_s", &[2.0, 2.0, 2.5, 2.0]),
            ("sglang:cache_aware", "ttft_p99_s", &[4.0, 4.0, 4.0, 4.0]),
            ("composite", "cpu_s_per_1k_requests", &[0.1, 0.1, 0.1, 0.1]),
            (
                "vllm:cache_aware",
                "cpu_s_per_1k_requests",
                &[3.0, 3.0, 3.0, 3.0],
            ),
            ("composite", "goodput_rps", &[3.0, 2.9, 3.0, 3.1]),
            ("round-robin", "goodput_rps", &[3.0, 3.0, 3.0, 3.0]),
        ],
    );
    f.insert("conversation/knee_rps".into(), 3.0);
    let stated = stated(&Samples::of_shape(&f, "conversation"));
    let get = |key: &str| stated.iter().find(|s| s.key == key).unwrap();
    let p99 = get("best_over_rr/1.00/ttft_p99");
    assert!(p99.what.contains("`composite`"), "{}", p99.what);
    assert!((p99.ratio.value - 4.3 / 20.0).abs() < 1e-9);
    assert_eq!(p99.verdict(), Some(Verdict::Met));
    // Goodput straddles 0.98: undecided.
    assert_eq!(
        get("best_over_rr/1.00/goodput").verdict(),
        Some(Verdict::Undecided)
    );
    let router = get("best_over_router/ttft_p99");
    assert!(
        router.what.contains("`vllm:cache_aware`"),
        "{}",
        router.what
    );
    assert_eq!(router.verdict(), Some(Verdict::Met));
    let cpu = get("best_over_router/cpu");
    assert!((cpu.ratio.value - 0.1 / 3.0).abs() < 1e-9);
    assert_eq!(cpu.verdict(), Some(Verdict::Met));
    assert_eq!(over_round_robin_overall(&stated), Some(Verdict::Undecided));
    assert_eq!(undecided(&stated), 1);

    let mut out = Figures::new();
    insert(&mut out, "conversation", &stated);
    assert_eq!(
        out["conversation/target/best_over_rr/1.00/ttft_p99/at_most"],
        0.5
    );
    assert_eq!(
        out["conversation/target/best_over_rr/1.00/ttft_p99/verdict"],
        1.0
    );
    assert_eq!(
        out["conversation/target/best_over_rr/1.00/goodput/verdict"],
        0.0
    );
    assert_eq!(
        out["conversation/target/best_over_rr/1.00/ttft_p99/pairs"],
        4.0
    );
    assert!(out["conversation/target/best_over_rr/1.00/ttft_p99/lo"] <= 4.3 / 20.0);
    assert_eq!(out["conversation/targets_undecided"], 1.0);
}

#[test]
fn session_affinity_is_stated_against_load_only_at_each_load() {
    let f = figures(
        "multi-turn",
        "0.75",
        &[
            ("composite", "ttft_mean_s", &[2.0, 2.2, 1.8]),
            ("persistence", "ttft_mean_s", &[1.0, 1.0, 1.0]),
            ("composite", "ttft_p99_s", &[4.0, 4.0, 4.0]),
            ("persistence", "ttft_p99_s", &[5.0, 5.0, 5.0]),
        ],
    );
    let stated = stated(&Samples::of_shape(&f, "multi-turn"));
    let mean = stated
        .iter()
        .find(|s| s.key == "composite_over_persistence/0.75/ttft_mean")
        .unwrap();
    assert!((mean.ratio.value - 2.0).abs() < 1e-9);
    assert_eq!(mean.verdict(), Some(Verdict::Met));
    assert!(mean.what.ends_with("at 75% of the knee"), "{}", mean.what);
    let p99 = stated
        .iter()
        .find(|s| s.key == "persistence_over_composite/0.75/ttft_p99")
        .unwrap();
    assert_eq!(p99.verdict(), Some(Verdict::Missed));
}

#[test]
fn fair_share_states_its_two_targets_against_the_calm_and_the_unfair_runs() {
    let f = figures(
        "noisy-tenant",
        "0.75",
        &[
            ("calm:composite-fair", "well_ttft_p99_s", &[1.0, 1.0, 1.0]),
            ("noisy:composite-fair", "well_ttft_p99_s", &[1.1, 1.1, 1.1]),
            (
                "noisy:composite-cutoff",
                "well_ttft_p99_s",
                &[4.0, 4.0, 4.0],
            ),
            ("noisy:composite-fair", "goodput_rps", &[5.0, 5.0, 5.0]),
            ("noisy:composite-cutoff", "goodput_rps", &[5.5, 5.5, 5.5]),
        ],
    );
    let stated = stated(&Samples::of_shape(&f, "noisy-tenant"));
    let get = |key: &str| stated.iter().find(|s| s.key == key).unwrap();
    let p99 = get("fair_well_p99_over_calm/0.75");
    assert!((p99.ratio.value - 1.1).abs() < 1e-9);
    assert_eq!(p99.verdict(), Some(Verdict::Met));
    let goodput = get("fair_goodput_over_unfair/0.75");
    assert!((goodput.ratio.value - 5.0 / 5.5).abs() < 1e-9);
    assert_eq!(goodput.verdict(), Some(Verdict::Missed));
    let unfair = get("unfair_well_p99_over_calm/0.75");
    assert_eq!(unfair.verdict(), None);
    assert!(unfair.reading().ends_with("higher"), "{}", unfair.reading());
}
