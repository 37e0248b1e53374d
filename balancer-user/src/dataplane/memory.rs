//! An in-memory [`Dataplane`]: the kernel maps as plain collections, with the same capacities,
//! for testing the balancer's bookkeeping without a kernel.

use std::collections::HashMap;

use std::sync::{Arc, Mutex};

use balancer_common::maps::{
    Admission, Backend, FairAdmission, GlobalConfig, Home, MAX_BACKENDS, MAX_VIPS, NatLinks,
    SnatSource, SourcePrefix, VipKey, VipMeta,
};
use balancer_common::stats::{GlobalStats, NatLinkStats, TrafficStats};

use super::nat_expiry::{MemoryNat, NatSweeper};
use super::{AdmissionCounts, Dataplane, DataplaneError, FlowCounter};

/// Kernel state kept in memory. Fields are public so tests can inspect them.
#[derive(Debug, Default)]
pub struct MemoryDataplane {
    pub config: GlobalConfig,
    pub vips: HashMap<VipKey, VipMeta>,
    pub backends: HashMap<u32, Backend>,
    pub tables: HashMap<u32, Vec<u32>>,
    /// Number of tables published so far.
    pub publishes: usize,
    /// Number of `publish_tables` calls (batches; each one kernel wait).
    pub table_swaps: usize,
    /// Number of `set_vips` calls (index swaps).
    pub index_swaps: usize,
    pub stats: GlobalStats,
    pub vip_traffic: HashMap<u32, TrafficStats>,
    pub backend_traffic: HashMap<u32, TrafficStats>,
    /// Active flows per backend id.
    pub active: HashMap<u32, u64>,
    /// Clients homed per backend id under session persistence, in `HOME_UNIT`s (tests add
    /// them as the data plane would).
    pub homes: HashMap<u32, u64>,
    /// Capacities per backend id for that spreading.
    pub home_capacities: HashMap<u32, u32>,
    /// Tier classification: prefixes and DSCP values.
    pub tier_prefixes: Vec<(std::net::IpAddr, u8, u8)>,
    pub tier_dscp: Vec<u8>,
    /// Source NAT per VIP id, and its flow tables (shared with sweeps run later).
    pub snat_sources: HashMap<u32, SnatSource>,
    pub source_prefixes: HashMap<u32, SourcePrefix>,
    /// Admission control per VIP id, and its counters (tests set them).
    pub admission: HashMap<u32, Admission>,
    /// Fair admission's tenant rates per VIP id.
    pub fair: HashMap<u32, FairAdmission>,
    pub admission_counts: HashMap<u32, AdmissionCounts>,
    pub nat: Arc<Mutex<MemoryNat>>,
    /// NAT's links, and the frames it sent to the other one.
    pub nat_links: NatLinks,
    pub nat_link_stats: NatLinkStats,
}

impl Dataplane for MemoryDataplane {
    fn set_config(&mut self, config: &GlobalConfig) -> Result<(), DataplaneError> {
        self.config = *config;
        Ok(())
    }

    fn set_vips(
        &mut self,
        upserts: &[(VipKey, VipMeta)],
        removals: &[VipKey],
    ) -> Result<(), DataplaneError> {
        let new_keys = upserts
            .iter()
            .filter(|(k, _)| !self.vips.contains_key(k))
            .count();
        if self.vips.len() + new_keys > 2 * MAX_VIPS as usize {
            return Err(DataplaneError::Full {
                map: "VIPS",
                capacity: 2 * MAX_VIPS,
            });
        }
        for key in removals {
            self.vips.remove(key);
        }
        for (key, meta) in upserts {
            self.vips.insert(*key, *meta);
        }
        self.index_swaps += 1;
        Ok(())
    }

    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError> {
        put(&mut self.backends, id, *backend, "BACKENDS", MAX_BACKENDS)
    }

    fn set_snat_source(&mut self, vip_id: u32, source: &SnatSource) -> Result<(), DataplaneError> {
        put(
            &mut self.snat_sources,
            vip_id,
            *source,
            "SNAT_SOURCES",
            MAX_VIPS,
        )
    }

    fn set_source_prefix(
        &mut self,
        vip_id: u32,
        prefix: &SourcePrefix,
    ) -> Result<(), DataplaneError> {
        put(
            &mut self.source_prefixes,
            vip_id,
            *prefix,
            "SOURCE_PREFIXES",
            MAX_VIPS,
        )
    }

    fn set_admission(&mut self, vip_id: u32, admission: &Admission) -> Result<(), DataplaneError> {
        put(
            &mut self.admission,
            vip_id,
            *admission,
            "ADMISSION",
            MAX_VIPS,
        )
    }

