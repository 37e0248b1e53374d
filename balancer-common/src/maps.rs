//! Map names, capacities and the key/value layouts of every map the XDP program and the daemon
//! share. Each struct is `#[repr(C)]` with explicit padding fields (so no byte of a key is ever
//! uninitialised) and a compile-time size check.

use crate::addr::RawAddr;

/// VIP lookup: [`VipKey`] -> [`VipMeta`].
pub const VIPS: &str = "VIPS";
/// Maglev tables: array of maps indexed by `vip_id`; each inner array maps slot -> backend id.
pub const MAGLEV: &str = "MAGLEV";
/// Backends by id: array of [`Backend`].
pub const BACKENDS: &str = "BACKENDS";
/// Connection table: LRU hash [`FlowKey`] -> [`FlowState`].
pub const FLOWS: &str = "FLOWS";
/// Global settings: array of one [`GlobalConfig`].
pub const CONFIG: &str = "CONFIG";
/// Per-CPU global counters: array of one [`crate::stats::GlobalStats`].
pub const STATS: &str = "STATS";
/// Per-CPU traffic per VIP: array of [`crate::stats::TrafficStats`] indexed by `vip_id`.
pub const VIP_STATS: &str = "VIP_STATS";
/// Per-CPU traffic per backend: array of [`crate::stats::TrafficStats`] indexed by backend id.
pub const BACKEND_STATS: &str = "BACKEND_STATS";

/// Most VIPs one balancer serves (outer Maglev array, per-VIP counters).
pub const MAX_VIPS: u32 = 1024;
/// Most backends over all VIPs (backend array, per-backend counters).
pub const MAX_BACKENDS: u32 = 16384;
/// Largest Maglev table. The inner-map template is declared with this size and
/// `BPF_F_INNER_MAP`, so each VIP's table may be any prime up to it.
pub const MAX_TABLE_SIZE: u32 = 655_373;
/// Default Maglev table size (prime), as in the Maglev paper.
pub const DEFAULT_TABLE_SIZE: u32 = 65_537;
/// Connection-table capacity compiled into the object; the daemon sets the real size from its
/// config before loading.
pub const DEFAULT_MAX_FLOWS: u32 = 1 << 20;

/// Slot value of a Maglev table with no usable backend; the data plane drops such packets.
pub const NO_BACKEND: u32 = u32::MAX;

/// `BPF_F_INNER_MAP`: inner maps of a map-in-map may differ in `max_entries`.
pub const BPF_F_INNER_MAP: u32 = 1 << 12;
/// `BPF_F_MMAPABLE`: an array whose values user space can map and write directly.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
/// Flags of every Maglev table (inner map): sizes may differ per VIP, and the daemon fills a
/// new table through a memory mapping instead of one syscall per slot.
pub const MAGLEV_TABLE_FLAGS: u32 = BPF_F_INNER_MAP | BPF_F_MMAPABLE;
/// `BPF_F_NO_COMMON_LRU`: each CPU keeps its own LRU list (no cross-CPU lock on eviction).
pub const BPF_F_NO_COMMON_LRU: u32 = 1 << 1;

/// Key of the VIP map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VipKey {
    pub addr: RawAddr,
    /// Destination port in network byte order.
    pub port: u16,
    /// IP protocol number (6 TCP, 17 UDP).
    pub proto: u8,
    /// [`crate::addr::FAMILY_V4`] or [`crate::addr::FAMILY_V6`].
    pub family: u8,
}
const _: () = assert!(core::mem::size_of::<VipKey>() == 20);

/// How a VIP's packets reach the chosen backend.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardMode {
    /// Rewrite the Ethernet addresses and transmit on the same link (direct server return).
    L2Dsr = 0,
    /// Encapsulate in an outer IP header (IPv4-in-IPv4 / IPv6-in-IPv6, or mixed).
    Ipip = 1,
    /// Encapsulate in outer IP + UDP (GUE variant 1: the inner IP header follows the UDP header).
    Gue = 2,
}

