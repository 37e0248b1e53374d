//! Admission control at SYN time: while the daemon holds a VIP's pool saturated, a new flow is
//! admitted only if its client's tier is admitted and under the tier's cap on this CPU;
//! otherwise it goes to the VIP's overflow tier, or is refused (a TCP RST from `reset`, or a
//! drop). Established flows never get here: the caller asks only for TCP SYNs and UDP packets
//! of no tracked flow.
//!
//! Fair admission instead admits every tenant (tier) at most at the rate the daemon publishes
//! for it: its fair share of the pool while saturated, its own limit at all times. The pace is
//! a GCRA on one word per tenant shared by all CPUs: a flow is admitted while the tenant's
//! theoretical arrival time is at most the burst ahead of now, and moves it on by one
//! interval. Two CPUs that read the word at once may both admit: at most one flow per other
//! CPU over the rate at such a moment, never a lasting drift (each admission still adds its
//! interval, atomically).

use balancer_common::maps::{ADMISSION_TIERS, REFUSE_DROP, VIP_F_FAIR};

use crate::{
    active::atomic_add,
    clock::{now_ns, now_ticks},
    maps::{ADMISSION, ADMISSION_STATS, FAIR, FAIR_TAT},
    schedulers::{unpack, unpack_addr},
    tiers::{tier_block, tier_of},
};

/// [`balancer_admit`]'s verdict (bits 56 and up): choose as usual.
pub const ADMIT: u64 = 0;
/// Refuse (how: [`REFUSE_BY_DROP`]).
pub const REFUSE: u64 = 1;
/// Choose from the overflow tier's block (the low 48 bits, packed as `balancer_tier`'s), and
/// refuse (how: [`REFUSE_BY_DROP`]) if it has no backend to take the flow.
pub const OVERFLOW: u64 = 2;
/// Verdict bit: a refusal drops the packet (else a TCP SYN is answered with a RST and a UDP
/// packet is dropped).
pub const REFUSE_BY_DROP: u64 = 1 << 55;

/// The verdict on a new flow of the VIP `vip` (packed as the schedulers take it) from the
/// client `src_lo`/`src_hi`, `fd` = `family | dscp << 8 | vip flags << 16`: [`ADMIT`],
/// [`REFUSE`] or [`OVERFLOW`] `<< 56`, with [`REFUSE_BY_DROP`] and the overflow block.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_admit(vip: u64, src_lo: u64, src_hi: u64, fd: u64) -> u64 {
    let pool = unpack(vip, 0);
    let Some(admission) = ADMISSION.get(pool.vip_id) else {
        return ADMIT;
    };
    if admission.saturated == 0 {
        return ADMIT;
    }
    let src = unpack_addr(src_lo, src_hi);
    let mut tier = tier_of(&src, fd as u8, (fd >> 8) as u8);
    if tier >= ADMISSION_TIERS {
        tier = 0;
    }
    let Some(stats) = ADMISSION_STATS.get_ptr_mut(pool.vip_id * ADMISSION_TIERS + tier) else {
        return ADMIT;
    };
    // SAFETY: this CPU's entry, valid while the program runs.
    let stats = unsafe { &mut *stats };
    if (fd >> 16) as u8 & VIP_F_FAIR != 0 {
        let (interval, burst) = match FAIR.get(pool.vip_id) {
            Some(f) => (
                match f.intervals_ns.get(tier as usize) {
                    Some(i) => *i,
                    None => 0,
                },
                f.burst_ns,
            ),
            None => (0, 0),
        };
        if interval == 0 || within_pace(pool.vip_id * ADMISSION_TIERS + tier, interval, burst) {
            stats.admitted += 1;
            return ADMIT;
        }
        stats.shed_over_cap += 1;
    } else if (admission.admit >> tier) & 1 != 0 {
        let cap = match admission.caps.get(tier as usize) {
            Some(c) => *c,
            None => 0,
        };
        if cap == 0 {
            stats.admitted += 1;
            return ADMIT;
        }
        let now = now_ticks();
        if stats.window_tick != now {
            stats.window_tick = now;
            stats.window_admitted = 0;
        }
        if stats.window_admitted < u64::from(cap) {
            stats.window_admitted += 1;
            stats.admitted += 1;
            return ADMIT;
        }
        stats.shed_over_cap += 1;
    } else {
        stats.shed_saturated += 1;
    }
    let how = if admission.refuse == REFUSE_DROP {
        REFUSE_BY_DROP
    } else {
        0
    };
    if admission.overflow_tier != 0 {
        let block = tier_block(&pool, u32::from(admission.overflow_tier));
        if block != 0 {
            stats.overflowed += 1;
            return OVERFLOW << 56 | how | (block & 0xffff_ffff_ffff);
        }
    }
    REFUSE << 56 | how
}

/// GCRA: whether the tenant at `index` of [`FAIR_TAT`] may admit a flow now at one per
/// `interval` nanoseconds with `burst` of tolerance; if so its pace moves on by `interval`.
#[inline(always)]
fn within_pace(index: u32, interval: u64, burst: u64) -> bool {
    let Some(tat) = FAIR_TAT.get_ptr_mut(index) else {
        return true;
    };
    let now = now_ns();
    // SAFETY: an aligned u64 in a map value, shared by all CPUs: read and written whole.
    let mut at = unsafe { core::ptr::read_volatile(tat) };
    if at < now {
        // Idle since: the pace starts again from now.
        unsafe { core::ptr::write_volatile(tat, now) };
        at = now;
    }
    if at - now > burst {
        return false;
    }
    atomic_add(tat, interval);
    true
}
