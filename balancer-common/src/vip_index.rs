//! The VIP index: an open-addressing hash table in a plain array, so the XDP program finds a
//! VIP with one inlined array access per probe instead of a hash-map call. The daemon builds
//! the whole index and swaps it in with one map update whenever the VIP set changes (rare), so
//! readers never see it half-written.
//!
//! A key lives in one of [`crate::maps::VIP_INDEX_PROBES`] slots starting at its home slot; an empty slot
//! (family 0) ends a search early. With at most 2 x [`crate::maps::MAX_VIPS`] keys in
//! [`VIP_INDEX_SLOTS`] slots the table is at most 3% full.

use crate::maps::{VIP_INDEX_SLOTS, VipKey};

/// The home slot hash of a key: cheap (it runs for every packet), and good enough to spread
/// the at most 2048 keys of an index of 65536 slots.
#[inline(always)]
pub const fn vip_hash(key: &VipKey) -> u32 {
    let tail = key.port as u32 | (key.proto as u32) << 16 | (key.family as u32) << 24;
    let h = key.addr[0]
        ^ key.addr[1].rotate_left(7)
        ^ key.addr[2].rotate_left(13)
        ^ key.addr[3].rotate_left(19)
        ^ tail.wrapping_mul(0x85eb_ca6b);
    // Multiplicative hashing: the top 16 bits of the product are well mixed.
    h.wrapping_mul(0x9e37_79b1) >> 16
}

/// The slot of probe `i` for a key of hash `hash`.
#[inline(always)]
pub const fn probe_slot(hash: u32, i: u32) -> u32 {
    hash.wrapping_add(i) & (VIP_INDEX_SLOTS - 1)
}

/// Whether two keys are equal, word by word (cheaper in BPF than a byte compare).
#[inline(always)]
pub fn same_key(a: &VipKey, b: &VipKey) -> bool {
    a.addr[0] == b.addr[0]
        && a.addr[1] == b.addr[1]
        && a.addr[2] == b.addr[2]
        && a.addr[3] == b.addr[3]
        && a.port == b.port
        && a.proto == b.proto
        && a.family == b.family
}

#[cfg(feature = "std")]
pub use build::{IndexError, build_index, lookup};

#[cfg(feature = "std")]
mod build {
    use super::*;
    use crate::maps::{VIP_INDEX_PROBES, VipMeta, VipSlot};

