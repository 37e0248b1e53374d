//! The config file as serde reads it: every key optional, unknown keys refused. Validation
//! turns these into the typed sections of [`super::Config`].

use serde::{Deserialize, Serialize};

use super::fleet::{RawBgp, RawFleet};

/// The config file's shape, as serde reads and writes it. Validation turns it into [`Config`];
/// [`Config::to_raw`] turns a [`Config`] back into it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_file: Option<String>,
    #[serde(default)]
    pub conntrack: RawConntrack,
    #[serde(default)]
    pub encap: RawEncap,
    #[serde(default)]
    pub api: RawApi,
    #[serde(default)]
    pub metrics: RawMetrics,
    #[serde(default)]
    pub nat: RawNat,
    #[serde(default)]
    pub fleet: RawFleet,
    #[serde(default)]
    pub bgp: RawBgp,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tier: Vec<RawTier>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pool: Vec<RawPool>,
    #[serde(default)]
    pub vip: Vec<RawVip>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConntrack {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_flows: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp_idle_timeout_secs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood_threshold: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removal_grace_secs: Option<i64>,
}

/// `[nat]`: the interface of the backends' link (when not `interface`), the source ports of
/// source NAT and when its flows expire.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawNat {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_idle_timeout_secs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_closed_timeout_secs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp_idle_timeout_secs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ports: Option<i64>,
}

/// A string, or a list of strings.
fn string_or_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrList {
        One(String),
        List(Vec<String>),
    }
    match OneOrList::deserialize(d)
        .map_err(|_| serde::de::Error::custom("expected a string or a list of strings"))?
    {
        OneOrList::One(s) => Ok(vec![s]),
        OneOrList::List(l) => Ok(l),
    }
}

/// One string as a string, several as a list.
fn one_or_list<S: serde::Serializer>(items: &[String], s: S) -> Result<S::Ok, S::Error> {
    match items {
        [one] => s.serialize_str(one),
        _ => items.serialize(s),
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawEncap {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_v4: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_v6: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawApi {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_token_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push_token_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rise: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fall: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawVip {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// A service: several addresses (an IPv4 and an IPv6 one), ports or protocols with one
    /// backend list, expanded into one VIP each (see `config::service`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protocols: Vec<String>,
    /// The service this VIP was expanded from: set by the expansion, shown by the API and kept
    /// in the state file; a config file may not set it (see [`super::Config::parse`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gue_port: Option<i64>,
    /// Source NAT of a `nat` VIP: `"interface"`, or an address (a list of one IPv4 and one
    /// IPv6 address for a dual-stack service).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "string_or_list",
        serialize_with = "one_or_list"
    )]
    pub nat_source: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_size: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<RawHealth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<RawTelemetry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<RawPolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistence_secs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_load_factor: Option<f64>,
    /// Tenant affinity: source hash and session persistence key on the first this many bits
    /// of an IPv4 client's address (32, the default: the whole address)...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_prefix_v4: Option<i64>,
    /// ...and of an IPv6 client's (128, the default: the whole address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_prefix_v6: Option<i64>,
    /// Admission control at SYN time while the pool is saturated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission: Option<super::admission::RawAdmission>,
    /// Model routing: take backends from this `[[pool]]`...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// ...those serving this model (all of the pool's when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default)]
    pub backend: Vec<RawBackend>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPool {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// none | models | metrics
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discover: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<i64>,
    /// http | https (discovery requests), and their certificates and token, as a VIP's
    /// telemetry has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
    #[serde(default)]
    pub backend: Vec<RawBackend>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// More pages, as "port/path" (e.g. "9400/metrics" for a DCGM exporter).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<String>,
    /// The fastest a scrape (and weight round) follows the one before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<i64>,
    /// The slowest: the wait while the VIP takes few requests (default the larger of 4000 and
    /// `interval_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_interval_ms: Option<i64>,
    /// Requests per backend between scrapes, which paces them between the two intervals
    /// (default 8; 0: every `interval_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_scrape: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_kib: Option<i64>,
    /// Half-life of the recent window of the figures derived from counter pairs (mean TTFT,
    /// prefill time per prompt token, prompt size, prefix-cache hits); default 200.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub derived_half_life_ms: Option<i64>,
    /// "http" (default) or "https".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// HTTPS: the CA (PEM) that signed the backends' certificates (default: the system's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// HTTPS: a client certificate and its key (PEM), for endpoints that ask for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A file holding a bearer token sent as `Authorization: Bearer ...` with every scrape.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_memory_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ewma_alpha: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hysteresis: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_saturation: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_saturation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_free_gpu_memory_mib: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_after_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantum: Option<i64>,
    /// Removed: `false` (what it always meant) is still read, `true` refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fresher_load: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_share: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackend {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drained: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTier {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dscp: Vec<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spillover: Option<bool>,
    /// The tier's weight in fair admission (a tenant; default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<i64>,
    /// The tier's new flows per second on each VIP with fair admission, at all times.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_new_flows_per_sec: Option<i64>,
}
