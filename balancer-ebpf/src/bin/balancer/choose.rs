//! Choosing a packet's backend: the VIP index, then the connection table (a set-associative
//! flow cache, see `balancer_common::flow_cache`), the VIP's scheduler for new flows (with
//! session persistence and bounded load where configured), flood mode to keep a burst of new
//! flows from thrashing the connection table, and the active-flow counts the connection-aware
//! schedulers read.

use aya_ebpf::{
    btf_maps::Array,
    helpers::generated::{bpf_get_prandom_u32, bpf_ktime_get_coarse_ns},
    maps::lpm_trie::Key as LpmKey,
    programs::XdpContext,
};
use aya_log_ebpf::warn;
use balancer_common::{
    addr::{FAMILY_V4, RawAddr},
    flow_cache::{
        FlowValue, TICK_SHIFT, bucket_of, flow_tag, is_referenced, referenced, unreferenced, victim,
    },
    flow_hash::{flow_hash, slot},
    maps::{
        AffinityKey, AffinityValue, BACKEND_F_ACTIVE, Backend, FLOW_WAYS, FlowBucket, FlowEntry,
        FlowKey, GlobalConfig, MAGLEV_TABLE_FLAGS, MAX_BACKENDS, MAX_TABLE_ENTRIES, MAX_TIERS,
        NO_BACKEND, Scheduler, VIP_F_TIERS, VIP_INDEX_PROBES, VipKey, VipMeta,
    },
    schedule::{HEADER, SPILL, TIER_OFFSETS, less_loaded, over_bound},
    stats::{Counter, GlobalStats},
    vip_index::{probe_slot, same_key, vip_hash},
};

use crate::maps::{
    ACTIVE, AFFINITY, BACKENDS, FLOOD, FLOWS, MAGLEV, RR_CURSOR, TIER_DSCP, TIER_V4, TIER_V6,
    VIP_ACTIVE, VIPS,
};

/// A VIP's table: Maglev slots, then its schedule.
type Table = Array<u32, { MAX_TABLE_ENTRIES as usize }, { MAGLEV_TABLE_FLAGS as usize }>;

/// Most backends least-conn compares per new flow (from a rotating start, so larger pools are
/// sampled fairly).
const LEAST_CONN_SCAN: u32 = 256;
/// Most table slots a bounded-load hash probes past a full backend.
const BOUNDED_PROBES: u32 = 8;

/// The VIP (or address marker) with this key, from the VIP index.
#[inline(always)]
pub fn find_vip(key: &VipKey) -> Option<&'static VipMeta> {
    let index = VIPS.get(0)?;
    let hash = vip_hash(key);
    for i in 0..VIP_INDEX_PROBES {
        let slot = index.get(probe_slot(hash, i))?;
        if slot.key.family == 0 {
            return None;
        }
        if same_key(&slot.key, key) {
            return Some(&slot.meta);
        }
    }
    None
}

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

/// The chosen backend.
pub struct Choice {
    pub id: u32,
    pub backend: &'static Backend,
    /// Chosen from the Maglev table rather than the connection table.
    pub new_flow: bool,
}

#[inline(always)]
fn usable(backend: &Backend) -> bool {
    backend.flags & BACKEND_F_ACTIVE != 0
}

/// The flow clock in ticks of 2^30 ns (a coarse clock: cheap, ~jiffy precision).
#[inline(always)]
fn now_ticks() -> u64 {
    // SAFETY: helper without arguments.
    (unsafe { bpf_ktime_get_coarse_ns() }) >> TICK_SHIFT
}

/// A flow's place in the connection table.
pub struct Slot {
    pub tag: u64,
    pub bucket: &'static mut FlowBucket,
}

/// The bucket a flow belongs in.
#[inline(always)]
pub fn flow_slot(key: &FlowKey, cfg: &GlobalConfig) -> Option<Slot> {
    let tag = flow_tag(key, cfg.flow_seed);
    let bucket = FLOWS.get_ptr_mut(bucket_of(tag, cfg.flow_bucket_mask))?;
    // SAFETY: a valid array element; ways are read and written with single 8-byte accesses.
    Some(Slot {
        tag,
        bucket: unsafe { &mut *bucket },
    })
}

