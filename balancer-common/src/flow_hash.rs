//! The hash that places a packet's flow on a Maglev slot.
//!
//! The XDP program and user space (tests, `balancer table`, the fleet agreeing on one table)
//! compute it with this same code. It is a fixed function of the packet's bytes with no
//! per-host seed, so every balancer in a fleet sends a flow to the same slot. It runs on the
//! new-flow path of every VIP packet, so it is a handful of 32-bit multiplies (the murmur3
//! finalizer), not a general-purpose hash.
//!
//! Inputs are the raw words of [`crate::addr::RawAddr`] (packet byte order read as a native
//! word) and the source port as it sits in the packet. The result is defined for little-endian
//! hosts, which every supported target is.

use crate::addr::RawAddr;

const SEED: u32 = 0x9e37_79b9;

#[inline(always)]
pub(crate) const fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

#[inline(always)]
pub(crate) const fn absorb(h: u32, word: u32) -> u32 {
    fmix32(h ^ word).wrapping_add(0x6b43_a9b5)
}

/// Hash of a client address alone (source-hash affinity: all of a client's flows agree).
#[inline(always)]
pub const fn source_hash(src: &RawAddr) -> u32 {
    let mut h = SEED;
    h = absorb(h, src[0]);
    h = absorb(h, src[1]);
    h = absorb(h, src[2]);
    h = absorb(h, src[3]);
    fmix32(h)
}

/// Hash of a flow to one VIP: the client address and source port. The VIP's own address,
/// port and protocol are the same for every flow of a table, so they add nothing.
///
/// `sport` is the port as read from the packet (network byte order in memory).
#[inline(always)]
pub const fn flow_hash(src: &RawAddr, sport: u16) -> u32 {
    fmix32(source_hash(src) ^ (sport as u32).wrapping_mul(0x27d4_eb2f))
}

/// The Maglev slot for a hash in a table of `table_size` entries.
#[inline(always)]
pub const fn slot(hash: u32, table_size: u32) -> u32 {
    hash % table_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_do_not_drift() {
        // A fleet's balancers must agree on these across builds and hosts: a change here moves
        // live flows between backends during a rolling upgrade.
        let src = [u32::from_ne_bytes([10, 0, 0, 1]), 0, 0, 0];
        assert_eq!(flow_hash(&src, 1234u16.to_be()), 0x2d38_1299);
        assert_eq!(
            slot(flow_hash(&src, 1234u16.to_be()), 65_537),
            0x2d38_1299 % 65_537
        );
    }

    #[test]
    fn ports_and_addresses_both_matter() {
        let a = [u32::from_ne_bytes([10, 0, 0, 1]), 0, 0, 0];
        let b = [u32::from_ne_bytes([10, 0, 0, 2]), 0, 0, 0];
        assert_ne!(flow_hash(&a, 1000), flow_hash(&a, 1001));
        assert_ne!(flow_hash(&a, 1000), flow_hash(&b, 1000));
        assert_eq!(source_hash(&a), source_hash(&a));
    }

    #[test]
    fn spreads_evenly_over_slots() {
        // 200k flows from 1000 clients x 200 ports over 101 slots: every slot within 10% of fair.
        let slots = 101u32;
        let mut counts = vec![0u32; slots as usize];
        for c in 0..1000u32 {
            let src = [
                u32::from_ne_bytes([10, 1, (c >> 8) as u8, c as u8]),
                0,
                0,
                0,
            ];
            for p in 0..200u16 {
                counts[slot(flow_hash(&src, (40000 + p).to_be()), slots) as usize] += 1;
            }
        }
        let fair = 200_000.0 / f64::from(slots);
        for (i, &n) in counts.iter().enumerate() {
            let dev = (f64::from(n) - fair).abs() / fair;
            assert!(
                dev < 0.10,
                "slot {i} got {n} flows, fair share {fair:.0} (off by {dev:.3})"
            );
        }
    }
}
