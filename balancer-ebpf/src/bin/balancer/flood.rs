//! Flood mode: past a threshold of new flows per CPU per flow-clock tick, new flows are
//! forwarded by hash alone and not inserted, so a burst cannot thrash the connection table.

use aya_ebpf::programs::XdpContext;
use aya_log_ebpf::warn;
use balancer_common::{
    maps::GlobalConfig,
    stats::{Counter, GlobalStats},
};

use crate::{
    clock::now_ticks,
    maps::{CONFIG, FLOOD},
    stats::count,
};

/// Whether flood mode will not track the new flow being chosen now on this CPU: what
/// [`flood_allows_insert`], called once it is chosen, will answer (the window is this CPU's,
/// and one program run uses it at a time). Read-only, for the choice to remember nothing of
/// an untracked flow's client.
#[inline(always)]
pub fn flood_will_skip() -> bool {
    let threshold = match CONFIG.get(0) {
        Some(cfg) => cfg.flood_threshold,
        None => 0,
    };
    if threshold == 0 {
        return false;
    }
    match FLOOD.get(0) {
        Some(window) => window.tick == now_ticks() && window.new_flows >= threshold,
        None => false,
    }
}

/// Counts a new flow against this CPU's window (one flow-clock tick); `false` once the window
/// is over the threshold.
#[inline(always)]
pub fn flood_allows_insert(ctx: &XdpContext, cfg: &GlobalConfig, stats: &mut GlobalStats) -> bool {
    if cfg.flood_threshold == 0 {
        return true;
    }
    let Some(window) = FLOOD.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: per-CPU value, valid for the program's run.
    let window = unsafe { &mut *window };
    let now = now_ticks();
    if now != window.tick {
        window.tick = now;
        window.new_flows = 0;
        window.flooding = 0;
    }
    window.new_flows += 1;
    if window.new_flows <= cfg.flood_threshold {
        return true;
    }
    if window.flooding == 0 {
        window.flooding = 1;
        count(stats, Counter::FloodActivations);
        warn!(
            ctx,
            "flood mode: over {} new flows/s on this CPU; new flows use the hash alone",
            cfg.flood_threshold
        );
    }
    count(stats, Counter::FloodInsertsSkipped);
    false
}
