//! Sending a packet to its backend: L2 direct server return (rewrite the Ethernet addresses),
//! encapsulation in an outer IP header (IPIP) or outer IP + UDP (GUE variant 1), or NAT
//! (`nat`).

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_TX},
    helpers::generated::bpf_xdp_adjust_head,
    programs::XdpContext,
};
use balancer_common::{
    addr::{FAMILY_V4, RawAddr},
    maps::{Backend, ForwardMode, GlobalConfig, VipMeta},
};
use balancer_ebpf::{
    csum,
    headers::*,
    parse::{Frame, Ip},
};

/// The backend id [`to_backend`] takes for a VIP that does not forward by NAT (only NAT reads
/// it).
pub const NOT_NAT: u32 = u32::MAX;

/// Bytes of L2 header saved across `bpf_xdp_adjust_head`: Ethernet plus two VLAN tags.
const L2_MAX: usize = ETH_LEN + 2 * VLAN_LEN;

/// Why a packet could not be encapsulated.
pub enum EncapError {
    /// The encapsulated packet would exceed the configured MTU; the client must be told.
    TooBig { mtu: u32 },
    /// The kernel refused to grow the headroom, or the frame changed under us.
    Failed,
}

/// A flow's entropy for the outer header of the encapsulating modes (the outer source
/// address's hashed bits, the IPv6 flow label, the GUE source port), so the backend's RSS
/// spreads flows: the XOR of the client address's first and last 32-bit words and its port.
/// The same for a flow's packets and for ICMP errors about it.
#[inline(always)]
pub fn flow_entropy(client: &RawAddr, port: u16) -> u32 {
    client[0] ^ client[3] ^ u32::from(port)
}

/// Rewrites the Ethernet addresses: to the backend's next hop, from the address the frame was
/// sent to (ours).
#[inline(always)]
pub fn l2_dsr(frame: &Frame, backend: &Backend) -> u32 {
    let Some(eth) = frame.ptr::<EthHdr>(0) else {
        return XDP_DROP;
    };
    // SAFETY: bounds checked by `ptr`.
    let eth = unsafe { &mut *eth };
    eth.src = eth.dst;
    eth.dst = backend.mac;
    XDP_TX
}

/// Bytes an encapsulation adds in front of the inner IP packet.
#[inline(always)]
pub fn overhead(mode: u8, backend: &Backend) -> usize {
    let ip = if backend.family == FAMILY_V4 {
        IPV4_LEN
    } else {
        IPV6_LEN
    };
    if mode == ForwardMode::Gue as u8 {
        ip + UDP_LEN
    } else {
        ip
    }
}

/// Grows the frame's headroom by `delta` bytes and puts the saved L2 header back at the front,
/// addressed from us to `dst_mac`. Returns the new frame.
#[inline(always)]
pub fn push_headroom(
    ctx: &XdpContext,
    delta: usize,
    dst_mac: Option<[u8; 6]>,
) -> Result<Frame, EncapError> {
    let old = Frame::of(ctx);
    // Every IP frame we handle is longer than L2_MAX, so this copy never fails.
    let l2 = old.ptr::<[u8; L2_MAX]>(0).ok_or(EncapError::Failed)?;
    // SAFETY: bounds checked by `ptr`.
    let saved = unsafe { *l2 };
    // SAFETY: `ctx.ctx` is the program's context.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(delta as i32)) } != 0 {
        return Err(EncapError::Failed);
    }
    let frame = Frame::of(ctx);
    let l2 = frame.ptr::<[u8; L2_MAX]>(0).ok_or(EncapError::Failed)?;
    // SAFETY: bounds checked by `ptr`. Bytes past the real L2 header are overwritten by the
    // caller's headers.
    unsafe { *l2 = saved };
    let eth = frame.ptr::<EthHdr>(0).ok_or(EncapError::Failed)?;
    // SAFETY: bounds checked by `ptr`.
    let eth = unsafe { &mut *eth };
    let ours = eth.dst;
    eth.dst = dst_mac.unwrap_or(eth.src);
    eth.src = ours;
    Ok(frame)
}

