//! An in-memory [`Dataplane`]: the kernel maps as plain collections, with the same capacities,
//! for testing the balancer's bookkeeping without a kernel.

use std::collections::HashMap;

use balancer_common::maps::{Backend, GlobalConfig, MAX_BACKENDS, MAX_VIPS, VipKey, VipMeta};
use balancer_common::stats::{GlobalStats, TrafficStats};

use super::{Dataplane, DataplaneError};

/// Kernel state kept in memory. Fields are public so tests can inspect them.
#[derive(Debug, Default)]
pub struct MemoryDataplane {
    pub config: GlobalConfig,
    pub vips: HashMap<VipKey, VipMeta>,
    pub backends: HashMap<u32, Backend>,
    pub tables: HashMap<u32, Vec<u32>>,
    /// Number of tables published so far (each one a single swap).
    pub publishes: usize,
    pub stats: GlobalStats,
    pub vip_traffic: HashMap<u32, TrafficStats>,
    pub backend_traffic: HashMap<u32, TrafficStats>,
}

impl Dataplane for MemoryDataplane {
    fn set_config(&mut self, config: &GlobalConfig) -> Result<(), DataplaneError> {
        self.config = *config;
        Ok(())
    }

    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), DataplaneError> {
        if !self.vips.contains_key(key) && self.vips.len() >= 2 * MAX_VIPS as usize {
            return Err(DataplaneError::Full {
                map: "VIPS",
                capacity: 2 * MAX_VIPS,
            });
        }
        self.vips.insert(*key, *meta);
        Ok(())
    }

    fn remove_vip(&mut self, key: &VipKey) -> Result<(), DataplaneError> {
        self.vips.remove(key);
        Ok(())
    }

    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError> {
        if id >= MAX_BACKENDS {
            return Err(DataplaneError::Full {
                map: "BACKENDS",
                capacity: MAX_BACKENDS,
            });
        }
        self.backends.insert(id, *backend);
        Ok(())
    }

    fn publish_table(&mut self, vip_id: u32, table: &[u32]) -> Result<(), DataplaneError> {
        self.tables.insert(vip_id, table.to_vec());
        self.publishes += 1;
        Ok(())
    }

    fn clear_table(&mut self, vip_id: u32) -> Result<(), DataplaneError> {
        self.tables.remove(&vip_id);
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
