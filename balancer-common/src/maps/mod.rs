//! Map names, capacities and the key/value layouts of every map the XDP program and the daemon
//! share. Each struct is `#[repr(C)]` with explicit padding fields (so no byte of a key is ever
//! uninitialised) and a compile-time size check.

use crate::addr::RawAddr;

mod decap;
mod nat;

pub use decap::*;
pub use nat::*;

/// The VIP index: array of maps with one inner array of [`VipSlot`]s, an open-addressing hash
/// table the daemon builds whole and swaps in (see [`crate::vip_index`]).
pub const VIPS: &str = "VIPS";
/// Per-VIP tables: array of maps indexed by `vip_id`; each inner array holds the VIP's Maglev
/// table (slot -> backend id) followed by its schedule (see [`crate::schedule`]).
pub const MAGLEV: &str = "MAGLEV";
/// Backends by id: array of [`Backend`].
pub const BACKENDS: &str = "BACKENDS";
/// Connection table: array of [`FlowBucket`]s, a set-associative flow cache (see
/// [`crate::flow_cache`]).
pub const FLOWS: &str = "FLOWS";
/// Global settings: array of one [`GlobalConfig`].
pub const CONFIG: &str = "CONFIG";
/// Per-CPU global counters: array of one [`crate::stats::GlobalStats`].
pub const STATS: &str = "STATS";
/// Per-CPU traffic per VIP: array of [`crate::stats::TrafficStats`] indexed by `vip_id`.
pub const VIP_STATS: &str = "VIP_STATS";
/// Per-CPU traffic per backend: array of [`crate::stats::TrafficStats`] indexed by backend id.
pub const BACKEND_STATS: &str = "BACKEND_STATS";
/// Active flows per backend id: array of `u64` used as signed counters, changed with atomic
/// adds when a flow is recorded, ends (client FIN/RST) or is evicted from the connection table.
pub const ACTIVE: &str = "ACTIVE";
/// Active flows per VIP id, like [`ACTIVE`] (the bounded-load reference).
pub const VIP_ACTIVE: &str = "VIP_ACTIVE";
/// Session persistence's spreading, per backend id: array of [`Home`], the clients the
/// backend homes now (each new client's placement an atomic add of one
/// [`crate::schedule::HOME_UNIT`], each tick a client returns a share of one,
/// [`crate::schedule::home_refresh`]; the daemon ages the counts each second over a quarter of
/// the persistence time, [`crate::schedule::HOME_FADE_PARTS`]) and its capacity (written by the daemon); zeroed when an id goes to a new
/// backend. What spreads a VIP's few heavy clients ([`crate::schedule::spread_over`]).
pub const HOMES: &str = "HOMES";
/// Scrapes due by new flows: array by VIP id of `u64` used as a signed counter, the new flows
/// left before the VIP's next scrape is due. The daemon sets it at each scrape of a VIP whose
/// telemetry is paced by its requests; the program counts it down (atomic adds) for each new
/// flow of the VIPs flagged [`VIP_F_SCRAPE_DUE`], and the flow that brings it to zero puts the
/// VIP's id in [`SCRAPE_EVENTS`].
pub const SCRAPE_DUE: &str = "SCRAPE_DUE";
/// Ring buffer of VIP ids (`u32`) whose new flows reached a scrape's ([`SCRAPE_DUE`]): the
/// daemon, woken by it, scrapes their backends at once (where it would otherwise read every
/// VIP's counter on a timer).
pub const SCRAPE_EVENTS: &str = "SCRAPE_EVENTS";
/// Bytes of [`SCRAPE_EVENTS`]: one page, 256 events (each record an 8-byte header and the
/// 4-byte id, rounded up to 8).
pub const SCRAPE_EVENTS_BYTES: u32 = 4096;
/// Values of a [`SCRAPE_DUE`] count after the new flow's own that put an event in
/// [`SCRAPE_EVENTS`]: 0 (the flow that reached the count) and the few after it, so two CPUs
/// that both count down before either reads the result (the program has no fetch-and-add)
/// still tell; the daemon takes several events for a VIP as one.
pub const SCRAPE_DUE_WINDOW: i64 = 4;
/// Per-CPU round-robin cursors per VIP id (`u32`).
pub const RR_CURSOR: &str = "RR_CURSOR";
/// Session persistence: LRU hash of [`AffinityKey`] -> [`AffinityValue`].
pub const AFFINITY: &str = "AFFINITY";
/// NAT forwarding: LRU hash of a reply's [`NatReplyKey`] -> [`NatReplyValue`] (the VIP to
/// write back as its source, the client's next hop), one per flow to a `nat` VIP.
pub const NAT_REPLIES: &str = "NAT_REPLIES";
/// Source NAT: array by VIP id of [`SnatSource`] (family 0: the VIP does not translate
/// sources).
pub const SNAT_SOURCES: &str = "SNAT_SOURCES";
/// Source affinity by prefix: array by VIP id of [`SourcePrefix`], read for new flows of the
/// VIPs flagged [`VIP_F_SOURCE_PREFIX`] (source hash and session persistence key on the
/// client's prefix instead of its address).
pub const SOURCE_PREFIXES: &str = "SOURCE_PREFIXES";
/// Admission control: array by VIP id of [`Admission`], read for the new flows of the VIPs
/// flagged [`VIP_F_ADMISSION`] (the daemon publishes whether the VIP's pool is saturated).
pub const ADMISSION: &str = "ADMISSION";
/// Admission counters, and each CPU's window for the per-tier caps: per-CPU array by
/// `vip_id * ADMISSION_TIERS + tier` of [`crate::stats::TierAdmission`].
pub const ADMISSION_STATS: &str = "ADMISSION_STATS";
/// Entries per VIP in [`ADMISSION_STATS`]: clients of no tier (0), then tiers 1..=7.
pub const ADMISSION_TIERS: u32 = MAX_TIERS + 1;
/// Fair admission: array by VIP id of [`FairAdmission`], read for the new flows of the VIPs
/// flagged [`VIP_F_FAIR`] while their admission entry is consulted.
pub const FAIR: &str = "FAIR";
/// Fair admission's pace: array by `vip_id * ADMISSION_TIERS + tier` of `u64`, shared by all
/// CPUs: each tenant's theoretical arrival time (GCRA, in `bpf_ktime_get_coarse_ns`
/// nanoseconds), moved on by [`FairAdmission::intervals_ns`] for each flow admitted.
pub const FAIR_TAT: &str = "FAIR_TAT";
/// Source NAT: hash of a client's flow ([`SnatFlowKey`]) -> [`SnatFlowValue`] (its backend,
/// source address and port). Not LRU: an entry leaves only when the daemon expires it, with
/// its [`SNAT_PORTS`] entry, so a port is never given to a second live flow.
pub const SNAT_FLOWS: &str = "SNAT_FLOWS";
/// Source NAT: hash of a reply's [`NatReplyKey`] (backend to the NAT source address and port)
/// -> [`SnatPortValue`] (the client's flow). Inserted only if absent: the port allocator.
pub const SNAT_PORTS: &str = "SNAT_PORTS";
/// Source NAT: LRU hash of a client address ([`SnatClientKey`]) -> the ports (`u64`) its
/// flows hold. The program adds one for each port a flow takes and refuses a new flow whose
/// client holds [`SnatSource::client_ports`]; the daemon writes the true counts after each
/// sweep (so an entry the LRU evicted, or a port given back, is counted again within a second).
pub const SNAT_CLIENTS: &str = "SNAT_CLIENTS";
/// Client addresses [`SNAT_CLIENTS`] counts at once (an LRU map is allocated whole: about
/// 5 MB). Beyond them the least recent are forgotten until the daemon's next sweep.
pub const MAX_SNAT_CLIENTS: u32 = 1 << 16;
/// NAT counters: per-CPU array of one [`crate::stats::NatStats`].
pub const NAT_STATS: &str = "NAT_STATS";
/// The two links of NAT forwarding when the backends are on another interface than the
/// clients: array of one [`NatLinks`] (all zero: one link, frames leave where they came in).
pub const NAT_LINKS: &str = "NAT_LINKS";
/// Frames NAT sent to its other link: per-CPU array of one [`crate::stats::NatLinkStats`].
pub const NAT_LINK_STATS: &str = "NAT_LINK_STATS";
/// Priority tiers of IPv4 clients: LPM trie of source prefixes (`[u8; 4]` data) -> tier (u8).
pub const TIER_V4: &str = "TIER_V4";
/// Priority tiers of IPv6 clients: LPM trie of source prefixes (`[u8; 16]` data) -> tier (u8).
pub const TIER_V6: &str = "TIER_V6";
/// Priority tier by DSCP: array of 64 tiers (u8; 0 = none). Prefixes take precedence.
pub const TIER_DSCP: &str = "TIER_DSCP";
/// Most priority tiers (ids 1..=MAX_TIERS; 0 is the shared pool).
pub const MAX_TIERS: u32 = 7;
/// Most client prefixes over all tiers, per family.
pub const MAX_TIER_PREFIXES: u32 = 4096;

