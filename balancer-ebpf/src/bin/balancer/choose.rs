//! Choosing a packet's backend: the VIP index, then the connection table (a set-associative
//! flow cache, see `balancer_common::flow_cache`), the VIP's Maglev table for new flows, and
//! flood mode to keep a burst of new flows from thrashing the connection table.

use aya_ebpf::{helpers::generated::bpf_ktime_get_coarse_ns, programs::XdpContext};
use aya_log_ebpf::warn;
use balancer_common::{
    addr::RawAddr,
    flow_cache::{
        FlowValue, TICK_SHIFT, bucket_of, flow_tag, is_referenced, referenced, unreferenced, victim,
    },
    flow_hash::{flow_hash, slot},
    maps::{
        BACKEND_F_ACTIVE, Backend, FLOW_WAYS, FlowBucket, FlowKey, GlobalConfig, NO_BACKEND,
        VIP_INDEX_PROBES, VipKey, VipMeta,
    },
    stats::{Counter, GlobalStats},
    vip_index::{probe_slot, same_key, vip_hash},
};

use crate::maps::{BACKENDS, FLOOD, FLOWS, MAGLEV, VIPS};

/// The VIP (or address marker) with this key, from the VIP index.
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

/// What kind of packet a flow's packet is, as far as choosing goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PacketKind {
    /// A TCP SYN without ACK: a new connection, always chosen afresh from the table (a reused
    /// client port must not land on the backend an old connection had, which may be draining).
    TcpSyn,
    /// Any other TCP packet.
    Tcp,
    /// UDP: tracked flows expire after the configured idle time.
    Udp,
}

/// A packet's flow: the client address and port, and the packet kind.
pub struct Flow<'a> {
    pub src: &'a RawAddr,
    pub sport: u16,
    pub kind: PacketKind,
}

/// The chosen backend.
pub struct Choice {
    pub id: u32,
    pub backend: &'static Backend,
    /// Chosen from the Maglev table rather than the connection table.
    pub new_flow: bool,
}

#[inline(always)]
fn usable(backend: &Backend) -> bool {
    backend.flags & BACKEND_F_ACTIVE != 0
}

/// The flow clock in ticks of 2^30 ns (a coarse clock: cheap, ~jiffy precision).
#[inline(always)]
fn now_ticks() -> u64 {
    // SAFETY: helper without arguments.
    (unsafe { bpf_ktime_get_coarse_ns() }) >> TICK_SHIFT
}

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

/// Looks a flow up in its bucket.
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
                Some(backend)
                    if usable(backend) && backend.generation as u16 == value.generation =>
                {
                    Tracked::Live(way, value, backend)
                }
                _ => Tracked::Gone,
            };
        }
        way += 1;
    }
    Tracked::Miss
}

/// Pins a flow to a backend: takes a way (see `flow_cache::victim`) and writes the value before
/// the tag, so a reader that sees the tag sees its value.
#[inline(always)]
fn insert(slot: &mut Slot, value: FlowValue) {
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
    entry.value = value.pack(slot.tag);
    entry.tag = slot.tag;
}

/// The backend for `flow` to `vip`, or `None` if the VIP has no usable backend.
#[inline(always)]
pub fn choose(
    ctx: &XdpContext,
    vip: &VipMeta,
    flow: &Flow<'_>,
    cfg: &GlobalConfig,
    stats: &mut GlobalStats,
) -> Option<Choice> {
    let key = FlowKey {
        src: *flow.src,
        vip_id: vip.vip_id,
        sport: flow.sport,
        _pad: 0,
    };
    let mut slot = flow_slot(&key, cfg)?;
    let udp = flow.kind == PacketKind::Udp;
    let found = if flow.kind == PacketKind::TcpSyn {
        Tracked::Miss
    } else {
        tracked(&slot)
    };
    let mut now = 0;
    match found {
        Tracked::Live(way, value, backend) => {
            let entry = &mut slot.bucket.ways[way % FLOW_WAYS];
            if !udp || cfg.udp_idle_ticks == 0 {
                if !is_referenced(entry.value) {
                    entry.value = referenced(entry.value);
                }
                count(stats, Counter::ConntrackHit);
                return Some(Choice {
                    id: u32::from(value.backend_id),
                    backend,
                    new_flow: false,
                });
            }
            now = now_ticks();
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
                return Some(Choice {
                    id: u32::from(value.backend_id),
                    backend,
                    new_flow: false,
                });
            }
            count(stats, Counter::UdpFlowExpired);
        }
        Tracked::Gone => count(stats, Counter::FlowRehashed),
        Tracked::Miss => count(stats, Counter::ConntrackMiss),
    }

    let (id, backend) = from_table(vip, flow.src, flow.sport)?;
    if flood_allows_insert(ctx, cfg, stats) {
        if udp && now == 0 {
            now = now_ticks();
        }
        insert(
            &mut slot,
            FlowValue {
                backend_id: id as u16,
                generation: backend.generation as u16,
                last_seen: now as u16,
                referenced: false,
            },
        );
    }
    Some(Choice {
        id,
        backend,
        new_flow: true,
    })
}

/// The backend the VIP's Maglev table assigns to the flow (no connection tracking).
#[inline(always)]
pub fn from_table(vip: &VipMeta, src: &RawAddr, sport: u16) -> Option<(u32, &'static Backend)> {
    if vip.table_size == 0 {
        return None;
    }
    let index = slot(flow_hash(src, sport), vip.table_size);
    let id = *MAGLEV.get_value(vip.vip_id, &index)?;
    if id == NO_BACKEND {
        return None;
    }
    let backend = BACKENDS.get(id)?;
    if !usable(backend) {
        return None;
    }
    Some((id, backend))
}

/// Counts a new flow against this CPU's window (one flow-clock tick); `false` once the window
/// is over the threshold (flood mode: the flow is forwarded by hash alone, not inserted).
#[inline(always)]
fn flood_allows_insert(ctx: &XdpContext, cfg: &GlobalConfig, stats: &mut GlobalStats) -> bool {
    if cfg.flood_threshold == 0 {
        return true;
    }
    let Some(window) = FLOOD.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: per-CPU value, valid for the program's run.
    let window = unsafe { &mut *window };
    let now = now_ticks();
    if now != window.tick {
        window.tick = now;
        window.new_flows = 0;
        window.flooding = 0;
    }
    window.new_flows += 1;
    if window.new_flows <= cfg.flood_threshold {
        return true;
    }
    if window.flooding == 0 {
        window.flooding = 1;
        count(stats, Counter::FloodActivations);
        warn!(
            ctx,
            "flood mode: over {} new flows/s on this CPU; new flows use the hash alone",
            cfg.flood_threshold
        );
    }
    count(stats, Counter::FloodInsertsSkipped);
    false
}

#[inline(always)]
pub fn count(stats: &mut GlobalStats, counter: Counter) {
    stats.counters[counter as usize] += 1;
}
