//! The balancer's bookkeeping, apart from BPF access (the role of Katran's `KatranLb`): VIPs and
//! their backends, id allocation, Maglev tables, and the order in which kernel state changes so
//! that no packet ever sees a half-made change.
//!
//! Ordering rules:
//! - a VIP entry appears only after its backends and table exist, and goes first on removal;
//! - a new table is published (one atomic swap) after new backends are written and before
//!   removed backends are deactivated; packets of a removed backend's flows are re-hashed;
//! - a drained backend (weight 0) leaves the table but stays active, so its established
//!   flows continue;
//! - a backend removed from a VIP leaves the table at once but stays active for a grace period
//!   (its established flows continue), then is deactivated; re-adding it within the grace
//!   period takes it back with its flows. A removed VIP takes its backends with it at once.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use balancer_common::addr::raw_from_ip;
use balancer_common::maglev::{self, MaglevBackend, MaglevError};
use balancer_common::maps::{
    BACKEND_F_ACTIVE, Backend, ForwardMode, GlobalConfig, LAYOUT, MAX_BACKENDS, MAX_VIPS,
    VIP_F_COUNT, VIP_F_TIERS, VipKey, VipMeta,
};
use balancer_common::schedule;
use balancer_common::stats::{GlobalStats, TrafficStats};

use crate::config::{BackendConfig, Forwarding, VipConfig};
use crate::dataplane::{Dataplane, DataplaneError};
use crate::net::{MacAddr, Protocol};

/// Why a change was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum BalancerError {
    #[error("no next-hop MAC known for backend {backend} of VIP {vip}")]
    NoMac { vip: String, backend: IpAddr },
    #[error("VIP {vip}: {source}")]
    Table {
        vip: String,
        #[source]
        source: MaglevError,
    },
    #[error("no free {what} id (at most {max})")]
    IdsExhausted { what: &'static str, max: u32 },
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
}

/// The (address, port, protocol) of a VIP.
pub type Endpoint = (IpAddr, u16, Protocol);

/// Ids handed out first-in first-out, so a freed id is reused as late as possible.
#[derive(Debug)]
struct IdPool {
    free: VecDeque<u32>,
}

impl IdPool {
    fn new(max: u32) -> Self {
        IdPool {
            free: (0..max).collect(),
        }
    }
    fn take(&mut self) -> Option<u32> {
        self.free.pop_front()
    }
    fn give_back(&mut self, id: u32) {
        self.free.push_back(id);
    }
    fn available(&self) -> usize {
        self.free.len()
    }
    /// Marks `id` as in use (restoring a snapshot).
    fn reserve(&mut self, id: u32) -> bool {
        match self.free.iter().position(|f| *f == id) {
            Some(at) => {
                self.free.remove(at);
                true
            }
            None => false,
        }
    }
}

/// A backend of one VIP as the kernel has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendState {
    pub id: u32,
    pub address: IpAddr,
    /// Configured weight (kept while drained or unhealthy).
    pub weight: u32,
    /// Drained: out of the table, its established flows continue.
    pub drained: bool,
    /// Failing its health checks: out of the table and inactive (its flows are re-hashed).
    pub healthy: bool,
    /// The weight a telemetry policy computed, in place of `weight` (see [`crate::policy`]).
    pub dynamic_weight: Option<u32>,
    /// The weight the fleet's leader published for it (see [`crate::fleet`]), in place of
    /// everything local: every balancer of a fleet builds its table from the same weights.
    pub fleet_weight: Option<u32>,
    pub mac: MacAddr,
    pub generation: u32,
    /// The priority tier it is dedicated to (0: the shared pool).
    pub tier: u8,
}

impl BackendState {
    /// The weight its VIP's table is built with.
    pub fn table_weight(&self) -> u32 {
        if let Some(w) = self.fleet_weight {
            return w;
        }
        self.local_weight()
    }

    /// The weight this balancer's own view gives it (configuration, drain, health, telemetry
    /// policy): what a fleet's leader publishes.
    pub fn local_weight(&self) -> u32 {
        if self.healthy && !self.drained {
            self.dynamic_weight.unwrap_or(self.weight)
        } else {
            0
        }
    }
}

/// A VIP as the kernel has it.
#[derive(Clone, Debug)]
pub struct VipState {
    pub id: u32,
    pub config: VipConfig,
    pub backends: BTreeMap<IpAddr, BackendState>,
    /// Current Maglev table (backend ids).
    pub table: Vec<u32>,
    /// Host-independent fingerprint of the table (see `maglev::fingerprint`).
    pub fingerprint: u64,
    /// Maglev tables of the priority tiers the VIP dedicates backends to.
    pub tier_tables: BTreeMap<u8, Vec<u32>>,
    /// Tiers that spill into the shared pool, as published.
    pub spill: u8,
}

impl VipState {
    /// What the data plane gets for this VIP: the Maglev table, then the schedule (see
    /// `balancer_common::schedule`).
    pub fn published(&self) -> Vec<u32> {
        let schedule_of = |tier: u8| {
            let listed: Vec<(u32, u32)> = self
                .backends
                .values()
                .filter(|b| b.tier == tier)
                .map(|b| (b.id, b.table_weight()))
                .collect();
            schedule::build(&listed, self.config.scheduler.needs_sequence())
        };
        let tiers: Vec<(u8, &Vec<u32>, Vec<u32>)> = self
            .tier_tables
            .iter()
            .map(|(t, table)| (*t, table, schedule_of(*t)))
            .collect();
        let blocks: Vec<(u8, &[u32], &[u32])> = tiers
            .iter()
            .map(|(t, table, schedule)| (*t, table.as_slice(), schedule.as_slice()))
            .collect();
        schedule::lay_out(&self.table, &schedule_of(0), &blocks, self.spill)
    }

    /// Slots per backend address in the current table.
    /// (A tier's backends: their slots in their tier's table, of the same size.)
    pub fn slot_shares(&self) -> BTreeMap<IpAddr, usize> {
        let mut counts = maglev::slot_counts(&self.table);
        for table in self.tier_tables.values() {
            counts.extend(maglev::slot_counts(table));
        }
        self.backends
            .values()
            .map(|b| (b.address, counts.get(&b.id).copied().unwrap_or(0)))
            .collect()
    }
}

/// A backend removed from its VIP, still serving its established flows until `until`.
#[derive(Clone, Debug)]
pub struct RetiringBackend {
    pub vip: Endpoint,
    pub state: BackendState,
    pub until: Instant,
}

/// A [`Balancer`]'s bookkeeping as saved beside the pinned maps (JSON).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// [`LAYOUT`] of the maps it describes.
    pub layout: u64,
    pub flow_seed: u64,
    pub next_generation: u32,
    pub vips: Vec<VipSnapshot>,
    pub retiring: Vec<RetiringSnapshot>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct VipSnapshot {
    pub id: u32,
    pub config: crate::config::RawVip,
    pub backends: Vec<BackendSnapshot>,
    #[serde(default)]
    pub spill: u8,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BackendSnapshot {
    pub id: u32,
    pub address: IpAddr,
    pub weight: u32,
    pub drained: bool,
    pub healthy: bool,
    #[serde(default)]
    pub dynamic_weight: Option<u32>,
    #[serde(default)]
    pub fleet_weight: Option<u32>,
    pub mac: String,
    pub generation: u32,
    #[serde(default)]
    pub tier: u8,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RetiringSnapshot {
    pub vip: (IpAddr, u16, String),
    pub backend: BackendSnapshot,
    pub remaining_ms: u64,
}

/// Why a snapshot cannot be carried on from.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(
        "the pinned state has map layout {found:#x}, this build has {expected:#x}: run `balancer stop --detach` and start afresh"
    )]
    Layout { found: u64, expected: u64 },
    #[error("the saved state is inconsistent: {0}")]
    Invalid(String),
}

