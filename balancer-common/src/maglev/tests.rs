//! Tests of `maglev`.

use super::*;

fn names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1))
        .collect()
}

fn backends(names: &[String], weight: impl Fn(usize) -> u32) -> Vec<MaglevBackend<'_>> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| MaglevBackend {
            identity: n.as_bytes(),
            weight: weight(i),
            id: i as u32,
        })
        .collect()
}

#[test]
fn slot_counts_match_a_plain_count() {
    let naive = |table: &[u32]| {
        let mut counts = std::collections::BTreeMap::new();
        for &id in table.iter().filter(|id| **id != NO_BACKEND) {
            *counts.entry(id).or_insert(0usize) += 1;
        }
        counts
    };
    let n = names(5);
    let table = build_table(&backends(&n, |i| [1000, 50, 10, 0, 300][i]), 65_537).unwrap();
    assert_eq!(slot_counts(&table), naive(&table));
    assert_eq!(slot_counts(&table).values().sum::<usize>(), 65_537);
    // Empty slots, an odd length (a remainder after the lanes of four), a large id (the
    // map's path), and no backend at all.
    let mixed = [3, NO_BACKEND, 3, 0, 9, 9, 9];
    assert_eq!(slot_counts(&mixed), naive(&mixed));
    let large = [5, 1 << 24, 5, NO_BACKEND, 1 << 24];
    assert_eq!(slot_counts(&large), naive(&large));
    assert!(slot_counts(&[NO_BACKEND; 3]).is_empty());
    assert!(slot_counts(&[]).is_empty());
}

#[test]
fn primes() {
    assert!(is_prime(65_537));
    assert!(is_prime(655_373));
    assert!(is_prime(2) && is_prime(3) && is_prime(13));
    assert!(!is_prime(0) && !is_prime(1) && !is_prime(65_536) && !is_prime(655_371));
    assert_eq!(build_table(&[], 65_536), Err(MaglevError::NotPrime(65_536)));
}

#[test]
fn weighted_quotas_are_exact_shares() {
    let n = names(7);
    let weight = |i: usize| [1u32, 7, 7, 2, 100, 3, 1][i];
    let table = build_table(&backends(&n, weight), 65_537).unwrap();
    let total: u32 = (0..7).map(weight).sum();
    for (id, &c) in &slot_counts(&table) {
        let exact = 65_537.0 * f64::from(weight(*id as usize)) / f64::from(total);
        assert!(
            (c as f64 - exact).abs() < 1.0,
            "backend {id}: {c} slots for an exact share of {exact:.2}"
        );
    }
}

#[test]
fn equal_weights_take_the_round_robin_path_with_the_same_result() {
    let n = names(37);
    let sorted = backends(&n, |_| 4);
    let ids: Vec<u32> = sorted.iter().map(|b| b.id).collect();
    let m = 65_537u64;
    let walks = || -> Vec<Permutation> {
        sorted
            .iter()
            .map(|b| Permutation::of(b.identity, m))
            .collect()
    };
    let mut a = vec![NO_BACKEND; m as usize];
    let mut b = vec![NO_BACKEND; m as usize];
    fill_round_robin(&mut a, &mut walks(), &ids);
    fill_weighted(&mut b, &mut walks(), &ids, &vec![4; ids.len()]);
    assert_eq!(a, b);
}

/// The weighted fill as specified, every slot claimed by a walk (no shortcut at the end).
fn fill_weighted_by_walks_only(
    table: &mut [u32],
    walks: &mut [Permutation],
    ids: &[u32],
    weights: &[u32],
) {
    let mut quotas = quotas(table.len() as u64, weights);
    let mut active: Vec<usize> = (0..weights.len()).filter(|&r| quotas[r] > 0).collect();
    while !active.is_empty() {
        for &r in &active {
            claim(table, &mut walks[r], ids[r]);
            quotas[r] -= 1;
        }
        active.retain(|&r| quotas[r] > 0);
    }
}

