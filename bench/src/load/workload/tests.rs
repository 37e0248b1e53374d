//! Tests of `workload`.

use super::*;

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize - 1]
}

fn opts(shape: Shape, requests: usize, rate: f64, seed: u64) -> WorkloadOptions {
    WorkloadOptions {
        shape,
        requests,
        rate,
        seed,
        trace_clients: TraceClients::PerRequest,
        trace_time: TraceTime::Rate,
        seconds: 0.0,
    }
}

#[test]
fn the_shipped_trace_parses_and_workloads_repeat() {
    let trace = shipped_trace().unwrap();
    assert_eq!(trace.len(), 2400);
    for shape in Shape::ALL {
        let a = build(&opts(shape, 200, 4.0, 7), &trace).unwrap();
        assert_eq!(
            a,
            build(&opts(shape, 200, 4.0, 7), &trace).unwrap(),
            "{shape:?}"
        );
        assert_ne!(
            a,
            build(&opts(shape, 200, 4.0, 8), &trace).unwrap(),
            "{shape:?}"
        );
        assert_eq!(request_count(&a), 200, "{shape:?}");
    }
}

#[test]
fn shapes_have_their_sizes_and_rates() {
    let trace = shipped_trace().unwrap();
    let sizes = |w: &[Conversation]| -> (f64, f64) {
        let turns: Vec<&Turn> = w.iter().flat_map(|c| &c.turns).collect();
        let n = turns.len() as f64;
        (
            turns
                .iter()
                .map(|t| t.message.split_whitespace().count() as f64)
                .sum::<f64>()
                / n,
            turns
                .iter()
                .map(|t| f64::from(t.output_tokens))
                .sum::<f64>()
                / n,
        )
    };
    let rate = |w: &[Conversation]| (w.len() - 1) as f64 / (w.last().unwrap().start - w[0].start);
    let p = build(&opts(Shape::PrefillHeavy, 3000, 5.0, 1), &trace).unwrap();
    let (prompt, output) = sizes(&p);
    assert!((1900.0..2300.0).contains(&prompt), "{prompt}");
    assert!((20.0..28.0).contains(&output), "{output}");
    assert!((4.6..5.4).contains(&rate(&p)), "{}", rate(&p));
    for seed in [0, 1, 2] {
        let c = build(&opts(Shape::Conversation, 600, 3.0, seed), &trace).unwrap();
        assert!((2.99..3.01).contains(&rate(&c)), "{}", rate(&c));
        assert_eq!(c[0].start, 0.0);
    }
    let c = build(&opts(Shape::Conversation, 1000, 3.0, 0), &trace).unwrap();
    assert!(sizes(&c).1 > 200.0, "decode-heavy: {:?}", sizes(&c));
    // Bursty: the same mean rate, but gaps far more variable than Poisson's (CV 1).
    let m = build(&opts(Shape::Mixed, 3000, 5.0, 1), &trace).unwrap();
    assert!((4.0..6.0).contains(&rate(&m)), "{}", rate(&m));
    let gaps: Vec<f64> = m.windows(2).map(|w| w[1].start - w[0].start).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
    assert!(sd / mean > 1.3, "CV {}", sd / mean);
    // Multi-turn: about 4 turns each, later turns wait for their think time.
    let t = build(&opts(Shape::MultiTurn, 2000, 4.0, 1), &trace).unwrap();
    let mean_turns = 2000.0 / t.len() as f64;
    assert!((3.2..4.8).contains(&mean_turns), "{mean_turns}");
    assert!(t.iter().flat_map(|c| &c.turns[1..]).all(|x| x.think > 0.0));
    assert!(percentile(t.iter().map(|c| c.turns.len() as f64).collect(), 99.0) >= 8.0);
}

