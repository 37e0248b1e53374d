//! What the control logic needs from the kernel, as a trait: write VIPs, backends, settings
//! and whole Maglev tables, and read counters. [`kernel::KernelDataplane`] implements it on the
//! loaded XDP program's maps; [`memory::MemoryDataplane`] keeps the same state in memory so
//! the bookkeeping in [`crate::vips`] is tested without root or a kernel. Beside the port: the
//! eBPF objects ([`ebpf`]), the pinned state ([`pinning`]), the host's network facts
//! ([`netinfo`]), the global settings ([`settings`]) and the backend-side decapsulation
//! ([`decap`]).

pub mod decap;
pub mod ebpf;
pub mod kernel;
pub mod memory;
pub mod nat_expiry;
pub mod netinfo;
pub mod pinning;
pub mod scrape_due;
pub mod settings;
pub(crate) mod sys;

pub use nat_expiry::{NatSweep, NatSweepSettings, NatSweeper};
pub use scrape_due::ScrapeDue;

use balancer_common::maps::{
    ADMISSION_TIERS, Admission, Backend, FairAdmission, GlobalConfig, Home, NatLinks, SnatSource,
    SourcePrefix, VipKey, VipMeta,
};
use balancer_common::stats::{GlobalStats, NatLinkStats, TierAdmission, TrafficStats};

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

/// Flows per backend id, counted when [`FlowCounter::count`] runs (see
/// [`Dataplane::flow_counter`]).
pub struct FlowCounter(Box<dyn FnOnce() -> FlowCounts + Send>);

type FlowCounts = Result<std::collections::HashMap<u32, u64>, DataplaneError>;

impl FlowCounter {
    /// A count to run later.
    pub fn later(count: impl FnOnce() -> FlowCounts + Send + 'static) -> FlowCounter {
        FlowCounter(Box::new(count))
    }

    /// A count already made.
    pub fn ready(counts: std::collections::HashMap<u32, u64>) -> FlowCounter {
        FlowCounter::later(move || Ok(counts))
    }

    pub fn count(self) -> FlowCounts {
        (self.0)()
    }
}

