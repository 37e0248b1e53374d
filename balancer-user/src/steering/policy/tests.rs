//! Tests of [`super`].

use super::*;

fn ip(i: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, i])
}

fn input(i: u8, signals: Signals) -> Input {
    Input {
        address: ip(i),
        configured: 1,
        signals: Some(signals),
        age: Some(Duration::from_millis(50)),
        flows: 0,
    }
}

fn cfg(kind: PolicyKind) -> PolicyConfig {
    PolicyConfig {
        kind,
        ewma_alpha: 1.0,
        ..PolicyConfig::default()
    }
}

fn weights(d: &[Decision]) -> Vec<u32> {
    d.iter().map(|d| d.weight).collect()
}

#[test]
fn a_saturated_kv_cache_gets_no_new_flows() {
    let mut state = PolicyState::default();
    let kv = |v| Signals {
        kv_usage: Some(v),
        ..Signals::default()
    };
    let d = decide(
        &cfg(PolicyKind::Composite),
        &[input(1, kv(0.97)), input(2, kv(0.5))],
        &mut state,
    );
    assert_eq!(d[0].weight, 0);
    assert!(
        d[0].reason.contains("KV cache 97% >= 95%"),
        "{}",
        d[0].reason
    );
    assert!(d[0].saturated && !d[1].saturated);
    assert!(d[1].weight > 0);
}

#[test]
fn a_long_queue_gets_no_new_flows_when_a_cut_off_is_set() {
    let queue = |waiting| Signals {
        kv_usage: Some(0.3),
        running: Some(4.0),
        waiting: Some(waiting),
        ..Signals::default()
    };
    let inputs = [input(1, queue(6.0)), input(2, queue(1.0))];
    // Off by default: a long queue only lowers the weight.
    let d = decide(
        &cfg(PolicyKind::Composite),
        &inputs,
        &mut PolicyState::default(),
    );
    assert!(d[0].weight > 0 && d[0].weight < d[1].weight, "{d:?}");
    let c = PolicyConfig {
        queue_saturation: 6,
        ..cfg(PolicyKind::Composite)
    };
    let d = decide(&c, &inputs, &mut PolicyState::default());
    assert_eq!(d[0].weight, 0);
    assert_eq!(d[0].reason, "saturated: 6 requests waiting >= 6");
    assert!(d[0].saturated);
    assert!(d[1].weight > 0, "{d:?}");
}

#[test]
fn composite_weights_follow_the_expected_delay_of_each_backend() {
    // Two fast servers (a prompt's prefill 0.25 s) and a slow one (1 s), idle: the slow
    // one gets the floor, the fast ones the top.
    let prefill = |p: f64, waiting: f64| Signals {
        kv_usage: Some(0.1),
        running: Some(2.0),
        waiting: Some(waiting),
        prefill_seconds: Some(p),
        ..Signals::default()
    };
    let c = cfg(PolicyKind::Composite);
    let idle = decide(
        &c,
        &[
            input(1, prefill(0.25, 0.0)),
            input(2, prefill(0.25, 0.0)),
            input(3, prefill(1.0, 0.0)),
        ],
        &mut PolicyState::default(),
    );
    // exp(3 x (1 - 1 s / 0.25 s)): far below the floor (1% of the top).
    assert_eq!(weights(&idle), vec![1000, 1000, 10], "{idle:?}");
    assert!(
        idle[2]
            .reason
            .contains("expected delay 1000 ms, pool's best 250 ms"),
        "{}",
        idle[2].reason
    );
    // The fast ones queue 5 requests each (1.5 s ahead): the slow idle one is now the best.
    let busy = decide(
        &c,
        &[
            input(1, prefill(0.25, 5.0)),
            input(2, prefill(0.25, 5.0)),
            input(3, prefill(1.0, 0.0)),
        ],
        &mut PolicyState::default(),
    );
    assert_eq!(busy[2].weight, 1000, "{busy:?}");
    assert!(busy[0].weight < 600, "{busy:?}");
    // A server not measured yet counts as the pool's median; with the factor at 0 the KV
    // capacity decides, as before.
    let d = decide(
        &c,
        &[
            input(1, prefill(0.25, 0.0)),
            input(
                2,
                Signals {
                    prefill_seconds: None,
                    ..prefill(0.25, 0.0)
                },
            ),
        ],
        &mut PolicyState::default(),
    );
    assert_eq!(weights(&d), vec![1000, 1000]);
    let mut off = cfg(PolicyKind::Composite);
    off.factors.delay = 0.0;
    let d = decide(
        &off,
        &[input(1, prefill(0.25, 0.0)), input(3, prefill(1.0, 0.0))],
        &mut PolicyState::default(),
    );
    assert_eq!(d[0].weight, d[1].weight, "{d:?}");
}

