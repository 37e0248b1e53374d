//! Session persistence: a client's new flows go to the backend its last flow had, while the
//! VIP's persistence time has not run out since and that backend may take it; otherwise the
//! VIP's scheduler picks — or, under bounded load, where that would pile the VIP's few
//! clients onto one backend, the backend homing the fewest per unit of capacity
//! (`balancer_spread`) — and the pick is remembered. With a source prefix (tenant affinity)
//! "a client" is every address of its network: source hash and persistence key on the
//! prefix.

use balancer_common::{
    addr::{FAMILY_V4, RawAddr, prefix_of},
    maps::{AffinityKey, AffinityValue, BACKEND_F_RETURNING_ELSEWHERE, VIP_F_SOURCE_PREFIX},
};

use balancer_common::stats::Counter;

use crate::{
    backends::Pick,
    clock::now_ticks,
    flood::flood_will_skip,
    homes::{add_home, refresh_home},
    maps::{AFFINITY, BACKENDS, SOURCE_PREFIXES, STATS},
    schedulers::{balancer_least_homed, balancer_spread, full, scheduled, unpack, unpack_addr},
    stats::count,
};

/// The backend id for a new flow (`NO_BACKEND` if none): the client's previous one under
/// session persistence, else the VIP's scheduler's choice (remembered under persistence).
/// Arguments as the schedulers take them (see `schedulers`), the client address as two
/// integers.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_pick(vip: u64, opts: u64, src_lo: u64, src_hi: u64) -> u32 {
    let meta = unpack(vip, opts);
    let src = affinity_source(&unpack_addr(src_lo, src_hi), meta.vip_id, opts);
    let sport = (opts >> 32) as u16;
    if meta.persist_ticks == 0 {
        return scheduled(vip, opts, &src, sport);
    }
    // A flow flood mode will not track leaves no trace of its client either: a flood cannot
    // fill the persistence table or inflate a backend's homes.
    let track = !flood_will_skip();
    let now = now_ticks() as u16;
    let key = AffinityKey {
        src,
        vip_id: meta.vip_id,
    };
    if let Some(sticky) = AFFINITY.get_ptr_mut(key) {
        // SAFETY: a map value, valid for the program's run.
        let sticky = unsafe { &mut *sticky };
        let id = u32::from(sticky.backend_id);
        if now.wrapping_sub(sticky.last_seen) <= meta.persist_ticks {
            let verdict = balancer_may_stick(vip, opts, id, u32::from(sticky.generation));
            if verdict != STICK_NO {
                if track && sticky.last_seen != now {
                    // Once a tick: the client still lives here (see `refresh_home`).
                    sticky.last_seen = now;
                    refresh_home(id, meta.persist_ticks);
                }
                if verdict == STICK_YES {
                    count_choice(Counter::PersistenceReturned);
                    return id;
                }
                // Its backend is over the bound, or sends its returning clients elsewhere:
                // this flow goes where the scheduler puts it, the client keeps its backend (a
                // key behind a NAT carries many clients' flows: only the excess leaves, not
                // all of them).
                count_choice(if verdict == STICK_FULL {
                    Counter::PersistenceOverBound
                } else {
                    Counter::PersistenceSentElsewhere
                });
                return scheduled(vip, opts, &src, sport);
            }
        }
    }
    count_choice(Counter::PersistencePlaced);
    // A new client: where the scheduler puts it, unless under bounded load that would pile
    // the VIP's few clients onto one backend (see `balancer_spread`; without a bound nothing
    // says which backend has room, and the pick stands); counted where it lands.
    let pick = scheduled(vip, opts, &src, sport);
    let id = if meta.load_bound != 0 {
        balancer_spread(vip, opts, pick, balancer_least_homed(vip))
    } else {
        pick
    };
    if track && let Some(b) = BACKENDS.get(id) {
        add_home(id);
        let value = AffinityValue {
            backend_id: id as u16,
            generation: b.generation,
            last_seen: now,
            _pad: 0,
        };
        let _ = AFFINITY.insert(key, value, 0);
    }
    id
}

/// Counts one of persistence's outcomes in this CPU's global counters.
#[inline(always)]
fn count_choice(counter: Counter) {
    if let Some(stats) = STATS.get_ptr_mut(0) {
        // SAFETY: this CPU's entry, valid while the program runs.
        count(unsafe { &mut *stats }, counter);
    }
}

/// What source hash and persistence key on: the client's address, or under a source prefix
/// its network (the prefix length of its family).
#[inline(always)]
fn affinity_source(src: &RawAddr, vip_id: u32, opts: u64) -> RawAddr {
    if (opts >> 56) as u8 & VIP_F_SOURCE_PREFIX == 0 {
        return *src;
    }
    let Some(prefix) = SOURCE_PREFIXES.get(vip_id) else {
        return *src;
    };
    let len = if (opts >> 48) as u8 == FAMILY_V4 {
        prefix.v4
    } else {
        prefix.v6
    };
    prefix_of(src, u32::from(len))
}

/// [`balancer_may_stick`]: the remembered backend is gone, another, or takes no new flows.
const STICK_NO: u32 = 0;
/// [`balancer_may_stick`]: it takes the flow.
const STICK_YES: u32 = 1;
/// [`balancer_may_stick`]: it stays the client's, but is over the bounded load.
const STICK_FULL: u32 = 2;
/// [`balancer_may_stick`]: it stays the client's, but its returning clients are sent
/// elsewhere this round.
const STICK_ELSEWHERE: u32 = 3;

/// Whether a client's remembered backend may take its new flow: [`STICK_YES`] if it serves
/// the VIP, is the same backend (generation), takes new flows, its returning clients are not
/// sent elsewhere this round (`BACKEND_F_RETURNING_ELSEWHERE`) and it has room under bounded
/// load; [`STICK_ELSEWHERE`] if only the first of those two is missing, [`STICK_FULL`] if only
/// the room; else [`STICK_NO`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_may_stick(vip: u64, opts: u64, id: u32, generation: u32) -> u32 {
    let meta = unpack(vip, opts);
    let p = Pick::candidate(meta.vip_id, id);
    if !p.is_some() {
        return STICK_NO;
    }
    let b = p.backend();
    if b.weight == 0 || b.generation != generation as u16 {
        return STICK_NO;
    }
    if b.flags & BACKEND_F_RETURNING_ELSEWHERE != 0 {
        STICK_ELSEWHERE
    } else if full(&meta, id, b) {
        STICK_FULL
    } else {
        STICK_YES
    }
}