/// Encapsulates the packet for `backend` (IPIP or GUE per `vip.mode`). `entropy` varies the
/// outer source address (and GUE source port) per flow so the backend's RSS spreads flows.
#[inline(always)]
pub fn encap(
    ctx: &XdpContext,
    ip: &Ip,
    vip: &VipMeta,
    backend: &Backend,
    cfg: &GlobalConfig,
    entropy: u32,
) -> Result<(), EncapError> {
    let gue = vip.mode == ForwardMode::Gue as u8;
    let extra = overhead(vip.mode, backend);
    if cfg.mtu != 0 && ip.len + extra > cfg.mtu as usize {
        return Err(EncapError::TooBig {
            mtu: cfg.mtu - extra as u32,
        });
    }
    let inner_proto = if ip.family == FAMILY_V4 {
        IPPROTO_IPIP
    } else {
        IPPROTO_IPV6
    };
    let outer_proto = if gue { IPPROTO_UDP } else { inner_proto };
    let frame = push_headroom(ctx, extra, Some(backend.mac))?;

    let ether_type = frame.ptr::<u16>(ip.l3_off - 2).ok_or(EncapError::Failed)?;
    let l4_off;
    if backend.family == FAMILY_V4 {
        // SAFETY: bounds checked by `ptr`.
        unsafe { *ether_type = ETH_P_IP };
        let h = frame.ptr::<Ipv4Hdr>(ip.l3_off).ok_or(EncapError::Failed)?;
        // SAFETY: bounds checked by `ptr`.
        let h = unsafe { &mut *h };
        *h = Ipv4Hdr {
            ver_ihl: 0x45,
            tos: ip.tos,
            tot_len: ((ip.len + extra) as u16).to_be(),
            id: 0,
            frag_off: IPV4_DF,
            ttl: 64,
            proto: outer_proto,
            check: 0,
            saddr: cfg.encap_src_v4 | (entropy & cfg.encap_src_v4_hash_mask).to_be(),
            daddr: backend.addr[0],
        };
        h.check = csum::ipv4_header(h);
        l4_off = ip.l3_off + IPV4_LEN;
    } else {
        // SAFETY: bounds checked by `ptr`.
        unsafe { *ether_type = ETH_P_IPV6 };
        let h = frame.ptr::<Ipv6Hdr>(ip.l3_off).ok_or(EncapError::Failed)?;
        // SAFETY: bounds checked by `ptr`.
        let h = unsafe { &mut *h };
        let label = entropy & 0x000f_ffff;
        let mut saddr = cfg.encap_src_v6;
        saddr[3] |= (entropy & cfg.encap_src_v6_hash_mask).to_be();
        *h = Ipv6Hdr {
            ver_tc_flow: [
                0x60 | (ip.tos >> 4),
                (ip.tos << 4) | (label >> 16) as u8,
                (label >> 8) as u8,
                label as u8,
            ],
            payload_len: ((ip.len + extra - IPV6_LEN) as u16).to_be(),
            next_hdr: outer_proto,
            hop_limit: 64,
            saddr,
            daddr: backend.addr,
        };
        l4_off = ip.l3_off + IPV6_LEN;
    }
    if gue {
        let udp = frame.ptr::<UdpHdr>(l4_off).ok_or(EncapError::Failed)?;
        // SAFETY: bounds checked by `ptr`.
        unsafe {
            *udp = UdpHdr {
                src: (((entropy & 0x3fff) | 0xc000) as u16).to_be(),
                dst: vip.gue_port,
                len: ((ip.len + UDP_LEN) as u16).to_be(),
                // Zero: no checksum. Allowed for IPv4, and for IPv6 tunnels by RFC 6935; the
                // inner packet carries its own transport checksum.
                check: 0,
            }
        };
    }
    Ok(())
}

/// Sends the packet to `backend` (id `id`) the way `vip` says. `entropy` is a per-flow value
/// used by the encapsulating modes.
#[inline(always)]
pub fn to_backend(
    ctx: &XdpContext,
    ip: &Ip,
    vip: &VipMeta,
    id: u32,
    backend: &Backend,
    cfg: &GlobalConfig,
    entropy: u32,
) -> Result<u32, EncapError> {
    if vip.mode == ForwardMode::L2Dsr as u8 {
        return Ok(l2_dsr(&Frame::of(ctx), backend));
    }
    if vip.mode == ForwardMode::Nat as u8 {
        return Ok(
            match crate::nat::balancer_nat_forward(ctx.ctx, id, vip.vip_id) {
                crate::nat::NAT_RESET => crate::reset::balancer_reset(ctx.ctx),
                action => action,
            },
        );
    }
    encap(ctx, ip, vip, backend, cfg, entropy)?;
    Ok(XDP_TX)
}
