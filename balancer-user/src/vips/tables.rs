//! What the kernel holds for a VIP and its backends: map keys and values, and the Maglev
//! tables (with a block per priority tier).

use std::collections::BTreeMap;
use std::net::IpAddr;

use balancer_common::addr::raw_from_ip;
use balancer_common::maglev;
use balancer_common::maglev::MaglevBackend;
use balancer_common::maps::{
    BACKEND_F_ACTIVE, BACKEND_F_RETURNING_ELSEWHERE, Backend, ForwardMode, VIP_F_ADMISSION,
    VIP_F_COUNT, VIP_F_FAIR, VIP_F_SCRAPE_DUE, VIP_F_SOURCE_PREFIX, VIP_F_TIERS, VipKey, VipMeta,
};

use crate::base::config::{Forwarding, VipConfig};

use super::{BackendState, BalancerError};

pub(super) fn vip_key(address: IpAddr, port: u16, proto: u8) -> VipKey {
    let (addr, family) = raw_from_ip(address);
    VipKey {
        addr,
        port: port.to_be(),
        proto,
        family,
    }
}

pub(super) fn forward_mode(f: Forwarding) -> ForwardMode {
    match f {
        Forwarding::L2Dsr => ForwardMode::L2Dsr,
        Forwarding::Ipip => ForwardMode::Ipip,
        Forwarding::Gue => ForwardMode::Gue,
        Forwarding::Nat => ForwardMode::Nat,
    }
}

pub(super) fn vip_meta(id: u32, config: &VipConfig) -> VipMeta {
    VipMeta {
        vip_id: id,
        table_size: config.table_size,
        mode: forward_mode(config.forwarding) as u8,
        flags: if config.backends.iter().any(|b| b.tier.is_some()) {
            VIP_F_TIERS
        } else {
            0
        } | if config.policy.reads_flows()
            || config.admission.as_ref().is_some_and(|a| a.fair)
        {
            // Fair admission measures the pool's capacity by the flows it finishes.
            VIP_F_COUNT
        } else {
            0
        } | if config.affinity_prefix.is_prefix() {
            VIP_F_SOURCE_PREFIX
        } else {
            0
        } | if config.admission.is_some() {
            VIP_F_ADMISSION
        } else {
            0
        } | if config.admission.as_ref().is_some_and(|a| a.fair) {
            VIP_F_FAIR
        } else {
            0
        } | if config.telemetry.paced() {
            VIP_F_SCRAPE_DUE
        } else {
            0
        },
        gue_port: config.gue_port.to_be(),
        scheduler: config.scheduler as u8,
        load_bound: config.load_bound_pct,
        persist_ticks: config.persistence_ticks(),
    }
}

/// A backend's entry as its state says (`returning_elsewhere` is set only while its VIP has
/// persistence and a telemetry policy: see `set_returning_elsewhere` and `apply`).
pub(super) fn backend_entry(vip_id: u32, _vip: &VipConfig, b: &BackendState) -> Backend {
    let (addr, family) = raw_from_ip(b.address);
    let mut flags = if b.healthy { BACKEND_F_ACTIVE } else { 0 };
    if b.returning_elsewhere {
        flags |= BACKEND_F_RETURNING_ELSEWHERE;
    }
    Backend {
        addr,
        mac: b.mac.0,
        family,
        flags,
        generation: b.generation as u16,
        bound_share: b.bound_share,
        vip_id: vip_id as u16,
        weight: b.table_weight().min(u32::from(u16::MAX)) as u16,
    }
}

/// Builds the Maglev table of a VIP's backends, with what its fingerprint needs.
pub fn build_table(
    name: &str,
    table_size: u32,
    backends: &BTreeMap<IpAddr, BackendState>,
) -> Result<(Vec<u32>, Fingerprint), BalancerError> {
    let members = pool_members(backends, 0);
    let table = build_members_table(name, table_size, &members)?;
    Ok((table, Fingerprint::of(members)))
}

/// A table's host-independent fingerprint (see [`maglev::fingerprint`]), computed when first
/// asked for: status and `balancer table` want it, the weight rounds that rebuild a table
/// several times a second under load do not. Keeps the identities and ids of the backends
/// the table was built from, which is all the fingerprint reads besides the table.
#[derive(Clone, Debug, Default)]
pub struct Fingerprint {
    backends: Vec<(String, u32)>,
    value: std::sync::OnceLock<u64>,
}

impl Fingerprint {
    /// Of the table built from `members` (a pool's identities and backends).
    fn of(members: Vec<(String, &BackendState)>) -> Fingerprint {
        Fingerprint {
            backends: members
                .into_iter()
                .map(|(identity, b)| (identity, b.id))
                .collect(),
            value: std::sync::OnceLock::new(),
        }
    }

    /// The fingerprint of `table`, the table this was made with.
    pub fn value(&self, table: &[u32]) -> u64 {
        *self.value.get_or_init(|| {
            let input: Vec<MaglevBackend<'_>> = self
                .backends
                .iter()
                .map(|(identity, id)| MaglevBackend {
                    identity: identity.as_bytes(),
                    weight: 0,
                    id: *id,
                })
                .collect();
            maglev::fingerprint(table, &input)
        })
    }
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
        .map(|t| Ok((t, build_pool_table(name, table_size, backends, t)?)))
        .collect()
}

/// The Maglev table of the backends of one pool (tier 0: the shared pool).
pub(super) fn build_pool_table(
    name: &str,
    table_size: u32,
    backends: &BTreeMap<IpAddr, BackendState>,
    tier: u8,
) -> Result<Vec<u32>, BalancerError> {
    build_members_table(name, table_size, &pool_members(backends, tier))
}

/// The backends of pool `tier` among `backends`, each with its Maglev identity (its address).
fn pool_members(
    backends: &BTreeMap<IpAddr, BackendState>,
    tier: u8,
) -> Vec<(String, &BackendState)> {
    backends
        .values()
        .filter(|b| b.tier == tier)
        .map(|b| (b.address.to_string(), b))
        .collect()
}

/// The Maglev table of `members` ([`pool_members`]).
fn build_members_table(
    name: &str,
    table_size: u32,
    members: &[(String, &BackendState)],
) -> Result<Vec<u32>, BalancerError> {
    let input: Vec<MaglevBackend<'_>> = members
        .iter()
        .map(|(identity, b)| MaglevBackend {
            identity: identity.as_bytes(),
            weight: b.table_weight(),
            id: b.id,
        })
        .collect();
    maglev::build_table(&input, table_size).map_err(|source| BalancerError::Table {
        vip: name.to_string(),
        source,
    })
}
