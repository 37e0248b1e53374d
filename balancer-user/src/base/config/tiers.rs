//! `[[tier]]`: tiers of clients (source prefixes, DSCP): priority tiers with their own backend
//! pools, and the tenants of fair admission with their shares and limits.

use crate::base::net::Prefix;

use super::error::{ConfigError, invalid};
use super::fields::{int_in, required};
use super::raw::RawTier;
use super::vip::valid_name;

/// A priority tier: clients from its prefixes, or marked with its DSCP values, go to the
/// backends a VIP dedicates to it; other clients never do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierConfig {
    pub name: String,
    /// 1..=7, in the order of the config file.
    pub id: u8,
    pub prefixes: Vec<Prefix>,
    pub dscp: Vec<u8>,
    /// When none of a VIP's backends for the tier can take a new flow (all down, drained or
    /// saturated), it goes to the shared pool; else it is dropped.
    pub spillover: bool,
    /// The tier's weight as a tenant in fair admission (`[vip.admission] fair`): while a VIP's
    /// pool is saturated, its new flows are shared among the tenants asking in proportion.
    pub share: u32,
    /// The tier's new flows per second on each VIP with fair admission, saturated or not.
    pub max_new_flows_per_sec: Option<u32>,
}

/// Largest tenant share.
pub const MAX_SHARE: i64 = 10_000;
/// Largest rate limit of a tenant (new flows per second).
pub const MAX_TENANT_RATE: i64 = 100_000_000;

/// Validates the `[[tier]]` tables: names unique, at most 7, prefixes and DSCP values in range
/// and each claimed by one tier.
pub(super) fn validate_tiers(raw: Vec<RawTier>) -> Result<Vec<TierConfig>, ConfigError> {
    let max = balancer_common::maps::MAX_TIERS as usize;
    if raw.len() > max {
        return Err(invalid(
            "tier",
            format!("{} entries", raw.len()),
            format!("at most {max} tiers"),
        ));
    }
    let mut tiers: Vec<TierConfig> = Vec::new();
    let mut prefixes = 0;
    for (i, t) in raw.into_iter().enumerate() {
        let key = |k: &str| format!("tier[{i}].{k}");
        let name = required(t.name, &key("name"))?;
        if !valid_name(&name) {
            return Err(invalid(
                key("name"),
                format!("{name:?}"),
                "a name is 1-64 letters, digits, '-', '_' or '.'",
            ));
        }
        if tiers.iter().any(|x| x.name == name) {
            return Err(invalid(
                key("name"),
                format!("{name:?}"),
                "another tier has this name",
            ));
        }
        let mut tier = TierConfig {
            name,
            id: (i + 1) as u8,
            prefixes: Vec::new(),
            dscp: Vec::new(),
            spillover: t.spillover.unwrap_or(true),
            share: int_in(t.share.unwrap_or(1), 1, MAX_SHARE, &key("share"))?,
            max_new_flows_per_sec: t
                .max_new_flows_per_sec
                .map(|r| int_in(r, 1, MAX_TENANT_RATE, &key("max_new_flows_per_sec")))
                .transpose()?,
        };
        for (j, p) in t.prefixes.iter().enumerate() {
            let k = format!("{}[{j}]", key("prefixes"));
            let prefix: Prefix = p
                .parse()
                .map_err(|e: String| invalid(&k, format!("{p:?}"), e))?;
            if tiers.iter().any(|x| x.prefixes.contains(&prefix)) {
                return Err(invalid(k, format!("{p:?}"), "another tier has this prefix"));
            }
            tier.prefixes.push(prefix);
            prefixes += 1;
        }
        for (j, d) in t.dscp.iter().enumerate() {
            let k = format!("{}[{j}]", key("dscp"));
            let d: u8 = int_in(*d, 0, 63, &k)?;
            if tiers.iter().any(|x| x.dscp.contains(&d)) {
                return Err(invalid(k, d, "another tier has this DSCP value"));
            }
            tier.dscp.push(d);
        }
        // A tier without clients serves only as a VIP's admission overflow (checked with
        // the VIPs).
        tiers.push(tier);
    }
    if prefixes > balancer_common::maps::MAX_TIER_PREFIXES as usize {
        return Err(invalid(
            "tier",
            format!("{prefixes} prefixes"),
            "too many client prefixes (at most 4096)",
        ));
    }
    Ok(tiers)
}