    fn set_fair(&mut self, vip_id: u32, fair: &FairAdmission) -> Result<(), DataplaneError> {
        put(&mut self.fair, vip_id, *fair, "FAIR", MAX_VIPS)
    }

    fn admission_stats(&self, vip_id: u32) -> Result<AdmissionCounts, DataplaneError> {
        Ok(self
            .admission_counts
            .get(&vip_id)
            .copied()
            .unwrap_or_default())
    }

    fn set_nat_links(&mut self, links: &NatLinks) -> Result<(), DataplaneError> {
        self.nat_links = *links;
        Ok(())
    }

    fn nat_link_stats(&self) -> Result<NatLinkStats, DataplaneError> {
        Ok(self.nat_link_stats)
    }

    fn nat_sweeper(&self) -> Result<NatSweeper, DataplaneError> {
        Ok(NatSweeper::of(&self.nat))
    }

    fn set_tiers(
        &mut self,
        prefixes: &[(std::net::IpAddr, u8, u8)],
        dscp: &[u8; 64],
    ) -> Result<(), DataplaneError> {
        self.tier_prefixes = prefixes.to_vec();
        self.tier_dscp = dscp.to_vec();
        Ok(())
    }

    fn reset_active(&mut self, id: u32) -> Result<(), DataplaneError> {
        self.active.remove(&id);
        self.homes.remove(&id);
        self.home_capacities.remove(&id);
        Ok(())
    }

    fn homes(&self, ids: &[u32]) -> Result<HashMap<u32, Home>, DataplaneError> {
        Ok(ids
            .iter()
            .map(|id| {
                let home = Home {
                    homed: self.homes.get(id).copied().unwrap_or(0),
                    capacity: self.home_capacities.get(id).copied().unwrap_or(0),
                    _pad: 0,
                };
                (*id, home)
            })
            .filter(|(_, h)| h.homed > 0 || h.capacity > 0)
            .collect())
    }

    fn age_homes(&mut self, ids: &[u32], divisor: u64) -> Result<(), DataplaneError> {
        for id in ids {
            if let Some(n) = self.homes.get_mut(id) {
                *n = super::aged_homes(*n, divisor);
            }
        }
        Ok(())
    }

    fn set_home_capacities(&mut self, capacities: &[(u32, u32)]) -> Result<(), DataplaneError> {
        for (id, capacity) in capacities {
            put(
                &mut self.home_capacities,
                *id,
                *capacity,
                "HOMES",
                MAX_BACKENDS,
            )?;
        }
        Ok(())
    }

    fn active_flows(&self, ids: &[u32]) -> Result<HashMap<u32, u64>, DataplaneError> {
        Ok(ids
            .iter()
            .filter_map(|id| Some((*id, *self.active.get(id)?)))
            .filter(|(_, n)| *n > 0)
            .collect())
    }

    /// No connection table in memory: the flows counted as active stand for it.
    fn flow_counter(&self) -> Result<FlowCounter, DataplaneError> {
        Ok(FlowCounter::ready(
            self.active
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, v)| (*k, *v))
                .collect(),
        ))
    }

    fn publish_tables(&mut self, tables: &[(u32, &[u32])]) -> Result<(), DataplaneError> {
        for (vip_id, table) in tables {
            self.tables.insert(*vip_id, table.to_vec());
            self.publishes += 1;
        }
        self.table_swaps += 1;
        Ok(())
    }

    fn clear_tables(&mut self, vip_ids: &[u32]) -> Result<(), DataplaneError> {
        for id in vip_ids {
            self.tables.remove(id);
        }
        Ok(())
    }

    fn global_stats(&self) -> Result<GlobalStats, DataplaneError> {
        Ok(self.stats)
    }

    fn vip_stats(&self, vip_id: u32) -> Result<TrafficStats, DataplaneError> {
        Ok(self.vip_traffic.get(&vip_id).copied().unwrap_or_default())
    }

    fn backend_stats(&self, id: u32) -> Result<TrafficStats, DataplaneError> {
        Ok(self.backend_traffic.get(&id).copied().unwrap_or_default())
    }
}

/// An array map's entry `id` set to `value`, as the kernel's array of `capacity` would take it.
fn put<V>(
    map: &mut HashMap<u32, V>,
    id: u32,
    value: V,
    name: &'static str,
    capacity: u32,
) -> Result<(), DataplaneError> {
    if id >= capacity {
        return Err(DataplaneError::Full {
            map: name,
            capacity,
        });
    }
    map.insert(id, value);
    Ok(())
}
