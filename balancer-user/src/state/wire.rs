//! JSON bodies of the control API, shared by the daemon and the CLI.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// An error answer: `{"error": "..."}` with an HTTP status that says what kind.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// What a change did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChangeResult {
    pub message: String,
    pub vips_added: usize,
    pub vips_removed: usize,
    pub vips_updated: usize,
    pub tables_published: usize,
    pub slots_changed: usize,
}

/// `PUT .../weight`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightBody {
    pub weight: i64,
}

/// `PUT /v1/vips/{name}/scheduler`: the VIP's scheduler and, optionally, session persistence,
/// bounded load and tenant affinity's source prefixes (absent: unchanged).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerBody {
    pub scheduler: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence_secs: Option<i64>,
    /// A factor >= 1.01, or 0 to remove the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_load_factor: Option<f64>,
    /// IPv4 source prefix length source hash and persistence key on (32: whole addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_prefix_v4: Option<i64>,
    /// IPv6 source prefix length (128: whole addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_prefix_v6: Option<i64>,
}

/// `PUT /v1/tiers/{name}`: a tier's settings as a tenant of fair admission (absent: unchanged).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantBody {
    /// Its share (weight), 1-10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<i64>,
    /// Its new flows per second on each VIP with fair admission; 0 removes the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_flows_per_sec: Option<i64>,
}

/// `POST /v1/stop`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopBody {
    /// Also detach the program and unpin everything.
    #[serde(default)]
    pub detach: bool,
}

/// One backend in `status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackendStatus {
    pub address: IpAddr,
    pub weight: u32,
    pub drained: bool,
    pub healthy: bool,
    /// Health-check state: "unchecked", "healthy", "unhealthy".
    pub health: String,
    /// Share of the VIP's table, 0..1.
    pub table_share: f64,
    /// Connection-table entries pinned to it.
    pub flows: u64,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub pps: f64,
    pub bps: f64,
    /// Removed from the VIP, still serving its established flows.
    pub retiring: bool,
    /// Under bounded load: its share of its pool's weights averaged over the VIP's mean flow
    /// duration, 0..1 (what its share of active flows is held to, times the bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_share: Option<f64>,
    /// Under session persistence: the clients it homes now (placed, or returning within about
    /// a quarter of the persistence time), what spreads a VIP's few heavy clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub homed_clients: Option<f64>,
    /// Under session persistence: the capacity its clients are spread by (configured weight x
    /// KV-cache capacity against the pool's mean; 1.0 is a mean backend of weight 1); absent
    /// until written (the VIP's first weight round, or a second for a static policy), while
    /// new clients go where the scheduler picks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_capacity: Option<f64>,
}

/// One VIP in `status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VipStatus {
    pub name: String,
    pub address: IpAddr,
    pub port: u16,
    pub protocol: String,
    pub forwarding: String,
    /// The scheduler of new flows, with persistence and bounded load when set.
    #[serde(default)]
    pub scheduler: String,
    pub table_size: u32,
    /// Host-independent fingerprint of the Maglev table (equal on every balancer with the same
    /// backends and weights).
    pub table_fingerprint: String,
    pub health_check: String,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub pps: f64,
    pub bps: f64,
    pub flows: u64,
    pub backends: Vec<BackendStatus>,
    /// Announced over BGP (false also without `[bgp]`).
    #[serde(default)]
    pub announced: bool,
    /// Admission control (absent without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionStatus>,
}

/// A VIP's admission control in `status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AdmissionStatus {
    /// Every eligible backend of the shared pool is over its saturation cut-off: only the
    /// admitted tiers get new flows.
    pub saturated: bool,
    /// How a flow not admitted is refused: "reset" or "drop".
    pub refuse: String,
    /// The tier whose backends take the flows not admitted.
    pub overflow: Option<String>,
    /// Per client tier ("none": clients of no tier), counted while saturated.
    pub tiers: Vec<TierAdmissionStatus>,
    /// Fair admission: every tier is a tenant, admitted by its share while saturated.
    #[serde(default)]
    pub fair: bool,
    /// Fair admission: the new flows per second the shared pool finishes, as measured (what
    /// the tenants share while it is saturated); absent until measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<f64>,
}

