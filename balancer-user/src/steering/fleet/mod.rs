//! Many balancers, one table: the fleet's desired state in etcd, and VIP announcement over
//! BGP.
//!
//! The agent reaches etcd through the [`store::FleetStore`] port: [`etcd::EtcdStore`] in the
//! daemon (gRPC, TLS, auth), [`memory_store::MemoryStore`] in tests.
//!
//! Every balancer of a fleet runs the same config. One of them, elected through an etcd lease
//! ([`agent`]), turns its own view — configured weights, drains, health checks, telemetry
//! policies — into the weight of every backend of every VIP and publishes that as a
//! [`FleetState`] with a new epoch, in a transaction fenced on its leadership (a deposed
//! leader's write fails). Every other balancer reads the state and builds its tables from
//! exactly those weights, as each epoch arrives on its watch ([`crate::vips::Balancer::set_fleet_weights`]); since Maglev
//! tables depend only on the backend set and the weights, every balancer then holds the same
//! table (same fingerprint), and a flow ECMP moves from one balancer to another reaches the
//! same backend. Without etcd a balancer keeps forwarding with the last state it applied.
//!
//! [`bgp`] announces the VIPs through BIRD while this balancer can serve them.

pub mod agent;
pub mod bgp;
pub mod etcd;
pub mod memory_store;
pub mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::dataplane::Dataplane;
use crate::vips::Balancer;

/// VIP name → backend address → the weight its table is built with (0: out of the table).
pub type FleetWeights = BTreeMap<String, BTreeMap<IpAddr, u32>>;

/// What the leader publishes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FleetState {
    /// Increases with every publication.
    pub epoch: u64,
    /// The instance that published it.
    pub leader: String,
    /// The weight of every backend of every VIP.
    pub vips: FleetWeights,
    /// The VIPs and their backends as the leader's config has them (file form): followers
    /// take VIPs and backends added, changed or removed on the leader.
    #[serde(default)]
    pub vip_config: Vec<crate::base::config::RawVip>,
}

/// The VIPs of a config in the form a [`FleetState`] carries them.
pub fn vip_config(config: &crate::base::config::Config) -> Vec<crate::base::config::RawVip> {
    config
        .vips
        .iter()
        .map(crate::base::config::VipConfig::to_raw)
        .collect()
}

/// Whether two VIP lists say the same (compared as JSON: the file form has no equality).
pub fn same_vips(a: &[crate::base::config::RawVip], b: &[crate::base::config::RawVip]) -> bool {
    serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
}

/// The weights this balancer's own view gives every backend (what a leader publishes).
pub fn local_weights<D: Dataplane>(balancer: &Balancer<D>) -> FleetWeights {
    balancer
        .vips()
        .map(|v| {
            let weights = v
                .backends
                .values()
                .map(|b| (b.address, b.local_weight()))
                .collect();
            (v.config.name.clone(), weights)
        })
        .collect()
}

/// Whether this balancer leads its fleet (in `status` as "starting", "leader" or "follower").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FleetRole {
    /// Not yet in the election.
    #[default]
    Starting,
    Leader,
    Follower,
}

impl std::fmt::Display for FleetRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FleetRole::Starting => "starting",
            FleetRole::Leader => "leader",
            FleetRole::Follower => "follower",
        })
    }
}

/// How this balancer's last exchange with etcd went, for `status` and
/// `balancer_fleet_etcd_up`. In JSON: `"unknown"`, `"ok"` or `{"failing": "<error>"}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EtcdHealth {
    /// No exchange yet.
    #[default]
    Unknown,
    Ok,
    /// The last exchange failed with this error.
    Failing(String),
}

impl EtcdHealth {
    pub fn is_ok(&self) -> bool {
        *self == EtcdHealth::Ok
    }
}

impl fmt::Display for EtcdHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdHealth::Unknown => f.write_str("not reached yet"),
            EtcdHealth::Ok => f.write_str("ok"),
            EtcdHealth::Failing(e) => write!(f, "failing: {e}"),
        }
    }
}

/// This balancer's place in the fleet, for `status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetStatus {
    pub instance: String,
    pub role: FleetRole,
    /// The leader as last read from etcd.
    pub leader: Option<String>,
    /// The epoch of the state applied (or, on the leader, published) last.
    pub epoch: u64,
    /// How the last exchange with etcd went (on an error, forwarding goes on with the last
    /// state applied).
    pub etcd: EtcdHealth,
    /// Seconds since the last state was applied or published.
    #[serde(default)]
    pub applied_secs_ago: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_health_reads_ok_or_the_error_in_status() {
        for (health, json) in [
            (EtcdHealth::Unknown, serde_json::json!("unknown")),
            (EtcdHealth::Ok, serde_json::json!("ok")),
            (
                EtcdHealth::Failing("etcd unreachable".into()),
                serde_json::json!({"failing": "etcd unreachable"}),
            ),
        ] {
            assert_eq!(serde_json::to_value(&health).unwrap(), json);
            assert_eq!(serde_json::from_value::<EtcdHealth>(json).unwrap(), health);
        }
        assert!(EtcdHealth::Ok.is_ok() && !EtcdHealth::Failing(String::new()).is_ok());
    }

    #[test]
    fn the_role_reads_as_a_word_in_status() {
        let status = FleetStatus {
            role: FleetRole::Leader,
            ..FleetStatus::default()
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["role"], "leader");
        let back: FleetStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, status);
        assert_eq!(FleetStatus::default().role.to_string(), "starting");
        assert!(serde_json::from_str::<FleetRole>("\"king\"").is_err());
    }

    #[test]
    fn states_round_trip_as_json() {
        let mut vips = FleetWeights::new();
        vips.insert(
            "web".into(),
            [
                ("10.0.0.1".parse().unwrap(), 100),
                ("fd00::2".parse().unwrap(), 0),
            ]
            .into_iter()
            .collect(),
        );
        let s = FleetState {
            epoch: 7,
            leader: "lb1".into(),
            vips,
            vip_config: Vec::new(),
        };
        let text = serde_json::to_string(&s).unwrap();
        let back = serde_json::from_str::<FleetState>(&text).unwrap();
        assert_eq!(
            (back.epoch, &back.leader, &back.vips),
            (s.epoch, &s.leader, &s.vips)
        );
        assert!(serde_json::from_str::<FleetState>(r#"{"epoch":-1}"#).is_err());
    }
}