/// What one `apply` changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub vips_added: usize,
    pub vips_removed: usize,
    pub vips_updated: usize,
    pub tables_published: usize,
    /// Slots whose backend changed, summed over republished tables.
    pub slots_changed: usize,
    /// Time spent building Maglev tables.
    pub table_build_time: Duration,
    /// Time spent publishing them into the data plane.
    pub table_publish_time: Duration,
    /// Names of the VIPs whose tables were rebuilt.
    pub rebuilt: Vec<String>,
    /// When the new tables went live (the swap began).
    pub live_at: Option<Instant>,
}

/// VIPs, backends and tables, written through a [`Dataplane`].
pub struct Balancer<D: Dataplane> {
    dataplane: D,
    vips: BTreeMap<Endpoint, VipState>,
    vip_ids: IdPool,
    backend_ids: IdPool,
    next_generation: u32,
    /// How many VIPs use each address (for the address-only marker entries).
    address_users: HashMap<IpAddr, usize>,
    retiring: Vec<RetiringBackend>,
    removal_grace: Duration,
    settings: GlobalConfig,
    /// Backends failing their health checks.
    unhealthy: HashSet<(Endpoint, IpAddr)>,
    /// The priority tiers in force, and which of them spill into the shared pool (bit `id`).
    tiers: Vec<crate::config::TierConfig>,
    tier_spill: u8,
    /// Time spent building and publishing tables since the last `apply` began.
    build_time: Duration,
    publish_time: Duration,
}

fn vip_key(address: IpAddr, port: u16, proto: u8) -> VipKey {
    let (addr, family) = raw_from_ip(address);
    VipKey {
        addr,
        port: port.to_be(),
        proto,
        family,
    }
}

fn forward_mode(f: Forwarding) -> ForwardMode {
    match f {
        Forwarding::L2Dsr => ForwardMode::L2Dsr,
        Forwarding::Ipip => ForwardMode::Ipip,
        Forwarding::Gue => ForwardMode::Gue,
    }
}

fn vip_meta(id: u32, config: &VipConfig) -> VipMeta {
    VipMeta {
        vip_id: id,
        table_size: config.table_size,
        mode: forward_mode(config.forwarding) as u8,
        flags: if config.backends.iter().any(|b| b.tier.is_some()) {
            VIP_F_TIERS
        } else {
            0
        } | if config.policy.reads_flows() {
            VIP_F_COUNT
        } else {
            0
        },
        gue_port: config.gue_port.to_be(),
        scheduler: config.scheduler as u8,
        load_bound: config.load_bound_pct,
        persist_ticks: config.persistence_ticks(),
    }
}

fn backend_entry(vip_id: u32, _vip: &VipConfig, b: &BackendState) -> Backend {
    let (addr, family) = raw_from_ip(b.address);
    Backend {
        addr,
        mac: b.mac.0,
        family,
        flags: if b.healthy { BACKEND_F_ACTIVE } else { 0 },
        generation: b.generation,
        vip_id: vip_id as u16,
        weight: b.table_weight().min(u32::from(u16::MAX)) as u16,
    }
}

/// Builds the Maglev table of a VIP's backends.
pub fn build_table(
    name: &str,
    table_size: u32,
    backends: &BTreeMap<IpAddr, BackendState>,
) -> Result<(Vec<u32>, u64), BalancerError> {
    build_pool_table(name, table_size, backends, 0)
}

/// The Maglev tables of the priority tiers among `backends` (the same size as the VIP's).
pub fn build_tier_tables(
    name: &str,
    table_size: u32,
    backends: &BTreeMap<IpAddr, BackendState>,
) -> Result<BTreeMap<u8, Vec<u32>>, BalancerError> {
    let tiers: std::collections::BTreeSet<u8> = backends
        .values()
        .map(|b| b.tier)
        .filter(|t| *t != 0)
        .collect();
    tiers
        .into_iter()
        .map(|t| Ok((t, build_pool_table(name, table_size, backends, t)?.0)))
        .collect()
}

/// The Maglev table of the backends of one pool (tier 0: the shared pool).
fn build_pool_table(
    name: &str,
    table_size: u32,
    backends: &BTreeMap<IpAddr, BackendState>,
    tier: u8,
) -> Result<(Vec<u32>, u64), BalancerError> {
    let identities: Vec<(String, &BackendState)> = backends
        .values()
        .filter(|b| b.tier == tier)
        .map(|b| (b.address.to_string(), b))
        .collect();
    let input: Vec<MaglevBackend<'_>> = identities
        .iter()
        .map(|(identity, b)| MaglevBackend {
            identity: identity.as_bytes(),
            weight: b.table_weight(),
            id: b.id,
        })
        .collect();
    let table = maglev::build_table(&input, table_size).map_err(|source| BalancerError::Table {
        vip: name.to_string(),
        source,
    })?;
    let fingerprint = maglev::fingerprint(&table, &input);
    Ok((table, fingerprint))
}

impl<D: Dataplane> Balancer<D> {
    pub fn new(dataplane: D) -> Self {
        Balancer {
            dataplane,
            vips: BTreeMap::new(),
            vip_ids: IdPool::new(MAX_VIPS),
            backend_ids: IdPool::new(MAX_BACKENDS),
            next_generation: 1,
            address_users: HashMap::new(),
            retiring: Vec::new(),
            removal_grace: Duration::ZERO,
            settings: GlobalConfig::default(),
            unhealthy: HashSet::new(),
            tiers: Vec::new(),
            tier_spill: 0,
            build_time: Duration::ZERO,
            publish_time: Duration::ZERO,
        }
    }

    /// Builds a VIP's table, timing it.
    fn build(
        &mut self,
        name: &str,
        table_size: u32,
        backends: &BTreeMap<IpAddr, BackendState>,
    ) -> Result<(Vec<u32>, u64), BalancerError> {
        let started = Instant::now();
        let built = build_table(name, table_size, backends);
        self.build_time += started.elapsed();
        built
    }

    /// Makes `tiers` the priority tiers in force: the data plane's client classification
    /// (source prefixes, DSCP) is rewritten when they change. Call before [`Balancer::apply`],
    /// which places backends in their tiers' pools.
    pub fn set_tiers(&mut self, tiers: &[crate::config::TierConfig]) -> Result<(), BalancerError> {
        if self.tiers == tiers {
            return Ok(());
        }
        let mut prefixes = Vec::new();
        let mut dscp = [0u8; 64];
        for t in tiers {
            for p in &t.prefixes {
                prefixes.push((p.addr, p.len, t.id));
            }
            for d in &t.dscp {
                dscp[usize::from(*d)] = t.id;
            }
        }
        self.dataplane.set_tiers(&prefixes, &dscp)?;
        self.tiers = tiers.to_vec();
        self.tier_spill = tiers
            .iter()
            .filter(|t| t.spillover)
            .fold(0, |m, t| m | 1 << t.id);
        Ok(())
    }

    fn tier_id(&self, name: Option<&str>) -> u8 {
        name.and_then(|n| self.tiers.iter().find(|t| t.name == n))
            .map_or(0, |t| t.id)
    }

    /// The global data-plane settings in force.
    pub fn settings(&self) -> &GlobalConfig {
        &self.settings
    }

