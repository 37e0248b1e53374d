//! A VIP's schedule: what the schedulers other than the consistent hashes read. It is stored
//! in the VIP's table map right after the Maglev slots, so a table and its schedule are
//! swapped in together. Layout, in `u32` entries from index `table_size`:
//!
//! | entries | what |
//! | --- | --- |
//! | `[0]` | `L`: backends taking new flows (weight > 0), each once, in identity order |
//! | `[1]` | `S`: length of the weighted round-robin sequence (0 unless that scheduler) |
//! | `[2]` | reserved (0; bounded load reads each backend's averaged share, `Backend::bound_share`) |
//! | `[3]` | tiers whose flows spill to the shared pool when their own backends cannot take them (bit `t`) |
//! | `[4, 11)` | for tiers 1..=7: where the tier's block starts in the map (0: no block) |
//! | `[11, 11 + L)` | the listed backend ids |
//! | `[11 + L, 11 + L + S)` | backend ids in weighted round-robin order |
//!
//! A tier's block holds its table size `M`, then its own Maglev slots and schedule laid out as
//! above (tier entries 0). The shared pool's block starts at 0 without the size entry (the
//! size is the VIP's).
//!
//! Also the pure comparisons the data plane makes (weighted least load, bounded load), so they
//! are unit-tested here.

/// Entries of the schedule header before the backend list.
pub const HEADER: u32 = 11;
/// Header entry: tiers that spill to the shared pool.
pub const SPILL: u32 = 3;
/// Header entry of tier 1's block offset (tier `t` at `TIER_OFFSETS + t - 1`).
pub const TIER_OFFSETS: u32 = 4;

/// The load figures are clamped to this many flows before multiplying (no overflow).
pub const LOAD_CLAMP: u64 = 1 << 24;

#[inline(always)]
const fn clamp(v: u64) -> u64 {
    if v > LOAD_CLAMP { LOAD_CLAMP } else { v }
}

/// Whether backend `a` (with `a_active` flows and weight `a_weight`) is less loaded per unit
/// of weight than backend `b`: `a_active / a_weight < b_active / b_weight`.
#[inline(always)]
pub const fn less_loaded(a_active: u64, a_weight: u32, b_active: u64, b_weight: u32) -> bool {
    // Flow counts stay far below 2^47, weights below 2^16: the products cannot overflow.
    (a_active & LOAD_MASK) * (b_weight as u64) < (b_active & LOAD_MASK) * (a_weight as u64)
}

/// Flow counts are taken modulo 2^47 in comparisons (no overflow with 16-bit weights).
const LOAD_MASK: u64 = (1 << 47) - 1;

/// Bounded load (consistent hashing with bounded loads, Mirrokni et al.): whether a backend
/// with `active` flows and weight `weight` is full, its capacity being its weighted share of
/// the VIP's flows plus the new one, times `(100 + bound_pct)`%. Never full with
/// `bound_pct == 0` (no bound) or no weight.
#[inline(always)]
pub const fn over_bound(
    active: u64,
    vip_active: u64,
    weight: u32,
    total_weight: u32,
    bound_pct: u32,
) -> bool {
    if bound_pct == 0 || total_weight == 0 || weight == 0 {
        return false;
    }
    let total = if total_weight > 1 << 30 {
        1 << 30
    } else {
        total_weight
    } as u64;
    clamp(active) * total * 100
        >= (clamp(vip_active) + 1) * (weight as u64) * (100 + bound_pct as u64)
}

/// One client homed on a backend in [`crate::maps::HOMES`] (fixed point: the daemon ages the
/// counts by fractions of it, and a returning client adds one over the fade time in ticks, to
/// within a thousandth up to hours of persistence).
pub const HOME_UNIT: u64 = 1 << 20;

/// A client's count fades over `1/HOME_FADE_PARTS` of its VIP's persistence time: the daemon
/// takes that fraction's reciprocal share of each count once a second (a count of a 60 s
/// persistence loses 1/15 of itself a second), and a client that keeps returning is counted
/// again by [`home_refresh`]; so a count is the clients a backend homes now, not the clients
/// placed on it over the persistence time (a departed client fades within seconds, where a
/// count kept over the whole persistence time would still weigh on the next clients' placement).
pub const HOME_FADE_PARTS: u64 = 4;

