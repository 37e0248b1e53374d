//! Staging one VIP: what a config changes for it, worked out and written where no packet can see it
//! yet (ids, new backend entries, its table).

use super::*;

/// A VIP's backends as staged: every one by address, how many are new, and those to rewrite
/// once the table is live.
#[derive(Default)]
pub(super) struct StagedBackends {
    pub(super) backends: BTreeMap<IpAddr, BackendState>,
    pub(super) added: usize,
    /// Backends that failed their health checks: made inactive once the table is live.
    pub(super) deactivate: Vec<BackendState>,
    /// Backends whose weight changed: rewritten once the table is live.
    pub(super) reweighted: Vec<BackendState>,
}

/// What a config change touches of a VIP, besides its backends coming and going.
pub(super) struct Changes {
    /// Its VIP-index entry.
    pub(super) meta: bool,
    /// Its config at all.
    pub(super) config: bool,
    /// A backend's health.
    pub(super) health: bool,
    /// What its table is built from: a backend's table weight or tier, or the table's size.
    pub(super) table_inputs: bool,
    /// The table's size.
    pub(super) resized: bool,
    /// Whether it counts active flows: the counts start from zero (flows recorded before are
    /// not in them; their ends are not subtracted, see `FlowValue::counted`).
    pub(super) counting: bool,
}

impl Changes {
    fn of(
        id: u32,
        config: &VipConfig,
        current: Option<&VipState>,
        old_backends: &BTreeMap<IpAddr, BackendState>,
        staged: &StagedBackends,
    ) -> Changes {
        let meta = vip_meta(id, config);
        let old = |b: &BackendState| old_backends.get(&b.address);
        let resized = current.is_some_and(|c| c.config.table_size != config.table_size);
        Changes {
            meta: current.is_none_or(|c| vip_meta(id, &c.config) != meta),
            config: current.is_none_or(|c| c.config != *config),
            health: staged
                .backends
                .values()
                .any(|b| old(b).is_some_and(|o| o.healthy != b.healthy)),
            table_inputs: resized
                || staged.backends.values().any(|b| {
                    old(b).is_some_and(|o| o.table_weight() != b.table_weight() || o.tier != b.tier)
                }),
            resized,
            counting: current
                .is_some_and(|c| vip_meta(id, &c.config).counts_active() != meta.counts_active()),
        }
    }
}

