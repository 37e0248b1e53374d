//! NAT forwarding. A client's packet to a `nat` VIP leaves with the backend's address as its
//! destination (ports unchanged), and the way back is recorded in `NAT_REPLIES`; the backend's
//! reply, routed back through this host (its gateway), gets the VIP back as its source and goes
//! to the Ethernet address the client's packets came from. Checksums are updated incrementally.
//!
//! With source NAT (the VIP has an entry in `SNAT_SOURCES`) the packet also leaves from the
//! VIP's NAT source address and a port of its range, so the backend replies to this host
//! whatever its routes. A new flow's port is found by inserting its reply key into
//! `SNAT_PORTS` only where none is ([`SNAT_PROBES`] random tries), so no two live flows to one
//! backend port share a source port; `SNAT_FLOWS` keeps the flow's choice. Neither map evicts:
//! the daemon removes flows idle past their timeout (`balancer::dataplane::nat_expiry`).
//!
//! Both directions are global functions (verified once, on their own, with their own stack).
//! The reply's takes the entry function's parse as one integer ([`pack`]); the forward one takes
//! the backend's id and parses again (handing it the parse too cost the entry function 16 bytes
//! of stack, over the verifier's 512-byte limit along its deepest call chain).

use aya_ebpf::bindings::{BPF_ANY, BPF_NOEXIST};
use aya_ebpf::{
    bindings::{
        xdp_action::{XDP_DROP, XDP_PASS},
        xdp_md,
    },
    programs::XdpContext,
};
use balancer_common::{
    addr::{FAMILY_V4, RawAddr},
    maps::{Backend, NAT_GATEWAY, NAT_SNAT, SNAT_CLOSING, SNAT_EMBRYONIC, SNAT_PROBES, SnatSource},
};
use balancer_ebpf::{
    csum,
    headers::{EthHdr, IPPROTO_TCP, IPPROTO_UDP, Ipv4Hdr, Ipv6Hdr, Ports, UdpHdr},
    parse::{
        Frame, Ip, Shape, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, parse_ip, parse_l2, parse_tcp_flags,
    },
};

use crate::{
    active::atomic_add,
    clock::{now_ticks, random},
    links::{Side, send},
    maps::{
        BACKENDS, NAT_REPLIES, NAT_SCRATCH, NAT_STATS, NatScratch, SNAT_CLIENTS, SNAT_FLOWS,
        SNAT_PORTS, SNAT_SOURCES,
    },
};

/// `-E2BIG`: a hash map is full.
const E2BIG: i32 = -7;
/// What [`balancer_nat_forward`] answers for a TCP segment that would open a source-NAT flow
/// without a SYN (a spoofed segment, or a connection this balancer never saw): the caller
/// answers it with a RST, and no port is taken. Above every XDP action.
pub const NAT_RESET: u32 = 0x100;
/// TCP flags that end a connection.
const FIN_OR_RST: u8 = TCP_FIN | TCP_RST;

/// What the global functions know of the packet: the frame, where its headers are, and its
/// family and protocol.
pub(crate) struct Packet {
    pub(crate) frame: Frame,
    pub(crate) l3_off: usize,
    pub(crate) l4_off: usize,
    pub(crate) family: u8,
    pub(crate) proto: u8,
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
    checked(frame, pack(&ip.opaque(&frame), 0))
}

/// Bounds on the offsets a global function is handed (the verifier knows nothing of them). A
/// reply whose IPv6 extension headers run past them is not translated.
const MAX_L3_OFF: u64 = 64;
const MAX_L4_OFF: u64 = 1024;

/// The caller's parse as one integer: offsets, family, protocol, and the `GlobalConfig::nat`
/// bits (which reply tables to look in).
#[inline(always)]
pub fn pack(ip: &Ip, nat: u32) -> u64 {
    ip.l3_off as u64
        | (ip.l4_off as u64) << 16
        | u64::from(ip.family) << 32
        | u64::from(ip.proto) << 40
        | u64::from(nat & 0xff) << 48
}

/// The L3 and L4 offsets of a [`pack`]ed parse, if within the bounds the global functions
/// accept (the verifier knows nothing of them).
#[inline(always)]
pub(crate) fn offsets(layout: u64) -> Option<(usize, usize)> {
    let l3_off = layout & 0xffff;
    let l4_off = (layout >> 16) & 0xffff;
    if l3_off > MAX_L3_OFF || l4_off > MAX_L4_OFF {
        return None;
    }
    Some((l3_off as usize, l4_off as usize))
}

