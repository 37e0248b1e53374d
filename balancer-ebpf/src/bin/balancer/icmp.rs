//! ICMP at the balancer: answering clients whose packets would not fit once encapsulated,
//! answering pings to VIP addresses, and forwarding ICMP errors that quote a VIP flow (for
//! example a router's fragmentation-needed about a backend's reply) to that flow's backend.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    helpers::generated::bpf_xdp_adjust_tail,
    programs::XdpContext,
};
use balancer_common::{
    addr::{FAMILY_V4, FAMILY_V6, RawAddr},
    maps::{FlowKey, ForwardMode, GlobalConfig, VipKey},
    stats::{Counter, GlobalStats},
};
use balancer_ebpf::{
    csum,
    headers::*,
    parse::{Frame, Ip},
};

use crate::{
    conntrack::pinned_backend,
    forward::{EncapError, NOT_NAT, flow_entropy, push_headroom, to_backend},
    schedulers::from_table,
    stats::count,
    vip_index::{Probe, find_vip},
};

/// Bytes of the offending packet quoted back: its IP header and the first 8 bytes after it.
const QUOTE_V4: usize = IPV4_LEN + 8;
const QUOTE_V6: usize = IPV6_LEN + 8;
/// Smallest MTU an IPv6 link may have; never advertise less.
const IPV6_MIN_MTU: u32 = 1280;

/// Replaces the packet with ICMP fragmentation-needed (IPv4) or packet-too-big (IPv6) for its
/// sender, advertising `mtu`, and returns the action that sends it back.
#[inline(always)]
pub fn too_big(ctx: &XdpContext, ip: &Ip, mtu: u32, stats: &mut GlobalStats) -> u32 {
    let result = if ip.family == FAMILY_V4 {
        too_big_v4(ctx, ip, mtu)
    } else {
        too_big_v6(ctx, ip, mtu.max(IPV6_MIN_MTU))
    };
    match result {
        Ok(()) => {
            count(stats, Counter::IcmpTooBigSent);
            XDP_TX
        }
        Err(_) => {
            count(stats, Counter::DropEncapFailed);
            XDP_DROP
        }
    }
}

/// Trims the frame to `len` bytes.
#[inline(always)]
pub(crate) fn trim(ctx: &XdpContext, len: usize) -> Result<Frame, EncapError> {
    let frame = Frame::of(ctx);
    let delta = len as i32 - frame.size() as i32;
    // SAFETY: `ctx.ctx` is the program's context.
    if delta > 0 || unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
        return Err(EncapError::Failed);
    }
    Ok(Frame::of(ctx))
}

#[inline(always)]
fn too_big_v4(ctx: &XdpContext, ip: &Ip, mtu: u32) -> Result<(), EncapError> {
    // The quote must exist before anything is moved.
    Frame::of(ctx)
        .ptr::<[u8; QUOTE_V4]>(ip.l3_off)
        .ok_or(EncapError::Failed)?;
    push_headroom(ctx, IPV4_LEN + ICMP_LEN, None)?;
    let total = IPV4_LEN + ICMP_LEN + QUOTE_V4;
    let frame = trim(ctx, ip.l3_off + total)?;
    let h = frame.ptr::<Ipv4Hdr>(ip.l3_off).ok_or(EncapError::Failed)?;
    // SAFETY: bounds checked by `ptr`.
    let h = unsafe { &mut *h };
    *h = Ipv4Hdr {
        ver_ihl: 0x45,
        tos: 0,
        tot_len: (total as u16).to_be(),
        id: 0,
        frag_off: 0,
        ttl: 64,
        proto: IPPROTO_ICMP,
        check: 0,
        saddr: ip.dst[0],
        daddr: ip.src[0],
    };
    h.check = csum::ipv4_header(h);
    let icmp_off = ip.l3_off + IPV4_LEN;
    let icmp = frame.ptr::<IcmpHdr>(icmp_off).ok_or(EncapError::Failed)?;
    let mtu = (mtu.min(0xffff) as u16).to_be_bytes();
    // SAFETY: bounds checked by `ptr`.
    let icmp = unsafe { &mut *icmp };
    *icmp = IcmpHdr {
        kind: ICMP_DEST_UNREACH,
        code: ICMP_FRAG_NEEDED,
        check: 0,
        rest: [0, 0, mtu[0], mtu[1]],
    };
    let body = frame
        .ptr::<[u16; (ICMP_LEN + QUOTE_V4) / 2]>(icmp_off)
        .ok_or(EncapError::Failed)?;
    // SAFETY: `body` covers exactly the ICMP message.
    icmp.check =
        !csum::fold(unsafe { csum::sum_words::<{ (ICMP_LEN + QUOTE_V4) / 2 }>(body.cast()) });
    Ok(())
}