#[test]
fn composite_delays_compare_prefill_speed_not_the_prompts_each_backend_got() {
    // Two equal GPUs (0.1 ms of prefill per prompt token): one happened to get short
    // prompts (a mean prefill 158 ms), the other long ones (374 ms); a GPU 4x slower
    // per token got mid-sized ones.
    let measured = |per_token: f64, prompt: f64| Signals {
        kv_usage: Some(0.1),
        running: Some(1.0),
        waiting: Some(0.0),
        prefill_seconds: Some(per_token * prompt),
        prefill_seconds_per_token: Some(per_token),
        prompt_tokens_mean: Some(prompt),
        ..Signals::default()
    };
    let d = decide(
        &cfg(PolicyKind::Composite),
        &[
            input(1, measured(1e-4, 1580.0)),
            input(2, measured(1e-4, 3740.0)),
            input(3, measured(4e-4, 2000.0)),
        ],
        &mut PolicyState::default(),
    );
    assert_eq!(weights(&d), vec![1000, 1000, 10], "{d:?}");
    // The pool's median prompt (2,000 tokens) at each backend's speed.
    assert!(
        d[2].reason
            .contains("expected delay 800 ms, pool's best 200 ms"),
        "{}",
        d[2].reason
    );
}

/// A GPU at 0.1 ms per prompt token, prompts of 2,000 tokens (200 ms each), with `prefilling`
/// requests running without a first token and its prefix-cache hit rate.
fn prefilling_gpu(prefilling: f64, hits: Option<f64>) -> Signals {
    Signals {
        kv_usage: Some(0.1),
        running: Some(prefilling),
        waiting: Some(0.0),
        prefilling: Some(prefilling),
        prefill_seconds_per_token: Some(1e-4),
        prefill_seconds_per_token_fastest: Some(1e-4),
        prompt_tokens_mean: Some(2000.0),
        prefix_cache_hit_rate: hits,
        ..Signals::default()
    }
}

#[test]
fn composite_delays_count_the_share_of_each_prompt_a_backend_computes() {
    // Two equal GPUs, 0.1 ms per computed token, the pool's prompt 2,000 tokens: a whole
    // prompt prefills in 200 ms. GPU 1 finds 75% of its prompt tokens in its prefix cache and
    // has 2 requests ahead: 50 ms a request, 150 ms in all; GPU 2 finds none and has none
    // ahead: 200 ms. So GPU 1 is the pool's best.
    let gpu = |prefilling: f64, hits: f64, computed_tokens_on_page: bool| Signals {
        computed_sum_count: computed_tokens_on_page.then_some((500.0, 1.0)),
        ..prefilling_gpu(prefilling, Some(hits))
    };
    let pool = |first: Signals, second: Signals| {
        decide(
            &cfg(PolicyKind::Composite),
            &[input(1, first), input(2, second)],
            &mut PolicyState::default(),
        )
    };
    // Over computed tokens GPU 1 leads; over prompt tokens (a page without the computed
    // tokens) the speed already counts the hits: 200 ms x 3 against 200 ms, GPU 2 leads.
    for (on_page, first_leads, delays) in [
        (true, true, "expected delay 150 ms, pool's best 150 ms"),
        (false, false, "expected delay 600 ms, pool's best 200 ms"),
    ] {
        let d = pool(gpu(2.0, 0.75, on_page), gpu(0.0, 0.0, on_page));
        assert_eq!(d[0].weight > d[1].weight, first_leads, "{d:?}");
        assert!(d[0].reason.contains(delays), "{}", d[0].reason);
    }
    // Every prompt token a hit: still a token computed, never a delay of nothing.
    let d = pool(gpu(0.0, 1.0, true), gpu(0.0, 0.0, true));
    assert!(
        d[0].reason.contains("expected delay 0 ms"),
        "{}",
        d[0].reason
    );
    assert_eq!(weights(&d), vec![1000, 10], "{d:?}");
}