/// The packet [`pack`] describes, if its offsets are in bounds and its TCP or UDP header is
/// present up to the checksum.
#[inline(always)]
fn checked(frame: Frame, layout: u64) -> Option<Packet> {
    let (l3_off, l4_off) = offsets(layout)?;
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
pub(crate) struct TcpToCheck {
    _ports_seq_ack: [u32; 3],
    _off_flags_window: [u16; 2],
    pub(crate) check: u16,
}

impl Packet {
    /// Writes the source and destination addresses to `src` and `dst`.
    #[inline(always)]
    fn addrs_into(&self, src: &mut RawAddr, dst: &mut RawAddr) -> Option<()> {
        if self.family == FAMILY_V4 {
            let h = self.frame.ptr::<Ipv4Hdr>(self.l3_off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &*h };
            *src = [h.saddr, 0, 0, 0];
            *dst = [h.daddr, 0, 0, 0];
        } else {
            let h = self.frame.ptr::<Ipv6Hdr>(self.l3_off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &*h };
            *src = h.saddr;
            *dst = h.daddr;
        }
        Some(())
    }

    #[inline(always)]
    fn ports(&self) -> Option<Ports> {
        let p = self.frame.ptr::<Ports>(self.l4_off)?;
        // SAFETY: bounds checked by `ptr`.
        Some(unsafe { *p })
    }

    /// The TCP flags (0 for UDP).
    #[inline(always)]
    fn tcp_flags(&self) -> u8 {
        if self.proto != IPPROTO_TCP {
            return 0;
        }
        parse_tcp_flags(&self.frame, self.l4_off).unwrap_or(0)
    }

    /// The TCP or UDP checksum field.
    #[inline(always)]
    fn l4_check(&self) -> Option<*mut u16> {
        match self.proto {
            IPPROTO_TCP => {
                let t = self.frame.ptr::<TcpToCheck>(self.l4_off)?;
                // SAFETY: bounds checked by `ptr`.
                Some(unsafe { &raw mut (*t).check })
            }
            IPPROTO_UDP => {
                let u = self.frame.ptr::<UdpHdr>(self.l4_off)?;
                // SAFETY: bounds checked by `ptr`.
                Some(unsafe { &raw mut (*u).check })
            }
            _ => None,
        }
    }

    /// Writes the new source and destination addresses of `change` (each `(old, new)` where
    /// it changes) and its new port, and updates the IPv4 header checksum and the TCP or UDP
    /// checksum (whose pseudo-header holds the addresses) once each, by the summed deltas.
    /// Every pointer is checked before anything is written, so a translation never stops
    /// half-way.
    #[inline(always)]
    fn translate(&self, change: &Change<'_>) -> Option<()> {
        let v4 = self.family == FAMILY_V4;
        let l4_check = self.l4_check()?;
        let ports = self.frame.ptr::<Ports>(self.l4_off)?;
        let mut delta = 0u64;
        if v4 {
            let h = self.frame.ptr::<Ipv4Hdr>(self.l3_off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &mut *h };
            if let Some((old, new)) = change.src {
                h.saddr = new[0];
                delta += csum::addr_delta::<1>(old, new);
            }
            if let Some((old, new)) = change.dst {
                h.daddr = new[0];
                delta += csum::addr_delta::<1>(old, new);
            }
            h.check = csum::apply(h.check, delta);
        } else {
            let h = self.frame.ptr::<Ipv6Hdr>(self.l3_off)?;
            // SAFETY: bounds checked by `ptr`.
            let h = unsafe { &mut *h };
            if let Some((old, new)) = change.src {
                h.saddr = *new;
                delta += csum::addr_delta::<4>(old, new);
            }
            if let Some((old, new)) = change.dst {
                h.daddr = *new;
                delta += csum::addr_delta::<4>(old, new);
            }
        }
        if let Some(port) = change.port {
            // SAFETY: bounds checked by `ptr`.
            let p = unsafe { &mut *ports };
            let old = match port {
                Port::Src(new) => core::mem::replace(&mut p.src, new),
                Port::Dst(new) => core::mem::replace(&mut p.dst, new),
            };
            delta += csum::word_delta(old, port.value());
        }
        // SAFETY: bounds checked by `ptr` in `l4_check`.
        let sum = unsafe { *l4_check };
        if self.proto == IPPROTO_UDP && v4 && sum == 0 {
            // An IPv4 UDP checksum of zero means "none", and stays so.
            return Some(());
        }
        let mut updated = csum::apply(sum, delta);
        if self.proto == IPPROTO_UDP && updated == 0 {
            updated = 0xffff;
        }
        // SAFETY: as above.
        unsafe { *l4_check = updated };
        Some(())
    }
}

/// What a NAT translation writes: each address that changes as `(old, new)`, and the port
/// that changes (network order).
struct Change<'a> {
    src: Option<(&'a RawAddr, &'a RawAddr)>,
    dst: Option<(&'a RawAddr, &'a RawAddr)>,
    port: Option<Port>,
}

