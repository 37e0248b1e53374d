//! Admission control as the data plane gets it: each VIP's entry (refusal, admitted tiers and
//! their caps, overflow tier, and whether the pool is saturated), written when the config or
//! the saturation changes.

use std::time::{Duration, Instant};

use balancer_common::maps::{
    ADMISSION_SATURATED, ADMISSION_TENANTS, Admission, FairAdmission, REFUSE_DROP, REFUSE_RESET,
};

use crate::base::config::{AdmissionConfig, Refusal, VipConfig};
use crate::dataplane::{AdmissionCounts, Dataplane};

use super::fair::{FairState, Reading, TENANTS};
use super::{Balancer, BalancerError, Endpoint};

/// How far ahead of its rate a tenant may open new flows in fair admission (its burst: half
/// a second's worth).
pub const FAIR_BURST: Duration = Duration::from_millis(500);

/// Nanoseconds per flow at `rate` flows per second (at least 1: 0 means no limit).
fn interval_ns(rate: f64) -> u64 {
    if rate <= 0.0 {
        // No rate at all: one flow a day.
        return 86_400_000_000_000;
    }
    (1e9 / rate).round().clamp(1.0, 86_400_000_000_000.0) as u64
}

/// A VIP's tenants in fair admission: per tier id, its share (0: no tenant) and its own limit.
pub type Tenants = ([u32; TENANTS], [Option<u32>; TENANTS]);

impl<D: Dataplane> Balancer<D> {
    /// The tenants of fair admission `a`: the clients of no tier, and each tier with clients.
    pub fn tenants(&self, a: &AdmissionConfig) -> Tenants {
        let mut shares = [0; TENANTS];
        let mut limits = [None; TENANTS];
        shares[0] = a.default_share;
        for t in &self.tiers {
            let i = usize::from(t.id);
            if i < TENANTS && (!t.prefixes.is_empty() || !t.dscp.is_empty()) {
                shares[i] = t.share;
                limits[i] = t.max_new_flows_per_sec;
            }
        }
        (shares, limits)
    }

    /// Each tenant's rate in VIP `id`'s fair admission now (None: no limit): its fair share
    /// while the pool is saturated, its own limit at all times.
    pub fn fair_rates(
        &self,
        id: u32,
        a: &AdmissionConfig,
        saturated: bool,
    ) -> [Option<f64>; TENANTS] {
        let (shares, limits) = self.tenants(a);
        if saturated {
            match self.fair.get(&id) {
                Some(state) => state.saturated_rates(&shares, &limits),
                None => FairState::default().saturated_rates(&shares, &limits),
            }
        } else {
            limits.map(|l| l.map(f64::from))
        }
    }

    /// VIP `id`'s fair-admission measurements (None: no fair admission, or no round yet).
    pub fn fair_state(&self, id: u32) -> Option<&FairState> {
        self.fair.get(&id)
    }

    /// The data plane's admission entry of `config` (all zero without admission control: every
    /// flow admitted), and its fair-admission entry (all zero without fair admission).
    pub(super) fn admission_entry(
        &self,
        id: u32,
        config: &VipConfig,
        saturated: bool,
    ) -> (Admission, FairAdmission) {
        let Some(a) = &config.admission else {
            return Default::default();
        };
        let mut entry = Admission {
            saturated: if saturated { ADMISSION_SATURATED } else { 0 },
            refuse: match a.refuse {
                Refusal::Reset => REFUSE_RESET,
                Refusal::Drop => REFUSE_DROP,
            },
            admit: 0,
            overflow_tier: self.tier_id(a.overflow.as_deref()),
            caps: [0; 8],
        };
        if a.fair {
            let rates = self.fair_rates(id, a, saturated);
            let mut fair = FairAdmission {
                burst_ns: FAIR_BURST.as_nanos() as u64,
                ..FairAdmission::default()
            };
            for (t, rate) in rates.iter().enumerate() {
                fair.intervals_ns[t] = rate.map_or(0, interval_ns);
            }
            // Every new flow is judged by its tenant, open or saturated: what each asks is
            // then known when the pool saturates.
            entry.saturated |= ADMISSION_TENANTS;
            return (entry, fair);
        }
        for (tier, cap) in &a.admit {
            let id = self.tier_id(Some(tier));
            if id != 0 {
                entry.admit |= 1 << id;
                entry.caps[usize::from(id)] = *cap;
            }
        }
        (entry, FairAdmission::default())
    }

