//! The running daemon's state, and every operation on it, one module per concern:
//! configuration changes ([`changes`]), health ([`health`]), backend reports and weights
//! ([`weights`]), the fleet ([`fleet`]), traffic rates ([`traffic`]), what the API and the
//! metrics page show ([`views`]), and the narrow ports the workers reach it through
//! ([`ports`]). [`wire`] holds the API's bodies the views are made of; [`metrics`] the
//! daemon's registered metrics and the rendering of its page.

mod changes;
mod edits;
mod fleet;
mod health;
pub mod metrics;
mod nat;
mod ports;
mod traffic;
mod views;
mod weights;
pub mod wire;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::base::config::{Config, ConfigError};
use crate::dataplane::DynDataplane;
use crate::dataplane::netinfo::{Links, NextHops};
use crate::dataplane::pinning::Pins;
use crate::state::metrics::Metrics;
use crate::steering::policy::{Decision, PolicyState};
use crate::steering::telemetry::store::TelemetryStore;
use crate::vips::{Balancer, Endpoint};
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
    /// The resulting config is invalid (400).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The resulting data-plane settings are impossible on this host (400).
    #[error(transparent)]
    Settings(#[from] crate::dataplane::settings::SettingsError),
    /// A backend's next hop did not resolve (400).
    #[error("resolving backend MAC addresses: {0}")]
    NextHops(#[from] crate::dataplane::netinfo::NeighbourError),
    /// Writing the tables or reading the data plane failed (500).
    #[error(transparent)]
    Dataplane(#[from] crate::vips::BalancerError),
}

impl ChangeError {
    /// A valid change the data plane did not take (the tables in force stay).
    pub fn is_publish_failure(&self) -> bool {
        matches!(self, ChangeError::Failed(_) | ChangeError::Dataplane(_))
    }
}

/// The daemon.
pub struct Daemon {
    pub config: Config,
    /// Counts the configs put in force ([`Daemon::apply_config`]): the once-a-second thread
    /// brings the health, telemetry and discovery loops in line with the config only when it
    /// moved.
    config_generation: u64,
    pub config_path: PathBuf,
    pub links: Links,
    pub balancer: Balancer<DynDataplane>,
    pub pins: Pins,
    /// Where next-hop MACs come from for backends added later.
    next_hops: Box<dyn NextHops>,
    pub metrics: Metrics,
    pub neighbour_timeout: Duration,
    pub started: Instant,
    /// Per VIP id / backend id.
    vip_traffic: HashMap<u32, Sampled>,
    backend_traffic: HashMap<u32, Sampled>,
    rates_at: Option<Instant>,
    /// When the traffic counters were last read, and when a view that shows their rates
    /// (status, stats) was last asked for.
    read_at: Option<Instant>,
    rates_watched_at: Option<Instant>,
    /// Whether the last reading of the traffic counters failed (its warning is logged once,
    /// not every second).
    traffic_unread: bool,
    /// Connection-table entries per backend id (from `flow_counter`: counted when status,
    /// stats, weights or metrics ask), and when they were counted.
    flows: HashMap<u32, u64>,
    flows_at: Option<Instant>,
    /// Backends under health checks: latest verdict known to the checker.
    pub checked: HashMap<(Endpoint, IpAddr), bool>,
    /// Backend reports (scraped or pushed).
    pub telemetry: TelemetryStore,
    /// Per VIP name: the weight policy's memory and its last decisions.
    policies: HashMap<String, PolicyState>,
    decisions: HashMap<String, Vec<Decision>>,
    /// Per VIP name: the wait its telemetry loop set from its last scrape to the next.
    scrape_intervals: HashMap<String, Duration>,
    /// Model routing: per pool, the models each backend was found serving, and the last
    /// discovery error per backend.
    pub served: HashMap<String, HashMap<IpAddr, Vec<String>>>,
    pub discovery_errors: HashMap<(String, IpAddr), String>,
    /// The fleet agent's view (see [`crate::steering::fleet`]).
    pub fleet: crate::steering::fleet::FleetStatus,
    /// VIPs drained from BGP announcement by name.
    pub drained_vips: std::collections::BTreeSet<String>,
    announcer: crate::steering::fleet::bgp::Announcer,
    /// Bumped whenever this balancer's own view (weights, VIPs) may have changed: a fleet
    /// leader publishes then, without waiting for its next tick.
    local_changes: tokio::sync::watch::Sender<u64>,
    /// The data plane's source-NAT drop counters at the last sweep (none yet: `None`).
    nat_seen: Option<balancer_common::stats::NatStats>,
    /// Source-NAT flows the last sweep left (none swept yet: `None`).
    nat_flows_left: Option<u64>,
}

impl Daemon {
    /// Tells whoever follows this balancer's own view (the fleet agent) that it may have
    /// changed.
    pub fn local_view_changed(&self) {
        self.local_changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Follows [`Daemon::local_view_changed`].
    pub fn subscribe_local_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.local_changes.subscribe()
    }
}

/// What the daemon knows of its host, apart from the data plane: the interfaces it serves,
/// where its maps are pinned, how it resolves next hops, and where the routes of the VIPs it
/// announces go (BIRD, when `[bgp]` is set).
pub struct Host {
    pub links: Links,
    pub pins: Pins,
    pub next_hops: Box<dyn NextHops>,
    pub neighbour_timeout: Duration,
    pub routes: Box<dyn crate::steering::fleet::bgp::Routes>,
}

impl Daemon {
    /// A daemon over `balancer`, whose data plane already holds `config` (see
    /// [`Daemon::publish`] for a fresh one).
    pub fn new(
        config: Config,
        config_path: PathBuf,
        host: Host,
        balancer: Balancer<DynDataplane>,
        metrics: Metrics,
    ) -> Daemon {
        let Host {
            links,
            pins,
            next_hops,
            neighbour_timeout,
            routes,
        } = host;
        Daemon {
            config,
            config_generation: 0,
            config_path,
            links,
            balancer,
            pins,
            next_hops,
            metrics,
            neighbour_timeout,
            started: Instant::now(),
            vip_traffic: HashMap::new(),
            backend_traffic: HashMap::new(),
            rates_at: None,
            read_at: None,
            rates_watched_at: None,
            traffic_unread: false,
            flows: HashMap::new(),
            flows_at: None,
            checked: HashMap::new(),
            telemetry: TelemetryStore::default(),
            policies: HashMap::new(),
            decisions: HashMap::new(),
            scrape_intervals: HashMap::new(),
            served: HashMap::new(),
            discovery_errors: HashMap::new(),
            fleet: crate::steering::fleet::FleetStatus::default(),
            drained_vips: Default::default(),
            announcer: crate::steering::fleet::bgp::Announcer::new(routes),
            local_changes: tokio::sync::watch::Sender::new(0),
            nat_seen: None,
            nat_flows_left: None,
        }
    }
}

/// Writes the settings, NAT links, tiers and VIPs of `config` into `balancer` (`macs`: the
/// next hops of backends that give none). `flow_buckets`: the connection table's size, fixed
/// when its map was made.
pub fn configure(
    balancer: &mut Balancer<DynDataplane>,
    config: &Config,
    links: &Links,
    flow_seed: u64,
    flow_buckets: u32,
    macs: &HashMap<IpAddr, crate::base::net::MacAddr>,
) -> Result<crate::vips::ApplyReport, ChangeError> {
    let mut settings =
        crate::dataplane::settings::data_plane_settings(config, &links.clients, flow_seed)?;
    settings.flow_bucket_mask = flow_buckets - 1;
    crate::dataplane::settings::check_nat_ports(
        config,
        crate::dataplane::settings::ephemeral_ports(),
    )?;
    let snat = crate::dataplane::settings::snat_sources(config, links.of_backends(true))?;
    balancer.set_settings(&settings)?;
    balancer.set_nat_links(&links.nat_links())?;
    balancer.set_snat_sources(snat);
    balancer.set_removal_grace(config.conntrack.removal_grace);
    balancer.set_tiers(&config.tiers)?;
    Ok(balancer.apply(&config.vips, macs)?)
}

impl Daemon {
    /// A daemon on a fresh data plane (the in-memory one in tests): `config` validated, its
    /// next hops resolved through the host's [`NextHops`], and published.
    pub fn publish(
        config: Config,
        config_path: PathBuf,
        host: Host,
        dataplane: DynDataplane,
        metrics: Metrics,
    ) -> Result<Daemon, ChangeError> {
        let wanted = config.backends_without_mac();
        let macs = host
            .links
            .resolve(&*host.next_hops, &wanted, host.neighbour_timeout)?;
        let mut balancer = Balancer::new(dataplane);
        let buckets = crate::dataplane::ebpf::flow_buckets(config.conntrack.max_flows);
        let report = configure(&mut balancer, &config, &host.links, 1, buckets, &macs)?;
        let daemon = Daemon::new(config, config_path, host, balancer, metrics);
        daemon.record(&report);
        daemon.persist_state();
        Ok(daemon)
    }
}
