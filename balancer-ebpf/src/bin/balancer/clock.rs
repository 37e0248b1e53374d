//! The flow clock and the program's random numbers.

use aya_ebpf::helpers::generated::{bpf_get_prandom_u32, bpf_ktime_get_coarse_ns};
use balancer_common::flow_cache::TICK_SHIFT;

/// The flow clock in ticks of 2^30 ns (a coarse clock: cheap, ~jiffy precision).
#[inline(always)]
pub fn now_ticks() -> u64 {
    now_ns() >> TICK_SHIFT
}

/// The coarse clock in nanoseconds.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_coarse_ns() }
}

#[inline(always)]
pub fn random() -> u32 {
    // SAFETY: helper without arguments.
    unsafe { bpf_get_prandom_u32() }
}