impl ForwardMode {
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::L2Dsr),
            1 => Some(Self::Ipip),
            2 => Some(Self::Gue),
            _ => None,
        }
    }
}

/// Value of the VIP map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipMeta {
    /// Index into [`MAGLEV`] and [`VIP_STATS`].
    pub vip_id: u32,
    /// Number of slots of this VIP's Maglev table (a prime).
    pub table_size: u32,
    /// A [`ForwardMode`] as `u8`.
    pub mode: u8,
    /// `VIP_F_*` bits.
    pub flags: u8,
    /// Outer UDP destination port for [`ForwardMode::Gue`], network byte order.
    pub gue_port: u16,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<VipMeta>() == 16);

/// A backend slot is in use and may receive packets.
pub const BACKEND_F_ACTIVE: u8 = 1;

/// Value of the backend array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backend {
    pub addr: RawAddr,
    /// Next-hop MAC: the backend's own when it is on the link, otherwise the gateway's.
    pub mac: [u8; 6],
    pub family: u8,
    /// `BACKEND_F_*` bits.
    pub flags: u8,
    /// Changes whenever the slot is given to a different backend, so connection-table entries
    /// that point at a previous occupant are detected and re-hashed.
    pub generation: u32,
}
const _: () = assert!(core::mem::size_of::<Backend>() == 28);

/// Key of the connection table: one client flow to one VIP. The VIP's address, port and
/// protocol are implied by `vip_id`, which keeps the key (and the hash over it) short.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: RawAddr,
    pub vip_id: u32,
    /// Client port in network byte order.
    pub sport: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<FlowKey>() == 24);

/// Value of the connection table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowState {
    pub backend_id: u32,
    /// [`Backend::generation`] when the flow was pinned.
    pub backend_generation: u32,
    /// Last packet time (`bpf_ktime_get_ns`), kept for UDP idle expiry.
    pub last_seen_ns: u64,
}
const _: () = assert!(core::mem::size_of::<FlowState>() == 16);

/// Global settings, the single entry of [`CONFIG`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalConfig {
    /// Outer IPv4 source base for encapsulation (network order).
    pub encap_src_v4: u32,
    /// Host-order mask of flow-hash bits OR-ed into the outer IPv4 source, so a backend's NIC
    /// RSS spreads encapsulated flows over its queues. 0 = a fixed source.
    pub encap_src_v4_hash_mask: u32,
    /// Outer IPv6 source base for encapsulation.
    pub encap_src_v6: RawAddr,
    /// Like `encap_src_v4_hash_mask`, applied to the last word of the IPv6 source.
    pub encap_src_v6_hash_mask: u32,
    /// Largest IP packet the egress link carries; an encapsulated packet that would exceed it
    /// is answered with ICMP fragmentation-needed / packet-too-big. 0 = no check.
    pub mtu: u32,
    /// A UDP flow idle longer than this is chosen afresh. 0 = never expires.
    pub udp_idle_timeout_ns: u64,
    /// New flows per second per CPU above which the connection table stops taking entries and
    /// new flows use the consistent hash alone (flood mode). 0 = no limit.
    pub flood_threshold: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<GlobalConfig>() == 48);

/// Decapsulator settings: array of one [`DecapConfig`].
pub const DECAP_CONFIG: &str = "DECAP_CONFIG";
/// Decapsulator: outer destination addresses it accepts ([`DecapAddrKey`] -> `u8`, unused).
pub const DECAP_ADDRS: &str = "DECAP_ADDRS";
/// Decapsulator counters: per-CPU array of one [`crate::stats::DecapStats`].
pub const DECAP_STATS: &str = "DECAP_STATS";
/// Most local addresses the decapsulator accepts as outer destinations.
pub const MAX_DECAP_ADDRS: u32 = 64;

/// Settings of the backend-side decapsulator.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecapConfig {
    /// UDP destination port of GUE packets, network byte order; 0 = no GUE.
    pub gue_port: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<DecapConfig>() == 4);

/// A local address the decapsulator accepts as an outer destination.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DecapAddrKey {
    pub addr: RawAddr,
    pub family: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<DecapAddrKey>() == 20);
