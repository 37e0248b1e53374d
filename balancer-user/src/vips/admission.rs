//! Admission control as the data plane gets it: each VIP's entry (refusal, admitted tiers and
//! their caps, overflow tier, and whether the pool is saturated), written when the config or
//! the saturation changes.

use balancer_common::maps::{Admission, REFUSE_DROP, REFUSE_RESET};

use crate::base::config::{Refusal, VipConfig};
use crate::dataplane::{AdmissionCounts, Dataplane};

use super::{Balancer, BalancerError, Endpoint};

impl<D: Dataplane> Balancer<D> {
    /// The data plane's admission entry of `config` (all zero without admission control: every
    /// flow admitted).
    pub(super) fn admission_entry(&self, config: &VipConfig, saturated: bool) -> Admission {
        let Some(a) = &config.admission else {
            return Admission::default();
        };
        let mut entry = Admission {
            saturated: u8::from(saturated),
            refuse: match a.refuse {
                Refusal::Reset => REFUSE_RESET,
                Refusal::Drop => REFUSE_DROP,
            },
            admit: 0,
            overflow_tier: self.tier_id(a.overflow.as_deref()),
            caps: [0; 8],
        };
        for (tier, cap) in &a.admit {
            let id = self.tier_id(Some(tier));
            if id != 0 {
                entry.admit |= 1 << id;
                entry.caps[usize::from(id)] = *cap;
            }
        }
        entry
    }

    /// Writes VIP `id`'s admission entry if it differs from the one written.
    pub(super) fn write_admission(
        &mut self,
        id: u32,
        config: &VipConfig,
        saturated: bool,
    ) -> Result<(), BalancerError> {
        let entry = self.admission_entry(config, saturated);
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

    /// A VIP's admission counters per client tier (index 0: clients of no tier).
    pub fn admission_counts(&self, vip_id: u32) -> Result<AdmissionCounts, BalancerError> {
        Ok(self.dataplane.admission_stats(vip_id)?)
    }
}
