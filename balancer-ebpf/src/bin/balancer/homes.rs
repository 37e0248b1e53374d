//! Clients placed per backend under session persistence (`HOMES`), shared by all CPUs, with
//! each backend's capacity: what spreads a VIP's new clients when a few carry its traffic
//! (see `balancer_common::schedule::spread_over`). The daemon ages the counts and writes the
//! capacities.

use balancer_common::{maps::HOME_CAPACITY_SCALE, schedule::HOME_UNIT};

use crate::{active::atomic_add, maps::HOMES};

/// Counts a new client placed on a backend.
#[inline(always)]
pub fn add_home(backend_id: u32) {
    if let Some(p) = HOMES.get_ptr_mut(backend_id) {
        // SAFETY: a map value; `placed` is its aligned first field.
        atomic_add(unsafe { &raw mut (*p).placed }, HOME_UNIT);
    }
}

/// The clients placed on a backend lately, in `HOME_UNIT`s, and its capacity (a mean
/// backend's while the daemon has written none; at least 1).
#[inline(always)]
pub fn home_of(backend_id: u32) -> (u64, u32) {
    match HOMES.get_ptr(backend_id) {
        Some(p) => {
            // SAFETY: a map value; single aligned loads.
            let placed = unsafe { core::ptr::read_volatile(&raw const (*p).placed) };
            let capacity = unsafe { core::ptr::read_volatile(&raw const (*p).capacity) };
            (
                placed,
                if capacity == 0 {
                    HOME_CAPACITY_SCALE
                } else {
                    capacity
                },
            )
        }
        None => (0, HOME_CAPACITY_SCALE),
    }
}
