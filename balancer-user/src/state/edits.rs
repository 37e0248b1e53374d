//! The changes the API and the CLI make to VIPs and backends, and pushed reports: each
//! checked against the config in force, written into the raw config, and applied as one change
//! (see [`Daemon::edit`]). The API only translates HTTP to these calls.

use std::net::IpAddr;

use super::{ChangeError, Daemon};
use crate::base::config::{
    MAX_WEIGHT, RawBackend, RawConfig, RawVip, service, validate_backend, validate_vip,
};
use crate::state::wire::{ChangeResult, SchedulerBody, TenantBody};

/// The raw VIP `name` in an edit, or the error that it is missing.
fn raw_vip<'a>(c: &'a mut RawConfig, name: &str) -> Result<&'a mut RawVip, ChangeError> {
    c.vip
        .iter_mut()
        .find(|v| v.name.as_deref() == Some(name))
        .ok_or_else(|| ChangeError::NotFound(format!("no VIP named {name:?}")))
}

fn parse_backend(addr: &str) -> Result<IpAddr, ChangeError> {
    addr.parse()
        .map_err(|_| ChangeError::Invalid(format!("{addr:?} is not an IP address")))
}

fn is_backend(b: &RawBackend, address: IpAddr) -> bool {
    b.address.as_deref().and_then(|a| a.parse::<IpAddr>().ok()) == Some(address)
}

impl Daemon {
    /// The address of backend `addr` of VIP `name`, if the VIP has it.
    fn existing_backend(&self, name: &str, addr: &str) -> Result<IpAddr, ChangeError> {
        let address = parse_backend(addr)?;
        if self.vip_named(name)?.backend(address).is_none() {
            return Err(ChangeError::NotFound(format!(
                "VIP {name:?} has no backend {address}"
            )));
        }
        Ok(address)
    }

    /// Adds a VIP (no name: the one validation derives, so later commands find it), or a
    /// service: one VIP per address, protocol and port it lists, all or none.
    pub fn add_vip(&mut self, raw: RawVip) -> Result<ChangeResult, ChangeError> {
        if raw.service.is_some() {
            return Err(ChangeError::Invalid(
                "service is set by the daemon: list addresses, ports or protocols instead".into(),
            ));
        }
        let mut added = Vec::new();
        for member in service::expand(raw, "vip")? {
            let vip = validate_vip(member.clone(), "vip")?;
            if self.config.vip(&vip.name).is_some() {
                return Err(ChangeError::Conflict(format!(
                    "a VIP named {:?} exists",
                    vip.name
                )));
            }
            if let Some(other) = self
                .config
                .vips
                .iter()
                .find(|v| v.endpoint() == vip.endpoint())
            {
                return Err(ChangeError::Conflict(format!(
                    "VIP {:?} already serves {}/{}",
                    other.name,
                    std::net::SocketAddr::new(vip.address, vip.port),
                    vip.protocol
                )));
            }
            added.push(RawVip {
                name: Some(vip.name),
                ..member
            });
        }
        let names: Vec<String> = added.iter().filter_map(|v| v.name.clone()).collect();
        let what = match names.as_slice() {
            [one] => format!("VIP {one} added"),
            _ => format!("{} VIPs added: {}", names.len(), names.join(", ")),
        };
        self.edit(&what, |c| {
            c.vip.extend(added);
            Ok(())
        })
    }

    pub fn remove_vip(&mut self, name: &str) -> Result<ChangeResult, ChangeError> {
        self.vip_named(name)?;
        self.edit(&format!("VIP {name} removed"), |c| {
            c.vip.retain(|v| v.name.as_deref() != Some(name));
            Ok(())
        })
    }

    pub fn set_scheduler(
        &mut self,
        name: &str,
        body: SchedulerBody,
    ) -> Result<ChangeResult, ChangeError> {
        self.vip_named(name)?;
        let what = format!("scheduler of {name} set to {}", body.scheduler);
        self.edit(&what, |c| {
            let vip = raw_vip(c, name)?;
            vip.scheduler = Some(body.scheduler);
            if let Some(p) = body.persistence_secs {
                vip.persistence_secs = Some(p);
            }
            match body.max_load_factor {
                Some(0.0) => vip.max_load_factor = None,
                Some(f) => vip.max_load_factor = Some(f),
                None => {}
            }
            if let Some(len) = body.affinity_prefix_v4 {
                vip.affinity_prefix_v4 = Some(len);
            }
            if let Some(len) = body.affinity_prefix_v6 {
                vip.affinity_prefix_v6 = Some(len);
            }
            Ok(())
        })
    }

    /// Changes tier `name`'s share and rate limit as a tenant of fair admission. Only the
    /// admission entries of the VIPs with fair admission change: no table, no flow.
    pub fn set_tenant(
        &mut self,
        name: &str,
        body: TenantBody,
    ) -> Result<ChangeResult, ChangeError> {
        if !self.config.tiers.iter().any(|t| t.name == name) {
            return Err(ChangeError::NotFound(format!("no tier named {name:?}")));
        }
        if body.share.is_none() && body.max_new_flows_per_sec.is_none() {
            return Err(ChangeError::Invalid(
                "nothing to change: give share or max_new_flows_per_sec".into(),
            ));
        }
        let mut said = Vec::new();
        if let Some(s) = body.share {
            said.push(format!("share {s}"));
        }
        match body.max_new_flows_per_sec {
            Some(0) => said.push("no rate limit".into()),
            Some(r) => said.push(format!("at most {r} new flows/s")),
            None => {}
        }
        let what = format!("tier {name}: {}", said.join(", "));
        self.edit(&what, |c| {
            let tier = c
                .tier
                .iter_mut()
                .find(|t| t.name.as_deref() == Some(name))
                .ok_or_else(|| ChangeError::NotFound(format!("no tier named {name:?}")))?;
            if let Some(s) = body.share {
                tier.share = Some(s);
            }
            match body.max_new_flows_per_sec {
                Some(0) => tier.max_new_flows_per_sec = None,
                Some(r) => tier.max_new_flows_per_sec = Some(r),
                None => {}
            }
            Ok(())
        })
    }

