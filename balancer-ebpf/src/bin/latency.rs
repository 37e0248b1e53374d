//! Passive request latency on a backend host: two tc programs, attached to the interface the
//! clients' packets arrive on (`latency_ingress`) and leave by (`latency_egress`).
//!
//! Per TCP flow to a watched server port (`LATENCY_PORTS`), each client data packet marks a
//! request in progress (its time kept: the last one counts); a request that starts with HTTP
//! `GET ` or `HEAD ` (a health check, a metrics scrape) is not measured. The server's first data packet
//! after it gives the time to first token; a packet of response headers alone (it starts with
//! `HTTP/` and ends with the blank line) is skipped, as a streaming server sends its headers
//! before the first token. Later server data packets give the inter-token latency, until the
//! chunked encoding's last chunk, a FIN or a RST. Packets are never changed or dropped: both
//! programs hand every packet on to the next (`TC_ACT_UNSPEC`).
//!
//! Types, map names and the histogram's buckets: `balancer_common::latency`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    bindings::TC_ACT_UNSPEC,
    btf_maps::{HashMap, LruHashMap, PerCpuArray},
    helpers::bpf_ktime_get_ns,
    macros::{btf_map, classifier},
    programs::TcContext,
};
use balancer_common::{
    addr::{FAMILY_V4, FAMILY_V6, RawAddr},
    latency::{
        FLOW_AWAITING, FLOW_ENDED, FLOW_HEADERS, FLOW_IGNORED, FLOW_RESPONDING, LatencyFlow,
        LatencyFlowKey, LatencyStats, MAX_LATENCY_FLOWS, MAX_LATENCY_PORTS,
    },
};
use balancer_ebpf::headers::{
    ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPPROTO_TCP, IPV4_FRAG_MASK, IPV4_LEN, IPV6_LEN, Ipv4Hdr,
    Ipv6Hdr, TCP_LEN, TcpHdr,
};

#[btf_map]
static LATENCY_PORTS: HashMap<u16, u8, { MAX_LATENCY_PORTS as usize }> = HashMap::new();

#[btf_map]
static LATENCY_FLOWS: LruHashMap<LatencyFlowKey, LatencyFlow, { MAX_LATENCY_FLOWS as usize }> =
    LruHashMap::new();

#[btf_map]
static LATENCY_STATS: PerCpuArray<LatencyStats, 1> = PerCpuArray::new();

const TCP_FIN: u8 = 0x01;
const TCP_RST: u8 = 0x04;
/// `\r\n\r\n` as it lies in memory.
const BLANK_LINE: u32 = u32::from_ne_bytes(*b"\r\n\r\n");
/// `GET ` and `HEAD` as they lie in memory.
const GET: u32 = u32::from_ne_bytes(*b"GET ");
const HEAD: u32 = u32::from_ne_bytes(*b"HEAD");

/// A TCP segment's addresses, ports, flags and where its payload lies.
struct Segment {
    src: RawAddr,
    dst: RawAddr,
    sport: u16,
    dport: u16,
    family: u8,
    flags: u8,
    payload_off: usize,
    payload_len: usize,
}

/// Packets to a watched port: client to server.
#[classifier]
pub fn latency_ingress(ctx: TcContext) -> i32 {
    if let Some(seg) = segment(&ctx) {
        // SAFETY: the value is only read while the program runs.
        if unsafe { LATENCY_PORTS.get(seg.dport) }.is_some() {
            from_client(&ctx, &seg);
        }
    }
    TC_ACT_UNSPEC
}

/// Packets from a watched port: server to client.
#[classifier]
pub fn latency_egress(ctx: TcContext) -> i32 {
    if let Some(seg) = segment(&ctx) {
        // SAFETY: as above.
        if unsafe { LATENCY_PORTS.get(seg.sport) }.is_some() {
            from_server(&ctx, &seg);
        }
    }
    TC_ACT_UNSPEC
}