    /// A key could not be placed within its probe window.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum IndexError {
        NoSlot(VipKey),
        EmptyFamily(VipKey),
    }

    impl core::fmt::Display for IndexError {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            match self {
                IndexError::NoSlot(k) => write!(f, "no free VIP index slot near the home of {k:?}"),
                IndexError::EmptyFamily(k) => write!(f, "VIP key {k:?} has no address family"),
            }
        }
    }

    impl std::error::Error for IndexError {}

    /// Builds the index of `entries` (keys must be distinct and have a family), every slot
    /// carrying the global NAT bits `nat` (see [`VipSlot::nat`]).
    pub fn build_index(
        entries: &[(VipKey, VipMeta)],
        nat: u32,
    ) -> Result<Vec<VipSlot>, IndexError> {
        let empty = VipSlot {
            nat,
            ..VipSlot::default()
        };
        let mut slots = vec![empty; VIP_INDEX_SLOTS as usize];
        // Insertion in key order: the index depends only on the set of entries.
        let mut sorted: Vec<&(VipKey, VipMeta)> = entries.iter().collect();
        sorted.sort_by_key(|(k, _)| *k);
        for (key, meta) in sorted {
            if key.family == 0 {
                return Err(IndexError::EmptyFamily(*key));
            }
            let hash = vip_hash(key);
            let free = (0..VIP_INDEX_PROBES)
                .map(|i| probe_slot(hash, i) as usize)
                .find(|&s| slots[s].key.family == 0)
                .ok_or(IndexError::NoSlot(*key))?;
            slots[free] = VipSlot {
                key: *key,
                nat,
                meta: *meta,
            };
        }
        Ok(slots)
    }

    /// Looks a key up the way the XDP program does: the VIP's entry, or on a miss the NAT bits
    /// of the slot the search ended on.
    pub fn lookup<'a>(slots: &'a [VipSlot], key: &VipKey) -> Result<&'a VipMeta, u32> {
        let hash = vip_hash(key);
        let mut nat = 0;
        for i in 0..VIP_INDEX_PROBES {
            let slot = &slots[probe_slot(hash, i) as usize];
            if slot.key.family == 0 {
                return Err(slot.nat);
            }
            if same_key(&slot.key, key) {
                return Ok(&slot.meta);
            }
            nat = slot.nat;
        }
        Err(nat)
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::maps::{MAX_VIPS, VipMeta};

    fn key(i: u32, port: u16) -> VipKey {
        VipKey {
            addr: [i.to_be(), 0, 0, 0],
            port: port.to_be(),
            proto: 6,
            family: 4,
        }
    }

    #[test]
    fn every_key_is_found_and_others_are_not() {
        // The most the daemon ever stores: a VIP and an address marker per VIP.
        let entries: Vec<(VipKey, VipMeta)> = (0..2 * MAX_VIPS)
            .map(|i| {
                (
                    key(0x0a00_0000 + i / 2, if i % 2 == 0 { 80 } else { 0 }),
                    VipMeta {
                        vip_id: i,
                        ..VipMeta::default()
                    },
                )
            })
            .collect();
        let slots = build_index(&entries, 0).unwrap();
        for (k, m) in &entries {
            assert_eq!(lookup(&slots, k), Ok(m));
        }
        for i in 0..10_000 {
            assert_eq!(lookup(&slots, &key(0x0b00_0000 + i, 80)), Err(0));
        }
    }

    #[test]
    fn ipv6_vips_differing_in_one_word_all_fit() {
        let entries: Vec<(VipKey, VipMeta)> = (0..MAX_VIPS)
            .flat_map(|i| {
                let addr = [0x2001_0db8u32.to_be(), 0, 0, (i + 1).to_be()];
                [80u16, 443, 0].map(|port| {
                    (
                        VipKey {
                            addr,
                            port: port.to_be(),
                            proto: if port == 0 { 0 } else { 6 },
                            family: 6,
                        },
                        VipMeta::default(),
                    )
                })
            })
            .collect();
        let slots = build_index(&entries, 0).expect("3072 keys within 4 probes");
        for (k, m) in &entries {
            assert_eq!(lookup(&slots, k), Ok(m));
        }
    }

    #[test]
    fn the_index_depends_only_on_the_set() {
        let mut entries: Vec<(VipKey, VipMeta)> = (0..100)
            .map(|i| (key(i, 443), VipMeta::default()))
            .collect();
        let a = build_index(&entries, 0).unwrap();
        entries.reverse();
        assert_eq!(a, build_index(&entries, 0).unwrap());
    }

    #[test]
    fn keys_without_a_family_are_refused() {
        let bad = VipKey::default();
        assert_eq!(
            build_index(&[(bad, VipMeta::default())], 0),
            Err(IndexError::EmptyFamily(bad))
        );
    }

    #[test]
    fn every_miss_reads_the_nat_bits() {
        let entries: Vec<(VipKey, VipMeta)> = (0..2 * MAX_VIPS)
            .map(|i| {
                (
                    key(0x0a00_0000 + i / 2, if i % 2 == 0 { 80 } else { 0 }),
                    VipMeta::default(),
                )
            })
            .collect();
        let slots = build_index(&entries, 3).unwrap();
        assert!(slots.iter().all(|s| s.nat == 3));
        for (k, m) in &entries {
            assert_eq!(lookup(&slots, k), Ok(m));
        }
        for i in 0..10_000 {
            assert_eq!(lookup(&slots, &key(0x0b00_0000 + i, 80)), Err(3));
        }
    }
}
