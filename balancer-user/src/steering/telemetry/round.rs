//! One weight round of a VIP: its backends' latest reports and active flows go through the
//! VIP's policy, and the resulting weights go into its Maglev table (republished only when they
//! change it); for a VIP with admission control, whether its pool is saturated goes to the
//! data plane (and, in fair admission, each tenant's rate). Shared by the daemon and the benchmark that times it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

use super::store::TelemetryStore;
use crate::base::config::VipConfig;
use crate::dataplane::Dataplane;
use crate::steering::policy::{
    Decision, Input, PolicyKind, PolicyState, capacities, decide, pool_saturated,
};
use crate::vips::{ApplyReport, Balancer, BalancerError};

/// What a round decided and what publishing it did.
#[derive(Debug, Default)]
pub struct RoundOutcome {
    pub decisions: Vec<Decision>,
    /// Empty (nothing published) for static policies and unchanged tables.
    pub report: ApplyReport,
}

/// Runs one round for `vip` at `now`. `flows` holds active flows per backend id.
pub fn weight_round<D: Dataplane>(
    vip: &VipConfig,
    balancer: &mut Balancer<D>,
    store: &TelemetryStore,
    flows: &HashMap<u32, u64>,
    policy: &mut PolicyState,
    now: Instant,
) -> Result<RoundOutcome, BalancerError> {
    let endpoint = vip.endpoint();
    let Some(state) = balancer.vip(&vip.name) else {
        return Ok(RoundOutcome::default());
    };
    let inputs: Vec<Input> = vip
        .backends
        .iter()
        .map(|b| {
            let t = store.get(&endpoint, b.address);
            Input {
                address: b.address,
                configured: b.weight,
                signals: t.and_then(|t| t.latest.as_ref().map(|(s, _)| s.clone())),
                age: t.and_then(|t| t.age(now)),
                flows: state
                    .backends
                    .get(&b.address)
                    .and_then(|s| flows.get(&s.id).copied())
                    .unwrap_or(0),
            }
        })
        .collect();
    // Admission control watches the shared pool: the backends that may take its new flows.
    let eligible: std::collections::HashSet<IpAddr> = state
        .backends
        .values()
        .filter(|b| b.tier == 0 && b.healthy && !b.drained && b.weight > 0)
        .map(|b| b.address)
        .collect();
    let decisions = decide(&vip.policy, &inputs, policy);
    if vip.policy.kind == PolicyKind::Static {
        return Ok(RoundOutcome {
            decisions,
            report: ApplyReport::default(),
        });
    }
    let weights: Vec<(IpAddr, u32)> = decisions.iter().map(|d| (d.address, d.weight)).collect();
    let report = balancer.set_policy_weights(&endpoint, &weights)?;
    let returning: Vec<(IpAddr, bool)> = decisions
        .iter()
        .map(|d| (d.address, d.returning_elsewhere))
        .collect();
    balancer.set_returning_elsewhere(&endpoint, &returning)?;
    // Written with or without persistence: a VIP whose persistence is switched on has them at
    // once (while unknown, the data plane leaves a new client to the scheduler's pick).
    balancer.set_home_capacities(&endpoint, &capacities(&inputs, vip.policy.max_ratio))?;
    if vip.admission.is_some() {
        let saturated = pool_saturated(&decisions, |a| eligible.contains(&a));
        balancer.set_saturated(&endpoint, saturated)?;
        balancer.fair_round(&endpoint, now)?;
    }
    Ok(RoundOutcome { decisions, report })
}
