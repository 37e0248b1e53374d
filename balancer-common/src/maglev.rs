//! Weighted Maglev table population (Eisenbud et al., "Maglev: A Fast and Reliable Software
//! Network Load Balancer", NSDI 2016, §3.4).
//!
//! Each backend has a permutation of the table's slots given by an `offset` and a `skip`
//! derived from a hash of its identity; backends take turns claiming their next preferred free
//! slot until the table is full. With weights, each backend's quota is its exact share of the
//! table, `M * w_i / sum(w)` rounded by largest remainder; backends with quota left take turns
//! in identity order, round after round. Equal weights therefore reproduce the paper's round
//! robin exactly, and each backend holds its share to within one slot.
//!
//! Determinism: the table is a function of the set of (identity, weight) pairs and the table
//! size only. Backends are sorted by identity first, and the permutation hash is XXH3 with
//! fixed seeds: XXH3's output is specified and identical on every CPU, whereas `ahash` picks
//! an AES or a fallback path per CPU and may change between versions, which would let two
//! balancers of one fleet build different tables from the same backends.

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

impl Permutation {
    /// The walk of the backend with this identity through a table of `m` slots (m prime).
    fn of(identity: &[u8], m: u64) -> Permutation {
        Permutation {
            position: xxh3_64_with_seed(identity, OFFSET_SEED) % m,
            skip: xxh3_64_with_seed(identity, SKIP_SEED) % (m - 1) + 1,
        }
    }

