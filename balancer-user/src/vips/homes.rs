//! Session persistence's count of the clients each backend homes now (what spreads a VIP's few
//! heavy clients by capacity, see `balancer_common::schedule::spread_over`): the data plane adds
//! one at each new client's placement and a share of one each flow-clock tick a client returns
//! (`home_refresh`); the daemon ages the counts once a second over a quarter of the VIP's
//! persistence time (`HOME_FADE_PARTS`), so that a client that keeps returning counts about one
//! and one gone fades within that time; and each backend's capacity, which the clients are
//! spread by, written from the VIP's weight rounds.

use std::collections::HashMap;
use std::net::IpAddr;

use balancer_common::{
    maps::HOME_CAPACITY_SCALE,
    schedule::{HOME_UNIT, home_fade_secs},
};

use super::{Balancer, BalancerError, Endpoint};
use crate::base::config::PolicyKind;
use crate::dataplane::Dataplane;

/// A backend's entry for session persistence's spreading, as an operator reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HomeReading {
    /// The clients it homes now (placed, or returning within about a quarter of the VIP's
    /// persistence time).
    pub clients: f64,
    /// The capacity the clients are spread by: 1.0 is a mean backend of weight 1 (`None`
    /// while none is written: the data plane then leaves a new client to the scheduler's
    /// pick).
    pub capacity: Option<f64>,
}

impl<D: Dataplane> Balancer<D> {
    /// Under session persistence, per backend address of `vip`: the clients it homes now and
    /// its capacity. Empty for a VIP without persistence or not known.
    pub fn homes(&self, vip: &Endpoint) -> Result<HashMap<IpAddr, HomeReading>, BalancerError> {
        let Some(state) = self.vips.get(vip) else {
            return Ok(HashMap::new());
        };
        if state.config.persistence.is_zero() {
            return Ok(HashMap::new());
        }
        let ids: Vec<u32> = state.backends.values().map(|b| b.id).collect();
        let entries = self.dataplane.homes(&ids)?;
        Ok(state
            .backends
            .values()
            .map(|b| {
                let home = entries.get(&b.id).copied().unwrap_or_default();
                let reading = HomeReading {
                    clients: home.homed as f64 / HOME_UNIT as f64,
                    capacity: (home.capacity != 0)
                        .then(|| f64::from(home.capacity) / f64::from(HOME_CAPACITY_SCALE)),
                };
                (b.address, reading)
            })
            .collect())
    }

    /// Once a second: each persistent VIP's backends' counts lose 1/fade time (a quarter of the
    /// persistence time, in seconds, see `home_fade_secs`) of themselves, and a VIP's without
    /// persistence are cleared; a VIP with a static policy (no weight rounds) has its configured
    /// weights written as the capacities. Returns the VIPs aged.
    pub fn age_homes(&mut self) -> Result<usize, BalancerError> {
        let (persistent, without): (Vec<Endpoint>, Vec<Endpoint>) = self
            .vips
            .keys()
            .partition(|e| !self.vips[*e].config.persistence.is_zero());
        for vip in &without {
            // Persistence off: what its clients counted goes at once (switched on again, the
            // placements start from none, not from counts kept frozen meanwhile).
            let ids: Vec<u32> = self.vips[vip].backends.values().map(|b| b.id).collect();
            self.dataplane.age_homes(&ids, 1)?;
        }
        for vip in &persistent {
            let state = &self.vips[vip];
            let ids: Vec<u32> = state.backends.values().map(|b| b.id).collect();
            let divisor = home_fade_secs(state.config.persistence.as_secs());
            self.dataplane.age_homes(&ids, divisor)?;
            if state.config.policy.kind == PolicyKind::Static {
                // No weight rounds: the configured weights are the capacities.
                let configured: Vec<(IpAddr, f64)> = state
                    .backends
                    .values()
                    .map(|b| (b.address, f64::from(b.weight)))
                    .collect();
                self.set_home_capacities(vip, &configured)?;
            }
        }
        Ok(persistent.len())
    }

    /// Writes the capacities of `vip`'s backends (relative: 1.0 is a mean backend of weight 1,
    /// see `policy::capacities`) for session persistence's spreading — with or without
    /// persistence, so that a VIP whose persistence is switched on has them at once; nothing
    /// for addresses that are not its backends. Returns the entries written.
    pub fn set_home_capacities(
        &mut self,
        vip: &Endpoint,
        capacities: &[(IpAddr, f64)],
    ) -> Result<usize, BalancerError> {
        let Some(state) = self.vips.get(vip) else {
            return Ok(0);
        };
        let entries: Vec<(u32, u32)> = capacities
            .iter()
            .filter_map(|(address, capacity)| {
                let id = state.backends.get(address)?.id;
                let scaled = (capacity * f64::from(HOME_CAPACITY_SCALE)).round();
                Some((id, scaled.clamp(1.0, f64::from(u32::MAX)) as u32))
            })
            .collect();
        self.dataplane.set_home_capacities(&entries)?;
        Ok(entries.len())
    }
}
