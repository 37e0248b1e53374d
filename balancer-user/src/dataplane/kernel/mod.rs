//! [`Dataplane`] on the maps of the loaded XDP program.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, IterableMap as _, MapData, MapError, PerCpuArray};
use balancer_common::flow_cache::FlowValue;
use balancer_common::maps::{
    self as names, ADMISSION_TIERS, Admission, Backend, FairAdmission, FlowBucket, GlobalConfig,
    Home, MAGLEV_TABLE_FLAGS, NatLinks, SnatSource, SourcePrefix, VIP_INDEX_FLAGS, VIP_INDEX_SLOTS,
    VipKey, VipMeta, VipSlot,
};
use balancer_common::stats::{COUNTERS, GlobalStats, NatLinkStats, TierAdmission, TrafficStats};
use balancer_common::vip_index::build_index;

use super::nat_expiry::NatSweeper;
use super::scrape_due::ScrapeDue;
use super::sys::MappedArray;
use super::{AdmissionCounts, Dataplane, DataplaneError, FlowCounter, add_traffic, sys};
use crate::base::net::{lpm_word_v4, lpm_words_v6};

mod nat;
mod open;

use nat::KernelNat;
pub(in crate::dataplane) use open::map_err;
use open::{absent, mapped};

/// The balancer program's maps, owned by the daemon.
pub struct KernelDataplane {
    /// The VIP index's outer map, and the entries of the index in force.
    vip_index: MapData,
    vips: BTreeMap<VipKey, VipMeta>,
    /// The global NAT bits the index in the kernel carries in every slot (`VipSlot::nat`).
    index_nat: u32,
    maglev: MapData,
    backends: Array<MapData, Backend>,
    config: Array<MapData, GlobalConfig>,
    stats: PerCpuArray<MapData, GlobalStats>,
    vip_stats: PerCpuArray<MapData, TrafficStats>,
    backend_stats: PerCpuArray<MapData, TrafficStats>,
    flows: MapData,
    flows_buckets: u32,
    /// The connection table and the active-flow counts mapped once, read in place (see
    /// [`sys::MappedArray`]).
    flows_view: OnceLock<Arc<MappedArray<FlowBucket>>>,
    active_view: OnceLock<Arc<MappedArray<u64>>>,
    active: Array<MapData, u64>,
    /// The clients homed per backend, mapped (`None` in an object built before the count: a
    /// benchmark's baseline).
    homes: Option<sys::SharedHomes>,
    tier_v4: LpmTrie<MapData, u32, u8>,
    tier_v6: LpmTrie<MapData, [u32; 4], u8>,
    tier_dscp: Array<MapData, u8>,
    snat_sources: Array<MapData, SnatSource>,
    /// Tenant affinity's prefixes; `None` in an object built before it (a benchmark's
    /// baseline). (A restart that adopts an older pinned program loads this build's object:
    /// the map is there, and the older program ignores it until `--replace`.)
    source_prefixes: Option<Array<MapData, SourcePrefix>>,
    /// Admission control and its counters; `None` in an object built before it (a
    /// benchmark's baseline).
    admission: Option<Array<MapData, Admission>>,
    admission_stats: Option<PerCpuArray<MapData, TierAdmission>>,
    /// Fair admission's tenant rates; `None` in an object built before it.
    fair: Option<Array<MapData, FairAdmission>>,
    /// NAT's two links and their counters; `None` in an object built before them (a
    /// benchmark's baseline), which knows one link only.
    nat_links: Option<Array<MapData, NatLinks>>,
    nat_link_stats: Option<PerCpuArray<MapData, NatLinkStats>>,
    /// The source-NAT tables (shared with sweeps run later).
    nat: Arc<Mutex<KernelNat>>,
    swap_started: Option<std::time::Instant>,
    /// The paced VIPs' counts of new flows left before a scrape, and the ring buffer of those
    /// that reached it (None once taken, or in an object of an earlier build).
    scrape_due: Option<ScrapeDue>,
    /// By VIP id, the Maglev tables this process swapped in, kept mapped for reuse.
    tables: HashMap<u32, InnerTables>,
}

/// A VIP's table in force and the one it replaced. The kernel waits for the programs still
/// reading a table it swaps out before the swap returns, so the replaced one has no reader
/// left: the next publish refills it in place and swaps it back in, instead of creating,
/// mapping and unmapping a new map each time (one spare table's memory per VIP).
#[derive(Default)]
struct InnerTables {
    current: Option<InnerTable>,
    spare: Option<InnerTable>,
}

