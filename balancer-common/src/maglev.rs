//! Weighted Maglev table population (Eisenbud et al., "Maglev: A Fast and Reliable Software
//! Network Load Balancer", NSDI 2016, §3.4).
//!
//! Each backend has a permutation of the table's slots given by an `offset` and a `skip`
//! derived from a hash of its identity; backends take turns claiming their next preferred free
//! slot until the table is full. With weights, the turns are spaced like weighted fair
//! queueing: backend `i` takes its `k`-th turn at virtual time `k / w_i`, ties going to the
//! backend whose identity sorts first. Equal weights therefore reproduce the paper's round
//! robin exactly, and each backend ends within one slot of `M * w_i / sum(w)`.
//!
//! Determinism: the table is a function of the set of (identity, weight) pairs and the table
//! size only. Backends are sorted by identity first, and the permutation hash is XXH3 with
//! fixed seeds: XXH3's output is specified and identical on every CPU, whereas `ahash` picks
//! an AES or a fallback path per CPU and may change between versions, which would let two
//! balancers of one fleet build different tables from the same backends.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt;

use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use crate::maps::NO_BACKEND;

const OFFSET_SEED: u64 = 0x6d61_676c_6576_0001;
const SKIP_SEED: u64 = 0x6d61_676c_6576_0002;

/// One backend as the table builder sees it.
#[derive(Clone, Copy, Debug)]
pub struct MaglevBackend<'a> {
    /// Stable identity (e.g. the address as text); decides the backend's permutation.
    pub identity: &'a [u8],
    /// Relative share; 0 takes no slots (drain).
    pub weight: u32,
    /// The value written into the backend's slots.
    pub id: u32,
}

/// Why a table could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MaglevError {
    /// The table size is not a prime number.
    NotPrime(u32),
    /// More weighted backends than slots.
    TooManyBackends { backends: usize, table_size: u32 },
    /// Two backends share an identity.
    DuplicateIdentity(String),
    /// A backend id equals [`NO_BACKEND`].
    ReservedId,
}

impl fmt::Display for MaglevError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaglevError::NotPrime(m) => write!(f, "table size {m} is not a prime number"),
            MaglevError::TooManyBackends {
                backends,
                table_size,
            } => write!(
                f,
                "{backends} backends do not fit a table of {table_size} slots"
            ),
            MaglevError::DuplicateIdentity(id) => write!(f, "backend {id:?} appears twice"),
            MaglevError::ReservedId => write!(f, "backend id {NO_BACKEND} is reserved"),
        }
    }
}

impl std::error::Error for MaglevError {}

/// Whether `n` is prime (trial division; table sizes are below 2^32).
pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let n = u64::from(n);
    let mut d = 3u64;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// A backend's walk through its preferred slots.
struct Permutation {
    position: u64,
    skip: u64,
}

/// A backend's place in the turn order: its next turn is at virtual time `(turns + 1) / weight`.
#[derive(Clone, Copy, Eq, PartialEq)]
struct Turn {
    turns: u64,
    weight: u64,
    rank: usize,
}

impl Ord for Turn {
    /// Reverse order (the heap is a max-heap): the earliest virtual time, then the lowest rank.
    fn cmp(&self, other: &Self) -> Ordering {
        let mine = u128::from(self.turns + 1) * u128::from(other.weight);
        let theirs = u128::from(other.turns + 1) * u128::from(self.weight);
        theirs.cmp(&mine).then_with(|| other.rank.cmp(&self.rank))
    }
}

impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Builds the table: `table_size` slots, each holding the `id` of a backend, or [`NO_BACKEND`]
/// everywhere when no backend has a weight.
pub fn build_table(
    backends: &[MaglevBackend<'_>],
    table_size: u32,
) -> Result<Vec<u32>, MaglevError> {
    if !is_prime(table_size) {
        return Err(MaglevError::NotPrime(table_size));
    }
    let mut sorted: Vec<MaglevBackend<'_>> = backends.to_vec();
    sorted.sort_by(|a, b| a.identity.cmp(b.identity));
    for pair in sorted.windows(2) {
        if pair[0].identity == pair[1].identity {
            return Err(MaglevError::DuplicateIdentity(
                String::from_utf8_lossy(pair[0].identity).into_owned(),
            ));
        }
    }
    if sorted.iter().any(|b| b.id == NO_BACKEND) {
        return Err(MaglevError::ReservedId);
    }
    sorted.retain(|b| b.weight > 0);

    let m = u64::from(table_size);
    let mut table = vec![NO_BACKEND; table_size as usize];
    if sorted.is_empty() {
        return Ok(table);
    }
    if sorted.len() >= table_size as usize {
        return Err(MaglevError::TooManyBackends {
            backends: sorted.len(),
            table_size,
        });
    }

    let mut walks: Vec<Permutation> = sorted
        .iter()
        .map(|b| Permutation {
            position: xxh3_64_with_seed(b.identity, OFFSET_SEED) % m,
            skip: xxh3_64_with_seed(b.identity, SKIP_SEED) % (m - 1) + 1,
        })
        .collect();
    let mut turns: BinaryHeap<Turn> = sorted
        .iter()
        .enumerate()
        .map(|(rank, b)| Turn {
            turns: 0,
            weight: u64::from(b.weight),
            rank,
        })
        .collect();

    let mut filled = 0usize;
    while let Some(mut turn) = turns.pop() {
        let walk = &mut walks[turn.rank];
        while table[walk.position as usize] != NO_BACKEND {
            walk.position = (walk.position + walk.skip) % m;
        }
        table[walk.position as usize] = sorted[turn.rank].id;
        walk.position = (walk.position + walk.skip) % m;
        filled += 1;
        if filled == table.len() {
            break;
        }
        turn.turns += 1;
        turns.push(turn);
    }
    Ok(table)
}

/// Slots per backend id (ids absent from the table are absent from the result).
pub fn slot_counts(table: &[u32]) -> std::collections::BTreeMap<u32, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for &id in table {
        if id != NO_BACKEND {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

/// Number of slots whose owner differs between two tables of the same size.
pub fn slots_changed(old: &[u32], new: &[u32]) -> usize {
    old.iter().zip(new).filter(|(a, b)| a != b).count()
}

/// A host-independent fingerprint of a table: the table with each id replaced by its
/// backend's identity, hashed. Two balancers that built the same table from the same backends
/// report the same value even if they numbered the backends differently.
pub fn fingerprint(table: &[u32], backends: &[MaglevBackend<'_>]) -> u64 {
    let mut ranked: Vec<&MaglevBackend<'_>> = backends.iter().collect();
    ranked.sort_by(|a, b| a.identity.cmp(b.identity));
    let rank_of: std::collections::HashMap<u32, u32> = ranked
        .iter()
        .enumerate()
        .map(|(rank, b)| (b.id, rank as u32))
        .collect();
    let mut bytes = Vec::with_capacity(table.len() * 4 + 64 * ranked.len());
    for b in &ranked {
        bytes.extend_from_slice(&(b.identity.len() as u32).to_le_bytes());
        bytes.extend_from_slice(b.identity);
    }
    for id in table {
        let rank = rank_of.get(id).copied().unwrap_or(NO_BACKEND);
        bytes.extend_from_slice(&rank.to_le_bytes());
    }
    xxh3_64_with_seed(&bytes, 0)
}

#[cfg(test)]
mod tests {
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
    fn primes() {
        assert!(is_prime(65_537));
        assert!(is_prime(655_373));
        assert!(is_prime(2) && is_prime(3) && is_prime(13));
        assert!(!is_prime(0) && !is_prime(1) && !is_prime(65_536) && !is_prime(655_371));
        assert_eq!(build_table(&[], 65_536), Err(MaglevError::NotPrime(65_536)));
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
    const GOLDEN_10_BACKENDS_65537: u64 = 15_282_297_674_275_093_173;
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
}