/// One client tier's admission counters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TierAdmissionStatus {
    pub tier: String,
    /// Admitted while saturated.
    pub admitted: bool,
    /// New flows per second per CPU admitted while saturated (0: no cap).
    pub cap: u32,
    /// New flows admitted while saturated.
    pub admitted_flows: u64,
    /// New flows not admitted: the tier is not admitted while saturated.
    pub shed_saturated: u64,
    /// New flows not admitted: the tier's cap was spent.
    pub shed_over_cap: u64,
    /// Of those not admitted, sent to the overflow tier (the rest were refused).
    pub overflowed: u64,
    /// Fair admission: the tenant's share (absent: not a tenant, or not fair admission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<u32>,
    /// Fair admission: the new flows per second the tenant may open now (its fair share while
    /// saturated, its own limit at all times; absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// Fair admission: the new flows per second the tenant asked for lately.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<f64>,
}

/// `GET /v1/status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub interface: String,
    pub attach_mode: String,
    pub pin_dir: String,
    pub uptime_secs: u64,
    pub vips: Vec<VipStatus>,
    /// This balancer's place in its fleet (absent without `[fleet]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<crate::steering::fleet::FleetStatus>,
    /// BGP announcement (absent without `[bgp]`): the last error talking to BIRD, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpStatus>,
}

/// `status`'s BGP part.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BgpStatus {
    /// Addresses BIRD was told to announce.
    pub announced: Vec<IpAddr>,
    /// VIPs drained from announcement (`balancer vip drain`).
    pub drained: Vec<String>,
    pub last_error: Option<String>,
}

/// `GET /v1/stats`: global counters by name, and traffic per VIP and backend.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stats {
    pub counters: BTreeMap<String, u64>,
    pub vips: Vec<VipStatus>,
}

/// One backend's row in `table`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableShare {
    pub address: IpAddr,
    pub weight: u32,
    /// Weight share among backends in the table, 0..1.
    pub weight_share: f64,
    pub slots: usize,
    /// Slot share, 0..1.
    pub slot_share: f64,
}

/// `GET /v1/vips/{name}/table`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Table {
    pub vip: String,
    pub table_size: u32,
    pub fingerprint: String,
    pub backends: Vec<TableShare>,
}

/// One backend in `weights`: what it reported, and the weight the policy made of it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WeightRow {
    pub address: IpAddr,
    pub configured_weight: u32,
    /// The weight in force (the policy's, or the configured one for `static`).
    pub weight: u32,
    pub reason: String,
    /// Over a saturation cut-off in the last round.
    #[serde(default)]
    pub saturated: bool,
    /// Its returning clients (session persistence) sent elsewhere this round: the policy
    /// expects them served sooner by another backend, their whole prompt prefilled there.
    #[serde(default)]
    pub returning_elsewhere: bool,
    /// The latest report (absent before the first).
    pub signals: Option<crate::steering::telemetry::signals::Signals>,
    /// Age of that report, ms.
    pub report_age_ms: Option<u64>,
    pub flows: u64,
    pub reports: u64,
    pub errors: u64,
    pub last_error: Option<String>,
}

/// `GET /v1/weights`: per VIP.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VipWeights {
    pub vip: String,
    pub policy: String,
    pub telemetry: String,
    /// With admission control: whether the pool is saturated (only admitted tiers get new
    /// flows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_saturated: Option<bool>,
    /// A scraped VIP's wait from its last scrape to the next, ms: `interval_ms` when fixed,
    /// else the pace its requests set (`interval_ms` to `max_interval_ms`); absent before the
    /// first scrape and for pushed or no telemetry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_interval_ms: Option<u64>,
    pub backends: Vec<WeightRow>,
}