/// An inner Maglev table: its descriptor and a writable mapping of its slots.
struct InnerTable {
    fd: OwnedFd,
    slots: sys::WritableArray<u32>,
}

impl InnerTable {
    fn create(slots: usize) -> std::io::Result<InnerTable> {
        let fd = sys::create_array(4, slots as u32, MAGLEV_TABLE_FLAGS, "maglev_table")?;
        let slots = sys::WritableArray::map(fd.as_fd(), slots)?;
        Ok(InnerTable { fd, slots })
    }
}

impl KernelDataplane {
    /// Builds the VIP index of `self.vips` in a new inner map and swaps it in.
    fn publish_index(&mut self) -> Result<(), DataplaneError> {
        let entries: Vec<(VipKey, VipMeta)> = self.vips.iter().map(|(k, m)| (*k, *m)).collect();
        let slots = build_index(&entries, self.index_nat)
            .map_err(|e| DataplaneError::VipIndex(e.to_string()))?;
        let failed = |op: &str| {
            let op = op.to_string();
            move |e: std::io::Error| DataplaneError::VipIndex(format!("{op}: {e}"))
        };
        let inner = sys::create_array(
            std::mem::size_of::<VipSlot>() as u32,
            VIP_INDEX_SLOTS,
            VIP_INDEX_FLAGS,
            "vip_index",
        )
        .map_err(failed("create"))?;
        sys::fill_mmapable(inner.as_fd(), &slots).map_err(failed("fill"))?;
        sys::update_u32(self.vip_index.fd().as_fd(), 0, inner.as_raw_fd() as u32)
            .map_err(failed("swap in"))
    }

    fn traffic(
        map: &PerCpuArray<MapData, TrafficStats>,
        name: &'static str,
        index: u32,
    ) -> Result<TrafficStats, DataplaneError> {
        let values = map.get(&index, 0).map_err(map_err(name, "read"))?;
        let mut sum = TrafficStats::default();
        for v in values.iter() {
            add_traffic(&mut sum, v);
        }
        Ok(sum)
    }

    /// The traffic of each of `ids`: keys 0 to the highest of them read in one batched
    /// lookup (one system call where a lookup per key took one each) while they are dense
    /// enough that the keys read and not asked for are few, else key by key.
    fn traffic_of(
        map: &PerCpuArray<MapData, TrafficStats>,
        name: &'static str,
        ids: &[u32],
    ) -> Result<Vec<TrafficStats>, DataplaneError> {
        let Some(&highest) = ids.iter().max() else {
            return Ok(Vec::new());
        };
        if highest as usize >= 4 * ids.len() + 64 {
            return ids.iter().map(|id| Self::traffic(map, name, *id)).collect();
        }
        let syscall = |call: &'static str| {
            move |io_error| DataplaneError::Map {
                map: name,
                op: "read",
                source: MapError::SyscallError(aya::sys::SyscallError { call, io_error }),
            }
        };
        let cpus = aya::util::nr_cpus()
            .map_err(|(_, e)| e)
            .map_err(syscall("reading the possible CPUs"))?;
        let size = std::mem::size_of::<TrafficStats>();
        let fd = aya::maps::IterableMap::map(map).fd().as_fd();
        let batch = sys::lookup_percpu_batch(fd, highest + 1, size, cpus)
            .map_err(syscall("bpf_map_lookup_batch"))?;
        let Some(values) = batch else {
            return ids.iter().map(|id| Self::traffic(map, name, *id)).collect();
        };
        let stride = size.next_multiple_of(8);
        Ok(ids
            .iter()
            .map(|&id| {
                let mut sum = TrafficStats::default();
                for cpu in 0..cpus {
                    let at = (id as usize * cpus + cpu) * stride;
                    // SAFETY: `values` holds `highest + 1` keys of `cpus` values each, `stride`
                    // bytes apart; `TrafficStats` is plain `u64`s, read unaligned.
                    let v = unsafe {
                        std::ptr::read_unaligned(
                            values[at..at + size].as_ptr().cast::<TrafficStats>(),
                        )
                    };
                    add_traffic(&mut sum, &v);
                }
                sum
            })
            .collect())
    }
}