    pub fn add_backend(
        &mut self,
        name: &str,
        raw: RawBackend,
    ) -> Result<ChangeResult, ChangeError> {
        let backend = validate_backend(raw.clone(), "backend")?;
        if self.vip_named(name)?.backend(backend.address).is_some() {
            return Err(ChangeError::Conflict(format!(
                "backend {} is already in VIP {name:?}",
                backend.address
            )));
        }
        self.edit(
            &format!("backend {} added to {name}", backend.address),
            |c| {
                raw_vip(c, name)?.backend.push(raw);
                Ok(())
            },
        )
    }

    pub fn remove_backend(&mut self, name: &str, addr: &str) -> Result<ChangeResult, ChangeError> {
        let address = self.existing_backend(name, addr)?;
        self.edit(&format!("backend {address} removed from {name}"), |c| {
            raw_vip(c, name)?
                .backend
                .retain(|b| !is_backend(b, address));
            Ok(())
        })
    }

    pub fn set_backend_weight(
        &mut self,
        name: &str,
        addr: &str,
        weight: i64,
    ) -> Result<ChangeResult, ChangeError> {
        if !(0..=i64::from(MAX_WEIGHT)).contains(&weight) {
            return Err(ChangeError::Invalid(format!(
                "weight = {weight}: must be between 0 and {MAX_WEIGHT}"
            )));
        }
        self.edit_backend(name, addr, "weight set", |b| b.weight = Some(weight))
    }

    /// Drains (no new flows; established ones continue) or undrains a backend.
    pub fn drain_backend(
        &mut self,
        name: &str,
        addr: &str,
        drained: bool,
    ) -> Result<ChangeResult, ChangeError> {
        let what = if drained { "drained" } else { "undrained" };
        self.edit_backend(name, addr, what, |b| {
            b.drained = drained.then_some(true);
        })
    }

    /// Drains or undrains backend `addr` in every VIP (and pool) that has it, as one change:
    /// a host's maintenance in one command.
    pub fn drain_backend_everywhere(
        &mut self,
        addr: &str,
        drained: bool,
    ) -> Result<ChangeResult, ChangeError> {
        let what = if drained { "drained" } else { "undrained" };
        self.edit_backend_everywhere(addr, what, |list, address| {
            for b in list.iter_mut().filter(|b| is_backend(b, address)) {
                b.drained = drained.then_some(true);
            }
        })
    }

    /// Removes backend `addr` from every VIP (and pool) that has it, as one change.
    pub fn remove_backend_everywhere(&mut self, addr: &str) -> Result<ChangeResult, ChangeError> {
        self.edit_backend_everywhere(addr, "removed", |list, address| {
            list.retain(|b| !is_backend(b, address));
        })
    }

    /// Applies `f` to the backend lists of every VIP and pool, as one change; the VIPs that
    /// have backend `addr` are named in the answer (none: not found).
    fn edit_backend_everywhere(
        &mut self,
        addr: &str,
        what: &str,
        f: impl Fn(&mut Vec<RawBackend>, IpAddr),
    ) -> Result<ChangeResult, ChangeError> {
        let address = parse_backend(addr)?;
        let vips: Vec<String> = self
            .config
            .vips
            .iter()
            .filter(|v| v.backend(address).is_some())
            .map(|v| v.name.clone())
            .collect();
        if vips.is_empty() {
            return Err(ChangeError::NotFound(format!(
                "no VIP has backend {address}"
            )));
        }
        let message = format!(
            "backend {address} {what} in {} VIP(s): {}",
            vips.len(),
            vips.join(", ")
        );
        self.edit(&message, |c| {
            for vip in &mut c.vip {
                f(&mut vip.backend, address);
            }
            for pool in &mut c.pool {
                f(&mut pool.backend, address);
            }
            Ok(())
        })
    }

    /// A report pushed by backend `addr` (`balancer report --push`), for every VIP that takes
    /// its pushed reports.
    pub fn push_report(
        &mut self,
        addr: &str,
        signals: crate::steering::telemetry::signals::Signals,
    ) -> Result<ChangeResult, ChangeError> {
        let backend = parse_backend(addr)?;
        let vips = self.record_push(backend, signals)?;
        Ok(ChangeResult {
            message: format!("report from {backend} recorded for {vips} VIP(s)"),
            ..ChangeResult::default()
        })
    }

    /// Edits backend `addr` of VIP `name` with `f`, as one change.
    fn edit_backend(
        &mut self,
        name: &str,
        addr: &str,
        what: &str,
        f: impl FnOnce(&mut RawBackend),
    ) -> Result<ChangeResult, ChangeError> {
        let address = self.existing_backend(name, addr)?;
        self.edit(&format!("backend {address} of {name}: {what}"), |c| {
            let b = raw_vip(c, name)?
                .backend
                .iter_mut()
                .find(|b| is_backend(b, address))
                .ok_or_else(|| {
                    ChangeError::NotFound(format!("VIP {name:?} has no backend {address}"))
                })?;
            f(b);
            Ok(())
        })
    }
}