/// What the connection table says about a flow.
pub enum Tracked {
    /// Not in the table.
    Miss,
    /// In the table, but its backend has left (removed, unhealthy, or the slot reused).
    Gone,
    /// In the table with a usable backend: the way, its value, and the backend.
    Live(usize, FlowValue, &'static Backend),
}

/// Looks a flow up in its bucket.
#[inline(always)]
pub fn tracked(slot: &Slot) -> Tracked {
    let mut way = 0;
    while way < FLOW_WAYS {
        let entry = &slot.bucket.ways[way];
        if entry.tag == slot.tag {
            let Some(value) = FlowValue::unpack(entry.value, slot.tag) else {
                return Tracked::Miss;
            };
            return match BACKENDS.get(u32::from(value.backend_id)) {
                Some(backend)
                    if usable(backend) && backend.generation as u16 == value.generation =>
                {
                    Tracked::Live(way, value, backend)
                }
                _ => Tracked::Gone,
            };
        }
        way += 1;
    }
    Tracked::Miss
}

/// Pins a flow to a backend: takes a way (see `flow_cache::victim`) and writes the value before
/// the tag, so a reader that sees the tag sees its value. Returns the way's previous tag and
/// value (the flow it evicts, if any).
#[inline(always)]
fn insert(slot: &mut Slot, value: FlowValue) -> (u64, u64) {
    let (way, passed) = victim(&slot.bucket.ways, slot.tag);
    // Second chance: the referenced ways passed over lose their bit.
    let start = way + FLOW_WAYS - passed;
    let mut n = 0;
    while n < passed && n < FLOW_WAYS {
        let w = (start + n) % FLOW_WAYS;
        slot.bucket.ways[w].value = unreferenced(slot.bucket.ways[w].value);
        n += 1;
    }
    let entry = &mut slot.bucket.ways[way % FLOW_WAYS];
    let evicted = (entry.tag, entry.value);
    entry.value = value.pack(slot.tag);
    entry.tag = slot.tag;
    evicted
}

/// The backend for `flow` to `vip`, or `None` if the VIP has no usable backend.
#[inline(always)]
pub fn choose(
    ctx: &XdpContext,
    vip: &VipMeta,
    flow: &Flow<'_>,
    cfg: &GlobalConfig,
    stats: &mut GlobalStats,
) -> Option<Choice> {
    let key = FlowKey {
        src: *flow.src,
        vip_id: vip.vip_id,
        sport: flow.sport,
        _pad: 0,
    };
    let mut slot = flow_slot(&key, cfg)?;
    let udp = flow.kind == PacketKind::Udp;
    let found = if flow.kind == PacketKind::TcpSyn {
        Tracked::Miss
    } else {
        tracked(&slot)
    };
    let mut now = 0;
    match found {
        Tracked::Live(way, value, backend) => {
            let entry = &mut slot.bucket.ways[way % FLOW_WAYS];
            let hit = Choice {
                id: u32::from(value.backend_id),
                backend,
                new_flow: false,
            };
            if flow.kind == PacketKind::TcpEnd && !value.closed {
                core::hint::cold_path();
                end_flow(entry, slot.tag);
                count(stats, Counter::ConntrackHit);
                return Some(hit);
            }
            if !udp || cfg.udp_idle_ticks == 0 {
                if !is_referenced(entry.value) {
                    entry.value = referenced(entry.value);
                }
                count(stats, Counter::ConntrackHit);
                return Some(hit);
            }
            now = now_ticks();
            let idle = (now as u16).wrapping_sub(value.last_seen);
            if u32::from(idle) <= cfg.udp_idle_ticks {
                if idle != 0 || !value.referenced {
                    entry.value = FlowValue {
                        last_seen: now as u16,
                        referenced: true,
                        ..value
                    }
                    .pack(slot.tag);
                }
                count(stats, Counter::ConntrackHit);
                return Some(hit);
            }
            count(stats, Counter::UdpFlowExpired);
        }
        Tracked::Gone => count(stats, Counter::FlowRehashed),
        Tracked::Miss => count(stats, Counter::ConntrackMiss),
    }
    // A new flow: rarer than an established flow's packets; keep the code above tight.
    core::hint::cold_path();

    let (id, backend) = new_flow_backend(vip, flow)?;
    if flood_allows_insert(ctx, cfg, stats) {
        if udp && now == 0 {
            now = now_ticks();
        }
        let closed = flow.kind == PacketKind::TcpEnd;
        let counted = !closed && vip.counts_active();
        let (old_tag, old_value) = insert(
            &mut slot,
            FlowValue {
                backend_id: id as u16,
                generation: backend.generation as u16,
                last_seen: now as u16,
                referenced: false,
                closed,
                counted,
            },
        );
        // The evicted flow may be any VIP's: its value says whether it was counted.
        forget_evicted(old_tag, old_value);
        if counted {
            add_active(id, vip.vip_id as u16, 1);
        }
    }
    Some(Choice {
        id,
        backend,
        new_flow: true,
    })
}

/// The client ends a connection (FIN or RST): it stops counting as active (in the daemon's
/// counts, and in the data plane's where its VIP keeps them), and keeps its backend for the
/// rest of the teardown. Out of line, off the established-flow path.
#[inline(never)]
fn end_flow(entry: &mut FlowEntry, tag: u64) {
    let Some(value) = FlowValue::unpack(entry.value, tag) else {
        return;
    };
    entry.value = FlowValue {
        closed: true,
        referenced: true,
        ..value
    }
    .pack(tag);
    let id = u32::from(value.backend_id);
    if value.counted
        && let Some(b) = BACKENDS.get(id)
    {
        add_active(id, b.vip_id, u64::MAX);
    }
}

/// Adds `delta` (`u64::MAX` for -1) to a backend's and its VIP's active-flow counts.
#[inline(always)]
fn add_active(backend_id: u32, vip_id: u16, delta: u64) {
    add_counter(&ACTIVE, backend_id, delta);
    add_counter(&VIP_ACTIVE, u32::from(vip_id), delta);
}

#[inline(always)]
fn add_counter<const N: usize, const F: usize>(map: &Array<u64, N, F>, index: u32, delta: u64) {
    if let Some(p) = map.get_ptr_mut(index) {
        atomic_add(p, delta);
    }
}

/// Adds to a `u64` shared by all CPUs.
#[inline(always)]
fn atomic_add(p: *mut u64, delta: u64) {
    // SAFETY: `p` points at an aligned u64 in a map value, changed atomically only.
    #[cfg(target_arch = "bpf")]
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            p, delta,
        );
    }
    #[cfg(not(target_arch = "bpf"))]
    unsafe {
        core::sync::atomic::AtomicU64::from_ptr(p)
            .fetch_add(delta, core::sync::atomic::Ordering::Relaxed);
    }
}