    /// Writes VIP `id`'s admission entry if it differs from the one written.
    pub(super) fn write_admission(
        &mut self,
        id: u32,
        config: &VipConfig,
        saturated: bool,
    ) -> Result<(), BalancerError> {
        let (entry, fair) = self.admission_entry(id, config, saturated);
        // The rates first: the admission entry is what makes the program read them. (A VIP
        // without fair admission never has its entry read: nothing to write.)
        if self.fair_written.get(&id).copied().unwrap_or_default() != fair {
            self.dataplane.set_fair(id, &fair)?;
            self.fair_written.insert(id, fair);
        }
        if self.admission_written.get(&id) != Some(&entry) {
            self.dataplane.set_admission(id, &entry)?;
            self.admission_written.insert(id, entry);
        }
        Ok(())
    }

    /// Publishes whether a VIP's shared pool is saturated (every eligible backend over its
    /// policy's cut-off): while it is, admission control admits only the VIP's admitted tiers.
    /// Ignored for a VIP without admission control. Returns whether it changed.
    pub fn set_saturated(
        &mut self,
        vip: &Endpoint,
        saturated: bool,
    ) -> Result<bool, BalancerError> {
        let Some(state) = self.vips.get(vip) else {
            return Ok(false);
        };
        let saturated = saturated && state.config.admission.is_some();
        if state.saturated == saturated {
            return Ok(false);
        }
        let (id, config) = (state.id, state.config.clone());
        self.write_admission(id, &config, saturated)?;
        if let Some(state) = self.vips.get_mut(vip) {
            state.saturated = saturated;
        }
        if saturated {
            let admitted: Vec<&str> = config
                .admission
                .iter()
                .flat_map(|a| a.admit.keys().map(String::as_str))
                .collect();
            tracing::warn!(vip = %config.name, admitted = ?admitted, "pool saturated: admitting new flows of the admitted tiers only");
        } else {
            tracing::info!(vip = %config.name, "pool no longer saturated: admitting every new flow");
        }
        Ok(true)
    }

    /// One round of a VIP's fair admission at `now`: reads what its pool finished and what
    /// each tenant asked, and writes the tenants' rates. Nothing for a VIP without fair
    /// admission.
    pub fn fair_round(&mut self, vip: &Endpoint, now: Instant) -> Result<(), BalancerError> {
        let Some(state) = self.vips.get(vip) else {
            return Ok(());
        };
        if !state.config.admission.as_ref().is_some_and(|a| a.fair) {
            let id = state.id;
            self.fair.remove(&id);
            return Ok(());
        }
        let (id, saturated, config) = (state.id, state.saturated, state.config.clone());
        let pool: Vec<u32> = state
            .backends
            .values()
            .filter(|b| b.tier == 0)
            .map(|b| b.id)
            .collect();
        let placed = self
            .dataplane
            .backends_stats(&pool)?
            .iter()
            .map(|s| s.new_flows)
            .sum();
        let active = self.dataplane.active_flows(&pool)?.values().sum();
        let counts = self.dataplane.admission_stats(id)?;
        let asked = counts.map(|c| c.admitted + c.shed_saturated + c.shed_over_cap);
        let state = self.fair.entry(id).or_default();
        state.observe(
            now,
            Reading {
                pool,
                placed,
                active,
                asked,
            },
        );
        tracing::debug!(
            vip = %config.name,
            placed,
            active,
            saturated,
            capacity = ?state.capacity(),
            asked = ?state.asked(),
            "fair admission round"
        );
        self.write_admission(id, &config, saturated)
    }

    /// A VIP's admission counters per client tier (index 0: clients of no tier).
    pub fn admission_counts(&self, vip_id: u32) -> Result<AdmissionCounts, BalancerError> {
        Ok(self.dataplane.admission_stats(vip_id)?)
    }
}