#[test]
fn conversations_come_from_their_own_addresses_or_a_nat() {
    let trace = shipped_trace().unwrap();
    let distinct = |w: &[Conversation]| {
        let mut a: Vec<IpAddr> = w.iter().map(|c| c.source).collect();
        a.sort();
        a.dedup();
        a.len()
    };
    let own = build(&opts(Shape::MultiTurn, 400, 4.0, 1), &trace).unwrap();
    assert_eq!(distinct(&own), 100.min(own.len()));
    let nat = build(&opts(Shape::MultiTurnNat, 400, 4.0, 1), &trace).unwrap();
    assert_eq!(distinct(&nat), 4);
    // Texts differ per conversation.
    assert_ne!(own[0].turns[0].message, own[1].turns[0].message);
}

#[test]
fn tenants_share_a_network_and_a_system_prompt() {
    for shape in [Shape::Tenants, Shape::TenantsMany] {
        tenants_of(shape);
    }
}

fn tenants_of(shape: Shape) {
    let trace = shipped_trace().unwrap();
    let layout = shape.tenants().unwrap();
    let w = build(&opts(shape, 4000, 4.0, 3), &trace).unwrap();
    let network = |c: &Conversation| match c.source {
        IpAddr::V4(a) => u32::from(a) >> (32 - layout.prefix_v4),
        IpAddr::V6(_) => unreachable!(),
    };
    let mut by_network: std::collections::BTreeMap<u32, Vec<&Conversation>> =
        std::collections::BTreeMap::new();
    for c in &w {
        by_network.entry(network(c)).or_default().push(c);
    }
    assert_eq!(by_network.len(), layout.tenants, "a network per tenant");
    let mut sizes = Vec::new();
    for convs in by_network.values() {
        // The tenant's conversations open with one prompt of 300-3,000 words...
        let first: Vec<Vec<&str>> = convs
            .iter()
            .map(|c| c.turns[0].message.split_whitespace().collect())
            .collect();
        let shared = (0..first[0].len())
            .take_while(|&i| first.iter().all(|f| f.get(i) == first[0].get(i)))
            .count();
        let m = layout.prompt_median;
        assert!(
            convs.len() < 2 || (0.3 * m..=3.0 * m).contains(&(shared as f64)),
            "{shared}"
        );
        // ...from several addresses of its network, and later turns carry no prompt.
        let mut addrs: Vec<IpAddr> = convs.iter().map(|c| c.source).collect();
        addrs.sort();
        addrs.dedup();
        assert!(
            convs.len() < 40 || addrs.len() > layout.addresses() / 2,
            "{}",
            addrs.len()
        );
        sizes.push(convs.len());
    }
    // Popularity falls with rank (Zipf): the top tenant has several times the last's.
    sizes.sort_unstable();
    assert!(sizes[layout.tenants - 1] > 3 * sizes[0], "{sizes:?}");
    // Other shapes are unchanged by the tenants' prompts.
    let own = build(&opts(Shape::MultiTurn, 400, 4.0, 1), &trace).unwrap();
    assert!(own[0].turns[0].message.split_whitespace().count() <= 1000);
}

/// A trace of `n` requests 0.5 s apart, request i in session i mod 3 with blocks [i mod 2, i].
fn sessions_and_blocks(n: usize) -> Vec<TraceRequest> {
    (0..n)
        .map(|i| TraceRequest {
            at: i as f64 * 0.5,
            prompt_tokens: 2 * BLOCK_TOKENS - 12,
            output_tokens: 10,
            session: Some(i as u64 % 3),
            blocks: vec![i as u64 % 2, 100 + i as u64],
        })
        .collect()
}

