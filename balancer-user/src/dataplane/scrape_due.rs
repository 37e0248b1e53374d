//! What tells the telemetry loops that a paced VIP's new flows reached a scrape's: the count of
//! flows left, which a loop sets at each scrape, and the ring buffer of VIP ids the program
//! fills when a count reaches zero (`balancer_common::maps::SCRAPE_DUE`, `SCRAPE_EVENTS`). Taken
//! out of the kernel data plane once ([`super::Dataplane::take_scrape_due`]) by the loops'
//! thread, which then waits on the ring buffer instead of reading each VIP's counter on a timer.

use std::os::fd::{AsRawFd, RawFd};

use aya::maps::{Array, MapData, RingBuf};
use balancer_common::maps as names;

use super::DataplaneError;
use super::kernel::map_err;

/// Both maps.
pub struct ScrapeDue {
    pub counts: ScrapeDueCounts,
    pub events: ScrapeEvents,
}

/// The new flows left before each VIP's next scrape is due.
pub struct ScrapeDueCounts(Array<MapData, u64>);

impl ScrapeDueCounts {
    pub fn new(map: Array<MapData, u64>) -> Self {
        ScrapeDueCounts(map)
    }

    /// Sets the new flows left before the scrape of the VIP `vip_id` is due (a new count: the
    /// flows counted down before it are forgotten).
    pub fn set(&mut self, vip_id: u32, flows: u64) -> Result<(), DataplaneError> {
        let flows = flows.min(i64::MAX as u64);
        self.0
            .set(vip_id, flows, 0)
            .map_err(map_err(names::SCRAPE_DUE, "write"))
    }
}

/// The ids of the VIPs whose scrape came due, as the program wrote them.
pub struct ScrapeEvents(RingBuf<MapData>);

impl ScrapeEvents {
    pub fn new(ring: RingBuf<MapData>) -> Self {
        ScrapeEvents(ring)
    }

    /// Takes every event written so far, in order, and gives each VIP id to `each`.
    pub fn drain(&mut self, mut each: impl FnMut(u32)) {
        while let Some(item) = self.0.next() {
            if let Some(id) = item.get(..4) {
                each(u32::from_ne_bytes([id[0], id[1], id[2], id[3]]));
            }
        }
    }
}

/// Readable (for epoll) while events wait.
impl AsRawFd for ScrapeEvents {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