/// An active-flow count (the counters are signed; a transient negative reads as 0).
#[inline(always)]
fn active_of<const N: usize, const F: usize>(map: &Array<u64, N, F>, index: u32) -> u64 {
    match map.get_ptr(index) {
        // SAFETY: an aligned u64 in a map value.
        Some(p) => {
            // A single aligned 8-byte load (atomic loads do not lower for this CPU version).
            let v = unsafe { core::ptr::read_volatile(p) } as i64;
            if v < 0 { 0 } else { v as u64 }
        }
        None => 0,
    }
}

/// A flow pushed out of the connection table by an insert no longer counts as active (unless
/// it had ended, or its backend's slot has since gone to another backend).
#[inline(always)]
fn forget_evicted(tag: u64, value: u64) {
    if tag == 0 {
        return;
    }
    let Some(v) = FlowValue::unpack(value, tag) else {
        return;
    };
    if !v.counted || v.closed {
        return;
    }
    let id = u32::from(v.backend_id);
    if let Some(b) = BACKENDS.get(id)
        && b.generation as u16 == v.generation
    {
        add_active(id, b.vip_id, u64::MAX);
    }
}

/// `x` mapped onto `0..n` (multiply-shift: no division, and no division-by-zero path the
/// verifier would reject; `n == 0` gives 0).
#[inline(always)]
fn below(x: u32, n: u32) -> u32 {
    ((u64::from(x) * u64::from(n)) >> 32) as u32
}

#[inline(always)]
fn random() -> u32 {
    // SAFETY: helper without arguments.
    unsafe { bpf_get_prandom_u32() }
}