#[test]
fn composite_delays_count_the_requests_still_in_their_prefill() {
    // A GPU 4x faster per prompt token (its fastest measured: 0.1 ms) that admitted a burst to
    // its batch: nothing waits, but 5 of its 6 running requests have no first token yet, and
    // its mean prefill per token came out at 0.4 ms (requests admitted together share steps).
    // Against an idle slow GPU (0.4 ms) its expected delay is 6 prefills at its own speed
    // (1.2 s) to the slow one's 800 ms, so the slow one takes the next requests.
    let gpu = |mean: f64, fastest: f64, running: f64, prefilling: Option<f64>| Signals {
        kv_usage: Some(0.1),
        running: Some(running),
        waiting: Some(0.0),
        prefilling,
        prefill_seconds_per_token: Some(mean),
        prefill_seconds_per_token_fastest: Some(fastest),
        prompt_tokens_mean: Some(2000.0),
        ..Signals::default()
    };
    let d = decide(
        &cfg(PolicyKind::Composite),
        &[
            input(1, gpu(4e-4, 1e-4, 6.0, Some(5.0))),
            input(2, gpu(4e-4, 4e-4, 0.0, Some(0.0))),
        ],
        &mut PolicyState::default(),
    );
    assert!(d[1].weight > d[0].weight, "{d:?}");
    assert!(
        d[0].reason
            .contains("expected delay 1200 ms, pool's best 800 ms"),
        "{}",
        d[0].reason
    );
    // Where the servers do not say (other kinds): waiting, and the mean prefill per token.
    let d = decide(
        &cfg(PolicyKind::Composite),
        &[
            input(1, gpu(1e-4, 1e-4, 6.0, None)),
            input(2, gpu(4e-4, 4e-4, 0.0, None)),
        ],
        &mut PolicyState::default(),
    );
    assert!(d[0].weight > d[1].weight, "{d:?}");
    assert!(
        d[1].reason
            .contains("expected delay 800 ms, pool's best 200 ms"),
        "{}",
        d[1].reason
    );
}

