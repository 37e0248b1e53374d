//! Counter layouts. All counters are per-CPU in the kernel; the daemon sums them.

/// Global counters; the index names one entry of [`GlobalStats::counters`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Packets for a VIP, a VIP address or a NAT flow returned with `XDP_PASS` (packets for
    /// no VIP pass uncounted, so they cost no counter lookup).
    ActionPass = 0,
    /// Packets returned with `XDP_TX` (forwarded to a backend, or an ICMP answer).
    ActionTx,
    /// Packets returned with `XDP_DROP`.
    ActionDrop,
    /// A VIP packet whose flow was in the connection table.
    ConntrackHit,
    /// A VIP packet whose flow was not in the connection table, or a TCP SYN (a new
    /// connection is always chosen from the table).
    ConntrackMiss,
    /// A tracked flow whose backend had left (removed or unhealthy) and was chosen again.
    FlowRehashed,
    /// A tracked UDP flow idle past the timeout and chosen again.
    UdpFlowExpired,
    /// Times a CPU entered flood mode (new-flow rate over the threshold).
    FloodActivations,
    /// New flows not inserted into the connection table because of flood mode.
    FloodInsertsSkipped,
    /// VIP packet dropped: the VIP has no table or no usable backend.
    DropNoBackend,
    /// VIP packet dropped: an IP fragment.
    DropFragment,
    /// VIP packet dropped: IPv4 header with options.
    DropIpOptions,
    /// VIP packet dropped: headers inconsistent with the frame (bad lengths).
    DropMalformed,
    /// VIP packet dropped: the kernel refused to grow the headroom for encapsulation.
    DropEncapFailed,
    /// ICMP error quoting a VIP flow, forwarded to that flow's backend.
    IcmpErrorForwarded,
    /// ICMP fragmentation-needed / packet-too-big sent back to a client.
    IcmpTooBigSent,
    /// Session persistence: a returning client's new flow sent to its backend.
    PersistenceReturned,
    /// Session persistence: a returning client's new flow over its backend's bounded load,
    /// sent where the scheduler puts it (the client keeps its backend).
    PersistenceOverBound,
    /// Session persistence: a returning client's new flow sent elsewhere because the policy
    /// expects its backend to serve returning clients later than another would
    /// (`BACKEND_F_RETURNING_ELSEWHERE`; the client keeps its backend).
    PersistenceSentElsewhere,
    /// Session persistence: a new flow of a client without a backend to return to (new, its
    /// time run out, or its backend gone, drained or replaced), placed by the scheduler.
    PersistencePlaced,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; COUNTERS] = [
        Counter::ActionPass,
        Counter::ActionTx,
        Counter::ActionDrop,
        Counter::ConntrackHit,
        Counter::ConntrackMiss,
        Counter::FlowRehashed,
        Counter::UdpFlowExpired,
        Counter::FloodActivations,
        Counter::FloodInsertsSkipped,
        Counter::DropNoBackend,
        Counter::DropFragment,
        Counter::DropIpOptions,
        Counter::DropMalformed,
        Counter::DropEncapFailed,
        Counter::IcmpErrorForwarded,
        Counter::IcmpTooBigSent,
        Counter::PersistenceReturned,
        Counter::PersistenceOverBound,
        Counter::PersistenceSentElsewhere,
        Counter::PersistencePlaced,
    ];

    /// A snake_case name for metrics and the CLI.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::ActionPass => "xdp_pass",
            Counter::ActionTx => "xdp_tx",
            Counter::ActionDrop => "xdp_drop",
            Counter::ConntrackHit => "conntrack_hit",
            Counter::ConntrackMiss => "conntrack_miss",
            Counter::FlowRehashed => "flow_rehashed",
            Counter::UdpFlowExpired => "udp_flow_expired",
            Counter::FloodActivations => "flood_activations",
            Counter::FloodInsertsSkipped => "flood_inserts_skipped",
            Counter::DropNoBackend => "drop_no_backend",
            Counter::DropFragment => "drop_fragment",
            Counter::DropIpOptions => "drop_ip_options",
            Counter::DropMalformed => "drop_malformed",
            Counter::DropEncapFailed => "drop_encap_failed",
            Counter::IcmpErrorForwarded => "icmp_error_forwarded",
            Counter::IcmpTooBigSent => "icmp_too_big_sent",
            Counter::PersistenceReturned => "persistence_returned",
            Counter::PersistenceOverBound => "persistence_over_bound",
            Counter::PersistenceSentElsewhere => "persistence_sent_elsewhere",
            Counter::PersistencePlaced => "persistence_placed",
        }
    }
}