/// Whether `id` can be a backend id (`NO_BACKEND` and anything else out of range cannot).
///
/// A range check, never `id == NO_BACKEND`: for the BPF CPU version these objects are built
/// for (no 32-bit jumps), LLVM compares a zero-extended 32-bit id with `u32::MAX` as a 64-bit
/// compare against a sign-extended -1, which is never equal (measured: a scheduler's "none"
/// was taken for an id and the packet dropped).
#[inline(always)]
fn valid_id(id: u32) -> bool {
    id < MAX_BACKENDS
}

/// A scheduler's pick: a backend id and its entry, or none (`backend` null). A plain struct
/// rather than `Option<(u32, &Backend)>`, whose `None` leaves the id undefined: carried
/// through branches and across helper calls, LLVM may then spill an uninitialised register,
/// which the verifier rejects.
#[derive(Clone, Copy)]
struct Pick {
    id: u32,
    backend: *const Backend,
}

impl Pick {
    const NONE: Pick = Pick {
        id: NO_BACKEND,
        backend: core::ptr::null(),
    };

    #[inline(always)]
    fn is_some(&self) -> bool {
        !self.backend.is_null()
    }

    #[inline(always)]
    fn backend(&self) -> &'static Backend {
        // SAFETY: only called when `is_some`; a map value, valid for the program's run.
        unsafe { &*self.backend }
    }
}

/// The backend with this id if the VIP's table or schedule may name it: active and serving
/// this VIP (the table and the schedule only list backends with weight).
#[inline(always)]
fn candidate(vip: &Pool, id: u32) -> Pick {
    if !valid_id(id) {
        return Pick::NONE;
    }
    match BACKENDS.get(id) {
        Some(b) if usable(b) && u32::from(b.vip_id) == vip.vip_id => Pick { id, backend: b },
        _ => Pick::NONE,
    }
}

/// The backend for a new flow: from the client's priority tier's own backends when the VIP
/// has some (spilling to the shared pool as the tier allows), else from the shared pool: the
/// default scheduler (Maglev, no persistence, no bounded load) inline, the others from
/// [`balancer_pick`].
#[inline(always)]
fn new_flow_backend(vip: &VipMeta, flow: &Flow<'_>) -> Option<(u32, &'static Backend)> {
    if vip.flags & VIP_F_TIERS != 0 {
        core::hint::cold_path();
        let src = flow.src;
        // The tier's block (if the client has a tier and the VIP backends for it), then a
        // pick there: called one after the other, not nested, to keep the call chain's stack
        // within the kernel's limit.
        let block = balancer_tier(
            pack_pool(vip.vip_id, 0, vip.table_size),
            u64::from(src[0]) | u64::from(src[1]) << 32,
            u64::from(src[2]) | u64::from(src[3]) << 32,
            u64::from(flow.family) | u64::from(flow.dscp) << 8,
        );
        if block != 0 {
            let base = (block & 0xff_ffff) as u32;
            let size = ((block >> 24) & 0xff_ffff) as u32;
            let id = pick_in(vip, base, size, flow);
            if valid_id(id) {
                return checked(vip, id);
            }
            if block >> 48 == 0 {
                // The tier does not spill into the shared pool.
                return None;
            }
        }
    }
    if vip.scheduler == Scheduler::Maglev as u8 && vip.persist_ticks == 0 && vip.load_bound == 0 {
        let (id, backend) = from_table(vip, flow.src, flow.sport)?;
        return if u32::from(backend.vip_id) == vip.vip_id {
            Some((id, backend))
        } else {
            None
        };
    }
    checked(vip, pick_in(vip, 0, vip.table_size, flow))
}

/// `balancer_pick` on one pool of the VIP.
#[inline(always)]
fn pick_in(vip: &VipMeta, base: u32, table_size: u32, flow: &Flow<'_>) -> u32 {
    let src = flow.src;
    balancer_pick(
        pack_pool(vip.vip_id, base, table_size),
        pack_opts(vip, flow.sport),
        u64::from(src[0]) | u64::from(src[1]) << 32,
        u64::from(src[2]) | u64::from(src[3]) << 32,
    )
}