/// Most VIPs one balancer serves (outer Maglev array, per-VIP counters).
pub const MAX_VIPS: u32 = 1024;
/// Most backends over all VIPs (backend array, per-backend counters). Backend ids fit 16 bits
/// (they are stored in 16 bits of a connection-table entry).
pub const MAX_BACKENDS: u32 = 16384;
/// Largest Maglev table.
pub const MAX_TABLE_SIZE: u32 = 655_373;
/// Longest weighted-round-robin sequence (weights are scaled down to fit).
pub const MAX_SEQUENCE: u32 = 1 << 16;
/// Largest per-VIP table: the shared pool's Maglev slots and schedule (header, backend list,
/// sequence), then one block per priority tier with its own (see [`crate::schedule`]). The
/// inner-map template is declared with this size and `BPF_F_INNER_MAP`, so each VIP's table
/// has its own size.
pub const MAX_TABLE_ENTRIES: u32 =
    (MAX_TIERS + 1) * (1 + MAX_TABLE_SIZE + crate::schedule::HEADER + MAX_BACKENDS + MAX_SEQUENCE);
/// Default capacity of the session-persistence map (clients x VIPs).
pub const DEFAULT_AFFINITY_ENTRIES: u32 = 1 << 17;
/// Default Maglev table size (prime), as in the Maglev paper.
pub const DEFAULT_TABLE_SIZE: u32 = 65_537;
/// Slots of the VIP index (a power of two; VIPs and address markers fill at most 3% of it).
pub const VIP_INDEX_SLOTS: u32 = 1 << 16;
/// A VIP sits at most this many slots after its home slot in the index.
pub const VIP_INDEX_PROBES: u32 = 4;
/// Ways per connection-table bucket.
pub const FLOW_WAYS: usize = 4;
/// Connection-table buckets compiled into the object; the daemon sets the real number (a power
/// of two) from its config before loading.
pub const DEFAULT_FLOW_BUCKETS: u32 = 1 << 18;

