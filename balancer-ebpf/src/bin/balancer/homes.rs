//! Clients homed per backend under session persistence (`HOMES`), shared by all CPUs, with
//! each backend's capacity: what spreads a VIP's new clients when a few carry its traffic
//! (see `balancer_common::schedule::spread_over`). The daemon ages the counts and writes the
//! capacities.

use balancer_common::schedule::{HOME_UNIT, home_refresh};

use crate::{active::atomic_add, maps::HOMES};

/// Counts a new client placed on a backend.
#[inline(always)]
pub fn add_home(backend_id: u32) {
    add_to_home(backend_id, HOME_UNIT);
}

/// Counts a returning client again on its backend, once a flow-clock tick: with the daemon's
/// ageing a client that keeps coming counts about one, one gone fades (see
/// `balancer_common::schedule::home_refresh`).
#[inline(always)]
pub fn refresh_home(backend_id: u32, persist_ticks: u16) {
    add_to_home(backend_id, home_refresh(persist_ticks));
}

#[inline(always)]
fn add_to_home(backend_id: u32, units: u64) {
    if let Some(p) = HOMES.get_ptr_mut(backend_id) {
        // SAFETY: a map value; `homed` is its aligned first field.
        atomic_add(unsafe { &raw mut (*p).homed }, units);
    }
}

/// The clients a backend homes now, in `HOME_UNIT`s, and its capacity (0 while the daemon
/// has written none: nothing says where a client has room, and the scheduler's pick stands).
#[inline(always)]
pub fn home_of(backend_id: u32) -> (u64, u32) {
    match HOMES.get_ptr(backend_id) {
        Some(p) => {
            // SAFETY: a map value; single aligned loads.
            let homed = unsafe { core::ptr::read_volatile(&raw const (*p).homed) };
            let capacity = unsafe { core::ptr::read_volatile(&raw const (*p).capacity) };
            (homed, capacity)
        }
        None => (0, 0),
    }
}
