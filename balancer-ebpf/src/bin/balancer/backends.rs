//! Backend entries as the choosing code sees them: one predicate for "may take this VIP's
//! flows", id checks, and the scheduler's pick.

use balancer_common::maps::{BACKEND_F_ACTIVE, Backend, MAX_BACKENDS, NO_BACKEND};

use crate::maps::BACKENDS;

/// Whether a backend takes traffic at all (active: healthy and not removed).
#[inline(always)]
pub fn usable(backend: &Backend) -> bool {
    backend.flags & BACKEND_F_ACTIVE != 0
}

/// Whether a backend may take a new flow of VIP `vip_id`: usable, and its slot still belongs
/// to that VIP (an id named by a table being swapped out may have gone to another VIP).
#[inline(always)]
pub fn serves(backend: &Backend, vip_id: u32) -> bool {
    usable(backend) && u32::from(backend.vip_id) == vip_id
}

/// Whether `id` can be a backend id (`NO_BACKEND` and anything else out of range cannot).
///
/// A range check, never `id == NO_BACKEND`: for the BPF CPU version these objects are built
/// for (no 32-bit jumps), LLVM compares a zero-extended 32-bit id with `u32::MAX` as a 64-bit
/// compare against a sign-extended -1, which is never equal (measured: a scheduler's "none"
/// was taken for an id and the packet dropped).
#[inline(always)]
pub fn valid_id(id: u32) -> bool {
    id < MAX_BACKENDS
}

/// The backend entry of id `id` if it serves VIP `vip_id`.
#[inline(always)]
pub fn serving(vip_id: u32, id: u32) -> Option<(u32, &'static Backend)> {
    let backend = BACKENDS.get(id)?;
    if serves(backend, vip_id) {
        Some((id, backend))
    } else {
        None
    }
}

/// A backend's weight for load ratios (at least 1).
#[inline(always)]
pub fn weight_of(b: &Backend) -> u32 {
    if b.weight == 0 {
        1
    } else {
        u32::from(b.weight)
    }
}

/// A backend's averaged weight share for bounded load (at least 1).
#[inline(always)]
pub fn bound_share_of(b: &Backend) -> u32 {
    if b.bound_share == 0 {
        1
    } else {
        u32::from(b.bound_share)
    }
}

/// A scheduler's pick: a backend id and its entry, or none (`backend` null). A plain struct
/// rather than `Option<(u32, &Backend)>`, whose `None` leaves the id undefined: carried
/// through branches and across helper calls, LLVM may then spill an uninitialised register,
/// which the verifier rejects.
#[derive(Clone, Copy)]
pub struct Pick {
    pub id: u32,
    backend: *const Backend,
}

impl Pick {
    pub const NONE: Pick = Pick {
        id: NO_BACKEND,
        backend: core::ptr::null(),
    };

    /// The backend with this id if it serves VIP `vip_id` (a table or schedule only lists
    /// backends with weight).
    #[inline(always)]
    pub fn candidate(vip_id: u32, id: u32) -> Pick {
        if !valid_id(id) {
            return Pick::NONE;
        }
        match BACKENDS.get(id) {
            Some(b) if serves(b, vip_id) => Pick { id, backend: b },
            _ => Pick::NONE,
        }
    }

    #[inline(always)]
    pub fn is_some(&self) -> bool {
        !self.backend.is_null()
    }

    #[inline(always)]
    pub fn backend(&self) -> &'static Backend {
        // SAFETY: only called when `is_some`; a map value, valid for the program's run.
        unsafe { &*self.backend }
    }
}