/// Slot value of a Maglev table with no usable backend; the data plane drops such packets.
pub const NO_BACKEND: u32 = u32::MAX;

/// `BPF_F_INNER_MAP`: inner maps of a map-in-map may differ in `max_entries`.
pub const BPF_F_INNER_MAP: u32 = 1 << 12;
/// `BPF_F_MMAPABLE`: an array whose values user space can map and write directly.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
/// Flags of every Maglev table (inner map): sizes may differ per VIP, and the daemon fills a
/// new table through a memory mapping instead of one syscall per slot.
pub const MAGLEV_TABLE_FLAGS: u32 = BPF_F_INNER_MAP | BPF_F_MMAPABLE;
/// Flags of the VIP index (inner map): fixed size, so the kernel inlines lookups into it.
pub const VIP_INDEX_FLAGS: u32 = BPF_F_MMAPABLE;

/// Key of a VIP: address, port, protocol. An address marker (port 0, protocol 0) tells that
/// an address belongs to some VIP, for fragments and ICMP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VipKey {
    pub addr: RawAddr,
    /// Destination port in network byte order.
    pub port: u16,
    /// IP protocol number (6 TCP, 17 UDP; 0 for an address marker).
    pub proto: u8,
    /// [`crate::addr::FAMILY_V4`] or [`crate::addr::FAMILY_V6`]; 0 marks an empty slot.
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
    /// Rewrite the destination address to the backend's (NAT); the backend's replies come back
    /// through the balancer (its gateway), which writes the VIP back as their source.
    Nat = 3,
}

