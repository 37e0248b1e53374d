//! Admission control at SYN time: while the daemon holds a VIP's pool saturated, a new flow is
//! admitted only if its client's tier is admitted and under the tier's cap on this CPU;
//! otherwise it goes to the VIP's overflow tier, or is refused (a TCP RST from `reset`, or a
//! drop). Established flows never get here: the caller asks only for TCP SYNs and UDP packets
//! of no tracked flow.

use balancer_common::maps::{ADMISSION_TIERS, REFUSE_DROP};

use crate::{
    clock::now_ticks,
    maps::{ADMISSION, ADMISSION_STATS},
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
/// client `src_lo`/`src_hi`, `fd` = `family | dscp << 8`: [`ADMIT`], [`REFUSE`] or
/// [`OVERFLOW`] `<< 56`, with [`REFUSE_BY_DROP`] and the overflow block.
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
    if (admission.admit >> tier) & 1 != 0 {
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
