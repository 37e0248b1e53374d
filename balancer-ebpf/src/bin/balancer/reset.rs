//! Refusing a TCP segment fast: it becomes a RST back to its sender, as RFC 9293 resets a
//! segment for no connection — one without ACK gets a RST|ACK of sequence 0 acknowledging the
//! SYN and any data with it (admission control refusing a new connection, so the client fails
//! at once instead of retrying into a saturated pool); one with ACK gets a RST whose sequence
//! is that acknowledgement (a source-NAT segment of a connection this balancer never saw).

use aya_ebpf::{
    bindings::{
        xdp_action::{XDP_DROP, XDP_TX},
        xdp_md,
    },
    programs::XdpContext,
};
use balancer_common::addr::FAMILY_V4;
use balancer_ebpf::{
    csum,
    headers::{
        EthHdr, IPPROTO_TCP, IPV4_DF, IPV4_LEN, IPV6_LEN, Ipv4Hdr, Ipv6Hdr, TCP_LEN, TcpHdr,
    },
    parse::{Frame, Shape, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, parse_ip, parse_l2},
};

use crate::icmp::trim;

/// Turns the TCP segment in `ctx` into a RST to its sender and returns `XDP_TX`;
/// `XDP_DROP` if the segment cannot be answered (not plain TCP, lengths inconsistent, or the
/// frame could not shrink). A global function: verified once, with its own stack.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_reset(ctx: *mut xdp_md) -> u32 {
    match reset(&XdpContext::new(ctx)) {
        Some(()) => XDP_TX,
        None => XDP_DROP,
    }
}

#[inline(always)]
fn reset(ctx: &XdpContext) -> Option<()> {
    let frame = Frame::of(ctx);
    let ip = parse_ip(&frame, &parse_l2(&frame)?)?;
    if ip.shape != Shape::Plain || ip.proto != IPPROTO_TCP {
        return None;
    }
    let tcp = frame.ptr::<TcpHdr>(ip.l4_off)?;
    // SAFETY: bounds checked by `ptr`.
    let seg = unsafe { *tcp };
    if seg.flags & TCP_RST != 0 {
        // A RST is never answered.
        return None;
    }
    let header = usize::from(seg.doff >> 4) * 4;
    let data = ip
        .len
        .checked_sub(ip.l4_off - ip.l3_off)?
        .checked_sub(header)?;
    let mut consumed = data as u32;
    if seg.flags & TCP_SYN != 0 {
        consumed += 1;
    }
    if seg.flags & TCP_FIN != 0 {
        consumed += 1;
    }
    let ack = u32::from_be(seg.seq).wrapping_add(consumed);
    // A segment without ACK is acknowledged; one with ACK is answered at its acknowledgement.
    let with_ack = seg.flags & TCP_ACK == 0;
    let v4 = ip.family == FAMILY_V4;
    let l4_off = ip.l3_off + if v4 { IPV4_LEN } else { IPV6_LEN };
    let frame = trim(ctx, l4_off + TCP_LEN).ok()?;

    let eth = frame.ptr::<EthHdr>(0)?;
    // SAFETY: bounds checked by `ptr`.
    let eth = unsafe { &mut *eth };
    core::mem::swap(&mut eth.src, &mut eth.dst);
    if v4 {
        let h = frame.ptr::<Ipv4Hdr>(ip.l3_off)?;
        // SAFETY: bounds checked by `ptr`.
        let h = unsafe { &mut *h };
        *h = Ipv4Hdr {
            ver_ihl: 0x45,
            tos: 0,
            tot_len: ((IPV4_LEN + TCP_LEN) as u16).to_be(),
            id: 0,
            frag_off: IPV4_DF,
            ttl: 64,
            proto: IPPROTO_TCP,
            check: 0,
            saddr: ip.dst[0],
            daddr: ip.src[0],
        };
        h.check = csum::ipv4_header(h);
    } else {
        let h = frame.ptr::<Ipv6Hdr>(ip.l3_off)?;
        // SAFETY: bounds checked by `ptr`.
        unsafe {
            *h = Ipv6Hdr {
                ver_tc_flow: [0x60, 0, 0, 0],
                payload_len: (TCP_LEN as u16).to_be(),
                next_hdr: IPPROTO_TCP,
                hop_limit: 64,
                saddr: ip.dst,
                daddr: ip.src,
            }
        };
    }
    let tcp = frame.ptr::<TcpHdr>(l4_off)?;
    // SAFETY: bounds checked by `ptr`.
    let tcp = unsafe { &mut *tcp };
    *tcp = TcpHdr {
        src: seg.dst,
        dst: seg.src,
        seq: if with_ack { 0 } else { seg.ack_seq },
        ack_seq: if with_ack { ack.to_be() } else { 0 },
        doff: ((TCP_LEN / 4) as u8) << 4,
        flags: if with_ack { TCP_RST | TCP_ACK } else { TCP_RST },
        window: 0,
        check: 0,
        urg_ptr: 0,
    };
    let pseudo = csum::sum_addr(&ip.src)
        + csum::sum_addr(&ip.dst)
        + u64::from((TCP_LEN as u16).to_be())
        + u64::from(u16::from(IPPROTO_TCP).to_be());
    // SAFETY: `tcp` is the whole 20-byte header, inside the frame.
    let sum = pseudo + unsafe { csum::sum_words::<{ TCP_LEN / 2 }>((tcp as *const TcpHdr).cast()) };
    tcp.check = !csum::fold(sum);
    Some(())
}
