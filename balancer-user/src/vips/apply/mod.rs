//! Applying a config: VIPs and backends staged, written and published in the order that
//! keeps every packet on a whole state (see the ordering rules of [`super`]).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

mod stage;

use balancer_common::maglev;
use balancer_common::maps::{Backend, MAX_BACKENDS, MAX_VIPS, VipKey, VipMeta};

use crate::base::config::{BackendConfig, VipConfig};
use crate::base::net::MacAddr;
use crate::dataplane::Dataplane;

use super::tables::{backend_entry, build_tier_tables, vip_key, vip_meta};
use super::{
    ApplyReport, BackendState, Balancer, BalancerError, Endpoint, RetiringBackend, VipState,
};

/// What `apply` will change for one VIP, prepared before anything becomes visible.
pub(super) struct StagedVip {
    endpoint: Endpoint,
    is_new: bool,
    added: usize,
    retired: Vec<BackendState>,
    /// Backends that failed their health checks: made inactive once the table is live.
    deactivate: Vec<BackendState>,
    /// Backends whose weight changed: rewritten once the table is live.
    reweighted: Vec<BackendState>,
    meta_changed: bool,
    shrinks: bool,
    table_changed: bool,
    slots_changed: usize,
    state: VipState,
}

/// The VIP-index value of an address marker.
pub(super) fn address_marker() -> VipMeta {
    VipMeta {
        vip_id: u32::MAX,
        ..VipMeta::default()
    }
}

