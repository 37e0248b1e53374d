//! The running daemon's state, and every operation on it, one module per concern:
//! configuration changes ([`changes`]), health ([`health`]), backend reports and weights
//! ([`weights`]), the fleet ([`fleet`]), traffic rates ([`traffic`]) and what the API and
//! the metrics page show ([`views`]).

mod changes;
mod fleet;
mod health;
mod traffic;
mod views;
mod weights;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::balancer::{Balancer, Endpoint};
use crate::config::{Config, ConfigError};
use crate::dataplane::kernel::KernelDataplane;
use crate::metrics::Metrics;
use crate::netinfo::Interface;
use crate::pinning::Pins;
use crate::policy::{Decision, PolicyState};
use crate::telemetry::store::TelemetryStore;
use traffic::Sampled;

/// Why a change was refused; maps onto an HTTP status and a CLI exit code.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The request or the resulting config is invalid (400).
    #[error("{0}")]
    Invalid(String),
    /// No such VIP or backend (404).
    #[error("{0}")]
    NotFound(String),
    /// Already exists (409).
    #[error("{0}")]
    Conflict(String),
    /// The change was valid but applying it failed (500).
    #[error("{0}")]
    Failed(String),
}

impl From<ConfigError> for ChangeError {
    fn from(e: ConfigError) -> Self {
        ChangeError::Invalid(e.to_string())
    }
}

/// The daemon.
pub struct Daemon {
    pub config: Config,
    pub config_path: PathBuf,
    pub iface: Interface,
    pub balancer: Balancer<KernelDataplane>,
    pub pins: Pins,
    pub metrics: Metrics,
    pub neighbour_timeout: Duration,
    pub started: Instant,
    /// Per VIP id / backend id.
    vip_traffic: HashMap<u32, Sampled>,
    backend_traffic: HashMap<u32, Sampled>,
    rates_at: Option<Instant>,
    /// Connection-table entries per backend id (refreshed by `count_flows`).
    flows: HashMap<u32, u64>,
    /// Backends under health checks: latest verdict known to the checker.
    pub checked: HashMap<(Endpoint, IpAddr), bool>,
    /// Backend reports (scraped or pushed).
    pub telemetry: TelemetryStore,
    /// Per VIP name: the weight policy's memory and its last decisions.
    policies: HashMap<String, PolicyState>,
    decisions: HashMap<String, Vec<Decision>>,
    /// Model routing: per pool, the models each backend was found serving, and the last
    /// discovery error per backend.
    pub served: HashMap<String, HashMap<IpAddr, Vec<String>>>,
    pub discovery_errors: HashMap<(String, IpAddr), String>,
    /// The fleet agent's view (see [`crate::fleet`]).
    pub fleet: crate::fleet::FleetStatus,
    /// VIPs drained from BGP announcement by name.
    pub drained_vips: std::collections::BTreeSet<String>,
    announcer: crate::fleet::bgp::Announcer,
}

impl Daemon {
    pub fn new(
        config: Config,
        config_path: PathBuf,
        iface: Interface,
        balancer: Balancer<KernelDataplane>,
        pins: Pins,
        metrics: Metrics,
        neighbour_timeout: Duration,
    ) -> Daemon {
        Daemon {
            config,
            config_path,
            iface,
            balancer,
            pins,
            metrics,
            neighbour_timeout,
            started: Instant::now(),
            vip_traffic: HashMap::new(),
            backend_traffic: HashMap::new(),
            rates_at: None,
            flows: HashMap::new(),
            checked: HashMap::new(),
            telemetry: TelemetryStore::default(),
            policies: HashMap::new(),
            decisions: HashMap::new(),
            served: HashMap::new(),
            discovery_errors: HashMap::new(),
            fleet: crate::fleet::FleetStatus::default(),
            drained_vips: Default::default(),
            announcer: Default::default(),
        }
    }
}
