//! The balancer's bookkeeping, apart from BPF access (the role of Katran's `KatranLb`): VIPs and
//! their backends, id allocation, Maglev tables, and the order in which kernel state changes so
//! that no packet ever sees a half-made change.
//!
//! Ordering rules:
//! - a VIP entry appears only after its backends and table exist, and goes first on removal;
//! - a new table is published (one atomic swap) after new backends are written and before
//!   removed backends are deactivated; packets of a removed backend's flows are re-hashed;
//! - a drained backend (weight 0) leaves the table but stays active, so its established
//!   flows continue;
//! - a backend removed from a VIP leaves the table at once but stays active for a grace period
//!   (its established flows continue), then is deactivated; re-adding it within the grace
//!   period takes it back with its flows. A removed VIP takes its backends with it at once.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use balancer_common::addr::raw_from_ip;
use balancer_common::maglev::{self, MaglevBackend, MaglevError};
use balancer_common::maps::{
    BACKEND_F_ACTIVE, Backend, ForwardMode, GlobalConfig, MAX_BACKENDS, MAX_VIPS, VipKey, VipMeta,
};
use balancer_common::stats::{GlobalStats, TrafficStats};

use crate::config::{Forwarding, MacAddr, Protocol, VipConfig};
use crate::dataplane::{Dataplane, DataplaneError};

/// Why a change was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum BalancerError {
    #[error("no next-hop MAC known for backend {backend} of VIP {vip}")]
    NoMac { vip: String, backend: IpAddr },
    #[error("VIP {vip}: {source}")]
    Table {
        vip: String,
        #[source]
        source: MaglevError,
    },
    #[error("no free {what} id (at most {max})")]
    IdsExhausted { what: &'static str, max: u32 },
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
}

/// The (address, port, protocol) of a VIP.
pub type Endpoint = (IpAddr, u16, Protocol);

/// Ids handed out first-in first-out, so a freed id is reused as late as possible.
#[derive(Debug)]
struct IdPool {
    free: VecDeque<u32>,
}

impl IdPool {
    fn new(max: u32) -> Self {
        IdPool {
            free: (0..max).collect(),
        }
    }
    fn take(&mut self) -> Option<u32> {
        self.free.pop_front()
    }
    fn give_back(&mut self, id: u32) {
        self.free.push_back(id);
    }
    fn available(&self) -> usize {
        self.free.len()
    }
}

/// A backend of one VIP as the kernel has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendState {
    pub id: u32,
    pub address: IpAddr,
    pub weight: u32,
    pub mac: MacAddr,
    pub generation: u32,
}

/// A VIP as the kernel has it.
#[derive(Clone, Debug)]
pub struct VipState {
    pub id: u32,
    pub config: VipConfig,
    pub backends: BTreeMap<IpAddr, BackendState>,
    /// Current Maglev table (backend ids).
    pub table: Vec<u32>,
    /// Host-independent fingerprint of the table (see `maglev::fingerprint`).
    pub fingerprint: u64,
}

impl VipState {
    /// Slots per backend address in the current table.
    pub fn slot_shares(&self) -> BTreeMap<IpAddr, usize> {
        let counts = maglev::slot_counts(&self.table);
        self.backends
            .values()
            .map(|b| (b.address, counts.get(&b.id).copied().unwrap_or(0)))
            .collect()
    }
}

/// A backend removed from its VIP, still serving its established flows until `until`.
#[derive(Clone, Debug)]
pub struct RetiringBackend {
    pub vip: Endpoint,
    pub state: BackendState,
    pub until: Instant,
}

/// What one `apply` changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub vips_added: usize,
    pub vips_removed: usize,
    pub vips_updated: usize,
    pub tables_published: usize,
    /// Slots whose backend changed, summed over republished tables.
    pub slots_changed: usize,
    pub table_build_time: Duration,
}

/// VIPs, backends and tables, written through a [`Dataplane`].
pub struct Balancer<D: Dataplane> {
    dataplane: D,
    vips: BTreeMap<Endpoint, VipState>,
    vip_ids: IdPool,
    backend_ids: IdPool,
    next_generation: u32,
    /// How many VIPs use each address (for the address-only marker entries).
    address_users: HashMap<IpAddr, usize>,
    retiring: Vec<RetiringBackend>,
    removal_grace: Duration,
    settings: GlobalConfig,
}

