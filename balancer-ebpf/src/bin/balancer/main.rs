//! The balancer's XDP program.
//!
//! The packet path reads top to bottom: parse, look up the VIP, choose a backend (connection
//! table, else the VIP's scheduler), rewrite or encapsulate, count. Anything not addressed to
//! a VIP leaves untouched with `XDP_PASS`, so the host's own traffic (ARP, SSH, ICMP to its
//! addresses) is unaffected.
//!
//! One module per concern, in the order a packet meets them: `vip_index`; `choose` (the
//! decision) over `conntrack`, `admission` (with `reset`, the RST a refused SYN gets), `tiers`,
//! `persistence` and `schedulers`, with `backends` (which backend may take a VIP's flow),
//! `active` (active-flow counts), `flood` and `clock`; `scrape_due` (a paced VIP's new flows,
//! counted toward its next scrape); `forward` (DSR, IPIP, GUE) and `nat` (NAT, both ways, with
//! `nat_icmp` and `links`, the link a NAT frame leaves on); `icmp` (errors about VIP flows,
//! echo, PMTU); `stats`; `maps`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Atomic adds to shared counters: the BPF target has no compare-and-swap, so `core::sync::atomic`
// offers no `fetch_add` there; the intrinsic lowers to the BPF atomic add instruction.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

mod active;
mod admission;
mod backends;
mod choose;
mod clock;
mod conntrack;
mod flood;
mod flow;
mod forward;
mod homes;
mod icmp;
mod links;
mod maps;
// Keys and values go to the map helpers by reference into the scratch area: by value (as
// clippy suggests) they would be copied to the stack the NAT functions keep small.
#[allow(clippy::needless_borrows_for_generic_args)]
mod nat;
#[allow(clippy::needless_borrows_for_generic_args)]
mod nat_icmp;
mod persistence;
mod reset;
mod schedulers;
mod scrape_due;
mod stats;
mod tiers;
mod vip_index;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    macros::xdp,
    programs::XdpContext,
};
use balancer_common::{
    maps::{VIP_F_SCRAPE_DUE, VipKey},
    stats::{Counter, GlobalStats},
};
use balancer_ebpf::{
    headers::{IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP},
    parse::{
        Frame, Ip, Shape, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, parse_ip, parse_l2, parse_ports,
        parse_tcp_flags,
    },
};

use crate::{
    choose::{Refused, choose},
    flow::{Flow, PacketKind},
    forward::{EncapError, flow_entropy, to_backend},
    maps::{BACKEND_STATS, CONFIG, STATS, VIP_STATS},
    stats::{add_traffic, count},
    vip_index::{Probe, find_vip},
};

#[xdp]
pub fn balancer(ctx: XdpContext) -> u32 {
    let frame = Frame::of(&ctx);
    let Some(l2) = parse_l2(&frame) else {
        return XDP_PASS;
    };
    let Some(ip) = parse_ip(&frame, &l2) else {
        return XDP_PASS;
    };
    if ip.shape == Shape::Plain
        && (ip.proto == IPPROTO_TCP || ip.proto == IPPROTO_UDP)
        && let Some(ports) = parse_ports(&frame, ip.l4_off)
    {
        let key = VipKey {
            addr: ip.dst,
            port: ports.dst,
            proto: ip.proto,
            family: ip.family,
        };
        let vip = match find_vip(&key) {
            Probe::Vip(vip) => vip,
            Probe::Miss { nat } => return not_for_a_vip(&ctx, &ip, nat),
        };
        let kind = if ip.proto == IPPROTO_UDP {
            PacketKind::Udp
        } else {
            match parse_tcp_flags(&frame, ip.l4_off) {
                Some(flags) if flags & (TCP_SYN | TCP_ACK) == TCP_SYN => PacketKind::TcpSyn,
                Some(flags) if flags & (TCP_FIN | TCP_RST) != 0 => PacketKind::TcpEnd,
                _ => PacketKind::Tcp,
            }
        };
        let flow = Flow {
            src: &ip.src,
            sport: ports.src,
            kind,
            family: ip.family,
            dscp: ip.tos >> 2,
        };
        let Some(stats) = global_stats() else {
            return XDP_PASS;
        };
        let action = to_vip(&ctx, &frame, &ip, vip, &flow, stats);
        return counted(stats, action);
    }
    not_plain_transport(&ctx, &frame, &ip)
}

/// This CPU's global counters: looked up only for packets the program acts on, so traffic
/// that is not for a VIP pays nothing for them.
#[inline(always)]
fn global_stats() -> Option<&'static mut GlobalStats> {
    // SAFETY: this CPU's entry, valid while the program runs.
    STATS.get_ptr_mut(0).map(|stats| unsafe { &mut *stats })
}

/// Counts the action the program takes on a packet it handled, and returns it.
#[inline(always)]
fn counted(stats: &mut GlobalStats, action: u32) -> u32 {
    let counter = match action {
        XDP_TX => Counter::ActionTx,
        XDP_DROP => Counter::ActionDrop,
        XDP_PASS => Counter::ActionPass,
        // `XDP_REDIRECT`: counted where NAT sends a frame to its other link (`links`).
        _ => return action,
    };
    count(stats, counter);
    action
}

