//! The layouts of NAT's maps: the replies of NAT flows, source NAT's per-VIP source, its
//! flows, ports and per-client counts, and the two links.

use crate::addr::RawAddr;

/// Key of [`NAT_REPLIES`](super::NAT_REPLIES): a reply of a NAT flow as it leaves the backend
/// (backend to client).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NatReplyKey {
    pub backend: RawAddr,
    pub client: RawAddr,
    /// Network byte order, as in the packet.
    pub backend_port: u16,
    pub client_port: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<NatReplyKey>() == 40);

impl NatReplyKey {
    /// Sets everything but the addresses (ports in network byte order).
    #[inline(always)]
    pub fn set_ports(&mut self, backend_port: u16, client_port: u16, proto: u8, family: u8) {
        self.backend_port = backend_port;
        self.client_port = client_port;
        self.proto = proto;
        self.family = family;
        self._pad = [0; 2];
    }
}

/// Value of [`NAT_REPLIES`](super::NAT_REPLIES): the VIP the client addressed, and the Ethernet
/// source of the client's packets (the client, or its router), where replies go.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatReplyValue {
    pub vip: RawAddr,
    pub client_mac: [u8; 6],
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<NatReplyValue>() == 24);

/// Source NAT of one VIP: the address its flows leave from and the ports they take.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnatSource {
    pub addr: RawAddr,
    /// First port of the range, host byte order.
    pub port_min: u16,
    /// Ports in the range (0: none).
    pub port_count: u16,
    /// The address's family; 0 = no source NAT for this VIP.
    pub family: u8,
    pub _pad: u8,
    /// Most ports one client address may hold ([`SNAT_CLIENTS`](super::SNAT_CLIENTS)) before its
    /// new flows are refused; 0: no limit.
    pub client_ports: u16,
}
const _: () = assert!(core::mem::size_of::<SnatSource>() == 24);

/// Key of [`SNAT_CLIENTS`](super::SNAT_CLIENTS): a client's address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SnatClientKey {
    pub addr: RawAddr,
    pub family: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<SnatClientKey>() == 20);

/// The links of NAT forwarding (the single entry of [`NAT_LINKS`](super::NAT_LINKS)): the program
/// runs on both; a NAT VIP's packet leaves on the backends' link, a reply (or an ICMP error about a
/// flow) on the clients', by `bpf_redirect` when it came in on the other one. `backend_ifindex` 0:
/// one link for both.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatLinks {
    /// Interface index of the clients' link (the daemon's `interface`).
    pub client_ifindex: u32,
    /// Interface index of the backends' link (`[nat] interface`); 0: the clients' link.
    pub backend_ifindex: u32,
    /// The MAC frames leaving on the clients' link come from.
    pub client_mac: [u8; 6],
    /// The MAC frames leaving on the backends' link come from.
    pub backend_mac: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<NatLinks>() == 20);

/// Key of [`SNAT_FLOWS`](super::SNAT_FLOWS): a client's flow to a VIP, as the client sends it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SnatFlowKey {
    pub client: RawAddr,
    pub vip: RawAddr,
    /// Network byte order, as in the packet.
    pub client_port: u16,
    pub vip_port: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<SnatFlowKey>() == 40);

impl SnatFlowKey {
    /// Sets everything but the addresses (ports in network byte order).
    #[inline(always)]
    pub fn set_ports(&mut self, client_port: u16, vip_port: u16, proto: u8, family: u8) {
        self.client_port = client_port;
        self.vip_port = vip_port;
        self.proto = proto;
        self.family = family;
        self._pad = [0; 2];
    }
}

/// Value of [`SNAT_FLOWS`](super::SNAT_FLOWS): how the flow leaves for its backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnatFlowValue {
    pub backend: RawAddr,
    /// The source address written in the flow's packets.
    pub source: RawAddr,
    /// Flow-clock tick of the client's last packet.
    pub last_seen: u64,
    /// The source port written, network byte order.
    pub nat_port: u16,
    /// [`SNAT_CLOSING`] once the client sent FIN or RST; [`SNAT_EMBRYONIC`] from its SYN
    /// until its first ACK; 0 in between. Either way the flow times out as a closed one.
    pub closing: u8,
    pub _pad: [u8; 5],
}
const _: () = assert!(core::mem::size_of::<SnatFlowValue>() == 48);

/// Value of [`SNAT_PORTS`](super::SNAT_PORTS): the client's flow a reply belongs to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnatPortValue {
    pub client: RawAddr,
    pub vip: RawAddr,
    /// The Ethernet source of the client's packets (the client, or its router).
    pub client_mac: [u8; 6],
    /// Network byte order.
    pub client_port: u16,
    /// Flow-clock tick of the backend's last reply (or of the flow's first packet).
    pub last_seen: u64,
    /// 1 once the backend sent FIN or RST.
    pub closing: u8,
    pub _pad: [u8; 7],
}
const _: () = assert!(core::mem::size_of::<SnatPortValue>() == 56);

/// [`SnatFlowValue::closing`]: the client sent FIN or RST.
pub const SNAT_CLOSING: u8 = 1;
/// [`SnatFlowValue::closing`]: the client sent a SYN and no ACK yet (the handshake is not
/// complete: a spoofed SYN's port comes back at the closed flows' timeout).
pub const SNAT_EMBRYONIC: u8 = 2;

/// Free ports tried at random before a new source-NAT flow counts as "no port".
pub const SNAT_PROBES: u32 = 32;

/// [`GlobalConfig::nat`](super::GlobalConfig::nat) bit: a VIP forwards by NAT with replies through
/// this host as the backends' gateway ([`NAT_REPLIES`](super::NAT_REPLIES)).
pub const NAT_GATEWAY: u32 = 1;
/// [`GlobalConfig::nat`](super::GlobalConfig::nat) bit: a VIP translates sources too
/// ([`SNAT_PORTS`](super::SNAT_PORTS)).
pub const NAT_SNAT: u32 = 2;
