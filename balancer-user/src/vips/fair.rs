//! Fair admission's rates: what each tenant of a VIP may open per second while its pool is
//! saturated (see `base::config::admission`).
//!
//! Each weight round reads the VIP's counters: the new flows its shared pool took and its
//! active flows (their difference is the flows the pool finished), and each tenant's new flows
//! asking admission. The pool's **capacity** is the rate at which it finishes flows, averaged
//! over [`CAPACITY_HALF_LIFE`]: while saturated the pool works flat out, so that rate is what
//! it can take; just before, it is the rate that saturated it. While saturated the tenants
//! share [`TARGET`] of it (a little less than it finishes, so a backlog drains) by max-min
//! fairness on their shares and their asked rates ([`water_fill`]): each tenant may open up
//! to the fair level for its share ([`fair_level`]; one held there gets exactly its part, one
//! asking less has room for its bursts), at least its share of the whole (so one that starts
//! asking is not held to the little it asked before), and never more than its own limit.

use std::time::{Duration, Instant};

use balancer_common::maps::ADMISSION_TIERS;

/// Tenants per VIP: the clients of no tier (0), then tiers 1..=7.
pub const TENANTS: usize = ADMISSION_TIERS as usize;

/// Half-life of the pool's averaged capacity.
pub const CAPACITY_HALF_LIFE: Duration = Duration::from_secs(3);
/// Half-life of each tenant's averaged asked rate.
pub const ASKED_HALF_LIFE: Duration = Duration::from_secs(1);
/// The share of the pool's capacity given out while it is saturated.
pub const TARGET: f64 = 0.95;
/// The least capacity assumed of a saturated pool (new flows per second): a pool that has
/// finished nothing yet still admits a trickle.
pub const MIN_CAPACITY: f64 = 1.0;

/// One reading of a VIP's counters.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// The shared pool's backend ids (a reading over other ids starts the averages afresh).
    pub pool: Vec<u32>,
    /// New flows the shared pool's backends took, ever.
    pub placed: u64,
    /// Their active flows now.
    pub active: u64,
    /// Per tenant: new flows that asked admission, ever (admitted or not).
    pub asked: [u64; TENANTS],
}

/// A VIP's fair-admission state.
#[derive(Clone, Debug, Default)]
pub struct FairState {
    last: Option<(Instant, Reading)>,
    /// The pool's capacity, new flows per second (None until measured).
    capacity: Option<f64>,
    /// Per tenant: new flows per second asking admission.
    asked: [f64; TENANTS],
}

impl FairState {
    /// Takes a reading at `now`. An interval whose counters went back (maps made afresh) or
    /// whose pool changed only starts the next one.
    pub fn observe(&mut self, now: Instant, reading: Reading) {
        let Some((then, last)) = self.last.replace((now, reading.clone())) else {
            return;
        };
        let secs = now.saturating_duration_since(then).as_secs_f64();
        if secs <= 0.0 || last.pool != reading.pool {
            return;
        }
        if let Some(placed) = reading.placed.checked_sub(last.placed) {
            // Flows finished: those placed, less those that added to the active count.
            let finished = (placed as f64 - (reading.active as f64 - last.active as f64)).max(0.0);
            let rate = finished / secs;
            self.capacity = Some(match self.capacity {
                Some(c) => average(c, rate, secs, CAPACITY_HALF_LIFE),
                None => rate,
            });
        }
        for (t, asked) in self.asked.iter_mut().enumerate() {
            if let Some(n) = reading.asked[t].checked_sub(last.asked[t]) {
                *asked = average(*asked, n as f64 / secs, secs, ASKED_HALF_LIFE);
            }
        }
    }

    /// The pool's capacity as measured, new flows per second.
    pub fn capacity(&self) -> Option<f64> {
        self.capacity
    }

    /// Each tenant's asked rate as averaged, new flows per second.
    pub fn asked(&self) -> [f64; TENANTS] {
        self.asked
    }

    /// Each tenant's rate while the pool is saturated, given their shares (0: no such
    /// tenant) and own limits.
    pub fn saturated_rates(
        &self,
        shares: &[u32; TENANTS],
        limits: &[Option<u32>; TENANTS],
    ) -> [Option<f64>; TENANTS] {
        let capacity = self.capacity.unwrap_or(0.0).max(MIN_CAPACITY) * TARGET;
        let weights = shares.map(f64::from);
        let total: f64 = weights.iter().sum();
        // A tenant's own limit caps what it asks: what it cannot take goes to the others.
        let mut demands = self.asked;
        for (d, l) in demands.iter_mut().zip(limits) {
            if let Some(l) = l {
                *d = d.min(f64::from(*l));
            }
        }
        let level = fair_level(capacity, &weights, &demands);
        let mut rates = [None; TENANTS];
        for t in 0..TENANTS {
            if shares[t] == 0 {
                continue;
            }
            // Every tenant may open up to the fair level for its share: the one held there
            // gets exactly its part, one asking for less has room for its bursts.
            let guaranteed = capacity * weights[t] / total;
            let rate = (level * weights[t]).max(guaranteed);
            rates[t] = Some(match limits[t] {
                Some(l) => rate.min(f64::from(l)),
                None => rate,
            });
        }
        rates
    }
}