    /// How long a backend removed from a VIP keeps its established flows (zero: re-hash them
    /// at once).
    pub fn set_removal_grace(&mut self, grace: Duration) {
        self.removal_grace = grace;
    }

    /// Backends removed from their VIP that still serve established flows.
    pub fn retiring(&self) -> &[RetiringBackend] {
        &self.retiring
    }

    /// The bookkeeping a restarted daemon needs to carry on with the pinned maps.
    pub fn snapshot(&self) -> Snapshot {
        let backend = |b: &BackendState| BackendSnapshot {
            id: b.id,
            address: b.address,
            weight: b.weight,
            drained: b.drained,
            healthy: b.healthy,
            dynamic_weight: b.dynamic_weight,
            fleet_weight: b.fleet_weight,
            mac: b.mac.to_string(),
            generation: b.generation,
            tier: b.tier,
        };
        let now = Instant::now();
        Snapshot {
            layout: LAYOUT,
            flow_seed: self.settings.flow_seed,
            next_generation: self.next_generation,
            vips: self
                .vips
                .values()
                .map(|v| VipSnapshot {
                    id: v.id,
                    config: v.config.to_raw(),
                    backends: v.backends.values().map(backend).collect(),
                    spill: v.spill,
                })
                .collect(),
            retiring: self
                .retiring
                .iter()
                .map(|r| RetiringSnapshot {
                    vip: (r.vip.0, r.vip.1, r.vip.2.to_string()),
                    backend: backend(&r.state),
                    remaining_ms: r.until.saturating_duration_since(now).as_millis() as u64,
                })
                .collect(),
        }
    }

    /// A balancer that carries on from `snapshot` over maps that already hold its state:
    /// nothing is written to the kernel. Tables are rebuilt in memory (they are a function of
    /// the backends) to serve `table` and fingerprints.
    pub fn restore(dataplane: D, snapshot: &Snapshot) -> Result<Self, RestoreError> {
        if snapshot.layout != LAYOUT {
            return Err(RestoreError::Layout {
                found: snapshot.layout,
                expected: LAYOUT,
            });
        }
        let mut lb = Balancer::new(dataplane);
        lb.next_generation = snapshot.next_generation.max(1);
        lb.settings.flow_seed = snapshot.flow_seed;
        let state_of = |b: &BackendSnapshot| -> Result<BackendState, RestoreError> {
            Ok(BackendState {
                id: b.id,
                address: b.address,
                weight: b.weight,
                drained: b.drained,
                healthy: b.healthy,
                dynamic_weight: b.dynamic_weight,
                fleet_weight: b.fleet_weight,
                mac: b.mac.parse().map_err(RestoreError::Invalid)?,
                generation: b.generation,
                tier: b.tier,
            })
        };
        for vip in &snapshot.vips {
            let config = crate::config::validate_vip(vip.config.clone(), "state.vip")
                .map_err(|e| RestoreError::Invalid(e.to_string()))?;
            if !lb.vip_ids.reserve(vip.id) {
                return Err(RestoreError::Invalid(format!(
                    "VIP id {} used twice",
                    vip.id
                )));
            }
            let mut backends = BTreeMap::new();
            for b in &vip.backends {
                let state = state_of(b)?;
                if !lb.backend_ids.reserve(state.id) {
                    return Err(RestoreError::Invalid(format!(
                        "backend id {} used twice",
                        state.id
                    )));
                }
                if !state.healthy {
                    lb.unhealthy.insert((config.endpoint(), state.address));
                }
                backends.insert(state.address, state);
            }
            let (table, fingerprint) = build_table(&config.name, config.table_size, &backends)
                .map_err(|e| RestoreError::Invalid(e.to_string()))?;
            let tier_tables = build_tier_tables(&config.name, config.table_size, &backends)
                .map_err(|e| RestoreError::Invalid(e.to_string()))?;
            *lb.address_users.entry(config.address).or_insert(0) += 1;
            lb.vips.insert(
                config.endpoint(),
                VipState {
                    id: vip.id,
                    config,
                    backends,
                    table,
                    fingerprint,
                    tier_tables,
                    spill: vip.spill,
                },
            );
        }
        let now = Instant::now();
        for r in &snapshot.retiring {
            let protocol = r.vip.2.parse().map_err(RestoreError::Invalid)?;
            let state = state_of(&r.backend)?;
            if !lb.backend_ids.reserve(state.id) {
                return Err(RestoreError::Invalid(format!(
                    "backend id {} used twice",
                    state.id
                )));
            }
            lb.retiring.push(RetiringBackend {
                vip: (r.vip.0, r.vip.1, protocol),
                state,
                until: now + Duration::from_millis(r.remaining_ms),
            });
        }
        Ok(lb)
    }

    /// Sets the weights a telemetry policy computed for a VIP's backends (in place of their
    /// configured weights) and republishes its table if they changed the table. Backends not
    /// listed keep theirs.
    pub fn set_dynamic_weights(
        &mut self,
        vip: &Endpoint,
        weights: &[(IpAddr, u32)],
    ) -> Result<ApplyReport, BalancerError> {
        let mut report = ApplyReport::default();
        let Some(state) = self.vips.get_mut(vip) else {
            return Ok(report);
        };
        let mut changed = false;
        for (address, weight) in weights {
            if let Some(b) = state.backends.get_mut(address)
                && b.dynamic_weight != Some(*weight)
            {
                let before = b.table_weight();
                b.dynamic_weight = Some(*weight);
                changed |= before != b.table_weight();
            }
        }
        if !changed {
            return Ok(report);
        }
        self.build_time = Duration::ZERO;
        self.publish_time = Duration::ZERO;
        self.rebuild_weights(vip, &mut report)?;
        report.table_build_time = self.build_time;
        report.table_publish_time = self.publish_time;
        report.live_at = self.dataplane.swap_started();
        Ok(report)
    }

    /// Sets the weights a fleet's leader published (VIP name → backend → weight) in place of
    /// every local one, or with `None` returns every VIP to its local weights. A VIP the
    /// published state does not name keeps its local weights; a backend it does not list gets
    /// weight 0. Republishes the tables that change.
    pub fn set_fleet_weights(
        &mut self,
        published: Option<&BTreeMap<String, BTreeMap<IpAddr, u32>>>,
    ) -> Result<ApplyReport, BalancerError> {
        let mut report = ApplyReport::default();
        self.build_time = Duration::ZERO;
        self.publish_time = Duration::ZERO;
        let endpoints: Vec<Endpoint> = self.vips.keys().copied().collect();
        for vip in endpoints {
            let state = self.vips.get_mut(&vip).expect("listed above");
            let weights = published.and_then(|p| p.get(&state.config.name));
            let mut changed = false;
            for b in state.backends.values_mut() {
                let fleet = weights.map(|w| w.get(&b.address).copied().unwrap_or(0));
                if b.fleet_weight != fleet {
                    let before = b.table_weight();
                    b.fleet_weight = fleet;
                    changed |= before != b.table_weight();
                }
            }
            if changed {
                self.rebuild_weights(&vip, &mut report)?;
            }
        }
        report.table_build_time = self.build_time;
        report.table_publish_time = self.publish_time;
        report.live_at = self.dataplane.swap_started();
        Ok(report)
    }