#[inline(always)]
fn too_big_v6(ctx: &XdpContext, ip: &Ip, mtu: u32) -> Result<(), EncapError> {
    Frame::of(ctx)
        .ptr::<[u8; QUOTE_V6]>(ip.l3_off)
        .ok_or(EncapError::Failed)?;
    push_headroom(ctx, IPV6_LEN + ICMP_LEN, None)?;
    let payload = ICMP_LEN + QUOTE_V6;
    let frame = trim(ctx, ip.l3_off + IPV6_LEN + payload)?;
    let h = frame.ptr::<Ipv6Hdr>(ip.l3_off).ok_or(EncapError::Failed)?;
    // SAFETY: bounds checked by `ptr`.
    unsafe {
        *h = Ipv6Hdr {
            ver_tc_flow: [0x60, 0, 0, 0],
            payload_len: (payload as u16).to_be(),
            next_hdr: IPPROTO_ICMPV6,
            hop_limit: 255,
            saddr: ip.dst,
            daddr: ip.src,
        }
    };
    let icmp_off = ip.l3_off + IPV6_LEN;
    let icmp = frame.ptr::<IcmpHdr>(icmp_off).ok_or(EncapError::Failed)?;
    // SAFETY: bounds checked by `ptr`.
    let icmp = unsafe { &mut *icmp };
    *icmp = IcmpHdr {
        kind: ICMPV6_PACKET_TOO_BIG,
        code: 0,
        check: 0,
        rest: mtu.to_be_bytes(),
    };
    let body = frame
        .ptr::<[u16; (ICMP_LEN + QUOTE_V6) / 2]>(icmp_off)
        .ok_or(EncapError::Failed)?;
    let pseudo = csum::sum_addr(&ip.src)
        + csum::sum_addr(&ip.dst)
        + u64::from((payload as u16).to_be())
        + u64::from(u16::from(IPPROTO_ICMPV6).to_be());
    // SAFETY: `body` covers exactly the ICMPv6 message.
    let sum = pseudo + unsafe { csum::sum_words::<{ (ICMP_LEN + QUOTE_V6) / 2 }>(body.cast()) };
    icmp.check = !csum::fold(sum);
    Ok(())
}

/// Handles an ICMP or ICMPv6 packet addressed to a VIP address.
#[inline(always)]
pub fn to_vip_address(
    ctx: &XdpContext,
    frame: &Frame,
    ip: &Ip,
    cfg: &GlobalConfig,
    stats: &mut GlobalStats,
) -> u32 {
    let Some(icmp) = frame.ptr::<IcmpHdr>(ip.l4_off) else {
        count(stats, Counter::DropMalformed);
        return XDP_DROP;
    };
    // SAFETY: bounds checked by `ptr`.
    let icmp = unsafe { &mut *icmp };
    let (echo_request, echo_reply) = if ip.family == FAMILY_V4 {
        (ICMP_ECHO_REQUEST, ICMP_ECHO_REPLY)
    } else {
        (ICMPV6_ECHO_REQUEST, ICMPV6_ECHO_REPLY)
    };
    if icmp.kind == echo_request && icmp.code == 0 {
        return echo(frame, ip, icmp, echo_reply);
    }
    if !is_error(ip.family, icmp.kind) {
        return XDP_PASS;
    }
    forward_error(ctx, frame, ip, cfg, stats)
}

/// Whether an ICMP (`family` IPv4) or ICMPv6 message of type `kind` is an error that quotes
/// the packet it is about.
#[inline(always)]
pub fn is_error(family: u8, kind: u8) -> bool {
    if family == FAMILY_V4 {
        matches!(
            kind,
            ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
        )
    } else {
        matches!(
            kind,
            ICMPV6_DEST_UNREACH
                | ICMPV6_PACKET_TOO_BIG
                | ICMPV6_TIME_EXCEEDED
                | ICMPV6_PARAMETER_PROBLEM
        )
    }
}