impl Dataplane for KernelDataplane {
    /// Connection-table entries per backend id whose flow the client has not ended (tag set,
    /// value intact, not closed by FIN/RST).
    fn flow_counter(&self) -> Result<FlowCounter, DataplaneError> {
        // The mapping is shared: the count may run after this data plane is gone.
        let table = mapped(
            &self.flows_view,
            &self.flows,
            self.flows_buckets as usize,
            "the connection table",
        )?;
        Ok(FlowCounter::later(move || {
            let mut counts = HashMap::new();
            for i in 0..table.len() {
                let bucket = table.get(i);
                for way in &bucket.ways {
                    if way.tag == 0 {
                        continue;
                    }
                    if let Some(v) = FlowValue::unpack(way.value, way.tag)
                        && !v.closed
                    {
                        *counts.entry(u32::from(v.backend_id)).or_insert(0) += 1;
                    }
                }
            }
            Ok(counts)
        }))
    }

    fn set_config(&mut self, config: &GlobalConfig) -> Result<(), DataplaneError> {
        // The program reads the NAT bits from the index (a miss reads them from its last slot).
        if config.nat != self.index_nat {
            let saved = self.index_nat;
            self.index_nat = config.nat;
            if let Err(e) = self.publish_index() {
                self.index_nat = saved;
                return Err(e);
            }
        }
        self.config
            .set(0, config, 0)
            .map_err(map_err(names::CONFIG, "write"))
    }

    fn set_vips(
        &mut self,
        upserts: &[(VipKey, VipMeta)],
        removals: &[VipKey],
    ) -> Result<(), DataplaneError> {
        let saved = self.vips.clone();
        for key in removals {
            self.vips.remove(key);
        }
        for (key, meta) in upserts {
            self.vips.insert(*key, *meta);
        }
        if self.vips == saved {
            return Ok(());
        }
        let result = self.publish_index();
        if result.is_err() {
            self.vips = saved;
        }
        result
    }

    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError> {
        self.backends
            .set(id, backend, 0)
            .map_err(map_err(names::BACKENDS, "write"))
    }

    fn set_snat_source(&mut self, vip_id: u32, source: &SnatSource) -> Result<(), DataplaneError> {
        self.snat_sources
            .set(vip_id, source, 0)
            .map_err(map_err(names::SNAT_SOURCES, "write"))
    }

    fn set_source_prefix(
        &mut self,
        vip_id: u32,
        prefix: &SourcePrefix,
    ) -> Result<(), DataplaneError> {
        match &mut self.source_prefixes {
            Some(map) => map
                .set(vip_id, prefix, 0)
                .map_err(map_err(names::SOURCE_PREFIXES, "write")),
            None if !prefix.is_prefix() => Ok(()),
            None => Err(absent(
                names::SOURCE_PREFIXES,
                "find (this program knows no tenant affinity)",
            )),
        }
    }

    fn set_admission(&mut self, vip_id: u32, admission: &Admission) -> Result<(), DataplaneError> {
        match &mut self.admission {
            Some(map) => map
                .set(vip_id, admission, 0)
                .map_err(map_err(names::ADMISSION, "write")),
            None if *admission == Admission::default() => Ok(()),
            None => Err(absent(
                names::ADMISSION,
                "find (this program knows no admission control)",
            )),
        }
    }

    fn set_fair(&mut self, vip_id: u32, fair: &FairAdmission) -> Result<(), DataplaneError> {
        match &mut self.fair {
            Some(map) => map
                .set(vip_id, fair, 0)
                .map_err(map_err(names::FAIR, "write")),
            None if *fair == FairAdmission::default() => Ok(()),
            None => Err(absent(
                names::FAIR,
                "find (this program knows no fair admission)",
            )),
        }
    }

    fn admission_stats(&self, vip_id: u32) -> Result<AdmissionCounts, DataplaneError> {
        let mut counts = AdmissionCounts::default();
        let Some(map) = &self.admission_stats else {
            return Ok(counts);
        };
        for (tier, sum) in counts.iter_mut().enumerate() {
            let values = map
                .get(&(vip_id * ADMISSION_TIERS + tier as u32), 0)
                .map_err(map_err(names::ADMISSION_STATS, "read"))?;
            for v in values.iter() {
                sum.admitted += v.admitted;
                sum.shed_saturated += v.shed_saturated;
                sum.shed_over_cap += v.shed_over_cap;
                sum.overflowed += v.overflowed;
            }
        }
        Ok(counts)
    }

    fn set_nat_links(&mut self, links: &NatLinks) -> Result<(), DataplaneError> {
        match &mut self.nat_links {
            Some(map) => map
                .set(0, links, 0)
                .map_err(map_err(names::NAT_LINKS, "write")),
            None if *links == NatLinks::default() => Ok(()),
            None => Err(absent(
                names::NAT_LINKS,
                "find (this program knows one link only)",
            )),
        }
    }