/// The port a translation writes, and which.
#[derive(Clone, Copy)]
enum Port {
    Src(u16),
    Dst(u16),
}

impl Port {
    #[inline(always)]
    fn value(self) -> u16 {
        match self {
            Port::Src(p) | Port::Dst(p) => p,
        }
    }
}

/// Sends a client's packet for a `nat` VIP to backend `backend_id`: records the reply's way
/// back (or, if VIP `vip_id` translates sources, finds the flow's source port), writes the
/// backend as the destination, and addresses the frame to the backend's next hop.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_nat_forward(ctx: *mut xdp_md, backend_id: u32, vip_id: u32) -> u32 {
    forward(ctx, backend_id, vip_id).unwrap_or(XDP_DROP)
}

/// This CPU's scratch area.
#[inline(always)]
pub(crate) fn scratch() -> Option<&'static mut NatScratch> {
    let s = NAT_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's entry, used by one program run at a time.
    Some(unsafe { &mut *s })
}

#[inline(always)]
fn forward(ctx: *mut xdp_md, backend_id: u32, vip_id: u32) -> Option<u32> {
    let p = parse(ctx)?;
    let backend = BACKENDS.get(backend_id)?;
    // The daemon gives a NAT VIP backends of its own family only; a packet is never half
    // rewritten with another family's address.
    if backend.family != p.family {
        return None;
    }
    let s = scratch()?;
    let ports = p.ports()?;
    let flow = &mut s.flow_key;
    p.addrs_into(&mut flow.client, &mut flow.vip)?;
    flow.set_ports(ports.src, ports.dst, p.proto, p.family);
    let eth = p.frame.ptr::<EthHdr>(0)?;
    // SAFETY: bounds checked by `ptr`.
    let eth = unsafe { &mut *eth };
    match SNAT_SOURCES.get(vip_id) {
        Some(source) if source.family == p.family => {
            let Some(port) = snat_port(&p, backend, source, s, eth.src)? else {
                return Some(NAT_RESET);
            };
            p.translate(&Change {
                src: Some((&s.flow_key.client, &source.addr)),
                dst: Some((&s.flow_key.vip, &backend.addr)),
                port: Some(Port::Src(port)),
            })?;
        }
        _ => {
            record_way_back(backend, s, eth.src)?;
            p.translate(&Change {
                src: None,
                dst: Some((&s.flow_key.vip, &backend.addr)),
                port: None,
            })?;
        }
    }
    Some(send(ctx, eth, backend.mac, Side::Backends))
}

/// The reply key of the flow in `s.flow_key` as it leaves `backend` for `to` (the client, or
/// the NAT source) and port `to_port`.
#[inline(always)]
fn reply_key(s: &mut NatScratch, backend: &Backend, to: &RawAddr, to_port: u16) {
    let r = &mut s.reply;
    r.backend = backend.addr;
    r.client = *to;
    let f = &s.flow_key;
    r.set_ports(f.vip_port, to_port, f.proto, f.family);
}

/// Gateway NAT: keeps the reply's way back in `NAT_REPLIES` (written when missing or stale).
#[inline(always)]
fn record_way_back(backend: &Backend, s: &mut NatScratch, client_mac: [u8; 6]) -> Option<()> {
    let client = s.flow_key.client;
    reply_key(s, backend, &client, s.flow_key.client_port);
    // A lookup keeps the entry recent in the LRU.
    let known = NAT_REPLIES.get_ptr(&s.reply).is_some_and(|v| {
        // SAFETY: a map value, valid for the program's run.
        let v = unsafe { &*v };
        v.vip == s.flow_key.vip && v.client_mac == client_mac
    });
    if !known {
        s.gateway.vip = s.flow_key.vip;
        s.gateway.client_mac = client_mac;
        s.gateway._pad = [0; 2];
        NAT_REPLIES.insert(&s.reply, &s.gateway, 0).ok()?;
    }
    Some(())
}