/// What a returning client adds to its backend's count, at most once a flow-clock tick (when
/// its persistence entry's `last_seen` moves), for a VIP of `persist_ticks`: `HOME_UNIT` over
/// the fade time in ticks, so that with the daemon's ageing a client that returns every tick
/// counts about one (and one that returns less often, that share of one).
#[inline(always)]
pub const fn home_refresh(persist_ticks: u16) -> u64 {
    let fade_ticks = persist_ticks as u64 / HOME_FADE_PARTS;
    if fade_ticks <= 1 {
        HOME_UNIT
    } else {
        HOME_UNIT / fade_ticks
    }
}

/// The daemon's divisor for ageing a VIP's counts once a second (see [`HOME_FADE_PARTS`]): its
/// persistence time in seconds over [`HOME_FADE_PARTS`], at least 1.
pub const fn home_fade_secs(persistence_secs: u64) -> u64 {
    let secs = persistence_secs / HOME_FADE_PARTS;
    if secs == 0 { 1 } else { secs }
}

/// Clients homed are clamped to this many units (2^20 clients: past it the pick stands), and
/// capacities to [`CAPACITY_CLAMP`], before multiplying (no overflow: whole clients, at most
/// 2^20 + 2, x 2^20 x 3 < 2^64).
const HOMES_CLAMP: u64 = 1 << 40;
const CAPACITY_CLAMP: u32 = 1 << 20;

/// The whole clients a count of `homed` units stands for, with the new one: rounded to the
/// nearest whole client (clamped first). A count jitters by about a tenth of a client around
/// each one that keeps returning (its share added once a tick, the ageing once a second), and
/// a departed client's remainder fades below a half: neither decides a placement.
#[inline(always)]
const fn with_new(homed: u64) -> u64 {
    let homed = if homed > HOMES_CLAMP {
        HOMES_CLAMP
    } else {
        homed
    };
    (homed + HOME_UNIT / 2) / HOME_UNIT + 1
}

/// A capacity clamped (and at least 1).
#[inline(always)]
const fn clamped(capacity: u32) -> u64 {
    (if capacity > CAPACITY_CLAMP {
        CAPACITY_CLAMP
    } else if capacity == 0 {
        1
    } else {
        capacity
    }) as u64
}

/// Session persistence's placement of a new client: whether it goes to the backend homing the
/// fewest clients per unit of capacity (`least_homed` clients, capacity `least_capacity`)
/// rather than to the scheduler's pick (`pick_homed`, `pick_capacity`) — when the pick, with
/// this client, would home at least 3/2 the clients per unit of capacity that the least would
/// with it. Counts in [`HOME_UNIT`]s, compared in whole clients. Where many clients come, the counts follow the
/// scheduler's weights and the pick mostly stands (the bound keeps the rest off backends the
/// weights starve); where a few heavy ones do (clients behind a NAT, one address each), they
/// are spread by capacity instead of left to where the hash and the weights of the moment put
/// them.
#[inline(always)]
pub const fn spread_over(
    pick_homed: u64,
    pick_capacity: u32,
    least_homed: u64,
    least_capacity: u32,
) -> bool {
    2 * with_new(pick_homed) * clamped(least_capacity)
        >= 3 * with_new(least_homed) * clamped(pick_capacity)
}

/// Whether backend `a` would home fewer clients per unit of capacity than `b` with the new
/// client (counts clamped as in [`spread_over`]): an idle small backend is not "less homed"
/// than a large one with a client already.
#[inline(always)]
pub const fn fewer_homes(a_homed: u64, a_capacity: u32, b_homed: u64, b_capacity: u32) -> bool {
    with_new(a_homed) * clamped(b_capacity) < with_new(b_homed) * clamped(a_capacity)
}

/// Builds the schedule of a pool: `backends` are `(id, weight)` in identity order;
/// `sequence` asks for the weighted round-robin sequence too. The tier entries are 0 (see
/// [`set_tiers`]).
#[cfg(feature = "std")]
pub fn build(backends: &[(u32, u32)], sequence: bool) -> Vec<u32> {
    let listed: Vec<(u32, u32)> = backends.iter().copied().filter(|(_, w)| *w > 0).collect();
    let seq = if sequence {
        weighted_sequence(&listed, crate::maps::MAX_SEQUENCE as usize)
    } else {
        Vec::new()
    };
    let mut out = vec![0; HEADER as usize];
    out[0] = listed.len() as u32;
    out[1] = seq.len() as u32;
    out.extend(listed.iter().map(|(id, _)| *id));
    out.extend(seq);
    out
}

