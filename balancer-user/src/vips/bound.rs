//! What bounded load judges a backend against: its share of its pool's weights averaged over
//! the VIP's mean flow duration ([`Backend::bound_share`]).
//!
//! Bounded load refuses a backend a new or returning flow when its share of the VIP's active
//! flows is over `(100 + bound)`% of its share of the weights. The active flows were placed
//! over their whole lives, under the weights of each moment; a telemetry policy moves the
//! weights every round (several times a second), much faster than flows end. Judged against
//! the weights of the moment, a backend whose weight just dipped looks over its bound although
//! its flows followed the weights it had, and returning clients of session persistence are
//! moved for nothing. Its averaged share
//! moves as its share of flows can: an exponential average whose time constant is the VIP's
//! mean flow duration (Little's law: active flows over new flows per second, both counted by
//! the data plane). Placement keeps the weights of the moment; a backend at weight 0 takes no
//! flow whatever its averaged share.
//!
//! [`Backend::bound_share`]: balancer_common::maps::Backend::bound_share

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use balancer_common::maps::BOUND_SHARE_SCALE;

use crate::dataplane::Dataplane;

use super::tables::backend_entry;
use super::{BackendState, Balancer, BalancerError, Endpoint};

/// Longest averaging time: flows longer than this on average (or no new flow for as long)
/// leave the average moving at this pace.
pub const MAX_MEAN_FLOW: Duration = Duration::from_secs(600);
/// The mean flow duration is measured over at least this long (shorter intervals count too
/// few new flows).
const MEASURE_OVER: Duration = Duration::from_secs(1);

/// A VIP's averaged weight shares, and the mean flow duration they are averaged over.
#[derive(Clone, Debug, Default)]
pub struct BoundShares {
    /// Averaged share of its pool's weights, per backend (0..=1).
    averages: BTreeMap<IpAddr, f64>,
    /// When the averages were last brought up to date.
    aged_at: Option<Instant>,
    /// The VIP's new flows counted so far, and when they were read.
    flows_read: Option<(Instant, u64)>,
    /// The VIP's mean flow duration, as last measured (zero until measured: the averages
    /// follow the weights).
    mean_flow: Duration,
}

impl BoundShares {
    /// The mean flow duration the averages use.
    pub fn mean_flow(&self) -> Duration {
        self.mean_flow
    }

    /// Takes a reading of the VIP's counters: `new_flows` ever counted and `active` flows now.
    /// At least [`MEASURE_OVER`] after the previous reading, the mean flow duration becomes
    /// `active` over the new flows per second between them (at most [`MAX_MEAN_FLOW`]; an
    /// interval without new flows leaves it as it was).
    pub fn measure(&mut self, now: Instant, new_flows: u64, active: u64) {
        let Some((then, before)) = self.flows_read else {
            self.flows_read = Some((now, new_flows));
            return;
        };
        let elapsed = now.saturating_duration_since(then);
        if elapsed < MEASURE_OVER {
            return;
        }
        self.flows_read = Some((now, new_flows));
        // A counter that went back (maps started afresh) gives no interval.
        let Some(new) = new_flows.checked_sub(before).filter(|n| *n > 0) else {
            return;
        };
        let per_second = new as f64 / elapsed.as_secs_f64();
        let mean = active as f64 / per_second;
        self.mean_flow = Duration::from_secs_f64(mean.min(MAX_MEAN_FLOW.as_secs_f64()));
    }

    /// Brings the averages up to `now`: the shares `backends` had since the last time held
    /// all along (the weights change only through this module's callers, which age first).
    /// A backend without an average starts at `published` (its entry's share, after a
    /// restart), else at its current share; averages of backends no longer listed go.
    pub fn age(&mut self, backends: &BTreeMap<IpAddr, BackendState>, now: Instant) {
        let shares = current_shares(backends);
        // Never back in time (callers read the clock at different moments).
        let now = self.aged_at.map_or(now, |t| now.max(t));
        let elapsed = self
            .aged_at
            .map_or(Duration::ZERO, |t| now.duration_since(t));
        let kept = if elapsed.is_zero() {
            1.0
        } else if self.mean_flow.is_zero() {
            0.0
        } else {
            (-elapsed.as_secs_f64() / self.mean_flow.as_secs_f64()).exp()
        };
        self.averages.retain(|a, _| backends.contains_key(a));
        for (address, share) in &shares {
            let start = match backends[address].bound_share {
                0 => *share,
                published => f64::from(published) / f64::from(BOUND_SHARE_SCALE),
            };
            let average = self.averages.entry(*address).or_insert(start);
            *average = share + (*average - share) * kept;
        }
        self.aged_at = Some(now);
    }

