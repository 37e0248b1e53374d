//! The schedulers' choice logic in the XDP program through BPF_PROG_TEST_RUN (needs root):
//! round robin, weighted round robin, source hash, random, weighted random, least
//! connections, power of two choices, session persistence with bounded load and with the
//! policy's verdict on returning clients, the spreading of a VIP's few persistent clients,
//! tenant affinity (source hash and persistence keyed
//! on a source prefix), and the active-flow counts the connection-aware ones read.

use std::collections::BTreeMap;
use std::net::IpAddr;

use balancer::base::config::RawTier;
use balancer::dataplane::Dataplane;
use balancer_common::stats::Counter;
use balancer_tests::configs::{Extra, backend, harness_settings, scheduled_vip, to_toml, vip};
use balancer_tests::packet::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const B1: &str = "10.111.0.11";
const B2: &str = "10.111.0.12";
const B3: &str = "10.111.0.13";

/// One VIP per scheduler (10.111.1.1, .2, ...), each with backends b1, b2, b3 of the given
/// weights.
fn config(vips: &[(&str, &str, [u32; 3], Extra)]) -> String {
    let mut config = harness_settings(65_536);
    for (i, (name, scheduler, w, extra)) in vips.iter().enumerate() {
        let backends = [(B1, w[0]), (B2, w[1]), (B3, w[2])];
        config.vip.push(scheduled_vip(
            name,
            vip_addr(i),
            scheduler,
            &backends,
            *extra,
        ));
    }
    to_toml(&config)
}

fn vip_addr(i: usize) -> IpAddr {
    ip(&format!("10.111.1.{}", i + 1))
}

fn harness(text: &str) -> Harness {
    pin_to_current_cpu();
    Harness::new(text)
        .expect("loading the balancer needs root and BPF: run through cargo xtask test")
}

/// Sends a SYN from `client`:`sport` to VIP `i`; the backend it went to.
fn syn(h: &mut Harness, i: usize, client: IpAddr, sport: u16) -> IpAddr {
    let (action, out) = h
        .run(&tcp_frame(client, sport, vip_addr(i), 80, true, b""))
        .unwrap();
    assert_eq!(
        action_name(action),
        "XDP_TX",
        "SYN {client}:{sport} to VIP {i}"
    );
    backend_of_output(&out, &[ip(B1), ip(B2), ip(B3)]).expect("output to a known backend")
}

/// Ends the flow from `client`:`sport` to VIP `i` (a FIN), which must go to `backend`.
fn end_flow(h: &mut Harness, i: usize, client: IpAddr, sport: u16, backend: IpAddr) {
    let (action, out) = h
        .run(&tcp_flags_frame(
            client,
            sport,
            vip_addr(i),
            80,
            true,
            false,
        ))
        .unwrap();
    assert_eq!(action_name(action), "XDP_TX");
    assert_eq!(backend_of_output(&out, &[backend]), Some(backend));
}

/// Session persistence's outcome counters: returned, over the bound, sent elsewhere, placed.
fn persistence_choices(h: &Harness) -> [u64; 4] {
    let g = h.balancer.global_stats().unwrap();
    [
        g.get(Counter::PersistenceReturned),
        g.get(Counter::PersistenceOverBound),
        g.get(Counter::PersistenceSentElsewhere),
        g.get(Counter::PersistencePlaced),
    ]
}

fn counts(picks: &[IpAddr]) -> BTreeMap<IpAddr, usize> {
    let mut c = BTreeMap::new();
    for p in picks {
        *c.entry(*p).or_insert(0) += 1;
    }
    c
}

