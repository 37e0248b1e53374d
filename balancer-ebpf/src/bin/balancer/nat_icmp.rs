//! ICMP errors about NAT flows, translated as their flows are, so the host they reach matches
//! them to its connection (Linux's NAT does the same for "related" ICMP):
//!
//! - an error about a reply (a router on the client's side, e.g. fragmentation needed), sent
//!   to the VIP: goes to the flow's backend, the quoted packet as the backend sent it (from
//!   the backend; with source NAT, to the NAT source and port);
//! - an error about a client's packet (the backend's port unreachable, or a router on the
//!   backends' side), sent to the client (gateway NAT) or to the NAT source: goes to the
//!   client, the quoted packet as the client sent it (to the VIP, from the client and its
//!   port), from the VIP where the backend itself sent it.
//!
//! The outer IPv4 header checksum, the ICMP checksum (with its IPv6 pseudo-header), the quoted
//! IPv4 header's checksum and the quoted TCP or UDP checksum (where the quote holds it) are
//! updated incrementally. Both directions are global functions, their keys in the scratch area.

use aya_ebpf::{
    bindings::{
        xdp_action::{XDP_DROP, XDP_PASS},
        xdp_md,
    },
    programs::XdpContext,
};
use balancer_common::{
    addr::{FAMILY_V4, RawAddr},
    maps::{NAT_GATEWAY, NAT_SNAT},
};
use balancer_ebpf::{csum, headers::*, parse::Frame};

use crate::{
    icmp::is_error,
    links::{Side, send},
    maps::{BACKENDS, NAT_REPLIES, SNAT_FLOWS, SNAT_PORTS, SNAT_SOURCES},
    nat::{TcpToCheck, offsets, scratch},
};

/// An ICMP error quoting a TCP or UDP packet: where its headers are.
struct IcmpError {
    frame: Frame,
    l3_off: usize,
    /// The ICMP header.
    l4_off: usize,
    family: u8,
    /// The quoted packet's IP header, its TCP or UDP header, and its protocol.
    inner_l3: usize,
    inner_l4: usize,
    inner_proto: u8,
    /// The quoted packet's ports.
    inner_ports: Ports,
}

/// The ICMP error `layout` describes (the caller's parse, see `nat::pack`), if it is one and
/// quotes an IPv4 header without options or an IPv6 header without extension headers, and
/// TCP or UDP ports; the quoted addresses are copied to `inner_src` and `inner_dst`, the outer
/// source to `outer_src`.
///
/// Everything a translation decides on is copied out here, before any map lookup: after a
/// helper call the verifier knows nothing of packet bounds checked before it, and the
/// compiler may reuse such a check. The writes start from a fresh [`IcmpError::reload`].
#[inline(always)]
fn checked(
    ctx: *mut xdp_md,
    layout: u64,
    inner_src: &mut RawAddr,
    inner_dst: &mut RawAddr,
    outer_src: &mut RawAddr,
) -> Option<IcmpError> {
    let frame = Frame::of(&XdpContext::new(ctx));
    let (l3_off, l4_off) = offsets(layout)?;
    let family = (layout >> 32) as u8;
    let proto = (layout >> 40) as u8;
    let icmp_of_family = if family == FAMILY_V4 {
        IPPROTO_ICMP
    } else {
        IPPROTO_ICMPV6
    };
    if proto != icmp_of_family {
        return None;
    }
    let icmp = frame.ptr::<IcmpHdr>(l4_off)?;
    // SAFETY: bounds checked by `ptr`.
    if !is_error(family, unsafe { (*icmp).kind }) {
        return None;
    }
    let inner_l3 = l4_off + ICMP_LEN;
    let (inner_l4, inner_proto) = if family == FAMILY_V4 {
        let h = frame.ptr::<Ipv4Hdr>(inner_l3)?;
        // SAFETY: bounds checked by `ptr`.
        let h = unsafe { &*h };
        if h.ver_ihl != 0x45 {
            return None;
        }
        (inner_l3 + IPV4_LEN, h.proto)
    } else {
        let h = frame.ptr::<Ipv6Hdr>(inner_l3)?;
        // SAFETY: bounds checked by `ptr`.
        (inner_l3 + IPV6_LEN, unsafe { (*h).next_hdr })
    };
    if inner_proto != IPPROTO_TCP && inner_proto != IPPROTO_UDP {
        return None;
    }
    let ports = frame.ptr::<Ports>(inner_l4)?;
    // SAFETY: bounds checked by `ptr`.
    let inner_ports = unsafe { *ports };
    let m = IcmpError {
        frame,
        l3_off,
        l4_off,
        family,
        inner_l3,
        inner_l4,
        inner_proto,
        inner_ports,
    };
    m.addrs_at(inner_l3, inner_src, inner_dst)?;
    let mut outer_dst = [0; 4];
    m.addrs_at(l3_off, outer_src, &mut outer_dst)?;
    Some(m)
}

impl IcmpError {
    /// The frame as it is now (after map lookups: see [`checked`]).
    #[inline(always)]
    fn reload(&mut self, ctx: *mut xdp_md) {
        self.frame = Frame::of(&XdpContext::new(ctx));
    }

