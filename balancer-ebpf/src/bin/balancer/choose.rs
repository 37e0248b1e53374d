//! Choosing a packet's backend: the connection table first, the VIP's Maglev table for new
//! flows, and flood mode to keep a burst of new flows from thrashing the connection table.

use aya_ebpf::{helpers::generated::bpf_ktime_get_ns, programs::XdpContext};
use aya_log_ebpf::warn;
use balancer_common::{
    addr::RawAddr,
    flow_hash::{flow_hash, slot},
    maps::{BACKEND_F_ACTIVE, Backend, FlowKey, FlowState, GlobalConfig, NO_BACKEND, VipMeta},
    stats::{Counter, GlobalStats},
};

use crate::maps::{BACKENDS, FLOOD, FLOWS, MAGLEV};

const NS_PER_SEC: u64 = 1_000_000_000;

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

/// What the connection table says about a flow.
pub enum Tracked {
    /// Not in the table.
    Miss,
    /// In the table, but its backend has left (removed, unhealthy, or the slot reused).
    Gone,
    /// In the table with a usable backend.
    Live(&'static mut FlowState, &'static Backend),
}

/// Looks a flow up in the connection table.
#[inline(always)]
pub fn tracked(key: &FlowKey) -> Tracked {
    let Some(state) = FLOWS.get_ptr_mut(key) else {
        return Tracked::Miss;
    };
    // SAFETY: the kernel returned a valid pointer to the value; it stays valid while the
    // program runs.
    let state = unsafe { &mut *state };
    match BACKENDS.get(state.backend_id) {
        Some(backend) if usable(backend) && backend.generation == state.backend_generation => {
            Tracked::Live(state, backend)
        }
        _ => Tracked::Gone,
    }
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
    let udp = flow.kind == PacketKind::Udp;
    let tracked = if flow.kind == PacketKind::TcpSyn {
        Tracked::Miss
    } else {
        tracked(&key)
    };
    match tracked {
        Tracked::Live(state, backend) => {
            if !udp || cfg.udp_idle_timeout_ns == 0 {
                count(stats, Counter::ConntrackHit);
                return Some(Choice {
                    id: state.backend_id,
                    backend,
                    new_flow: false,
                });
            }
            // SAFETY: helper without arguments.
            let now = unsafe { bpf_ktime_get_ns() };
            if now.wrapping_sub(state.last_seen_ns) <= cfg.udp_idle_timeout_ns {
                state.last_seen_ns = now;
                count(stats, Counter::ConntrackHit);
                return Some(Choice {
                    id: state.backend_id,
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
        let state = FlowState {
            backend_id: id,
            backend_generation: backend.generation,
            // SAFETY: helper without arguments.
            last_seen_ns: if udp {
                unsafe { bpf_ktime_get_ns() }
            } else {
                0
            },
        };
        // A failed insert only means the next packet of the flow is hashed again.
        let _ = FLOWS.insert(key, state, 0);
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

/// Counts a new flow against this CPU's one-second window; `false` once the window is over
/// the threshold (flood mode: the flow is forwarded by hash alone, not inserted).
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
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(window.start_ns) > NS_PER_SEC {
        window.start_ns = now;
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
