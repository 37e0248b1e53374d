//! Configuration changes, from the file or the API: validated, applied in one step, written
//! back; and the state file that goes with the pinned maps.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::base::config::{Config, Forwarding, RawConfig};
use crate::base::files::write_atomically;
use crate::base::net::MacAddr;
use crate::dataplane::settings::data_plane_settings;
use crate::state::wire::ChangeResult;
use crate::vips::ApplyReport;

use super::{ChangeError, Daemon};

impl Daemon {
    /// The configured VIP `name`, or a not-found error naming it.
    pub fn vip_named(&self, name: &str) -> Result<&crate::base::config::VipConfig, ChangeError> {
        self.config
            .vip(name)
            .ok_or_else(|| ChangeError::NotFound(format!("no VIP named {name:?}")))
    }

    /// Drains a VIP from BGP announcement (`drain`) or returns it.
    pub fn drain_vip(&mut self, name: &str, drain: bool) -> Result<ChangeResult, ChangeError> {
        self.vip_named(name)?;
        let changed = if drain {
            self.drained_vips.insert(name.to_string())
        } else {
            self.drained_vips.remove(name)
        };
        self.announce();
        Ok(ChangeResult {
            message: format!(
                "VIP {name} {}{}",
                if drain {
                    "drained from announcement"
                } else {
                    "announced again"
                },
                if changed { "" } else { " (already)" }
            ),
            ..ChangeResult::default()
        })
    }

    /// Saves the bookkeeping that goes with the pinned maps.
    pub fn persist_state(&self) {
        let snapshot = self.balancer.snapshot();
        match serde_json::to_vec_pretty(&snapshot) {
            Ok(bytes) => {
                if let Err(e) = write_atomically(&self.config.state_file, &bytes) {
                    tracing::error!(path = %self.config.state_file.display(), "writing the state file: {e}");
                }
            }
            Err(e) => tracing::error!("encoding the state file: {e}"),
        }
    }

    /// Makes `new` the configuration in force. Settings only a restart can change are refused.
    /// `origin` names the source for logs and metrics; with `write_file`, the config file is
    /// rewritten to match.
    pub fn apply_config(
        &mut self,
        new: Config,
        origin: &str,
        write_file: bool,
    ) -> Result<ApplyReport, ChangeError> {
        let result = self.try_apply(new, write_file);
        if let Err(e) = &result {
            self.metrics
                .change_errors
                .with_label_values(&[origin])
                .inc();
            if e.is_publish_failure() {
                self.metrics
                    .publish_errors
                    .with_label_values(&[origin])
                    .inc();
            }
            tracing::warn!(origin, "change refused: {e}");
        }
        result
    }