/// Exponential average of `old` towards `new` over `secs` with `half_life`.
fn average(old: f64, new: f64, secs: f64, half_life: Duration) -> f64 {
    let keep = 0.5f64.powf(secs / half_life.as_secs_f64());
    old * keep + new * (1.0 - keep)
}

/// Max-min fair split of `capacity` among tenants with `weights` (0: not a tenant) asking
/// `demands`: a tenant asking for less than its weighted share of what is left gets what it
/// asks, and the rest is split among the others by weight, until every tenant has its demand
/// or the capacity is given out. The result sums to at most `capacity`.
pub fn water_fill(capacity: f64, weights: &[f64], demands: &[f64]) -> Vec<f64> {
    let n = weights.len().min(demands.len());
    let mut given = vec![0.0; weights.len()];
    let mut open: Vec<usize> = (0..n)
        .filter(|&t| weights[t] > 0.0 && demands[t] > 0.0)
        .collect();
    let mut left = capacity.max(0.0);
    while !open.is_empty() && left > 0.0 {
        let total: f64 = open.iter().map(|&t| weights[t]).sum();
        let level = left / total;
        let (met, unmet): (Vec<usize>, Vec<usize>) = open
            .iter()
            .partition(|&&t| demands[t] <= level * weights[t]);
        if met.is_empty() {
            for t in unmet {
                given[t] = level * weights[t];
            }
            break;
        }
        for t in met {
            given[t] = demands[t];
            left -= demands[t];
        }
        open = unmet;
    }
    given
}

