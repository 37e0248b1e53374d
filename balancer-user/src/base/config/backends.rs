//! A VIP's `backend` entries: each validated alone, then the list (each address once, a `nat`
//! VIP's of its family).

use std::collections::HashSet;
use std::net::IpAddr;

use crate::base::net::MacAddr;

use super::MAX_WEIGHT;
use super::error::{ConfigError, invalid};
use super::fields::{int_in, parse_field, parse_ip, required};
use super::raw::RawBackend;
use super::vip::{Forwarding, valid_name};

/// One backend of a VIP.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendConfig {
    pub address: IpAddr,
    /// Relative share of new flows; 0 takes none (established flows continue).
    pub weight: u32,
    /// Drained: no new flows, established ones continue; the weight is kept for undrain.
    pub drained: bool,
    /// Next-hop MAC; default: looked up in the neighbour table (the backend's own when on
    /// the link, else its gateway's).
    pub mac: Option<MacAddr>,
    /// Dedicated to this priority tier's clients (a `[[tier]]` name); `None`: the shared pool.
    pub tier: Option<String>,
    /// Joined from this `[[pool]]` (model routing), not listed in the VIP itself.
    pub from_pool: Option<String>,
}

impl BackendConfig {
    /// The backend in its file form.
    pub fn to_raw(&self) -> RawBackend {
        RawBackend {
            address: Some(self.address.to_string()),
            weight: Some(self.weight.into()),
            drained: self.drained.then_some(true),
            mac: self.mac.map(|m| m.to_string()),
            tier: self.tier.clone(),
        }
    }
}

/// Validates one backend; `label` prefixes the keys in errors (e.g. `vip[0].backend[2]`).
pub fn validate_backend(raw: RawBackend, label: &str) -> Result<BackendConfig, ConfigError> {
    let key = |k: &str| format!("{label}.{k}");
    let text = required(raw.address, &key("address"))?;
    let address = parse_ip(&text, &key("address"))?;
    if address.is_unspecified() || address.is_multicast() {
        return Err(invalid(
            key("address"),
            format!("{text:?}"),
            "a backend must be a unicast address",
        ));
    }
    let weight = match raw.weight {
        Some(w) => int_in(w, 0, MAX_WEIGHT.into(), &key("weight"))?,
        None => 1,
    };
    let mac = raw
        .mac
        .map(|m| parse_field::<MacAddr>(&m, &key("mac")))
        .transpose()?;
    let tier = match raw.tier {
        Some(t) if !valid_name(&t) => {
            return Err(invalid(key("tier"), format!("{t:?}"), "not a tier name"));
        }
        t => t,
    };
    Ok(BackendConfig {
        address,
        weight,
        drained: raw.drained.unwrap_or(false),
        mac,
        tier,
        from_pool: None,
    })
}

/// A VIP's backends: each valid, each once, a `nat` VIP's of its address family.
pub(super) fn validate_backends(
    raw: Vec<RawBackend>,
    forwarding: Forwarding,
    address: IpAddr,
    label: &str,
) -> Result<Vec<BackendConfig>, ConfigError> {
    let mut backends = Vec::with_capacity(raw.len());
    let mut seen = HashSet::new();
    for (j, b) in raw.into_iter().enumerate() {
        let blabel = format!("{label}.backend[{j}]");
        let backend = validate_backend(b, &blabel)?;
        if forwarding == Forwarding::Nat && backend.address.is_ipv4() != address.is_ipv4() {
            return Err(invalid(
                format!("{blabel}.address"),
                format!("{:?}", backend.address.to_string()),
                "a nat VIP's backends are of its address family (the backend's address replaces the VIP's)",
            ));
        }
        if !seen.insert(backend.address) {
            return Err(invalid(
                format!("{blabel}.address"),
                format!("{:?}", backend.address.to_string()),
                "this backend is listed twice for the VIP",
            ));
        }
        backends.push(backend);
    }
    Ok(backends)
}
