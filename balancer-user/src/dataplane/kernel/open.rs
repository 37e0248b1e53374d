//! Taking the program's maps out of a loaded object: fresh, or adopted as an earlier daemon
//! pinned them.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, OnceLock};

use aya::Ebpf;
use aya::maps::{Array, IterableMap as _, Map, MapData, MapError, RingBuf};
use balancer_common::maps::{self as names, VIP_INDEX_SLOTS, VipKey, VipMeta, VipSlot};

use super::nat::NatStatsMap;
use super::{KernelDataplane, KernelNat};
use crate::dataplane::scrape_due::{ScrapeDue, ScrapeDueCounts, ScrapeEvents};
use crate::dataplane::sys::MappedArray;
use crate::dataplane::{DataplaneError, sys};

pub(in crate::dataplane) fn map_err(
    map: &'static str,
    op: &'static str,
) -> impl FnOnce(MapError) -> DataplaneError {
    move |source| DataplaneError::Map { map, op, source }
}

pub(super) fn take_map_of_maps(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<MapData, DataplaneError> {
    match ebpf.take_map(name) {
        Some(Map::ArrayOfMaps(data)) => Ok(data),
        _ => Err(DataplaneError::Map {
            map: name,
            op: "find",
            source: MapError::InvalidName { name: name.into() },
        }),
    }
}

pub(super) fn take<T: TryFrom<Map, Error = MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, DataplaneError> {
    T::try_from(take_map(ebpf, name)?).map_err(map_err(name, "open"))
}

/// The map `name`, untyped.
pub(super) fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, DataplaneError> {
    ebpf.take_map(name).ok_or(DataplaneError::Map {
        map: name,
        op: "find",
        source: MapError::InvalidName { name: name.into() },
    })
}

/// The mapping of `count` values of `map` kept in `view`, made on first use.
pub(super) fn mapped<T: Copy>(
    view: &OnceLock<Arc<MappedArray<T>>>,
    map: &MapData,
    count: usize,
    what: &str,
) -> Result<Arc<MappedArray<T>>, DataplaneError> {
    if let Some(v) = view.get() {
        return Ok(v.clone());
    }
    let v = Arc::new(
        MappedArray::map(map.fd().as_fd(), count)
            .map_err(|e| DataplaneError::VipIndex(format!("mapping {what}: {e}")))?,
    );
    Ok(view.get_or_init(|| v).clone())
}

/// A write to a map this object lacks (see [`take_optional`]).
pub(super) fn absent(map: &'static str, op: &'static str) -> DataplaneError {
    DataplaneError::Map {
        map,
        op,
        source: MapError::InvalidName { name: map.into() },
    }
}

/// Like [`take`], for a map an object of an earlier build may lack.
pub(super) fn take_optional<T: TryFrom<Map, Error = MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<Option<T>, DataplaneError> {
    match ebpf.take_map(name) {
        Some(map) => Ok(Some(T::try_from(map).map_err(map_err(name, "open"))?)),
        None => Ok(None),
    }
}

impl KernelDataplane {
    /// Takes the balancer's maps out of a loaded object whose maps are new: the VIP index
    /// starts empty.
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        let mut dataplane = Self::take_maps(ebpf)?;
        // An empty index, so lookups find no VIP rather than no index.
        dataplane.publish_index()?;
        Ok(dataplane)
    }

    /// Takes the balancer's maps out of a loaded object whose maps were pinned by an earlier
    /// daemon: the VIP index in force is read back, and nothing is written.
    pub fn adopt(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        let mut dataplane = Self::take_maps(ebpf)?;
        (dataplane.vips, dataplane.index_nat) = dataplane.read_index()?;
        Ok(dataplane)
    }

    /// The entries of the VIP index in the kernel, and the NAT bits its slots carry.
    fn read_index(&self) -> Result<(BTreeMap<VipKey, VipMeta>, u32), DataplaneError> {
        let failed = |op: &'static str| {
            move |e: std::io::Error| DataplaneError::VipIndex(format!("{op}: {e}"))
        };
        let id =
            sys::lookup_u32(self.vip_index.fd().as_fd(), 0).map_err(failed("find the index"))?;
        let inner = sys::map_fd_by_id(id).map_err(failed("open the index"))?;
        let slots: Vec<VipSlot> = sys::read_mmapable(inner.as_fd(), VIP_INDEX_SLOTS as usize)
            .map_err(failed("read the index"))?;
        let nat = slots.first().map_or(0, |s| s.nat);
        let entries = slots
            .into_iter()
            .filter(|s| s.key.family != 0)
            .map(|s| (s.key, s.meta))
            .collect();
        Ok((entries, nat))
    }

    /// Buckets of the connection table (fixed when its map was created).
    pub fn flow_buckets(&self) -> u32 {
        self.flows_buckets
    }

    fn take_maps(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        let flows = match ebpf.take_map(names::FLOWS) {
            Some(Map::Array(data)) => data,
            _ => {
                return Err(DataplaneError::Map {
                    map: names::FLOWS,
                    op: "find",
                    source: MapError::InvalidName {
                        name: names::FLOWS.into(),
                    },
                });
            }
        };
        let flows_buckets = flows
            .info()
            .map(|info| info.max_entries())
            .map_err(map_err(names::FLOWS, "inspect"))?;
        Ok(KernelDataplane {
            vip_index: take_map_of_maps(ebpf, names::VIPS)?,
            vips: BTreeMap::new(),
            index_nat: 0,
            maglev: take_map_of_maps(ebpf, names::MAGLEV)?,
            backends: take(ebpf, names::BACKENDS)?,
            config: take(ebpf, names::CONFIG)?,
            stats: take(ebpf, names::STATS)?,
            vip_stats: take(ebpf, names::VIP_STATS)?,
            backend_stats: take(ebpf, names::BACKEND_STATS)?,
            flows,
            flows_buckets,
            flows_view: OnceLock::new(),
            active_view: OnceLock::new(),
            active: take(ebpf, names::ACTIVE)?,
            homes: take_optional::<Array<MapData, names::Home>>(ebpf, names::HOMES)?
                .map(|homes| {
                    sys::SharedHomes::map(homes.map().fd().as_fd(), names::MAX_BACKENDS as usize)
                        .map_err(|e| {
                            DataplaneError::VipIndex(format!("mapping the clients homed: {e}"))
                        })
                })
                .transpose()?,
            tier_v4: take(ebpf, names::TIER_V4)?,
            tier_v6: take(ebpf, names::TIER_V6)?,
            tier_dscp: take(ebpf, names::TIER_DSCP)?,
            snat_sources: take(ebpf, names::SNAT_SOURCES)?,
            nat_links: take_optional(ebpf, names::NAT_LINKS)?,
            source_prefixes: take_optional(ebpf, names::SOURCE_PREFIXES)?,
            admission: take_optional(ebpf, names::ADMISSION)?,
            admission_stats: take_optional(ebpf, names::ADMISSION_STATS)?,
            fair: take_optional(ebpf, names::FAIR)?,
            nat_link_stats: take_optional(ebpf, names::NAT_LINK_STATS)?,
            tables: HashMap::new(),
            nat: Arc::new(Mutex::new(KernelNat {
                ports: take(ebpf, names::SNAT_PORTS)?,
                flows: take(ebpf, names::SNAT_FLOWS)?,
                clients: take_optional(ebpf, names::SNAT_CLIENTS)?,
                stats: NatStatsMap::take(ebpf)?,
            })),
            swap_started: None,
            scrape_due: match (
                take_optional::<Array<MapData, u64>>(ebpf, names::SCRAPE_DUE)?,
                take_optional::<RingBuf<MapData>>(ebpf, names::SCRAPE_EVENTS)?,
            ) {
                (Some(counts), Some(events)) => Some(ScrapeDue {
                    counts: ScrapeDueCounts::new(counts),
                    events: ScrapeEvents::new(events),
                }),
                _ => None,
            },
        })
    }
}