/// Lays out a VIP's whole table map: the shared pool's Maglev `table` and `schedule` (from
/// [`build`]), then a block per tier (`(tier, table, schedule)`), with the offsets and the
/// spill bits written into the shared pool's header.
#[cfg(feature = "std")]
pub fn lay_out(
    table: &[u32],
    schedule: &[u32],
    tiers: &[(u8, &[u32], &[u32])],
    spill: u8,
) -> Vec<u32> {
    let header_at = table.len();
    let mut out = Vec::with_capacity(table.len() + schedule.len());
    out.extend_from_slice(table);
    out.extend_from_slice(schedule);
    out[header_at + SPILL as usize] = u32::from(spill);
    for (tier, t_table, t_schedule) in tiers {
        if *tier == 0 || u32::from(*tier) > crate::maps::MAX_TIERS {
            continue;
        }
        let at = out.len() as u32;
        out[header_at + (TIER_OFFSETS + u32::from(*tier) - 1) as usize] = at;
        out.push(t_table.len() as u32);
        out.extend_from_slice(t_table);
        out.extend_from_slice(t_schedule);
    }
    out
}

/// A weighted round-robin sequence of ids: each appears in proportion to its weight (weights
/// divided by their common divisor, and scaled down when their sum exceeds `max_len`), spread
/// evenly (earliest-deadline order: the `k`-th turn of a backend of weight `w` is due at
/// `(k + 1/2) / w`; ties go to the earlier backend).
#[cfg(feature = "std")]
pub fn weighted_sequence(backends: &[(u32, u32)], max_len: usize) -> Vec<u32> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    let weights: Vec<u64> = backends.iter().map(|(_, w)| u64::from(*w)).collect();
    if weights.iter().all(|w| *w == 0) {
        return Vec::new();
    }
    let gcd = weights.iter().copied().filter(|w| *w > 0).fold(0, gcd_of);
    let mut weights: Vec<u64> = weights.iter().map(|w| w / gcd).collect();
    let sum: u64 = weights.iter().sum();
    if sum > max_len as u64 {
        weights = weights
            .iter()
            .map(|w| {
                if *w == 0 {
                    0
                } else {
                    (w * max_len as u64 / sum).max(1)
                }
            })
            .collect();
        let gcd = weights.iter().copied().filter(|w| *w > 0).fold(0, gcd_of);
        weights.iter_mut().for_each(|w| *w /= gcd);
    }
    let len: u64 = weights.iter().sum();
    /// Turn `turn` of a backend of weight `weight` is due at (2 turn + 1) / (2 weight).
    #[derive(PartialEq, Eq)]
    struct Due {
        turn: u64,
        weight: u64,
        index: usize,
    }
    impl Ord for Due {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            let a = u128::from(2 * self.turn + 1) * u128::from(other.weight);
            let b = u128::from(2 * other.turn + 1) * u128::from(self.weight);
            a.cmp(&b).then(self.index.cmp(&other.index))
        }
    }
    impl PartialOrd for Due {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    let mut heap: BinaryHeap<Reverse<Due>> = weights
        .iter()
        .enumerate()
        .filter(|(_, w)| **w > 0)
        .map(|(index, weight)| {
            Reverse(Due {
                turn: 0,
                weight: *weight,
                index,
            })
        })
        .collect();
    let mut out = Vec::with_capacity(len as usize);
    while (out.len() as u64) < len {
        let Some(Reverse(mut due)) = heap.pop() else {
            break;
        };
        out.push(backends[due.index].0);
        due.turn += 1;
        if due.turn < due.weight {
            heap.push(Reverse(due));
        }
    }
    out
}