impl ForwardMode {
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::L2Dsr),
            1 => Some(Self::Ipip),
            2 => Some(Self::Gue),
            3 => Some(Self::Nat),
            _ => None,
        }
    }
}

/// How a VIP picks the backend of a new flow (established flows keep theirs).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Scheduler {
    /// Consistent hash of the client address and port over the weighted Maglev table.
    #[default]
    Maglev = 0,
    /// Consistent hash of the client address alone: a client's connections share a backend.
    SourceHash = 1,
    /// Each backend in turn (a cursor per CPU).
    RoundRobin = 2,
    /// Backends in turn in proportion to their weights (smooth weighted round robin).
    WeightedRoundRobin = 3,
    /// A backend picked uniformly at random.
    Random = 4,
    /// A backend picked at random in proportion to its weight.
    WeightedRandom = 5,
    /// The backend with the fewest active flows per unit of weight.
    LeastConn = 6,
    /// Two backends picked at random by weight; the one with fewer active flows per weight.
    PowerOfTwo = 7,
}

impl Scheduler {
    pub const ALL: [Scheduler; 8] = [
        Scheduler::Maglev,
        Scheduler::SourceHash,
        Scheduler::RoundRobin,
        Scheduler::WeightedRoundRobin,
        Scheduler::Random,
        Scheduler::WeightedRandom,
        Scheduler::LeastConn,
        Scheduler::PowerOfTwo,
    ];

    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Maglev),
            1 => Some(Self::SourceHash),
            2 => Some(Self::RoundRobin),
            3 => Some(Self::WeightedRoundRobin),
            4 => Some(Self::Random),
            5 => Some(Self::WeightedRandom),
            6 => Some(Self::LeastConn),
            7 => Some(Self::PowerOfTwo),
            _ => None,
        }
    }

    /// The name used in configs and the CLI.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Maglev => "maglev",
            Self::SourceHash => "source-hash",
            Self::RoundRobin => "round-robin",
            Self::WeightedRoundRobin => "weighted-round-robin",
            Self::Random => "random",
            Self::WeightedRandom => "weighted-random",
            Self::LeastConn => "least-conn",
            Self::PowerOfTwo => "power-of-two",
        }
    }

    /// Whether it walks the weighted round-robin sequence (built only for it).
    pub const fn needs_sequence(self) -> bool {
        matches!(self, Self::WeightedRoundRobin)
    }
}

/// What the data plane knows of a VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipMeta {
    /// Index into [`MAGLEV`] and [`VIP_STATS`].
    pub vip_id: u32,
    /// Number of slots of this VIP's Maglev table (a prime); its schedule follows them.
    pub table_size: u32,
    /// A [`ForwardMode`] as `u8`.
    pub mode: u8,
    /// `VIP_F_*` bits.
    pub flags: u8,
    /// Outer UDP destination port for [`ForwardMode::Gue`], network byte order.
    pub gue_port: u16,
    /// A [`Scheduler`] as `u8`.
    pub scheduler: u8,
    /// Bounded load: a backend holding more than `(100 + load_bound)`% of its weighted share
    /// of the VIP's active flows takes no new clients by hash or persistence. 0 = no bound.
    pub load_bound: u8,
    /// Session persistence: a client's new flows go to its previous backend while it was seen
    /// within this many flow-clock ticks. 0 = off.
    pub persist_ticks: u16,
}
const _: () = assert!(core::mem::size_of::<VipMeta>() == 16);