#[test]
fn returning_clients_go_elsewhere_only_when_their_cached_prompt_is_worth_less_than_the_wait() {
    // Three equal GPUs: a whole prompt (2,000 tokens at 0.1 ms) prefills in 200 ms; 80% of
    // the prompt tokens they see are found in the prefix cache, so each request ahead computes
    // 40 ms on average, and a returning client's own prompt is cached. GPU 1 has 3 requests
    // ahead (120 ms at home against 200 ms on the idle GPU 3: it stays), GPU 2 has 6 (240 ms:
    // it goes).
    let gpu = prefilling_gpu;
    let d = decide(
        &cfg(PolicyKind::Composite),
        &[
            input(1, gpu(3.0, Some(0.8))),
            input(2, gpu(6.0, Some(0.8))),
            input(3, gpu(0.0, Some(0.8))),
        ],
        &mut PolicyState::default(),
    );
    let elsewhere: Vec<bool> = d.iter().map(|d| d.returning_elsewhere).collect();
    assert_eq!(elsewhere, vec![false, true, false], "{d:?}");
    assert!(
        d[1].reason
            .contains("a returning client sooner elsewhere (240 ms here, 200 ms there"),
        "{}",
        d[1].reason
    );
    assert!(!d[0].reason.contains("returning"), "{}", d[0].reason);
    // Elsewhere a GPU computes its queue's share too: GPU 3 busy with 4 (200 x (0.2 x 4 + 1)
    // = 360 ms there) keeps GPU 2's clients home.
    let d = decide(
        &cfg(PolicyKind::Composite),
        &[input(2, gpu(6.0, Some(0.8))), input(3, gpu(4.0, Some(0.8)))],
        &mut PolicyState::default(),
    );
    assert!(!d[0].returning_elsewhere, "{d:?}");
    // Where the hits are unknown, the cache's worth cannot be weighed: never sent elsewhere.
    let d = decide(
        &cfg(PolicyKind::Composite),
        &[input(2, gpu(6.0, None)), input(3, gpu(0.0, None))],
        &mut PolicyState::default(),
    );
    assert!(d.iter().all(|d| !d.returning_elsewhere), "{d:?}");
    // Other policies have no expected delays: never.
    let d = decide(
        &cfg(PolicyKind::LeastConn),
        &[input(2, gpu(6.0, Some(0.8))), input(3, gpu(0.0, Some(0.8)))],
        &mut PolicyState::default(),
    );
    assert!(d.iter().all(|d| !d.returning_elsewhere), "{d:?}");
}

#[test]
fn weights_follow_free_gpu_memory() {
    let mut state = PolicyState::default();
    let gib = 1024.0 * 1024.0 * 1024.0;
    let mem = |used: f64| Signals {
        gpu_memory_used_bytes: Some(used * gib),
        gpu_memory_total_bytes: Some(80.0 * gib),
        ..Signals::default()
    };
    let d = decide(
        &cfg(PolicyKind::Gpu),
        &[
            input(1, mem(20.0)),
            input(2, mem(40.0)),
            input(3, mem(60.0)),
        ],
        &mut state,
    );
    // Free 60, 40, 20 GiB -> 1000, 667, 333 (quantum 10).
    assert_eq!(weights(&d), vec![1000, 670, 330]);
    let mut cfg = cfg(PolicyKind::Gpu);
    cfg.min_free_gpu_memory_bytes = 30.0 * gib;
    let d = decide(
        &cfg,
        &[input(1, mem(20.0)), input(2, mem(60.0))],
        &mut PolicyState::default(),
    );
    assert_eq!(d[1].weight, 0, "{}", d[1].reason);
    assert!(
        d[1].reason
            .contains("free GPU memory 20480 MiB < 30720 MiB"),
        "{}",
        d[1].reason
    );
}

#[test]
fn hysteresis_holds_weights_under_small_noise() {
    let mut state = PolicyState::default();
    let c = PolicyConfig {
        kind: PolicyKind::Composite,
        ..PolicyConfig::default()
    };
    let load = |kv: f64, waiting: f64| Signals {
        kv_usage: Some(kv),
        waiting: Some(waiting),
        running: Some(8.0),
        ..Signals::default()
    };
    let first = weights(&decide(
        &c,
        &[input(1, load(0.3, 1.0)), input(2, load(0.6, 4.0))],
        &mut state,
    ));
    // Settle the EWMA.
    for _ in 0..20 {
        decide(
            &c,
            &[input(1, load(0.3, 1.0)), input(2, load(0.6, 4.0))],
            &mut state,
        );
    }
    let settled = weights(&decide(
        &c,
        &[input(1, load(0.3, 1.0)), input(2, load(0.6, 4.0))],
        &mut state,
    ));
    assert!(settled[0] > settled[1] && first[0] > first[1]);
    // +-2% noise on every input: nothing moves.
    for round in 0..200 {
        let n = if round % 2 == 0 { 1.02 } else { 0.98 };
        let d = decide(
            &c,
            &[
                input(1, load(0.3 * n, 1.0 * n)),
                input(2, load(0.6 / n, 4.0 / n)),
            ],
            &mut state,
        );
        assert_eq!(
            weights(&d),
            settled,
            "round {round}: weights moved under 2% noise"
        );
    }
    // A real change moves them.
    let d = decide(
        &c,
        &[input(1, load(0.9, 10.0)), input(2, load(0.2, 0.0))],
        &mut state,
    );
    assert!(weights(&d)[1] > settled[1], "{d:?}");
}

