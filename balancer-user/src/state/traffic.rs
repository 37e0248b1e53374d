//! Traffic counters and their rates, and the connection-table flow counts.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use balancer_common::stats::TrafficStats;

use super::Daemon;
use crate::dataplane::{DataplaneError, FlowCounter};

/// Traffic counters of one VIP or backend at the last reading, and the rates over the last
/// rate interval (which started at `rate_base`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Sampled {
    pub(super) totals: TrafficStats,
    pub(super) rate_base: TrafficStats,
    pub(super) pps: f64,
    pub(super) bps: f64,
}

/// The shortest interval rates are computed over (shorter ones are mostly noise); counters
/// themselves are read afresh on every request.
const RATE_INTERVAL: Duration = Duration::from_millis(100);

/// The rates are watched while a view that shows them (status, stats: `balancer status`,
/// `balancer top`) was asked for within this long; the once-a-second work then reads the
/// counters every second, so each view's rates span about a second.
const WATCHED_FOR: Duration = Duration::from_secs(30);

/// How often the once-a-second work reads the counters while nobody watches the rates: a
/// view then shows rates over the last 0.1 to 10 s (the reading it makes ends the interval).
/// (With one VIP scraped every 4 s under load, the once-a-second thread was a fifth of the
/// daemon's CPU, 0.11 of 0.61 ms a second; reading every 10 s halved it.) The counters
/// themselves are read afresh by every view and by every page of the metrics.
const UNWATCHED_READ_EVERY: Duration = Duration::from_secs(10);

/// Whether the once-a-second work reads the counters at `now`: every second while the rates
/// are watched (a view of them at `watched_at`, within [`WATCHED_FOR`]), else once the last
/// reading (at `read_at`) is [`UNWATCHED_READ_EVERY`] old. (A second's tick may come a little
/// early: "old" allows 100 ms.)
fn reading_due(now: Instant, read_at: Option<Instant>, watched_at: Option<Instant>) -> bool {
    let watched = watched_at.is_some_and(|at| now.saturating_duration_since(at) < WATCHED_FOR);
    let slack = Duration::from_millis(100);
    watched
        || read_at
            .is_none_or(|at| now.saturating_duration_since(at) + slack >= UNWATCHED_READ_EVERY)
}

impl Sampled {
    /// A reading inside the rate interval: new totals, the last rates.
    pub(super) fn with_totals(self, totals: TrafficStats) -> Sampled {
        Sampled { totals, ..self }
    }

    /// A reading that ends a rate interval of `seconds` (`None`: the first reading, rates 0)
    /// and starts the next one.
    pub(super) fn with_rates(self, totals: TrafficStats, seconds: Option<f64>) -> Sampled {
        let base = self.rate_base;
        let (pps, bps) = match seconds {
            Some(s) if totals.packets >= base.packets && totals.bytes >= base.bytes => (
                (totals.packets - base.packets) as f64 / s,
                (totals.bytes - base.bytes) as f64 * 8.0 / s,
            ),
            _ => (0.0, 0.0),
        };
        Sampled {
            totals,
            rate_base: totals,
            pps,
            bps,
        }
    }
}

impl Daemon {
    /// Retires removed backends whose grace period is over, ages bounded load's averaged
    /// shares and session persistence's clients homed.
    pub fn tick(&mut self) {
        match self.balancer.expire_retired(Instant::now()) {
            Ok(0) => {}
            Ok(_) => self.persist_state(),
            Err(e) => tracing::error!("retiring removed backends: {e}"),
        }
        if let Err(e) = self.balancer.refresh_bound_shares(Instant::now()) {
            tracing::error!("writing bounded load's averaged weight shares: {e}");
        }
        if let Err(e) = self.balancer.age_homes() {
            tracing::error!("ageing session persistence's clients homed: {e}");
        }
    }

    /// The once-a-second reading of the traffic counters, when due: every second while a
    /// view of the rates was asked for recently, else every [`UNWATCHED_READ_EVERY`].
    pub fn sample_if_due(&mut self) {
        if reading_due(Instant::now(), self.read_at, self.rates_watched_at) {
            self.sample();
        }
    }

    /// Reads the traffic counters for a view that shows their rates (status, stats): the
    /// rates count as watched from now on, for [`WATCHED_FOR`].
    pub fn sample_for_view(&mut self) {
        self.rates_watched_at = Some(Instant::now());
        self.sample();
    }