impl VipMeta {
    /// Whether the data plane counts the VIP's active flows (atomic adds on every new, ended
    /// and evicted flow): only for the schedulers that read them, for bounded load, and for the
    /// VIPs whose weight policy reads them ([`VIP_F_COUNT`]).
    pub const fn counts_active(&self) -> bool {
        matches!(
            Scheduler::from_u8(self.scheduler),
            Some(Scheduler::LeastConn | Scheduler::PowerOfTwo)
        ) || self.load_bound != 0
            || self.flags & VIP_F_COUNT != 0
    }
}

/// One slot of the VIP index.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipSlot {
    pub key: VipKey,
    /// The global NAT bits ([`GlobalConfig::nat`]), the same in every slot, empty ones
    /// included: a lookup that misses reads them from the slot it ended on, so the path of a
    /// packet for no VIP needs no other lookup to know whether it may be a NAT flow's reply.
    /// (Was padding, always 0: an index of an earlier build reads as "no NAT" until the daemon
    /// writes its settings.)
    pub nat: u32,
    pub meta: VipMeta,
}
const _: () = assert!(core::mem::size_of::<VipSlot>() == 40);

/// The VIP has backends dedicated to priority tiers: new flows look up the client's tier.
pub const VIP_F_TIERS: u8 = 1;
/// [`VipMeta::flags`]: count the VIP's active flows for its weight policy.
pub const VIP_F_COUNT: u8 = 2;
/// [`VipMeta::flags`]: source hash and session persistence key on the client's source prefix
/// (lengths in [`SOURCE_PREFIXES`]), so every client of one tenant's network lands together.
pub const VIP_F_SOURCE_PREFIX: u8 = 4;
/// [`VipMeta::flags`]: new flows pass admission control first (the VIP's [`ADMISSION`] entry).
pub const VIP_F_ADMISSION: u8 = 8;
/// [`VipMeta::flags`]: new flows count down the VIP's [`SCRAPE_DUE`] entry (its telemetry is
/// paced by its requests).
pub const VIP_F_SCRAPE_DUE: u8 = 16;
/// [`VipMeta::flags`]: admission control is fair admission ([`FAIR`] holds the tenants'
/// rates).
pub const VIP_F_FAIR: u8 = 32;

/// A backend slot is in use and may receive packets.
pub const BACKEND_F_ACTIVE: u8 = 1;
/// Session persistence: clients returning to this backend are expected to be served sooner
/// elsewhere this round (the daemon's policy weighs their cached prompt against the backend's
/// queue): their new flows go where the VIP's scheduler puts them, and they keep it as their
/// backend, as when it is over the load bound.
pub const BACKEND_F_RETURNING_ELSEWHERE: u8 = 2;

/// [`Backend::bound_share`] of a backend with all of its pool's weight.
pub const BOUND_SHARE_SCALE: u32 = 1 << 15;

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
    pub generation: u16,
    /// What bounded load judges its share of the VIP's active flows against: its share of its
    /// pool's weights averaged over the VIP's mean flow duration, in units of
    /// 1/[`BOUND_SHARE_SCALE`] (a flow placed under the weights of a moment stays for its
    /// whole life, so its backend's share of flows follows the weights' average, not their
    /// latest value). Read as at least 1.
    pub bound_share: u16,
    /// The VIP it serves (a chosen backend must belong to the flow's VIP).
    pub vip_id: u16,
    /// Its weight in the VIP's table (0: takes no new flows: drained, weight 0, unhealthy).
    pub weight: u16,
}
const _: () = assert!(core::mem::size_of::<Backend>() == 32);

/// Value of [`HOMES`]: the clients a backend homes now and its capacity.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Home {
    /// Clients it homes now (placed or returning within about a quarter of the VIP's
    /// persistence time), in [`crate::schedule::HOME_UNIT`]s (changed by atomic adds and
    /// updates only).
    pub homed: u64,
    /// What it can serve, in units of 1/[`HOME_CAPACITY_SCALE`] of its VIP's mean backend:
    /// its configured weight x its KV-cache capacity against the pool's mean (the configured
    /// weight alone where backends report none). 0: not known yet (none written): the
    /// scheduler's pick stands.
    pub capacity: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<Home>() == 16);

