//! Choosing a packet's backend: the connection table first; for a new flow, admission control
//! where the VIP has it (`admission`), then the client's priority tier's backends where the
//! VIP has some, else the VIP's scheduler (Maglev inline, the others through the global
//! functions of `schedulers` and `persistence`); then the new flow is pinned unless flood mode
//! is on.

use aya_ebpf::programs::XdpContext;
use balancer_common::{
    maps::{
        Backend, FlowKey, GlobalConfig, MAX_BACKENDS, Scheduler, VIP_F_ADMISSION, VIP_F_TIERS,
        VipMeta,
    },
    stats::GlobalStats,
};

use crate::{
    admission::{ADMIT, OVERFLOW, REFUSE_BY_DROP, balancer_admit},
    backends::{serving, valid_id},
    conntrack::{Lookup, flow_slot, lookup, pin},
    flood::flood_allows_insert,
    flow::{Flow, PacketKind},
    maps::ADMISSION,
    persistence::balancer_pick,
    schedulers::{from_table, pack_addr, pack_opts, pack_pool},
    tiers::balancer_tier,
};

/// The chosen backend.
pub struct Choice {
    pub id: u32,
    pub backend: &'static Backend,
    /// Chosen afresh rather than from the connection table.
    pub new_flow: bool,
}

/// Whether admission control refused a packet's new flow, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    No,
    /// Answer a TCP SYN with a RST (drop anything else).
    Reset,
    /// Drop the packet.
    Drop,
}

/// The backend for `flow` to `vip`, or `None` if the VIP has no usable backend or admission
/// control refused the flow (then `refused` says how). An out-parameter rather than a richer
/// return type: it leaves the established flows' path as it was.
#[inline(always)]
pub fn choose(
    ctx: &XdpContext,
    vip: &VipMeta,
    flow: &Flow<'_>,
    cfg: &GlobalConfig,
    stats: &mut GlobalStats,
    refused: &mut Refused,
) -> Option<Choice> {
    let key = FlowKey {
        src: *flow.src,
        vip_id: vip.vip_id,
        sport: flow.sport,
        _pad: 0,
    };
    let mut slot = flow_slot(&key, cfg)?;
    let now = match lookup(&mut slot, flow.kind, cfg, stats) {
        Lookup::Hit(id, backend) => {
            return Some(Choice {
                id,
                backend,
                new_flow: false,
            });
        }
        Lookup::New { now } => now,
    };
    // A new flow: rarer than an established flow's packets; keep the code above tight.
    core::hint::cold_path();

    let picked = if vip.flags & VIP_F_ADMISSION != 0
        && (flow.kind == PacketKind::TcpSyn || flow.kind == PacketKind::Udp)
        && admission_consulted(vip.vip_id)
    {
        match admission(vip, flow) {
            AS_USUAL => new_flow_backend(vip, flow),
            REFUSED_RESET => {
                *refused = Refused::Reset;
                return None;
            }
            REFUSED_DROP => {
                *refused = Refused::Drop;
                return None;
            }
            overflow => serving(vip.vip_id, overflow),
        }
    } else {
        new_flow_backend(vip, flow)
    };
    let (id, backend) = picked?;
    if flood_allows_insert(ctx, cfg, stats) {
        pin(
            &mut slot,
            vip.vip_id as u16,
            id,
            backend,
            flow.kind,
            vip.counts_active(),
            now,
        );
    }
    Some(Choice {
        id,
        backend,
        new_flow: true,
    })
}

/// Whether VIP `vip_id`'s new flows go through admission control: the daemon holds its pool
/// saturated (or, in fair admission, a tenant's own limit applies while it is open). One
/// array read: an open pool's new flows pay no more for admission control.
#[inline(always)]
fn admission_consulted(vip_id: u32) -> bool {
    match ADMISSION.get(vip_id) {
        Some(a) => a.saturated != 0,
        None => false,
    }
}