/// The fair level of a max-min split of `capacity` ([`water_fill`]): the rate per unit of
/// weight of the tenants that get less than they ask. When every tenant asking gets all it
/// asks, the level of the one asking most per weight plus what is left spread over them; when
/// none asks, the capacity over every tenant's weight.
pub fn fair_level(capacity: f64, weights: &[f64], demands: &[f64]) -> f64 {
    let given = water_fill(capacity, weights, demands);
    let n = weights.len().min(demands.len());
    let asking: Vec<usize> = (0..n)
        .filter(|&t| weights[t] > 0.0 && demands[t] > 0.0)
        .collect();
    if let Some(&t) = asking
        .iter()
        .find(|&&t| given[t] < demands[t] * (1.0 - 1e-9))
    {
        return given[t] / weights[t];
    }
    if asking.is_empty() {
        let all: f64 = weights.iter().filter(|w| **w > 0.0).sum();
        return if all > 0.0 {
            capacity.max(0.0) / all
        } else {
            0.0
        };
    }
    let left = (capacity - given.iter().sum::<f64>()).max(0.0);
    let top = asking
        .iter()
        .map(|&t| demands[t] / weights[t])
        .fold(0.0, f64::max);
    top + left / asking.iter().map(|&t| weights[t]).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn water_fill_gives_the_small_asker_its_demand_and_splits_the_rest_by_weight() {
        // 100 to share; tenant 0 asks 10, tenants 1 (weight 1) and 2 (weight 2) ask plenty.
        let got = water_fill(100.0, &[1.0, 1.0, 2.0], &[10.0, 500.0, 500.0]);
        assert!(close(got[0], 10.0), "{got:?}");
        assert!(close(got[1], 30.0), "{got:?}");
        assert!(close(got[2], 60.0), "{got:?}");
    }

    #[test]
    fn water_fill_is_work_conserving_and_never_over_capacity() {
        // Everyone under their share: each gets its demand, the sum under capacity.
        let got = water_fill(100.0, &[1.0, 1.0], &[20.0, 30.0]);
        assert_eq!(got, vec![20.0, 30.0]);
        // One tenant asking far over its share takes what the others leave.
        let got = water_fill(100.0, &[1.0, 1.0, 1.0], &[10.0, 10.0, 1_000.0]);
        assert!(close(got[2], 80.0), "{got:?}");
        // Cascading: the second level frees more for the last.
        let got = water_fill(90.0, &[1.0, 1.0, 1.0], &[5.0, 40.0, 1_000.0]);
        assert!(
            close(got[0], 5.0) && close(got[1], 40.0) && close(got[2], 45.0),
            "{got:?}"
        );
        for (cap, w, d) in [
            (
                50.0,
                vec![3.0, 1.0, 1.0, 0.0],
                vec![100.0, 7.0, 100.0, 100.0],
            ),
            (0.0, vec![1.0, 1.0], vec![5.0, 5.0]),
            (10.0, vec![1.0, 2.0], vec![0.0, 0.0]),
        ] {
            let got = water_fill(cap, &w, &d);
            let sum: f64 = got.iter().sum();
            assert!(sum <= cap + 1e-9, "{cap} {w:?} {d:?}: {got:?}");
            for t in 0..w.len() {
                assert!(got[t] <= d[t] + 1e-9, "no more than asked: {got:?}");
                if w[t] == 0.0 {
                    assert_eq!(got[t], 0.0, "not a tenant");
                }
            }
        }
    }

    fn reading(placed: u64, active: u64, asked: [u64; TENANTS]) -> Reading {
        Reading {
            pool: vec![1, 2],
            placed,
            active,
            asked,
        }
    }

    #[test]
    fn the_capacity_is_the_rate_the_pool_finishes_flows() {
        let t0 = Instant::now();
        let mut s = FairState::default();
        s.observe(t0, reading(1_000, 50, [0; TENANTS]));
        assert_eq!(s.capacity(), None, "one reading is no interval");
        // 300 placed in 2 s, 100 more active: 200 finished, 100/s.
        s.observe(
            t0 + Duration::from_secs(2),
            reading(1_300, 150, [0; TENANTS]),
        );
        assert!(close(s.capacity().unwrap(), 100.0), "{:?}", s.capacity());
        // Counters that went back leave it as it was.
        s.observe(t0 + Duration::from_secs(3), reading(10, 150, [0; TENANTS]));
        assert!(close(s.capacity().unwrap(), 100.0));
        // A changed pool starts afresh.
        let mut other = reading(20, 150, [0; TENANTS]);
        other.pool = vec![1, 2, 3];
        s.observe(t0 + Duration::from_secs(4), other);
        assert!(close(s.capacity().unwrap(), 100.0));
    }

    #[test]
    fn a_flooding_tenant_is_held_to_what_the_others_leave() {
        let t0 = Instant::now();
        let mut s = FairState::default();
        s.observe(t0, reading(0, 0, [0; TENANTS]));
        // 100 flows/s finished; tenant 0 asks 10/s, tenant 1 asks 10/s, tenant 2 floods 500/s.
        let mut asked = [0; TENANTS];
        asked[0] = 10 * 60;
        asked[1] = 10 * 60;
        asked[2] = 500 * 60;
        s.observe(t0 + Duration::from_secs(60), reading(6_000, 0, asked));
        let mut shares = [0; TENANTS];
        shares[0] = 1;
        shares[1] = 1;
        shares[2] = 1;
        let rates = s.saturated_rates(&shares, &[None; TENANTS]);
        let cap = 100.0 * TARGET;
        // The flooder gets what the quiet tenants leave; they may burst up to the same level.
        assert!(close(rates[2].unwrap(), cap - 20.0), "{rates:?}");
        assert!(close(rates[0].unwrap(), cap - 20.0), "{rates:?}");
        assert_eq!(rates[3], None, "not a tenant");
        // With its own limit of 30/s, the flooder is held there.
        let mut limits = [None; TENANTS];
        limits[2] = Some(30);
        let rates = s.saturated_rates(&shares, &limits);
        assert!(close(rates[2].unwrap(), 30.0), "{rates:?}");
    }

    #[test]
    fn the_fair_level_is_what_the_held_tenants_get_per_weight() {
        // Tenant 2 (weight 2) is held at 60: level 30.
        assert!(close(
            fair_level(100.0, &[1.0, 1.0, 2.0], &[10.0, 500.0, 500.0]),
            30.0
        ));
        // Everyone satisfied: the top demand per weight (20) plus the 50 left over 2.
        assert!(close(fair_level(100.0, &[1.0, 1.0], &[20.0, 30.0]), 55.0));
        // Nobody asking: the capacity over every weight.
        assert!(close(
            fair_level(90.0, &[1.0, 2.0, 0.0], &[0.0, 0.0, 5.0]),
            30.0
        ));
        assert_eq!(fair_level(90.0, &[0.0], &[0.0]), 0.0);
    }

    #[test]
    fn an_unmeasured_pool_still_admits_a_trickle_by_share() {
        let s = FairState::default();
        let mut shares = [0; TENANTS];
        shares[0] = 1;
        shares[1] = 3;
        let rates = s.saturated_rates(&shares, &[None; TENANTS]);
        assert!(
            close(rates[0].unwrap(), MIN_CAPACITY * TARGET / 4.0),
            "{rates:?}"
        );
        assert!(
            close(rates[1].unwrap(), MIN_CAPACITY * TARGET * 0.75),
            "{rates:?}"
        );
    }
}