/// [`Home::capacity`] of a backend of its VIP's mean capacity and configured weight 1.
pub const HOME_CAPACITY_SCALE: u32 = 1000;

/// Key of the session-persistence map: a client of a VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub src: RawAddr,
    pub vip_id: u32,
}
const _: () = assert!(core::mem::size_of::<AffinityKey>() == 20);

/// The source prefix lengths a VIP's affinity keys on (its entry of [`SOURCE_PREFIXES`]): the
/// first `v4` bits of an IPv4 client's address, the first `v6` of an IPv6 one's.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourcePrefix {
    pub v4: u8,
    pub v6: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<SourcePrefix>() == 4);

impl SourcePrefix {
    /// Whole addresses: no prefix.
    pub const WHOLE: SourcePrefix = SourcePrefix {
        v4: 32,
        v6: 128,
        _pad: [0; 2],
    };

    /// Whether it keys on less than whole addresses.
    pub const fn is_prefix(&self) -> bool {
        self.v4 < 32 || self.v6 < 128
    }
}

impl Default for SourcePrefix {
    fn default() -> Self {
        SourcePrefix::WHOLE
    }
}

/// [`Admission::refuse`]: a refused TCP SYN is answered with a RST (a UDP packet is dropped).
pub const REFUSE_RESET: u8 = 0;
/// [`Admission::refuse`]: a refused new flow's packet is dropped.
pub const REFUSE_DROP: u8 = 1;

/// A VIP's admission control (its entry of [`ADMISSION`]): while its pool is saturated, a new
/// flow (TCP SYN, or a UDP packet of no tracked flow) is admitted only if its client's tier is
/// admitted and under that tier's cap; otherwise it goes to the overflow tier's backends when
/// the VIP has some, else it is refused. Established flows never reach this.
///
/// A VIP with fair admission ([`VIP_F_FAIR`]) judges its tenants by [`FairAdmission`]
/// instead of `admit` and `caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// [`ADMISSION_SATURATED`] while the daemon holds every eligible backend of the VIP's
    /// shared pool saturated, with [`ADMISSION_TENANTS`] in fair admission; 0: every new flow
    /// is admitted without a look.
    pub saturated: u8,
    /// [`REFUSE_RESET`] or [`REFUSE_DROP`].
    pub refuse: u8,
    /// Tiers admitted while saturated (bit `t`; bit 0: clients of no tier).
    pub admit: u8,
    /// The tier whose backends take the flows not admitted (0: none, they are refused).
    pub overflow_tier: u8,
    /// Per tier (index as `admit`'s bits): new flows admitted while saturated per flow-clock
    /// tick (about a second) on each CPU; 0 = no cap.
    pub caps: [u32; ADMISSION_TIERS as usize],
}
const _: () = assert!(core::mem::size_of::<Admission>() == 36);

/// [`Admission::saturated`]: the daemon holds the VIP's shared pool saturated.
pub const ADMISSION_SATURATED: u8 = 1;
/// [`Admission::saturated`], fair admission only: every new flow is judged by its tenant,
/// also while the pool is open (counted for the tenant's asked rate, held to its own limit).
pub const ADMISSION_TENANTS: u8 = 2;

/// A VIP's fair admission (its entry of [`FAIR`], read for the VIPs flagged [`VIP_F_FAIR`]):
/// every tier (tenant) is admitted at most at its rate, one new flow per `intervals_ns[tier]`
/// on average over all CPUs with bursts of up to `burst_ns` ahead of that pace (a GCRA on
/// [`FAIR_TAT`]). The daemon publishes each tenant's fair share of the pool while it is
/// saturated, and its `max_new_flows_per_sec` at all times.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FairAdmission {
    /// Per tier, nanoseconds per new flow at its rate (0: no limit).
    pub intervals_ns: [u64; ADMISSION_TIERS as usize],
    /// How far ahead of its pace a tenant may admit, in nanoseconds.
    pub burst_ns: u64,
}
const _: () = assert!(core::mem::size_of::<FairAdmission>() == 72);