#[test]
fn the_last_backend_with_quota_takes_the_free_slots_its_walk_would_claim() {
    // Weight sets a load-driven policy publishes (one or two backends far ahead, the rest
    // at a floor), and others; tables large and small.
    let sets: [&[u32]; 9] = [
        &[1000, 240, 10, 10],
        &[240, 810, 10, 10],
        &[620, 410, 10, 20],
        &[1000, 10],
        &[1, 1000, 1, 1, 1, 1, 1],
        &[3, 5, 7, 11, 13, 17],
        &[1000],
        &[7, 0, 7, 1],
        &[2, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    ];
    for m in [13u32, 251, 65_537] {
        for weights in sets {
            let n = names(weights.len());
            let all = backends(&n, |i| weights[i]);
            let mut sorted: Vec<_> = all.iter().copied().filter(|b| b.weight > 0).collect();
            sorted.sort_by(|a, b| a.identity.cmp(b.identity));
            let ids: Vec<u32> = sorted.iter().map(|b| b.id).collect();
            let ws: Vec<u32> = sorted.iter().map(|b| b.weight).collect();
            let walks = || -> Vec<Permutation> {
                sorted
                    .iter()
                    .map(|b| Permutation::of(b.identity, u64::from(m)))
                    .collect()
            };
            let mut by_walks = vec![NO_BACKEND; m as usize];
            fill_weighted_by_walks_only(&mut by_walks, &mut walks(), &ids, &ws);
            let mut fast = vec![NO_BACKEND; m as usize];
            fill_weighted(&mut fast, &mut walks(), &ids, &ws);
            assert_eq!(fast, by_walks, "M={m} weights {weights:?}");
            assert!(
                fast.iter().all(|&id| id != NO_BACKEND),
                "M={m} {weights:?}: a free slot left"
            );
        }
    }
}

#[test]
fn every_slot_is_filled() {
    let n = names(7);
    let table = build_table(&backends(&n, |_| 1), 65_537).unwrap();
    assert!(
        table.iter().all(|&id| id < 7),
        "a slot was left empty or holds a stray id"
    );
}

#[test]
fn empty_or_all_drained_gives_an_empty_table() {
    let n = names(3);
    let t = build_table(&backends(&n, |_| 0), 13).unwrap();
    assert_eq!(t, vec![NO_BACKEND; 13]);
    assert_eq!(build_table(&[], 13).unwrap(), vec![NO_BACKEND; 13]);
}

#[test]
fn input_order_does_not_matter() {
    let n = names(50);
    let forward = backends(&n, |i| 1 + (i as u32 % 3));
    let mut reversed = forward.clone();
    reversed.reverse();
    let mut shuffled = forward.clone();
    shuffled.rotate_left(17);
    let a = build_table(&forward, 65_537).unwrap();
    assert_eq!(a, build_table(&reversed, 65_537).unwrap());
    assert_eq!(a, build_table(&shuffled, 65_537).unwrap());
}

#[test]
fn golden_fingerprint() {
    // Known backends -> known table. Every balancer of a fleet, on any CPU and any build,
    // must produce this table; if this value changes, tables change across an upgrade.
    let n = names(10);
    let b = backends(&n, |i| 1 + i as u32 % 2);
    let table = build_table(&b, 65_537).unwrap();
    assert_eq!(fingerprint(&table, &b), GOLDEN_10_BACKENDS_65537);
    assert_eq!(&table[..8], &GOLDEN_FIRST_SLOTS);
}
const GOLDEN_10_BACKENDS_65537: u64 = 11_022_648_795_076_825_656;
const GOLDEN_FIRST_SLOTS: [u32; 8] = [2, 9, 5, 3, 1, 7, 0, 9];

#[test]
fn equal_weights_share_within_one_percent() {
    let n = names(100);
    let table = build_table(&backends(&n, |_| 1), 65_537).unwrap();
    let counts = slot_counts(&table);
    assert_eq!(counts.len(), 100);
    let fair = 65_537.0 / 100.0;
    for (id, &c) in &counts {
        let dev = (c as f64 - fair).abs() / fair;
        assert!(
            dev <= 0.01,
            "backend {id} has {c} slots, fair {fair}: off by {dev:.4}"
        );
    }
}

#[test]
fn weighted_shares_follow_weights_within_one_percent() {
    for m in [65_537u32, 655_373] {
        let n = names(100);
        let weight = |i: usize| [1u32, 2, 3, 5, 10][i % 5];
        let b = backends(&n, weight);
        let table = build_table(&b, m).unwrap();
        let total: u32 = (0..100).map(weight).sum();
        for (id, &c) in &slot_counts(&table) {
            let want = f64::from(m) * f64::from(weight(*id as usize)) / f64::from(total);
            let dev = (c as f64 - want).abs() / want;
            assert!(
                dev <= 0.01,
                "M={m} backend {id}: {c} slots, want {want:.1} ({dev:.4})"
            );
        }
    }
}

#[test]
fn removing_one_of_100_moves_its_slots_and_few_others() {
    let n = names(100);
    let all = backends(&n, |_| 1);
    let before = build_table(&all, 65_537).unwrap();
    let removed = 42u32;
    let rest: Vec<_> = all.iter().copied().filter(|b| b.id != removed).collect();
    let after = build_table(&rest, 65_537).unwrap();
    let mut others_moved = 0;
    for (old, new) in before.iter().zip(&after) {
        if *old == removed {
            assert_ne!(*new, removed);
        } else if old != new {
            others_moved += 1;
        }
    }
    let frac = others_moved as f64 / 65_537.0;
    assert!(
        frac < 0.01,
        "{others_moved} slots of survivors moved ({frac:.4})"
    );
}

#[test]
fn reweighting_one_of_100_moves_little_beyond_its_change() {
    let n = names(100);
    let all = backends(&n, |_| 10);
    let before = build_table(&all, 65_537).unwrap();
    let changed: Vec<_> = all
        .iter()
        .map(|b| MaglevBackend {
            weight: if b.id == 7 { 5 } else { b.weight },
            ..*b
        })
        .collect();
    let after = build_table(&changed, 65_537).unwrap();
    let lost = slot_counts(&before)[&7] - slot_counts(&after)[&7];
    let moved = slots_changed(&before, &after);
    let extra = (moved - lost) as f64 / 65_537.0;
    assert!(
        extra < 0.01,
        "{moved} slots moved for {lost} that had to ({extra:.4} extra)"
    );
}

#[test]
fn rejects_bad_input() {
    let n = vec!["a".to_string(), "a".to_string()];
    assert_eq!(
        build_table(&backends(&n, |_| 1), 13),
        Err(MaglevError::DuplicateIdentity("a".into()))
    );
    let n = names(13);
    assert!(matches!(
        build_table(&backends(&n, |_| 1), 13),
        Err(MaglevError::TooManyBackends { .. })
    ));
}

#[test]
fn fingerprint_ignores_id_numbering() {
    let n = names(5);
    let a = backends(&n, |_| 1);
    let b: Vec<_> = a
        .iter()
        .map(|x| MaglevBackend {
            id: x.id + 100,
            ..*x
        })
        .collect();
    let ta = build_table(&a, 65_537).unwrap();
    let tb = build_table(&b, 65_537).unwrap();
    assert_ne!(ta, tb);
    assert_eq!(fingerprint(&ta, &a), fingerprint(&tb, &b));
}
