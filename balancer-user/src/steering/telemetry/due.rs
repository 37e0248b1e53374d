//! Scrapes due by new flows, told by the data plane. A paced VIP's loop sets, at each scrape,
//! the new flows its next scrape is for ([`DueWatch::expect`]); the program counts them down
//! and writes the VIP's id to a ring buffer when they reach zero; [`relay`], woken by the ring
//! buffer, tells that VIP's loop ([`DueWatch::listen`]), which scrapes at once. Between scrapes
//! the loops' thread sleeps: reading each paced VIP's counter every half second instead cost a
//! wake-up, a lock and a map read each time (profiled at the LLM benchmark's 5.5 requests a
//! second: a quarter to a third of the daemon's CPU). Where the data plane cannot tell (an
//! object without the maps, as a benchmark's baseline), the loops read the counters on a timer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::dataplane::scrape_due::ScrapeEvents;

/// Sets a VIP's count of new flows left (by VIP id); an error says why it could not.
type SetCount = Box<dyn FnMut(u32, u64) -> Result<(), String> + Send>;

/// The paced VIPs' loops, by VIP id, and how their counts are set.
pub struct DueWatch {
    set_count: Mutex<SetCount>,
    loops: Mutex<HashMap<u32, mpsc::Sender<()>>>,
}

impl DueWatch {
    /// A watch whose counts `set_count` writes.
    pub fn new(
        set_count: impl FnMut(u32, u64) -> Result<(), String> + Send + 'static,
    ) -> Arc<DueWatch> {
        Arc::new(DueWatch {
            set_count: Mutex::new(Box::new(set_count)),
            loops: Mutex::new(HashMap::new()),
        })
    }

    /// Where the loop of the VIP `vip_id` hears that its scrape is due, from now on (a loop
    /// started again for the same VIP takes the place of the one before). Events that come
    /// while one waits unheard are one.
    pub fn listen(&self, vip_id: u32) -> mpsc::Receiver<()> {
        let (tell, told) = mpsc::channel(1);
        if let Ok(mut loops) = self.loops.lock() {
            loops.insert(vip_id, tell);
        }
        told
    }

    /// Sets the new flows after which the next scrape of the VIP `vip_id` is due, counted from
    /// now. False where it could not be set (the loop then reads the VIP's counter itself).
    pub fn expect(&self, vip_id: u32, flows: u64) -> bool {
        let Ok(mut set) = self.set_count.lock() else {
            return false;
        };
        match set(vip_id, flows) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(vip_id, "setting the flows a scrape is due after: {e}");
                false
            }
        }
    }

    /// Tells the loop of the VIP `vip_id` that its scrape is due (nothing when no loop
    /// listens: a VIP removed since).
    pub fn due(&self, vip_id: u32) {
        let Ok(mut loops) = self.loops.lock() else {
            return;
        };
        if let Some(tell) = loops.get(&vip_id)
            && let Err(mpsc::error::TrySendError::Closed(_)) = tell.try_send(())
        {
            loops.remove(&vip_id);
        }
    }
}

/// Reads the data plane's events as they come and tells each VIP's loop; runs on the loops'
/// runtime until it stops.
pub async fn relay(events: ScrapeEvents, watch: Arc<DueWatch>) {
    // SAFETY: `events` owns the ring buffer's map, whose descriptor stays open, and is the one
    // `as_raw_fd` returns, for as long as the AsyncFd owns it.
    let registered = unsafe { AsyncFd::register_with_interest(events, Interest::READABLE) };
    let mut events = match registered {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!("telemetry: cannot wait on the ring buffer of scrapes due: {e}");
            return;
        }
    };
    loop {
        let mut ready = match events.readable_mut().await {
            Ok(ready) => ready,
            Err(e) => {
                tracing::error!("telemetry: waiting on the ring buffer of scrapes due: {e}");
                return;
            }
        };
        // Readiness first, then the events: one written after the last read wakes the next
        // wait (the kernel wakes a reader that has caught up), none is left unread.
        ready.clear_ready();
        ready.get_inner_mut().drain(|vip_id| watch.due(vip_id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_vips_loop_hears_its_own_events_once_however_many() {
        let set: Arc<Mutex<Vec<(u32, u64)>>> = Default::default();
        let seen = set.clone();
        let watch = DueWatch::new(move |id, flows| {
            seen.lock().unwrap().push((id, flows));
            if id == 9 {
                Err("no such VIP".into())
            } else {
                Ok(())
            }
        });
        assert!(watch.expect(3, 32));
        assert!(!watch.expect(9, 32), "a count that could not be set");
        assert_eq!(*set.lock().unwrap(), [(3, 32), (9, 32)]);

        let mut three = watch.listen(3);
        let mut four = watch.listen(4);
        watch.due(3);
        watch.due(3);
        watch.due(7); // no loop listens
        assert_eq!(three.try_recv(), Ok(()));
        assert!(
            three.try_recv().is_err(),
            "two events before the loop heard: one"
        );
        assert!(four.try_recv().is_err(), "another VIP's event");

        // A loop started again takes the place of the one before; a loop gone is forgotten.
        let mut again = watch.listen(3);
        watch.due(3);
        assert_eq!(again.try_recv(), Ok(()));
        assert!(three.try_recv().is_err());
        drop(again);
        watch.due(3);
        assert!(!watch.loops.lock().unwrap().contains_key(&3));
    }
}