#[test]
fn stale_reports_are_saturated_or_kept() {
    let mut state = PolicyState::default();
    let ok = Signals {
        kv_usage: Some(0.2),
        ..Signals::default()
    };
    let mut c = cfg(PolicyKind::Composite);
    let fresh = decide(
        &c,
        &[input(1, ok.clone()), input(2, ok.clone())],
        &mut state,
    );
    let mut old = input(2, ok.clone());
    old.age = Some(Duration::from_secs(5));
    let d = decide(&c, &[input(1, ok.clone()), old.clone()], &mut state);
    assert_eq!(d[1].weight, 0);
    assert!(
        d[1].reason
            .contains("stale report (5000 ms old): treated as saturated"),
        "{}",
        d[1].reason
    );
    c.stale = StaleMode::Keep;
    let mut state = PolicyState::default();
    decide(&c, &[input(1, ok.clone()), input(2, ok)], &mut state);
    let d = decide(
        &c,
        &[
            input(
                1,
                Signals {
                    kv_usage: Some(0.2),
                    ..Signals::default()
                },
            ),
            old,
        ],
        &mut state,
    );
    assert_eq!(d[1].weight, fresh[1].weight, "{}", d[1].reason);
    assert!(d[1].reason.contains("keeping the last weight"));
}

#[test]
fn the_floor_keeps_slow_backends_in_rotation_and_capacity_counts() {
    let mut state = PolicyState::default();
    let s = |kv: f64, cap: f64| Signals {
        kv_usage: Some(kv),
        kv_capacity_tokens: Some(cap),
        inflight_tokens: Some(kv * cap),
        ..Signals::default()
    };
    let c = PolicyConfig {
        kind: PolicyKind::Tokens,
        ewma_alpha: 1.0,
        floor: 0.1,
        ..PolicyConfig::default()
    };
    // A large GPU (4x the KV capacity) half full beats a small one a quarter full.
    let d = decide(
        &c,
        &[
            input(1, s(0.5, 400_000.0)),
            input(2, s(0.25, 100_000.0)),
            input(3, s(0.94, 100_000.0)),
        ],
        &mut state,
    );
    assert_eq!(d[0].weight, 1000);
    assert!(d[1].weight < 500, "{d:?}");
    assert_eq!(d[2].weight, 100, "the floor: {d:?}");
}

#[test]
fn least_conn_and_static() {
    let mut state = PolicyState::default();
    let mut a = input(1, Signals::default());
    a.flows = 0;
    let mut b = input(2, Signals::default());
    b.flows = 3;
    b.age = None;
    let d = decide(
        &cfg(PolicyKind::LeastConn),
        &[a.clone(), b.clone()],
        &mut state,
    );
    assert_eq!(weights(&d), vec![1000, 250]);
    a.configured = 7;
    let d = decide(&cfg(PolicyKind::Static), &[a, b], &mut state);
    assert_eq!(weights(&d), vec![7, 1]);
}

#[test]
fn when_all_are_saturated_capacity_decides() {
    let mut state = PolicyState::default();
    let full = |capacity: f64| Signals {
        kv_usage: Some(0.99),
        kv_capacity_tokens: Some(capacity),
        ..Signals::default()
    };
    let d = decide(
        &cfg(PolicyKind::Composite),
        &[
            input(1, full(65_536.0)),
            input(2, full(16_384.0)),
            input(3, full(65_536.0)),
        ],
        &mut state,
    );
    assert_eq!(weights(&d), vec![1000, 250, 1000]);
    assert!(
        d[0].reason.starts_with("every backend saturated"),
        "{}",
        d[0].reason
    );
    // Saturated all the same, whatever weight they keep.
    assert!(d.iter().all(|d| d.saturated));
    assert!(pool_saturated(&d, |_| true));
}