/// Turns an echo request into the reply, in place.
#[inline(always)]
fn echo(frame: &Frame, ip: &Ip, icmp: &mut IcmpHdr, reply: u8) -> u32 {
    let old = u16::from_ne_bytes([icmp.kind, icmp.code]);
    icmp.kind = reply;
    let new = u16::from_ne_bytes([icmp.kind, icmp.code]);
    // RFC 1624: HC' = ~(~HC + ~m + m'). Swapping the addresses leaves both sums unchanged.
    icmp.check = !csum::fold(u64::from(!icmp.check) + u64::from(!old) + u64::from(new));
    if ip.family == FAMILY_V4 {
        let Some(h) = frame.ptr::<Ipv4Hdr>(ip.l3_off) else {
            return XDP_DROP;
        };
        // SAFETY: bounds checked by `ptr`.
        let h = unsafe { &mut *h };
        h.saddr = ip.dst[0];
        h.daddr = ip.src[0];
    } else {
        let Some(h) = frame.ptr::<Ipv6Hdr>(ip.l3_off) else {
            return XDP_DROP;
        };
        // SAFETY: bounds checked by `ptr`.
        let h = unsafe { &mut *h };
        h.saddr = ip.dst;
        h.daddr = ip.src;
    }
    let Some(eth) = frame.ptr::<EthHdr>(0) else {
        return XDP_DROP;
    };
    // SAFETY: bounds checked by `ptr`.
    let eth = unsafe { &mut *eth };
    core::mem::swap(&mut eth.dst, &mut eth.src);
    XDP_TX
}

/// The flow an ICMP error quotes: the packet a backend sent from the VIP to a client.
struct Quoted {
    vip: VipKey,
    client: RawAddr,
    client_port: u16,
}

#[inline(always)]
fn quoted_flow(frame: &Frame, ip: &Ip) -> Option<Quoted> {
    let inner = ip.l4_off + ICMP_LEN;
    if ip.family == FAMILY_V4 {
        let h = frame.ptr::<Ipv4Hdr>(inner)?;
        // SAFETY: bounds checked by `ptr`.
        let h = unsafe { &*h };
        if h.ver_ihl != 0x45 {
            return None;
        }
        let ports = frame.ptr::<Ports>(inner + IPV4_LEN)?;
        // SAFETY: bounds checked by `ptr`.
        let ports = unsafe { *ports };
        Some(Quoted {
            vip: VipKey {
                addr: [h.saddr, 0, 0, 0],
                port: ports.src,
                proto: h.proto,
                family: FAMILY_V4,
            },
            client: [h.daddr, 0, 0, 0],
            client_port: ports.dst,
        })
    } else {
        let h = frame.ptr::<Ipv6Hdr>(inner)?;
        // SAFETY: bounds checked by `ptr`.
        let h = unsafe { &*h };
        let ports = frame.ptr::<Ports>(inner + IPV6_LEN)?;
        // SAFETY: bounds checked by `ptr`.
        let ports = unsafe { *ports };
        Some(Quoted {
            vip: VipKey {
                addr: h.saddr,
                port: ports.src,
                proto: h.next_hdr,
                family: FAMILY_V6,
            },
            client: h.daddr,
            client_port: ports.dst,
        })
    }
}

/// Sends an ICMP error about a VIP flow to the backend serving that flow.
#[inline(always)]
fn forward_error(
    ctx: &XdpContext,
    frame: &Frame,
    ip: &Ip,
    cfg: &GlobalConfig,
    stats: &mut GlobalStats,
) -> u32 {
    let Some(quoted) = quoted_flow(frame, ip) else {
        return XDP_PASS;
    };
    if quoted.vip.proto != IPPROTO_TCP && quoted.vip.proto != IPPROTO_UDP {
        return XDP_PASS;
    }
    let Probe::Vip(vip) = find_vip(&quoted.vip) else {
        return XDP_PASS;
    };
    let key = FlowKey {
        src: quoted.client,
        vip_id: vip.vip_id,
        sport: quoted.client_port,
        _pad: 0,
    };
    let (id, backend) = match pinned_backend(&key, cfg) {
        Some(pinned) => pinned,
        None => match from_table(vip, &quoted.client, quoted.client_port) {
            Some(chosen) => chosen,
            None => {
                count(stats, Counter::DropNoBackend);
                return XDP_DROP;
            }
        },
    };
    // A NAT flow's error is translated as the flow's packets are.
    if vip.mode == ForwardMode::Nat as u8 {
        let action = crate::nat_icmp::balancer_nat_icmp_to_backend(
            ctx.ctx,
            crate::nat::pack(ip, 0),
            id,
            vip.vip_id,
        );
        if action == XDP_TX {
            count(stats, Counter::IcmpErrorForwarded);
        }
        return action;
    }
    let entropy = flow_entropy(&quoted.client, quoted.client_port);
    match to_backend(ctx, ip, vip, NOT_NAT, backend, cfg, entropy) {
        Ok(action) => {
            count(stats, Counter::IcmpErrorForwarded);
            action
        }
        Err(_) => {
            count(stats, Counter::DropEncapFailed);
            XDP_DROP
        }
    }
}