#[test]
fn trace_clients_parse_and_map_requests_to_addresses() {
    for (text, expect) in [
        ("per-request", TraceClients::PerRequest),
        ("per-session", TraceClients::PerSession),
        ("per-prefix", TraceClients::PerPrefix),
        ("behind:4", TraceClients::Behind(4)),
    ] {
        assert_eq!(TraceClients::parse(text).unwrap(), expect);
    }
    for bad in ["", "behind:0", "behind:101", "behind:x", "per-tenant"] {
        assert!(TraceClients::parse(bad).is_err(), "{bad:?}");
    }
    let trace = sessions_and_blocks(60);
    let sources = |clients| {
        let o = WorkloadOptions {
            trace_clients: clients,
            ..opts(Shape::Conversation, 60, 2.0, 0)
        };
        let w = build(&o, &trace).unwrap();
        w.iter().map(|c| c.source).collect::<Vec<_>>()
    };
    let distinct = |s: &[IpAddr]| s.iter().collect::<std::collections::BTreeSet<_>>().len();
    assert_eq!(distinct(&sources(TraceClients::PerRequest)), 60);
    let by_session = sources(TraceClients::PerSession);
    assert_eq!(distinct(&by_session), 3);
    assert!((0..60).all(|i| by_session[i] == by_session[i % 3]));
    let by_prefix = sources(TraceClients::PerPrefix);
    assert_eq!(distinct(&by_prefix), 2);
    assert!((0..60).all(|i| by_prefix[i] == by_prefix[i % 2]));
    assert_eq!(distinct(&sources(TraceClients::Behind(4))), 4);
}

#[test]
fn shared_blocks_become_shared_prompt_prefixes() {
    let w = build(
        &opts(Shape::Conversation, 4, 2.0, 0),
        &sessions_and_blocks(4),
    )
    .unwrap();
    let words = |i: usize| -> Vec<&str> { w[i].turns[0].message.split(' ').collect() };
    let block = BLOCK_TOKENS as usize;
    // Requests 0 and 2 share their first block, not their second; 0 and 1 share nothing.
    assert_eq!(words(0)[..block], words(2)[..block]);
    assert_ne!(words(0)[block..], words(2)[block..]);
    assert_ne!(words(0)[..block], words(1)[..block]);
    assert_eq!(words(0).len(), 2 * block - 12);
    // A block cut short is the start of the same block in full; tokens past the blocks are
    // fresh words.
    let mut rng = Rng::new(1);
    let short = prompt_of_blocks(&[7], 100, &mut rng);
    let full = prompt_of_blocks(&[7, 8], 600, &mut rng);
    assert!(full.starts_with(&short));
    let longer = prompt_of_blocks(&[7], 600, &mut rng);
    assert_eq!(longer.split(' ').count(), 600);
    assert_ne!(longer, full);
}

#[test]
fn a_trace_replays_as_recorded_at_its_own_times() {
    for (text, expect) in [
        ("rate", TraceTime::Rate),
        ("recorded", TraceTime::Recorded { speed: 1.0 }),
        ("recorded:2.5", TraceTime::Recorded { speed: 2.5 }),
    ] {
        assert_eq!(TraceTime::parse(text).unwrap(), expect);
    }
    for bad in [
        "",
        "recorded:0",
        "recorded:-1",
        "recorded:NaN",
        "recorded:inf",
        "asap",
    ] {
        let e = TraceTime::parse(bad).unwrap_err().to_string();
        assert!(
            e.contains("expected rate, recorded or recorded:X"),
            "{bad:?}: {e}"
        );
    }
    // One request a second for 100 s, then ten in the next second: a burst.
    let mut trace: Vec<TraceRequest> = (0..100)
        .map(|i| TraceRequest {
            at: f64::from(i),
            prompt_tokens: 10,
            output_tokens: 5,
            session: None,
            blocks: Vec::new(),
        })
        .collect();
    let first = trace[0].clone();
    trace.extend((0..10).map(|i| TraceRequest {
        at: 100.0 + f64::from(i) * 0.1,
        ..first.clone()
    }));
    let recorded = |speed: f64, seconds: f64, seed: u64| WorkloadOptions {
        trace_time: TraceTime::Recorded { speed },
        seconds,
        ..opts(Shape::Conversation, 1, 1.0, seed)
    };
    // As recorded: 20 s of arrivals one second apart, whatever `requests` and `rate` say.
    for seed in 0..20 {
        let w = build(&recorded(1.0, 20.0, seed), &trace).unwrap();
        let starts: Vec<f64> = w.iter().map(|c| c.start).collect();
        assert!(
            starts[0] == 0.0 && *starts.last().unwrap() < 20.0,
            "{starts:?}"
        );
        assert!(starts.windows(2).all(|p| p[1] > p[0]), "{starts:?}");
        assert!((19..=29).contains(&w.len()), "seed {seed}: {}", w.len());
    }
    // Twice as fast: 40 s of the trace in 20 s.
    let w = build(&recorded(2.0, 20.0, 1), &trace).unwrap();
    assert!(w.iter().all(|c| c.start < 20.0));
    assert!(w.len() >= 39, "{}", w.len());
    // The stretch with the burst keeps it (the rate mode would spread it over the stretch).
    let whole = build(&recorded(1.0, 100.5, 0), &trace).unwrap();
    assert_eq!(whole.len(), 105);
    assert!((whole[104].start - whole[100].start - 0.4).abs() < 1e-9);
    // The trace's mean rate as replayed; and a trace too short for the run says so.
    let rate = TraceTime::Recorded { speed: 2.0 }.rate_of(&trace).unwrap();
    assert!((rate - 2.0 * 109.0 / 100.9).abs() < 1e-9, "{rate}");
    assert_eq!(TraceTime::Rate.rate_of(&trace), None);
    let e = build(&recorded(1.0, 200.0, 0), &trace)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the trace spans 100.9 s, 100.9 s at speed 1: shorter than the 200 s of arrivals asked (--duration)"),
        "{e}"
    );
}