    /// Reads the traffic counters, and updates the rates when the last rate interval is at
    /// least [`RATE_INTERVAL`] old (else the last rates stand).
    pub fn sample(&mut self) {
        let now = Instant::now();
        self.read_at = Some(now);
        let elapsed = self.rates_at.map(|t| now.duration_since(t));
        let new_rates = elapsed.is_none_or(|e| e >= RATE_INTERVAL);
        let seconds = elapsed.map(|e| e.as_secs_f64()).filter(|s| *s > 0.0);
        let update = |map: &mut HashMap<u32, Sampled>, id: u32, totals: TrafficStats| {
            let previous = map.get(&id).copied().unwrap_or_default();
            let sampled = if new_rates {
                previous.with_rates(totals, seconds)
            } else {
                previous.with_totals(totals)
            };
            map.insert(id, sampled);
        };
        let vips: Vec<u32> = self.balancer.vips().map(|v| v.id).collect();
        // Every VIP's backends and the retiring ones, each once, read in one go.
        let mut backends: Vec<u32> = self
            .balancer
            .vips()
            .flat_map(|v| v.backends.values().map(|b| b.id))
            .chain(self.balancer.retiring().iter().map(|r| r.state.id))
            .collect();
        backends.sort_unstable();
        backends.dedup();
        let dataplane = self.balancer.dataplane();
        let mut vip_traffic = std::mem::take(&mut self.vip_traffic);
        let mut backend_traffic = std::mem::take(&mut self.backend_traffic);
        let read = crate::dataplane::Dataplane::vips_stats(dataplane, &vips).and_then(|v| {
            crate::dataplane::Dataplane::backends_stats(dataplane, &backends).map(|b| (v, b))
        });
        match read {
            Ok((vip_stats, backend_stats)) => {
                for (id, t) in vips.iter().zip(vip_stats) {
                    update(&mut vip_traffic, *id, t);
                }
                for (id, t) in backends.iter().zip(backend_stats) {
                    update(&mut backend_traffic, *id, t);
                }
                if std::mem::take(&mut self.traffic_unread) {
                    tracing::info!("traffic counters read again");
                }
            }
            // The last figures stand; said once while it lasts.
            Err(e) if !self.traffic_unread => {
                tracing::warn!("reading the traffic counters: {e}");
                self.traffic_unread = true;
            }
            Err(_) => {}
        }
        self.vip_traffic = vip_traffic;
        self.backend_traffic = backend_traffic;
        if new_rates {
            self.rates_at = Some(now);
        }
    }

    /// A count of the active flows per backend: connection-table entries not ended by the
    /// client (FIN/RST), to run without holding the daemon. (The data plane's own counters
    /// exist only for the VIPs whose scheduler reads them; this count covers every VIP.)
    pub fn flow_counter(&self) -> Result<FlowCounter, DataplaneError> {
        self.balancer.dataplane().flow_counter()
    }

    /// Takes a count made by [`Daemon::flow_counter`] (an error is logged; the last stays).
    pub fn set_flow_counts(&mut self, counts: Result<HashMap<u32, u64>, DataplaneError>) {
        match counts {
            Ok(counts) => {
                self.flows = counts;
                self.flows_at = Some(Instant::now());
            }
            Err(e) => tracing::warn!("counting flows: {e}"),
        }
    }

    /// [`Daemon::refresh_flow_counts`] unless the last count is younger than `age`. Blocking.
    pub fn refresh_flow_counts_older_than(daemon: &std::sync::Mutex<Daemon>, age: Duration) {
        let fresh = daemon
            .lock()
            .is_ok_and(|d| d.flows_at.is_some_and(|at| at.elapsed() < age));
        if !fresh {
            Daemon::refresh_flow_counts(daemon);
        }
    }

    /// Counts the flows afresh, holding `daemon` only to start the count and to take it:
    /// reading a large connection table takes tens of milliseconds, and changes, fleet
    /// applies and weight rounds need not wait for it. Blocking.
    pub fn refresh_flow_counts(daemon: &std::sync::Mutex<Daemon>) {
        let Ok(counter) = daemon.lock().map(|d| d.flow_counter()) else {
            return;
        };
        let counts = counter.and_then(FlowCounter::count);
        if let Ok(mut d) = daemon.lock() {
            d.set_flow_counts(counts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(packets: u64, bytes: u64, new_flows: u64) -> TrafficStats {
        TrafficStats {
            packets,
            bytes,
            new_flows,
        }
    }

    #[test]
    fn counters_are_always_fresh_and_rates_move_only_at_a_new_interval() {
        // First reading: totals, no rate yet.
        let first = Sampled::default().with_rates(traffic(10, 1000, 2), None);
        assert_eq!(first.totals, traffic(10, 1000, 2));
        assert_eq!((first.pps, first.bps), (0.0, 0.0));
        // Half a second later: rates over the interval.
        let second = first.with_rates(traffic(60, 6000, 7), Some(0.5));
        assert_eq!((second.pps, second.bps), (100.0, 80_000.0));
        // A reading inside the rate interval: new totals (what a status right after
        // traffic must show), the last rates, the same rate base.
        let third = second.with_totals(traffic(80, 8000, 9));
        assert_eq!(third.totals.new_flows, 9);
        assert_eq!((third.pps, third.bps), (100.0, 80_000.0));
        assert_eq!(third.rate_base, traffic(60, 6000, 7));
        // The next interval counts from the rate base, not from the reading in between.
        let fourth = third.with_rates(traffic(110, 11_000, 9), Some(1.0));
        assert_eq!((fourth.pps, fourth.bps), (50.0, 40_000.0));
        // Counters that went backwards (a map recreated): no negative rate.
        let fifth = fourth.with_rates(traffic(5, 500, 1), Some(1.0));
        assert_eq!((fifth.pps, fifth.bps), (0.0, 0.0));
    }

    #[test]
    fn the_counters_are_read_every_second_while_watched_else_every_ten() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Never read: due at once, watched or not.
        assert!(reading_due(t0, None, None));
        // Unwatched: not a second after the last reading, nor 9 s after; 10 s after (a
        // tick up to 100 ms early included), due.
        assert!(!reading_due(at(1_000), Some(t0), None));
        assert!(!reading_due(at(9_000), Some(t0), None));
        assert!(reading_due(at(9_950), Some(t0), None));
        assert!(reading_due(at(10_000), Some(t0), None));
        // Watched (a view 5 s ago): every tick.
        assert!(reading_due(at(6_000), Some(at(5_000)), Some(at(1_000))));
        // A view 30 s ago or more no longer counts.
        assert!(reading_due(at(30_500), Some(at(29_500)), Some(at(1_000))));
        assert!(!reading_due(at(31_000), Some(at(30_000)), Some(at(1_000))));
    }
}