/// Value of the session-persistence map: the client's backend and when it was last chosen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    pub backend_id: u16,
    /// Low 16 bits of the backend's generation.
    pub generation: u16,
    /// Flow-clock tick of the client's last new flow.
    pub last_seen: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<AffinityValue>() == 8);

/// One client flow to one VIP: what the connection table is keyed by (through
/// [`crate::flow_cache::flow_tag`]). The VIP's address, port and protocol are implied by
/// `vip_id`.
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

/// One way of a connection-table bucket: the flow's tag (0 = empty) and its packed value
/// (see [`crate::flow_cache::FlowValue`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowEntry {
    pub tag: u64,
    pub value: u64,
}
const _: () = assert!(core::mem::size_of::<FlowEntry>() == 16);

/// A connection-table bucket: one 64-byte cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowBucket {
    pub ways: [FlowEntry; FLOW_WAYS],
}
const _: () = assert!(core::mem::size_of::<FlowBucket>() == 64);

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
    /// Seed of the connection table's hash (per host; keeps crafted flows from piling into
    /// one bucket).
    pub flow_seed: u64,
    /// Connection-table buckets - 1 (their number is a power of two).
    pub flow_bucket_mask: u32,
    /// A UDP flow idle longer than this many [`crate::flow_cache::TICK_NS`] ticks is chosen
    /// afresh. 0 = never expires.
    pub udp_idle_ticks: u32,
    /// New flows per second per CPU above which the connection table stops taking entries and
    /// new flows use the consistent hash alone (flood mode). 0 = no limit.
    pub flood_threshold: u32,
    /// [`NAT_GATEWAY`] and [`NAT_SNAT`] bits: while a VIP forwards by NAT, packets not for a
    /// VIP are looked up in [`NAT_REPLIES`] and/or [`SNAT_PORTS`] (a reply from a backend gets
    /// the VIP back as its source). The program reads the copy in every VIP-index slot
    /// ([`VipSlot::nat`]), which the daemon keeps equal to this one. (Was padding, always 0:
    /// pinned maps of earlier builds read as "no NAT".)
    pub nat: u32,
}
const _: () = assert!(core::mem::size_of::<GlobalConfig>() == 56);

/// Identifies the layout of the pinned maps: a daemon adopts pinned maps only when their
/// layout is its own. The top byte is bumped by hand when a meaning changes without a size
/// (9: fair admission's bit in `Admission::saturated` and `VIP_F_FAIR`, which an older program
/// would read as a saturated pool admitting no tier).
pub const LAYOUT: u64 = (9 << 56)
    | (core::mem::size_of::<VipSlot>() as u64) << 40
    | (core::mem::size_of::<Backend>() as u64) << 32
    | (core::mem::size_of::<FlowBucket>() as u64) << 24
    | (core::mem::size_of::<GlobalConfig>() as u64) << 16
    | (crate::stats::COUNTERS as u64) << 8
    | core::mem::size_of::<crate::stats::TrafficStats>() as u64;

/// The maps pinned under the daemon's pin directory (the program, its XDP link and these).
pub const PINNED_MAPS: [&str; 31] = [
    VIPS,
    MAGLEV,
    BACKENDS,
    FLOWS,
    CONFIG,
    STATS,
    VIP_STATS,
    BACKEND_STATS,
    ACTIVE,
    VIP_ACTIVE,
    HOMES,
    SCRAPE_DUE,
    SCRAPE_EVENTS,
    RR_CURSOR,
    AFFINITY,
    NAT_REPLIES,
    SNAT_SOURCES,
    SOURCE_PREFIXES,
    ADMISSION,
    ADMISSION_STATS,
    FAIR,
    FAIR_TAT,
    SNAT_FLOWS,
    SNAT_PORTS,
    SNAT_CLIENTS,
    NAT_STATS,
    NAT_LINKS,
    NAT_LINK_STATS,
    TIER_V4,
    TIER_V6,
    TIER_DSCP,
];
