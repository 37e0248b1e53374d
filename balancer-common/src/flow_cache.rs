//! The connection table: a set-associative flow cache in a plain (memory-mappable) array of
//! 64-byte buckets of [`FLOW_WAYS`] ways, shared by all CPUs.
//!
//! Why not a kernel LRU hash: on the kind of machine this project targets, an LRU-hash insert
//! from XDP costs several hundred nanoseconds (bucket locks, LRU list locks, element
//! recycling), while every lookup and insert here is a few plain loads and stores in one
//! cache line. Entries carry a 64-bit tag of the flow (a seeded hash of [`FlowKey`]) instead of
//! the key; the value packs the backend id, the low 16 bits of its generation, a last-seen
//! tick (UDP idle expiry), a closed bit (the client sent FIN or RST: the flow no longer counts
//! as active, but keeps its backend for the rest of the teardown), a counted bit (the flow is
//! in its backend's active-flow count) and 13 check bits taken from the tag, so a value read while another CPU rewrites the way is recognised as torn and
//! treated as a miss.
//!
//! Replacement is CLOCK-like ("second chance"): a hit sets the way's referenced bit (a store
//! only when it was clear); an insert into a full bucket takes the first way without the bit,
//! clearing the bits it passes, so flows that keep sending stay while idle ones age out.

use crate::maps::{FLOW_WAYS, FlowEntry, FlowKey};

/// One tick of the flow clock: 2^30 ns (about 1.07 s), from `bpf_ktime_get_coarse_ns() >> 30`.
pub const TICK_SHIFT: u32 = 30;
pub const TICK_NS: u64 = 1 << TICK_SHIFT;

const K1: u64 = 0x9e37_79b9_7f4a_7c15;
const K2: u64 = 0xbf58_476d_1ce4_e5b9;

#[inline(always)]
const fn round(h: u64, w: u64) -> u64 {
    let h = (h ^ w).wrapping_mul(K1);
    h ^ (h >> 29)
}

/// The flow's tag: a seeded 64-bit hash of its key, never 0 (0 marks an empty way).
#[inline(always)]
pub const fn flow_tag(key: &FlowKey, seed: u64) -> u64 {
    let mut h = seed ^ 0x2545_f491_4f6c_dd1d;
    h = round(h, key.src[0] as u64 | (key.src[1] as u64) << 32);
    h = round(h, key.src[2] as u64 | (key.src[3] as u64) << 32);
    h = round(h, key.vip_id as u64 | (key.sport as u64) << 32);
    h ^= h >> 32;
    h = h.wrapping_mul(K2);
    h ^= h >> 29;
    if h == 0 { 1 } else { h }
}

/// The bucket of a tag, given the bucket count - 1.
#[inline(always)]
pub const fn bucket_of(tag: u64, mask: u32) -> u32 {
    tag as u32 & mask
}

const REFERENCED: u64 = 1 << 63;
const CLOSED: u64 = 1 << 62;
const COUNTED: u64 = 1 << 61;
const CHECK_SHIFT: u32 = 48;
const CHECK_MASK: u64 = 0x1fff;

/// The check bits of a tag (independent of the bucket bits, which are the lowest).
#[inline(always)]
const fn check_of(tag: u64) -> u64 {
    (tag >> 49) & CHECK_MASK
}

/// A connection-table value, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowValue {
    pub backend_id: u16,
    /// Low 16 bits of the backend's generation when the flow was pinned.
    pub generation: u16,
    /// Last-seen tick (UDP flows; 0 for TCP).
    pub last_seen: u16,
    pub referenced: bool,
    /// The client ended the flow (TCP FIN or RST): no longer counted as active.
    pub closed: bool,
    /// The flow is in its backend's active-flow count (its VIP counts them).
    pub counted: bool,
}

impl FlowValue {
    /// Packs the value for the way holding `tag`.
    #[inline(always)]
    pub const fn pack(self, tag: u64) -> u64 {
        self.backend_id as u64
            | (self.generation as u64) << 16
            | (self.last_seen as u64) << 32
            | check_of(tag) << CHECK_SHIFT
            | if self.closed { CLOSED } else { 0 }
            | if self.counted { COUNTED } else { 0 }
            | if self.referenced { REFERENCED } else { 0 }
    }

    /// Unpacks a value read from the way holding `tag`; `None` if its check bits belong to
    /// another tag (a way read while being rewritten).
    #[inline(always)]
    pub const fn unpack(value: u64, tag: u64) -> Option<FlowValue> {
        if (value >> CHECK_SHIFT) & CHECK_MASK != check_of(tag) {
            return None;
        }
        Some(FlowValue {
            backend_id: value as u16,
            generation: (value >> 16) as u16,
            last_seen: (value >> 32) as u16,
            referenced: value & REFERENCED != 0,
            closed: value & CLOSED != 0,
            counted: value & COUNTED != 0,
        })
    }
}