    /// The value of a backend's entry: its averaged share in units of 1/[`BOUND_SHARE_SCALE`]
    /// (0 before it has one).
    pub fn published(&self, address: IpAddr) -> u16 {
        let average = self.averages.get(&address).copied().unwrap_or(0.0);
        (average.clamp(0.0, 1.0) * f64::from(BOUND_SHARE_SCALE)).round() as u16
    }
}

/// Each backend's share of its pool's weights (the pool: its priority tier, or the shared
/// pool); 0 for a backend without weight, or in a pool without any.
pub fn current_shares(backends: &BTreeMap<IpAddr, BackendState>) -> BTreeMap<IpAddr, f64> {
    let mut totals: BTreeMap<u8, u64> = BTreeMap::new();
    for b in backends.values() {
        *totals.entry(b.tier).or_default() += u64::from(b.table_weight());
    }
    backends
        .iter()
        .map(|(address, b)| {
            let total = totals[&b.tier];
            let share = if total == 0 {
                0.0
            } else {
                f64::from(b.table_weight()) / total as f64
            };
            (*address, share)
        })
        .collect()
}

impl<D: Dataplane> Balancer<D> {
    /// Ages a VIP's averaged shares to now under the weights in force: called before its
    /// weights change.
    pub(super) fn age_bound_shares(&mut self, vip: &Endpoint) {
        if let Some(state) = self.vips.get_mut(vip)
            && state.config.load_bound_pct != 0
        {
            state.bound.age(&state.backends, Instant::now());
        }
    }

    /// Ages a VIP's averaged shares to `now` and sets them in its backend states (not yet
    /// written); returns the ids whose value changed.
    pub(super) fn settle_bound_shares(&mut self, vip: &Endpoint, now: Instant) -> Vec<u32> {
        let Some(state) = self.vips.get_mut(vip) else {
            return Vec::new();
        };
        if state.config.load_bound_pct == 0 {
            return Vec::new();
        }
        state.bound.age(&state.backends, now);
        let mut changed = Vec::new();
        for (address, b) in &mut state.backends {
            let value = state.bound.published(*address);
            if b.bound_share != value {
                b.bound_share = value;
                changed.push(b.id);
            }
        }
        changed
    }

    /// Ages a VIP's averaged shares to `now` and writes the backend entries whose value moved;
    /// returns how many.
    pub(super) fn publish_bound_shares(
        &mut self,
        vip: &Endpoint,
        now: Instant,
    ) -> Result<usize, BalancerError> {
        let changed = self.settle_bound_shares(vip, now);
        let Some(state) = self.vips.get(vip) else {
            return Ok(0);
        };
        for b in state.backends.values().filter(|b| changed.contains(&b.id)) {
            self.dataplane
                .set_backend(b.id, &backend_entry(state.id, &state.config, b))?;
        }
        Ok(changed.len())
    }

