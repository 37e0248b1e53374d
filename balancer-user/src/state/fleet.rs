//! The fleet's side of the daemon: adopting the weights a leader published, and the VIPs
//! announced over BGP.

use std::net::IpAddr;

use super::Daemon;

impl Daemon {
    /// Builds the tables from the weights a fleet's leader published, or (`None`) from this
    /// balancer's own view again. Whether it worked.
    pub fn apply_fleet(&mut self, weights: Option<&crate::steering::fleet::FleetWeights>) -> bool {
        self.publish_fleet(weights).is_some()
    }

    /// [`Daemon::apply_fleet`]: None when it failed, else when the first changed table went
    /// live (None: no table changed).
    fn publish_fleet(
        &mut self,
        weights: Option<&crate::steering::fleet::FleetWeights>,
    ) -> Option<Option<std::time::Instant>> {
        match self.balancer.set_fleet_weights(weights) {
            Ok(report) => {
                if report.tables_published > 0 {
                    self.record(&report);
                    self.persist_state();
                    return Some(report.live_at);
                }
                Some(None)
            }
            Err(e) => {
                self.metrics
                    .publish_errors
                    .with_label_values(&["fleet"])
                    .inc();
                tracing::error!("applying the fleet's weights: {e}");
                None
            }
        }
    }

    /// Takes a state the fleet's leader published: its weights, then its VIPs and backends
    /// (rewriting this balancer's config file to match). The weights go first, so that the
    /// tables of the VIPs both balancers have are live before the config work; VIPs and
    /// backends the config brings take their published weights right after. None when it
    /// failed, else when its first changed table went live (None: no table changed).
    pub fn adopt_fleet(
        &mut self,
        state: &crate::steering::fleet::FleetState,
    ) -> Option<Option<std::time::Instant>> {
        let applied = self.publish_fleet(Some(&state.vips))?;
        let ours = crate::steering::fleet::vip_config(&self.config);
        if !state.vip_config.is_empty()
            && !crate::steering::fleet::same_vips(&ours, &state.vip_config)
        {
            // Files only under api.file_dir: a writer of the fleet's store is no root here.
            let dir = self.config.api.file_dir.clone();
            if let Some(e) = state
                .vip_config
                .iter()
                .find_map(|v| crate::base::config::check_files_under(v, dir.as_deref()).err())
            {
                tracing::error!(epoch = state.epoch, "fleet: the leader's VIPs refused: {e}");
                return Some(applied);
            }
            let theirs = state.vip_config.clone();
            match self.edit("fleet state", move |raw| {
                raw.vip = theirs;
                Ok(())
            }) {
                Ok(r) => tracing::info!(
                    epoch = state.epoch,
                    added = r.vips_added,
                    removed = r.vips_removed,
                    updated = r.vips_updated,
                    "fleet: took the leader's VIPs"
                ),
                // The weights still apply to the VIPs both have; the error repeats each epoch.
                Err(e) => tracing::error!(
                    epoch = state.epoch,
                    "fleet: the leader's VIPs do not apply here: {e}"
                ),
            }
            let later = self.publish_fleet(Some(&state.vips))?;
            return Some(applied.or(later));
        }
        Some(applied)
    }

    /// The addresses of the VIPs this balancer can serve: a backend in the table, not
    /// drained from announcement.
    pub fn announceable(&self) -> std::collections::BTreeSet<IpAddr> {
        self.balancer
            .vips()
            .filter(|v| !self.drained_vips.contains(&v.config.name))
            .filter(|v| v.backends.values().any(|b| b.table_weight() > 0))
            .map(|v| v.config.address)
            .collect()
    }

    /// Tells BIRD the VIPs to announce, when `[bgp]` is set (cheap when nothing changed).
    pub fn announce(&mut self) {
        if let Some(bgp) = self.config.bgp.clone() {
            let addresses = self.announceable();
            self.announcer.announce(&bgp, &addresses);
        }
    }

    /// Withdraws every route (shutdown).
    pub fn withdraw_all(&mut self) {
        if let Some(bgp) = self.config.bgp.clone() {
            self.announcer.announce(&bgp, &Default::default());
        }
    }
}