/// A TCP/UDP packet for a VIP.
#[inline(always)]
fn to_vip(
    ctx: &XdpContext,
    frame: &Frame,
    ip: &Ip,
    vip: &balancer_common::maps::VipMeta,
    flow: &Flow<'_>,
    stats: &mut GlobalStats,
) -> u32 {
    let Some(cfg) = CONFIG.get(0) else {
        return XDP_PASS;
    };
    let mut refused = Refused::No;
    let Some(choice) = choose(ctx, vip, flow, cfg, stats, &mut refused) else {
        return match refused {
            Refused::No => {
                count(stats, Counter::DropNoBackend);
                XDP_DROP
            }
            // Refused by admission control (counted there): a SYN is answered with a RST.
            Refused::Reset if flow.kind == PacketKind::TcpSyn => reset::balancer_reset(ctx.ctx),
            _ => XDP_DROP,
        };
    };
    let bytes = frame.size() as u64;
    add_traffic(VIP_STATS.get_ptr_mut(vip.vip_id), bytes, choice.new_flow);
    add_traffic(BACKEND_STATS.get_ptr_mut(choice.id), bytes, choice.new_flow);
    if choice.new_flow && vip.flags & VIP_F_SCRAPE_DUE != 0 {
        scrape_due::count_new_flow(vip.vip_id);
    }
    let entropy = flow_entropy(flow.src, flow.sport);
    match to_backend(ctx, ip, vip, choice.id, choice.backend, cfg, entropy) {
        Ok(action) => action,
        Err(EncapError::TooBig { mtu }) => icmp::too_big(ctx, ip, mtu, stats),
        Err(EncapError::Failed) => {
            count(stats, Counter::DropEncapFailed);
            XDP_DROP
        }
    }
}

/// A TCP/UDP packet not for a VIP: a NAT flow's reply gets its VIP back (only looked up while
/// a VIP forwards by NAT: `nat`, the global NAT bits the VIP index's miss returned); anything
/// else passes untouched and uncounted.
#[inline(always)]
fn not_for_a_vip(ctx: &XdpContext, ip: &Ip, nat: u32) -> u32 {
    if nat == 0 {
        return XDP_PASS;
    }
    let Some(stats) = global_stats() else {
        return XDP_PASS;
    };
    counted(stats, nat::balancer_nat_reply(ctx.ctx, nat::pack(ip, nat)))
}

/// A packet for none of the VIP addresses that is not plain TCP/UDP: an ICMP error about a
/// NAT flow goes to the flow's client (only looked at while a VIP forwards by NAT); anything
/// else passes untouched and uncounted.
#[inline(always)]
fn not_for_a_vip_address(ctx: &XdpContext, ip: &Ip, nat: u32) -> u32 {
    if nat == 0 || ip.shape != Shape::Plain || !is_icmp(ip) {
        return XDP_PASS;
    }
    let Some(stats) = global_stats() else {
        return XDP_PASS;
    };
    counted(
        stats,
        nat_icmp::balancer_nat_icmp_to_client(ctx.ctx, nat::pack(ip, nat)),
    )
}

/// Whether the packet is ICMP of its own family (ICMP in IPv4, ICMPv6 in IPv6).
#[inline(always)]
fn is_icmp(ip: &Ip) -> bool {
    if ip.family == balancer_common::addr::FAMILY_V4 {
        ip.proto == IPPROTO_ICMP
    } else {
        ip.proto == IPPROTO_ICMPV6
    }
}

/// Fragments, IPv4 options, malformed headers, ICMP and other protocols: only packets for a VIP
/// address are ours; everything else passes untouched.
#[inline(always)]
fn not_plain_transport(ctx: &XdpContext, frame: &Frame, ip: &Ip) -> u32 {
    let key = VipKey {
        addr: ip.dst,
        port: 0,
        proto: 0,
        family: ip.family,
    };
    if let Probe::Miss { nat } = find_vip(&key) {
        return not_for_a_vip_address(ctx, ip, nat);
    }
    let Some(stats) = global_stats() else {
        return XDP_PASS;
    };
    let drop_reason = match ip.shape {
        Shape::Fragment => Counter::DropFragment,
        Shape::Options => Counter::DropIpOptions,
        Shape::Malformed => Counter::DropMalformed,
        Shape::Plain => match ip.proto {
            // ICMP of the packet's own family (ICMPv6's number in an IPv4 header is not ICMP).
            IPPROTO_ICMP | IPPROTO_ICMPV6 if is_icmp(ip) => {
                let Some(cfg) = CONFIG.get(0) else {
                    return XDP_PASS;
                };
                let action = icmp::to_vip_address(ctx, frame, ip, cfg, stats);
                return counted(stats, action);
            }
            // TCP/UDP whose ports are cut off.
            IPPROTO_TCP | IPPROTO_UDP => Counter::DropMalformed,
            _ => return counted(stats, XDP_PASS),
        },
    };
    count(stats, drop_reason);
    counted(stats, XDP_DROP)
}

#[cfg(all(target_arch = "bpf", not(test)))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