    /// Once a second: measures each bounded VIP's mean flow duration, ages its averaged
    /// shares and writes the entries that moved. Returns how many entries were written.
    pub fn refresh_bound_shares(&mut self, now: Instant) -> Result<usize, BalancerError> {
        let bounded: Vec<Endpoint> = self
            .vips
            .iter()
            .filter(|(_, v)| v.config.load_bound_pct != 0)
            .map(|(e, _)| *e)
            .collect();
        let mut written = 0;
        for vip in bounded {
            let state = &self.vips[&vip];
            let ids: Vec<u32> = state.backends.values().map(|b| b.id).collect();
            let new_flows = self.dataplane.vip_stats(state.id)?.new_flows;
            let active: u64 = self.dataplane.active_flows(&ids)?.values().sum();
            let state = self.vips.get_mut(&vip).expect("listed above");
            state.bound.measure(now, new_flows, active);
            written += self.publish_bound_shares(&vip, now)?;
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(last: u8, weight: u32, tier: u8) -> (IpAddr, BackendState) {
        let address = IpAddr::from([10, 0, 0, last]);
        let state = BackendState {
            id: u32::from(last),
            address,
            weight,
            drained: false,
            healthy: true,
            policy_weight: None,
            fleet_weight: None,
            mac: crate::base::net::MacAddr([2, 0, 0, 0, 0, last]),
            generation: 1,
            tier,
            bound_share: 0,
            returning_elsewhere: false,
        };
        (address, state)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn shares_are_per_pool_and_zero_without_weight() {
        let backends: BTreeMap<_, _> = [
            backend(1, 3, 0),
            backend(2, 1, 0),
            backend(3, 0, 0),
            backend(4, 5, 1),
            backend(5, 0, 2),
        ]
        .into_iter()
        .collect();
        let shares = current_shares(&backends);
        let at = |last: u8| shares[&IpAddr::from([10, 0, 0, last])];
        assert!(close(at(1), 0.75) && close(at(2), 0.25) && close(at(3), 0.0));
        assert!(close(at(4), 1.0));
        assert!(close(at(5), 0.0), "a pool without weight");
    }

    #[test]
    fn the_mean_flow_duration_is_active_flows_over_new_flows_per_second() {
        let mut b = BoundShares::default();
        let t0 = Instant::now();
        b.measure(t0, 1_000, 40);
        assert_eq!(b.mean_flow(), Duration::ZERO, "one reading is no interval");
        b.measure(t0 + Duration::from_millis(500), 1_010, 40);
        assert_eq!(
            b.mean_flow(),
            Duration::ZERO,
            "too short an interval is skipped"
        );
        // 20 new flows in 2 s, 40 active: 4 s each.
        b.measure(t0 + Duration::from_secs(2), 1_020, 40);
        assert_eq!(b.mean_flow(), Duration::from_secs(4));
        // No new flow: the last measure stands.
        b.measure(t0 + Duration::from_secs(4), 1_020, 40);
        assert_eq!(b.mean_flow(), Duration::from_secs(4));
        // A counter that went back gives nothing either.
        b.measure(t0 + Duration::from_secs(6), 3, 40);
        assert_eq!(b.mean_flow(), Duration::from_secs(4));
        // Long flows, few new ones: capped.
        b.measure(t0 + Duration::from_secs(106), 4, 1_000_000);
        assert_eq!(b.mean_flow(), MAX_MEAN_FLOW);
    }

    #[test]
    fn averages_follow_the_weights_over_the_mean_flow_duration() {
        let mut backends: BTreeMap<_, _> =
            [backend(1, 1, 0), backend(2, 1, 0)].into_iter().collect();
        let a = IpAddr::from([10, 0, 0, 1]);
        let mut b = BoundShares::default();
        let t0 = Instant::now();
        b.age(&backends, t0);
        assert_eq!(b.published(a), (BOUND_SHARE_SCALE / 2) as u16);
        // Without a measured flow duration the averages are the shares of the moment.
        backends.get_mut(&a).unwrap().weight = 3;
        b.age(&backends, t0 + Duration::from_millis(1));
        assert_eq!(b.published(a), (BOUND_SHARE_SCALE * 3 / 4) as u16);
        // Flows of 2 s: a change of weights moves the average by 1 - e^(-t/2s).
        b.mean_flow = Duration::from_secs(2);
        let t1 = t0 + Duration::from_secs(1);
        b.age(&backends, t1);
        assert_eq!(b.published(a), (BOUND_SHARE_SCALE * 3 / 4) as u16);
        backends.get_mut(&a).unwrap().weight = 1;
        b.age(&backends, t1 + Duration::from_secs(2));
        let expected = 0.5 + 0.25 * (-1.0f64).exp();
        assert!(close(b.averages[&a], expected), "{}", b.averages[&a]);
        // A backend that leaves loses its average; one that joins starts at its share.
        backends.remove(&a);
        let (c, state) = backend(3, 1, 0);
        backends.insert(c, state);
        b.age(&backends, t1 + Duration::from_secs(3));
        assert!(!b.averages.contains_key(&a));
        assert!(close(b.averages[&c], 0.5));
    }

    #[test]
    fn a_restarted_daemon_carries_on_from_the_published_share() {
        let (a, mut state) = backend(1, 1, 0);
        state.bound_share = (BOUND_SHARE_SCALE / 4) as u16;
        let backends: BTreeMap<_, _> = [(a, state), backend(2, 1, 0)].into_iter().collect();
        let mut b = BoundShares::default();
        b.age(&backends, Instant::now());
        assert_eq!(b.published(a), (BOUND_SHARE_SCALE / 4) as u16);
    }
}