#[inline(always)]
fn from_client(ctx: &TcContext, seg: &Segment) {
    let key = LatencyFlowKey {
        client: seg.src,
        server: seg.dst,
        client_port: seg.sport,
        server_port: seg.dport,
        family: seg.family,
        _pad: [0; 3],
    };
    if seg.flags & (TCP_FIN | TCP_RST) != 0 {
        let _ = LATENCY_FLOWS.remove(key);
        return;
    }
    if seg.payload_len == 0 {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(stats) = stats() else {
        return;
    };
    let state;
    if let Some(flow) = LATENCY_FLOWS.get_ptr_mut(key) {
        // SAFETY: the entry is valid while the program runs.
        let flow = unsafe { &mut *flow };
        match flow.state {
            // More of the same request: its last packet counts.
            FLOW_AWAITING => {
                flow.request_ns = now;
                return;
            }
            // The whole answer came with the headers: it was the first token.
            FLOW_HEADERS => stats.ttft.observe(flow.headers_ns - flow.request_ns),
            _ => {}
        }
        state = request_state(ctx, seg);
        flow.request_ns = now;
        flow.state = state;
    } else {
        state = request_state(ctx, seg);
        let flow = LatencyFlow {
            request_ns: now,
            headers_ns: 0,
            last_ns: 0,
            state,
            _pad: 0,
        };
        if LATENCY_FLOWS.insert(key, flow, 0).is_err() {
            return;
        }
    }
    if state == FLOW_IGNORED {
        stats.skipped += 1;
    } else {
        stats.requests += 1;
    }
}

/// The state a request starts in, from its first packet: [`FLOW_IGNORED`] for HTTP `GET ` and
/// `HEAD ` (not measured), else [`FLOW_AWAITING`].
#[inline(always)]
fn request_state(ctx: &TcContext, seg: &Segment) -> u32 {
    let unmeasured = match ctx.load::<u32>(seg.payload_off) {
        Ok(GET) => true,
        Ok(HEAD) => matches!(ctx.load::<u8>(seg.payload_off + 4), Ok(b' ')),
        _ => false,
    };
    if unmeasured {
        FLOW_IGNORED
    } else {
        FLOW_AWAITING
    }
}

#[inline(always)]
fn from_server(ctx: &TcContext, seg: &Segment) {
    let key = LatencyFlowKey {
        client: seg.dst,
        server: seg.src,
        client_port: seg.dport,
        server_port: seg.sport,
        family: seg.family,
        _pad: [0; 3],
    };
    let closing = seg.flags & (TCP_FIN | TCP_RST) != 0;
    if seg.payload_len == 0 && !closing {
        return;
    }
    let Some(stats) = stats() else {
        return;
    };
    let Some(flow) = LATENCY_FLOWS.get_ptr_mut(key) else {
        if seg.payload_len != 0 {
            stats.unmatched += 1;
        }
        return;
    };
    // SAFETY: the entry is valid while the program runs.
    let flow = unsafe { &mut *flow };
    let now = unsafe { bpf_ktime_get_ns() };
    if seg.payload_len != 0 {
        match flow.state {
            FLOW_AWAITING if headers_alone(ctx, seg) => {
                flow.headers_ns = now;
                flow.state = FLOW_HEADERS;
            }
            // The first data of the answer.
            FLOW_AWAITING | FLOW_HEADERS => {
                stats.ttft.observe(now - flow.request_ns);
                flow.last_ns = now;
                flow.state = FLOW_RESPONDING;
            }
            FLOW_RESPONDING => {
                if last_chunk(ctx, seg) {
                    flow.state = FLOW_ENDED;
                } else {
                    stats.itl.observe(now - flow.last_ns);
                    flow.last_ns = now;
                }
            }
            _ => {}
        }
    }
    if closing {
        if flow.state == FLOW_HEADERS {
            stats.ttft.observe(flow.headers_ns - flow.request_ns);
        }
        let _ = LATENCY_FLOWS.remove(key);
    }
}

#[inline(always)]
fn stats() -> Option<&'static mut LatencyStats> {
    // SAFETY: this CPU's entry, valid while the program runs.
    LATENCY_STATS.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// A payload that starts with `HTTP/` and ends with the blank line after the headers: response
/// headers with no body data yet.
#[inline(always)]
fn headers_alone(ctx: &TcContext, seg: &Segment) -> bool {
    if seg.payload_len < 16 || seg.payload_len > 8192 {
        return false;
    }
    // Compared as integers: a byte-array comparison may become a call to `bcmp`.
    let starts = matches!(ctx.load::<u32>(seg.payload_off), Ok(w) if w == u32::from_ne_bytes(*b"HTTP"))
        && matches!(ctx.load::<u8>(seg.payload_off + 4), Ok(b'/'));
    starts
        && matches!(ctx.load::<u32>(seg.payload_off + seg.payload_len - 4), Ok(w) if w == BLANK_LINE)
}

/// The chunked encoding's last chunk, `0\r\n\r\n`, alone: the response ended.
#[inline(always)]
fn last_chunk(ctx: &TcContext, seg: &Segment) -> bool {
    seg.payload_len == 5
        && matches!(ctx.load::<u8>(seg.payload_off), Ok(b'0'))
        && matches!(ctx.load::<u32>(seg.payload_off + 1), Ok(w) if w == BLANK_LINE)
}

/// The TCP segment in the packet, if it is one (IPv4 without fragments, or IPv6 whose next
/// header is TCP).
#[inline(always)]
fn segment(ctx: &TcContext) -> Option<Segment> {
    let ether_type: u16 = ctx.load(12).ok()?;
    let (src, dst, family, l4_off, l4_len) = if ether_type == ETH_P_IP {
        let ip: Ipv4Hdr = ctx.load(ETH_LEN).ok()?;
        if ip.proto != IPPROTO_TCP || ip.frag_off & IPV4_FRAG_MASK != 0 {
            return None;
        }
        let ihl = ((ip.ver_ihl & 0x0f) as usize) * 4;
        let total = u16::from_be(ip.tot_len) as usize;
        if ihl < IPV4_LEN || total < ihl {
            return None;
        }
        (
            [ip.saddr, 0, 0, 0],
            [ip.daddr, 0, 0, 0],
            FAMILY_V4,
            ETH_LEN + ihl,
            total - ihl,
        )
    } else if ether_type == ETH_P_IPV6 {
        let ip: Ipv6Hdr = ctx.load(ETH_LEN).ok()?;
        if ip.next_hdr != IPPROTO_TCP {
            return None;
        }
        (
            ip.saddr,
            ip.daddr,
            FAMILY_V6,
            ETH_LEN + IPV6_LEN,
            u16::from_be(ip.payload_len) as usize,
        )
    } else {
        return None;
    };
    let tcp: TcpHdr = ctx.load(l4_off).ok()?;
    let doff = ((tcp.doff >> 4) as usize) * 4;
    if doff < TCP_LEN || l4_len < doff {
        return None;
    }
    Some(Segment {
        src,
        dst,
        sport: tcp.src,
        dport: tcp.dst,
        family,
        flags: tcp.flags,
        payload_off: l4_off + doff,
        payload_len: l4_len - doff,
    })
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
