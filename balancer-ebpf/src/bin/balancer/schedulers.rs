//! The schedulers that pick a new flow's backend from a pool of a VIP: Maglev (with bounded
//! load), source hash, round robin and weighted round robin, random, weighted random, power
//! of two, least connections; and the Maglev lookup used without connection tracking.
//!
//! The schedulers are global functions: the kernel verifies each once, on its own, rather
//! than once for every way the packet path reaches it (each header layout is a different
//! verifier state, and the schedulers' loops multiplied by all of them exceed the verifier's
//! budget). Their arguments are therefore plain integers: the pool as `vip_id | table_size <<
//! 16 | base << 40` (where its block starts in the VIP's table map; 0 for the shared pool),
//! the VIP's options as `scheduler | load_bound << 8 | persist_ticks << 16 | client port << 32
//! | address family << 48 | flags << 56`, and they return a backend id, checked by the
//! caller.

use aya_ebpf::btf_maps::Array;
use balancer_common::{
    addr::RawAddr,
    flow_hash::{flow_hash, slot},
    maps::{
        BOUND_SHARE_SCALE, Backend, MAGLEV_TABLE_FLAGS, MAX_TABLE_ENTRIES, NO_BACKEND, Scheduler,
        VipMeta,
    },
    schedule::{HEADER, fewer_homes, less_loaded, over_bound, spread_over},
};

use crate::{
    active::{backend_active, vip_active},
    backends::{Pick, bound_share_of, serves, serving, valid_id, weight_of},
    clock::random,
    homes::home_of,
    maps::{BACKENDS, MAGLEV, RR_CURSOR},
};

/// A VIP's table: Maglev slots, then its schedule.
pub type Table = Array<u32, { MAX_TABLE_ENTRIES as usize }, { MAGLEV_TABLE_FLAGS as usize }>;

/// Most backends least-conn compares per new flow (from a rotating start, so larger pools are
/// sampled fairly).
const LEAST_CONN_SCAN: u32 = 256;
/// Most backends session persistence's spreading compares per new client (from a random
/// start): each costs the verifier a pass over the loop's body, within the whole program's
/// budget of a million instructions.
const SPREAD_SCAN: u32 = 16;
/// Most table slots a bounded-load hash probes past a full backend.
const BOUNDED_PROBES: u32 = 8;

/// A pool of a VIP's backends as the schedulers see it: the shared pool (`base` 0) or a
/// priority tier's block of the VIP's table map, with the VIP's options.
#[derive(Clone, Copy)]
pub struct Pool {
    pub vip_id: u32,
    pub base: u32,
    pub table_size: u32,
    pub scheduler: u8,
    pub load_bound: u8,
    pub persist_ticks: u16,
}

#[inline(always)]
pub fn pack_pool(vip_id: u32, base: u32, table_size: u32) -> u64 {
    u64::from(vip_id & 0xffff)
        | u64::from(table_size & 0xff_ffff) << 16
        | u64::from(base & 0xff_ffff) << 40
}

#[inline(always)]
pub fn pack_opts(vip: &VipMeta, sport: u16, family: u8) -> u64 {
    u64::from(vip.scheduler)
        | u64::from(vip.load_bound) << 8
        | u64::from(vip.persist_ticks) << 16
        | u64::from(sport) << 32
        | u64::from(family) << 48
        | u64::from(vip.flags) << 56
}

#[inline(always)]
pub fn unpack(vip: u64, opts: u64) -> Pool {
    Pool {
        vip_id: (vip & 0xffff) as u32,
        table_size: ((vip >> 16) & 0xff_ffff) as u32,
        base: ((vip >> 40) & 0xff_ffff) as u32,
        scheduler: opts as u8,
        load_bound: (opts >> 8) as u8,
        persist_ticks: (opts >> 16) as u16,
    }
}

/// An address passed to a global function as two integers, back.
#[inline(always)]
pub fn unpack_addr(lo: u64, hi: u64) -> RawAddr {
    [lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32]
}

