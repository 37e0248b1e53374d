//! Bounds-checked header parsing shared by the programs: Ethernet with up to two VLAN tags,
//! IPv4, IPv6 with a bounded walk over extension headers, and L4 ports.
//!
//! Every read goes through [`Frame::ptr`], which checks the whole header against the end of
//! the frame, so the verifier can prove each access and a truncated frame yields `None`.

use core::mem::size_of;

use aya_ebpf::programs::XdpContext;
use balancer_common::addr::{FAMILY_V4, FAMILY_V6, RawAddr};

use crate::headers::*;

/// The bounds of one packet.
#[derive(Clone, Copy)]
pub struct Frame {
    pub start: usize,
    pub end: usize,
}

impl Frame {
    /// The frame an XDP program was given.
    #[inline(always)]
    pub fn of(ctx: &XdpContext) -> Frame {
        Frame {
            start: ctx.data(),
            end: ctx.data_end(),
        }
    }

    /// A pointer to a `T` at `offset`, if the whole `T` lies inside the frame.
    #[inline(always)]
    pub fn ptr<T>(&self, offset: usize) -> Option<*mut T> {
        if self.start + offset + size_of::<T>() > self.end {
            return None;
        }
        Some((self.start + offset) as *mut T)
    }

    #[inline(always)]
    pub fn size(&self) -> usize {
        self.end - self.start
    }
}

/// The link layer of a frame.
#[derive(Clone, Copy)]
pub struct L2 {
    /// Offset of the network header: 14, 18 or 22.
    pub l3_off: usize,
    /// Ether type after any VLAN tags (network order).
    pub ether_type: u16,
}

/// Parses Ethernet and up to two 802.1Q/802.1ad tags.
#[inline(always)]
pub fn parse_l2(frame: &Frame) -> Option<L2> {
    let eth: *const EthHdr = frame.ptr(0)?;
    // SAFETY: `ptr` checked that the header lies inside the frame.
    let mut ether_type = unsafe { (*eth).ether_type };
    let mut l3_off = ETH_LEN;
    if ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD {
        let tag: *const VlanHdr = frame.ptr(l3_off)?;
        // SAFETY: bounds checked by `ptr`.
        ether_type = unsafe { (*tag).ether_type };
        l3_off += VLAN_LEN;
        if ether_type == ETH_P_8021Q {
            let tag: *const VlanHdr = frame.ptr(l3_off)?;
            // SAFETY: bounds checked by `ptr`.
            ether_type = unsafe { (*tag).ether_type };
            l3_off += VLAN_LEN;
        }
    }
    Some(L2 { l3_off, ether_type })
}

/// What kind of IP packet this is, as far as forwarding is concerned.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Headers consistent; `proto` and `l4_off` name the transport header.
    Plain,
    /// A fragment (IPv4 MF/offset, or an IPv6 fragment header).
    Fragment,
    /// IPv4 with options.
    Options,
    /// Length fields disagree with the frame, or an IPv6 extension chain too long to follow.
    Malformed,
}

/// The network layer of a frame. Addresses are valid whatever the [`Shape`].
#[derive(Clone, Copy)]
pub struct Ip {
    pub family: u8,
    pub shape: Shape,
    /// Transport protocol (after IPv6 extension headers).
    pub proto: u8,
    /// IPv4 TOS / IPv6 traffic class, copied to an outer header.
    pub tos: u8,
    pub src: RawAddr,
    pub dst: RawAddr,
    pub l3_off: usize,
    pub l4_off: usize,
    /// IP packet length from the header (IPv4 total length; IPv6 40 + payload length).
    pub len: usize,
}

impl Ip {
    /// This parse with a transport offset the verifier cannot tell apart from another
    /// parse's. Each shape of network header the parse knows (IPv4, IPv6 with extension
    /// headers) leaves an offset of its own, and the verifier walks the code after the parse
    /// once per shape; here those shapes reach that code in one state, so it is walked once
    /// per network-header offset (one per VLAN tag), and the program stays well under the
    /// verifier's limit of instructions processed. The value is unchanged: the frame's linear
    /// part is shorter than 1 MiB, so `size >> 20` is 0 (the verifier knows the frame's size
    /// only as a number it cannot bound), and no parse gives an offset past the floor plus
    /// [`OPAQUE_MASK`]. The floor (an IPv4 header after the network header) is one the
    /// verifier knows, so code that reaches back from the offset still passes.
    #[inline(always)]
    pub fn opaque(mut self, frame: &Frame) -> Ip {
        let zero = frame.size() >> 20;
        let floor = self.l3_off + IPV4_LEN;
        self.l4_off = floor + ((self.l4_off - floor + zero) & OPAQUE_MASK);
        self
    }
}

/// The bound [`Ip::opaque`] gives a transport offset past its floor. The longest parse ends
/// 40 + 4 × 2,048 = 8,232 bytes past the network header (IPv6 and four extension headers of
/// the longest kind); an offset plus a header's size must stay under 64 KiB for the
/// verifier to track a packet range.
pub const OPAQUE_MASK: usize = (1 << 14) - 1;