impl<D: Dataplane> Balancer<D> {
    /// Works out what `config` changes for one VIP and does the parts no packet can see yet:
    /// allocates ids, writes new backend entries, builds the table. `None` if nothing changes.
    pub(in crate::vips) fn stage_vip(
        &mut self,
        endpoint: &Endpoint,
        config: &VipConfig,
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<Option<StagedVip>, BalancerError> {
        // The averaged shares take in the weights in force until now.
        self.age_bound_shares(endpoint);
        let current = self.vips.get(endpoint).cloned();
        let is_new = current.is_none();
        let id = match &current {
            Some(c) => c.id,
            None => self.new_vip_id()?,
        };
        let old_backends = current
            .as_ref()
            .map(|c| c.backends.clone())
            .unwrap_or_default();
        let staged = self.stage_backends(endpoint, id, config, macs, &old_backends)?;
        let retired: Vec<BackendState> = old_backends
            .values()
            .filter(|old| !staged.backends.contains_key(&old.address))
            .cloned()
            .collect();
        let current_saturated = self.write_vip_settings(endpoint, id, config, current.as_ref())?;
        let changes = Changes::of(id, config, current.as_ref(), &old_backends, &staged);
        let spill = self.spill_of(&staged.backends);
        // A new scheduler may need another schedule, new tier settings another header: the
        // table is published again.
        let rescheduled = current
            .as_ref()
            .is_some_and(|c| c.config.scheduler != config.scheduler || c.spill != spill);
        if changes.counting {
            self.restart_counts(&staged.backends, &old_backends)?;
        }
        let rebuild = is_new || staged.added > 0 || !retired.is_empty() || changes.table_inputs;
        if !rebuild && !rescheduled && !changes.meta && !changes.config && !changes.health {
            return Ok(None);
        }
        let StagedBackends {
            backends,
            added,
            deactivate,
            reweighted,
        } = staged;
        let table = if rebuild {
            Some(self.build(&config.name, config.table_size, &backends)?)
        } else {
            None
        };
        let tier_tables = match (&table, &current) {
            (None, Some(c)) => c.tier_tables.clone(),
            _ => build_tier_tables(&config.name, config.table_size, &backends)?,
        };
        let slots_changed = match (&current, &table) {
            (Some(c), Some((t, _))) if !changes.resized => maglev::slots_changed(&c.table, t),
            (_, Some((t, _))) => t.len(),
            (_, None) => 0,
        };
        let (old_table, old_fingerprint, bound) = current
            .map(|c| (c.table, c.fingerprint, c.bound))
            .unwrap_or_default();
        let shrinks = changes.resized && (config.table_size as usize) < old_table.len();
        let (table, fingerprint, table_changed) = match table {
            Some((t, f)) => (t, f, true),
            None => (old_table, old_fingerprint, rescheduled),
        };
        Ok(Some(StagedVip {
            endpoint: *endpoint,
            is_new,
            added,
            retired,
            deactivate,
            reweighted,
            meta_changed: changes.meta,
            shrinks,
            table_changed,
            slots_changed,
            state: VipState {
                id,
                config: config.clone(),
                backends,
                table,
                fingerprint,
                tier_tables,
                spill,
                saturated: current_saturated,
                bound,
            },
        }))
    }

    /// A free VIP id.
    fn new_vip_id(&mut self) -> Result<u32, BalancerError> {
        self.vip_ids.take().ok_or(BalancerError::IdsExhausted {
            what: "VIP",
            max: MAX_VIPS,
        })
    }

    /// The tier spill a VIP's table header carries: the balancer's, where a backend is
    /// dedicated to a tier.
    fn spill_of(&self, backends: &BTreeMap<IpAddr, BackendState>) -> u8 {
        if backends.values().any(|b| b.tier != 0) {
            self.tier_spill
        } else {
            0
        }
    }

    /// Counting active flows starts or stops: the counts of the backends kept start from zero.
    fn restart_counts(
        &mut self,
        backends: &BTreeMap<IpAddr, BackendState>,
        old_backends: &BTreeMap<IpAddr, BackendState>,
    ) -> Result<(), BalancerError> {
        for b in backends.values() {
            if old_backends.contains_key(&b.address) {
                self.dataplane.reset_active(b.id)?;
            }
        }
        Ok(())
    }

    /// The VIP's backends as `config` has them: new ones written, changed ones rewritten now or
    /// listed for after the table is live.
    pub(super) fn stage_backends(
        &mut self,
        endpoint: &Endpoint,
        vip_id: u32,
        config: &VipConfig,
        macs: &HashMap<IpAddr, MacAddr>,
        old_backends: &BTreeMap<IpAddr, BackendState>,
    ) -> Result<StagedBackends, BalancerError> {
        let mut staged = StagedBackends::default();
        for b in &config.backends {
            // The configured MAC, else the resolved one, else the one in force.
            let mac = match Self::mac_of(config, b.address, macs) {
                Ok(mac) => mac,
                Err(e) => old_backends.get(&b.address).map(|o| o.mac).ok_or(e)?,
            };
            let healthy = !self.unhealthy.contains(&(*endpoint, b.address));
            let previous = match old_backends.get(&b.address) {
                Some(old) => Some(old.clone()),
                None => {
                    staged.added += 1;
                    // Back within its grace period: same slot, its flows continue.
                    self.take_retiring(endpoint, b.address)
                }
            };
            let state = match previous {
                Some(old) => {
                    let mut state = self.updated_backend(config, b, &old, mac, healthy);
                    self.rewrite_backend(vip_id, config, &old, &mut state, &mut staged)?;
                    state
                }
                None => self.new_backend(vip_id, config, b, mac, healthy)?,
            };
            staged.backends.insert(b.address, state);
        }
        Ok(staged)
    }

    /// A backend the VIP already had (or had retiring), with its new settings.
    pub(super) fn updated_backend(
        &self,
        config: &VipConfig,
        b: &BackendConfig,
        old: &BackendState,
        mac: MacAddr,
        healthy: bool,
    ) -> BackendState {
        let dynamic = config.policy.kind != crate::base::config::PolicyKind::Static;
        let mut state = BackendState {
            weight: b.weight,
            drained: b.drained,
            healthy,
            policy_weight: old.policy_weight.filter(|_| dynamic),
            mac,
            tier: self.tier_id(b.tier.as_deref()),
            ..old.clone()
        };
        // Without persistence no client returns, and a static policy holds no verdict on
        // those that do (its rounds end before one): the flag goes.
        state.returning_elsewhere &= dynamic && !config.persistence.is_zero();
        state
    }

    /// Writes a changed backend's entry at once where no table change must come first, else
    /// lists it in `staged` for after the table is live.
    pub(super) fn rewrite_backend(
        &mut self,
        vip_id: u32,
        config: &VipConfig,
        old: &BackendState,
        state: &mut BackendState,
        staged: &mut StagedBackends,
    ) -> Result<(), BalancerError> {
        if state.healthy && !old.healthy {
            // Back from failing checks: a new generation, so flows the kernel still pins to
            // its old self are re-hashed rather than resurrected.
            state.generation = self.next_generation();
            self.dataplane
                .set_backend(state.id, &backend_entry(vip_id, config, state))?;
        } else if !state.healthy && old.healthy {
            // Deactivated after the table without it is live.
            staged.deactivate.push(state.clone());
        } else if state.mac != old.mac {
            // New next hop: same id and generation, so its flows stay.
            self.dataplane
                .set_backend(state.id, &backend_entry(vip_id, config, state))?;
        } else if state.table_weight() != old.table_weight() {
            // The new weight is written once the table with it is live.
            staged.reweighted.push(state.clone());
        } else if state.returning_elsewhere != old.returning_elsewhere {
            self.dataplane
                .set_backend(state.id, &backend_entry(vip_id, config, state))?;
        }
        Ok(())
    }

    /// Writes what the data plane reads with the VIP's packets, before a new VIP is visible:
    /// its source NAT, the source prefix its affinity keys on, its admission control. Returns
    /// whether its pool counts as saturated (carried over).
    pub(super) fn write_vip_settings(
        &mut self,
        endpoint: &Endpoint,
        id: u32,
        config: &VipConfig,
        current: Option<&VipState>,
    ) -> Result<bool, BalancerError> {
        let snat = self.snat_plan.get(endpoint).copied().unwrap_or_default();
        if self.snat_written.get(&id) != Some(&snat) {
            self.dataplane.set_snat_source(id, &snat)?;
            self.snat_written.insert(id, snat);
        }
        if self.prefix_written.get(&id) != Some(&config.affinity_prefix) {
            self.dataplane
                .set_source_prefix(id, &config.affinity_prefix)?;
            self.prefix_written.insert(id, config.affinity_prefix);
        }
        let saturated = config.admission.is_some() && current.is_some_and(|c| c.saturated);
        self.write_admission(id, config, saturated)?;
        Ok(saturated)
    }
}
