//! Tests of `store`.

use super::*;
use crate::base::config::RECENT_HALF_LIFE;

fn valid(s: Signals) -> Valid {
    s.validate().unwrap()
}

/// The recent window of a VIP scraped every 100 ms (the default).
const H: Duration = RECENT_HALF_LIFE;

fn close(v: Option<f64>, want: f64) -> bool {
    v.is_some_and(|v| (v - want).abs() < 1e-9)
}

#[test]
fn rates_come_from_counters() {
    let mut t = BackendTelemetry::default();
    let t0 = Instant::now();
    let report = |tokens: f64, sum: f64, count: f64| Signals {
        tokens_total: Some(tokens),
        ttft_sum_count: Some((sum, count)),
        prefill_sum_count: Some((sum / 10.0, count)),
        prompt_sum_count: Some((count * 100.0, count)),
        ..Signals::default()
    };
    t.record(valid(report(1000.0, 1.0, 10.0)), t0, H);
    assert_eq!(t.latest.as_ref().unwrap().0.ttft_seconds, None);
    assert_eq!(t.latest.as_ref().unwrap().0.tokens_per_second, None);
    t.record(
        report(3000.0, 4.0, 20.0).validate().unwrap(),
        t0 + Duration::from_millis(500),
        H,
    );
    let s = &t.latest.as_ref().unwrap().0;
    assert_eq!(s.tokens_per_second, Some(4000.0));
    assert!(close(s.ttft_seconds, 0.3));
    assert!((s.prefill_seconds.unwrap() - 0.03).abs() < 1e-12);
    // 0.3 s of prefill over 1,000 prompt tokens.
    assert!((s.prefill_seconds_per_token.unwrap() - 0.0003).abs() < 1e-12);
    assert!(close(s.prompt_tokens_mean, 100.0));
    // No new first tokens: the last TTFT stands; a counter reset gives no rate.
    t.record(
        valid(report(10.0, 4.0, 20.0)),
        t0 + Duration::from_millis(1000),
        H,
    );
    let s = &t.latest.as_ref().unwrap().0;
    assert!(close(s.ttft_seconds, 0.3));
    assert!((s.prefill_seconds.unwrap() - 0.03).abs() < 1e-12, "kept");
    assert!((s.prefill_seconds_per_token.unwrap() - 0.0003).abs() < 1e-12);
    assert_eq!(s.tokens_per_second, None);
    assert_eq!(
        t.age(t0 + Duration::from_millis(1500)),
        Some(Duration::from_millis(500))
    );
}

#[test]
fn the_prefill_per_token_counts_only_the_tokens_a_server_computed() {
    let mut t = BackendTelemetry::default();
    let t0 = Instant::now();
    // 10 requests of 1,000 prompt tokens, 800 of each found in the prefix cache: 0.5 s
    // of prefill for 2,000 computed tokens.
    let report = |n: f64, computed: Option<f64>| Signals {
        prefill_sum_count: Some((n * 0.05, n)),
        prompt_sum_count: Some((n * 1000.0, n)),
        computed_sum_count: computed.map(|c| (n * c, n)),
        ..Signals::default()
    };
    t.record(valid(report(10.0, Some(200.0))), t0, H);
    t.record(
        valid(report(20.0, Some(200.0))),
        t0 + Duration::from_secs(1),
        H,
    );
    let s = &t.latest.as_ref().unwrap().0;
    assert!(close(s.prefill_seconds_per_token, 0.00025));
    assert!(close(s.prefill_seconds_per_token_fastest, 0.00025));
    assert!(close(s.prompt_tokens_mean, 1000.0), "the prompt's size");
    // A page without the computed tokens: over the prompt tokens, as before.
    let mut old = BackendTelemetry::default();
    old.record(valid(report(10.0, None)), t0, H);
    old.record(valid(report(20.0, None)), t0 + Duration::from_secs(1), H);
    let s = &old.latest.as_ref().unwrap().0;
    assert!(close(s.prefill_seconds_per_token, 0.00005));
}

