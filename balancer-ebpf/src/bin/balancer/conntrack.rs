//! The connection table: a set-associative flow cache (see `balancer_common::flow_cache`)
//! that pins each flow to its backend. Lookups refresh a flow (its second-chance bit, a UDP
//! flow's idle clock) and end it on the client's FIN or RST; inserts evict by second chance.
//! Flows of VIPs that keep active-flow counts are counted while they live.

use balancer_common::{
    flow_cache::{FlowValue, bucket_of, flow_tag, is_referenced, referenced, unreferenced, victim},
    maps::{Backend, FLOW_WAYS, FlowBucket, FlowEntry, FlowKey, GlobalConfig},
    stats::{Counter, GlobalStats},
};

use crate::{
    active::add_active,
    backends::usable,
    clock::now_ticks,
    flow::PacketKind,
    maps::{BACKENDS, FLOWS},
    stats::count,
};

/// A flow's place in the connection table.
pub struct Slot {
    pub tag: u64,
    pub bucket: &'static mut FlowBucket,
}

/// The bucket a flow belongs in.
#[inline(always)]
pub fn flow_slot(key: &FlowKey, cfg: &GlobalConfig) -> Option<Slot> {
    let tag = flow_tag(key, cfg.flow_seed);
    let bucket = FLOWS.get_ptr_mut(bucket_of(tag, cfg.flow_bucket_mask))?;
    // SAFETY: a valid array element; ways are read and written with single 8-byte accesses.
    Some(Slot {
        tag,
        bucket: unsafe { &mut *bucket },
    })
}

