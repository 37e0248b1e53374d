//! Wire layouts of the headers the programs read and write. Multi-byte fields are in network
//! byte order, as on the wire.

pub const ETH_P_IP: u16 = 0x0800_u16.to_be();
pub const ETH_P_IPV6: u16 = 0x86dd_u16.to_be();
pub const ETH_P_8021Q: u16 = 0x8100_u16.to_be();
pub const ETH_P_8021AD: u16 = 0x88a8_u16.to_be();

pub const IPPROTO_HOPOPTS: u8 = 0;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_IPIP: u8 = 4;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_IPV6: u8 = 41;
pub const IPPROTO_ROUTING: u8 = 43;
pub const IPPROTO_FRAGMENT: u8 = 44;
pub const IPPROTO_AH: u8 = 51;
pub const IPPROTO_ICMPV6: u8 = 58;
pub const IPPROTO_DSTOPTS: u8 = 60;

/// IPv4 `frag_off`: more-fragments flag and offset bits (network order).
pub const IPV4_FRAG_MASK: u16 = 0x3fff_u16.to_be();
/// IPv4 `frag_off`: don't-fragment flag (network order).
pub const IPV4_DF: u16 = 0x4000_u16.to_be();

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub ether_type: u16,
}
pub const ETH_LEN: usize = 14;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct VlanHdr {
    pub tci: u16,
    pub ether_type: u16,
}
pub const VLAN_LEN: usize = 4;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv4Hdr {
    pub ver_ihl: u8,
    pub tos: u8,
    pub tot_len: u16,
    pub id: u16,
    pub frag_off: u16,
    pub ttl: u8,
    pub proto: u8,
    pub check: u16,
    pub saddr: u32,
    pub daddr: u32,
}
pub const IPV4_LEN: usize = 20;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv6Hdr {
    /// Version (4 bits), traffic class (8 bits), flow label (20 bits).
    pub ver_tc_flow: [u8; 4],
    pub payload_len: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
}
pub const IPV6_LEN: usize = 40;

/// The first bytes of TCP and UDP headers: the ports.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ports {
    pub src: u16,
    pub dst: u16,
}

/// A TCP header without options.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TcpHdr {
    pub src: u16,
    pub dst: u16,
    pub seq: u32,
    pub ack_seq: u32,
    /// Data offset in 32-bit words (high 4 bits).
    pub doff: u8,
    pub flags: u8,
    pub window: u16,
    pub check: u16,
    pub urg_ptr: u16,
}
pub const TCP_LEN: usize = 20;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UdpHdr {
    pub src: u16,
    pub dst: u16,
    pub len: u16,
    pub check: u16,
}
pub const UDP_LEN: usize = 8;

/// ICMP and ICMPv6 share this 8-byte header layout.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IcmpHdr {
    pub kind: u8,
    pub code: u8,
    pub check: u16,
    /// Identifier/sequence, unused, or the next-hop MTU (bytes 6..8 for ICMPv4 type 3 code 4;
    /// bytes 4..8 for ICMPv6 packet-too-big).
    pub rest: [u8; 4],
}
pub const ICMP_LEN: usize = 8;

pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_FRAG_NEEDED: u8 = 4;
pub const ICMP_ECHO_REQUEST: u8 = 8;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
pub const ICMP_PARAMETER_PROBLEM: u8 = 12;

pub const ICMPV6_DEST_UNREACH: u8 = 1;
pub const ICMPV6_PACKET_TOO_BIG: u8 = 2;
pub const ICMPV6_TIME_EXCEEDED: u8 = 3;
pub const ICMPV6_PARAMETER_PROBLEM: u8 = 4;
pub const ICMPV6_ECHO_REQUEST: u8 = 128;
pub const ICMPV6_ECHO_REPLY: u8 = 129;
