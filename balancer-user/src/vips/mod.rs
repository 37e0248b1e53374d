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

mod admission;
mod apply;
mod bound;
mod fair;
mod homes;
mod snapshot;
mod tables;
mod weights;

pub use bound::BoundShares;
pub use fair::{FairState, water_fill};
pub use homes::HomeReading;
pub use snapshot::{BackendSnapshot, RestoreError, RetiringSnapshot, Snapshot, VipSnapshot};
pub use tables::{build_table, build_tier_tables};

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use balancer_common::maglev::{self, MaglevError};
use balancer_common::maps::{
    Admission, GlobalConfig, MAX_BACKENDS, MAX_VIPS, NatLinks, SnatSource, SourcePrefix,
};
use balancer_common::schedule;
use balancer_common::stats::{GlobalStats, TrafficStats};

use crate::base::config::VipConfig;
use crate::base::net::MacAddr;
use crate::dataplane::{Dataplane, DataplaneError};

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

pub use crate::base::net::Endpoint;

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
    /// The weight a telemetry policy computed, in place of `weight` (see [`crate::steering::policy`]).
    pub policy_weight: Option<u32>,
    /// The weight the fleet's leader published for it (see [`crate::steering::fleet`]), in place of
    /// everything local: every balancer of a fleet builds its table from the same weights.
    pub fleet_weight: Option<u32>,
    pub mac: MacAddr,
    pub generation: u32,
    /// The priority tier it is dedicated to (0: the shared pool).
    pub tier: u8,
    /// Its averaged share of its pool's weights as written for bounded load (see [`bound`];
    /// 0 until its VIP has a bound and a share was worked out).
    pub bound_share: u16,
    /// The telemetry policy expects its returning clients to be served sooner elsewhere this
    /// round (written as `BACKEND_F_RETURNING_ELSEWHERE` where the VIP has session
    /// persistence; see [`crate::steering::policy::Decision::returning_elsewhere`]).
    pub returning_elsewhere: bool,
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
            self.policy_weight.unwrap_or(self.weight)
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
    /// Host-independent fingerprint of the table: [`VipState::fingerprint`].
    pub(crate) fingerprint: tables::Fingerprint,
    /// Maglev tables of the priority tiers the VIP dedicates backends to.
    pub tier_tables: BTreeMap<u8, Vec<u32>>,
    /// Tiers that spill into the shared pool, as published.
    pub spill: u8,
    /// Admission control holds the shared pool saturated (as published; always false for a
    /// VIP without admission control).
    pub saturated: bool,
    /// The backends' weight shares averaged for bounded load (see [`bound`]).
    pub bound: BoundShares,
}

impl VipState {
    /// Host-independent fingerprint of the table (see `maglev::fingerprint`).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint.value(&self.table)
    }

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
    tiers: Vec<crate::base::config::TierConfig>,
    tier_spill: u8,
    /// Time spent building and publishing tables since the last `apply` began.
    build_time: Duration,
    publish_time: Duration,
    /// The source NAT each VIP should have (none: absent), and what is written per VIP id.
    snat_plan: HashMap<Endpoint, SnatSource>,
    snat_written: HashMap<u32, SnatSource>,
    /// The source prefix written per VIP id.
    prefix_written: HashMap<u32, SourcePrefix>,
    /// The admission control written per VIP id.
    admission_written: HashMap<u32, Admission>,
    /// Fair admission's measurements, and the tenants' rates written, per VIP id.
    fair: HashMap<u32, FairState>,
    fair_written: HashMap<u32, balancer_common::maps::FairAdmission>,
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
            snat_plan: HashMap::new(),
            snat_written: HashMap::new(),
            prefix_written: HashMap::new(),
            admission_written: HashMap::new(),
            fair: HashMap::new(),
            fair_written: HashMap::new(),
        }
    }

    /// Builds a VIP's table, timing it.
    pub(super) fn build(
        &mut self,
        name: &str,
        table_size: u32,
        backends: &BTreeMap<IpAddr, BackendState>,
    ) -> Result<(Vec<u32>, tables::Fingerprint), BalancerError> {
        let started = Instant::now();
        let built = build_table(name, table_size, backends);
        self.build_time += started.elapsed();
        built
    }

    /// Makes `tiers` the priority tiers in force: the data plane's client classification
    /// (source prefixes, DSCP) is rewritten when they change. Call before [`Balancer::apply`],
    /// which places backends in their tiers' pools.
    pub fn set_tiers(
        &mut self,
        tiers: &[crate::base::config::TierConfig],
    ) -> Result<(), BalancerError> {
        if self.tiers == tiers {
            return Ok(());
        }
        // A change of shares or rate limits alone leaves the classification as it is (it
        // reaches the data plane through the VIPs' admission entries).
        let classes = |t: &[crate::base::config::TierConfig]| {
            t.iter()
                .map(|t| (t.id, t.prefixes.clone(), t.dscp.clone()))
                .collect::<Vec<_>>()
        };
        if classes(&self.tiers) == classes(tiers) {
            self.tiers = tiers.to_vec();
            self.tier_spill = spill_of(tiers);
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
        self.tier_spill = spill_of(tiers);
        Ok(())
    }

    pub(super) fn tier_id(&self, name: Option<&str>) -> u8 {
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

    /// The data plane's word of paced VIPs' scrapes due, handed over once (see
    /// [`Dataplane::take_scrape_due`]).
    pub fn take_scrape_due(&mut self) -> Option<crate::dataplane::ScrapeDue> {
        self.dataplane.take_scrape_due()
    }

    pub fn dataplane(&self) -> &D {
        &self.dataplane
    }

    /// Sets the source NAT of the VIPs (by endpoint; the rest have none), written by the next
    /// [`Balancer::apply`].
    pub fn set_snat_sources(&mut self, plan: HashMap<Endpoint, SnatSource>) {
        self.snat_plan = plan;
    }

    /// Writes the links NAT forwarding sends frames on (see [`NatLinks`]).
    pub fn set_nat_links(&mut self, links: &NatLinks) -> Result<(), BalancerError> {
        Ok(self.dataplane.set_nat_links(links)?)
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
}

#[cfg(test)]
mod tests;

/// The tiers that spill into the shared pool (bit `id`).
fn spill_of(tiers: &[crate::base::config::TierConfig]) -> u8 {
    tiers
        .iter()
        .filter(|t| t.spillover)
        .fold(0, |m, t| m | 1 << t.id)
}