/// What the connection table says about a flow.
pub enum Tracked {
    /// Not in the table.
    Miss,
    /// In the table, but its backend has left (removed, unhealthy, or the slot reused).
    Gone,
    /// In the table with a usable backend: the way, its value, and the backend.
    Live(usize, FlowValue, &'static Backend),
}

/// Looks a flow up in its bucket (changes nothing).
#[inline(always)]
pub fn tracked(slot: &Slot) -> Tracked {
    let mut way = 0;
    while way < FLOW_WAYS {
        let entry = &slot.bucket.ways[way];
        if entry.tag == slot.tag {
            let Some(value) = FlowValue::unpack(entry.value, slot.tag) else {
                return Tracked::Miss;
            };
            return match BACKENDS.get(u32::from(value.backend_id)) {
                Some(backend) if usable(backend) && backend.generation == value.generation => {
                    Tracked::Live(way, value, backend)
                }
                _ => Tracked::Gone,
            };
        }
        way += 1;
    }
    Tracked::Miss
}

/// The backend the table pins a flow to, if it is tracked and its backend is still there
/// (changes nothing: for packets about a flow, such as ICMP errors, rather than of it).
#[inline(always)]
pub fn pinned_backend(key: &FlowKey, cfg: &GlobalConfig) -> Option<(u32, &'static Backend)> {
    match tracked(&flow_slot(key, cfg)?) {
        Tracked::Live(_, value, backend) => Some((u32::from(value.backend_id), backend)),
        Tracked::Miss | Tracked::Gone => None,
    }
}

/// What a packet's lookup found.
pub enum Lookup {
    /// An established flow's backend (id and entry).
    Hit(u32, &'static Backend),
    /// Choose afresh: not tracked, expired, its backend gone, or a SYN. `now` is the flow
    /// clock if the lookup read it, else 0.
    New { now: u64 },
}

/// Looks a packet's flow up and keeps its entry current: a hit is marked referenced (second
/// chance), a UDP flow's idle clock restarts, a client's FIN or RST ends the flow. A TCP SYN
/// never hits (see [`PacketKind::TcpSyn`]). Counts hits, misses, rehashes and expiries.
#[inline(always)]
pub fn lookup(
    slot: &mut Slot,
    kind: PacketKind,
    cfg: &GlobalConfig,
    stats: &mut GlobalStats,
) -> Lookup {
    let found = if kind == PacketKind::TcpSyn {
        Tracked::Miss
    } else {
        tracked(slot)
    };
    match found {
        Tracked::Live(way, value, backend) => {
            let entry = &mut slot.bucket.ways[way % FLOW_WAYS];
            let hit = Lookup::Hit(u32::from(value.backend_id), backend);
            if kind == PacketKind::TcpEnd && !value.closed {
                core::hint::cold_path();
                end_flow(entry, slot.tag);
                count(stats, Counter::ConntrackHit);
                return hit;
            }
            if kind != PacketKind::Udp || cfg.udp_idle_ticks == 0 {
                if !is_referenced(entry.value) {
                    entry.value = referenced(entry.value);
                }
                count(stats, Counter::ConntrackHit);
                return hit;
            }
            let now = now_ticks();
            let idle = (now as u16).wrapping_sub(value.last_seen);
            if u32::from(idle) <= cfg.udp_idle_ticks {
                if idle != 0 || !value.referenced {
                    entry.value = FlowValue {
                        last_seen: now as u16,
                        referenced: true,
                        ..value
                    }
                    .pack(slot.tag);
                }
                count(stats, Counter::ConntrackHit);
                return hit;
            }
            count(stats, Counter::UdpFlowExpired);
            Lookup::New { now }
        }
        Tracked::Gone => {
            count(stats, Counter::FlowRehashed);
            Lookup::New { now: 0 }
        }
        Tracked::Miss => {
            count(stats, Counter::ConntrackMiss);
            Lookup::New { now: 0 }
        }
    }
}

/// Pins a new flow of VIP `vip_id` to backend `id`, evicting a way by second chance; the flow
/// counts as active if `counted`. `closed` when the flow's first packet seen is already its
/// FIN or RST. `now` is the flow clock (read here for UDP if 0).
#[inline(always)]
pub fn pin(
    slot: &mut Slot,
    vip_id: u16,
    id: u32,
    backend: &Backend,
    kind: PacketKind,
    counted: bool,
    mut now: u64,
) {
    if kind == PacketKind::Udp && now == 0 {
        now = now_ticks();
    }
    let closed = kind == PacketKind::TcpEnd;
    let counted = counted && !closed;
    let (old_tag, old_value) = insert(
        slot,
        FlowValue {
            backend_id: id as u16,
            generation: backend.generation,
            last_seen: now as u16,
            referenced: false,
            closed,
            counted,
        },
    );
    // The evicted flow may be any VIP's: its value says whether it was counted.
    forget_evicted(old_tag, old_value);
    if counted {
        add_active(id, vip_id, 1);
    }
}

/// Takes a way (see `flow_cache::victim`) and writes the value before the tag, so a reader
/// that sees the tag sees its value. Returns the way's previous tag and value (the flow it
/// evicts, if any).
#[inline(always)]
fn insert(slot: &mut Slot, value: FlowValue) -> (u64, u64) {
    let (way, passed) = victim(&slot.bucket.ways, slot.tag);
    // Second chance: the referenced ways passed over lose their bit.
    let start = way + FLOW_WAYS - passed;
    let mut n = 0;
    while n < passed && n < FLOW_WAYS {
        let w = (start + n) % FLOW_WAYS;
        slot.bucket.ways[w].value = unreferenced(slot.bucket.ways[w].value);
        n += 1;
    }
    let entry = &mut slot.bucket.ways[way % FLOW_WAYS];
    let evicted = (entry.tag, entry.value);
    entry.value = value.pack(slot.tag);
    entry.tag = slot.tag;
    evicted
}

/// The client ends a connection (FIN or RST): it stops counting as active (in the daemon's
/// counts, and in the data plane's where its VIP keeps them), and keeps its backend for the
/// rest of the teardown. Out of line, off the established-flow path.
#[inline(never)]
fn end_flow(entry: &mut FlowEntry, tag: u64) {
    let Some(value) = FlowValue::unpack(entry.value, tag) else {
        return;
    };
    entry.value = FlowValue {
        closed: true,
        referenced: true,
        ..value
    }
    .pack(tag);
    let id = u32::from(value.backend_id);
    if value.counted
        && let Some(b) = BACKENDS.get(id)
    {
        add_active(id, b.vip_id, u64::MAX);
    }
}

/// A flow pushed out of the connection table by an insert no longer counts as active (unless
/// it had ended, or its backend's slot has since gone to another backend).
#[inline(always)]
fn forget_evicted(tag: u64, value: u64) {
    if tag == 0 {
        return;
    }
    let Some(v) = FlowValue::unpack(value, tag) else {
        return;
    };
    if !v.counted || v.closed {
        return;
    }
    let id = u32::from(v.backend_id);
    if let Some(b) = BACKENDS.get(id)
        && b.generation == v.generation
    {
        add_active(id, b.vip_id, u64::MAX);
    }
}