    pub(super) fn try_apply(
        &mut self,
        mut new: Config,
        write_file: bool,
    ) -> Result<ApplyReport, ChangeError> {
        new.place_pool_backends(&self.served);
        crate::base::config::check_vip_set(&new.vips)?;
        let old = &self.config;
        let fixed = [
            ("interface", old.interface != new.interface),
            ("attach_mode", old.attach_mode != new.attach_mode),
            ("nat.interface", old.nat.interface != new.nat.interface),
            ("pin_dir", old.pin_dir != new.pin_dir),
            ("state_file", old.state_file != new.state_file),
            (
                "conntrack.max_flows",
                old.conntrack.max_flows != new.conntrack.max_flows,
            ),
            ("api", old.api != new.api),
            ("metrics", old.metrics != new.metrics),
            ("fleet", old.fleet != new.fleet),
        ];
        if let Some((key, _)) = fixed.iter().find(|(_, changed)| *changed) {
            return Err(ChangeError::Invalid(format!(
                "{key} only changes with a restart of the daemon"
            )));
        }
        // Next hops of backends the kernel does not know yet.
        let mut unknown: Vec<(IpAddr, bool)> = new
            .vips
            .iter()
            .flat_map(|v| {
                let current = self.balancer.vip(&v.name);
                let nat = v.forwarding == Forwarding::Nat;
                v.backends
                    .iter()
                    .filter(move |b| {
                        b.mac.is_none()
                            && current.is_none_or(|c| !c.backends.contains_key(&b.address))
                    })
                    .map(move |b| (b.address, nat))
            })
            .collect();
        unknown.sort();
        unknown.dedup();
        let macs: HashMap<IpAddr, MacAddr> = if unknown.is_empty() {
            HashMap::new()
        } else {
            self.links
                .resolve(&*self.next_hops, &unknown, self.neighbour_timeout)?
        };
        let mut settings = data_plane_settings(
            &new,
            &self.links.clients,
            self.balancer.settings().flow_seed,
        )?;
        settings.flow_bucket_mask = self.balancer.settings().flow_bucket_mask;
        crate::dataplane::settings::check_nat_ports(
            &new,
            crate::dataplane::settings::ephemeral_ports(),
        )?;
        let snat = crate::dataplane::settings::snat_sources(&new, self.links.of_backends(true))?;
        if settings != *self.balancer.settings() {
            self.balancer.set_settings(&settings)?;
        }
        self.balancer.set_removal_grace(new.conntrack.removal_grace);
        self.balancer.set_tiers(&new.tiers)?;
        self.balancer.set_snat_sources(snat);
        let report = self.balancer.apply(&new.vips, &macs);
        // Whatever happened, the kernel state is what the bookkeeping says: save it.
        self.persist_state();
        let report = report?;
        self.record(&report);
        if write_file {
            write_atomically(&self.config_path, new.to_toml().as_bytes()).map_err(|e| {
                ChangeError::Failed(format!(
                    "applied, but writing {} failed: {e}",
                    self.config_path.display()
                ))
            })?;
        }
        self.config = new;
        self.config_generation += 1;
        Ok(report)
    }

    /// How many configs were put in force since the daemon started: the loops that follow
    /// the config need a look only when this moved.
    pub fn config_generation(&self) -> u64 {
        self.config_generation
    }

    /// Records a change's table work in the metrics.
    pub fn record(&self, report: &ApplyReport) {
        self.local_view_changed();
        if report.tables_published > 0 {
            self.metrics
                .table_build_seconds
                .observe(report.table_build_time.as_secs_f64());
            self.metrics
                .table_publish_seconds
                .observe(report.table_publish_time.as_secs_f64());
        }
        for name in &report.rebuilt {
            self.metrics.table_rebuilds.with_label_values(&[name]).inc();
        }
    }

    /// Applies an edit of the config's file form (the API's changes), validated exactly like
    /// the file, and writes the config file.
    pub fn edit(
        &mut self,
        what: &str,
        edit: impl FnOnce(&mut RawConfig) -> Result<(), ChangeError>,
    ) -> Result<ChangeResult, ChangeError> {
        let mut raw = self.config.to_raw();
        edit(&mut raw)?;
        let new = Config::from_raw(raw)?;
        let report = self.apply_config(new, "api", true)?;
        Ok(change_result(what, &report))
    }

    /// Re-reads the config file.
    pub fn reload(&mut self, origin: &str) -> Result<ChangeResult, ChangeError> {
        let new = match Config::load(&self.config_path) {
            Ok(c) => c,
            Err(e) => {
                self.metrics
                    .change_errors
                    .with_label_values(&[origin])
                    .inc();
                return Err(e.into());
            }
        };
        let report = self.apply_config(new, origin, false)?;
        Ok(change_result("config reloaded", &report))
    }
}

pub(super) fn change_result(what: &str, report: &ApplyReport) -> ChangeResult {
    ChangeResult {
        message: what.to_string(),
        vips_added: report.vips_added,
        vips_removed: report.vips_removed,
        vips_updated: report.vips_updated,
        tables_published: report.tables_published,
        slots_changed: report.slots_changed,
    }
}
