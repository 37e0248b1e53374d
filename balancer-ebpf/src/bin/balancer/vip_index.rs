//! The VIP index: an open-addressed array of slots (see `balancer_common::vip_index`), one
//! inner map replaced whole when the VIPs change.

use balancer_common::{
    maps::{VIP_INDEX_PROBES, VipKey, VipMeta},
    vip_index::{probe_slot, same_key, vip_hash},
};

use crate::maps::VIPS;

/// What the index says about a key.
pub enum Probe {
    /// The VIP (or address marker) with this key.
    Vip(&'static VipMeta),
    /// No VIP has this key. `nat`: the global NAT bits, read from the slot the search ended on
    /// (every slot carries them, see `VipSlot::nat`), so a miss needs no other lookup to know
    /// whether the packet may be a NAT flow's reply.
    Miss { nat: u32 },
}

/// Looks a key up.
#[inline(always)]
pub fn find_vip(key: &VipKey) -> Probe {
    let Some(index) = VIPS.get(0) else {
        return Probe::Miss { nat: 0 };
    };
    let hash = vip_hash(key);
    let mut nat = 0;
    for i in 0..VIP_INDEX_PROBES {
        let Some(slot) = index.get(probe_slot(hash, i)) else {
            break;
        };
        if slot.key.family == 0 {
            return Probe::Miss { nat: slot.nat };
        }
        if same_key(&slot.key, key) {
            return Probe::Vip(&slot.meta);
        }
        nat = slot.nat;
    }
    Probe::Miss { nat }
}