/// An address as two integers for a global function.
#[inline(always)]
pub fn pack_addr(src: &RawAddr) -> (u64, u64) {
    (
        u64::from(src[0]) | u64::from(src[1]) << 32,
        u64::from(src[2]) | u64::from(src[3]) << 32,
    )
}

/// The scheduler's choice, else (while a change of scheduler and its schedule are on their way
/// in) the Maglev table's.
#[inline(always)]
pub fn scheduled(vip: u64, opts: u64, src: &RawAddr, sport: u16) -> u32 {
    let id = match Scheduler::from_u8(opts as u8) {
        Some(Scheduler::SourceHash) => balancer_hashed(vip, opts, flow_hash(src, 0)),
        Some(Scheduler::RoundRobin) => balancer_in_turn(vip, 0),
        Some(Scheduler::WeightedRoundRobin) => balancer_in_turn(vip, 1),
        Some(Scheduler::Random | Scheduler::WeightedRandom | Scheduler::PowerOfTwo) => {
            balancer_random(vip, opts)
        }
        Some(Scheduler::LeastConn) => balancer_least_conn(vip),
        _ => NO_BACKEND,
    };
    if valid_id(id) {
        return id;
    }
    balancer_hashed(vip, opts, flow_hash(src, sport))
}

/// The VIP's table, and its size checked non-zero.
#[inline(always)]
pub fn table_of(meta: &Pool) -> Option<&'static Table> {
    if meta.table_size == 0 {
        return None;
    }
    MAGLEV.get(meta.vip_id)
}

/// The Maglev slot of `hash`; under bounded load, the first of the following slots whose
/// backend has room (the hash's own backend if none has).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_hashed(vip: u64, opts: u64, hash: u32) -> u32 {
    let meta = unpack(vip, opts);
    let Some(table) = table_of(&meta) else {
        return NO_BACKEND;
    };
    hashed(&meta, table, hash).id
}

/// Round robin over the list (`weighted` 0) or the weighted sequence (1).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_in_turn(vip: u64, weighted: u32) -> u32 {
    let meta = unpack(vip, 0);
    let Some(table) = table_of(&meta) else {
        return NO_BACKEND;
    };
    in_turn(&meta, table, weighted != 0).id
}

/// Random, weighted random, or the better of two weighted random picks.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_random(vip: u64, opts: u64) -> u32 {
    let meta = unpack(vip, opts);
    let Some(table) = table_of(&meta) else {
        return NO_BACKEND;
    };
    let vip = &meta;
    let p = match Scheduler::from_u8(vip.scheduler) {
        Some(Scheduler::Random) => {
            let len = header(vip, table, 0);
            listed(vip, table, below(random(), len), len)
        }
        Some(Scheduler::PowerOfTwo) => {
            let a = at_slot(vip, table, below(random(), vip.table_size));
            let b = at_slot(vip, table, below(random(), vip.table_size));
            if !a.is_some() {
                b
            } else if !b.is_some() {
                a
            } else if less_loaded(
                backend_active(b.id),
                weight_of(b.backend()),
                backend_active(a.id),
                weight_of(a.backend()),
            ) {
                b
            } else {
                a
            }
        }
        _ => at_slot(vip, table, below(random(), vip.table_size)),
    };
    p.id
}

/// Least connections (see [`least_conn`]).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_least_conn(vip: u64) -> u32 {
    let meta = unpack(vip, 0);
    let Some(table) = table_of(&meta) else {
        return NO_BACKEND;
    };
    least_conn(&meta, table).id
}

/// `x` mapped onto `0..n` (multiply-shift: no division, and no division-by-zero path the
/// verifier would reject; `n == 0` gives 0).
#[inline(always)]
fn below(x: u32, n: u32) -> u32 {
    ((u64::from(x) * u64::from(n)) >> 32) as u32
}

/// Whether a backend is over the VIP's bounded load: its share of the VIP's active flows
/// against its averaged share of its pool's weights (see [`Backend::bound_share`]).
#[inline(always)]
pub fn full(vip: &Pool, id: u32, b: &Backend) -> bool {
    if vip.load_bound == 0 {
        return false;
    }
    over_bound(
        backend_active(id),
        vip_active(vip.vip_id),
        bound_share_of(b),
        BOUND_SHARE_SCALE,
        u32::from(vip.load_bound),
    )
}

