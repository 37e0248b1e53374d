//! The VIP index: an open-addressed array of slots (see `balancer_common::vip_index`), one
//! inner map replaced whole when the VIPs change.

use balancer_common::{
    maps::{VIP_INDEX_PROBES, VipKey, VipMeta},
    vip_index::{probe_slot, same_key, vip_hash},
};

use crate::maps::VIPS;

/// The VIP (or address marker) with this key.
#[inline(always)]
pub fn find_vip(key: &VipKey) -> Option<&'static VipMeta> {
    let index = VIPS.get(0)?;
    let hash = vip_hash(key);
    for i in 0..VIP_INDEX_PROBES {
        let slot = index.get(probe_slot(hash, i))?;
        if slot.key.family == 0 {
            return None;
        }
        if same_key(&slot.key, key) {
            return Some(&slot.meta);
        }
    }
    None
}
