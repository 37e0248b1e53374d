//! Choosing a packet's backend: the connection table first; for a new flow, the client's
//! priority tier's backends where the VIP has some, else the VIP's scheduler (Maglev inline,
//! the others through the global functions of `schedulers` and `persistence`); then the new
//! flow is pinned unless flood mode is on.

use aya_ebpf::programs::XdpContext;
use balancer_common::{
    maps::{Backend, FlowKey, GlobalConfig, Scheduler, VIP_F_TIERS, VipMeta},
    stats::GlobalStats,
};

use crate::{
    backends::{serving, valid_id},
    conntrack::{Lookup, flow_slot, lookup, pin},
    flood::flood_allows_insert,
    flow::Flow,
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

    let (id, backend) = new_flow_backend(vip, flow)?;
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

/// The backend for a new flow: from the client's priority tier's own backends when the VIP
/// has some (spilling to the shared pool as the tier allows), else from the shared pool: the
/// default scheduler (Maglev, no persistence, no bounded load) inline, the others from
/// [`balancer_pick`].
#[inline(always)]
fn new_flow_backend(vip: &VipMeta, flow: &Flow<'_>) -> Option<(u32, &'static Backend)> {
    if vip.flags & VIP_F_TIERS != 0 {
        core::hint::cold_path();
        let (src_lo, src_hi) = pack_addr(flow.src);
        // The tier's block (if the client has a tier and the VIP backends for it), then a
        // pick there: called one after the other, not nested, to keep the call chain's stack
        // within the kernel's limit.
        let block = balancer_tier(
            pack_pool(vip.vip_id, 0, vip.table_size),
            src_lo,
            src_hi,
            u64::from(flow.family) | u64::from(flow.dscp) << 8,
        );
        if block != 0 {
            let base = (block & 0xff_ffff) as u32;
            let size = ((block >> 24) & 0xff_ffff) as u32;
            let id = pick_in(vip, base, size, flow);
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