impl<D: Dataplane> Balancer<D> {
    /// Makes the kernel state match `vips`. `macs` gives each backend's next-hop MAC (a
    /// backend's own `mac` setting wins). Everything that can be checked is checked before
    /// the first kernel write.
    pub fn apply(
        &mut self,
        vips: &[VipConfig],
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<ApplyReport, BalancerError> {
        let mut report = ApplyReport::default();
        let desired: BTreeMap<Endpoint, &VipConfig> =
            vips.iter().map(|v| (v.endpoint(), v)).collect();

        // Check: MACs known, ids available, tables buildable (with placeholder ids).
        for vip in vips {
            let current = self.vips.get(&vip.endpoint());
            for b in &vip.backends {
                let known = current.is_some_and(|c| c.backends.contains_key(&b.address));
                if b.mac.is_none() && !macs.contains_key(&b.address) && !known {
                    return Err(BalancerError::NoMac {
                        vip: vip.name.clone(),
                        backend: b.address,
                    });
                }
            }
        }
        let new_vips = desired
            .keys()
            .filter(|e| !self.vips.contains_key(e))
            .count();
        if new_vips > self.vip_ids.available() {
            return Err(BalancerError::IdsExhausted {
                what: "VIP",
                max: MAX_VIPS,
            });
        }
        let kept_backends: usize = self
            .vips
            .iter()
            .filter(|(e, _)| desired.contains_key(e))
            .map(|(_, v)| v.backends.len())
            .sum();
        let wanted_backends: usize = vips.iter().map(|v| v.backends.len()).sum();
        let freed_backends: usize =
            self.vips.values().map(|v| v.backends.len()).sum::<usize>() - kept_backends;
        if wanted_backends > self.backend_ids.available() + kept_backends + freed_backends {
            return Err(BalancerError::IdsExhausted {
                what: "backend",
                max: MAX_BACKENDS,
            });
        }

        // Removed VIPs go first (one index swap), freeing ids for the rest.
        let gone: Vec<Endpoint> = self
            .vips
            .keys()
            .filter(|e| !desired.contains_key(e))
            .copied()
            .collect();
        if !gone.is_empty() {
            self.remove_vips(&gone)?;
            report.vips_removed = gone.len();
        }

        self.build_time = Duration::ZERO;
        self.publish_time = Duration::ZERO;
        let mut staged = Vec::new();
        for (endpoint, config) in &desired {
            if let Some(stage) = self.stage_vip(endpoint, config, macs)? {
                staged.push(stage);
            }
        }
        report.vips_added = staged.iter().filter(|s| s.is_new).count();
        report.vips_updated = staged.len() - report.vips_added;
        self.commit(staged, &mut report)?;
        report.table_build_time = self.build_time;
        report.table_publish_time = self.publish_time;
        Ok(report)
    }

    pub(super) fn next_generation(&mut self) -> u32 {
        let g = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        g
    }

    pub(super) fn new_backend(
        &mut self,
        vip_id: u32,
        vip: &VipConfig,
        config: &BackendConfig,
        mac: MacAddr,
        healthy: bool,
    ) -> Result<BackendState, BalancerError> {
        let id = self.backend_ids.take().ok_or(BalancerError::IdsExhausted {
            what: "backend",
            max: MAX_BACKENDS,
        })?;
        let state = BackendState {
            id,
            address: config.address,
            weight: config.weight,
            drained: config.drained,
            healthy,
            policy_weight: None,
            fleet_weight: None,
            mac,
            generation: self.next_generation(),
            tier: self.tier_id(config.tier.as_deref()),
            bound_share: 0,
            returning_elsewhere: false,
        };
        // A fresh id counts no active flows (its previous holder's may linger).
        let written = self.dataplane.reset_active(id).and_then(|()| {
            self.dataplane
                .set_backend(id, &backend_entry(vip_id, vip, &state))
        });
        if let Err(e) = written {
            self.backend_ids.give_back(id);
            tracing::error!(vip = %vip.name, backend = %config.address, "writing backend failed: {e}");
            return Err(e.into());
        }
        Ok(state)
    }

    pub(super) fn take_retiring(
        &mut self,
        endpoint: &Endpoint,
        address: IpAddr,
    ) -> Option<BackendState> {
        let at = self
            .retiring
            .iter()
            .position(|r| r.vip == *endpoint && r.state.address == address)?;
        Some(self.retiring.swap_remove(at).state)
    }

    pub(super) fn retire_backend(&mut self, b: &BackendState) -> Result<(), BalancerError> {
        // Inactive: flows pinned to it are re-hashed on their next packet.
        self.dataplane.set_backend(b.id, &Backend::default())?;
        self.backend_ids.give_back(b.id);
        Ok(())
    }

    pub(super) fn mac_of(
        vip: &VipConfig,
        address: IpAddr,
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<MacAddr, BalancerError> {
        vip.backends
            .iter()
            .find(|b| b.address == address)
            .and_then(|b| b.mac)
            .or_else(|| macs.get(&address).copied())
            .ok_or(BalancerError::NoMac {
                vip: vip.name.clone(),
                backend: address,
            })
    }

    /// Makes staged VIPs visible, in an order no packet can catch half-done, with one atomic
    /// swap per kind of change: shrinking metas, then all new tables, then the VIP index (new
    /// VIPs, changed metas, new address markers), then the removed backends retire.
    pub(super) fn commit(
        &mut self,
        staged: Vec<StagedVip>,
        report: &mut ApplyReport,
    ) -> Result<(), BalancerError> {
        let key_of = |s: &StagedVip| {
            let c = &s.state.config;
            vip_key(c.address, c.port, c.protocol.number())
        };
        let shrinking: Vec<(VipKey, VipMeta)> = staged
            .iter()
            .filter(|s| s.shrinks)
            .map(|s| (key_of(s), vip_meta(s.state.id, &s.state.config)))
            .collect();
        if !shrinking.is_empty() {
            // A smaller table size goes first: the old (larger) table still covers it.
            self.dataplane.set_vips(&shrinking, &[])?;
        }
        let published: Vec<(u32, Vec<u32>)> = staged
            .iter()
            .filter(|s| s.table_changed)
            .map(|s| (s.state.id, s.state.published()))
            .collect();
        let tables: Vec<(u32, &[u32])> = published
            .iter()
            .map(|(id, t)| (*id, t.as_slice()))
            .collect();
        if !tables.is_empty() {
            let started = Instant::now();
            self.dataplane.publish_tables(&tables)?;
            self.publish_time += started.elapsed();
        }
        let mut upserts: Vec<(VipKey, VipMeta)> = staged
            .iter()
            .filter(|s| s.meta_changed && !s.shrinks)
            .map(|s| (key_of(s), vip_meta(s.state.id, &s.state.config)))
            .collect();
        for s in staged.iter().filter(|s| s.is_new) {
            let users = self
                .address_users
                .entry(s.state.config.address)
                .or_insert(0);
            *users += 1;
            if *users == 1 {
                upserts.push((vip_key(s.state.config.address, 0, 0), address_marker()));
            }
        }
        if !upserts.is_empty() {
            self.dataplane.set_vips(&upserts, &[])?;
        }
        for s in staged {
            self.finish_vip(s, report)?;
        }
        Ok(())
    }

    /// After the swaps: a staged VIP's deactivated and reweighted backends written, its removed
    /// ones retired (now, or after the removal grace), and its state kept.
    fn finish_vip(&mut self, s: StagedVip, report: &mut ApplyReport) -> Result<(), BalancerError> {
        let until = Instant::now() + self.removal_grace;
        report.tables_published += usize::from(s.table_changed);
        report.slots_changed += s.slots_changed;
        if s.table_changed {
            report.rebuilt.push(s.state.config.name.clone());
        }
        for b in s.deactivate.iter().chain(&s.reweighted) {
            self.dataplane
                .set_backend(b.id, &backend_entry(s.state.id, &s.state.config, b))?;
        }
        for b in &s.retired {
            if self.removal_grace.is_zero() {
                self.retire_backend(b)?;
            } else {
                self.retiring.push(RetiringBackend {
                    vip: s.endpoint,
                    state: b.clone(),
                    until,
                });
            }
        }
        let c = &s.state.config;
        if s.is_new {
            tracing::info!(
                vip = %c.name,
                endpoint = %format!("{}/{}", std::net::SocketAddr::new(c.address, c.port), c.protocol),
                backends = s.state.backends.len(),
                forwarding = %c.forwarding,
                "VIP added"
            );
        } else {
            tracing::info!(
                vip = %c.name,
                backends = s.state.backends.len(),
                added = s.added,
                removed = s.retired.len(),
                slots_changed = s.slots_changed,
                "VIP updated"
            );
        }
        self.vips.insert(s.endpoint, s.state);
        // Shares of new or reweighted backends, and of the rest of their pool.
        self.publish_bound_shares(&s.endpoint, Instant::now())?;
        Ok(())
    }

    /// Removes VIPs: their index entries (and address markers no VIP uses any more) in one
    /// swap, then their tables, then their backends.
    pub(super) fn remove_vips(&mut self, endpoints: &[Endpoint]) -> Result<(), BalancerError> {
        let mut removals = Vec::new();
        let mut removed = Vec::new();
        for endpoint in endpoints {
            let Some(vip) = self.vips.remove(endpoint) else {
                continue;
            };
            removals.push(vip_key(
                vip.config.address,
                vip.config.port,
                vip.config.protocol.number(),
            ));
            if let Some(users) = self.address_users.get_mut(&vip.config.address) {
                *users -= 1;
                if *users == 0 {
                    self.address_users.remove(&vip.config.address);
                    removals.push(vip_key(vip.config.address, 0, 0));
                }
            }
            removed.push(vip);
        }
        self.dataplane.set_vips(&[], &removals)?;
        let ids: Vec<u32> = removed.iter().map(|v| v.id).collect();
        self.dataplane.clear_tables(&ids)?;
        for vip in removed {
            for b in vip.backends.values() {
                self.retire_backend(b)?;
            }
            let endpoint = vip.config.endpoint();
            let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring)
                .into_iter()
                .partition(|r| r.vip == endpoint);
            self.retiring = others;
            for r in &mine {
                self.retire_backend(&r.state)?;
            }
            self.vip_ids.give_back(vip.id);
            self.snat_written.remove(&vip.id);
            self.prefix_written.remove(&vip.id);
            self.admission_written.remove(&vip.id);
            self.fair.remove(&vip.id);
            self.fair_written.remove(&vip.id);
            tracing::info!(vip = %vip.config.name, "VIP removed");
        }
        Ok(())
    }
}