/// [`admission`]'s answers besides a backend id (all above any id, and small: compared as
/// 32-bit values without sign extension, see [`valid_id`]).
const AS_USUAL: u32 = MAX_BACKENDS + 1;
const REFUSED_RESET: u32 = MAX_BACKENDS + 2;
const REFUSED_DROP: u32 = MAX_BACKENDS + 3;

/// A new flow of a VIP with admission control: [`AS_USUAL`] when admitted (chosen as usual), a
/// backend id of the overflow tier when sent there, else how it is refused (also when the
/// overflow tier has no backend to take it). Not inlined, and plain integers in and out: its
/// locals would otherwise grow the entry function's stack frame.
#[inline(never)]
fn admission(vip: &VipMeta, flow: &Flow<'_>) -> u32 {
    let (pool, src_lo, src_hi, client) = client_args(vip, flow);
    let verdict = balancer_admit(pool, src_lo, src_hi, client | u64::from(vip.flags) << 16);
    let refused = if verdict & REFUSE_BY_DROP != 0 {
        REFUSED_DROP
    } else {
        REFUSED_RESET
    };
    match verdict >> 56 {
        OVERFLOW => {
            let id = pick_in_block(vip, verdict, flow);
            if valid_id(id) { id } else { refused }
        }
        ADMIT => AS_USUAL,
        _ => refused,
    }
}

/// The backend for a new flow: from the client's priority tier's own backends when the VIP
/// has some (spilling to the shared pool as the tier allows), else from the shared pool: the
/// default scheduler (Maglev, no persistence, no bounded load) inline, the others from
/// [`balancer_pick`].
#[inline(always)]
fn new_flow_backend(vip: &VipMeta, flow: &Flow<'_>) -> Option<(u32, &'static Backend)> {
    if vip.flags & VIP_F_TIERS != 0 {
        core::hint::cold_path();
        // The tier's block (if the client has a tier and the VIP backends for it), then a
        // pick there: called one after the other, not nested, to keep the call chain's stack
        // within the kernel's limit.
        let (pool, src_lo, src_hi, client) = client_args(vip, flow);
        let block = balancer_tier(pool, src_lo, src_hi, client);
        if block != 0 {
            let id = pick_in_block(vip, block, flow);
            if valid_id(id) {
                return serving(vip.vip_id, id);
            }
            if block >> 48 == 0 {
                // The tier does not spill into the shared pool.
                return None;
            }
        }
    }
    if vip.scheduler == Scheduler::Maglev as u8 && vip.persist_ticks == 0 && vip.load_bound == 0 {
        return from_table(vip, flow.src, flow.sport);
    }
    serving(vip.vip_id, pick_in(vip, 0, vip.table_size, flow))
}

/// What [`balancer_tier`] and [`balancer_admit`] take of a new flow: the VIP's shared pool,
/// the client's address (two words), and its family and DSCP.
#[inline(always)]
fn client_args(vip: &VipMeta, flow: &Flow<'_>) -> (u64, u64, u64, u64) {
    let (src_lo, src_hi) = pack_addr(flow.src);
    (
        pack_pool(vip.vip_id, 0, vip.table_size),
        src_lo,
        src_hi,
        u64::from(flow.family) | u64::from(flow.dscp) << 8,
    )
}

/// [`balancer_pick`] in the pool block those functions answer with: its first slot in bits
/// 0-23, its size in bits 24-47.
#[inline(always)]
fn pick_in_block(vip: &VipMeta, block: u64, flow: &Flow<'_>) -> u32 {
    let base = (block & 0xff_ffff) as u32;
    let size = ((block >> 24) & 0xff_ffff) as u32;
    pick_in(vip, base, size, flow)
}

/// [`balancer_pick`] on one pool of the VIP.
#[inline(always)]
fn pick_in(vip: &VipMeta, base: u32, table_size: u32, flow: &Flow<'_>) -> u32 {
    let (src_lo, src_hi) = pack_addr(flow.src);
    balancer_pick(
        pack_pool(vip.vip_id, base, table_size),
        pack_opts(vip, flow.sport, flow.family),
        src_lo,
        src_hi,
    )
}
