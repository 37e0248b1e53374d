//! The balancer's maps. Names, layouts and capacities come from `balancer_common::maps`; the
//! daemon resizes the connection table from its config before loading.

use aya_ebpf::{
    btf_maps::{Array, ArrayOfMaps, LpmTrie, LruHashMap, PerCpuArray},
    macros::btf_map,
};
use balancer_common::{
    maps::{
        AffinityKey, AffinityValue, BPF_F_MMAPABLE, Backend, DEFAULT_AFFINITY_ENTRIES,
        DEFAULT_FLOW_BUCKETS, FlowBucket, GlobalConfig, MAGLEV_TABLE_FLAGS, MAX_BACKENDS,
        MAX_TABLE_ENTRIES, MAX_TIER_PREFIXES, MAX_VIPS, NatReplyKey, NatReplyValue,
        VIP_INDEX_FLAGS, VIP_INDEX_SLOTS, VipSlot,
    },
    stats::{GlobalStats, TrafficStats},
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

/// Active flows per VIP id (atomic adds; read as signed).
#[btf_map]
pub static VIP_ACTIVE: Array<u64, { MAX_VIPS as usize }, { BPF_F_MMAPABLE as usize }> =
    Array::new();

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