fn vip_key(address: IpAddr, port: u16, proto: u8) -> VipKey {
    let (addr, family) = raw_from_ip(address);
    VipKey {
        addr,
        port: port.to_be(),
        proto,
        family,
    }
}

fn forward_mode(f: Forwarding) -> ForwardMode {
    match f {
        Forwarding::L2Dsr => ForwardMode::L2Dsr,
        Forwarding::Ipip => ForwardMode::Ipip,
        Forwarding::Gue => ForwardMode::Gue,
    }
}

fn vip_meta(id: u32, config: &VipConfig) -> VipMeta {
    VipMeta {
        vip_id: id,
        table_size: config.table_size,
        mode: forward_mode(config.forwarding) as u8,
        flags: 0,
        gue_port: config.gue_port.to_be(),
        _pad: 0,
    }
}

fn backend_entry(b: &BackendState) -> Backend {
    let (addr, family) = raw_from_ip(b.address);
    Backend {
        addr,
        mac: b.mac.0,
        family,
        flags: BACKEND_F_ACTIVE,
        generation: b.generation,
    }
}

/// Builds the Maglev table of a VIP's backends.
pub fn build_table(
    name: &str,
    table_size: u32,
    backends: &BTreeMap<IpAddr, BackendState>,
) -> Result<(Vec<u32>, u64), BalancerError> {
    let identities: Vec<(String, &BackendState)> = backends
        .values()
        .map(|b| (b.address.to_string(), b))
        .collect();
    let input: Vec<MaglevBackend<'_>> = identities
        .iter()
        .map(|(identity, b)| MaglevBackend {
            identity: identity.as_bytes(),
            weight: b.weight,
            id: b.id,
        })
        .collect();
    let table = maglev::build_table(&input, table_size).map_err(|source| BalancerError::Table {
        vip: name.to_string(),
        source,
    })?;
    let fingerprint = maglev::fingerprint(&table, &input);
    Ok((table, fingerprint))
}

impl<D: Dataplane> Balancer<D> {
    pub fn new(dataplane: D) -> Self {
        Balancer {
            dataplane,
            vips: BTreeMap::new(),
            vip_ids: IdPool::new(MAX_VIPS),
            backend_ids: IdPool::new(MAX_BACKENDS),
            next_generation: 1,
            address_users: HashMap::new(),
            retiring: Vec::new(),
            removal_grace: Duration::ZERO,
            settings: GlobalConfig::default(),
        }
    }

    /// The global data-plane settings in force.
    pub fn settings(&self) -> &GlobalConfig {
        &self.settings
    }

    /// How long a backend removed from a VIP keeps its established flows (zero: re-hash them
    /// at once).
    pub fn set_removal_grace(&mut self, grace: Duration) {
        self.removal_grace = grace;
    }

    /// Backends removed from their VIP that still serve established flows.
    pub fn retiring(&self) -> &[RetiringBackend] {
        &self.retiring
    }