/// The kernel state the balancer writes and reads.
///
/// Each call that changes what packets see is one atomic step: a packet sees all of it or
/// none of it. Map-in-map swaps make the kernel wait for programs still reading the old inner
/// map (an RCU grace period, milliseconds), so changes come in batches.
pub trait Dataplane {
    /// Replaces the global settings.
    fn set_config(&mut self, config: &GlobalConfig) -> Result<(), DataplaneError>;
    /// Adds or replaces `upserts` and removes `removals` in the VIP index (VIPs and address
    /// markers), in one swap. Removing an absent key is not an error.
    fn set_vips(
        &mut self,
        upserts: &[(VipKey, VipMeta)],
        removals: &[VipKey],
    ) -> Result<(), DataplaneError>;
    /// Writes a backend slot.
    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError>;
    /// Writes VIP `vip_id`'s source NAT (family 0: none).
    fn set_snat_source(&mut self, vip_id: u32, source: &SnatSource) -> Result<(), DataplaneError>;
    /// Writes the source prefix a VIP's affinity keys on.
    fn set_source_prefix(
        &mut self,
        vip_id: u32,
        prefix: &SourcePrefix,
    ) -> Result<(), DataplaneError>;
    /// Writes VIP `vip_id`'s admission control (read only while its VIP is flagged
    /// `VIP_F_ADMISSION`).
    fn set_admission(&mut self, vip_id: u32, admission: &Admission) -> Result<(), DataplaneError>;
    /// Writes VIP `vip_id`'s fair admission: its tenants' rates (read only while its VIP is
    /// flagged `VIP_F_FAIR`).
    fn set_fair(&mut self, vip_id: u32, fair: &FairAdmission) -> Result<(), DataplaneError>;
    /// VIP `vip_id`'s admission counters per client tier (index 0: clients of no tier), summed
    /// over CPUs.
    fn admission_stats(&self, vip_id: u32) -> Result<AdmissionCounts, DataplaneError>;
    /// Writes the links NAT forwarding sends frames on (all zero: the one link they came in on).
    fn set_nat_links(&mut self, links: &NatLinks) -> Result<(), DataplaneError>;
    /// Frames NAT sent to its other link, summed over CPUs.
    fn nat_link_stats(&self) -> Result<NatLinkStats, DataplaneError>;
    /// A sweep of the source-NAT tables (see [`nat_expiry::sweep`]), to run later without the
    /// daemon's lock.
    fn nat_sweeper(&self) -> Result<NatSweeper, DataplaneError>;
    /// Replaces the priority-tier classification: client prefixes `(address, length, tier)`
    /// and the tier of each DSCP value (0: none).
    fn set_tiers(
        &mut self,
        prefixes: &[(std::net::IpAddr, u8, u8)],
        dscp: &[u8; 64],
    ) -> Result<(), DataplaneError>;
    /// Zeroes a backend id's active-flow count and its clients homed and capacity (before
    /// the id goes to a new backend).
    fn reset_active(&mut self, id: u32) -> Result<(), DataplaneError>;
    /// Each backend id of `ids`'s entry for session persistence's spreading: the clients it
    /// homes now, in `HOME_UNIT`s, and its capacity (ids with neither are left out; none at
    /// all in an object built before the count).
    fn homes(&self, ids: &[u32]) -> Result<std::collections::HashMap<u32, Home>, DataplaneError>;
    /// Ages the clients homed on each backend id of `ids`: each count loses `1/divisor` of
    /// itself, rounded up (so it reaches 0), in one atomic step against the data plane's
    /// adds.
    fn age_homes(&mut self, ids: &[u32], divisor: u64) -> Result<(), DataplaneError>;
    /// Writes each `(backend id, capacity)`'s capacity for session persistence's spreading
    /// (`Home::capacity`).
    fn set_home_capacities(&mut self, capacities: &[(u32, u32)]) -> Result<(), DataplaneError>;
    /// Active flows of each backend id in `ids` (ids with none are left out). Only the ids
    /// asked for are read: a policy round wants its VIP's few backends, not every slot.
    fn active_flows(
        &self,
        ids: &[u32],
    ) -> Result<std::collections::HashMap<u32, u64>, DataplaneError>;
    /// A count of the connection-table entries per backend id whose flow the client has not
    /// ended (every VIP's, whatever its scheduler), to run later: reading a large table takes
    /// tens of milliseconds, which the daemon spends without holding its state.
    fn flow_counter(&self) -> Result<FlowCounter, DataplaneError>;
    /// [`Dataplane::flow_counter`], run now.
    fn flow_counts(&self) -> Result<std::collections::HashMap<u32, u64>, DataplaneError> {
        self.flow_counter()?.count()
    }
    /// Makes each `(vip_id, table)` that VIP's Maglev table, each in one step (a packet sees a
    /// VIP's old table or its new one, never a mix).
    fn publish_tables(&mut self, tables: &[(u32, &[u32])]) -> Result<(), DataplaneError>;
    /// When the last `publish_tables` began swapping (the new tables are live from then on;
    /// the call itself returns after the kernel's wait for readers of the old ones).
    fn swap_started(&self) -> Option<std::time::Instant> {
        None
    }
    /// Drops the tables of VIPs whose index entries are already gone.
    fn clear_tables(&mut self, vip_ids: &[u32]) -> Result<(), DataplaneError>;
    /// The counts of new flows left before the paced VIPs' scrapes and the ring buffer of
    /// those that reached it, handed over once (None afterwards, and where the program has
    /// neither: the telemetry loops then read the VIPs' counters on a timer).
    fn take_scrape_due(&mut self) -> Option<ScrapeDue> {
        None
    }
    /// Global counters summed over CPUs.
    fn global_stats(&self) -> Result<GlobalStats, DataplaneError>;
    /// Traffic of one VIP summed over CPUs.
    fn vip_stats(&self, vip_id: u32) -> Result<TrafficStats, DataplaneError>;
    /// Traffic of one backend summed over CPUs.
    fn backend_stats(&self, id: u32) -> Result<TrafficStats, DataplaneError>;
    /// The traffic of each VIP of `ids` (in their order), summed over CPUs; a data plane may
    /// read them all at once.
    fn vips_stats(&self, ids: &[u32]) -> Result<Vec<TrafficStats>, DataplaneError> {
        ids.iter().map(|id| self.vip_stats(*id)).collect()
    }
    /// The traffic of each backend of `ids` (in their order), summed over CPUs.
    fn backends_stats(&self, ids: &[u32]) -> Result<Vec<TrafficStats>, DataplaneError> {
        ids.iter().map(|id| self.backend_stats(*id)).collect()
    }
}

/// A VIP's admission counters by client tier (index 0: clients of no tier).
pub type AdmissionCounts = [TierAdmission; ADMISSION_TIERS as usize];

/// A count of clients homed, aged by `1/divisor` of itself, rounded up (see
/// [`Dataplane::age_homes`]).
pub fn aged_homes(homes: u64, divisor: u64) -> u64 {
    homes - homes.div_ceil(divisor.max(1))
}

