//! Metrics pages, through everything a scrape feeds: any text is samples or an error naming its
//! line; signals are refused or come out finite and in range; two readings of them in the
//! telemetry store and a composite weight round beside three ordinary backends never panic, give
//! weights within 0..=MAX_WEIGHT, leave the ordinary backends in rotation, and hold the page's
//! backend to its bounded share (`policy.max_share`: 3 x 1/4, a quantum's rounding aside).
#![no_main]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use balancer::base::config::RECENT_HALF_LIFE;
use balancer::steering::policy::{self, Input, MAX_WEIGHT, PolicyConfig, PolicyKind, PolicyState};
use balancer::steering::telemetry::signals::{Signals, Valid};
use balancer::steering::telemetry::store::BackendTelemetry;
use balancer::steering::telemetry::{page, signals};
use libfuzzer_sys::fuzz_target;

fn ordinary(running: f64) -> Valid {
    Signals {
        running: Some(running),
        waiting: Some(0.0),
        kv_usage: Some(0.3),
        kv_capacity_tokens: Some(100_000.0),
        prefill_seconds: Some(0.05),
        ..Signals::default()
    }
    .validate()
    .expect("an ordinary report is valid")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The input is two pages of one backend, a reading apart, split at a form feed.
    let (first, second) = text.split_once('\u{c}').unwrap_or((text, text));
    let started = Instant::now();
    let mut store = BackendTelemetry::default();
    let mut at = started;
    for page in [first, second] {
        let Ok(samples) = page::parse(page) else {
            return;
        };
        let Ok(valid) = signals::extract(&samples).validate() else {
            return;
        };
        store.record(valid, at, RECENT_HALF_LIFE);
        at += Duration::from_millis(100);
    }
    let (hostile, _) = store.latest.clone().expect("two readings recorded");
    let checked = hostile.clone().validate();
    assert!(
        checked.is_ok(),
        "the store derived {checked:?} from {hostile:?}"
    );

    let address = |last: u8| IpAddr::from([10, 0, 0, last]);
    let input = |last: u8, signals: Signals| Input {
        address: address(last),
        configured: 100,
        signals: Some(signals),
        age: Some(Duration::from_millis(10)),
        flows: 0,
    };
    let inputs = [
        input(1, hostile),
        input(2, ordinary(2.0).into_inner()),
        input(3, ordinary(3.0).into_inner()),
        input(4, ordinary(1.0).into_inner()),
    ];
    let cfg = PolicyConfig {
        kind: PolicyKind::Composite,
        ..PolicyConfig::default()
    };
    let mut state = PolicyState::default();
    for _ in 0..3 {
        let decisions = policy::decide(&cfg, &inputs, &mut state);
        assert_eq!(decisions.len(), 4);
        for d in &decisions {
            assert!(d.weight <= MAX_WEIGHT, "{d:?}");
        }
        assert!(decisions[1..].iter().all(|d| d.weight > 0), "{decisions:?}");
        let total: u32 = decisions.iter().map(|d| d.weight).sum();
        let share = f64::from(decisions[0].weight) / f64::from(total);
        assert!(
            share <= 0.8,
            "the page's backend took {share}: {decisions:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a page took {:?}",
        started.elapsed()
    );
});