    fn nat_link_stats(&self) -> Result<NatLinkStats, DataplaneError> {
        let Some(map) = &self.nat_link_stats else {
            return Ok(NatLinkStats::default());
        };
        let values = map
            .get(&0, 0)
            .map_err(map_err(names::NAT_LINK_STATS, "read"))?;
        Ok(values
            .iter()
            .fold(NatLinkStats::default(), |sum, v| NatLinkStats {
                to_backends: sum.to_backends + v.to_backends,
                to_clients: sum.to_clients + v.to_clients,
            }))
    }

    fn nat_sweeper(&self) -> Result<NatSweeper, DataplaneError> {
        Ok(NatSweeper::of(&self.nat))
    }

    fn set_tiers(
        &mut self,
        prefixes: &[(std::net::IpAddr, u8, u8)],
        dscp: &[u8; 64],
    ) -> Result<(), DataplaneError> {
        // Drop the entries no longer wanted, then write the wanted ones (a client may see a
        // mix for the moment it takes: tiers only steer new flows).
        let v4_keys: Vec<LpmKey<u32>> = self.tier_v4.keys().filter_map(Result::ok).collect();
        let v6_keys: Vec<LpmKey<[u32; 4]>> = self.tier_v6.keys().filter_map(Result::ok).collect();
        let mut want_v4 = Vec::new();
        let mut want_v6 = Vec::new();
        for (addr, len, tier) in prefixes {
            match addr {
                std::net::IpAddr::V4(a) => {
                    want_v4.push((LpmKey::new(u32::from(*len), lpm_word_v4(a)), *tier))
                }
                std::net::IpAddr::V6(a) => {
                    want_v6.push((LpmKey::new(u32::from(*len), lpm_words_v6(a)), *tier))
                }
            }
        }
        for k in v4_keys {
            if !want_v4
                .iter()
                .any(|(w, _)| w.prefix_len() == k.prefix_len() && w.data() == k.data())
            {
                let _ = self.tier_v4.remove(&k);
            }
        }
        for k in v6_keys {
            if !want_v6
                .iter()
                .any(|(w, _)| w.prefix_len() == k.prefix_len() && w.data() == k.data())
            {
                let _ = self.tier_v6.remove(&k);
            }
        }
        for (k, tier) in &want_v4 {
            self.tier_v4
                .insert(k, tier, 0)
                .map_err(map_err(names::TIER_V4, "write"))?;
        }
        for (k, tier) in &want_v6 {
            self.tier_v6
                .insert(k, tier, 0)
                .map_err(map_err(names::TIER_V6, "write"))?;
        }
        for (i, t) in dscp.iter().enumerate() {
            self.tier_dscp
                .set(i as u32, t, 0)
                .map_err(map_err(names::TIER_DSCP, "write"))?;
        }
        Ok(())
    }

    fn reset_active(&mut self, id: u32) -> Result<(), DataplaneError> {
        if let Some(homes) = &self.homes
            && (id as usize) < homes.len()
        {
            homes.clear(id as usize);
        }
        self.active
            .set(id, 0, 0)
            .map_err(map_err(names::ACTIVE, "write"))
    }

    fn homes(&self, ids: &[u32]) -> Result<HashMap<u32, Home>, DataplaneError> {
        let Some(homes) = &self.homes else {
            return Ok(HashMap::new());
        };
        Ok(ids
            .iter()
            .filter(|id| (**id as usize) < homes.len())
            .map(|id| {
                let i = *id as usize;
                let home = Home {
                    homed: homes.homed(i),
                    capacity: homes.capacity(i),
                    _pad: 0,
                };
                (*id, home)
            })
            .filter(|(_, h)| h.homed > 0 || h.capacity > 0)
            .collect())
    }

    fn age_homes(&mut self, ids: &[u32], divisor: u64) -> Result<(), DataplaneError> {
        let Some(homes) = &self.homes else {
            return Ok(());
        };
        for id in ids.iter().filter(|id| (**id as usize) < homes.len()) {
            homes.update_homed(*id as usize, |n| super::aged_homes(n, divisor));
        }
        Ok(())
    }

    fn set_home_capacities(&mut self, capacities: &[(u32, u32)]) -> Result<(), DataplaneError> {
        let Some(homes) = &self.homes else {
            return Ok(());
        };
        for (id, capacity) in capacities {
            let i = *id as usize;
            if i >= homes.len() {
                return Err(DataplaneError::Full {
                    map: names::HOMES,
                    capacity: homes.len() as u32,
                });
            }
            if homes.capacity(i) != *capacity {
                homes.set_capacity(i, *capacity);
            }
        }
        Ok(())
    }

