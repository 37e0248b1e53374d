//! NAT forwarding. A client's packet to a `nat` VIP leaves with the backend's address as its
//! destination (ports unchanged), and the way back is recorded in `NAT_REPLIES`; the backend's
//! reply, routed back through this host (its gateway), gets the VIP back as its source and goes
//! to the Ethernet address the client's packets came from. Checksums are updated incrementally.
//!
//! Both directions are global functions (verified once, on their own, with their own stack).
//! The reply's takes the entry function's parse as one integer ([`pack`]); the forward one takes
//! the backend's id and parses again (handing it the parse too cost the entry function 16 bytes
//! of stack, over the verifier's 512-byte limit along its deepest call chain).

use aya_ebpf::{
    bindings::{
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
        xdp_md,
    },
    programs::XdpContext,
};
use balancer_common::{
    addr::{FAMILY_V4, RawAddr},
    maps::{NatReplyKey, NatReplyValue},
};
use balancer_ebpf::{
    csum,
    headers::{EthHdr, IPPROTO_TCP, IPPROTO_UDP, Ipv4Hdr, Ipv6Hdr, Ports, UdpHdr},
    parse::{Frame, Ip, Shape, parse_ip, parse_l2},
};

use crate::maps::{BACKENDS, NAT_REPLIES};

/// What the global functions know of the packet: the frame, where its headers are, and its
/// family and protocol.
struct Packet {
    frame: Frame,
    l3_off: usize,
    l4_off: usize,
    family: u8,
    proto: u8,
}

/// The packet of `ctx`, if it is plain TCP or UDP over IPv4 or IPv6 with its transport header
/// present up to the checksum (so a translation, once decided, cannot fail half-way).
#[inline(always)]
fn parse(ctx: *mut xdp_md) -> Option<Packet> {
    let frame = Frame::of(&XdpContext::new(ctx));
    let ip = parse_ip(&frame, &parse_l2(&frame)?)?;
    if ip.shape != Shape::Plain {
        return None;
    }
    checked(frame, pack(&ip))
}

/// Bounds on the offsets a global function is handed (the verifier knows nothing of them). A
/// reply whose IPv6 extension headers run past them is not translated.
const MAX_L3_OFF: u64 = 64;
const MAX_L4_OFF: u64 = 1024;

/// The caller's parse as one integer: offsets, family, protocol.
#[inline(always)]
pub fn pack(ip: &Ip) -> u64 {
    ip.l3_off as u64
        | (ip.l4_off as u64) << 16
        | u64::from(ip.family) << 32
        | u64::from(ip.proto) << 40
}

/// The packet [`pack`] describes, if its offsets are in bounds and its TCP or UDP header is
/// present up to the checksum.
#[inline(always)]
fn checked(frame: Frame, layout: u64) -> Option<Packet> {
    let l3_off = layout & 0xffff;
    let l4_off = (layout >> 16) & 0xffff;
    if l3_off > MAX_L3_OFF || l4_off > MAX_L4_OFF {
        return None;
    }
    let (l3_off, l4_off) = (l3_off as usize, l4_off as usize);
    let proto = (layout >> 40) as u8;
    match proto {
        IPPROTO_TCP => frame.ptr::<TcpToCheck>(l4_off).map(|_| ())?,
        IPPROTO_UDP => frame.ptr::<UdpHdr>(l4_off).map(|_| ())?,
        _ => return None,
    }
    Some(Packet {
        frame,
        l3_off,
        l4_off,
        family: (layout >> 32) as u8,
        proto,
    })
}

/// The fixed part of a TCP header, up to its checksum.
#[repr(C)]
struct TcpToCheck {
    _ports_seq_ack: [u32; 3],
    _off_flags_window: [u16; 2],
    check: u16,
}

impl Packet {
    /// The source and destination addresses.
    #[inline(always)]
    fn addrs(&self) -> Option<(RawAddr, RawAddr)> {
        if self.family == FAMILY_V4 {
            let h = self.frame.ptr::<Ipv4Hdr>(self.l3_off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &*h };
            Some(([h.saddr, 0, 0, 0], [h.daddr, 0, 0, 0]))
        } else {
            let h = self.frame.ptr::<Ipv6Hdr>(self.l3_off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &*h };
            Some((h.saddr, h.daddr))
        }
    }

    #[inline(always)]
    fn ports(&self) -> Option<Ports> {
        let p = self.frame.ptr::<Ports>(self.l4_off)?;
        // SAFETY: bounds checked by `ptr`.
        Some(unsafe { *p })
    }

