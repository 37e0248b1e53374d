//! Backend-side programs.
//!
//! `decap` strips the outer header the balancer added (IPv4/IPv6 IPIP, or GUE: outer IP + UDP
//! to the configured port) from packets addressed to one of this host's accepted addresses,
//! and hands the inner packet to the stack. Hosts whose kernel has no ipip/fou devices (like
//! the test machines) need it; it is also cheaper than a tunnel device.
//!
//! `pass` does nothing but `XDP_PASS`: a veth only receives frames another veth sent with
//! `XDP_TX` when it has an XDP program of its own.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    btf_maps::{Array, HashMap, LpmTrie, PerCpuArray},
    helpers::generated::bpf_xdp_adjust_head,
    macros::{btf_map, xdp},
    maps::lpm_trie::Key as LpmKey,
    programs::XdpContext,
};
use balancer_common::{
    addr::{FAMILY_V4, FAMILY_V6},
    maps::{DecapAddrKey, DecapConfig, MAX_DECAP_ADDRS, MAX_DECAP_SOURCES},
    stats::DecapStats,
};
use balancer_ebpf::{
    headers::*,
    parse::{Frame, Shape, parse_ip, parse_l2},
};

#[btf_map]
static DECAP_CONFIG: Array<DecapConfig, 1> = Array::new();

#[btf_map]
static DECAP_ADDRS: HashMap<DecapAddrKey, u8, { MAX_DECAP_ADDRS as usize }> = HashMap::new();

#[btf_map]
static DECAP_SOURCES_V4: LpmTrie<u32, u8, { MAX_DECAP_SOURCES as usize }> = LpmTrie::new();

#[btf_map]
static DECAP_SOURCES_V6: LpmTrie<[u32; 4], u8, { MAX_DECAP_SOURCES as usize }> = LpmTrie::new();

#[btf_map]
static DECAP_STATS: PerCpuArray<DecapStats, 1> = PerCpuArray::new();

#[xdp]
pub fn pass(_ctx: XdpContext) -> u32 {
    XDP_PASS
}

#[xdp]
pub fn decap(ctx: XdpContext) -> u32 {
    if let Some(stats) = DECAP_STATS.get_ptr_mut(0) {
        // SAFETY: this CPU's entry, valid while the program runs.
        return try_decap(&ctx, unsafe { &mut *stats });
    }
    XDP_PASS
}

/// Whether a tunnelled packet's outer source is allowed (`balancer decap --allow`).
#[inline(always)]
fn source_allowed(src: &[u32; 4], family: u8) -> bool {
    if family == FAMILY_V4 {
        DECAP_SOURCES_V4.get(&LpmKey::new(32, src[0])).is_some()
    } else {
        DECAP_SOURCES_V6.get(&LpmKey::new(128, *src)).is_some()
    }
}

enum Outer {
    Ipip,
    Gue,
}

/// Strips a tunnelled packet for this host; the action: `XDP_DROP` for one from an outer
/// source not allowed, `XDP_PASS` for everything else (stripped or not).
#[inline(always)]
fn try_decap(ctx: &XdpContext, stats: &mut DecapStats) -> u32 {
    let frame = Frame::of(ctx);
    let Some(l2) = parse_l2(&frame) else {
        return XDP_PASS;
    };
    let Some(outer) = parse_ip(&frame, &l2) else {
        return XDP_PASS;
    };
    if outer.shape != Shape::Plain {
        return XDP_PASS;
    }
    // The settings are read for tunnelled packets only: the backend's own traffic pays nothing.
    let (kind, inner_off) = match outer.proto {
        IPPROTO_IPIP | IPPROTO_IPV6 => (Outer::Ipip, outer.l4_off),
        IPPROTO_UDP => {
            let Some(cfg) = DECAP_CONFIG.get(0) else {
                return XDP_PASS;
            };
            let Some(udp) = frame.ptr::<UdpHdr>(outer.l4_off) else {
                return XDP_PASS;
            };
            // SAFETY: bounds checked by `ptr`.
            if cfg.gue_port == 0 || unsafe { (*udp).dst } != cfg.gue_port {
                return XDP_PASS;
            }
            (Outer::Gue, outer.l4_off + UDP_LEN)
        }
        _ => return XDP_PASS,
    };
    let key = DecapAddrKey {
        addr: outer.dst,
        family: outer.family,
        _pad: [0; 3],
    };
    // SAFETY: the value is only read while the program runs.
    if unsafe { DECAP_ADDRS.get(key) }.is_none() {
        stats.foreign += 1;
        return XDP_PASS;
    }
    let restrict = match DECAP_CONFIG.get(0) {
        Some(cfg) => cfg.restrict_sources != 0,
        None => false,
    };
    if restrict && !source_allowed(&outer.src, outer.family) {
        stats.refused += 1;
        return XDP_DROP;
    }
    // At least a minimal IPv4 header must follow. (A one-byte check would also be optimised
    // into a form the verifier cannot follow.)
    let Some(inner) = frame.ptr::<[u8; IPV4_LEN]>(inner_off) else {
        stats.malformed += 1;
        return XDP_PASS;
    };
    // SAFETY: bounds checked by `ptr`.
    let inner_family = match unsafe { (*inner)[0] } >> 4 {
        4 => FAMILY_V4,
        6 => FAMILY_V6,
        _ => {
            stats.malformed += 1;
            return XDP_PASS;
        }
    };
    if strip(ctx, l2.l3_off, inner_off - l2.l3_off, inner_family).is_none() {
        stats.malformed += 1;
        return XDP_PASS;
    }
    match kind {
        Outer::Ipip => stats.ipip += 1,
        Outer::Gue => stats.gue += 1,
    }
    XDP_PASS
}

/// Removes `len` bytes after the L2 header (which is `l3_off` long) and sets its ether type.
#[inline(always)]
fn strip(ctx: &XdpContext, l3_off: usize, len: usize, inner_family: u8) -> Option<()> {
    let frame = Frame::of(ctx);
    match l3_off {
        ETH_LEN => move_l2::<ETH_LEN>(ctx, &frame, len)?,
        18 => move_l2::<18>(ctx, &frame, len)?,
        22 => move_l2::<22>(ctx, &frame, len)?,
        _ => return None,
    }
    let frame = Frame::of(ctx);
    let ether_type = frame.ptr::<u16>(l3_off - 2)?;
    // SAFETY: bounds checked by `ptr`.
    unsafe {
        *ether_type = if inner_family == FAMILY_V4 {
            ETH_P_IP
        } else {
            ETH_P_IPV6
        }
    };
    Some(())
}

#[inline(always)]
fn move_l2<const N: usize>(ctx: &XdpContext, frame: &Frame, len: usize) -> Option<()> {
    let l2 = frame.ptr::<[u8; N]>(0)?;
    // SAFETY: bounds checked by `ptr`.
    let saved = unsafe { *l2 };
    // SAFETY: `ctx.ctx` is the program's context.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, len as i32) } != 0 {
        return None;
    }
    let frame = Frame::of(ctx);
    let l2 = frame.ptr::<[u8; N]>(0)?;
    // SAFETY: bounds checked by `ptr`.
    unsafe { *l2 = saved };
    Some(())
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
