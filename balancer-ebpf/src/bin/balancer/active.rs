//! Active-flow counts per backend and per VIP, shared by all CPUs: what least-conn,
//! power-of-two and bounded load read, and what the daemon's connection-aware policies read.
//! Kept only for VIPs that need them (`VipMeta::counts_active`).

use aya_ebpf::btf_maps::Array;

use crate::maps::{ACTIVE, VIP_ACTIVE};

/// Adds `delta` (`u64::MAX` for -1) to a backend's and its VIP's active-flow counts.
#[inline(always)]
pub fn add_active(backend_id: u32, vip_id: u16, delta: u64) {
    add_counter(&ACTIVE, backend_id, delta);
    add_counter(&VIP_ACTIVE, u32::from(vip_id), delta);
}

/// A backend's active flows.
#[inline(always)]
pub fn backend_active(backend_id: u32) -> u64 {
    active_of(&ACTIVE, backend_id)
}

/// A VIP's active flows.
#[inline(always)]
pub fn vip_active(vip_id: u32) -> u64 {
    active_of(&VIP_ACTIVE, vip_id)
}

#[inline(always)]
fn add_counter<const N: usize, const F: usize>(map: &Array<u64, N, F>, index: u32, delta: u64) {
    if let Some(p) = map.get_ptr_mut(index) {
        atomic_add(p, delta);
    }
}

/// Adds to a `u64` shared by all CPUs.
#[inline(always)]
pub fn atomic_add(p: *mut u64, delta: u64) {
    // SAFETY: `p` points at an aligned u64 in a map value, changed atomically only.
    #[cfg(target_arch = "bpf")]
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            p, delta,
        );
    }
    #[cfg(not(target_arch = "bpf"))]
    unsafe {
        core::sync::atomic::AtomicU64::from_ptr(p)
            .fetch_add(delta, core::sync::atomic::Ordering::Relaxed);
    }
}

/// An active-flow count (the counters are signed; a transient negative reads as 0).
#[inline(always)]
fn active_of<const N: usize, const F: usize>(map: &Array<u64, N, F>, index: u32) -> u64 {
    match map.get_ptr(index) {
        // SAFETY: an aligned u64 in a map value.
        Some(p) => {
            // A single aligned 8-byte load (atomic loads do not lower for this CPU version).
            let v = unsafe { core::ptr::read_volatile(p) } as i64;
            if v < 0 { 0 } else { v as u64 }
        }
        None => 0,
    }
}