    fn v4(&self) -> bool {
        self.family == FAMILY_V4
    }

    /// Reads the source and destination of the IP header at `off` into `src` and `dst`.
    #[inline(always)]
    fn addrs_at(&self, off: usize, src: &mut RawAddr, dst: &mut RawAddr) -> Option<()> {
        if self.v4() {
            let h = self.frame.ptr::<Ipv4Hdr>(off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &*h };
            *src = [h.saddr, 0, 0, 0];
            *dst = [h.daddr, 0, 0, 0];
        } else {
            let h = self.frame.ptr::<Ipv6Hdr>(off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &*h };
            *src = h.saddr;
            *dst = h.daddr;
        }
        Some(())
    }

    /// Applies `update` to the ICMP checksum.
    #[inline(always)]
    fn update_icmp_check(&self, update: impl FnOnce(u16) -> u16) -> Option<()> {
        let icmp = self.frame.ptr::<IcmpHdr>(self.l4_off)?;
        // SAFETY: bounds checked by `ptr`.
        let icmp = unsafe { &mut *icmp };
        icmp.check = update(icmp.check);
        Some(())
    }

    /// Writes `new` as the IP header's (at `off`) destination (`dst`) or source; returns the
    /// old address and, for IPv4, the header checksum before and after.
    #[inline(always)]
    fn write_addr(&self, off: usize, dst: bool, new: &RawAddr) -> Option<(RawAddr, u16, u16)> {
        if self.v4() {
            let h = self.frame.ptr::<Ipv4Hdr>(off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &mut *h };
            let field = if dst { &mut h.daddr } else { &mut h.saddr };
            let old = [*field, 0, 0, 0];
            *field = new[0];
            let before = h.check;
            h.check = csum::replace_addr::<1>(before, &old, new);
            Some((old, before, h.check))
        } else {
            let h = self.frame.ptr::<Ipv6Hdr>(off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &mut *h };
            let field = if dst { &mut h.daddr } else { &mut h.saddr };
            let old = *field;
            *field = *new;
            Some((old, 0, 0))
        }
    }

    /// Replaces an address in the ICMP checksum (`N` words: 1 for IPv4, 4 for IPv6).
    #[inline(always)]
    fn icmp_addr(&self, old: &RawAddr, new: &RawAddr) -> Option<()> {
        let v4 = self.v4();
        self.update_icmp_check(|c| {
            if v4 {
                csum::replace_addr::<1>(c, old, new)
            } else {
                csum::replace_addr::<4>(c, old, new)
            }
        })
    }

    /// Writes the outer destination (`dst`) or source address. ICMPv6's checksum covers it
    /// (pseudo-header); ICMPv4's does not.
    #[inline(always)]
    fn set_outer(&self, dst: bool, new: &RawAddr) -> Option<()> {
        let (old, _, _) = self.write_addr(self.l3_off, dst, new)?;
        if !self.v4() {
            self.icmp_addr(&old, new)?;
        }
        Some(())
    }

    /// Applies `update` to the quoted TCP or UDP checksum, if the quote holds it, and the
    /// change to the ICMP checksum. A zero IPv4 UDP checksum stays zero.
    #[inline(always)]
    fn update_inner_l4_check(&self, update: impl FnOnce(u16) -> u16) -> Option<()> {
        let field: *mut u16 = if self.inner_proto == IPPROTO_TCP {
            match self.frame.ptr::<TcpToCheck>(self.inner_l4) {
                // SAFETY: bounds checked by `ptr`.
                Some(t) => unsafe { &raw mut (*t).check },
                None => return Some(()),
            }
        } else {
            match self.frame.ptr::<UdpHdr>(self.inner_l4) {
                // SAFETY: bounds checked by `ptr`.
                Some(u) => unsafe { &raw mut (*u).check },
                None => return Some(()),
            }
        };
        // SAFETY: bounds checked by `ptr` above.
        let old = unsafe { *field };
        let udp = self.inner_proto == IPPROTO_UDP;
        if udp && self.v4() && old == 0 {
            return Some(());
        }
        let mut new = update(old);
        if udp && new == 0 {
            new = 0xffff;
        }
        // SAFETY: as above.
        unsafe { *field = new };
        self.update_icmp_check(|c| csum::replace_word(c, old, new))
    }

    /// Writes the quoted packet's destination (`dst`) or source address, with every checksum
    /// that covers it.
    #[inline(always)]
    fn set_inner_addr(&self, dst: bool, new: &RawAddr) -> Option<()> {
        let (old, before, after) = self.write_addr(self.inner_l3, dst, new)?;
        self.icmp_addr(&old, new)?;
        let v4 = self.v4();
        if v4 {
            self.update_icmp_check(|c| csum::replace_word(c, before, after))?;
        }
        self.update_inner_l4_check(|c| {
            if v4 {
                csum::replace_addr::<1>(c, &old, new)
            } else {
                csum::replace_addr::<4>(c, &old, new)
            }
        })
    }