    /// The next preferred slot: `(position + skip) mod m`, without a division (skip < m).
    fn advance(&mut self, m: u64) {
        self.position += self.skip;
        if self.position >= m {
            self.position -= m;
        }
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
        .map(|b| Permutation::of(b.identity, m))
        .collect();
    let ids: Vec<u32> = sorted.iter().map(|b| b.id).collect();
    if sorted.iter().all(|b| b.weight == sorted[0].weight) {
        fill_round_robin(&mut table, &mut walks, &ids);
    } else {
        let weights: Vec<u32> = sorted.iter().map(|b| b.weight).collect();
        fill_weighted(&mut table, &mut walks, &ids, &weights);
    }
    Ok(table)
}

/// Claims `walk`'s next free preferred slot for `id`.
fn claim(table: &mut [u32], walk: &mut Permutation, id: u32) {
    let m = table.len() as u64;
    while table[walk.position as usize] != NO_BACKEND {
        walk.advance(m);
    }
    table[walk.position as usize] = id;
    walk.advance(m);
}

/// Equal weights: plain round robin in identity order, as in the paper.
fn fill_round_robin(table: &mut [u32], walks: &mut [Permutation], ids: &[u32]) {
    let mut filled = 0;
    loop {
        for (walk, id) in walks.iter_mut().zip(ids) {
            claim(table, walk, *id);
            filled += 1;
            if filled == table.len() {
                return;
            }
        }
    }
}

/// Each backend's exact share of `m` slots by weight, rounded by largest remainder (ties to
/// the lower rank); the quotas add up to `m`.
fn quotas(m: u64, weights: &[u32]) -> Vec<u64> {
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    let mut quotas: Vec<u64> = weights.iter().map(|w| m * u64::from(*w) / total).collect();
    let mut left = m - quotas.iter().sum::<u64>();
    let mut by_remainder: Vec<usize> = (0..weights.len()).collect();
    // Largest remainder first; the sort is stable, so ties keep rank order.
    by_remainder.sort_by_key(|&r| std::cmp::Reverse(m * u64::from(weights[r]) % total));
    for &r in &by_remainder {
        if left == 0 {
            break;
        }
        quotas[r] += 1;
        left -= 1;
    }
    quotas
}

/// Weighted turns: each backend's quota of slots is its exact share of the table (largest
/// remainders, ties to the lower rank); backends with quota left take turns in rank order, round
/// after round, dropping out as their quota runs out (about M ln M probes in all, most of them
/// of taken slots near the end).
///
/// The quotas add up to the table's size, so once a single backend has quota left, its quota
/// is the number of free slots and its walk would claim every one of them: they are given to it
/// in one pass instead. Same table, fewer probes: weights 1000/240/10/10 build in about half the
/// time; when the last two backends finish together there is little left to skip.
fn fill_weighted(table: &mut [u32], walks: &mut [Permutation], ids: &[u32], weights: &[u32]) {
    let mut quotas = quotas(table.len() as u64, weights);
    let mut active: Vec<usize> = (0..weights.len()).filter(|&r| quotas[r] > 0).collect();
    while active.len() > 1 {
        for &r in &active {
            claim(table, &mut walks[r], ids[r]);
            quotas[r] -= 1;
        }
        active.retain(|&r| quotas[r] > 0);
    }
    if let [last] = active[..] {
        for slot in table.iter_mut().filter(|slot| **slot == NO_BACKEND) {
            *slot = ids[last];
        }
    }
}

/// Slots per backend id (ids absent from the table are absent from the result).
///
/// Counted in a dense array when the ids are small (backend ids are slot numbers of a map of
/// a few thousand in practice): a map's entry per slot cost ~0.4 ms for a table of 65,537,
/// which every page of the daemon's metrics paid for each VIP.
pub fn slot_counts(table: &[u32]) -> std::collections::BTreeMap<u32, usize> {
    // NO_BACKEND (u32::MAX) wraps to 0: a plain maximum, without a branch per slot.
    let max_id = table
        .iter()
        .map(|id| id.wrapping_add(1))
        .max()
        .unwrap_or(0)
        .saturating_sub(1);
    if max_id >= 1 << 20 {
        let mut counts = std::collections::BTreeMap::new();
        for &id in table {
            if id != NO_BACKEND {
                *counts.entry(id).or_insert(0) += 1;
            }
        }
        return counts;
    }
    // Four histograms, one per lane of four slots (consecutive slots often hold the same id,
    // and one counter would make each increment wait for the one before); NO_BACKEND counts
    // in a last column, without a branch.
    let width = max_id as usize + 2;
    let column = |id: u32| id.min(max_id + 1) as usize;
    let mut lanes = vec![[0u32; 4]; width];
    let mut chunks = table.chunks_exact(4);
    for chunk in &mut chunks {
        for (lane, &id) in chunk.iter().enumerate() {
            lanes[column(id)][lane] += 1;
        }
    }
    for &id in chunks.remainder() {
        lanes[column(id)][0] += 1;
    }
    lanes[..width - 1]
        .iter()
        .enumerate()
        .filter_map(|(id, n)| {
            let n: usize = n.iter().map(|c| *c as usize).sum();
            (n > 0).then_some((id as u32, n))
        })
        .collect()
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
    let mut bytes = Vec::with_capacity(table.len() * 4 + 64 * ranked.len());
    for b in &ranked {
        bytes.extend_from_slice(&(b.identity.len() as u32).to_le_bytes());
        bytes.extend_from_slice(b.identity);
    }
    // id -> rank through a dense array (ids are small slot numbers in practice), else a map.
    let max_id = ranked.iter().map(|b| b.id).max().unwrap_or(0);
    if max_id < 1 << 20 {
        let mut rank_of = vec![NO_BACKEND; max_id as usize + 1];
        for (rank, b) in ranked.iter().enumerate() {
            rank_of[b.id as usize] = rank as u32;
        }
        for &id in table {
            let rank = rank_of.get(id as usize).copied().unwrap_or(NO_BACKEND);
            bytes.extend_from_slice(&rank.to_le_bytes());
        }
    } else {
        let rank_of: std::collections::HashMap<u32, u32> = ranked
            .iter()
            .enumerate()
            .map(|(rank, b)| (b.id, rank as u32))
            .collect();
        for id in table {
            let rank = rank_of.get(id).copied().unwrap_or(NO_BACKEND);
            bytes.extend_from_slice(&rank.to_le_bytes());
        }
    }
    xxh3_64_with_seed(&bytes, 0)
}

#[cfg(test)]
mod tests;