/// Source NAT: the source port (network order) of the flow in `s.flow_key`, found in
/// `SNAT_FLOWS` or allocated now; `Some(None)` for a TCP segment without SYN that would
/// open a flow (no port is taken for it). `None` (the packet is dropped) when no port is free
/// or the tables are full, counted in `NAT_STATS`.
#[inline(always)]
fn snat_port(
    p: &Packet,
    backend: &Backend,
    source: &SnatSource,
    s: &mut NatScratch,
    client_mac: [u8; 6],
) -> Option<Option<u16>> {
    let flags = p.tcp_flags();
    let now = now_ticks();
    if let Some(port) = known_snat_port(backend, source, s, flags, now) {
        return Some(Some(port));
    }
    // A new flow (or one whose backend changed): a TCP one only from a SYN, which claims a
    // free port, embryonic until the handshake completes.
    if p.proto == IPPROTO_TCP && flags & TCP_SYN == 0 {
        count_nat(Refused::NotSyn);
        return Some(None);
    }
    // The client's quota of ports, counted only where one is set.
    let quota = source.client_ports;
    let mut held = None;
    if quota != 0 {
        let c = &mut s.client;
        c.addr = s.flow_key.client;
        c.family = s.flow_key.family;
        c._pad = [0; 3];
        held = SNAT_CLIENTS.get_ptr_mut(&s.client);
        if let Some(held) = held
            // SAFETY: a map value, valid for the program's run.
            && unsafe { core::ptr::read_volatile(held) } >= u64::from(quota)
        {
            count_nat(Refused::ClientQuota);
            return None;
        }
    }
    let closing = if flags & TCP_SYN != 0 {
        SNAT_EMBRYONIC
    } else {
        0
    };
    claim_port(backend, source, s, client_mac, now)?;
    let f = &mut s.flow;
    f.backend = backend.addr;
    f.source = source.addr;
    f.last_seen = now;
    f.nat_port = s.reply.client_port;
    f.closing = closing;
    f._pad = [0; 5];
    if SNAT_FLOWS
        .insert(&s.flow_key, &s.flow, u64::from(BPF_ANY))
        .is_err()
    {
        let _ = SNAT_PORTS.remove(&s.reply);
        count_nat(Refused::TableFull);
        return None;
    }
    match held {
        Some(held) => atomic_add(held, 1),
        // Two CPUs may both insert: one count is lost until the daemon's next sweep.
        None if quota != 0 => {
            let _ = SNAT_CLIENTS.insert(&s.client, &1, 0);
        }
        None => {}
    }
    Some(Some(s.reply.client_port))
}

/// The port of the flow in `s.flow_key` if `SNAT_FLOWS` holds it for this backend and source,
/// its entry brought up to date by the packet's `flags`.
#[inline(always)]
fn known_snat_port(
    backend: &Backend,
    source: &SnatSource,
    s: &NatScratch,
    flags: u8,
    now: u64,
) -> Option<u16> {
    let v = SNAT_FLOWS.get_ptr_mut(&s.flow_key)?;
    // SAFETY: a map value, valid for the program's run; fields written whole.
    let v = unsafe { &mut *v };
    if v.backend != backend.addr || v.source != source.addr {
        return None;
    }
    if v.last_seen != now {
        v.last_seen = now;
    }
    if flags & FIN_OR_RST != 0 {
        v.closing = SNAT_CLOSING;
    } else if flags & TCP_SYN != 0 {
        // A SYN (again, or reusing the tuple): embryonic until its ACK.
        if v.closing != SNAT_EMBRYONIC {
            v.closing = SNAT_EMBRYONIC;
        }
    } else if flags & TCP_ACK != 0 && v.closing == SNAT_EMBRYONIC {
        v.closing = 0;
    }
    Some(v.nat_port)
}

