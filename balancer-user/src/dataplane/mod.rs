//! What the control logic needs from the kernel, as a trait: write VIPs, backends, settings
//! and whole Maglev tables, and read counters. [`kernel::KernelDataplane`] implements it on the
//! loaded XDP program's maps; [`memory::MemoryDataplane`] keeps the same state in memory so
//! the bookkeeping in [`crate::balancer`] is tested without root or a kernel.

pub mod kernel;
pub mod memory;
pub(crate) mod sys;

use balancer_common::maps::{Backend, GlobalConfig, VipKey, VipMeta};
use balancer_common::stats::{GlobalStats, TrafficStats};

/// A failed map operation.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("{op} on BPF map {map} failed: {source}")]
    Map {
        map: &'static str,
        op: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("Maglev table of VIP id {vip_id}: {op} failed: {source}")]
    Table {
        vip_id: u32,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("VIP index: {0}")]
    VipIndex(String),
    #[error("map {map} is full ({capacity} entries)")]
    Full { map: &'static str, capacity: u32 },
}

/// The kernel state the balancer writes and reads.
pub trait Dataplane {
    /// Replaces the global settings.
    fn set_config(&mut self, config: &GlobalConfig) -> Result<(), DataplaneError>;
    /// Adds or replaces a VIP entry (or a VIP address marker: port 0, protocol 0).
    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), DataplaneError>;
    /// Removes a VIP entry; absent entries are not an error.
    fn remove_vip(&mut self, key: &VipKey) -> Result<(), DataplaneError>;
    /// Writes a backend slot.
    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError>;
    /// Makes `table` the VIP's Maglev table in one step: packets see the old table or the new
    /// one, never a mix.
    fn publish_table(&mut self, vip_id: u32, table: &[u32]) -> Result<(), DataplaneError>;
    /// Drops the VIP's table (the VIP entry must already be gone).
    fn clear_table(&mut self, vip_id: u32) -> Result<(), DataplaneError>;
    /// Global counters summed over CPUs.
    fn global_stats(&self) -> Result<GlobalStats, DataplaneError>;
    /// Traffic of one VIP summed over CPUs.
    fn vip_stats(&self, vip_id: u32) -> Result<TrafficStats, DataplaneError>;
    /// Traffic of one backend summed over CPUs.
    fn backend_stats(&self, id: u32) -> Result<TrafficStats, DataplaneError>;
}

/// Adds `b` into `a`, counter by counter.
pub fn add_traffic(a: &mut TrafficStats, b: &TrafficStats) {
    a.packets += b.packets;
    a.bytes += b.bytes;
    a.new_flows += b.new_flows;
}
