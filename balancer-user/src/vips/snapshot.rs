//! The bookkeeping that goes with the pinned maps: saved after every change, and restored
//! by a daemon that adopts a running program, with no kernel write.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use balancer_common::maps::LAYOUT;

use crate::dataplane::Dataplane;

use super::tables::{build_table, build_tier_tables};
use super::{BackendState, Balancer, RetiringBackend, VipState};

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
    pub config: crate::base::config::RawVip,
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
    /// Written as `dynamic_weight` by builds before the rename; read under either name.
    #[serde(default, alias = "dynamic_weight")]
    pub policy_weight: Option<u32>,
    #[serde(default)]
    pub fleet_weight: Option<u32>,
    pub mac: String,
    pub generation: u32,
    #[serde(default)]
    pub tier: u8,
    /// Its averaged weight share as written (see [`BackendState::bound_share`]).
    #[serde(default)]
    pub bound_share: u16,
    /// Its returning clients sent elsewhere, as written (see
    /// [`BackendState::returning_elsewhere`]): restored so that the next round lifts a flag
    /// the kernel still holds.
    #[serde(default)]
    pub returning_elsewhere: bool,
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

impl<D: Dataplane> Balancer<D> {
    /// The bookkeeping a restarted daemon needs to carry on with the pinned maps.
    pub fn snapshot(&self) -> Snapshot {
        let backend = |b: &BackendState| BackendSnapshot {
            id: b.id,
            address: b.address,
            weight: b.weight,
            drained: b.drained,
            healthy: b.healthy,
            policy_weight: b.policy_weight,
            fleet_weight: b.fleet_weight,
            mac: b.mac.to_string(),
            generation: b.generation,
            tier: b.tier,
            bound_share: b.bound_share,
            returning_elsewhere: b.returning_elsewhere,
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
                policy_weight: b.policy_weight,
                fleet_weight: b.fleet_weight,
                mac: b.mac.parse().map_err(RestoreError::Invalid)?,
                generation: b.generation,
                tier: b.tier,
                bound_share: b.bound_share,
                returning_elsewhere: b.returning_elsewhere,
            })
        };
        for vip in &snapshot.vips {
            let config = crate::base::config::validate_vip(vip.config.clone(), "state.vip")
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
                    saturated: false,
                    bound: Default::default(),
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
}