#[test]
fn a_page_that_stops_saying_what_it_computed_does_not_read_as_a_burst_of_tokens() {
    let mut t = BackendTelemetry::default();
    let t0 = Instant::now();
    // As above: 0.05 s of prefill a request, 1,000 prompt tokens of which 200 computed.
    let report = |n: f64, computed: bool| Signals {
        prefill_sum_count: Some((n * 0.05, n)),
        prompt_sum_count: Some((n * 1000.0, n)),
        computed_sum_count: computed.then_some((n * 200.0, n)),
        ..Signals::default()
    };
    let at = |s: u64| t0 + Duration::from_secs(s);
    t.record(valid(report(10.0, true)), at(0), H);
    t.record(valid(report(20.0, true)), at(1), H);
    // The next page lacks the computed tokens: its prompt tokens less the last page's
    // computed ones (18,000 tokens for 0.5 s of prefill) are no interval's work.
    t.record(valid(report(30.0, false)), at(2), H);
    let s = &t.latest.as_ref().unwrap().0;
    assert!(close(s.prefill_seconds_per_token, 0.00025), "kept");
    // The fastest only relaxes (by 2^(1/30) a second); read as an interval it would be
    // 0.5 s over 26,000 tokens.
    let fastest = s.prefill_seconds_per_token_fastest.unwrap();
    assert!((0.00025..0.00026).contains(&fastest), "{fastest}");
    // From then on over prompt tokens: 0.5 s for 10,000 tokens.
    t.record(valid(report(40.0, false)), at(3), H);
    let s = &t.latest.as_ref().unwrap().0;
    assert!(s.prefill_seconds_per_token.unwrap() < 0.00025);
    assert!(close(s.prefill_seconds_per_token_fastest, 0.00005));
    // And back: computed tokens again count from the next page.
    t.record(valid(report(50.0, true)), at(4), H);
    let fastest = t
        .latest
        .as_ref()
        .unwrap()
        .0
        .prefill_seconds_per_token_fastest;
    assert!(
        (0.00005..0.000052).contains(&fastest.unwrap()),
        "{fastest:?}"
    );
}

#[test]
fn the_prefill_queue_is_total_over_any_floats() {
    // What once panicked in `f64::clamp` (bounds of NaN): counters overflowed to infinity.
    let inf = f64::INFINITY;
    for (first, finished, running, waiting) in [
        (inf, inf, 1.0, 0.0),
        (f64::NAN, 0.0, 1.0, 0.0),
        (1e308, -1e308, 1.0, f64::NAN),
        (5.0, 9.0, -4.0, 0.0),
        (0.0, 0.0, inf, 0.0),
    ] {
        let mut q = PrefillQueue::default();
        let v = q.update(first, finished, running, waiting);
        assert!(
            v.is_finite() && v >= 0.0,
            "{first} {finished} {running} {waiting}: {v}"
        );
        // And the next, sane, reading is read as such.
        assert_eq!(q.update(10.0, 8.0, 3.0, 1.0), 2.0);
    }
}

#[test]
fn the_prefill_queue_is_the_requests_in_flight_less_those_past_their_first_token() {
    let mut q = PrefillQueue::default();
    // 10 first tokens, 4 finished: 6 past their first token of 8 running; 2 waiting.
    assert_eq!(q.update(10.0, 4.0, 8.0, 2.0), 4.0);
    // A burst admitted at once: 20 running, none waiting, no new first token.
    assert_eq!(q.update(10.0, 4.0, 20.0, 0.0), 14.0);
    // Two requests aborted before their first token were counted as finished (the gap
    // is -2): the idle server's reading pins the offset at -2.
    assert_eq!(q.update(10.0, 12.0, 0.0, 0.0), 0.0);
    // From then on the offset (-2) is known: 3 first tokens later, 1 finished, 3 running.
    assert_eq!(q.update(13.0, 13.0, 3.0, 0.0), 1.0);
    // A restarted server's counters start again (and the offset with them).
    assert_eq!(q.update(1.0, 0.0, 2.0, 1.0), 2.0);
    // Never more than in flight, nor less than nothing.
    assert_eq!(q.update(1.0, 5.0, 2.0, 1.0), 3.0);
    assert_eq!(q.update(50.0, 5.0, 2.0, 1.0), 0.0);
}

