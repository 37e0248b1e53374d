//! The program's counters: global (per CPU, by reason) and traffic per VIP and per backend.

use balancer_common::stats::{Counter, GlobalStats, TrafficStats};

#[inline(always)]
pub fn count(stats: &mut GlobalStats, counter: Counter) {
    stats.counters[counter as usize] += 1;
}

/// Adds a packet of `bytes` (and a new flow) to a VIP's or backend's traffic entry.
#[inline(always)]
pub fn add_traffic(entry: Option<*mut TrafficStats>, bytes: u64, new_flow: bool) {
    if let Some(entry) = entry {
        // SAFETY: this CPU's entry, valid while the program runs.
        let entry = unsafe { &mut *entry };
        entry.packets += 1;
        entry.bytes += bytes;
        entry.new_flows += u64::from(new_flow);
    }
}