/// The backend entry of an id a scheduler returned, if it may take the VIP's flow.
#[inline(always)]
fn checked(vip: &VipMeta, id: u32) -> Option<(u32, &'static Backend)> {
    let backend = BACKENDS.get(id)?;
    if usable(backend) && u32::from(backend.vip_id) == vip.vip_id {
        Some((id, backend))
    } else {
        None
    }
}

/// The client's priority tier's block in the VIP's table map, if it has a tier (by source
/// prefix, else DSCP) and the VIP dedicates backends to it: `base | size << 24 | spill << 48`
/// (where the block's Maglev slots start, their number, and 1 if the tier spills into the
/// shared pool); 0 otherwise. `fd` is `family | dscp << 8`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_tier(vip: u64, src_lo: u64, src_hi: u64, fd: u64) -> u64 {
    let pool = unpack(vip, 0);
    let src: RawAddr = [
        src_lo as u32,
        (src_lo >> 32) as u32,
        src_hi as u32,
        (src_hi >> 32) as u32,
    ];
    let tier = tier_of(&src, fd as u8, (fd >> 8) as u8);
    if tier == 0 || tier > MAX_TIERS {
        return 0;
    }
    let Some(table) = table_of(&pool) else {
        return 0;
    };
    let header = pool.table_size;
    let at = match table.get(header + TIER_OFFSETS + tier - 1) {
        Some(v) => *v,
        None => 0,
    };
    if at == 0 {
        return 0;
    }
    let size = match table.get(at) {
        Some(v) => *v,
        None => 0,
    };
    let spill = match table.get(header + SPILL) {
        Some(v) => (*v >> tier) & 1,
        None => 0,
    };
    u64::from((at + 1) & 0xff_ffff) | u64::from(size & 0xff_ffff) << 24 | u64::from(spill) << 48
}

/// A client's priority tier: the longest matching source prefix's, else its DSCP's; 0 if none.
#[inline(always)]
fn tier_of(src: &RawAddr, family: u8, dscp: u8) -> u32 {
    let by_prefix = if family == FAMILY_V4 {
        let key = LpmKey::new(32, src[0]);
        TIER_V4.get(&key).copied()
    } else {
        let key = LpmKey::new(128, *src);
        TIER_V6.get(&key).copied()
    };
    match by_prefix {
        Some(t) if t != 0 => u32::from(t),
        _ => match TIER_DSCP.get(u32::from(dscp)) {
            Some(t) => u32::from(*t),
            None => 0,
        },
    }
}

// The schedulers are global functions: the kernel verifies each once, on its own, rather than
// once for every way the packet path reaches it (each header layout is a different verifier
// state, and the schedulers' loops multiplied by all of them exceed the verifier's budget).
// Their arguments are therefore plain integers: the pool as `vip_id | table_size << 16 |
// base << 40` (where its block starts in the VIP's table map; 0 for the shared pool), the
// VIP's options as `scheduler | load_bound << 8 | persist_ticks << 16 | client port << 32`,
// and they return a backend id, checked by the caller.

/// A pool of a VIP's backends as the schedulers see it: the shared pool (`base` 0) or a
/// priority tier's block of the VIP's table map, with the VIP's options.
#[derive(Clone, Copy)]
struct Pool {
    vip_id: u32,
    base: u32,
    table_size: u32,
    scheduler: u8,
    load_bound: u8,
    persist_ticks: u16,
}

#[inline(always)]
fn pack_pool(vip_id: u32, base: u32, table_size: u32) -> u64 {
    u64::from(vip_id & 0xffff)
        | u64::from(table_size & 0xff_ffff) << 16
        | u64::from(base & 0xff_ffff) << 40
}

#[inline(always)]
fn pack_opts(vip: &VipMeta, sport: u16) -> u64 {
    u64::from(vip.scheduler)
        | u64::from(vip.load_bound) << 8
        | u64::from(vip.persist_ticks) << 16
        | u64::from(sport) << 32
}

#[inline(always)]
fn unpack(vip: u64, opts: u64) -> Pool {
    Pool {
        vip_id: (vip & 0xffff) as u32,
        table_size: ((vip >> 16) & 0xff_ffff) as u32,
        base: ((vip >> 40) & 0xff_ffff) as u32,
        scheduler: opts as u8,
        load_bound: (opts >> 8) as u8,
        persist_ticks: (opts >> 16) as u16,
    }
}

