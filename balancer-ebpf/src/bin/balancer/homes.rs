//! Clients placed per backend under session persistence (`HOMES`), shared by all CPUs: what
//! spreads a VIP's new clients when a few carry its traffic (see
//! `balancer_common::schedule::spread_over`). The daemon ages the counts.

use balancer_common::schedule::HOME_UNIT;

use crate::{active::atomic_add, maps::HOMES};

/// Counts a new client placed on a backend.
#[inline(always)]
pub fn add_home(backend_id: u32) {
    if let Some(p) = HOMES.get_ptr_mut(backend_id) {
        atomic_add(p, HOME_UNIT);
    }
}

/// The clients placed on a backend lately, in `HOME_UNIT`s.
#[inline(always)]
pub fn homes_of(backend_id: u32) -> u64 {
    match HOMES.get_ptr(backend_id) {
        // SAFETY: an aligned u64 in a map value; a single aligned 8-byte load.
        Some(p) => unsafe { core::ptr::read_volatile(p) },
        None => 0,
    }
}