    /// Rebuilds and publishes one VIP's tables after its backends' weights changed, then
    /// updates the backends' entries (their weights for the connection-aware schedulers).
    fn rebuild_weights(
        &mut self,
        vip: &Endpoint,
        report: &mut ApplyReport,
    ) -> Result<(), BalancerError> {
        let state = &self.vips[vip];
        let config = state.config.clone();
        let backends = state.backends.clone();
        let (table, fingerprint) = self.build(&config.name, config.table_size, &backends)?;
        let tier_tables = build_tier_tables(&config.name, config.table_size, &backends)?;
        let id = self.vips[vip].id;
        let state = self.vips.get_mut(vip).expect("checked above");
        report.slots_changed = maglev::slots_changed(&state.table, &table);
        state.table = table;
        state.fingerprint = fingerprint;
        state.tier_tables = tier_tables;
        let published = state.published();
        let started = Instant::now();
        self.dataplane.publish_tables(&[(id, &published)])?;
        self.publish_time += started.elapsed();
        report.tables_published += 1;
        report.rebuilt.push(config.name.clone());
        report.vips_updated += 1;
        // Their weights for the connection-aware schedulers, once the table is live.
        for b in self.vips[vip].backends.values() {
            self.dataplane
                .set_backend(b.id, &backend_entry(id, &config, b))?;
        }
        Ok(())
    }

    /// Records a backend's health and, when it changed, rebuilds its VIP's table: an
    /// unhealthy backend leaves the table and is made inactive (its flows are re-hashed); a
    /// recovered one returns. Returns whether anything changed.
    pub fn set_health(
        &mut self,
        vip: &Endpoint,
        backend: IpAddr,
        healthy: bool,
    ) -> Result<bool, BalancerError> {
        let key = (*vip, backend);
        let changed = if healthy {
            self.unhealthy.remove(&key)
        } else {
            self.unhealthy.insert(key)
        };
        let Some(state) = self.vips.get(vip) else {
            return Ok(changed);
        };
        if !changed || !state.backends.contains_key(&backend) {
            return Ok(changed);
        }
        let config = state.config.clone();
        let mut report = ApplyReport::default();
        if let Some(stage) = self.stage_vip(vip, &config, &HashMap::new())? {
            self.commit(vec![stage], &mut report)?;
        }
        tracing::info!(vip = %config.name, %backend, healthy, "backend health changed");
        Ok(true)
    }