#[test]
fn a_pool_is_saturated_only_when_every_eligible_backend_is() {
    let mut state = PolicyState::default();
    let kv = |v| Signals {
        kv_usage: Some(v),
        ..Signals::default()
    };
    let mut stale = input(3, kv(0.1));
    stale.age = Some(Duration::from_secs(60));
    let d = decide(
        &cfg(PolicyKind::Composite),
        &[input(1, kv(0.99)), input(2, kv(0.5)), stale],
        &mut state,
    );
    assert_eq!(
        d.iter().map(|d| d.saturated).collect::<Vec<_>>(),
        vec![true, false, false],
        "a stale report is staleness, not saturation"
    );
    assert!(!pool_saturated(&d, |_| true));
    assert!(pool_saturated(&d, |a| a == ip(1)), "only 10.0.0.1 eligible");
    assert!(
        !pool_saturated(&d, |a| a == ip(1) || a == ip(3)),
        "a stale backend keeps the pool open (admission fails open)"
    );
    assert!(!pool_saturated(&d, |_| false), "no eligible backend");
}

#[test]
fn capacities_are_configured_weight_times_kv_capacity_against_the_mean() {
    let kv = |capacity: f64| Signals {
        kv_capacity_tokens: Some(capacity),
        ..Signals::default()
    };
    // 2 large + 2 small GPUs: 65,536 and 16,384 tokens against a mean of 40,960.
    let mut inputs = vec![
        input(1, kv(65_536.0)),
        input(2, kv(65_536.0)),
        input(3, kv(16_384.0)),
        input(4, kv(16_384.0)),
    ];
    inputs[1].configured = 2;
    let c: Vec<f64> = capacities(&inputs, PolicyConfig::default().max_ratio)
        .iter()
        .map(|(_, c)| *c)
        .collect();
    assert_eq!(c, [1.6, 3.2, 0.4, 0.4]);
    // However loaded they are: the weights follow the load, the capacities do not.
    inputs[0].signals.as_mut().unwrap().waiting = Some(50.0);
    assert_eq!(
        capacities(&inputs, PolicyConfig::default().max_ratio)[0].1,
        1.6
    );
    // No KV capacity reported: the configured weights.
    for i in &mut inputs {
        i.signals = None;
    }
    let c: Vec<f64> = capacities(&inputs, PolicyConfig::default().max_ratio)
        .iter()
        .map(|(_, c)| *c)
        .collect();
    assert_eq!(c, [1.0, 2.0, 1.0, 1.0]);
}

/// An ordinary backend's report: some load, a 100k-token cache, 50 ms to prefill a prompt.
fn ordinary(waiting: f64) -> Signals {
    Signals {
        kv_usage: Some(0.4),
        running: Some(4.0),
        waiting: Some(waiting),
        kv_capacity_tokens: Some(100_000.0),
        prefill_seconds: Some(0.05),
        ..Signals::default()
    }
}

/// What a compromised host could claim: an idle server with a boundless cache that prefills
/// in no time.
fn lying() -> Signals {
    Signals {
        kv_usage: Some(0.0),
        running: Some(0.0),
        waiting: Some(0.0),
        kv_capacity_tokens: Some(9e15),
        prefill_seconds: Some(1e-9),
        ..Signals::default()
    }
}

fn shares(d: &[Decision]) -> Vec<f64> {
    let total: u32 = d.iter().map(|d| d.weight).sum();
    d.iter()
        .map(|d| f64::from(d.weight) / f64::from(total))
        .collect()
}