#[test]
fn the_fastest_prefill_keeps_a_quiet_intervals_speed_through_a_burst() {
    let mut f = Fastest::default();
    let s = Duration::from_secs(1);
    assert_eq!(f.update((0.0, 0.0), s), None);
    // A request alone: 0.25 s for 2,000 tokens.
    let alone = f.update((0.25, 2000.0), s).unwrap();
    assert!((alone - 0.000125).abs() < 1e-12, "{alone}");
    // A burst: four prompts prefilled together, each measuring the others' too.
    let burst = f.update((4.25, 10000.0), s).unwrap();
    assert!(
        (burst - 0.000125 * 2f64.powf(1.0 / 30.0)).abs() < 1e-12,
        "{burst}"
    );
    // Nothing finished for a minute: the figure lets go (doubles every 30 s)...
    let later = f.update((4.25, 10000.0), Duration::from_secs(60)).unwrap();
    assert!((later / burst - 4.0).abs() < 1e-9, "{later}");
    // ... and a faster interval takes over at once.
    let faster = f.update((4.45, 12000.0), s).unwrap();
    assert!((faster - 0.0001).abs() < 1e-12, "{faster}");
    // A restarted server's counters add nothing.
    let after = f.update((0.1, 100.0), s).unwrap();
    assert!(after > 0.0001 && after < 0.000103, "{after}");
}

#[test]
fn a_vllm_report_says_its_requests_without_a_first_token() {
    let mut b = BackendTelemetry::default();
    let now = Instant::now();
    // 6 in flight, 7 first tokens, 4 finished: 3 past their first token.
    let page = Signals {
        running: Some(5.0),
        waiting: Some(1.0),
        ttft_sum_count: Some((3.0, 7.0)),
        prompt_sum_count: Some((700.0, 4.0)),
        ..Signals::default()
    };
    b.record(valid(page.clone()), now, H);
    assert_eq!(b.latest.as_ref().unwrap().0.prefilling, Some(3.0));
    // A pushed report's own figure is kept.
    let pushed = Signals {
        prefilling: Some(9.0),
        ..page
    };
    b.record(valid(pushed), now, H);
    assert_eq!(b.latest.as_ref().unwrap().0.prefilling, Some(9.0));
}

#[test]
fn the_prefix_cache_hit_rate_is_the_share_of_an_intervals_queries() {
    let mut t = BackendTelemetry::default();
    let t0 = Instant::now();
    let report = |hits: f64, queries: f64| Signals {
        prefix_cache_counts: Some((hits, queries)),
        ..Signals::default()
    };
    let rate = |t: &BackendTelemetry| t.latest.as_ref().unwrap().0.prefix_cache_hit_rate;
    t.record(valid(report(0.0, 0.0)), t0, H);
    assert_eq!(rate(&t), None, "one reading gives no rate");
    // 1,024 prompt tokens looked up, 768 found.
    t.record(
        valid(report(768.0, 1024.0)),
        t0 + Duration::from_millis(100),
        H,
    );
    assert!(close(rate(&t), 0.75));
    // No lookups since: the rate stands.
    t.record(
        valid(report(768.0, 1024.0)),
        t0 + Duration::from_millis(200),
        H,
    );
    assert!(close(rate(&t), 0.75));
    // 3,000 more, none found: the recent share falls, token-weighted (the 1,024 of two
    // intervals ago count half: 384 of 3,512).
    t.record(
        valid(report(768.0, 4024.0)),
        t0 + Duration::from_millis(300),
        H,
    );
    let after = rate(&t).unwrap();
    assert!((0.10..0.12).contains(&after), "{after}");
    // A restarted server (counters back to small numbers): nothing from the reset.
    t.record(
        valid(report(10.0, 3000.0)),
        t0 + Duration::from_millis(400),
        H,
    );
    assert!(
        (rate(&t).unwrap() - after).abs() < 0.01,
        "not computed across a reset"
    );
    // A server that reports the rate itself (SGLang) is taken as it is.
    t.record(
        Signals {
            prefix_cache_hit_rate: Some(0.4),
            ..Signals::default()
        }
        .validate()
        .unwrap(),
        t0 + Duration::from_millis(500),
        H,
    );
    assert_eq!(rate(&t), Some(0.4));
}

/// Readings of a counter pair every 100 ms for `secs`, each interval adding `count` to the
/// denominator and `count * ratio` to the numerator.
fn feed(r: &mut DecayedRatio, at: &mut (f64, f64), secs: f64, ratio: f64, count: f64) {
    for _ in 0..(secs * 10.0).round() as usize {
        at.0 += count * ratio;
        at.1 += count;
        r.update(*at, Duration::from_millis(100), H);
    }
}

