//! `aya::Pod` for the map types: each is `#[repr(C)]`, `Copy`, and has no implicit padding
//! (checked by the size assertions beside each definition), so any byte pattern is valid.

use crate::latency::{LatencyFlow, LatencyFlowKey, LatencyStats};
use crate::maps::{
    Admission, Backend, DecapAddrKey, DecapConfig, FairAdmission, FlowBucket, FlowKey,
    GlobalConfig, Home, NatLinks, NatReplyKey, NatReplyValue, SnatClientKey, SnatFlowKey,
    SnatFlowValue, SnatPortValue, SnatSource, SourcePrefix, VipKey, VipMeta, VipSlot,
};
use crate::stats::{DecapStats, GlobalStats, NatLinkStats, NatStats, TierAdmission, TrafficStats};

// SAFETY: see the module docs; every field is an integer or an array of integers.
unsafe impl aya::Pod for VipKey {}
// SAFETY: as above.
unsafe impl aya::Pod for VipMeta {}
// SAFETY: as above.
unsafe impl aya::Pod for Backend {}
// SAFETY: as above.
unsafe impl aya::Pod for FlowKey {}
// SAFETY: as above (`_pad` makes the tail explicit).
unsafe impl aya::Pod for Home {}
// SAFETY: as above.
unsafe impl aya::Pod for FlowBucket {}
// SAFETY: as above.
unsafe impl aya::Pod for VipSlot {}
// SAFETY: as above.
unsafe impl aya::Pod for GlobalConfig {}
// SAFETY: as above.
unsafe impl aya::Pod for NatReplyKey {}
// SAFETY: as above.
unsafe impl aya::Pod for NatReplyValue {}
// SAFETY: as above.
unsafe impl aya::Pod for GlobalStats {}
// SAFETY: as above.
unsafe impl aya::Pod for TrafficStats {}
// SAFETY: as above.
unsafe impl aya::Pod for DecapConfig {}
// SAFETY: as above.
unsafe impl aya::Pod for DecapAddrKey {}
// SAFETY: as above.
unsafe impl aya::Pod for DecapStats {}
// SAFETY: as above.
unsafe impl aya::Pod for SnatSource {}
// SAFETY: as above.
unsafe impl aya::Pod for SourcePrefix {}
// SAFETY: as above.
unsafe impl aya::Pod for SnatFlowKey {}
unsafe impl aya::Pod for SnatClientKey {}
// SAFETY: as above.
unsafe impl aya::Pod for SnatFlowValue {}
// SAFETY: as above.
unsafe impl aya::Pod for SnatPortValue {}
// SAFETY: as above.
unsafe impl aya::Pod for NatStats {}
// SAFETY: as above.
unsafe impl aya::Pod for NatLinks {}
// SAFETY: as above.
unsafe impl aya::Pod for NatLinkStats {}
// SAFETY: as above.
unsafe impl aya::Pod for Admission {}
// SAFETY: as above.
unsafe impl aya::Pod for FairAdmission {}
// SAFETY: as above.
unsafe impl aya::Pod for TierAdmission {}

// SAFETY: as above.
unsafe impl aya::Pod for LatencyFlowKey {}
// SAFETY: as above.
unsafe impl aya::Pod for LatencyFlow {}
// SAFETY: as above.
unsafe impl aya::Pod for LatencyStats {}