/// The backend id for a new flow (`NO_BACKEND` if none): the client's previous one under
/// session persistence, else the VIP's scheduler's choice (remembered under persistence).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_pick(vip: u64, opts: u64, src_lo: u64, src_hi: u64) -> u32 {
    let meta = unpack(vip, opts);
    let src: RawAddr = [
        src_lo as u32,
        (src_lo >> 32) as u32,
        src_hi as u32,
        (src_hi >> 32) as u32,
    ];
    let sport = (opts >> 32) as u16;
    if meta.persist_ticks == 0 {
        return scheduled(vip, opts, &src, sport);
    }
    let now = now_ticks() as u16;
    let key = AffinityKey {
        src,
        vip_id: meta.vip_id,
    };
    if let Some(sticky) = AFFINITY.get_ptr_mut(key) {
        // SAFETY: a map value, valid for the program's run.
        let sticky = unsafe { &mut *sticky };
        let id = u32::from(sticky.backend_id);
        if now.wrapping_sub(sticky.last_seen) <= meta.persist_ticks
            && balancer_may_stick(vip, opts, id, u32::from(sticky.generation)) != 0
        {
            if sticky.last_seen != now {
                sticky.last_seen = now;
            }
            return id;
        }
    }
    let id = scheduled(vip, opts, &src, sport);
    if let Some(b) = BACKENDS.get(id) {
        let value = AffinityValue {
            backend_id: id as u16,
            generation: b.generation as u16,
            last_seen: now,
            _pad: 0,
        };
        let _ = AFFINITY.insert(key, value, 0);
    }
    id
}

/// 1 if a client's remembered backend may take its new flow: it serves the VIP, is the same
/// backend (generation), takes new flows, and has room under bounded load.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_may_stick(vip: u64, opts: u64, id: u32, generation: u32) -> u32 {
    let meta = unpack(vip, opts);
    let Some(table) = MAGLEV.get(meta.vip_id) else {
        return 0;
    };
    let p = candidate(&meta, id);
    if !p.is_some() {
        return 0;
    }
    let b = p.backend();
    u32::from(
        b.weight != 0 && b.generation as u16 == generation as u16 && !full(&meta, table, id, b),
    )
}

/// The scheduler's choice, else (while a change of scheduler and its schedule are on their way
/// in) the Maglev table's.
#[inline(always)]
fn scheduled(vip: u64, opts: u64, src: &RawAddr, sport: u16) -> u32 {
    let id = match Scheduler::from_u8(opts as u8) {
        Some(Scheduler::SourceHash) => balancer_hashed(vip, opts, flow_hash(src, 0)),
        Some(Scheduler::RoundRobin) => balancer_in_turn(vip, 0),
        Some(Scheduler::WeightedRoundRobin) => balancer_in_turn(vip, 1),
        Some(Scheduler::Random | Scheduler::WeightedRandom | Scheduler::PowerOfTwo) => {
            balancer_random(vip, opts)
        }
        Some(Scheduler::LeastConn) => balancer_least_conn(vip),
        _ => NO_BACKEND,
    };
    if valid_id(id) {
        return id;
    }
    balancer_hashed(vip, opts, flow_hash(src, sport))
}

/// The VIP's table, and its size checked non-zero.
#[inline(always)]
fn table_of(meta: &Pool) -> Option<&'static Table> {
    if meta.table_size == 0 {
        return None;
    }
    MAGLEV.get(meta.vip_id)
}

/// The Maglev slot of `hash`; under bounded load, the first of the following slots whose
/// backend has room (the hash's own backend if none has).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_hashed(vip: u64, opts: u64, hash: u32) -> u32 {
    let meta = unpack(vip, opts);
    let Some(table) = table_of(&meta) else {
        return NO_BACKEND;
    };
    hashed(&meta, table, hash).id
}

/// Round robin over the list (`weighted` 0) or the weighted sequence (1).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_in_turn(vip: u64, weighted: u32) -> u32 {
    let meta = unpack(vip, 0);
    let Some(table) = table_of(&meta) else {
        return NO_BACKEND;
    };
    in_turn(&meta, table, weighted != 0).id
}

