//! `[vip.admission]`: admission control at SYN time. While every eligible backend of the VIP's
//! shared pool is saturated (by its policy's cut-offs: KV cache, waiting requests, free GPU
//! memory), new flows are admitted only for the listed tiers, each up to its cap; the rest go
//! to an overflow tier's backends or are refused (a TCP RST, or dropped).
//!
//! Fair admission (`fair = true`) treats each `[[tier]]` as a tenant and the clients of no tier
//! as one more: while the pool is saturated every tenant is admitted, the pool's rate of new
//! flows shared among the tenants asking by their `share` (max-min: a tenant asking for less
//! than its share gets what it asks, the rest is split among the others), and a tenant's
//! `max_new_flows_per_sec` holds at all times.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::{ConfigError, invalid};
use super::fields::int_in;
use super::vip::valid_name;

/// How a new flow that is not admitted is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Refusal {
    /// A TCP SYN is answered with a RST (the client fails at once); a UDP packet is dropped.
    #[default]
    Reset,
    /// The packet is dropped (a TCP client retries its SYN after its timeout).
    Drop,
}

impl Refusal {
    pub const fn name(self) -> &'static str {
        match self {
            Refusal::Reset => "reset",
            Refusal::Drop => "drop",
        }
    }
}

/// A VIP's admission control.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Tiers (by `[[tier]]` name) admitted while the pool is saturated, each with its cap:
    /// new flows per second on each CPU of the balancer (0: no cap). Clients of no tier and
    /// of tiers not listed are not admitted.
    pub admit: BTreeMap<String, u32>,
    /// A tier whose backends (on this VIP) take the flows not admitted; refused only when none
    /// of them can.
    pub overflow: Option<String>,
    pub refuse: Refusal,
    /// Fair admission: every tenant admitted by its share while saturated (`admit` is empty).
    pub fair: bool,
    /// Fair admission: the share of the clients of no tier.
    pub default_share: u32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            admit: BTreeMap::new(),
            overflow: None,
            refuse: Refusal::Reset,
            fair: false,
            default_share: 1,
        }
    }
}

/// `[vip.admission]` as written.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmission {
    /// Tier name -> new flows per second per CPU admitted while saturated (0: no cap).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub admit: BTreeMap<String, i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overflow: Option<String>,
    /// "reset" (default) or "drop".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refuse: Option<String>,
    /// Fair admission between the tiers as tenants, by their shares.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fair: Option<bool>,
    /// Fair admission: the share of the clients of no tier (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_share: Option<i64>,
}

/// Largest per-tier cap (new flows per second per CPU).
const MAX_CAP: i64 = 100_000_000;

/// Validates a VIP's `admission` table; `key` names a key of the VIP in errors. Tier names
/// are checked against the `[[tier]]`s by [`check_tiers`].
pub(super) fn validate_admission(
    raw: RawAdmission,
    key: &dyn Fn(&str) -> String,
) -> Result<AdmissionConfig, ConfigError> {
    let mut admit = BTreeMap::new();
    for (tier, cap) in raw.admit {
        let k = key(&format!("admission.admit.{tier}"));
        if !valid_name(&tier) {
            return Err(invalid(k, format!("{tier:?}"), "not a tier name"));
        }
        admit.insert(tier, int_in(cap, 0, MAX_CAP, &k)?);
    }
    let overflow = match raw.overflow {
        Some(t) if !valid_name(&t) => {
            return Err(invalid(
                key("admission.overflow"),
                format!("{t:?}"),
                "not a tier name",
            ));
        }
        Some(t) if admit.contains_key(&t) => {
            return Err(invalid(
                key("admission.overflow"),
                format!("{t:?}"),
                "this tier is admitted while saturated; the overflow tier takes the flows that are not",
            ));
        }
        t => t,
    };
    let fair = raw.fair.unwrap_or(false);
    if fair && !admit.is_empty() {
        return Err(invalid(
            key("admission.admit"),
            format!("{} tiers", admit.len()),
            "fair admission admits every tier by its share; list tiers in admit only without fair",
        ));
    }
    let default_share = match raw.default_share {
        Some(s) if !fair => {
            return Err(invalid(
                key("admission.default_share"),
                s,
                "the share of the clients of no tier applies to fair admission only (set fair = true)",
            ));
        }
        Some(s) => int_in(
            s,
            1,
            super::tiers::MAX_SHARE,
            &key("admission.default_share"),
        )?,
        None => 1,
    };
    let refuse = match raw.refuse.as_deref() {
        None | Some("reset") => Refusal::Reset,
        Some("drop") => Refusal::Drop,
        Some(other) => {
            return Err(invalid(
                key("admission.refuse"),
                format!("{other:?}"),
                "expected \"reset\" or \"drop\"",
            ));
        }
    };
    Ok(AdmissionConfig {
        admit,
        overflow,
        refuse,
        fair,
        default_share,
    })
}

impl AdmissionConfig {
    /// In its file form.
    pub fn to_raw(&self) -> RawAdmission {
        RawAdmission {
            admit: self
                .admit
                .iter()
                .map(|(t, c)| (t.clone(), i64::from(*c)))
                .collect(),
            overflow: self.overflow.clone(),
            refuse: Some(self.refuse.name().to_string()),
            fair: self.fair.then_some(true),
            default_share: self.fair.then_some(i64::from(self.default_share)),
        }
    }
}

/// Checks a VIP's admission against the tiers in force: every tier it names exists, and the
/// overflow tier has backends on the VIP. `label` is the VIP's (e.g. `vip[2]`).
pub(super) fn check_tiers(
    admission: &AdmissionConfig,
    tiers: &[super::TierConfig],
    backends: &[super::BackendConfig],
    label: &str,
) -> Result<(), ConfigError> {
    let exists = |name: &str| tiers.iter().any(|t| t.name == name);
    for tier in admission.admit.keys() {
        if !exists(tier) {
            return Err(invalid(
                format!("{label}.admission.admit.{tier}"),
                admission.admit[tier],
                "no [[tier]] has this name",
            ));
        }
    }
    if let Some(overflow) = &admission.overflow {
        if !exists(overflow) {
            return Err(invalid(
                format!("{label}.admission.overflow"),
                format!("{overflow:?}"),
                "no [[tier]] has this name",
            ));
        }
        if !backends.iter().any(|b| b.tier.as_deref() == Some(overflow)) {
            return Err(invalid(
                format!("{label}.admission.overflow"),
                format!("{overflow:?}"),
                "none of the VIP's backends is in this tier (set tier on the backends that take the overflow)",
            ));
        }
    }
    Ok(())
}
