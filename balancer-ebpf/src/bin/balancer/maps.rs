//! The balancer's maps. Names, layouts and capacities come from `balancer_common::maps`; the
//! daemon resizes the connection table from its config before loading.

use aya_ebpf::{
    btf_maps::{Array, ArrayOfMaps, PerCpuArray},
    macros::btf_map,
};
use balancer_common::{
    maps::{
        BPF_F_MMAPABLE, Backend, DEFAULT_FLOW_BUCKETS, FlowBucket, GlobalConfig,
        MAGLEV_TABLE_FLAGS, MAX_BACKENDS, MAX_TABLE_SIZE, MAX_VIPS, VIP_INDEX_FLAGS,
        VIP_INDEX_SLOTS, VipSlot,
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