/// Random, weighted random, or the better of two weighted random picks.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_random(vip: u64, opts: u64) -> u32 {
    let meta = unpack(vip, opts);
    let Some(table) = table_of(&meta) else {
        return NO_BACKEND;
    };
    let vip = &meta;
    let p = match Scheduler::from_u8(vip.scheduler) {
        Some(Scheduler::Random) => {
            let len = header(vip, table, 0);
            listed(vip, table, below(random(), len), len)
        }
        Some(Scheduler::PowerOfTwo) => {
            let a = at_slot(vip, table, below(random(), vip.table_size));
            let b = at_slot(vip, table, below(random(), vip.table_size));
            if !a.is_some() {
                b
            } else if !b.is_some() {
                a
            } else if less_loaded(
                active_of(&ACTIVE, b.id),
                weight_of(b.backend()),
                active_of(&ACTIVE, a.id),
                weight_of(a.backend()),
            ) {
                b
            } else {
                a
            }
        }
        _ => at_slot(vip, table, below(random(), vip.table_size)),
    };
    p.id
}

/// Least connections (see [`least_conn`]).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn balancer_least_conn(vip: u64) -> u32 {
    let meta = unpack(vip, 0);
    let Some(table) = table_of(&meta) else {
        return NO_BACKEND;
    };
    least_conn(&meta, table).id
}

/// A backend's weight for load ratios (at least 1).
#[inline(always)]
fn weight_of(b: &Backend) -> u32 {
    if b.weight == 0 {
        1
    } else {
        u32::from(b.weight)
    }
}

/// Whether a backend is over the VIP's bounded load.
#[inline(always)]
fn full(vip: &Pool, table: &Table, id: u32, b: &Backend) -> bool {
    if vip.load_bound == 0 {
        return false;
    }
    let total = match table.get(vip.base + vip.table_size + 2) {
        Some(t) => *t,
        None => 0,
    };
    over_bound(
        active_of(&ACTIVE, id),
        active_of(&VIP_ACTIVE, vip.vip_id),
        weight_of(b),
        total,
        u32::from(vip.load_bound),
    )
}

/// Entry `i` of the schedule's header (0 when absent).
#[inline(always)]
fn header(vip: &Pool, table: &Table, i: u32) -> u32 {
    match table.get(vip.base + vip.table_size + i) {
        Some(v) => *v,
        None => 0,
    }
}

/// The backend in a slot of the Maglev table.
#[inline(always)]
fn at_slot(vip: &Pool, table: &Table, index: u32) -> Pick {
    match table.get(vip.base + index) {
        Some(id) => candidate(vip, *id),
        None => Pick::NONE,
    }
}

/// The `i`-th backend of the schedule's list of `len`.
#[inline(always)]
fn listed(vip: &Pool, table: &Table, i: u32, len: u32) -> Pick {
    if i >= len {
        return Pick::NONE;
    }
    match table.get(vip.base + vip.table_size + HEADER + i) {
        Some(id) => candidate(vip, *id),
        None => Pick::NONE,
    }
}

/// The Maglev slot of `hash`; under bounded load, the first of the following slots whose
/// backend has room (the hash's own backend if none has).
#[inline(always)]
fn hashed(vip: &Pool, table: &Table, hash: u32) -> Pick {
    let size = vip.table_size;
    if size == 0 {
        return Pick::NONE;
    }
    let first = slot(hash, size);
    let home = at_slot(vip, table, first);
    if vip.load_bound == 0 {
        return home;
    }
    let mut i = 0;
    let mut index = first;
    while i < BOUNDED_PROBES {
        let p = at_slot(vip, table, index);
        if p.is_some() && !full(vip, table, p.id, p.backend()) {
            return p;
        }
        index += 1;
        if index >= size {
            index = 0;
        }
        i += 1;
    }
    home
}

/// This CPU's cursor of the VIP, advanced; in `0..len`.
#[inline(always)]
fn next_turn(vip: &Pool, len: u32) -> u32 {
    match RR_CURSOR.get_ptr_mut(vip.vip_id) {
        Some(c) => {
            // SAFETY: this CPU's entry.
            let c = unsafe { &mut *c };
            let at = if *c >= len { 0 } else { *c };
            *c = at + 1;
            at
        }
        None => 0,
    }
}