    /// Writes the quoted packet's destination (`dst`) or source port (network order).
    #[inline(always)]
    fn set_inner_port(&self, dst: bool, new: u16) -> Option<()> {
        let p = self.frame.ptr::<Ports>(self.inner_l4)?;
        // SAFETY: bounds checked by `ptr`.
        let p = unsafe { &mut *p };
        let field = if dst { &mut p.dst } else { &mut p.src };
        let old = *field;
        *field = new;
        self.update_icmp_check(|c| csum::replace_word(c, old, new))?;
        self.update_inner_l4_check(|c| csum::replace_word(c, old, new))
    }

    /// Addresses the frame to `mac` and sends it out on `side`'s link.
    #[inline(always)]
    fn send_to(&self, ctx: *mut xdp_md, mac: [u8; 6], side: Side) -> Option<u32> {
        let eth = self.frame.ptr::<EthHdr>(0)?;
        // SAFETY: bounds checked by `ptr`.
        let eth = unsafe { &mut *eth };
        Some(send(ctx, eth, mac, side))
    }
}

/// An ICMP error sent to a `nat` VIP about a reply of the flow the connection table (or the
/// VIP's table) gives backend `backend_id`: sent on to that backend, translated. `XDP_PASS`
/// when the flow is not known.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_nat_icmp_to_backend(
    ctx: *mut xdp_md,
    layout: u64,
    backend_id: u32,
    vip_id: u32,
) -> u32 {
    let Some(s) = scratch() else {
        return XDP_PASS;
    };
    // The quoted reply went from the VIP to the client.
    let flow = &mut s.flow_key;
    let Some(mut m) = checked(
        ctx,
        layout,
        &mut flow.vip,
        &mut flow.client,
        &mut s.outer_src,
    ) else {
        return XDP_PASS;
    };
    flow.set_ports(
        m.inner_ports.dst,
        m.inner_ports.src,
        m.inner_proto,
        m.family,
    );
    let Some(backend) = BACKENDS.get(backend_id) else {
        return XDP_PASS;
    };
    if backend.family != m.family {
        return XDP_PASS;
    }
    // With source NAT the backend sent it to the flow's NAT source and port.
    let snat = match SNAT_SOURCES.get(vip_id) {
        Some(source) if source.family == m.family => match SNAT_FLOWS.get_ptr(&s.flow_key) {
            // SAFETY: a map value, valid for the program's run.
            Some(f) if unsafe { (*f).backend } == backend.addr => Some(f),
            _ => return XDP_PASS,
        },
        _ => None,
    };
    m.reload(ctx);
    let translated = m.set_outer(true, &backend.addr).and_then(|()| {
        m.set_inner_addr(false, &backend.addr)?;
        if let Some(f) = snat {
            // SAFETY: as above.
            let f = unsafe { &*f };
            m.set_inner_addr(true, &f.source)?;
            m.set_inner_port(true, f.nat_port)?;
        }
        m.send_to(ctx, backend.mac, Side::Backends)
    });
    translated.unwrap_or(XDP_DROP)
}

/// An ICMP error not for a VIP address: if it quotes a NAT flow's packet as it left for its
/// backend, it goes to the flow's client, translated; else `XDP_PASS`. `layout`: the caller's
/// parse and the NAT bits (`nat::pack`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_nat_icmp_to_client(ctx: *mut xdp_md, layout: u64) -> u32 {
    let nat = (layout >> 48) as u32;
    let Some(s) = scratch() else {
        return XDP_PASS;
    };
    // The quoted packet went from the client (or the NAT source) to the backend.
    let r = &mut s.reply;
    let Some(mut m) = checked(ctx, layout, &mut r.client, &mut r.backend, &mut s.outer_src) else {
        return XDP_PASS;
    };
    r.set_ports(
        m.inner_ports.dst,
        m.inner_ports.src,
        m.inner_proto,
        m.family,
    );
    let from_backend = s.outer_src == s.reply.backend;
    if nat & NAT_GATEWAY != 0
        && let Some(w) = NAT_REPLIES.get_ptr(&s.reply)
    {
        // SAFETY: a map value, valid for the program's run.
        let w = unsafe { &*w };
        m.reload(ctx);
        let translated = m.set_inner_addr(true, &w.vip).and_then(|()| {
            if from_backend {
                m.set_outer(false, &w.vip)?;
            }
            m.send_to(ctx, w.client_mac, Side::Clients)
        });
        return translated.unwrap_or(XDP_DROP);
    }
    if nat & NAT_SNAT != 0
        && let Some(f) = SNAT_PORTS.get_ptr(&s.reply)
    {
        // SAFETY: a map value, valid for the program's run.
        let f = unsafe { &*f };
        m.reload(ctx);
        let translated = m.set_inner_addr(false, &f.client).and_then(|()| {
            m.set_inner_port(false, f.client_port)?;
            m.set_inner_addr(true, &f.vip)?;
            m.set_outer(true, &f.client)?;
            if from_backend {
                m.set_outer(false, &f.vip)?;
            }
            m.send_to(ctx, f.client_mac, Side::Clients)
        });
        return translated.unwrap_or(XDP_DROP);
    }
    XDP_PASS
}