/// Entry `i` of the schedule's header (0 when absent).
#[inline(always)]
fn header(vip: &Pool, table: &Table, i: u32) -> u32 {
    match table.get(vip.base + vip.table_size + i) {
        Some(v) => *v,
        None => 0,
    }
}

/// The backend in a slot of the Maglev table.
#[inline(always)]
fn at_slot(vip: &Pool, table: &Table, index: u32) -> Pick {
    match table.get(vip.base + index) {
        Some(id) => Pick::candidate(vip.vip_id, *id),
        None => Pick::NONE,
    }
}

/// The `i`-th backend of the schedule's list of `len`.
#[inline(always)]
fn listed(vip: &Pool, table: &Table, i: u32, len: u32) -> Pick {
    if i >= len {
        return Pick::NONE;
    }
    match table.get(vip.base + vip.table_size + HEADER + i) {
        Some(id) => Pick::candidate(vip.vip_id, *id),
        None => Pick::NONE,
    }
}

/// The Maglev slot of `hash`; under bounded load, the first of the following slots whose
/// backend has room (the hash's own backend if none has).
#[inline(always)]
fn hashed(vip: &Pool, table: &Table, hash: u32) -> Pick {
    let size = vip.table_size;
    if size == 0 {
        return Pick::NONE;
    }
    let first = slot(hash, size);
    let home = at_slot(vip, table, first);
    if vip.load_bound == 0 {
        return home;
    }
    let mut i = 0;
    let mut index = first;
    while i < BOUNDED_PROBES {
        let p = at_slot(vip, table, index);
        if p.is_some() && !full(vip, p.id, p.backend()) {
            return p;
        }
        index += 1;
        if index >= size {
            index = 0;
        }
        i += 1;
    }
    home
}

/// This CPU's cursor of the VIP, advanced; in `0..len`.
#[inline(always)]
fn next_turn(vip: &Pool, len: u32) -> u32 {
    match RR_CURSOR.get_ptr_mut(vip.vip_id) {
        Some(c) => {
            // SAFETY: this CPU's entry.
            let c = unsafe { &mut *c };
            let at = if *c >= len { 0 } else { *c };
            *c = at + 1;
            at
        }
        None => 0,
    }
}

/// Round robin over the list, or over the weighted sequence, with a cursor per CPU per VIP.
/// A backend that left since the schedule was built is skipped (a few tries).
#[inline(always)]
fn in_turn(vip: &Pool, table: &Table, weighted: bool) -> Pick {
    let list_len = header(vip, table, 0);
    let seq_len = header(vip, table, 1);
    let (start, len) = if weighted && seq_len > 0 {
        (vip.base + vip.table_size + HEADER + list_len, seq_len)
    } else {
        (vip.base + vip.table_size + HEADER, list_len)
    };
    if len == 0 {
        return Pick::NONE;
    }
    let mut tries = 0;
    while tries < 4 {
        let at = next_turn(vip, len);
        let p = match table.get(start + at) {
            Some(id) => Pick::candidate(vip.vip_id, *id),
            None => Pick::NONE,
        };
        if p.is_some() {
            return p;
        }
        tries += 1;
    }
    Pick::NONE
}

/// The listed backend with the fewest active flows per unit of weight, from a rotating start
/// (ties spread; lists longer than `LEAST_CONN_SCAN` are sampled in windows). The loop keeps
/// only integers (no map pointers), so the verifier's states at its head stay few.
#[inline(always)]
fn least_conn(vip: &Pool, table: &Table) -> Pick {
    let len = header(vip, table, 0);
    if len == 0 {
        return Pick::NONE;
    }
    let start = next_turn(vip, len);
    let scan = if len < LEAST_CONN_SCAN {
        len
    } else {
        LEAST_CONN_SCAN
    };
    let list = vip.base + vip.table_size + HEADER;
    let mut best_id = NO_BACKEND;
    let mut best_active: u64 = 0;
    let mut best_weight: u32 = 1;
    let mut i = 0;
    while i < LEAST_CONN_SCAN {
        if i >= scan {
            break;
        }
        let mut at = start + i;
        if at >= len {
            at -= len;
        }
        let id = match table.get(list + at) {
            Some(id) => *id,
            None => NO_BACKEND,
        };
        let weight = match BACKENDS.get(id) {
            Some(b) if serves(b, vip.vip_id) => weight_of(b),
            _ => 0,
        };
        if weight != 0 {
            let active = backend_active(id);
            if !valid_id(best_id) || less_loaded(active, weight, best_active, best_weight) {
                best_id = id;
                best_active = active;
                best_weight = weight;
            }
        }
        i += 1;
    }
    Pick::candidate(vip.vip_id, best_id)
}