    /// Deactivates retiring backends whose grace period ended by `now` (their remaining flows
    /// are re-hashed). Returns how many.
    pub fn expire_retired(&mut self, now: Instant) -> Result<usize, BalancerError> {
        let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring)
            .into_iter()
            .partition(|r| r.until <= now);
        self.retiring = kept;
        for r in &expired {
            self.retire_backend(&r.state)?;
            tracing::info!(backend = %r.state.address, vip = %format!("{}/{}", std::net::SocketAddr::new(r.vip.0, r.vip.1), r.vip.2), "removed backend's grace period over; its remaining flows are re-hashed");
        }
        Ok(expired.len())
    }

    pub fn dataplane(&self) -> &D {
        &self.dataplane
    }

    /// Replaces the global data-plane settings.
    pub fn set_settings(&mut self, settings: &GlobalConfig) -> Result<(), BalancerError> {
        self.dataplane.set_config(settings)?;
        self.settings = *settings;
        Ok(())
    }

    /// The VIPs in endpoint order.
    pub fn vips(&self) -> impl Iterator<Item = &VipState> {
        self.vips.values()
    }

    /// The VIP with this name.
    pub fn vip(&self, name: &str) -> Option<&VipState> {
        self.vips.values().find(|v| v.config.name == name)
    }

    pub fn global_stats(&self) -> Result<GlobalStats, BalancerError> {
        Ok(self.dataplane.global_stats()?)
    }

    pub fn vip_stats(&self, vip: &VipState) -> Result<TrafficStats, BalancerError> {
        Ok(self.dataplane.vip_stats(vip.id)?)
    }

    pub fn backend_stats(&self, backend: &BackendState) -> Result<TrafficStats, BalancerError> {
        Ok(self.dataplane.backend_stats(backend.id)?)
    }

    /// Makes the kernel state match `vips`. `macs` gives each backend's next-hop MAC (a
    /// backend's own `mac` setting wins). Everything that can be checked is checked before
    /// the first kernel write.
    pub fn apply(
        &mut self,
        vips: &[VipConfig],
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<ApplyReport, BalancerError> {
        let mut report = ApplyReport::default();
        let desired: BTreeMap<Endpoint, &VipConfig> =
            vips.iter().map(|v| (v.endpoint(), v)).collect();

        // Check: MACs known, ids available, tables buildable (with placeholder ids).
        for vip in vips {
            let current = self.vips.get(&vip.endpoint());
            for b in &vip.backends {
                let known = current.is_some_and(|c| c.backends.contains_key(&b.address));
                if b.mac.is_none() && !macs.contains_key(&b.address) && !known {
                    return Err(BalancerError::NoMac {
                        vip: vip.name.clone(),
                        backend: b.address,
                    });
                }
            }
        }
        let new_vips = desired
            .keys()
            .filter(|e| !self.vips.contains_key(e))
            .count();
        if new_vips > self.vip_ids.available() {
            return Err(BalancerError::IdsExhausted {
                what: "VIP",
                max: MAX_VIPS,
            });
        }
        let kept_backends: usize = self
            .vips
            .iter()
            .filter(|(e, _)| desired.contains_key(e))
            .map(|(_, v)| v.backends.len())
            .sum();
        let wanted_backends: usize = vips.iter().map(|v| v.backends.len()).sum();
        let freed_backends: usize =
            self.vips.values().map(|v| v.backends.len()).sum::<usize>() - kept_backends;
        if wanted_backends > self.backend_ids.available() + kept_backends + freed_backends {
            return Err(BalancerError::IdsExhausted {
                what: "backend",
                max: MAX_BACKENDS,
            });
        }

        // Removed VIPs go first (one index swap), freeing ids for the rest.
        let gone: Vec<Endpoint> = self
            .vips
            .keys()
            .filter(|e| !desired.contains_key(e))
            .copied()
            .collect();
        if !gone.is_empty() {
            self.remove_vips(&gone)?;
            report.vips_removed = gone.len();
        }

        self.build_time = Duration::ZERO;
        self.publish_time = Duration::ZERO;
        let mut staged = Vec::new();
        for (endpoint, config) in &desired {
            if let Some(stage) = self.stage_vip(endpoint, config, macs)? {
                staged.push(stage);
            }
        }
        report.vips_added = staged.iter().filter(|s| s.is_new).count();
        report.vips_updated = staged.len() - report.vips_added;
        self.commit(staged, &mut report)?;
        report.table_build_time = self.build_time;
        report.table_publish_time = self.publish_time;
        Ok(report)
    }

    fn next_generation(&mut self) -> u32 {
        let g = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        g
    }

    fn new_backend(
        &mut self,
        vip_id: u32,
        vip: &VipConfig,
        config: &BackendConfig,
        mac: MacAddr,
        healthy: bool,
    ) -> Result<BackendState, BalancerError> {
        let id = self.backend_ids.take().ok_or(BalancerError::IdsExhausted {
            what: "backend",
            max: MAX_BACKENDS,
        })?;
        let state = BackendState {
            id,
            address: config.address,
            weight: config.weight,
            drained: config.drained,
            healthy,
            dynamic_weight: None,
            fleet_weight: None,
            mac,
            generation: self.next_generation(),
            tier: self.tier_id(config.tier.as_deref()),
        };
        // A fresh id counts no active flows (its previous holder's may linger).
        let written = self.dataplane.reset_active(id).and_then(|()| {
            self.dataplane
                .set_backend(id, &backend_entry(vip_id, vip, &state))
        });
        if let Err(e) = written {
            self.backend_ids.give_back(id);
            tracing::error!(vip = %vip.name, backend = %config.address, "writing backend failed: {e}");
            return Err(e.into());
        }
        Ok(state)
    }

    fn take_retiring(&mut self, endpoint: &Endpoint, address: IpAddr) -> Option<BackendState> {
        let at = self
            .retiring
            .iter()
            .position(|r| r.vip == *endpoint && r.state.address == address)?;
        Some(self.retiring.swap_remove(at).state)
    }

    fn retire_backend(&mut self, b: &BackendState) -> Result<(), BalancerError> {
        // Inactive: flows pinned to it are re-hashed on their next packet.
        self.dataplane.set_backend(b.id, &Backend::default())?;
        self.backend_ids.give_back(b.id);
        Ok(())
    }

    fn mac_of(
        vip: &VipConfig,
        address: IpAddr,
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<MacAddr, BalancerError> {
        vip.backends
            .iter()
            .find(|b| b.address == address)
            .and_then(|b| b.mac)
            .or_else(|| macs.get(&address).copied())
            .ok_or(BalancerError::NoMac {
                vip: vip.name.clone(),
                backend: address,
            })
    }

    /// Works out what `config` changes for one VIP and does the parts no packet can see yet:
    /// allocates ids, writes new backend entries, builds the table. `None` if nothing changes.
    fn stage_vip(
        &mut self,
        endpoint: &Endpoint,
        config: &VipConfig,
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<Option<StagedVip>, BalancerError> {
        let current = self.vips.get(endpoint).cloned();
        let is_new = current.is_none();
        let id = match &current {
            Some(c) => c.id,
            None => self.vip_ids.take().ok_or(BalancerError::IdsExhausted {
                what: "VIP",
                max: MAX_VIPS,
            })?,
        };
        let old_backends = current
            .as_ref()
            .map(|c| c.backends.clone())
            .unwrap_or_default();
        let mut backends = BTreeMap::new();
        let mut added = 0;
        let mut deactivate = Vec::new();
        let mut reweighted = Vec::new();
        for b in &config.backends {
            // The configured MAC, else the resolved one, else the one in force.
            let mac = match Self::mac_of(config, b.address, macs) {
                Ok(mac) => mac,
                Err(e) => old_backends.get(&b.address).map(|o| o.mac).ok_or(e)?,
            };
            let healthy = !self.unhealthy.contains(&(*endpoint, b.address));
            let previous = match old_backends.get(&b.address) {
                Some(old) => Some(old.clone()),
                None => {
                    added += 1;
                    // Back within its grace period: same slot, its flows continue.
                    self.take_retiring(endpoint, b.address)
                }
            };
            let dynamic = config.policy.kind != crate::policy::PolicyKind::Static;
            let state = match previous {
                Some(old) => {
                    let mut state = BackendState {
                        weight: b.weight,
                        drained: b.drained,
                        healthy,
                        dynamic_weight: old.dynamic_weight.filter(|_| dynamic),
                        mac,
                        tier: self.tier_id(b.tier.as_deref()),
                        ..old.clone()
                    };
                    if healthy && !old.healthy {
                        // Back from failing checks: a new generation, so flows the kernel still
                        // pins to its old self are re-hashed rather than resurrected.
                        state.generation = self.next_generation();
                        self.dataplane
                            .set_backend(state.id, &backend_entry(id, config, &state))?;
                    } else if !healthy && old.healthy {
                        // Deactivated after the table without it is live.
                        deactivate.push(state.clone());
                    } else if state.mac != old.mac {
                        // New next hop: same id and generation, so its flows stay.
                        self.dataplane
                            .set_backend(state.id, &backend_entry(id, config, &state))?;
                    } else if state.table_weight() != old.table_weight() {
                        // The new weight is written once the table with it is live.
                        reweighted.push(state.clone());
                    }
                    state
                }
                None => self.new_backend(id, config, b, mac, healthy)?,
            };
            backends.insert(b.address, state);
        }
        let retired: Vec<BackendState> = old_backends
            .values()
            .filter(|old| !backends.contains_key(&old.address))
            .cloned()
            .collect();
        let meta = vip_meta(id, config);
        let meta_changed = current
            .as_ref()
            .is_none_or(|c| vip_meta(id, &c.config) != meta);
        let weights_changed = backends.values().any(|b| {
            old_backends
                .get(&b.address)
                .is_some_and(|old| old.table_weight() != b.table_weight() || old.tier != b.tier)
        });
        let resized = current
            .as_ref()
            .is_some_and(|c| c.config.table_size != config.table_size);
        let rebuild = is_new || added > 0 || !retired.is_empty() || weights_changed || resized;
        // A new scheduler may need another schedule, new tier settings another header: the
        // table is published again.
        let spill = if backends.values().any(|b| b.tier != 0) {
            self.tier_spill
        } else {
            0
        };
        let rescheduled = current
            .as_ref()
            .is_some_and(|c| c.config.scheduler != config.scheduler || c.spill != spill);
        // Counting active flows starts or stops: the counts start from zero (flows recorded
        // before are not in them; their ends are not subtracted, see `FlowValue::counted`).
        let counting_changed = current.as_ref().is_some_and(|c| {
            vip_meta(id, &c.config).counts_active() != vip_meta(id, config).counts_active()
        });
        if counting_changed {
            for b in backends.values() {
                if old_backends.contains_key(&b.address) {
                    self.dataplane.reset_active(b.id)?;
                }
            }
        }
        let config_changed = current.as_ref().is_none_or(|c| c.config != *config);
        let health_changed = backends.values().any(|b| {
            old_backends
                .get(&b.address)
                .is_some_and(|old| old.healthy != b.healthy)
        });
        if !rebuild && !rescheduled && !meta_changed && !config_changed && !health_changed {
            return Ok(None);
        }
        let table = if rebuild {
            Some(self.build(&config.name, config.table_size, &backends)?)
        } else {
            None
        };
        let tier_tables = match (&table, &current) {
            (None, Some(c)) => c.tier_tables.clone(),
            _ => build_tier_tables(&config.name, config.table_size, &backends)?,
        };
        let slots_changed = match (&current, &table) {
            (Some(c), Some((t, _))) if !resized => maglev::slots_changed(&c.table, t),
            (_, Some((t, _))) => t.len(),
            (_, None) => 0,
        };
        let (old_table, old_fingerprint) = current
            .map(|c| (c.table, c.fingerprint))
            .unwrap_or_default();
        let shrinks = resized && (config.table_size as usize) < old_table.len();
        let (table, fingerprint, table_changed) = match table {
            Some((t, f)) => (t, f, true),
            None => (old_table, old_fingerprint, rescheduled),
        };
        Ok(Some(StagedVip {
            endpoint: *endpoint,
            is_new,
            added,
            retired,
            deactivate,
            reweighted,
            meta_changed,
            shrinks,
            table_changed,
            slots_changed,
            state: VipState {
                id,
                config: config.clone(),
                backends,
                table,
                fingerprint,
                tier_tables,
                spill,
            },
        }))
    }

    /// Makes staged VIPs visible, in an order no packet can catch half-done, with one atomic
    /// swap per kind of change: shrinking metas, then all new tables, then the VIP index (new
    /// VIPs, changed metas, new address markers), then the removed backends retire.
    fn commit(
        &mut self,
        staged: Vec<StagedVip>,
        report: &mut ApplyReport,
    ) -> Result<(), BalancerError> {
        let key_of = |s: &StagedVip| {
            let c = &s.state.config;
            vip_key(c.address, c.port, c.protocol.number())
        };
        let shrinking: Vec<(VipKey, VipMeta)> = staged
            .iter()
            .filter(|s| s.shrinks)
            .map(|s| (key_of(s), vip_meta(s.state.id, &s.state.config)))
            .collect();
        if !shrinking.is_empty() {
            // A smaller table size goes first: the old (larger) table still covers it.
            self.dataplane.set_vips(&shrinking, &[])?;
        }
        let published: Vec<(u32, Vec<u32>)> = staged
            .iter()
            .filter(|s| s.table_changed)
            .map(|s| (s.state.id, s.state.published()))
            .collect();
        let tables: Vec<(u32, &[u32])> = published
            .iter()
            .map(|(id, t)| (*id, t.as_slice()))
            .collect();
        if !tables.is_empty() {
            let started = Instant::now();
            self.dataplane.publish_tables(&tables)?;
            self.publish_time += started.elapsed();
        }
        let mut upserts: Vec<(VipKey, VipMeta)> = staged
            .iter()
            .filter(|s| s.meta_changed && !s.shrinks)
            .map(|s| (key_of(s), vip_meta(s.state.id, &s.state.config)))
            .collect();
        for s in staged.iter().filter(|s| s.is_new) {
            let users = self
                .address_users
                .entry(s.state.config.address)
                .or_insert(0);
            *users += 1;
            if *users == 1 {
                upserts.push((vip_key(s.state.config.address, 0, 0), address_marker()));
            }
        }
        if !upserts.is_empty() {
            self.dataplane.set_vips(&upserts, &[])?;
        }
        let until = Instant::now() + self.removal_grace;
        for s in staged {
            report.tables_published += usize::from(s.table_changed);
            report.slots_changed += s.slots_changed;
            if s.table_changed {
                report.rebuilt.push(s.state.config.name.clone());
            }
            for b in s.deactivate.iter().chain(&s.reweighted) {
                self.dataplane
                    .set_backend(b.id, &backend_entry(s.state.id, &s.state.config, b))?;
            }
            for b in &s.retired {
                if self.removal_grace.is_zero() {
                    self.retire_backend(b)?;
                } else {
                    self.retiring.push(RetiringBackend {
                        vip: s.endpoint,
                        state: b.clone(),
                        until,
                    });
                }
            }
            let c = &s.state.config;
            if s.is_new {
                tracing::info!(
                    vip = %c.name,
                    endpoint = %format!("{}/{}", std::net::SocketAddr::new(c.address, c.port), c.protocol),
                    backends = s.state.backends.len(),
                    forwarding = %c.forwarding,
                    "VIP added"
                );
            } else {
                tracing::info!(
                    vip = %c.name,
                    backends = s.state.backends.len(),
                    added = s.added,
                    removed = s.retired.len(),
                    slots_changed = s.slots_changed,
                    "VIP updated"
                );
            }
            self.vips.insert(s.endpoint, s.state);
        }
        Ok(())
    }

    /// Removes VIPs: their index entries (and address markers no VIP uses any more) in one
    /// swap, then their tables, then their backends.
    fn remove_vips(&mut self, endpoints: &[Endpoint]) -> Result<(), BalancerError> {
        let mut removals = Vec::new();
        let mut removed = Vec::new();
        for endpoint in endpoints {
            let Some(vip) = self.vips.remove(endpoint) else {
                continue;
            };
            removals.push(vip_key(
                vip.config.address,
                vip.config.port,
                vip.config.protocol.number(),
            ));
            if let Some(users) = self.address_users.get_mut(&vip.config.address) {
                *users -= 1;
                if *users == 0 {
                    self.address_users.remove(&vip.config.address);
                    removals.push(vip_key(vip.config.address, 0, 0));
                }
            }
            removed.push(vip);
        }
        self.dataplane.set_vips(&[], &removals)?;
        let ids: Vec<u32> = removed.iter().map(|v| v.id).collect();
        self.dataplane.clear_tables(&ids)?;
        for vip in removed {
            for b in vip.backends.values() {
                self.retire_backend(b)?;
            }
            let endpoint = vip.config.endpoint();
            let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring)
                .into_iter()
                .partition(|r| r.vip == endpoint);
            self.retiring = others;
            for r in &mine {
                self.retire_backend(&r.state)?;
            }
            self.vip_ids.give_back(vip.id);
            tracing::info!(vip = %vip.config.name, "VIP removed");
        }
        Ok(())
    }
}

/// What `apply` will change for one VIP, prepared before anything becomes visible.
struct StagedVip {
    endpoint: Endpoint,
    is_new: bool,
    added: usize,
    retired: Vec<BackendState>,
    /// Backends that failed their health checks: made inactive once the table is live.
    deactivate: Vec<BackendState>,
    /// Backends whose weight changed: rewritten once the table is live.
    reweighted: Vec<BackendState>,
    meta_changed: bool,
    shrinks: bool,
    table_changed: bool,
    slots_changed: usize,
    state: VipState,
}

/// The VIP-index value of an address marker.
fn address_marker() -> VipMeta {
    VipMeta {
        vip_id: u32::MAX,
        ..VipMeta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendConfig, Config};
    use crate::dataplane::memory::MemoryDataplane;

    fn config(text: &str) -> Config {
        Config::parse(&format!("interface = \"eth0\"\n{text}")).unwrap()
    }

    fn two_vips() -> Config {
        config(
            r#"
[[vip]]
name = "web"
address = "10.100.0.1"
port = 80
[[vip.backend]]
address = "10.0.0.11"
[[vip.backend]]
address = "10.0.0.12"
weight = 3
[[vip]]
name = "dns"
address = "10.100.0.1"
port = 53
protocol = "udp"
forwarding = "gue"
table_size = 13
[[vip.backend]]
address = "10.0.0.11"
mac = "02:00:00:00:00:99"
"#,
        )
    }

    fn macs() -> HashMap<IpAddr, MacAddr> {
        (1..=20u8)
            .map(|i| {
                (
                    IpAddr::from([10, 0, 0, 10 + i]),
                    MacAddr([2, 0, 0, 0, 0, 10 + i]),
                )
            })
            .collect()
    }

    fn balancer() -> Balancer<MemoryDataplane> {
        Balancer::new(MemoryDataplane::default())
    }

    #[test]
    fn apply_writes_vips_backends_tables_and_address_markers() {
        let mut lb = balancer();
        let report = lb.apply(&two_vips().vips, &macs()).unwrap();
        assert_eq!(report.vips_added, 2);
        let dp = lb.dataplane();
        // Two VIP entries plus one shared address marker.
        assert_eq!(dp.vips.len(), 3);
        assert!(
            dp.vips
                .contains_key(&vip_key("10.100.0.1".parse().unwrap(), 0, 0))
        );
        let web = lb.vip("web").unwrap();
        let meta = dp.vips[&vip_key("10.100.0.1".parse().unwrap(), 80, 6)];
        assert_eq!(meta.vip_id, web.id);
        assert_eq!(meta.table_size, 65_537);
        // The published table: the Maglev slots, then the schedule (both backends listed).
        let published = &dp.tables[&web.id];
        assert_eq!(&published[..web.table.len()], web.table.as_slice());
        assert_eq!(
            published[web.table.len()..].len(),
            balancer_common::schedule::HEADER as usize + 2
        );
        assert_eq!(published[web.table.len()], 2);
        assert_eq!(published[web.table.len() + 2], 4, "total weight 1 + 3");
        // Shares follow weights 1:3.
        let shares = web.slot_shares();
        let a = shares[&"10.0.0.11".parse::<IpAddr>().unwrap()] as f64;
        let b = shares[&"10.0.0.12".parse::<IpAddr>().unwrap()] as f64;
        assert!((b / a - 3.0).abs() < 0.01, "shares {a} {b}");
        // The configured MAC wins over the neighbour table; ids are per (VIP, backend).
        let dns = lb.vip("dns").unwrap();
        let b11 = &dns.backends[&"10.0.0.11".parse::<IpAddr>().unwrap()];
        assert_eq!(dp.backends[&b11.id].mac, [2, 0, 0, 0, 0, 0x99]);
        assert_ne!(
            b11.id,
            web.backends[&"10.0.0.11".parse::<IpAddr>().unwrap()].id
        );
        assert_eq!(
            dp.vips[&vip_key("10.100.0.1".parse().unwrap(), 53, 17)].mode,
            ForwardMode::Gue as u8
        );
        assert_eq!(
            dp.vips[&vip_key("10.100.0.1".parse().unwrap(), 53, 17)].gue_port,
            6080u16.to_be()
        );
    }

    #[test]
    fn changes_reach_the_kernel_in_batches() {
        let mut lb = balancer();
        lb.apply(&two_vips().vips, &macs()).unwrap();
        // Adding two VIPs: one swap of all tables, then one of the index.
        assert_eq!(
            (lb.dataplane().table_swaps, lb.dataplane().index_swaps),
            (1, 1)
        );
        let mut cfg = two_vips();
        cfg.vips[0].backends[0].weight = 7;
        cfg.vips[1].backends[0].weight = 9;
        let report = lb.apply(&cfg.vips, &macs()).unwrap();
        assert_eq!(report.tables_published, 2);
        // Weights of two VIPs: one more table swap, no index swap.
        assert_eq!(
            (lb.dataplane().table_swaps, lb.dataplane().index_swaps),
            (2, 1)
        );
    }

    #[test]
    fn applying_the_same_config_twice_changes_nothing() {
        let mut lb = balancer();
        lb.apply(&two_vips().vips, &macs()).unwrap();
        let publishes = lb.dataplane().publishes;
        let report = lb.apply(&two_vips().vips, &macs()).unwrap();
        assert_eq!(report, ApplyReport::default());
        assert_eq!(lb.dataplane().publishes, publishes);
    }

    #[test]
    fn removing_a_backend_retires_it_and_keeps_the_others() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        let before = lb.vip("web").unwrap().clone();
        let gone = before.backends[&"10.0.0.11".parse::<IpAddr>().unwrap()].clone();
        let kept = before.backends[&"10.0.0.12".parse::<IpAddr>().unwrap()].clone();
        cfg.vips[0].backends.remove(0);
        let report = lb.apply(&cfg.vips, &macs()).unwrap();
        assert_eq!(report.vips_updated, 1);
        let dp = lb.dataplane();
        assert_eq!(
            dp.backends[&gone.id].flags, 0,
            "removed backend still active"
        );
        assert_eq!(dp.backends[&kept.id].flags, BACKEND_F_ACTIVE);
        assert_eq!(
            dp.backends[&kept.id].generation, kept.generation,
            "survivor's flows must stay"
        );
        let web = lb.vip("web").unwrap();
        assert!(web.table.iter().all(|&id| id == kept.id));
    }

    #[test]
    fn a_removed_backend_serves_its_flows_through_the_grace_period() {
        let mut lb = balancer();
        lb.set_removal_grace(Duration::from_secs(60));
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        let gone = lb.vip("web").unwrap().backends[&"10.0.0.11".parse::<IpAddr>().unwrap()].clone();
        cfg.vips[0].backends.remove(0);
        lb.apply(&cfg.vips, &macs()).unwrap();
        assert!(
            !lb.vip("web").unwrap().table.contains(&gone.id),
            "removed backend still in the table"
        );
        assert_eq!(
            lb.dataplane().backends[&gone.id].flags,
            BACKEND_F_ACTIVE,
            "flows cut before the grace period"
        );
        assert_eq!(lb.retiring().len(), 1);
        // Not yet.
        assert_eq!(lb.expire_retired(Instant::now()).unwrap(), 0);
        // Re-added within the grace period: same slot and generation, so flows continue.
        let mut back = cfg.clone();
        back.vips[0]
            .backends
            .insert(0, two_vips().vips[0].backends[0].clone());
        lb.apply(&back.vips, &macs()).unwrap();
        assert_eq!(lb.vip("web").unwrap().backends[&gone.address], gone);
        assert!(lb.retiring().is_empty());
        // Removed again, and the grace period passes.
        lb.apply(&cfg.vips, &macs()).unwrap();
        assert_eq!(
            lb.expire_retired(Instant::now() + Duration::from_secs(61))
                .unwrap(),
            1
        );
        assert_eq!(lb.dataplane().backends[&gone.id].flags, 0);
    }

    #[test]
    fn unhealthy_backends_leave_the_table_and_are_deactivated_until_they_recover() {
        let mut lb = balancer();
        lb.apply(&two_vips().vips, &macs()).unwrap();
        let web = lb.vip("web").unwrap().clone();
        let endpoint = web.config.endpoint();
        let sick: IpAddr = "10.0.0.12".parse().unwrap();
        let before = web.backends[&sick].clone();
        assert!(lb.set_health(&endpoint, sick, false).unwrap());
        assert!(
            !lb.set_health(&endpoint, sick, false).unwrap(),
            "no change the second time"
        );
        let web = lb.vip("web").unwrap();
        assert!(
            !web.table.contains(&before.id),
            "unhealthy backend still in the table"
        );
        assert_eq!(
            lb.dataplane().backends[&before.id].flags,
            0,
            "its flows must be re-hashed"
        );
        // A config apply keeps it out.
        lb.apply(&two_vips().vips, &macs()).unwrap();
        assert!(!lb.vip("web").unwrap().table.contains(&before.id));
        // Recovery: back in the table, active, with a new generation.
        assert!(lb.set_health(&endpoint, sick, true).unwrap());
        let back = &lb.vip("web").unwrap().backends[&sick];
        assert!(lb.vip("web").unwrap().table.contains(&back.id));
        assert_eq!(lb.dataplane().backends[&back.id].flags, BACKEND_F_ACTIVE);
        assert_ne!(back.generation, before.generation);
    }

    #[test]
    fn dynamic_weights_replace_configured_ones_until_the_policy_is_static() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        cfg.vips[0].policy.kind = crate::policy::PolicyKind::LeastConn;
        lb.apply(&cfg.vips, &macs()).unwrap();
        let endpoint = cfg.vips[0].endpoint();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap());
        let report = lb
            .set_dynamic_weights(&endpoint, &[(a, 900), (b, 100)])
            .unwrap();
        assert_eq!(report.tables_published, 1);
        let shares = lb.vip("web").unwrap().slot_shares();
        assert!((shares[&a] as f64 / 65_537.0 - 0.9).abs() < 0.001);
        // Same weights again: nothing to publish.
        assert_eq!(
            lb.set_dynamic_weights(&endpoint, &[(a, 900), (b, 100)])
                .unwrap()
                .tables_published,
            0
        );
        // A config apply keeps them; a static policy drops them.
        lb.apply(&cfg.vips, &macs()).unwrap();
        assert_eq!(
            lb.vip("web").unwrap().backends[&a].dynamic_weight,
            Some(900)
        );
        cfg.vips[0].policy.kind = crate::policy::PolicyKind::Static;
        lb.apply(&cfg.vips, &macs()).unwrap();
        let shares = lb.vip("web").unwrap().slot_shares();
        assert!(
            (shares[&b] as f64 / shares[&a] as f64 - 3.0).abs() < 0.01,
            "configured 1:3 back"
        );
    }

    #[test]
    fn fleet_weights_give_every_balancer_the_leaders_table() {
        // The leader sees backend .12 down and reweights .11; the follower sees all healthy.
        let cfg = two_vips();
        let mut leader = balancer();
        leader.apply(&cfg.vips, &macs()).unwrap();
        let endpoint = cfg.vips[0].endpoint();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap());
        leader.set_health(&endpoint, b, false).unwrap();
        leader.set_dynamic_weights(&endpoint, &[(a, 700)]).unwrap();
        let mut follower = balancer();
        follower.apply(&cfg.vips, &macs()).unwrap();
        let fingerprint = |lb: &Balancer<MemoryDataplane>| lb.vip("web").unwrap().fingerprint;
        assert_ne!(fingerprint(&leader), fingerprint(&follower));
        let published = crate::fleet::local_weights(&leader);
        assert_eq!(published["web"][&b], 0);
        let report = follower.set_fleet_weights(Some(&published)).unwrap();
        assert!(report.tables_published >= 1);
        assert_eq!(fingerprint(&leader), fingerprint(&follower));
        assert_eq!(
            follower.vip("web").unwrap().table,
            leader.vip("web").unwrap().table
        );
        // The same state again changes nothing; a VIP it does not name keeps local weights.
        assert_eq!(
            follower
                .set_fleet_weights(Some(&published))
                .unwrap()
                .tables_published,
            0
        );
        let mut partial = published.clone();
        partial.remove("web");
        follower.set_fleet_weights(Some(&partial)).unwrap();
        assert_ne!(fingerprint(&leader), fingerprint(&follower));
        // Back to its own view.
        follower.set_fleet_weights(Some(&published)).unwrap();
        follower.set_fleet_weights(None).unwrap();
        let mut fresh = balancer();
        fresh.apply(&cfg.vips, &macs()).unwrap();
        assert_eq!(fingerprint(&follower), fingerprint(&fresh));
    }

    #[test]
    fn a_drained_backend_keeps_its_weight_for_undrain() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        cfg.vips[0].backends[1].drained = true;
        lb.apply(&cfg.vips, &macs()).unwrap();
        let web = lb.vip("web").unwrap();
        let b = &web.backends[&"10.0.0.12".parse::<IpAddr>().unwrap()];
        assert!(!web.table.contains(&b.id));
        assert_eq!(b.weight, 3);
        assert_eq!(lb.dataplane().backends[&b.id].flags, BACKEND_F_ACTIVE);
        cfg.vips[0].backends[1].drained = false;
        lb.apply(&cfg.vips, &macs()).unwrap();
        let shares = lb.vip("web").unwrap().slot_shares();
        let (a, b) = (
            shares[&"10.0.0.11".parse::<IpAddr>().unwrap()] as f64,
            shares[&"10.0.0.12".parse::<IpAddr>().unwrap()] as f64,
        );
        assert!((b / a - 3.0).abs() < 0.01, "weights 1:3 restored: {a} {b}");
    }

    #[test]
    fn drain_keeps_the_backend_active_but_out_of_the_table() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        cfg.vips[0].backends[1].weight = 0;
        lb.apply(&cfg.vips, &macs()).unwrap();
        let web = lb.vip("web").unwrap();
        let drained = &web.backends[&"10.0.0.12".parse::<IpAddr>().unwrap()];
        assert!(!web.table.contains(&drained.id));
        assert_eq!(lb.dataplane().backends[&drained.id].flags, BACKEND_F_ACTIVE);
    }

    #[test]
    fn removing_a_vip_clears_everything_it_owned() {
        let mut lb = balancer();
        let cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        let web_id = lb.vip("web").unwrap().id;
        lb.apply(&cfg.vips[1..], &macs()).unwrap();
        let dp = lb.dataplane();
        assert!(!dp.tables.contains_key(&web_id));
        // The address marker stays while "dns" uses the address.
        assert_eq!(dp.vips.len(), 2);
        lb.apply(&[], &macs()).unwrap();
        let dp = lb.dataplane();
        assert!(dp.vips.is_empty() && dp.tables.is_empty());
        assert!(dp.backends.values().all(|b| b.flags == 0));
    }

    #[test]
    fn a_missing_mac_is_refused_before_anything_is_written() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        cfg.vips[0].backends.push(BackendConfig {
            address: "192.0.2.1".parse().unwrap(),
            weight: 1,
            drained: false,
            mac: None,
            tier: None,
            from_pool: None,
        });
        let err = lb.apply(&cfg.vips, &macs()).unwrap_err();
        assert!(err.to_string().contains("192.0.2.1"), "{err}");
        assert!(lb.dataplane().vips.is_empty() && lb.dataplane().backends.is_empty());
    }

    #[test]
    fn resizing_a_table_rebuilds_it_at_the_new_size() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        cfg.vips[0].table_size = 13;
        lb.apply(&cfg.vips, &macs()).unwrap();
        let web = lb.vip("web").unwrap();
        assert_eq!(web.table.len(), 13);
        assert_eq!(
            lb.dataplane().tables[&web.id].len(),
            13 + balancer_common::schedule::HEADER as usize + web.backends.len()
        );
        assert_eq!(
            lb.dataplane().vips[&vip_key("10.100.0.1".parse().unwrap(), 80, 6)].table_size,
            13
        );
    }

    #[test]
    fn a_snapshot_restores_the_same_bookkeeping_without_kernel_writes() {
        let mut lb = balancer();
        lb.set_removal_grace(Duration::from_secs(60));
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        lb.set_health(&cfg.vips[0].endpoint(), "10.0.0.12".parse().unwrap(), false)
            .unwrap();
        cfg.vips[1].backends.clear();
        lb.apply(&cfg.vips, &macs()).unwrap();
        let snapshot = lb.snapshot();
        let json = serde_json::to_string(&snapshot).unwrap();
        let restored = Balancer::restore(
            MemoryDataplane::default(),
            &serde_json::from_str(&json).unwrap(),
        )
        .unwrap();
        assert!(
            restored.dataplane().backends.is_empty(),
            "restore must not write the kernel"
        );
        for (a, b) in lb.vips().zip(restored.vips()) {
            assert_eq!(a.id, b.id);
            assert_eq!(a.config, b.config);
            assert_eq!(a.backends, b.backends);
            assert_eq!(a.table, b.table);
        }
        assert_eq!(restored.retiring().len(), 1);
        // Carrying on: the same config changes nothing; new ids do not collide.
        let mut restored = restored;
        let report = restored.apply(&cfg.vips, &macs()).unwrap();
        assert_eq!(report.tables_published, 0);
        cfg.vips[1].backends.push(BackendConfig {
            address: "10.0.0.15".parse().unwrap(),
            weight: 1,
            drained: false,
            mac: None,
            tier: None,
            from_pool: None,
        });
        restored.apply(&cfg.vips, &macs()).unwrap();
        let ids: HashSet<u32> = restored
            .vips()
            .flat_map(|v| v.backends.values().map(|b| b.id))
            .chain(restored.retiring().iter().map(|r| r.state.id))
            .collect();
        assert_eq!(ids.len(), 4, "ids collided after restore");
    }

    #[test]
    fn ids_are_reused_last() {
        let mut pool = IdPool::new(3);
        let a = pool.take().unwrap();
        pool.give_back(a);
        assert_ne!(pool.take(), Some(a));
    }
}