fn active(h: &Harness) -> BTreeMap<IpAddr, u64> {
    let ids: Vec<u32> = h
        .balancer
        .vips()
        .flat_map(|v| v.backends.values().map(|b| b.id))
        .collect();
    let by_id = h.balancer.dataplane().active_flows(&ids).unwrap();
    let mut out = BTreeMap::new();
    for v in h.balancer.vips() {
        for b in v.backends.values() {
            *out.entry(b.address).or_insert(0) += by_id.get(&b.id).copied().unwrap_or(0);
        }
    }
    out
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn round_robin_cycles_and_weighted_round_robin_follows_weights() {
    let mut h = harness(&config(&[
        ("rr", "round-robin", [1, 1, 1], Extra::None),
        ("wrr", "weighted-round-robin", [3, 1, 2], Extra::None),
    ]));
    let client = ip("10.9.0.1");
    let picks: Vec<IpAddr> = (0..30).map(|p| syn(&mut h, 0, client, 1000 + p)).collect();
    // Each cycle of 3 new flows visits every backend once, in the same order.
    for cycle in picks.chunks(3) {
        assert_eq!(counts(cycle).len(), 3, "cycle {cycle:?} of {picks:?}");
        assert_eq!(cycle, &picks[..3]);
    }
    let picks: Vec<IpAddr> = (0..60).map(|p| syn(&mut h, 1, client, 2000 + p)).collect();
    let c = counts(&picks);
    assert_eq!(
        (c[&ip(B1)], c[&ip(B2)], c[&ip(B3)]),
        (30, 10, 20),
        "{picks:?}"
    );
    // Smooth: the sequence repeats every 6 flows and never gives b1 three in a row.
    assert_eq!(&picks[..6], &picks[6..12]);
    assert!(
        picks.windows(3).all(|w| !(w[0] == w[1] && w[1] == w[2])),
        "{picks:?}"
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn source_hash_keeps_a_client_on_one_backend_and_spreads_clients() {
    let mut h = harness(&config(&[("sh", "source-hash", [1, 1, 1], Extra::None)]));
    let client = ip("10.9.0.77");
    let picks: Vec<IpAddr> = (0..100).map(|p| syn(&mut h, 0, client, 3000 + p)).collect();
    assert_eq!(
        counts(&picks).len(),
        1,
        "one client's connections split: {:?}",
        counts(&picks)
    );
    let picks: Vec<IpAddr> = (0..500u32)
        .map(|i| {
            syn(
                &mut h,
                0,
                ip(&format!(
                    "10.{}.{}.{}",
                    20 + i / 65536,
                    (i / 256) % 256,
                    i % 256
                )),
                4000,
            )
        })
        .collect();
    for (b, n) in counts(&picks) {
        let share = n as f64 / 500.0;
        assert!(
            (share - 1.0 / 3.0).abs() <= 0.1 / 3.0 + 0.02,
            "{b} got {n} of 500 clients"
        );
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn random_spreads_and_weighted_random_follows_weights() {
    let mut h = harness(&config(&[
        ("rnd", "random", [5, 1, 1], Extra::None),
        ("wrnd", "weighted-random", [3, 1, 2], Extra::None),
    ]));
    let client = ip("10.9.0.2");
    // 12,000 picks: a share's standard deviation is under 0.005, the bounds over 6 of them.
    const PICKS: u16 = 12_000;
    let picks: Vec<IpAddr> = (0..PICKS)
        .map(|p| syn(&mut h, 0, client, 1000 + p))
        .collect();
    for (b, n) in counts(&picks) {
        // Uniform whatever the weights.
        assert!(
            (n as f64 / f64::from(PICKS) - 1.0 / 3.0).abs() < 0.04,
            "random: {b} got {n} of {PICKS}"
        );
    }
    let picks: Vec<IpAddr> = (0..PICKS)
        .map(|p| syn(&mut h, 1, client, 20_000 + p))
        .collect();
    let c = counts(&picks);
    for (b, want) in [(B1, 0.5), (B2, 1.0 / 6.0), (B3, 1.0 / 3.0)] {
        let got = c[&ip(b)] as f64 / f64::from(PICKS);
        assert!(
            (got - want).abs() < 0.03,
            "weighted random: {b} got {got:.3}, weight share {want:.3}"
        );
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn least_conn_sends_new_flows_to_the_fewest_active_per_weight() {
    let mut h = harness(&config(&[("lc", "least-conn", [2, 1, 1], Extra::None)]));
    let client = ip("10.9.0.3");
    for p in 0..40 {
        syn(&mut h, 0, client, 1000 + p);
    }
    // Per unit of weight: 20, 10, 10.
    let a = active(&h);
    assert_eq!((a[&ip(B1)], a[&ip(B2)], a[&ip(B3)]), (20, 10, 10), "{a:?}");
    // Five of b2's clients close (FIN, or RST): b2 now has the fewest per weight and takes
    // the next five new flows.
    let mut closed = 0;
    for p in 0..40 {
        if closed == 5 {
            break;
        }
        let (_, out) = h
            .run(&tcp_frame(client, 1000 + p, vip_addr(0), 80, false, b"x"))
            .unwrap();
        if backend_of_output(&out, &[ip(B2)]).is_some() {
            let end = tcp_flags_frame(
                client,
                1000 + p,
                vip_addr(0),
                80,
                closed % 2 == 0,
                closed % 2 == 1,
            );
            let (action, out) = h.run(&end).unwrap();
            assert_eq!(action_name(action), "XDP_TX");
            assert!(
                backend_of_output(&out, &[ip(B2)]).is_some(),
                "the FIN/RST went to its flow's backend"
            );
            // A retransmitted FIN counts once.
            h.run(&end).unwrap();
            closed += 1;
        }
    }
    assert_eq!(active(&h)[&ip(B2)], 5);
    let next: Vec<IpAddr> = (0..5).map(|p| syn(&mut h, 0, client, 2000 + p)).collect();
    assert!(
        next.iter().all(|b| *b == ip(B2)),
        "new flows went to {next:?}, not to b2 (5 active)"
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn power_of_two_choices_balance_active_flows() {
    let mut h = harness(&config(&[("p2c", "power-of-two", [1, 1, 1], Extra::None)]));
    let client = ip("10.9.0.4");
    for p in 0..300 {
        syn(&mut h, 0, client, 1000 + p);
    }
    let a = active(&h);
    let (min, max) = (a.values().min().unwrap(), a.values().max().unwrap());
    // Two random choices keep the spread far tighter than random's (about ±15 here).
    assert!(max - min <= 6, "active flows {a:?}");
}

/// VIP "sticky": round robin with session persistence (60 s) over b1, b2, b3.
fn sticky_round_robin(weights: [u32; 3]) -> String {
    config(&[("sticky", "round-robin", weights, Extra::PersistenceSecs(60))])
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn persistence_keeps_a_client_on_its_backend_until_it_is_drained() {
    let mut h = harness(&sticky_round_robin([1, 1, 1]));
    let (a, b) = (ip("10.9.0.5"), ip("10.9.0.6"));
    let first = syn(&mut h, 0, a, 1000);
    for p in 1..10 {
        assert_eq!(
            syn(&mut h, 0, a, 1000 + p),
            first,
            "round robin moved a persistent client"
        );
    }
    assert_ne!(
        syn(&mut h, 0, b, 1000),
        first,
        "the next client takes the next backend"
    );
    // Drain a's backend: a moves, and sticks to its new backend.
    let weights: Vec<u32> = [B1, B2, B3]
        .iter()
        .map(|x| u32::from(ip(x) != first))
        .collect();
    h.reconfigure(&sticky_round_robin([weights[0], weights[1], weights[2]]))
        .unwrap();
    let moved = syn(&mut h, 0, a, 2000);
    assert_ne!(
        moved, first,
        "a drained backend kept a persistent client's new flows"
    );
    for p in 1..5 {
        assert_eq!(syn(&mut h, 0, a, 2000 + p), moved);
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn returning_clients_sent_elsewhere_spill_and_keep_their_backend() {
    let mut h = harness(&sticky_round_robin([1, 1, 1]));
    let endpoint = h.balancer.vip("sticky").unwrap().config.endpoint();
    let client = ip("10.9.0.5");
    let home = syn(&mut h, 0, client, 1000);
    assert_eq!(syn(&mut h, 0, client, 1001), home);
    assert_eq!(
        persistence_choices(&h),
        [1, 0, 0, 1],
        "returned, over, elsewhere, placed"
    );
    // The policy expects the client's backend to serve it later than another would: its new
    // flows go where round robin puts them (the two others in turn, then home again).
    assert_eq!(
        h.balancer
            .set_returning_elsewhere(&endpoint, &[(home, true)])
            .unwrap(),
        1
    );
    let spilled: Vec<IpAddr> = (0..3).map(|p| syn(&mut h, 0, client, 1002 + p)).collect();
    assert_eq!(
        spilled.iter().filter(|b| **b != home).count(),
        2,
        "round robin over three backends: {spilled:?}"
    );
    assert_eq!(persistence_choices(&h), [1, 0, 3, 1]);
    // The verdict lifted: back to its backend, not to where the spilled flows went.
    h.balancer
        .set_returning_elsewhere(&endpoint, &[(home, false)])
        .unwrap();
    for p in 0..3 {
        assert_eq!(syn(&mut h, 0, client, 1010 + p), home);
    }
    assert_eq!(persistence_choices(&h), [4, 0, 3, 1]);
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn persistence_over_the_bound_spills_a_flow_and_keeps_the_client_s_backend() {
    let mut config = harness_settings(65_536);
    let mut vip = scheduled_vip(
        "sticky-bounded",
        vip_addr(0),
        "maglev",
        &[(B1, 1), (B2, 1), (B3, 1)],
        Extra::PersistenceSecs(60),
    );
    vip.max_load_factor = Some(1.25);
    config.vip = vec![vip];
    let mut h = harness(&to_toml(&config));
    // Several clients in turn, each alone on the VIP (so a lucky hash cannot pass the test).
    for c in 1..=4 {
        let client = ip(&format!("10.9.9.{c}"));
        let home = syn(&mut h, 0, client, 1000);
        // Its backend holds every active flow, over 1.25 x a third: the next flow spills.
        let spilled = syn(&mut h, 0, client, 1001);
        assert_ne!(
            spilled, home,
            "client {client}: a flow over the bound stayed"
        );
        // Its backend has room again: the client's flows return to it, not to where the
        // excess went.
        end_flow(&mut h, 0, client, 1000, home);
        assert_eq!(syn(&mut h, 0, client, 1002), home, "client {client}");
        assert_eq!(syn(&mut h, 0, client, 1003), home, "client {client}");
        for (sport, backend) in [(1001, spilled), (1002, home), (1003, home)] {
            end_flow(&mut h, 0, client, sport, backend);
        }
        assert!(active(&h).values().all(|n| *n == 0), "{:?}", active(&h));
        // Each client: placed once, one flow over the bound, two returned.
        let c = c as u64;
        assert_eq!(
            persistence_choices(&h),
            [2 * c, c, 0, c],
            "returned, over the bound, sent elsewhere, placed"
        );
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn persistence_spreads_a_vip_s_few_clients_that_hash_onto_one_backend() {
    use balancer_common::schedule::{HOME_UNIT, home_refresh};
    let mut config = harness_settings(65_536);
    let backends = [(B1, 1), (B2, 1), (B3, 1)];
    let sticky = |name: &str, i: usize, bound: Option<f64>| {
        let mut v = scheduled_vip(
            name,
            vip_addr(i),
            "source-hash",
            &backends,
            Extra::PersistenceSecs(60),
        );
        v.max_load_factor = bound;
        v
    };
    config.vip = vec![
        scheduled_vip("sh", vip_addr(0), "source-hash", &backends, Extra::None),
        sticky("sticky", 1, Some(1.25)),
        sticky("sticky-unbounded", 2, None),
        sticky("sticky-unknown", 3, Some(1.25)),
        sticky("sticky-full", 4, Some(1.25)),
    ];
    let mut h = harness(&to_toml(&config));
    // Each flow ends after its SYN (the bound judges active flows: this test places clients,
    // not load).
    // Six clients that source hash puts on one backend (the VIPs' tables are the same: same
    // backends, weights and size), as a NAT's few addresses may land.
    let mut piled = Vec::new();
    let mut on = None;
    for i in 1..=250 {
        let client = ip(&format!("10.9.3.{i}"));
        let b = syn(&mut h, 0, client, 1000);
        if on.is_none_or(|o| o == b) {
            on = Some(b);
            piled.push(client);
        }
        if piled.len() == 6 {
            break;
        }
    }
    assert_eq!(piled.len(), 6, "six clients hashed onto one backend");
    // While no capacity is written (the daemon writes the configured weights of a static
    // policy once a second, a dynamic policy's from its first weight round) nothing says
    // where a client has room: the hash's pick stands.
    for c in &piled {
        let home = syn(&mut h, 3, *c, 1000);
        assert_eq!(home, on.unwrap(), "client {c}");
        end_flow(&mut h, 3, *c, 1000, home);
    }
    h.balancer.age_homes().unwrap();
    // Under persistence with bounded load they are spread two per backend (capacities equal:
    // the configured weights), and each keeps its backend.
    let mut homes = Vec::new();
    for c in &piled {
        let home = syn(&mut h, 1, *c, 1000);
        end_flow(&mut h, 1, *c, 1000, home);
        homes.push(home);
    }
    assert_eq!(
        counts(&homes).values().copied().collect::<Vec<_>>(),
        [2, 2, 2],
        "{homes:?}"
    );
    for (c, home) in piled.iter().zip(&homes) {
        for p in 1..4 {
            assert_eq!(syn(&mut h, 1, *c, 1000 + p), *home, "client {c}");
            end_flow(&mut h, 1, *c, 1000 + p, *home);
        }
    }
    assert_eq!(persistence_choices(&h), [18, 0, 0, 12]);
    // Counted where they landed: two clients' worth per backend.
    let ids = |h: &Harness, name: &str| -> Vec<u32> {
        h.balancer
            .vip(name)
            .unwrap()
            .backends
            .values()
            .map(|b| b.id)
            .collect()
    };
    // (A returning client adds a share of one once a flow-clock tick: the returns above may
    // have crossed one tick.)
    let refresh = home_refresh(h.balancer.vip("sticky").unwrap().config.persistence_ticks());
    let homed = h.balancer.dataplane().homes(&ids(&h, "sticky")).unwrap();
    assert!(
        homed.len() == 3
            && homed
                .values()
                .all(|h| (2 * HOME_UNIT..=2 * HOME_UNIT + 2 * refresh).contains(&h.homed)),
        "{homed:?}"
    );
    // A tick later each client that returns counts again: that share more per client.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    for (c, home) in piled.iter().zip(&homes) {
        assert_eq!(syn(&mut h, 1, *c, 2000), *home, "client {c}");
        end_flow(&mut h, 1, *c, 2000, *home);
    }
    let refreshed = h.balancer.dataplane().homes(&ids(&h, "sticky")).unwrap();
    assert!(
        refreshed
            .iter()
            .all(|(id, h)| h.homed == homed[id].homed + 2 * refresh),
        "{homed:?} -> {refreshed:?}"
    );
    // The daemon's ageing once a second: a 60 s persistence fades over 15 s, taking 1/15 of
    // each count.
    h.balancer.age_homes().unwrap();
    let aged = h.balancer.dataplane().homes(&ids(&h, "sticky")).unwrap();
    assert!(
        aged.iter().all(|(id, h)| {
            let before = refreshed[id].homed;
            h.homed == before - before.div_ceil(15)
        }),
        "{aged:?}"
    );
    // Without a bound nothing says which backend has room: the hash's pick stands.
    for c in &piled {
        assert_eq!(syn(&mut h, 2, *c, 1000), on.unwrap(), "client {c}");
    }

    // Bounded load has the last word on a placement: while the least homed backend is over
    // the bound, a new client stays with the scheduler's pick, home and flow. One client
    // homed on the hash's pick, then another backend made three times as large: the next
    // client is homed there, and its flow stays open.
    let on = on.unwrap();
    let (a, b, c) = (piled[0], piled[1], piled[2]);
    assert_eq!(syn(&mut h, 4, a, 1000), on);
    end_flow(&mut h, 4, a, 1000, on);
    let all = [ip(B1), ip(B2), ip(B3)];
    let large = all.into_iter().find(|x| *x != on).unwrap();
    let full_vip = h.balancer.vip("sticky-full").unwrap().config.endpoint();
    let capacities: Vec<(IpAddr, f64)> = all
        .into_iter()
        .map(|x| (x, if x == large { 3.0 } else { 1.0 }))
        .collect();
    h.balancer
        .set_home_capacities(&full_vip, &capacities)
        .unwrap();
    assert_eq!(syn(&mut h, 4, b, 1000), large);
    // The large backend holds the VIP's one active flow: over the bound (1 of 1 against a
    // third of 1 + 1, times 1.25), though still the least homed per unit of capacity (2
    // clients against 3 with the next one, the hash's pick 2 against 1): the next client
    // stays with the pick.
    let before = persistence_choices(&h);
    assert_eq!(
        syn(&mut h, 4, c, 1000),
        on,
        "the bound refuses the least homed"
    );
    end_flow(&mut h, 4, c, 1000, on);
    let homed = h
        .balancer
        .dataplane()
        .homes(&ids(&h, "sticky-full"))
        .unwrap();
    let clients = |x: IpAddr| {
        let id = h.balancer.vip("sticky-full").unwrap().backends[&x].id;
        homed
            .get(&id)
            .map_or(0, |h| (h.homed + HOME_UNIT / 2) / HOME_UNIT)
    };
    assert_eq!((clients(large), clients(on)), (1, 2), "{homed:?}");
    // Room again on the large one: the client returns to its home, the pick.
    end_flow(&mut h, 4, b, 1000, large);
    assert_eq!(syn(&mut h, 4, c, 1001), on, "the client keeps its home");
    end_flow(&mut h, 4, c, 1001, on);
    let after = persistence_choices(&h);
    assert_eq!(
        [0, 1, 2, 3].map(|i| after[i] - before[i]),
        [1, 0, 0, 1],
        "placed once, returned once"
    );
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn bounded_load_caps_each_backend_near_its_share() {
    let mut h = harness(&config(&[
        ("sh", "source-hash", [1, 1, 1], Extra::None),
        (
            "bounded",
            "source-hash",
            [1, 1, 1],
            Extra::MaxLoadFactor(1.25),
        ),
    ]));
    // 6 clients x 50 connections each: by source hash alone, a backend that draws 3 clients
    // holds half of all flows.
    let mut unbounded = Vec::new();
    let mut bounded = Vec::new();
    for c in 0..6 {
        let client = ip(&format!("10.9.1.{}", c + 1));
        for p in 0..50 {
            unbounded.push(syn(&mut h, 0, client, 1000 + p));
            bounded.push(syn(&mut h, 1, client, 1000 + p));
        }
    }
    let max_unbounded = *counts(&unbounded).values().max().unwrap();
    let max_bounded = *counts(&bounded).values().max().unwrap();
    println!(
        "most flows on one backend: {max_unbounded} by source hash, {max_bounded} with max_load_factor 1.25"
    );
    assert!(
        max_unbounded > 126,
        "these clients must pile up by hash for the test to mean anything"
    );
    // Capacity at the last flow: 1.25 x 300 / 3 = 125.
    assert!(
        max_bounded <= 126,
        "bounded load let a backend reach {max_bounded} of 300 flows"
    );
    assert!(max_bounded <= max_unbounded);
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn tenant_affinity_keeps_a_network_on_one_backend_within_bounded_load() {
    let tenant = |name: &str, address: &str, scheduler: &str, extra: Extra| {
        let mut v = scheduled_vip(
            name,
            address,
            scheduler,
            &[(B1, 1), (B2, 1), (B3, 1)],
            extra,
        );
        v.affinity_prefix_v4 = Some(24);
        v.affinity_prefix_v6 = Some(64);
        v
    };
    let mut config = harness_settings(65_536);
    config.vip = vec![
        tenant("by-hash", "10.111.1.1", "source-hash", Extra::None),
        tenant(
            "by-persistence",
            "10.111.1.2",
            "round-robin",
            Extra::PersistenceSecs(60),
        ),
        tenant(
            "bounded",
            "10.111.1.3",
            "source-hash",
            Extra::MaxLoadFactor(1.25),
        ),
        tenant("by-hash-v6", "2001:db8:111::1", "source-hash", Extra::None),
        scheduled_vip(
            "per-address",
            "10.111.1.5",
            "source-hash",
            &[(B1, 1), (B2, 1), (B3, 1)],
            Extra::None,
        ),
    ];
    let mut h = harness(&to_toml(&config));
    let v6_vip = ip("2001:db8:111::1");
    let syn_v6 = |h: &mut Harness, client: IpAddr| {
        let (action, out) = h
            .run(&tcp_frame(client, 5000, v6_vip, 80, true, b""))
            .unwrap();
        assert_eq!(action_name(action), "XDP_TX", "SYN {client} to {v6_vip}");
        backend_of_output(&out, &[ip(B1), ip(B2), ip(B3)]).expect("output to a known backend")
    };

    // Source hash by /24 (and /64): every address of a network on one backend, where hashing
    // whole addresses spreads the same clients; networks still spread.
    let members: Vec<IpAddr> = (1..=60).map(|i| ip(&format!("10.9.5.{i}"))).collect();
    let by_prefix: Vec<IpAddr> = members.iter().map(|c| syn(&mut h, 0, *c, 4000)).collect();
    assert_eq!(counts(&by_prefix).len(), 1, "{:?}", counts(&by_prefix));
    let by_address: Vec<IpAddr> = members.iter().map(|c| syn(&mut h, 4, *c, 4000)).collect();
    assert_eq!(
        counts(&by_address).len(),
        3,
        "whole addresses spread: {:?}",
        counts(&by_address)
    );
    let networks: Vec<IpAddr> = (0..90)
        .map(|n| {
            syn(
                &mut h,
                0,
                ip(&format!("10.{}.{}.7", 20 + n / 30, n % 30)),
                4000,
            )
        })
        .collect();
    for (b, n) in counts(&networks) {
        assert!(
            n >= 15,
            "{b} took {n} of 90 networks: {:?}",
            counts(&networks)
        );
    }
    let v6: Vec<IpAddr> = (1..=30)
        .map(|i| syn_v6(&mut h, ip(&format!("2001:db8:5:7::{i:x}"))))
        .collect();
    assert_eq!(counts(&v6).len(), 1, "one /64: {:?}", counts(&v6));
    let v6_networks: Vec<IpAddr> = (1..=30)
        .map(|n| syn_v6(&mut h, ip(&format!("2001:db8:5:{n:x}::1"))))
        .collect();
    assert!(counts(&v6_networks).len() > 1, "{:?}", counts(&v6_networks));

    // Persistence by /24: the network's first pick holds for its other addresses, though the
    // scheduler is round robin; another network takes the next backend.
    let first = syn(&mut h, 1, ip("10.9.6.1"), 1000);
    for i in 2..=20 {
        assert_eq!(
            syn(&mut h, 1, ip(&format!("10.9.6.{i}")), 1000),
            first,
            "10.9.6.{i} left its network's backend"
        );
    }
    assert_ne!(syn(&mut h, 1, ip("10.9.7.1"), 1000), first);

    // Bounded load: one network's 300 flows (all one backend by prefix) spill past the
    // bound: capacity at the last flow 1.25 x 300 / 3 = 125.
    let mut bounded = Vec::new();
    for c in 1..=6 {
        for p in 0..50 {
            bounded.push(syn(&mut h, 2, ip(&format!("10.9.8.{c}")), 1000 + p));
        }
    }
    let c = counts(&bounded);
    let most = *c.values().max().unwrap();
    assert!(most <= 126, "a backend reached {most} of 300: {c:?}");
    assert!(most >= 120, "the network's own backend filled first: {c:?}");
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn active_flows_are_counted_until_they_end_or_are_evicted() {
    // Counted for the VIPs whose scheduler reads the counts (least-conn here), not for maglev.
    let mut h = harness(&config(&[
        ("m", "least-conn", [1, 1, 1], Extra::None),
        ("plain", "maglev", [1, 1, 1], Extra::None),
    ]));
    syn(&mut h, 1, ip("10.9.0.8"), 999);
    assert_eq!(
        active(&h).values().sum::<u64>(),
        0,
        "a maglev VIP's flows were counted"
    );
    // The daemon's own count (the connection table) sees it, until the client ends it.
    let table_count = |h: &Harness| {
        h.balancer
            .dataplane()
            .flow_counts()
            .unwrap()
            .values()
            .sum::<u64>()
    };
    assert_eq!(table_count(&h), 1);
    h.run(&tcp_flags_frame(
        ip("10.9.0.8"),
        999,
        ip("10.111.1.2"),
        80,
        true,
        false,
    ))
    .unwrap();
    assert_eq!(
        table_count(&h),
        0,
        "an ended maglev flow still counted as active"
    );
    let client = ip("10.9.0.8");
    let total = |h: &Harness| active(h).values().sum::<u64>();
    syn(&mut h, 0, client, 1000);
    syn(&mut h, 0, client, 1001);
    assert_eq!(total(&h), 2);
    // Data packets change nothing; a FIN ends one (once, however often it is sent).
    h.run(&tcp_frame(client, 1000, vip_addr(0), 80, false, b"data"))
        .unwrap();
    let fin = tcp_flags_frame(client, 1000, vip_addr(0), 80, true, false);
    h.run(&fin).unwrap();
    h.run(&fin).unwrap();
    assert_eq!(total(&h), 1);
    // A SYN reusing the ended flow's port is a new flow.
    syn(&mut h, 0, client, 1000);
    assert_eq!(total(&h), 2);
    let rst = tcp_flags_frame(client, 1001, vip_addr(0), 80, false, true);
    h.run(&rst).unwrap();
    assert_eq!(total(&h), 1);
    // Evictions: five flows that share a connection-table bucket (4 ways): one is pushed out.
    let seed = h.settings.flow_seed;
    let mask = h.settings.flow_bucket_mask;
    let vip_id = h.balancer.vip("m").unwrap().id;
    let bucket = |sport: u16| {
        let key = balancer_common::maps::FlowKey {
            src: balancer_common::addr::raw_from_ip(ip("10.9.9.9")).0,
            vip_id,
            sport: sport.to_be(),
            _pad: 0,
        };
        balancer_common::flow_cache::bucket_of(
            balancer_common::flow_cache::flow_tag(&key, seed),
            mask,
        )
    };
    let target = bucket(1);
    let same: Vec<u16> = (1..u16::MAX)
        .filter(|p| bucket(*p) == target)
        .take(5)
        .collect();
    assert_eq!(same.len(), 5);
    for p in &same {
        syn(&mut h, 0, ip("10.9.9.9"), *p);
    }
    assert_eq!(total(&h), 1 + 4, "the evicted flow still counted");
}

/// A VIP on each family with two shared backends and one dedicated to the "premium" tier
/// (clients of 10.9.5.0/24, 2001:db8:5::/48, or DSCP 46).
fn tiered(spillover: bool, premium_weight: u32) -> String {
    let mut config = harness_settings(65_536);
    config.tier = vec![RawTier {
        name: Some("premium".into()),
        prefixes: vec!["10.9.5.0/24".into(), "2001:db8:5::/48".into()],
        dscp: vec![46],
        spillover: Some(spillover),
        ..RawTier::default()
    }];
    for (name, address, backends) in [
        ("t4", "10.111.1.1", [B1, B2, B3]),
        (
            "t6",
            "fd00:111:1::1",
            ["fd00:111::11", "fd00:111::12", "fd00:111::13"],
        ),
    ] {
        let mut v = vip(name, address, 80);
        v.backend = backends.iter().map(|b| backend(b, None)).collect();
        v.backend[2].tier = Some("premium".into());
        v.backend[2].weight = Some(premium_weight.into());
        config.vip.push(v);
    }
    to_toml(&config)
}

/// A SYN to the tiered VIP of `client`'s family; the backend it went to, or `None` if dropped.
fn tiered_syn(h: &mut Harness, client: IpAddr, sport: u16, dscp: u8) -> Option<IpAddr> {
    let vip = if client.is_ipv4() {
        ip("10.111.1.1")
    } else {
        ip("fd00:111:1::1")
    };
    let mut frame = tcp_frame(client, sport, vip, 80, true, b"");
    if dscp != 0 {
        if client.is_ipv4() {
            frame[15] = dscp << 2;
            frame[24] = 0;
            frame[25] = 0;
            let sum = !ones_complement_sum(&frame[14..34]);
            frame[24..26].copy_from_slice(&sum.to_be_bytes());
        } else {
            // Traffic class straddles the first two bytes of the IPv6 header.
            frame[14] = 0x60 | (dscp << 2) >> 4;
            frame[15] = ((dscp << 2) & 0x0f) << 4 | (frame[15] & 0x0f);
        }
    }
    let (action, out) = h.run(&frame).unwrap();
    match action_name(action) {
        "XDP_TX" => backend_of_output(
            &out,
            &[
                ip(B1),
                ip(B2),
                ip(B3),
                ip("fd00:111::11"),
                ip("fd00:111::12"),
                ip("fd00:111::13"),
            ],
        ),
        "XDP_DROP" => None,
        other => panic!("unexpected {other}"),
    }
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn priority_tiers_have_their_own_backends_and_spill_when_they_cannot_serve() {
    let mut h = harness(&tiered(true, 1));
    for (premium, other, dedicated) in [
        (ip("10.9.5.7"), ip("10.9.0.1"), ip(B3)),
        (ip("2001:db8:5::9"), ip("2001:db8:1::1"), ip("fd00:111::13")),
    ] {
        for p in 0..20 {
            assert_eq!(
                tiered_syn(&mut h, premium, 1000 + p, 0),
                Some(dedicated),
                "a premium client left its tier"
            );
        }
        let others: Vec<IpAddr> = (0..60)
            .map(|p| tiered_syn(&mut h, other, 2000 + p, 0).unwrap())
            .collect();
        assert!(
            !others.contains(&dedicated),
            "a free-tier client reached a premium backend: {others:?}"
        );
        assert_eq!(
            counts(&others).len(),
            2,
            "the shared pool serves the rest: {:?}",
            counts(&others)
        );
        // DSCP 46 marks a client premium too.
        assert_eq!(
            tiered_syn(&mut h, other, 3000, 46),
            Some(dedicated),
            "DSCP 46 is the premium tier"
        );
    }
    // The premium backend drained: premium clients spill into the shared pool.
    h.reconfigure(&tiered(true, 0)).unwrap();
    let spilled: Vec<IpAddr> = (0..20)
        .map(|p| tiered_syn(&mut h, ip("10.9.5.7"), 4000 + p, 0).unwrap())
        .collect();
    assert!(
        spilled.iter().all(|b| *b == ip(B1) || *b == ip(B2)),
        "{spilled:?}"
    );
    // Without spillover, they are refused instead.
    h.reconfigure(&tiered(false, 0)).unwrap();
    assert_eq!(
        tiered_syn(&mut h, ip("10.9.5.7"), 5000, 0),
        None,
        "a tier without spillover spilled"
    );
    assert!(
        tiered_syn(&mut h, ip("10.9.0.1"), 5000, 0).is_some(),
        "the shared pool still serves"
    );
}

/// Flood mode decides before the pick: a new flow it does not track leaves no persistence
/// entry and adds to no backend's homes, so a flood of new clients cannot fill the one or
/// inflate the other; the clients tracked before it keep returning home.
#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn flood_mode_remembers_no_client_it_does_not_track() {
    use balancer_common::schedule::HOME_UNIT;
    pin_to_current_cpu();
    // The flood window is per CPU and per flow-clock tick: two new flows, then flood mode.
    let mut h = Harness::with_settings(&sticky_round_robin([1, 1, 1]), |s| s.flood_threshold = 2)
        .expect("loading the balancer needs root and BPF: run through cargo xtask test");
    let clients: Vec<IpAddr> = (1..=6).map(|i| ip(&format!("10.9.0.{i}"))).collect();
    let homes: Vec<IpAddr> = clients.iter().map(|c| syn(&mut h, 0, *c, 1000)).collect();
    assert_eq!(persistence_choices(&h), [0, 0, 0, 6], "every client placed");
    let ids: Vec<u32> = h
        .balancer
        .vip("sticky")
        .unwrap()
        .backends
        .values()
        .map(|b| b.id)
        .collect();
    let homed: u64 = h
        .balancer
        .dataplane()
        .homes(&ids)
        .unwrap()
        .values()
        .map(|e| e.homed)
        .sum();
    assert_eq!(homed, 2 * HOME_UNIT, "only the two tracked clients homed");
    // A tracked client returns home; an untracked one has no home to return to (placed
    // again, and still remembered nowhere while the flood lasts).
    assert_eq!(syn(&mut h, 0, clients[0], 1001), homes[0]);
    syn(&mut h, 0, clients[5], 1001);
    assert_eq!(persistence_choices(&h), [1, 0, 0, 7]);
    let g = h.balancer.global_stats().unwrap();
    assert_eq!(g.get(Counter::FloodInsertsSkipped), 6);
}