#[test]
fn one_lying_report_cannot_take_more_than_its_bounded_share() {
    for kind in [PolicyKind::Composite, PolicyKind::Tokens] {
        let cfg = cfg(kind);
        let inputs = [
            input(1, lying()),
            input(2, ordinary(1.0)),
            input(3, ordinary(2.0)),
            input(4, ordinary(3.0)),
        ];
        let d = decide(&cfg, &inputs, &mut PolicyState::default());
        let s = shares(&d);
        // Four backends of equal configured weight: at most 3 x 1/4 (a quantum's rounding
        // aside), the others keeping the rest by their own scores.
        assert!(s[0] <= 0.75 + 0.01, "{kind:?}: {s:?} {d:?}");
        assert!(s[0] > 0.5, "{kind:?}: the liar still scores first: {s:?}");
        assert!(
            d[1].weight >= d[2].weight && d[2].weight >= d[3].weight && d[3].weight > 0,
            "{kind:?}: {d:?}"
        );
        assert!(d[0].reason.contains("policy.max_share"), "{}", d[0].reason);
        // Alone with one other backend, 3 x 1/2 bounds nothing: the other keeps the floor.
        let d = decide(&cfg, &inputs[..2], &mut PolicyState::default());
        assert!(d[1].weight > 0, "{d:?}");
    }
}

#[test]
fn a_bounded_share_is_met_exactly_and_leaves_honest_pools_alone() {
    let inputs: Vec<Input> = (1..=4).map(|i| input(i, Signals::default())).collect();
    // Water-filling: 1000 against 3 x 10 -> the first holds 3/4 of a total of 30 / (1 - 3/4).
    let mut targets = vec![Some(1000.0), Some(10.0), Some(10.0), Some(10.0)];
    let capped = cap_shares(&mut targets, &inputs, 3.0);
    assert_eq!(capped, [true, false, false, false]);
    assert_eq!(targets, [Some(90.0), Some(10.0), Some(10.0), Some(10.0)]);
    // Two over the bound (of 1.5 x 1/4 each) are both capped: 3/8 each of 20 / (1 - 3/4).
    let mut targets = vec![Some(1000.0), Some(1000.0), Some(10.0), Some(10.0)];
    let capped = cap_shares(&mut targets, &inputs, 1.5);
    assert_eq!(capped, [true, true, false, false]);
    assert_eq!(targets, [Some(30.0), Some(30.0), Some(10.0), Some(10.0)]);
    // The one over the bound is capped from the total the others leave, once: the second
    // (800 of a total of 1640) stays under half.
    let mut targets = vec![Some(1000.0), Some(800.0), Some(10.0), Some(10.0)];
    assert_eq!(
        cap_shares(&mut targets, &inputs, 2.0),
        [true, false, false, false]
    );
    assert_eq!(targets, [Some(820.0), Some(800.0), Some(10.0), Some(10.0)]);
    // Within the bound, or not scored: untouched.
    let mut targets = vec![Some(300.0), None, Some(200.0), Some(100.0)];
    assert_eq!(cap_shares(&mut targets, &inputs, 3.0), [false; 4]);
    assert_eq!(targets, [Some(300.0), None, Some(200.0), Some(100.0)]);
}

#[test]
fn a_reported_capacity_counts_within_max_ratio_of_the_median() {
    let kv = |capacity: f64| Signals {
        kv_capacity_tokens: Some(capacity),
        ..Signals::default()
    };
    let inputs = [
        input(1, kv(1e15)),
        input(2, kv(1000.0)),
        input(3, kv(1000.0)),
        input(4, kv(1e-3)),
    ];
    // Median 1000 (the upper middle): 10,000, 1000, 1000 and 100, against their mean 3025.
    let c: Vec<f64> = capacities(&inputs, 10.0).iter().map(|(_, c)| *c).collect();
    let want = [10_000.0, 1000.0, 1000.0, 100.0].map(|v| v / 3025.0);
    for (c, w) in c.iter().zip(want) {
        assert!((c - w).abs() < 1e-12, "{c} against {w}");
    }
}
