//! The balancer's maps. Names, layouts and capacities come from `balancer_common::maps`; the
//! daemon resizes the connection table from its config before loading.

use aya_ebpf::{
    btf_maps::{Array, ArrayOfMaps, HashMap, LruHashMap, PerCpuArray},
    macros::btf_map,
};
use balancer_common::{
    maps::{
        BPF_F_NO_COMMON_LRU, Backend, DEFAULT_MAX_FLOWS, FlowKey, FlowState, GlobalConfig,
        MAGLEV_TABLE_FLAGS, MAX_BACKENDS, MAX_TABLE_SIZE, MAX_VIPS, VipKey, VipMeta,
    },
    stats::{GlobalStats, TrafficStats},
};

/// VIP (address, port, protocol) -> its settings. Also holds one address-only entry per VIP
/// address (port 0, protocol 0) so fragments and ICMP can be recognised as VIP traffic.
#[btf_map]
pub static VIPS: HashMap<VipKey, VipMeta, { 2 * MAX_VIPS as usize }> = HashMap::new();

/// One Maglev table per VIP (slot -> backend id). The daemon builds a new inner map and swaps
/// it in with one update, so a packet sees either the whole old table or the whole new one.
#[btf_map]
pub static MAGLEV: ArrayOfMaps<
    Array<u32, { MAX_TABLE_SIZE as usize }, { MAGLEV_TABLE_FLAGS as usize }>,
    { MAX_VIPS as usize },
> = ArrayOfMaps::new();

/// Backends by id.
#[btf_map]
pub static BACKENDS: Array<Backend, { MAX_BACKENDS as usize }> = Array::new();

/// Connection table: each CPU keeps its own LRU list, so evictions never contend across CPUs.
#[btf_map]
pub static FLOWS: LruHashMap<
    FlowKey,
    FlowState,
    { DEFAULT_MAX_FLOWS as usize },
    { BPF_F_NO_COMMON_LRU as usize },
> = LruHashMap::new();

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

/// New-flow rate of the current one-second window, per CPU (flood mode).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FloodWindow {
    pub start_ns: u64,
    pub new_flows: u32,
    pub flooding: u32,
}

#[btf_map]
pub static FLOOD: PerCpuArray<FloodWindow, 1> = PerCpuArray::new();