    /// Deactivates retiring backends whose grace period ended by `now` (their remaining flows
    /// are re-hashed). Returns how many.
    pub fn expire_retired(&mut self, now: Instant) -> Result<usize, BalancerError> {
        let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring)
            .into_iter()
            .partition(|r| r.until <= now);
        self.retiring = kept;
        for r in &expired {
            self.retire_backend(&r.state)?;
            tracing::info!(backend = %r.state.address, vip = %format!("{}:{}/{}", r.vip.0, r.vip.1, r.vip.2), "removed backend's grace period over; its remaining flows are re-hashed");
        }
        Ok(expired.len())
    }

    pub fn dataplane(&self) -> &D {
        &self.dataplane
    }

    /// Replaces the global data-plane settings.
    pub fn set_settings(&mut self, settings: &GlobalConfig) -> Result<(), BalancerError> {
        self.dataplane.set_config(settings)?;
        self.settings = *settings;
        Ok(())
    }

    /// The VIPs in endpoint order.
    pub fn vips(&self) -> impl Iterator<Item = &VipState> {
        self.vips.values()
    }

    /// The VIP with this name.
    pub fn vip(&self, name: &str) -> Option<&VipState> {
        self.vips.values().find(|v| v.config.name == name)
    }

    pub fn global_stats(&self) -> Result<GlobalStats, BalancerError> {
        Ok(self.dataplane.global_stats()?)
    }

    pub fn vip_stats(&self, vip: &VipState) -> Result<TrafficStats, BalancerError> {
        Ok(self.dataplane.vip_stats(vip.id)?)
    }

    pub fn backend_stats(&self, backend: &BackendState) -> Result<TrafficStats, BalancerError> {
        Ok(self.dataplane.backend_stats(backend.id)?)
    }

    /// Makes the kernel state match `vips`. `macs` gives each backend's next-hop MAC (a
    /// backend's own `mac` setting wins). Everything that can be checked is checked before
    /// the first kernel write.
    pub fn apply(
        &mut self,
        vips: &[VipConfig],
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<ApplyReport, BalancerError> {
        let mut report = ApplyReport::default();
        let desired: BTreeMap<Endpoint, &VipConfig> =
            vips.iter().map(|v| (v.endpoint(), v)).collect();

        // Check: MACs known, ids available, tables buildable (with placeholder ids).
        for vip in vips {
            for b in &vip.backends {
                if b.mac.is_none() && !macs.contains_key(&b.address) {
                    return Err(BalancerError::NoMac {
                        vip: vip.name.clone(),
                        backend: b.address,
                    });
                }
            }
        }
        let new_vips = desired
            .keys()
            .filter(|e| !self.vips.contains_key(e))
            .count();
        if new_vips > self.vip_ids.available() {
            return Err(BalancerError::IdsExhausted {
                what: "VIP",
                max: MAX_VIPS,
            });
        }
        let kept_backends: usize = self
            .vips
            .iter()
            .filter(|(e, _)| desired.contains_key(e))
            .map(|(_, v)| v.backends.len())
            .sum();
        let wanted_backends: usize = vips.iter().map(|v| v.backends.len()).sum();
        let freed_backends: usize =
            self.vips.values().map(|v| v.backends.len()).sum::<usize>() - kept_backends;
        if wanted_backends > self.backend_ids.available() + kept_backends + freed_backends {
            return Err(BalancerError::IdsExhausted {
                what: "backend",
                max: MAX_BACKENDS,
            });
        }

        // Removed VIPs go first: frees ids for the rest.
        let gone: Vec<Endpoint> = self
            .vips
            .keys()
            .filter(|e| !desired.contains_key(e))
            .copied()
            .collect();
        for endpoint in gone {
            self.remove_vip(&endpoint)?;
            report.vips_removed += 1;
        }
        for (endpoint, config) in desired {
            let started = Instant::now();
            let changed = if self.vips.contains_key(&endpoint) {
                let changed = self.update_vip(&endpoint, config, macs)?;
                report.vips_updated += usize::from(changed.is_some());
                changed
            } else {
                report.vips_added += 1;
                self.add_vip(config, macs)?;
                Some(0)
            };
            if let Some(slots) = changed {
                report.tables_published += 1;
                report.slots_changed += slots;
                report.table_build_time += started.elapsed();
            }
        }
        Ok(report)
    }

    fn next_generation(&mut self) -> u32 {
        let g = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        g
    }

    fn new_backend(
        &mut self,
        vip: &VipConfig,
        address: IpAddr,
        weight: u32,
        mac: MacAddr,
    ) -> Result<BackendState, BalancerError> {
        let id = self.backend_ids.take().ok_or(BalancerError::IdsExhausted {
            what: "backend",
            max: MAX_BACKENDS,
        })?;
        let state = BackendState {
            id,
            address,
            weight,
            mac,
            generation: self.next_generation(),
        };
        if let Err(e) = self.dataplane.set_backend(id, &backend_entry(&state)) {
            self.backend_ids.give_back(id);
            tracing::error!(vip = %vip.name, backend = %address, "writing backend failed: {e}");
            return Err(e.into());
        }
        Ok(state)
    }

    fn take_retiring(&mut self, endpoint: &Endpoint, address: IpAddr) -> Option<BackendState> {
        let at = self
            .retiring
            .iter()
            .position(|r| r.vip == *endpoint && r.state.address == address)?;
        Some(self.retiring.swap_remove(at).state)
    }

    fn retire_backend(&mut self, b: &BackendState) -> Result<(), BalancerError> {
        // Inactive: flows pinned to it are re-hashed on their next packet.
        self.dataplane.set_backend(b.id, &Backend::default())?;
        self.backend_ids.give_back(b.id);
        Ok(())
    }

    fn mac_of(
        vip: &VipConfig,
        address: IpAddr,
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<MacAddr, BalancerError> {
        vip.backends
            .iter()
            .find(|b| b.address == address)
            .and_then(|b| b.mac)
            .or_else(|| macs.get(&address).copied())
            .ok_or(BalancerError::NoMac {
                vip: vip.name.clone(),
                backend: address,
            })
    }

    fn add_vip(
        &mut self,
        config: &VipConfig,
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<(), BalancerError> {
        let id = self.vip_ids.take().ok_or(BalancerError::IdsExhausted {
            what: "VIP",
            max: MAX_VIPS,
        })?;
        let mut backends = BTreeMap::new();
        for b in &config.backends {
            let mac = Self::mac_of(config, b.address, macs)?;
            let state = self.new_backend(config, b.address, b.weight, mac)?;
            backends.insert(b.address, state);
        }
        let (table, fingerprint) = build_table(&config.name, config.table_size, &backends)?;
        self.dataplane.publish_table(id, &table)?;
        self.dataplane.set_vip(
            &vip_key(config.address, config.port, config.protocol.number()),
            &vip_meta(id, config),
        )?;
        self.mark_address(config.address)?;
        tracing::info!(
            vip = %config.name,
            endpoint = %format!("{}:{}/{}", config.address, config.port, config.protocol),
            backends = backends.len(),
            forwarding = %config.forwarding,
            "VIP added"
        );
        self.vips.insert(
            config.endpoint(),
            VipState {
                id,
                config: config.clone(),
                backends,
                table,
                fingerprint,
            },
        );
        Ok(())
    }

    fn remove_vip(&mut self, endpoint: &Endpoint) -> Result<(), BalancerError> {
        let Some(vip) = self.vips.remove(endpoint) else {
            return Ok(());
        };
        self.dataplane.remove_vip(&vip_key(
            vip.config.address,
            vip.config.port,
            vip.config.protocol.number(),
        ))?;
        self.unmark_address(vip.config.address)?;
        self.dataplane.clear_table(vip.id)?;
        for b in vip.backends.values() {
            self.retire_backend(b)?;
        }
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring)
            .into_iter()
            .partition(|r| r.vip == *endpoint);
        self.retiring = others;
        for r in &mine {
            self.retire_backend(&r.state)?;
        }
        self.vip_ids.give_back(vip.id);
        tracing::info!(vip = %vip.config.name, "VIP removed");
        Ok(())
    }

    /// Brings an existing VIP to `config`. Returns the slots changed if a table was published.
    fn update_vip(
        &mut self,
        endpoint: &Endpoint,
        config: &VipConfig,
        macs: &HashMap<IpAddr, MacAddr>,
    ) -> Result<Option<usize>, BalancerError> {
        let Some(current) = self.vips.get(endpoint).cloned() else {
            return Ok(None);
        };
        let mut backends = BTreeMap::new();
        let mut retired = Vec::new();
        let mut added = Vec::new();
        for old in current.backends.values() {
            if !config.backends.iter().any(|b| b.address == old.address) {
                retired.push(old.clone());
            }
        }
        for b in &config.backends {
            let mac = Self::mac_of(config, b.address, macs)?;
            match current.backends.get(&b.address) {
                Some(old) if old.mac == mac => {
                    backends.insert(
                        b.address,
                        BackendState {
                            weight: b.weight,
                            ..old.clone()
                        },
                    );
                }
                Some(old) => {
                    // New next hop: same id and generation (flows stay), new MAC.
                    let state = BackendState {
                        weight: b.weight,
                        mac,
                        ..old.clone()
                    };
                    self.dataplane
                        .set_backend(state.id, &backend_entry(&state))?;
                    backends.insert(b.address, state);
                }
                None => {
                    let state = match self.take_retiring(endpoint, b.address) {
                        // Back within its grace period: same slot, its flows continue.
                        Some(old) => {
                            let state = BackendState {
                                weight: b.weight,
                                mac,
                                ..old
                            };
                            if state.mac != old.mac {
                                self.dataplane
                                    .set_backend(state.id, &backend_entry(&state))?;
                            }
                            state
                        }
                        None => self.new_backend(config, b.address, b.weight, mac)?,
                    };
                    added.push(state.id);
                    backends.insert(b.address, state);
                }
            }
        }
        let meta_changed = vip_meta(current.id, &current.config) != vip_meta(current.id, config);
        let membership_changed = !added.is_empty() || !retired.is_empty();
        let weights_changed = backends.values().any(|b| {
            current
                .backends
                .get(&b.address)
                .is_some_and(|old| old.weight != b.weight)
        });
        let resize = config.table_size != current.config.table_size;

        let mut changed = None;
        let mut vip = VipState {
            config: config.clone(),
            backends,
            ..current
        };
        let key = vip_key(config.address, config.port, config.protocol.number());
        if membership_changed || weights_changed || resize {
            let (table, fingerprint) = build_table(&config.name, config.table_size, &vip.backends)?;
            // Packets index the table with the VIP's table size: when it shrinks, the smaller
            // size goes first (old table still covers it); when it grows, the table goes first.
            if resize && config.table_size < vip.table.len() as u32 {
                self.dataplane.set_vip(&key, &vip_meta(vip.id, config))?;
                self.dataplane.publish_table(vip.id, &table)?;
            } else {
                self.dataplane.publish_table(vip.id, &table)?;
                if meta_changed {
                    self.dataplane.set_vip(&key, &vip_meta(vip.id, config))?;
                }
            }
            let slots = if resize {
                table.len()
            } else {
                maglev::slots_changed(&vip.table, &table)
            };
            vip.table = table;
            vip.fingerprint = fingerprint;
            changed = Some(slots);
        } else if meta_changed {
            self.dataplane.set_vip(&key, &vip_meta(vip.id, config))?;
            changed = Some(0);
        }
        let until = Instant::now() + self.removal_grace;
        for b in retired.iter() {
            if self.removal_grace.is_zero() {
                self.retire_backend(b)?;
            } else {
                self.retiring.push(RetiringBackend {
                    vip: *endpoint,
                    state: b.clone(),
                    until,
                });
            }
        }
        if changed.is_some() {
            tracing::info!(
                vip = %config.name,
                backends = vip.backends.len(),
                added = added.len(),
                removed = retired.len(),
                slots_changed = changed.unwrap_or(0),
                "VIP updated"
            );
        }
        self.vips.insert(*endpoint, vip);
        Ok(changed)
    }

    fn mark_address(&mut self, address: IpAddr) -> Result<(), BalancerError> {
        let users = self.address_users.entry(address).or_insert(0);
        *users += 1;
        if *users == 1 {
            let marker = VipMeta {
                vip_id: u32::MAX,
                ..VipMeta::default()
            };
            self.dataplane.set_vip(&vip_key(address, 0, 0), &marker)?;
        }
        Ok(())
    }

    fn unmark_address(&mut self, address: IpAddr) -> Result<(), BalancerError> {
        if let Some(users) = self.address_users.get_mut(&address) {
            *users -= 1;
            if *users == 0 {
                self.address_users.remove(&address);
                self.dataplane.remove_vip(&vip_key(address, 0, 0))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendConfig, Config};
    use crate::dataplane::memory::MemoryDataplane;

    fn config(text: &str) -> Config {
        Config::parse(&format!("interface = \"eth0\"\n{text}")).unwrap()
    }

    fn two_vips() -> Config {
        config(
            r#"
[[vip]]
name = "web"
address = "10.100.0.1"
port = 80
[[vip.backend]]
address = "10.0.0.11"
[[vip.backend]]
address = "10.0.0.12"
weight = 3
[[vip]]
name = "dns"
address = "10.100.0.1"
port = 53
protocol = "udp"
forwarding = "gue"
table_size = 13
[[vip.backend]]
address = "10.0.0.11"
mac = "02:00:00:00:00:99"
"#,
        )
    }

    fn macs() -> HashMap<IpAddr, MacAddr> {
        (1..=20u8)
            .map(|i| {
                (
                    IpAddr::from([10, 0, 0, 10 + i]),
                    MacAddr([2, 0, 0, 0, 0, 10 + i]),
                )
            })
            .collect()
    }

    fn balancer() -> Balancer<MemoryDataplane> {
        Balancer::new(MemoryDataplane::default())
    }

    #[test]
    fn apply_writes_vips_backends_tables_and_address_markers() {
        let mut lb = balancer();
        let report = lb.apply(&two_vips().vips, &macs()).unwrap();
        assert_eq!(report.vips_added, 2);
        let dp = lb.dataplane();
        // Two VIP entries plus one shared address marker.
        assert_eq!(dp.vips.len(), 3);
        assert!(
            dp.vips
                .contains_key(&vip_key("10.100.0.1".parse().unwrap(), 0, 0))
        );
        let web = lb.vip("web").unwrap();
        let meta = dp.vips[&vip_key("10.100.0.1".parse().unwrap(), 80, 6)];
        assert_eq!(meta.vip_id, web.id);
        assert_eq!(meta.table_size, 65_537);
        assert_eq!(dp.tables[&web.id], web.table);
        // Shares follow weights 1:3.
        let shares = web.slot_shares();
        let a = shares[&"10.0.0.11".parse::<IpAddr>().unwrap()] as f64;
        let b = shares[&"10.0.0.12".parse::<IpAddr>().unwrap()] as f64;
        assert!((b / a - 3.0).abs() < 0.01, "shares {a} {b}");
        // The configured MAC wins over the neighbour table; ids are per (VIP, backend).
        let dns = lb.vip("dns").unwrap();
        let b11 = &dns.backends[&"10.0.0.11".parse::<IpAddr>().unwrap()];
        assert_eq!(dp.backends[&b11.id].mac, [2, 0, 0, 0, 0, 0x99]);
        assert_ne!(
            b11.id,
            web.backends[&"10.0.0.11".parse::<IpAddr>().unwrap()].id
        );
        assert_eq!(
            dp.vips[&vip_key("10.100.0.1".parse().unwrap(), 53, 17)].mode,
            ForwardMode::Gue as u8
        );
        assert_eq!(
            dp.vips[&vip_key("10.100.0.1".parse().unwrap(), 53, 17)].gue_port,
            6080u16.to_be()
        );
    }

    #[test]
    fn applying_the_same_config_twice_changes_nothing() {
        let mut lb = balancer();
        lb.apply(&two_vips().vips, &macs()).unwrap();
        let publishes = lb.dataplane().publishes;
        let report = lb.apply(&two_vips().vips, &macs()).unwrap();
        assert_eq!(report, ApplyReport::default());
        assert_eq!(lb.dataplane().publishes, publishes);
    }

    #[test]
    fn removing_a_backend_retires_it_and_keeps_the_others() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        let before = lb.vip("web").unwrap().clone();
        let gone = before.backends[&"10.0.0.11".parse::<IpAddr>().unwrap()].clone();
        let kept = before.backends[&"10.0.0.12".parse::<IpAddr>().unwrap()].clone();
        cfg.vips[0].backends.remove(0);
        let report = lb.apply(&cfg.vips, &macs()).unwrap();
        assert_eq!(report.vips_updated, 1);
        let dp = lb.dataplane();
        assert_eq!(
            dp.backends[&gone.id].flags, 0,
            "removed backend still active"
        );
        assert_eq!(dp.backends[&kept.id].flags, BACKEND_F_ACTIVE);
        assert_eq!(
            dp.backends[&kept.id].generation, kept.generation,
            "survivor's flows must stay"
        );
        let web = lb.vip("web").unwrap();
        assert!(web.table.iter().all(|&id| id == kept.id));
    }

    #[test]
    fn a_removed_backend_serves_its_flows_through_the_grace_period() {
        let mut lb = balancer();
        lb.set_removal_grace(Duration::from_secs(60));
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        let gone = lb.vip("web").unwrap().backends[&"10.0.0.11".parse::<IpAddr>().unwrap()].clone();
        cfg.vips[0].backends.remove(0);
        lb.apply(&cfg.vips, &macs()).unwrap();
        assert!(
            !lb.vip("web").unwrap().table.contains(&gone.id),
            "removed backend still in the table"
        );
        assert_eq!(
            lb.dataplane().backends[&gone.id].flags,
            BACKEND_F_ACTIVE,
            "flows cut before the grace period"
        );
        assert_eq!(lb.retiring().len(), 1);
        // Not yet.
        assert_eq!(lb.expire_retired(Instant::now()).unwrap(), 0);
        // Re-added within the grace period: same slot and generation, so flows continue.
        let mut back = cfg.clone();
        back.vips[0]
            .backends
            .insert(0, two_vips().vips[0].backends[0].clone());
        lb.apply(&back.vips, &macs()).unwrap();
        assert_eq!(lb.vip("web").unwrap().backends[&gone.address], gone);
        assert!(lb.retiring().is_empty());
        // Removed again, and the grace period passes.
        lb.apply(&cfg.vips, &macs()).unwrap();
        assert_eq!(
            lb.expire_retired(Instant::now() + Duration::from_secs(61))
                .unwrap(),
            1
        );
        assert_eq!(lb.dataplane().backends[&gone.id].flags, 0);
    }

    #[test]
    fn drain_keeps_the_backend_active_but_out_of_the_table() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        cfg.vips[0].backends[1].weight = 0;
        lb.apply(&cfg.vips, &macs()).unwrap();
        let web = lb.vip("web").unwrap();
        let drained = &web.backends[&"10.0.0.12".parse::<IpAddr>().unwrap()];
        assert!(!web.table.contains(&drained.id));
        assert_eq!(lb.dataplane().backends[&drained.id].flags, BACKEND_F_ACTIVE);
    }

    #[test]
    fn removing_a_vip_clears_everything_it_owned() {
        let mut lb = balancer();
        let cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        let web_id = lb.vip("web").unwrap().id;
        lb.apply(&cfg.vips[1..], &macs()).unwrap();
        let dp = lb.dataplane();
        assert!(!dp.tables.contains_key(&web_id));
        // The address marker stays while "dns" uses the address.
        assert_eq!(dp.vips.len(), 2);
        lb.apply(&[], &macs()).unwrap();
        let dp = lb.dataplane();
        assert!(dp.vips.is_empty() && dp.tables.is_empty());
        assert!(dp.backends.values().all(|b| b.flags == 0));
    }

    #[test]
    fn a_missing_mac_is_refused_before_anything_is_written() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        cfg.vips[0].backends.push(BackendConfig {
            address: "192.0.2.1".parse().unwrap(),
            weight: 1,
            mac: None,
        });
        let err = lb.apply(&cfg.vips, &macs()).unwrap_err();
        assert!(err.to_string().contains("192.0.2.1"), "{err}");
        assert!(lb.dataplane().vips.is_empty() && lb.dataplane().backends.is_empty());
    }

    #[test]
    fn resizing_a_table_rebuilds_it_at_the_new_size() {
        let mut lb = balancer();
        let mut cfg = two_vips();
        lb.apply(&cfg.vips, &macs()).unwrap();
        cfg.vips[0].table_size = 13;
        lb.apply(&cfg.vips, &macs()).unwrap();
        let web = lb.vip("web").unwrap();
        assert_eq!(web.table.len(), 13);
        assert_eq!(lb.dataplane().tables[&web.id].len(), 13);
        assert_eq!(
            lb.dataplane().vips[&vip_key("10.100.0.1".parse().unwrap(), 80, 6)].table_size,
            13
        );
    }

    #[test]
    fn ids_are_reused_last() {
        let mut pool = IdPool::new(3);
        let a = pool.take().unwrap();
        pool.give_back(a);
        assert_ne!(pool.take(), Some(a));
    }
}