#[cfg(feature = "std")]
fn gcd_of(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd_of(b, a % b) }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    /// Places `clients` one after another on backends of capacities `weights`, each first
    /// offered to `pick(i)`, as the data plane does; returns the clients homed per backend.
    fn place(weights: &[u32], clients: usize, pick: impl Fn(usize) -> usize) -> Vec<u64> {
        let mut homes = vec![0u64; weights.len()];
        for i in 0..clients {
            let p = pick(i);
            let mut least = 0;
            for b in 1..weights.len() {
                if fewer_homes(homes[b], weights[b], homes[least], weights[least]) {
                    least = b;
                }
            }
            let to = if spread_over(homes[p], weights[p], homes[least], weights[least]) {
                least
            } else {
                p
            };
            homes[to] += HOME_UNIT;
        }
        homes.iter().map(|h| h / HOME_UNIT).collect()
    }

    #[test]
    fn counts_are_compared_in_whole_clients() {
        // Two clients on the pick, one on the least, each with a tick's share more than a
        // whole (or a tick's ageing less): the fourth still goes to the least, 2 + 2.
        let jitter = HOME_UNIT / 10;
        for (pick, least) in [
            (2 * HOME_UNIT, HOME_UNIT + jitter),
            (2 * HOME_UNIT - jitter, HOME_UNIT),
            (2 * HOME_UNIT + jitter, HOME_UNIT + jitter),
        ] {
            assert!(spread_over(pick, 1000, least, 1000), "{pick} {least}");
        }
        // What is left of clients gone (under half of one) counts as none.
        assert!(!fewer_homes(HOME_UNIT * 4 / 10, 1000, 0, 1000));
        assert!(!fewer_homes(0, 1000, HOME_UNIT * 4 / 10, 1000));
        assert!(fewer_homes(0, 1000, HOME_UNIT * 6 / 10, 1000));
    }

    #[test]
    fn a_returning_client_adds_one_over_the_fade_time() {
        // 60 s of persistence: 56 ticks, a fade of 14 ticks (15 s in the daemon's seconds).
        assert_eq!(home_refresh(56), HOME_UNIT / 14);
        assert_eq!(home_fade_secs(60), 15);
        // A fade of a tick or less: a whole client each tick, aged wholly each second.
        for ticks in [0, 1, 4, 7] {
            assert_eq!(home_refresh(ticks), HOME_UNIT, "{ticks}");
        }
        assert_eq!(home_fade_secs(3), 1);
        // The longest persistence still adds a fine share.
        assert!(home_refresh(u16::MAX) >= HOME_UNIT / 16_384);
    }

    #[test]
    fn a_few_clients_spread_by_weight_whatever_the_hash_picks() {
        // Four clients all hashed to the first large server: two per large server, none on the
        // small ones (a quarter of the capacity each).
        assert_eq!(place(&[400, 400, 100, 100], 4, |_| 0), [2, 2, 0, 0]);
        // Hashed to a small server: they go to the large ones all the same.
        assert_eq!(place(&[400, 400, 100, 100], 4, |_| 3), [2, 2, 0, 0]);
        // Eight equal servers, eight clients on one: one each.
        assert_eq!(place(&[10; 8], 8, |_| 5), [1; 8]);
    }

    #[test]
    fn many_clients_keep_the_schedulers_pick() {
        // Clients the hash spreads in proportion to the capacities: the counts follow them, no
        // client moved past the first few.
        let weights = [400, 400, 100, 100];
        let slots: Vec<usize> = (0..10).map(|s| [0, 0, 0, 0, 1, 1, 1, 1, 2, 3][s]).collect();
        let homes = place(&weights, 1000, |i| slots[(i * 7) % 10]);
        assert_eq!(homes, [400, 400, 100, 100]);
        // The pick stands while it homes under 3/2 the least's clients per unit of capacity.
        assert!(!spread_over(140 * HOME_UNIT, 1, 99 * HOME_UNIT, 1));
        assert!(spread_over(150 * HOME_UNIT, 1, 99 * HOME_UNIT, 1));
        // The least itself is never a move.
        assert!(!spread_over(0, 5, 0, 5));
        // No overflow at the clamp.
        assert!(!spread_over(u64::MAX, u32::MAX, u64::MAX, u32::MAX));
        assert!(spread_over(u64::MAX, u32::MAX, 0, u32::MAX));
        assert!(fewer_homes(0, 1, u64::MAX, 1));
        // With the new client counted: a large server with one client is less homed than an
        // idle one a quarter its weight.
        assert!(fewer_homes(HOME_UNIT, 400, 0, 100));
    }

    #[test]
    fn the_layout_lists_backends_with_weight() {
        let h = HEADER as usize;
        let s = build(&[(7, 2), (9, 0), (11, 1)], false);
        assert_eq!(&s[..3], &[2, 0, 0]);
        assert_eq!(&s[h..], &[7, 11]);
        let s = build(&[(7, 2), (9, 0), (11, 1)], true);
        assert_eq!(&s[..3], &[2, 3, 0]);
        assert_eq!(&s[h..], &[7, 11, 7, 11, 7]);
        assert_eq!(build(&[], true), vec![0; h]);
    }

    #[test]
    fn tier_blocks_follow_the_shared_pool_with_their_offsets() {
        let main_table = [1, 2, 1, 2, 1];
        let main = build(&[(1, 1), (2, 1)], false);
        let premium_table = [5, 5, 5];
        let premium = build(&[(5, 1)], false);
        let all = lay_out(&main_table, &main, &[(2, &premium_table, &premium)], 0b100);
        let header = main_table.len();
        assert_eq!(all[header + SPILL as usize], 0b100);
        assert_eq!(
            all[header + TIER_OFFSETS as usize],
            0,
            "tier 1 has no block"
        );
        let at = all[header + TIER_OFFSETS as usize + 1] as usize;
        assert_eq!(at, main_table.len() + main.len());
        assert_eq!(all[at], 3, "the block starts with its table size");
        assert_eq!(&all[at + 1..at + 4], &premium_table);
        assert_eq!(all[at + 4], 1, "its own list length");
        assert_eq!(all[at + 4 + HEADER as usize], 5);
    }

    #[test]
    fn sequences_are_proportional_and_spread() {
        let seq = weighted_sequence(&[(1, 5), (2, 1), (3, 2)], 1 << 16);
        assert_eq!(seq.len(), 8);
        let count = |id| seq.iter().filter(|x| **x == id).count();
        assert_eq!((count(1), count(2), count(3)), (5, 1, 2));
        // Never two turns of the small backends in a row.
        assert!(seq.windows(2).all(|w| w[0] != w[1] || w[0] == 1), "{seq:?}");
        // Equal weights: plain round robin.
        assert_eq!(
            weighted_sequence(&[(4, 3), (5, 3), (6, 3)], 100),
            vec![4, 5, 6]
        );
    }

    #[test]
    fn long_sequences_are_scaled_down_keeping_every_backend() {
        let backends: Vec<(u32, u32)> = (0..100).map(|i| (i, 60_000 + i)).collect();
        let seq = weighted_sequence(&backends, 1 << 16);
        assert!(seq.len() <= 1 << 16 && seq.len() > 60_000, "{}", seq.len());
        for (id, _) in &backends {
            assert!(seq.contains(id));
        }
        let seq = weighted_sequence(&[(1, 1_000_000), (2, 1)], 1000);
        assert_eq!(seq.iter().filter(|x| **x == 2).count(), 1);
        assert_eq!(seq.len(), 1000);
    }

    #[test]
    fn weighted_load_comparisons() {
        assert!(less_loaded(1, 1, 3, 2)); // 1 < 1.5
        assert!(!less_loaded(4, 2, 2, 1)); // 2 == 2
        assert!(!less_loaded(0, 1, 0, 0));
        assert!(!less_loaded(1 << 40, 1, 1 << 40, 1));
    }

    #[test]
    fn bounded_load_caps_a_backend_at_its_share_plus_the_bound() {
        // Two equal backends, 100 flows, bound 25%: capacity 101/2 * 1.25 = 63.1.
        assert!(!over_bound(63, 100, 1, 2, 25));
        assert!(over_bound(64, 100, 1, 2, 25));
        // Twice the weight, twice the capacity.
        assert!(!over_bound(125, 150, 2, 3, 25));
        assert!(over_bound(126, 150, 2, 3, 25));
        assert!(over_bound(127, 100, 2, 3, 25));
        // No bound, no weight: never full.
        assert!(!over_bound(1_000_000, 0, 1, 1, 0));
        assert!(!over_bound(5, 0, 0, 1, 25));
        // An idle VIP: the first flow always fits.
        assert!(!over_bound(0, 0, 1, 100, 1));
    }
}