    fn active_flows(&self, ids: &[u32]) -> Result<HashMap<u32, u64>, DataplaneError> {
        let all = mapped(
            &self.active_view,
            self.active.map(),
            names::MAX_BACKENDS as usize,
            "the active-flow counts",
        )?;
        Ok(ids
            .iter()
            .filter(|id| (**id as usize) < all.len())
            .map(|id| (*id, all.get(*id as usize)))
            // Signed counters; a transient negative reads as none.
            .filter(|(_, n)| (*n as i64) > 0)
            .collect())
    }

    fn publish_tables(&mut self, tables: &[(u32, &[u32])]) -> Result<(), DataplaneError> {
        let mut inners = Vec::with_capacity(tables.len());
        for (vip_id, table) in tables {
            let vip_id = *vip_id;
            let failed = |op| move |source| DataplaneError::Table { vip_id, op, source };
            // The VIP's replaced table when it has the size, else a new map.
            let spare = self
                .tables
                .get_mut(&vip_id)
                .and_then(|t| t.spare.take())
                .filter(|spare| spare.slots.len() == table.len());
            let mut inner = match spare {
                Some(spare) => spare,
                None => InnerTable::create(table.len()).map_err(failed("create"))?,
            };
            inner.slots.fill(table);
            inners.push(inner);
        }
        // One batched update swaps every table in; each swap is atomic, and the kernel waits
        // once for programs still reading the old tables. The values written are the inner
        // maps' descriptors (the kernel takes its own references).
        let keys: Vec<u32> = tables.iter().map(|(id, _)| *id).collect();
        let fds: Vec<u32> = inners.iter().map(|t| t.fd.as_raw_fd() as u32).collect();
        self.swap_started = Some(std::time::Instant::now());
        if let Err(source) = sys::update_u32_batch(self.maglev.fd().as_fd(), &keys, &fds) {
            // Which tables went in is unknown: none of them (nor those they replaced) is
            // refilled later; the next publish of these VIPs makes new ones.
            for id in &keys {
                self.tables.remove(id);
            }
            return Err(DataplaneError::Table {
                vip_id: keys.first().copied().unwrap_or(0),
                op: "swap in",
                source,
            });
        }
        for (id, inner) in keys.into_iter().zip(inners) {
            let slot = self.tables.entry(id).or_default();
            slot.spare = slot.current.replace(inner);
        }
        Ok(())
    }

    fn swap_started(&self) -> Option<std::time::Instant> {
        self.swap_started
    }

    fn take_scrape_due(&mut self) -> Option<ScrapeDue> {
        self.scrape_due.take()
    }

    fn clear_tables(&mut self, vip_ids: &[u32]) -> Result<(), DataplaneError> {
        for id in vip_ids {
            self.tables.remove(id);
        }
        sys::delete_u32_batch(self.maglev.fd().as_fd(), vip_ids).map_err(|source| {
            DataplaneError::Table {
                vip_id: vip_ids.first().copied().unwrap_or(0),
                op: "delete",
                source,
            }
        })
    }

    fn global_stats(&self) -> Result<GlobalStats, DataplaneError> {
        let values = self
            .stats
            .get(&0, 0)
            .map_err(map_err(names::STATS, "read"))?;
        let mut sum = GlobalStats::default();
        for v in values.iter() {
            for i in 0..COUNTERS {
                sum.counters[i] += v.counters[i];
            }
        }
        Ok(sum)
    }

    fn vip_stats(&self, vip_id: u32) -> Result<TrafficStats, DataplaneError> {
        Self::traffic(&self.vip_stats, names::VIP_STATS, vip_id)
    }

    fn backend_stats(&self, id: u32) -> Result<TrafficStats, DataplaneError> {
        Self::traffic(&self.backend_stats, names::BACKEND_STATS, id)
    }

    fn vips_stats(&self, ids: &[u32]) -> Result<Vec<TrafficStats>, DataplaneError> {
        Self::traffic_of(&self.vip_stats, names::VIP_STATS, ids)
    }

    fn backends_stats(&self, ids: &[u32]) -> Result<Vec<TrafficStats>, DataplaneError> {
        Self::traffic_of(&self.backend_stats, names::BACKEND_STATS, ids)
    }
}
