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
