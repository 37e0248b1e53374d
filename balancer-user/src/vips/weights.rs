//! Weight changes that need no new config: the policy's weights, the fleet leader's, health
//! verdicts, and the end of removed backends' grace periods.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use balancer_common::maglev;

use crate::dataplane::Dataplane;

use super::tables::{backend_entry, build_tier_tables};
use super::{ApplyReport, Balancer, BalancerError, Endpoint};

impl<D: Dataplane> Balancer<D> {
    /// Sets the weights a telemetry policy computed for a VIP's backends (in place of their
    /// configured weights) and republishes its table if they changed the table. Backends not
    /// listed keep theirs.
    pub fn set_policy_weights(
        &mut self,
        vip: &Endpoint,
        weights: &[(IpAddr, u32)],
    ) -> Result<ApplyReport, BalancerError> {
        let mut report = ApplyReport::default();
        // The averaged shares take in the weights in force until now.
        self.age_bound_shares(vip);
        let Some(state) = self.vips.get_mut(vip) else {
            return Ok(report);
        };
        let mut changed = false;
        for (address, weight) in weights {
            if let Some(b) = state.backends.get_mut(address)
                && b.policy_weight != Some(*weight)
            {
                let before = b.table_weight();
                b.policy_weight = Some(*weight);
                changed |= before != b.table_weight();
            }
        }
        if !changed {
            return Ok(report);
        }
        self.build_time = Duration::ZERO;
        self.publish_time = Duration::ZERO;
        self.rebuild_weights(vip, &mut report)?;
        report.table_build_time = self.build_time;
        report.table_publish_time = self.publish_time;
        report.live_at = self.dataplane.swap_started();
        Ok(report)
    }

    /// Sets which of a VIP's backends a telemetry policy expects to serve their returning
    /// clients more slowly than another would (see
    /// [`crate::steering::policy::Decision::returning_elsewhere`]) and writes the entries that change;
    /// backends not listed keep theirs. Only a VIP with session persistence writes the flag
    /// (others have no returning clients). Returns how many entries were written.
    pub fn set_returning_elsewhere(
        &mut self,
        vip: &Endpoint,
        verdicts: &[(IpAddr, bool)],
    ) -> Result<usize, BalancerError> {
        let Some(state) = self.vips.get_mut(vip) else {
            return Ok(0);
        };
        let persistent = !state.config.persistence.is_zero();
        let mut changed = Vec::new();
        for (address, elsewhere) in verdicts {
            let elsewhere = *elsewhere && persistent;
            if let Some(b) = state.backends.get_mut(address)
                && b.returning_elsewhere != elsewhere
            {
                b.returning_elsewhere = elsewhere;
                changed.push(*address);
            }
        }
        let state = &self.vips[vip];
        for address in &changed {
            let b = &state.backends[address];
            self.dataplane
                .set_backend(b.id, &backend_entry(state.id, &state.config, b))?;
        }
        Ok(changed.len())
    }

    /// Sets the weights a fleet's leader published (VIP name → backend → weight) in place of
    /// every local one, or with `None` returns every VIP to its local weights. A VIP the
    /// published state does not name keeps its local weights; a backend it does not list gets
    /// weight 0. Republishes the tables that change.
    pub fn set_fleet_weights(
        &mut self,
        published: Option<&BTreeMap<String, BTreeMap<IpAddr, u32>>>,
    ) -> Result<ApplyReport, BalancerError> {
        let mut report = ApplyReport::default();
        self.build_time = Duration::ZERO;
        self.publish_time = Duration::ZERO;
        let endpoints: Vec<Endpoint> = self.vips.keys().copied().collect();
        for vip in endpoints {
            self.age_bound_shares(&vip);
            let state = self.vips.get_mut(&vip).expect("listed above");
            let weights = published.and_then(|p| p.get(&state.config.name));
            let mut changed = false;
            for b in state.backends.values_mut() {
                let fleet = weights.map(|w| w.get(&b.address).copied().unwrap_or(0));
                if b.fleet_weight != fleet {
                    let before = b.table_weight();
                    b.fleet_weight = fleet;
                    changed |= before != b.table_weight();
                }
            }
            if changed {
                self.rebuild_weights(&vip, &mut report)?;
            }
        }
        report.table_build_time = self.build_time;
        report.table_publish_time = self.publish_time;
        report.live_at = self.dataplane.swap_started();
        Ok(report)
    }

    /// Rebuilds and publishes one VIP's tables after its backends' weights changed, then
    /// updates the backends' entries (their weights for the connection-aware schedulers).
    pub(super) fn rebuild_weights(
        &mut self,
        vip: &Endpoint,
        report: &mut ApplyReport,
    ) -> Result<(), BalancerError> {
        let state = &self.vips[vip];
        let config = state.config.clone();
        let backends = state.backends.clone();
        let (table, fingerprint) = self.build(&config.name, config.table_size, &backends)?;
        let tier_tables = build_tier_tables(&config.name, config.table_size, &backends)?;
        let id = self.vips[vip].id;
        let state = self.vips.get_mut(vip).expect("checked above");
        report.slots_changed = maglev::slots_changed(&state.table, &table);
        state.table = table;
        state.fingerprint = fingerprint;
        state.tier_tables = tier_tables;
        let published = state.published();
        let started = Instant::now();
        self.dataplane.publish_tables(&[(id, &published)])?;
        self.publish_time += started.elapsed();
        report.tables_published += 1;
        report.rebuilt.push(config.name.clone());
        report.vips_updated += 1;
        // Their weights for the connection-aware schedulers and their averaged shares for
        // bounded load, once the table is live.
        self.settle_bound_shares(vip, Instant::now());
        for b in self.vips[vip].backends.values() {
            self.dataplane
                .set_backend(b.id, &backend_entry(id, &config, b))?;
        }
        Ok(())
    }

    /// Records a backend's health and, when it changed, rebuilds its VIP's table: an
    /// unhealthy backend leaves the table and is made inactive (its flows are re-hashed); a
    /// recovered one returns. Returns whether anything changed.
    pub fn set_health(
        &mut self,
        vip: &Endpoint,
        backend: IpAddr,
        healthy: bool,
    ) -> Result<bool, BalancerError> {
        let key = (*vip, backend);
        let changed = if healthy {
            self.unhealthy.remove(&key)
        } else {
            self.unhealthy.insert(key)
        };
        let Some(state) = self.vips.get(vip) else {
            return Ok(changed);
        };
        if !changed || !state.backends.contains_key(&backend) {
            return Ok(changed);
        }
        let config = state.config.clone();
        let mut report = ApplyReport::default();
        if let Some(stage) = self.stage_vip(vip, &config, &HashMap::new())? {
            self.commit(vec![stage], &mut report)?;
        }
        tracing::info!(vip = %config.name, %backend, healthy, "backend health changed");
        Ok(true)
    }

    /// Deactivates retiring backends whose grace period ended by `now` (their remaining flows
    /// are re-hashed). Returns how many.
    pub fn expire_retired(&mut self, now: Instant) -> Result<usize, BalancerError> {
        let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring)
            .into_iter()
            .partition(|r| r.until <= now);
        self.retiring = kept;
        for r in &expired {
            self.retire_backend(&r.state)?;
            tracing::info!(backend = %r.state.address, vip = %format!("{}/{}", std::net::SocketAddr::new(r.vip.0, r.vip.1), r.vip.2), "removed backend's grace period over; its remaining flows are re-hashed");
        }
        Ok(expired.len())
    }
}
