//! What the API and the metrics page show: status, statistics, tables and weights.

use std::time::Instant;

use balancer_common::maps::BOUND_SHARE_SCALE;
use balancer_common::stats::Counter;

use crate::base::config::{HealthCheckKind, TelemetrySource, VipConfig};
use crate::state::wire::{
    AdmissionStatus, BackendStatus, Stats, Status, Table, TableShare, TierAdmissionStatus,
    VipStatus, VipWeights, WeightRow,
};
use crate::steering::policy::PolicyKind;
use crate::vips::{BackendState, VipState};

use super::{ChangeError, Daemon};

impl Daemon {
    /// The policy inputs and weights of every VIP.
    pub fn weights(&self) -> Vec<VipWeights> {
        let now = Instant::now();
        self.config
            .vips
            .iter()
            .map(|v| {
                let endpoint = v.endpoint();
                let state = self.balancer.vip(&v.name);
                let decisions = self.decisions.get(&v.name);
                VipWeights {
                    vip: v.name.clone(),
                    policy: v.policy.kind.name().to_string(),
                    pool_saturated: v
                        .admission
                        .as_ref()
                        .map(|_| state.is_some_and(|s| s.saturated)),
                    // Only while the VIP scrapes (a VIP changed to pushed reports keeps no
                    // loop to update it).
                    scrape_interval_ms: match &v.telemetry.source {
                        TelemetrySource::Scrape(_) => self
                            .scrape_intervals
                            .get(&v.name)
                            .map(|w| w.as_millis() as u64),
                        _ => None,
                    },
                    telemetry: match &v.telemetry.source {
                        TelemetrySource::None => "none".into(),
                        TelemetrySource::Push => "push".into(),
                        TelemetrySource::Scrape(pages) => pages
                            .iter()
                            .map(|(p, path)| format!(":{p}{path}"))
                            .collect::<Vec<_>>()
                            .join(" "),
                    },
                    backends: v
                        .backends
                        .iter()
                        .map(|b| {
                            let t = self.telemetry.get(&endpoint, b.address);
                            let bs = state.and_then(|s| s.backends.get(&b.address));
                            let decision =
                                decisions.and_then(|d| d.iter().find(|d| d.address == b.address));
                            WeightRow {
                                address: b.address,
                                configured_weight: b.weight,
                                weight: bs.map(|s| s.table_weight()).unwrap_or(0),
                                reason: decision.map(|d| d.reason.clone()).unwrap_or_else(|| {
                                    if v.policy.kind == PolicyKind::Static {
                                        "static: configured weight".into()
                                    } else {
                                        "no round yet".into()
                                    }
                                }),
                                saturated: decision.is_some_and(|d| d.saturated),
                                returning_elsewhere: bs.is_some_and(|s| s.returning_elsewhere),
                                signals: t.and_then(|t| t.latest.as_ref().map(|(s, _)| s.clone())),
                                report_age_ms: t
                                    .and_then(|t| t.age(now))
                                    .map(|a| a.as_millis() as u64),
                                flows: bs.and_then(|s| self.flows.get(&s.id).copied()).unwrap_or(0),
                                reports: t.map(|t| t.reports).unwrap_or(0),
                                errors: t.map(|t| t.errors).unwrap_or(0),
                                last_error: t.and_then(|t| t.last_error.clone()),
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    pub(super) fn vip_statuses(&self) -> Vec<VipStatus> {
        self.balancer
            .vips()
            .map(|vip| self.vip_status(vip))
            .collect()
    }

    /// One VIP's status: its settings, traffic and backends (those retiring last).
    fn vip_status(&self, vip: &VipState) -> VipStatus {
        let endpoint = vip.config.endpoint();
        let mut backends = self.backend_statuses(vip);
        for r in self
            .balancer
            .retiring()
            .iter()
            .filter(|r| r.vip == endpoint)
        {
            backends.push(self.retiring_status(&r.state));
        }
        let t = self.vip_traffic.get(&vip.id).copied().unwrap_or_default();
        let c = &vip.config;
        VipStatus {
            name: c.name.clone(),
            address: c.address,
            port: c.port,
            protocol: c.protocol.to_string(),
            forwarding: c.forwarding.to_string(),
            scheduler: scheduler_label(vip),
            table_size: c.table_size,
            table_fingerprint: format!("{:016x}", vip.fingerprint()),
            health_check: health_check_label(c),
            packets: t.totals.packets,
            bytes: t.totals.bytes,
            new_flows: t.totals.new_flows,
            pps: t.pps,
            bps: t.bps,
            flows: backends.iter().map(|b| b.flows).sum(),
            backends,
            announced: self.config.bgp.is_some()
                && self.announcer.announced().contains(&c.address)
                && !self.drained_vips.contains(&c.name),
            admission: self.admission_status(vip),
        }
    }

    /// The status of each backend in a VIP's table.
    fn backend_statuses(&self, vip: &VipState) -> Vec<BackendStatus> {
        let endpoint = vip.config.endpoint();
        let shares = vip.slot_shares();
        let table_len = vip.table.len().max(1) as f64;
        let homes = self.balancer.homes(&endpoint).unwrap_or_else(|e| {
            tracing::warn!(vip = %vip.config.name, "reading session persistence's homes: {e}");
            Default::default()
        });
        vip.backends
            .values()
            .map(|b| {
                let t = self.backend_traffic.get(&b.id).copied().unwrap_or_default();
                BackendStatus {
                    address: b.address,
                    weight: b.weight,
                    drained: b.drained,
                    healthy: b.healthy,
                    health: self.health_label(&endpoint, b.address, &vip.config.health.kind),
                    table_share: shares.get(&b.address).copied().unwrap_or(0) as f64 / table_len,
                    flows: self.flows.get(&b.id).copied().unwrap_or(0),
                    packets: t.totals.packets,
                    bytes: t.totals.bytes,
                    new_flows: t.totals.new_flows,
                    pps: t.pps,
                    bps: t.bps,
                    retiring: false,
                    bound_share: (vip.config.load_bound_pct > 0)
                        .then(|| f64::from(b.bound_share) / f64::from(BOUND_SHARE_SCALE)),
                    homed_clients: homes.get(&b.address).map(|h| h.clients),
                    home_capacity: homes.get(&b.address).and_then(|h| h.capacity),
                }
            })
            .collect()
    }

    /// The status of a removed backend in its grace period.
    fn retiring_status(&self, state: &BackendState) -> BackendStatus {
        let t = self
            .backend_traffic
            .get(&state.id)
            .copied()
            .unwrap_or_default();
        BackendStatus {
            address: state.address,
            weight: state.weight,
            drained: true,
            healthy: state.healthy,
            health: "removed".into(),
            table_share: 0.0,
            flows: self.flows.get(&state.id).copied().unwrap_or(0),
            packets: t.totals.packets,
            bytes: t.totals.bytes,
            new_flows: t.totals.new_flows,
            pps: t.pps,
            bps: t.bps,
            retiring: true,
            bound_share: None,
            homed_clients: None,
            home_capacity: None,
        }
    }

    /// A VIP's admission control with its counters per client tier (`None` without it).
    fn admission_status(&self, vip: &crate::vips::VipState) -> Option<AdmissionStatus> {
        let a = vip.config.admission.as_ref()?;
        let counts = match self.balancer.admission_counts(vip.id) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(vip = %vip.config.name, "reading the admission counters: {e}");
                Default::default()
            }
        };
        let names = std::iter::once(("none", 0u8))
            .chain(self.config.tiers.iter().map(|t| (t.name.as_str(), t.id)));
        let fair = a.fair.then(|| {
            let (shares, _) = self.balancer.tenants(a);
            let rates = self.balancer.fair_rates(vip.id, a, vip.saturated);
            let state = self.balancer.fair_state(vip.id);
            (
                shares,
                rates,
                state.map(|s| s.asked()),
                state.and_then(|s| s.capacity()),
            )
        });
        let tiers = names
            .map(|(name, id)| {
                let c = counts.get(usize::from(id)).copied().unwrap_or_default();
                let i = usize::from(id);
                let tenant = fair
                    .as_ref()
                    .filter(|(shares, ..)| shares.get(i).is_some_and(|s| *s > 0));
                TierAdmissionStatus {
                    tier: name.to_string(),
                    // Clients of no tier are never admitted while saturated (but in fair
                    // admission, where every tenant is).
                    admitted: if a.fair {
                        tenant.is_some()
                    } else {
                        id != 0 && a.admit.contains_key(name)
                    },
                    cap: if id != 0 {
                        a.admit.get(name).copied().unwrap_or(0)
                    } else {
                        0
                    },
                    admitted_flows: c.admitted,
                    shed_saturated: c.shed_saturated,
                    shed_over_cap: c.shed_over_cap,
                    overflowed: c.overflowed,
                    share: tenant.map(|(shares, ..)| shares[i]),
                    rate: tenant.and_then(|(_, rates, ..)| rates[i]),
                    asked: tenant.and_then(|(_, _, asked, _)| asked.map(|a| a[i])),
                }
            })
            .collect();
        Some(AdmissionStatus {
            saturated: vip.saturated,
            refuse: a.refuse.name().to_string(),
            overflow: a.overflow.clone(),
            tiers,
            fair: a.fair,
            capacity: fair.and_then(|(.., capacity)| capacity),
        })
    }

    pub fn status(&self) -> Status {
        Status {
            interface: self.config.interface.clone(),
            attach_mode: self.config.attach_mode.to_string(),
            pin_dir: self.config.pin_dir.display().to_string(),
            uptime_secs: self.started.elapsed().as_secs(),
            vips: self.vip_statuses(),
            fleet: self.config.fleet.as_ref().map(|_| self.fleet.clone()),
            bgp: self
                .config
                .bgp
                .as_ref()
                .map(|_| crate::state::wire::BgpStatus {
                    announced: self.announcer.announced().into_iter().collect(),
                    drained: self.drained_vips.iter().cloned().collect(),
                    last_error: self.announcer.last_error.clone(),
                }),
        }
    }

    pub fn stats(&self) -> Result<Stats, ChangeError> {
        let global = self.balancer.global_stats()?;
        let links = self
            .balancer
            .dataplane()
            .nat_link_stats()
            .map_err(crate::vips::BalancerError::from)?;
        let mut counters: std::collections::BTreeMap<String, u64> = Counter::ALL
            .iter()
            .map(|c| (c.name().to_string(), global.get(*c)))
            .collect();
        counters.insert("nat_redirect_to_backends".into(), links.to_backends);
        counters.insert("nat_redirect_to_clients".into(), links.to_clients);
        Ok(Stats {
            counters,
            vips: self.vip_statuses(),
        })
    }

    pub fn table(&self, name: &str) -> Result<Table, ChangeError> {
        self.vip_named(name)?;
        let vip = self
            .balancer
            .vip(name)
            .ok_or_else(|| ChangeError::Failed(format!("VIP {name:?} is not in the data plane")))?;
        let shares = vip.slot_shares();
        let total_weight: u64 = vip
            .backends
            .values()
            .map(|b| u64::from(b.table_weight()))
            .sum();
        let len = vip.table.len().max(1) as f64;
        Ok(Table {
            vip: name.to_string(),
            table_size: vip.config.table_size,
            fingerprint: format!("{:016x}", vip.fingerprint()),
            backends: vip
                .backends
                .values()
                .map(|b| {
                    let slots = shares.get(&b.address).copied().unwrap_or(0);
                    TableShare {
                        address: b.address,
                        weight: b.table_weight(),
                        weight_share: if total_weight == 0 {
                            0.0
                        } else {
                            f64::from(b.table_weight()) / total_weight as f64
                        },
                        slots,
                        slot_share: slots as f64 / len,
                    }
                })
                .collect(),
        })
    }

    /// The Prometheus exposition: the registry's metrics and the families read from the
    /// data plane and the views at this moment.
    pub fn render_metrics(&self) -> String {
        let counters = self.balancer.global_stats().ok().map(|global| {
            crate::state::metrics::render::Counters {
                global,
                nat_links: self
                    .balancer
                    .dataplane()
                    .nat_link_stats()
                    .unwrap_or_default(),
            }
        });
        self.metrics.render(crate::state::metrics::render::families(
            counters.as_ref(),
            &self.status(),
            &self.weights(),
        ))
    }
}

/// A VIP's scheduler and what modifies it: persistence, the load bound, the affinity prefix.
fn scheduler_label(vip: &VipState) -> String {
    let c = &vip.config;
    let mut s = c.scheduler.name().to_string();
    if !c.persistence.is_zero() {
        s.push_str(&format!(", persistence {}s", c.persistence.as_secs()));
    }
    if c.load_bound_pct > 0 {
        s.push_str(&format!(
            ", max load {:.2}x",
            1.0 + f64::from(c.load_bound_pct) / 100.0
        ));
        let mean_flow = vip.bound.mean_flow();
        if !mean_flow.is_zero() {
            s.push_str(&format!(
                " of weights averaged over {:.1}s",
                mean_flow.as_secs_f64()
            ));
        }
    }
    if c.affinity_prefix.is_prefix() {
        s.push_str(&format!(
            ", by /{} and /{}",
            c.affinity_prefix.v4, c.affinity_prefix.v6
        ));
    }
    s
}

/// A VIP's health check as one label (`tcp:80`, `https:443/health -> 200`).
fn health_check_label(c: &VipConfig) -> String {
    match &c.health.kind {
        HealthCheckKind::None => "none".into(),
        HealthCheckKind::Tcp => format!("tcp:{}", c.health.port),
        HealthCheckKind::Http {
            path,
            expect_status,
            tls,
        } => {
            let scheme = if tls.is_some() { "https" } else { "http" };
            format!("{scheme}:{}{} -> {expect_status}", c.health.port, path)
        }
    }
}