#[test]
fn trace_options_write_what_they_read() {
    for s in ["per-request", "per-session", "per-prefix", "behind:7"] {
        assert_eq!(TraceClients::parse(s).unwrap().spec(), s);
    }
    assert_eq!(TraceTime::Rate.describe(), "compressed to each load's rate");
    assert_eq!(
        TraceTime::parse("recorded").unwrap().describe(),
        "as recorded"
    );
    assert_eq!(
        TraceTime::parse("recorded:4").unwrap().describe(),
        "as recorded, 4x as fast"
    );
}

#[test]
fn the_noisy_tenant_asks_four_times_its_share_in_the_middle_third_only() {
    let o = opts(Shape::NoisyTenant, 2_000, 8.0, 3);
    let calm = build(&o, &[]).unwrap();
    // Four tenants, a quarter of the requests each (within sampling noise), from their /28s.
    let mut per = [0usize; NOISY_TENANTS];
    for c in &calm {
        per[noisy_tenant_of(c.source).expect("a tenant's address")] += 1;
        assert_eq!(c.turns.len(), 1);
    }
    for n in per {
        assert!((400..600).contains(&n), "{per:?}");
    }
    let (excess, (from, to)) = noisy_excess(&calm, 8.0, 3);
    assert_eq!(
        noisy_excess(&calm, 8.0, 3).0,
        excess,
        "the same seed, the same excess"
    );
    let end = calm.last().unwrap().start;
    assert!((from - end / 3.0).abs() < 1e-9 && (to - 2.0 * end / 3.0).abs() < 1e-9);
    assert!(excess.iter().all(|c| (from..=to).contains(&c.start)));
    assert!(
        excess
            .iter()
            .all(|c| noisy_tenant_of(c.source) == Some(NOISY))
    );
    // Ids follow the calm workload's.
    assert_eq!(excess[0].id, calm.len());
    // In the period the noisy tenant asks about 4x what each other tenant does.
    let in_period = |t: usize| {
        calm.iter()
            .chain(&excess)
            .filter(|c| (from..to).contains(&c.start) && noisy_tenant_of(c.source) == Some(t))
            .count() as f64
    };
    let ratio = in_period(NOISY) / in_period(0);
    assert!((3.0..5.2).contains(&ratio), "{ratio}");
    // The tiers' prefixes hold the tenants' addresses.
    assert_eq!(
        noisy_tenant_prefixes(),
        [
            "10.111.0.112/28",
            "10.111.0.128/28",
            "10.111.0.144/28",
            "10.111.0.160/28"
        ]
    );
    assert_eq!(noisy_tenant_of("10.111.0.175".parse().unwrap()), Some(3));
    assert_eq!(noisy_tenant_of("10.111.0.176".parse().unwrap()), None);
    assert_eq!(noisy_tenant_of("10.111.0.100".parse().unwrap()), None);
}