#[test]
fn a_decayed_ratio_follows_recent_data_and_keeps_its_value_when_none_arrives() {
    let mut r = DecayedRatio::default();
    assert_eq!(
        r.update((5.0, 10.0), Duration::ZERO, H),
        None,
        "one reading"
    );
    assert!(close(
        r.update((8.0, 20.0), Duration::from_millis(100), H),
        0.3
    ));
    // Data of one ratio only: idle time does not change it.
    assert!(close(
        r.update((8.0, 20.0), Duration::from_secs(30), H),
        0.3
    ));
    // Two minutes at 1.0, then ten seconds at 2.0: the figure is near the new value.
    let mut at = (8.0, 20.0);
    feed(&mut r, &mut at, 120.0, 1.0, 4.0);
    assert!((r.value(H).unwrap() - 1.0).abs() < 1e-3);
    feed(&mut r, &mut at, 10.0, 2.0, 4.0);
    let v = r.value(H).unwrap();
    assert!((1.75..2.0).contains(&v), "{v}");
    // Each increment weighs by its size: one request in a second of 40 moves it little.
    feed(&mut r, &mut at, 0.1, 100.0, 1.0 / 40.0);
    assert!(r.value(H).unwrap() < v * 1.1);
}

#[test]
fn a_bursts_last_interval_does_not_outlive_the_burst() {
    // Two equal GPUs serve the same minute of traffic; the last second of the burst finds
    // one of them with a full batch (prefill 5x slower) and the other idle.
    let (mut a, mut b) = (DecayedRatio::default(), DecayedRatio::default());
    let (mut at_a, mut at_b) = ((0.0, 0.0), (0.0, 0.0));
    a.update(at_a, Duration::ZERO, H);
    b.update(at_b, Duration::ZERO, H);
    feed(&mut a, &mut at_a, 60.0, 1.0, 2.0);
    feed(&mut b, &mut at_b, 60.0, 1.0, 2.0);
    feed(&mut a, &mut at_a, 1.0, 5.0, 2.0);
    feed(&mut b, &mut at_b, 1.0, 1.0, 2.0);
    let spread = |a: &DecayedRatio, b: &DecayedRatio| a.value(H).unwrap() / b.value(H).unwrap();
    let after = spread(&a, &b);
    assert!(after > 1.5, "just after the burst: {after}");
    // Twenty idle seconds later only the long-run trace of that second is left (the
    // interval figure kept before would have stayed at 5x).
    feed(&mut a, &mut at_a, 20.0, 0.0, 0.0);
    feed(&mut b, &mut at_b, 20.0, 0.0, 0.0);
    let idle = spread(&a, &b);
    assert!(
        idle < 1.12 && idle - 1.0 < (after - 1.0) / 4.0,
        "idle: {idle}"
    );
    // A GPU that is slower in the long run stays slower when idle.
    let mut slow = DecayedRatio::default();
    let mut at = (0.0, 0.0);
    slow.update(at, Duration::ZERO, H);
    feed(&mut slow, &mut at, 60.0, 4.0, 0.5);
    feed(&mut slow, &mut at, 20.0, 0.0, 0.0);
    assert!(spread(&slow, &b) > 3.5);
}

#[test]
fn a_window_of_two_slow_scrapes_pools_their_requests() {
    // Scrapes every 2 s, two or three requests finishing in each, their prefill times
    // 0.2, 0.6, 0.2, 0.6 s... (the same GPU, a batch busier or not). A half-life of 200 ms
    // reads each interval alone; one of two intervals (4 s, set) reads them pooled.
    let interval = Duration::from_secs(2);
    let read = |half_life: Duration| {
        let mut r = DecayedRatio::default();
        let mut at = (0.0, 0.0);
        r.update(at, Duration::ZERO, half_life);
        let mut figures = Vec::new();
        for i in 0..20 {
            let (each, n) = if i % 2 == 0 { (0.2, 3.0) } else { (0.6, 2.0) };
            at.0 += each * n;
            at.1 += n;
            figures.push(r.update(at, interval, half_life).unwrap());
        }
        let last = &figures[10..];
        let (lo, hi) = last
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        (lo, hi)
    };
    let (lo, hi) = read(RECENT_HALF_LIFE);
    assert!(lo < 0.22 && hi > 0.57, "interval by interval: {lo}..{hi}");
    let (lo, hi) = read(2 * interval);
    // The pooled mean is 0.36 s; the swing from one scrape to the next is a fraction of
    // the intervals' own.
    assert!(lo > 0.3 && hi < 0.45 && hi / lo < 1.4, "pooled: {lo}..{hi}");
}
