//! A packet's flow as choosing sees it: the client's address and port, and what kind of
//! packet it is.

use balancer_common::addr::RawAddr;

/// What kind of packet a flow's packet is, as far as choosing goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PacketKind {
    /// A TCP SYN without ACK: a new connection, always chosen afresh from the table (a reused
    /// client port must not land on the backend an old connection had, which may be draining).
    TcpSyn,
    /// A TCP FIN or RST from the client: the flow ends (it stops counting as active).
    TcpEnd,
    /// Any other TCP packet.
    Tcp,
    /// UDP: tracked flows expire after the configured idle time.
    Udp,
}

/// A packet's flow: the client address and port, and the packet kind.
pub struct Flow<'a> {
    pub src: &'a RawAddr,
    pub sport: u16,
    pub kind: PacketKind,
    /// The client's address family and DSCP (for priority tiers).
    pub family: u8,
    pub dscp: u8,
}