    /// Writes `new` as the destination (`dst`) or source address, and updates the IPv4 header
    /// checksum and the TCP or UDP checksum (whose pseudo-header holds the address). Each
    /// header is reached through one bounds-checked pointer, its fields at fixed offsets.
    #[inline(always)]
    fn rewrite(&self, dst: bool, old: &RawAddr, new: &RawAddr) -> Option<()> {
        let v4 = self.family == FAMILY_V4;
        let l4_check: *mut u16 = match self.proto {
            IPPROTO_TCP => {
                let t = self.frame.ptr::<TcpToCheck>(self.l4_off)?;
                // SAFETY: bounds checked by `ptr`.
                unsafe { &raw mut (*t).check }
            }
            IPPROTO_UDP => {
                let u = self.frame.ptr::<UdpHdr>(self.l4_off)?;
                // SAFETY: bounds checked by `ptr`.
                unsafe { &raw mut (*u).check }
            }
            _ => return None,
        };
        if v4 {
            let h = self.frame.ptr::<Ipv4Hdr>(self.l3_off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &mut *h };
            if dst {
                h.daddr = new[0];
            } else {
                h.saddr = new[0];
            }
            h.check = csum::replace_addr::<1>(h.check, old, new);
        } else {
            let h = self.frame.ptr::<Ipv6Hdr>(self.l3_off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &mut *h };
            if dst {
                h.daddr = *new;
            } else {
                h.saddr = *new;
            }
        }
        // SAFETY: bounds checked by `ptr` above.
        let sum = unsafe { *l4_check };
        // An IPv4 UDP checksum of zero means "none": it stays so.
        if self.proto == IPPROTO_UDP && v4 && sum == 0 {
            return Some(());
        }
        let mut updated = if v4 {
            csum::replace_addr::<1>(sum, old, new)
        } else {
            csum::replace_addr::<4>(sum, old, new)
        };
        if self.proto == IPPROTO_UDP && updated == 0 {
            updated = 0xffff;
        }
        // SAFETY: as above.
        unsafe { *l4_check = updated };
        Some(())
    }
}

/// Sends a client's packet for a `nat` VIP to backend `backend_id`: records the reply's way
/// back, writes the backend as the destination, and addresses the frame to the backend's next
/// hop.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_nat_forward(ctx: *mut xdp_md, backend_id: u32) -> u32 {
    forward(ctx, backend_id).unwrap_or(XDP_DROP)
}

#[inline(always)]
fn forward(ctx: *mut xdp_md, backend_id: u32) -> Option<u32> {
    let p = parse(ctx)?;
    let backend = BACKENDS.get(backend_id)?;
    // The daemon gives a NAT VIP backends of its own family only; a packet is never half
    // rewritten with another family's address.
    if backend.family != p.family {
        return None;
    }
    let ((client, vip), ports) = (p.addrs()?, p.ports()?);
    let eth = p.frame.ptr::<EthHdr>(0)?;
    // SAFETY: bounds checked by `ptr`.
    let eth = unsafe { &mut *eth };
    let key = NatReplyKey {
        backend: backend.addr,
        client,
        backend_port: ports.dst,
        client_port: ports.src,
        proto: p.proto,
        family: p.family,
        _pad: [0; 2],
    };
    // A lookup keeps the entry recent in the LRU; it is written when missing or stale.
    let known = NAT_REPLIES.get_ptr(key).is_some_and(|v| {
        // SAFETY: a map value, valid for the program's run.
        let v = unsafe { &*v };
        v.vip == vip && v.client_mac == eth.src
    });
    if !known {
        let way_back = NatReplyValue {
            vip,
            client_mac: eth.src,
            _pad: [0; 2],
        };
        NAT_REPLIES.insert(key, way_back, 0).ok()?;
    }
    p.rewrite(true, &vip, &backend.addr)?;
    eth.src = eth.dst;
    eth.dst = backend.mac;
    Some(XDP_TX)
}

/// A TCP/UDP packet not for a VIP: if it is a NAT flow's reply, writes the VIP back as its
/// source and sends it to the client's next hop (`XDP_TX`); else `XDP_PASS`. It parses the
/// packet again (the caller keeps nothing alive for it: the non-VIP path stays as it was).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_nat_reply(ctx: *mut xdp_md, layout: u64) -> u32 {
    let Some(p) = checked(Frame::of(&XdpContext::new(ctx)), layout) else {
        return XDP_PASS;
    };
    let (Some((backend, client)), Some(ports)) = (p.addrs(), p.ports()) else {
        return XDP_PASS;
    };
    let key = NatReplyKey {
        backend,
        client,
        backend_port: ports.src,
        client_port: ports.dst,
        proto: p.proto,
        family: p.family,
        _pad: [0; 2],
    };
    let Some(way_back) = NAT_REPLIES.get_ptr(key) else {
        return XDP_PASS;
    };
    // SAFETY: a map value, valid for the program's run; copied out at once.
    let way_back = unsafe { *way_back };
    let Some(eth) = p.frame.ptr::<EthHdr>(0) else {
        return XDP_PASS;
    };
    if p.rewrite(false, &backend, &way_back.vip).is_none() {
        return XDP_DROP;
    }
    // SAFETY: bounds checked by `ptr`.
    let eth = unsafe { &mut *eth };
    eth.src = eth.dst;
    eth.dst = way_back.client_mac;
    XDP_TX
}