/// Adds `b` into `a`, counter by counter.
pub fn add_traffic(a: &mut TrafficStats, b: &TrafficStats) {
    a.packets += b.packets;
    a.bytes += b.bytes;
    a.new_flows += b.new_flows;
}

/// A data plane chosen at run time: the kernel's in the daemon, the in-memory one in tests.
pub type DynDataplane = Box<dyn Dataplane + Send>;

impl<T: Dataplane + ?Sized> Dataplane for Box<T> {
    fn set_config(&mut self, config: &GlobalConfig) -> Result<(), DataplaneError> {
        (**self).set_config(config)
    }
    fn set_vips(
        &mut self,
        upserts: &[(VipKey, VipMeta)],
        removals: &[VipKey],
    ) -> Result<(), DataplaneError> {
        (**self).set_vips(upserts, removals)
    }
    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError> {
        (**self).set_backend(id, backend)
    }
    fn set_snat_source(&mut self, vip_id: u32, source: &SnatSource) -> Result<(), DataplaneError> {
        (**self).set_snat_source(vip_id, source)
    }
    fn set_source_prefix(
        &mut self,
        vip_id: u32,
        prefix: &SourcePrefix,
    ) -> Result<(), DataplaneError> {
        (**self).set_source_prefix(vip_id, prefix)
    }
    fn set_admission(&mut self, vip_id: u32, admission: &Admission) -> Result<(), DataplaneError> {
        (**self).set_admission(vip_id, admission)
    }
    fn set_fair(&mut self, vip_id: u32, fair: &FairAdmission) -> Result<(), DataplaneError> {
        (**self).set_fair(vip_id, fair)
    }
    fn admission_stats(&self, vip_id: u32) -> Result<AdmissionCounts, DataplaneError> {
        (**self).admission_stats(vip_id)
    }
    fn set_nat_links(&mut self, links: &NatLinks) -> Result<(), DataplaneError> {
        (**self).set_nat_links(links)
    }
    fn nat_link_stats(&self) -> Result<NatLinkStats, DataplaneError> {
        (**self).nat_link_stats()
    }
    fn nat_sweeper(&self) -> Result<NatSweeper, DataplaneError> {
        (**self).nat_sweeper()
    }
    fn set_tiers(
        &mut self,
        prefixes: &[(std::net::IpAddr, u8, u8)],
        dscp: &[u8; 64],
    ) -> Result<(), DataplaneError> {
        (**self).set_tiers(prefixes, dscp)
    }
    fn reset_active(&mut self, id: u32) -> Result<(), DataplaneError> {
        (**self).reset_active(id)
    }
    fn active_flows(
        &self,
        ids: &[u32],
    ) -> Result<std::collections::HashMap<u32, u64>, DataplaneError> {
        (**self).active_flows(ids)
    }
    fn homes(&self, ids: &[u32]) -> Result<std::collections::HashMap<u32, Home>, DataplaneError> {
        (**self).homes(ids)
    }
    fn age_homes(&mut self, ids: &[u32], divisor: u64) -> Result<(), DataplaneError> {
        (**self).age_homes(ids, divisor)
    }
    fn set_home_capacities(&mut self, capacities: &[(u32, u32)]) -> Result<(), DataplaneError> {
        (**self).set_home_capacities(capacities)
    }
    fn flow_counter(&self) -> Result<FlowCounter, DataplaneError> {
        (**self).flow_counter()
    }
    fn publish_tables(&mut self, tables: &[(u32, &[u32])]) -> Result<(), DataplaneError> {
        (**self).publish_tables(tables)
    }
    fn swap_started(&self) -> Option<std::time::Instant> {
        (**self).swap_started()
    }
    fn clear_tables(&mut self, vip_ids: &[u32]) -> Result<(), DataplaneError> {
        (**self).clear_tables(vip_ids)
    }
    fn take_scrape_due(&mut self) -> Option<ScrapeDue> {
        (**self).take_scrape_due()
    }
    fn global_stats(&self) -> Result<GlobalStats, DataplaneError> {
        (**self).global_stats()
    }
    fn vip_stats(&self, vip_id: u32) -> Result<TrafficStats, DataplaneError> {
        (**self).vip_stats(vip_id)
    }
    fn backend_stats(&self, id: u32) -> Result<TrafficStats, DataplaneError> {
        (**self).backend_stats(id)
    }
    fn vips_stats(&self, ids: &[u32]) -> Result<Vec<TrafficStats>, DataplaneError> {
        (**self).vips_stats(ids)
    }
    fn backends_stats(&self, ids: &[u32]) -> Result<Vec<TrafficStats>, DataplaneError> {
        (**self).backends_stats(ids)
    }
}