/// Longest IPv6 extension chain followed before the packet counts as malformed.
const MAX_IPV6_EXTENSIONS: usize = 4;

/// Parses the IPv4 header at `l3_off`. `None` if the fixed header is cut off.
#[inline(always)]
pub fn parse_ipv4(frame: &Frame, l3_off: usize) -> Option<Ip> {
    let h: *const Ipv4Hdr = frame.ptr(l3_off)?;
    // SAFETY: bounds checked by `ptr`.
    let h = unsafe { &*h };
    let ihl = (h.ver_ihl & 0x0f) as usize * 4;
    let len = u16::from_be(h.tot_len) as usize;
    let shape = if h.ver_ihl >> 4 != 4 || ihl < IPV4_LEN || len < ihl || l3_off + len > frame.size()
    {
        Shape::Malformed
    } else if h.frag_off & IPV4_FRAG_MASK != 0 {
        Shape::Fragment
    } else if ihl != IPV4_LEN {
        Shape::Options
    } else {
        Shape::Plain
    };
    Some(Ip {
        family: FAMILY_V4,
        shape,
        proto: h.proto,
        tos: h.tos,
        src: [h.saddr, 0, 0, 0],
        dst: [h.daddr, 0, 0, 0],
        l3_off,
        l4_off: l3_off + IPV4_LEN,
        len,
    })
}

/// Parses the IPv6 header at `l3_off` and follows up to four extension headers.
#[inline(always)]
pub fn parse_ipv6(frame: &Frame, l3_off: usize) -> Option<Ip> {
    let h: *const Ipv6Hdr = frame.ptr(l3_off)?;
    // SAFETY: bounds checked by `ptr`.
    let h = unsafe { &*h };
    let len = IPV6_LEN + u16::from_be(h.payload_len) as usize;
    let mut ip = Ip {
        family: FAMILY_V6,
        shape: Shape::Plain,
        proto: h.next_hdr,
        tos: (h.ver_tc_flow[0] << 4) | (h.ver_tc_flow[1] >> 4),
        src: h.saddr,
        dst: h.daddr,
        l3_off,
        l4_off: l3_off + IPV6_LEN,
        len,
    };
    if h.ver_tc_flow[0] >> 4 != 6 || l3_off + len > frame.size() {
        ip.shape = Shape::Malformed;
        return Some(ip);
    }
    for _ in 0..MAX_IPV6_EXTENSIONS {
        match ip.proto {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH => {
                let Some(ext) = frame.ptr::<[u8; 2]>(ip.l4_off) else {
                    ip.shape = Shape::Malformed;
                    return Some(ip);
                };
                // SAFETY: bounds checked by `ptr`.
                let ext = unsafe { *ext };
                let ext_len = if ip.proto == IPPROTO_AH {
                    (ext[1] as usize + 2) * 4
                } else {
                    (ext[1] as usize + 1) * 8
                };
                ip.proto = ext[0];
                ip.l4_off += ext_len;
            }
            IPPROTO_FRAGMENT => {
                let Some(ext) = frame.ptr::<[u8; 8]>(ip.l4_off) else {
                    ip.shape = Shape::Malformed;
                    return Some(ip);
                };
                // SAFETY: bounds checked by `ptr`.
                ip.proto = unsafe { (*ext)[0] };
                ip.shape = Shape::Fragment;
                return Some(ip);
            }
            _ => return Some(ip),
        }
    }
    if matches!(
        ip.proto,
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT
    ) {
        ip.shape = Shape::Malformed;
    }
    Some(ip)
}

/// Parses the network header named by `l2`. `None` for other ether types and cut-off headers.
#[inline(always)]
pub fn parse_ip(frame: &Frame, l2: &L2) -> Option<Ip> {
    if l2.ether_type == ETH_P_IP {
        parse_ipv4(frame, l2.l3_off)
    } else if l2.ether_type == ETH_P_IPV6 {
        parse_ipv6(frame, l2.l3_off)
    } else {
        None
    }
}

/// The transport ports at `l4_off`, in network order.
#[inline(always)]
pub fn parse_ports(frame: &Frame, l4_off: usize) -> Option<Ports> {
    let p: *const Ports = frame.ptr(l4_off)?;
    // SAFETY: bounds checked by `ptr`.
    Some(unsafe { *p })
}

/// TCP flags: FIN.
pub const TCP_FIN: u8 = 0x01;
/// TCP flags: SYN.
pub const TCP_SYN: u8 = 0x02;
/// TCP flags: RST.
pub const TCP_RST: u8 = 0x04;
/// TCP flags: ACK.
pub const TCP_ACK: u8 = 0x10;

/// The TCP flags byte of the header at `l4_off`, if the first 14 bytes are present.
#[inline(always)]
pub fn parse_tcp_flags(frame: &Frame, l4_off: usize) -> Option<u8> {
    let h: *const [u8; 14] = frame.ptr(l4_off)?;
    // SAFETY: bounds checked by `ptr`.
    Some(unsafe { (*h)[13] })
}