/// Whether a packed value has its referenced bit.
#[inline(always)]
pub const fn is_referenced(value: u64) -> bool {
    value & REFERENCED != 0
}

/// The packed value with the referenced bit set.
#[inline(always)]
pub const fn referenced(value: u64) -> u64 {
    value | REFERENCED
}

/// The packed value with the referenced bit clear.
#[inline(always)]
pub const fn unreferenced(value: u64) -> u64 {
    value & !REFERENCED
}

/// Which way an insert of `tag` takes in a bucket: the way already holding the tag, else an
/// empty way, else the first way from a tag-chosen start whose referenced bit is clear (the
/// bits of the ways passed over are cleared by the caller, see `clear_before`). Returns the way
/// and how many ways before it (from the start) the caller must clear.
#[inline(always)]
pub fn victim(ways: &[FlowEntry; FLOW_WAYS], tag: u64) -> (usize, usize) {
    let mut empty = FLOW_WAYS;
    let mut i = 0;
    while i < FLOW_WAYS {
        if ways[i].tag == tag {
            return (i, 0);
        }
        if empty == FLOW_WAYS && ways[i].tag == 0 {
            empty = i;
        }
        i += 1;
    }
    if empty < FLOW_WAYS {
        return (empty, 0);
    }
    let start = ((tag >> 40) as usize) % FLOW_WAYS;
    let mut n = 0;
    while n < FLOW_WAYS {
        let way = (start + n) % FLOW_WAYS;
        if !is_referenced(ways[way].value) {
            return (way, n);
        }
        n += 1;
    }
    // Every way was referenced: all get cleared, the start way is taken.
    (start, FLOW_WAYS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> FlowKey {
        FlowKey {
            src: [i, 0, 0, 0],
            vip_id: 3,
            sport: 4242,
            _pad: 0,
        }
    }

    #[test]
    fn values_round_trip_and_torn_reads_are_caught() {
        let tag = flow_tag(&key(1), 99);
        let v = FlowValue {
            backend_id: 16383,
            generation: 0xbeef,
            last_seen: 0x1234,
            referenced: true,
            closed: false,
            counted: true,
        };
        assert_eq!(FlowValue::unpack(v.pack(tag), tag), Some(v));
        let closed = FlowValue { closed: true, ..v };
        assert_eq!(FlowValue::unpack(closed.pack(tag), tag), Some(closed));
        let other = flow_tag(&key(2), 99);
        assert_ne!(check_of(tag), check_of(other));
        assert_eq!(FlowValue::unpack(v.pack(other), tag), None);
        assert!(is_referenced(v.pack(tag)));
        assert!(!is_referenced(unreferenced(v.pack(tag))));
    }

    #[test]
    fn tags_depend_on_every_field_and_the_seed() {
        let base = key(1);
        let t = flow_tag(&base, 7);
        assert_ne!(t, 0);
        assert_ne!(t, flow_tag(&base, 8));
        assert_ne!(
            t,
            flow_tag(
                &FlowKey {
                    sport: 4243,
                    ..base
                },
                7
            )
        );
        assert_ne!(t, flow_tag(&FlowKey { vip_id: 4, ..base }, 7));
        assert_ne!(
            t,
            flow_tag(
                &FlowKey {
                    src: [1, 0, 0, 1],
                    ..base
                },
                7
            )
        );
    }

    #[test]
    fn buckets_fill_evenly() {
        let mask = 1023u32;
        let mut counts = vec![0u32; 1024];
        for i in 0..102_400 {
            counts[bucket_of(flow_tag(&key(i), 5), mask) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(
            *min > 50 && *max < 160,
            "bucket loads {min}..{max} around 100"
        );
    }

    #[test]
    fn victims_prefer_the_same_tag_then_empty_then_unreferenced() {
        let tag = 0x1234_5678_9abc_def0;
        let mut ways = [FlowEntry::default(); FLOW_WAYS];
        assert_eq!(victim(&ways, tag), (0, 0));
        for (i, w) in ways.iter_mut().enumerate() {
            w.tag = 100 + i as u64;
            w.value = referenced(0);
        }
        ways[2].tag = tag;
        assert_eq!(victim(&ways, tag), (2, 0));
        ways[2].tag = 200;
        let start = ((tag >> 40) as usize) % FLOW_WAYS;
        assert_eq!(
            victim(&ways, tag),
            (start, FLOW_WAYS),
            "all referenced: start way"
        );
        let unref = (start + 2) % FLOW_WAYS;
        ways[unref].value = 0;
        assert_eq!(victim(&ways, tag), (unref, 2));
    }
}
