//! Scrapes due by new flows: a VIP whose telemetry is paced by its requests is scraped once its
//! new flows reach what a scrape is for. The daemon sets the VIP's count of flows left at each
//! scrape; each new flow counts it down, and the flow that brings it to zero (or one of the few
//! after it, should CPUs race) tells the daemon through a ring buffer — so a burst is scraped at
//! once, and a quiet VIP costs the daemon no wake-up to look.

use balancer_common::maps::SCRAPE_DUE_WINDOW;

use crate::{
    active::atomic_add,
    maps::{SCRAPE_DUE, SCRAPE_EVENTS},
};

/// Counts a new flow of the VIP `vip_id` down, and tells the daemon when its scrape is due.
#[inline(always)]
pub fn count_new_flow(vip_id: u32) {
    let Some(left) = SCRAPE_DUE.get_ptr_mut(vip_id) else {
        return;
    };
    // -1, shared by all CPUs.
    atomic_add(left, u64::MAX);
    // SAFETY: an aligned u64 in a map value; a single 8-byte load.
    let now = unsafe { core::ptr::read_volatile(left) } as i64;
    if now <= 0 && now > -SCRAPE_DUE_WINDOW {
        // A full ring (a daemon not reading) loses the event: its scrape then comes on time.
        let _ = SCRAPE_EVENTS.output(vip_id, 0);
    }
}
