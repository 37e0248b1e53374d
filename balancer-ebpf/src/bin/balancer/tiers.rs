//! Priority tiers: a client's tier comes from the longest matching source prefix, else its
//! DSCP; a VIP may dedicate a block of its table to a tier's own backends (see
//! `balancer_common::schedule` for the layout).

use aya_ebpf::maps::lpm_trie::Key as LpmKey;
use balancer_common::{
    addr::{FAMILY_V4, RawAddr},
    maps::MAX_TIERS,
    schedule::{SPILL, TIER_OFFSETS},
};

use crate::{
    maps::{TIER_DSCP, TIER_V4, TIER_V6},
    schedulers::{Pool, table_of, unpack, unpack_addr},
};

/// The client's priority tier's block in the VIP's table map, if it has a tier and the VIP
/// dedicates backends to it: `base | size << 24 | spill << 48` (where the block's Maglev slots
/// start, their number, and 1 if the tier spills into the shared pool); 0 otherwise. The pool
/// as the schedulers take it, the client address as two integers, `fd` = `family | dscp << 8`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_tier(vip: u64, src_lo: u64, src_hi: u64, fd: u64) -> u64 {
    let pool = unpack(vip, 0);
    let src = unpack_addr(src_lo, src_hi);
    tier_block(&pool, tier_of(&src, fd as u8, (fd >> 8) as u8))
}

/// Tier `tier`'s block in the VIP's table map, packed as [`balancer_tier`] returns it; 0 if
/// the tier is 0 or out of range, or the VIP dedicates no backends to it.
#[inline(always)]
pub fn tier_block(pool: &Pool, tier: u32) -> u64 {
    if tier == 0 || tier > MAX_TIERS {
        return 0;
    }
    let Some(table) = table_of(pool) else {
        return 0;
    };
    let header = pool.table_size;
    let at = match table.get(header + TIER_OFFSETS + tier - 1) {
        Some(v) => *v,
        None => 0,
    };
    if at == 0 {
        return 0;
    }
    let size = match table.get(at) {
        Some(v) => *v,
        None => 0,
    };
    let spill = match table.get(header + SPILL) {
        Some(v) => (*v >> tier) & 1,
        None => 0,
    };
    u64::from((at + 1) & 0xff_ffff) | u64::from(size & 0xff_ffff) << 24 | u64::from(spill) << 48
}

/// A client's priority tier: the longest matching source prefix's, else its DSCP's; 0 if none.
#[inline(always)]
pub fn tier_of(src: &RawAddr, family: u8, dscp: u8) -> u32 {
    let by_prefix = if family == FAMILY_V4 {
        let key = LpmKey::new(32, src[0]);
        TIER_V4.get(&key).copied()
    } else {
        let key = LpmKey::new(128, *src);
        TIER_V6.get(&key).copied()
    };
    match by_prefix {
        Some(t) if t != 0 => u32::from(t),
        _ => match TIER_DSCP.get(u32::from(dscp)) {
            Some(t) => u32::from(*t),
            None => 0,
        },
    }
}