/// Claims a free port of `source` for the flow in `s.flow_key` (its way back in
/// `SNAT_PORTS`, the port in `s.reply.client_port`), trying `SNAT_PROBES` random ones; `None`
/// (counted) when none was free or the table is full.
#[inline(always)]
fn claim_port(
    backend: &Backend,
    source: &SnatSource,
    s: &mut NatScratch,
    client_mac: [u8; 6],
    now: u64,
) -> Option<()> {
    reply_key(s, backend, &source.addr, 0);
    let w = &mut s.way_back;
    w.client = s.flow_key.client;
    w.vip = s.flow_key.vip;
    w.client_mac = client_mac;
    w.client_port = s.flow_key.client_port;
    w.last_seen = now;
    w.closing = 0;
    w._pad = [0; 7];
    let count = u32::from(source.port_count).max(1);
    let mut claimed = false;
    let mut full = source.port_count == 0;
    let mut i = 0;
    while i < SNAT_PROBES && !claimed && !full {
        let port = u32::from(source.port_min) + random() % count;
        s.reply.client_port = (port as u16).to_be();
        match SNAT_PORTS.insert(&s.reply, &s.way_back, u64::from(BPF_NOEXIST)) {
            Ok(()) => claimed = true,
            Err(E2BIG) => full = true,
            Err(_) => {}
        }
        i += 1;
    }
    if !claimed {
        count_nat(if full {
            Refused::TableFull
        } else {
            Refused::NoPort
        });
        return None;
    }
    Some(())
}

/// Why a packet got no source-NAT port.
#[derive(Clone, Copy)]
enum Refused {
    /// No free port for its backend.
    NoPort,
    /// The source-NAT tables are full.
    TableFull,
    /// Its client holds its quota of ports.
    ClientQuota,
    /// A TCP segment without SYN of no known flow.
    NotSyn,
}

/// Counts a packet that got no source-NAT port.
#[inline(always)]
fn count_nat(why: Refused) {
    if let Some(stats) = NAT_STATS.get_ptr_mut(0) {
        // SAFETY: this CPU's entry.
        let stats = unsafe { &mut *stats };
        match why {
            Refused::NoPort => stats.no_port += 1,
            Refused::TableFull => stats.table_full += 1,
            Refused::ClientQuota => stats.client_quota += 1,
            Refused::NotSyn => stats.not_syn += 1,
        }
    }
}

/// A TCP/UDP packet not for a VIP: if it is a NAT flow's reply, writes the VIP back as its
/// source (and, for source NAT, the client back as its destination) and sends it to the
/// client's next hop (on the clients' link: see [`crate::links`]); else `XDP_PASS`. `layout`
/// is the caller's parse and NAT bits ([`pack`]).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_nat_reply(ctx: *mut xdp_md, layout: u64) -> u32 {
    reply(ctx, layout).unwrap_or(XDP_PASS)
}

#[inline(always)]
fn reply(ctx: *mut xdp_md, layout: u64) -> Option<u32> {
    let nat = (layout >> 48) as u32;
    let p = checked(Frame::of(&XdpContext::new(ctx)), layout)?;
    let s = scratch()?;
    let ports = p.ports()?;
    let r = &mut s.reply;
    p.addrs_into(&mut r.backend, &mut r.client)?;
    r.set_ports(ports.src, ports.dst, p.proto, p.family);
    let eth = p.frame.ptr::<EthHdr>(0)?;
    if nat & NAT_GATEWAY != 0
        && let Some(way_back) = NAT_REPLIES.get_ptr(&s.reply)
    {
        // SAFETY: a map value, valid for the program's run.
        let way_back = unsafe { &*way_back };
        let change = Change {
            src: Some((&s.reply.backend, &way_back.vip)),
            dst: None,
            port: None,
        };
        if p.translate(&change).is_none() {
            return Some(XDP_DROP);
        }
        // SAFETY: bounds checked by `ptr`.
        let eth = unsafe { &mut *eth };
        return Some(send(ctx, eth, way_back.client_mac, Side::Clients));
    }
    if nat & NAT_SNAT != 0
        && let Some(flow) = SNAT_PORTS.get_ptr_mut(&s.reply)
    {
        // SAFETY: a map value, valid for the program's run; fields written whole.
        let flow = unsafe { &mut *flow };
        let now = now_ticks();
        if flow.last_seen != now {
            flow.last_seen = now;
        }
        if p.tcp_flags() & FIN_OR_RST != 0 {
            flow.closing = SNAT_CLOSING;
        }
        let change = Change {
            src: Some((&s.reply.backend, &flow.vip)),
            dst: Some((&s.reply.client, &flow.client)),
            port: Some(Port::Dst(flow.client_port)),
        };
        if p.translate(&change).is_none() {
            return Some(XDP_DROP);
        }
        // SAFETY: bounds checked by `ptr`.
        let eth = unsafe { &mut *eth };
        return Some(send(ctx, eth, flow.client_mac, Side::Clients));
    }
    Some(XDP_PASS)
}
