//! Tests of `e2e`.

use super::*;

#[test]
fn percentiles_pick_ranks() {
    let v: Vec<u32> = (1..=100).collect();
    assert_eq!(percentile(&v, 0.5), 51.0);
    assert_eq!(percentile(&v, 0.99), 99.0);
    assert_eq!(percentile(&[], 0.5), 0.0);
}

#[test]
fn peers_round_trip_by_key() {
    for p in Peer::ALL {
        assert_eq!(Peer::by_key(p.key()), Some(p));
    }
    assert_eq!(Peer::by_key("ipvs"), None);
}

#[test]
fn spread_is_max_minus_min() {
    let r = |rate| Round {
        conn: Phase {
            rate,
            ..Phase::default()
        },
        ..Round::default()
    };
    let (m, s) = stat(&[r(10.0), r(30.0), r(20.0)], |x| Some(x.conn.rate)).unwrap();
    assert_eq!((m, s), (20.0, 20.0));
}

#[test]
fn fair_ratios_pair_rounds_and_skip_rounds_without_the_figure() {
    let r = |rate, udp: Option<f64>| Round {
        conn: Phase {
            rate,
            ..Phase::default()
        },
        udp: udp.map(|rate| Phase {
            rate,
            ..Phase::default()
        }),
        ..Round::default()
    };
    let ours = [r(110.0, Some(90.0)), r(220.0, None), r(55.0, Some(45.0))];
    let theirs = [
        r(100.0, Some(100.0)),
        r(200.0, Some(100.0)),
        r(50.0, Some(50.0)),
    ];
    let conn = paired_ratios(&ours, &theirs, |x| Some(x.conn.rate));
    assert_eq!(conn.len(), 3);
    assert!(conn.iter().all(|x| (x - 1.1).abs() < 1e-12), "{conn:?}");
    let udp = paired_ratios(&ours, &theirs, |x| x.udp.as_ref().map(|u| u.rate));
    assert_eq!(udp.len(), 2);
    assert!(udp.iter().all(|x| (x - 0.9).abs() < 1e-12), "{udp:?}");
}
