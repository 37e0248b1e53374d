//! The balancer's maps. Names, layouts and capacities come from `balancer_common::maps`; the
//! daemon resizes the connection table from its config before loading.

use aya_ebpf::{
    btf_maps::{Array, ArrayOfMaps, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
    macros::btf_map,
};
use balancer_common::{
    addr::RawAddr,
    maps::{
        ADMISSION_TIERS, Admission, AffinityKey, AffinityValue, BPF_F_MMAPABLE, Backend,
        DEFAULT_AFFINITY_ENTRIES, DEFAULT_FLOW_BUCKETS, FairAdmission, FlowBucket, GlobalConfig,
        Home, MAGLEV_TABLE_FLAGS, MAX_BACKENDS, MAX_SNAT_CLIENTS, MAX_TABLE_ENTRIES,
        MAX_TIER_PREFIXES, MAX_VIPS, NatLinks, NatReplyKey, NatReplyValue, SCRAPE_EVENTS_BYTES,
        SnatClientKey, SnatFlowKey, SnatFlowValue, SnatPortValue, SnatSource, SourcePrefix,
        VIP_INDEX_FLAGS, VIP_INDEX_SLOTS, VipSlot,
    },
    stats::{GlobalStats, NatLinkStats, NatStats, TierAdmission, TrafficStats},
};

/// The VIP index (one inner array of slots, replaced whole when VIPs change). Besides VIPs it
/// holds one marker per VIP address (port 0, protocol 0) so fragments and ICMP can be
/// recognised as VIP traffic.
#[btf_map]
pub static VIPS: ArrayOfMaps<
    Array<VipSlot, { VIP_INDEX_SLOTS as usize }, { VIP_INDEX_FLAGS as usize }>,
    1,
> = ArrayOfMaps::new();

/// One table per VIP: its Maglev slots (slot -> backend id), then its schedule (see
/// `balancer_common::schedule`). The daemon builds a new inner map and swaps it in with one
/// update, so a packet sees either the whole old table or the whole new one.
#[btf_map]
pub static MAGLEV: ArrayOfMaps<
    Array<u32, { MAX_TABLE_ENTRIES as usize }, { MAGLEV_TABLE_FLAGS as usize }>,
    { MAX_VIPS as usize },
> = ArrayOfMaps::new();

/// Backends by id.
#[btf_map]
pub static BACKENDS: Array<Backend, { MAX_BACKENDS as usize }> = Array::new();

/// Connection table: a set-associative flow cache (see `balancer_common::flow_cache`).
#[btf_map]
pub static FLOWS: Array<
    FlowBucket,
    { DEFAULT_FLOW_BUCKETS as usize },
    { BPF_F_MMAPABLE as usize },
> = Array::new();

/// Global settings (one entry).
#[btf_map]
pub static CONFIG: Array<GlobalConfig, 1> = Array::new();

/// Global counters (one per-CPU entry).
#[btf_map]
pub static STATS: PerCpuArray<GlobalStats, 1> = PerCpuArray::new();

/// Traffic per VIP id.
#[btf_map]
pub static VIP_STATS: PerCpuArray<TrafficStats, { MAX_VIPS as usize }> = PerCpuArray::new();

/// Traffic per backend id.
#[btf_map]
pub static BACKEND_STATS: PerCpuArray<TrafficStats, { MAX_BACKENDS as usize }> = PerCpuArray::new();

/// Active flows per backend id (atomic adds; read as signed).
#[btf_map]
pub static ACTIVE: Array<u64, { MAX_BACKENDS as usize }, { BPF_F_MMAPABLE as usize }> =
    Array::new();

/// Clients placed per backend id under session persistence and its capacity (`Home`; the
/// placed count by atomic adds, aged by the daemon; the capacity written by the daemon).
#[btf_map]
pub static HOMES: Array<Home, { MAX_BACKENDS as usize }, { BPF_F_MMAPABLE as usize }> =
    Array::new();

/// Active flows per VIP id (atomic adds; read as signed).
#[btf_map]
pub static VIP_ACTIVE: Array<u64, { MAX_VIPS as usize }, { BPF_F_MMAPABLE as usize }> =
    Array::new();

/// New flows left before each VIP's next scrape is due (atomic adds; read as signed; counted
/// only for VIPs flagged `VIP_F_SCRAPE_DUE`).
#[btf_map]
pub static SCRAPE_DUE: Array<u64, { MAX_VIPS as usize }> = Array::new();

/// The ids of the VIPs whose scrape came due by new flows, for the daemon.
#[btf_map]
pub static SCRAPE_EVENTS: RingBuf<u32, { SCRAPE_EVENTS_BYTES as usize }> = RingBuf::new();

/// Round-robin cursors per VIP id, per CPU.
#[btf_map]
pub static RR_CURSOR: PerCpuArray<u32, { MAX_VIPS as usize }> = PerCpuArray::new();

/// Session persistence: a client's backend per VIP. The daemon sizes it from its config.
#[btf_map]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue, { DEFAULT_AFFINITY_ENTRIES as usize }> =
    LruHashMap::new();

/// NAT forwarding: the way back of each NAT flow's replies. The daemon sizes it from its
/// config (one entry per connection-table flow).
#[btf_map]
pub static NAT_REPLIES: LruHashMap<
    NatReplyKey,
    NatReplyValue,
    { DEFAULT_AFFINITY_ENTRIES as usize },
> = LruHashMap::new();

/// Source NAT: each VIP's source address and port range (family 0: none).
#[btf_map]
pub static SNAT_SOURCES: Array<SnatSource, { MAX_VIPS as usize }> = Array::new();

/// The source prefix each VIP's affinity keys on (read for VIPs flagged
/// `VIP_F_SOURCE_PREFIX` only).
#[btf_map]
pub static SOURCE_PREFIXES: Array<SourcePrefix, { MAX_VIPS as usize }> = Array::new();

/// Admission control per VIP id (read for VIPs flagged `VIP_F_ADMISSION` only).
#[btf_map]
pub static ADMISSION: Array<Admission, { MAX_VIPS as usize }> = Array::new();

/// Admission counters and cap windows per VIP id and client tier, per CPU.
#[btf_map]
pub static ADMISSION_STATS: PerCpuArray<TierAdmission, { (MAX_VIPS * ADMISSION_TIERS) as usize }> =
    PerCpuArray::new();

/// Fair admission's tenant rates per VIP id (read for VIPs flagged `VIP_F_FAIR` only).
#[btf_map]
pub static FAIR: Array<FairAdmission, { MAX_VIPS as usize }> = Array::new();

/// Fair admission's pace per VIP id and tenant, shared by all CPUs (see
/// `balancer_common::maps::FAIR_TAT`).
#[btf_map]
pub static FAIR_TAT: Array<u64, { (MAX_VIPS * ADMISSION_TIERS) as usize }> = Array::new();

/// `BPF_F_NO_PREALLOC`: entries take memory when inserted, not all when the map is made.
const NO_PREALLOC: usize = 1;

/// Source NAT: each client flow's backend, source address and port. The daemon sizes it from
/// its config and removes expired flows (with their ports). Allocated per entry: a host
/// without source NAT pays nothing for its capacity.
#[btf_map]
pub static SNAT_FLOWS: HashMap<
    SnatFlowKey,
    SnatFlowValue,
    { DEFAULT_AFFINITY_ENTRIES as usize },
    NO_PREALLOC,
> = HashMap::new();

/// Source NAT: the port each reply comes back to, and its client flow. An entry is inserted
/// only where none is (the port allocator); the daemon sizes and expires it like `SNAT_FLOWS`.
#[btf_map]
pub static SNAT_PORTS: HashMap<
    NatReplyKey,
    SnatPortValue,
    { DEFAULT_AFFINITY_ENTRIES as usize },
    NO_PREALLOC,
> = HashMap::new();

/// Source NAT: the ports each client address holds (LRU: a flood of spoofed addresses evicts
/// counts, which the daemon's sweep writes back).
#[btf_map]
pub static SNAT_CLIENTS: LruHashMap<SnatClientKey, u64, { MAX_SNAT_CLIENTS as usize }> =
    LruHashMap::new();

/// NAT counters (one per-CPU entry).
#[btf_map]
pub static NAT_STATS: PerCpuArray<NatStats, 1> = PerCpuArray::new();

/// The clients' and the backends' link of NAT forwarding (one entry).
#[btf_map]
pub static NAT_LINKS: Array<NatLinks, 1> = Array::new();

/// Frames NAT sent to its other link (one per-CPU entry).
#[btf_map]
pub static NAT_LINK_STATS: PerCpuArray<NatLinkStats, 1> = PerCpuArray::new();

/// Room for the NAT functions' keys and values (one per-CPU entry, not pinned): on the stack
/// they would take the NAT functions past the verifier's 512-byte limit along the call chain
/// from the entry function.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NatScratch {
    pub reply: NatReplyKey,
    pub flow_key: SnatFlowKey,
    pub flow: SnatFlowValue,
    pub way_back: SnatPortValue,
    pub gateway: NatReplyValue,
    /// An ICMP error's outer source address (compared with the backend's).
    pub outer_src: RawAddr,
    /// A source-NAT client's key in `SNAT_CLIENTS`.
    pub client: SnatClientKey,
}

#[btf_map]
pub static NAT_SCRATCH: PerCpuArray<NatScratch, 1> = PerCpuArray::new();

/// Priority tiers of IPv4 clients by source prefix (network-order address words).
#[btf_map]
pub static TIER_V4: LpmTrie<u32, u8, { MAX_TIER_PREFIXES as usize }> = LpmTrie::new();

/// Priority tiers of IPv6 clients by source prefix.
#[btf_map]
pub static TIER_V6: LpmTrie<[u32; 4], u8, { MAX_TIER_PREFIXES as usize }> = LpmTrie::new();

/// Priority tiers by DSCP (0 = none).
#[btf_map]
pub static TIER_DSCP: Array<u8, 64> = Array::new();

/// New-flow rate of the current window (one flow-clock tick), per CPU (flood mode).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FloodWindow {
    pub tick: u64,
    pub new_flows: u32,
    pub flooding: u32,
}

#[btf_map]
pub static FLOOD: PerCpuArray<FloodWindow, 1> = PerCpuArray::new();