/// Round robin over the list, or over the weighted sequence, with a cursor per CPU per VIP.
/// A backend that left since the schedule was built is skipped (a few tries).
#[inline(always)]
fn in_turn(vip: &Pool, table: &Table, weighted: bool) -> Pick {
    let list_len = header(vip, table, 0);
    let seq_len = header(vip, table, 1);
    let (start, len) = if weighted && seq_len > 0 {
        (vip.base + vip.table_size + HEADER + list_len, seq_len)
    } else {
        (vip.base + vip.table_size + HEADER, list_len)
    };
    if len == 0 {
        return Pick::NONE;
    }
    let mut tries = 0;
    while tries < 4 {
        let at = next_turn(vip, len);
        let p = match table.get(start + at) {
            Some(id) => candidate(vip, *id),
            None => Pick::NONE,
        };
        if p.is_some() {
            return p;
        }
        tries += 1;
    }
    Pick::NONE
}

/// The listed backend with the fewest active flows per unit of weight, from a rotating start
/// (ties spread; lists longer than `LEAST_CONN_SCAN` are sampled in windows). The loop keeps
/// only integers (no map pointers), so the verifier's states at its head stay few.
#[inline(always)]
fn least_conn(vip: &Pool, table: &Table) -> Pick {
    let len = header(vip, table, 0);
    if len == 0 {
        return Pick::NONE;
    }
    let start = next_turn(vip, len);
    let scan = if len < LEAST_CONN_SCAN {
        len
    } else {
        LEAST_CONN_SCAN
    };
    let list = vip.base + vip.table_size + HEADER;
    let mut best_id = NO_BACKEND;
    let mut best_active: u64 = 0;
    let mut best_weight: u32 = 1;
    let mut i = 0;
    while i < LEAST_CONN_SCAN {
        if i >= scan {
            break;
        }
        let mut at = start + i;
        if at >= len {
            at -= len;
        }
        let id = match table.get(list + at) {
            Some(id) => *id,
            None => NO_BACKEND,
        };
        let weight = match BACKENDS.get(id) {
            Some(b) if usable(b) && u32::from(b.vip_id) == vip.vip_id => weight_of(b),
            _ => 0,
        };
        if weight != 0 {
            let active = active_of(&ACTIVE, id);
            if !valid_id(best_id) || less_loaded(active, weight, best_active, best_weight) {
                best_id = id;
                best_active = active;
                best_weight = weight;
            }
        }
        i += 1;
    }
    candidate(vip, best_id)
}

/// The backend the VIP's Maglev table assigns to the flow (no connection tracking).
#[inline(always)]
pub fn from_table(vip: &VipMeta, src: &RawAddr, sport: u16) -> Option<(u32, &'static Backend)> {
    if vip.table_size == 0 {
        return None;
    }
    let index = slot(flow_hash(src, sport), vip.table_size);
    let id = *MAGLEV.get_value(vip.vip_id, &index)?;
    if !valid_id(id) {
        return None;
    }
    let backend = BACKENDS.get(id)?;
    if !usable(backend) {
        return None;
    }
    Some((id, backend))
}

/// Counts a new flow against this CPU's window (one flow-clock tick); `false` once the window
/// is over the threshold (flood mode: the flow is forwarded by hash alone, not inserted).
#[inline(always)]
fn flood_allows_insert(ctx: &XdpContext, cfg: &GlobalConfig, stats: &mut GlobalStats) -> bool {
    if cfg.flood_threshold == 0 {
        return true;
    }
    let Some(window) = FLOOD.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: per-CPU value, valid for the program's run.
    let window = unsafe { &mut *window };
    let now = now_ticks();
    if now != window.tick {
        window.tick = now;
        window.new_flows = 0;
        window.flooding = 0;
    }
    window.new_flows += 1;
    if window.new_flows <= cfg.flood_threshold {
        return true;
    }
    if window.flooding == 0 {
        window.flooding = 1;
        count(stats, Counter::FloodActivations);
        warn!(
            ctx,
            "flood mode: over {} new flows/s on this CPU; new flows use the hash alone",
            cfg.flood_threshold
        );
    }
    count(stats, Counter::FloodInsertsSkipped);
    false
}

#[inline(always)]
pub fn count(stats: &mut GlobalStats, counter: Counter) {
    stats.counters[counter as usize] += 1;
}