/// Number of global counters.
pub const COUNTERS: usize = 20;

/// The single per-CPU entry of [`crate::maps::STATS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalStats {
    pub counters: [u64; COUNTERS],
}
const _: () = assert!(core::mem::size_of::<GlobalStats>() == 8 * COUNTERS);

impl Default for GlobalStats {
    fn default() -> Self {
        Self {
            counters: [0; COUNTERS],
        }
    }
}

impl GlobalStats {
    pub const fn get(&self, counter: Counter) -> u64 {
        self.counters[counter as usize]
    }
}

/// Per-CPU traffic counters of one VIP or one backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficStats {
    pub packets: u64,
    pub bytes: u64,
    /// Flows this VIP/backend took from the Maglev table (connection-table misses).
    pub new_flows: u64,
}
const _: () = assert!(core::mem::size_of::<TrafficStats>() == 24);

/// Admission control of one VIP and client tier (per CPU; see
/// [`crate::maps::ADMISSION_STATS`]). Counted only while the VIP's pool is saturated (in fair
/// admission, at all times).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierAdmission {
    /// New flows admitted (the tier is admitted and under its cap).
    pub admitted: u64,
    /// New flows not admitted: the tier is not admitted while saturated.
    pub shed_saturated: u64,
    /// New flows not admitted: the tier is admitted but its cap was spent on this CPU; in fair
    /// admission, the tenant is over its rate (its fair share, or its `max_new_flows_per_sec`).
    pub shed_over_cap: u64,
    /// Of those not admitted, sent to the VIP's overflow tier (the rest were refused).
    pub overflowed: u64,
    /// This CPU's cap window: its flow-clock tick, and the flows admitted in it.
    pub window_tick: u64,
    pub window_admitted: u64,
}
const _: () = assert!(core::mem::size_of::<TierAdmission>() == 48);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_counter_in_index_order() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{} is out of order", c.name());
        }
    }
}

/// Counters of the backend-side decapsulator (one per-CPU entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecapStats {
    /// IPIP / IPv6-in-IP packets stripped and passed on.
    pub ipip: u64,
    /// GUE packets stripped and passed on.
    pub gue: u64,
    /// Encapsulated packets for an address not in the accepted set, passed untouched.
    pub foreign: u64,
    /// Encapsulated packets whose inner header was cut off or whose headroom could not move.
    pub malformed: u64,
    /// Encapsulated packets for an accepted address from an outer source not allowed
    /// (`balancer decap --allow`), dropped.
    pub refused: u64,
}
const _: () = assert!(core::mem::size_of::<DecapStats>() == 40);

/// NAT counters (one per-CPU entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatStats {
    /// New source-NAT flows dropped: no free port found for their backend.
    pub no_port: u64,
    /// New source-NAT flows dropped: the source-NAT tables are full.
    pub table_full: u64,
    /// New source-NAT flows dropped: their client address holds its quota of ports
    /// ([`crate::maps::SnatSource::client_ports`]).
    pub client_quota: u64,
    /// TCP segments without SYN of no source-NAT flow: answered with a RST, no port taken.
    pub not_syn: u64,
}
const _: () = assert!(core::mem::size_of::<NatStats>() == 32);

/// Frames NAT forwarding sent to its other link with `XDP_REDIRECT` (one per-CPU entry; see
/// [`crate::maps::NatLinks`]). The global counters count these as none of pass, tx or drop.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatLinkStats {
    /// Client packets (and ICMP errors about replies) sent to the backends' link.
    pub to_backends: u64,
    /// Replies (and ICMP errors about client packets) sent to the clients' link.
    pub to_clients: u64,
}
const _: () = assert!(core::mem::size_of::<NatLinkStats>() == 16);