/// Session persistence's placement of a new client under bounded load: the scheduler's
/// `pick`, or `best`, the listed backend that would home the fewest clients per unit of
/// capacity with it ([`balancer_least_homed`]), when the pick would home at least 3/2 as many
/// (`spread_over`) and `best` has room under the bound. While either capacity is unknown (none
/// written yet: a VIP's first moments) the pick stands.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_spread(vip: u64, opts: u64, pick: u32, best: u32) -> u32 {
    if !valid_id(best) || best == pick {
        return pick;
    }
    let meta = unpack(vip, opts);
    let (Some(p), Some(b)) = (BACKENDS.get(pick), BACKENDS.get(best)) else {
        return pick;
    };
    let (pick_homed, pick_capacity) = home_of(pick);
    let (best_homed, best_capacity) = home_of(best);
    if serves(p, meta.vip_id)
        && pick_capacity != 0
        && best_capacity != 0
        && spread_over(pick_homed, pick_capacity, best_homed, best_capacity)
        // Bounded load has the last word: a least homed backend without room leaves the pick.
        && !full(&meta, best, b)
    {
        best
    } else {
        pick
    }
}

/// The listed backend of pool `vip` (packed) that would home the fewest clients per unit of
/// capacity with a new one (`NO_BACKEND` if none), for [`balancer_spread`]. A function of its
/// own, with one argument, and the best so far read again for each comparison rather than
/// carried: the loop keeps few values, so its stack frame stays small (it sits on top of
/// persistence's and the packet path's, within the kernel's 512 bytes).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_least_homed(vip: u64) -> u32 {
    let meta = unpack(vip, 0);
    let Some(table) = table_of(&meta) else {
        return NO_BACKEND;
    };
    let len = header(&meta, table, 0);
    // From a random start: ties go to any of the least homed, and a longer list is sampled
    // fairly. (An unknown start also keeps the verifier's states few: each pass over the loop
    // looks alike to it, where counting from 0 gives it a state per position.)
    let mut at = below(random(), len);
    let list = meta.base + meta.table_size + HEADER;
    let mut best = NO_BACKEND;
    let mut left = if len < SPREAD_SCAN { len } else { SPREAD_SCAN };
    while left > 0 {
        left -= 1;
        let id = match table.get(list + at) {
            Some(id) => *id,
            None => NO_BACKEND,
        };
        if let Some(b) = BACKENDS.get(id)
            && serves(b, meta.vip_id)
            && b.weight != 0
        {
            let better = if valid_id(best) {
                let (homed, capacity) = home_of(id);
                let (best_homed, best_capacity) = home_of(best);
                fewer_homes(homed, capacity, best_homed, best_capacity)
            } else {
                true
            };
            if better {
                best = id;
            }
        }
        at += 1;
        if at >= len {
            at -= len;
        }
    }
    best
}

/// The backend the VIP's Maglev table assigns to a flow, if it serves the VIP (no connection
/// tracking, no bounded load).
#[inline(always)]
pub fn from_table(vip: &VipMeta, src: &RawAddr, sport: u16) -> Option<(u32, &'static Backend)> {
    if vip.table_size == 0 {
        return None;
    }
    let index = slot(flow_hash(src, sport), vip.table_size);
    let id = *MAGLEV.get_value(vip.vip_id, &index)?;
    if !valid_id(id) {
        return None;
    }
    serving(vip.vip_id, id)
}
