//! [`Dataplane`] on the maps of the loaded XDP program.

use std::os::fd::{AsFd, AsRawFd};

use aya::Ebpf;
use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray};
use balancer_common::maps::{
    self as names, Backend, GlobalConfig, MAGLEV_TABLE_FLAGS, VipKey, VipMeta,
};
use balancer_common::stats::{COUNTERS, GlobalStats, TrafficStats};

use super::{Dataplane, DataplaneError, add_traffic, sys};

/// The balancer program's maps, owned by the daemon.
pub struct KernelDataplane {
    vips: HashMap<MapData, VipKey, VipMeta>,
    maglev: MapData,
    backends: Array<MapData, Backend>,
    config: Array<MapData, GlobalConfig>,
    stats: PerCpuArray<MapData, GlobalStats>,
    vip_stats: PerCpuArray<MapData, TrafficStats>,
    backend_stats: PerCpuArray<MapData, TrafficStats>,
}

fn map_err(map: &'static str, op: &'static str) -> impl FnOnce(MapError) -> DataplaneError {
    move |source| DataplaneError::Map { map, op, source }
}

fn take<T: TryFrom<Map, Error = MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, DataplaneError> {
    let map = ebpf.take_map(name).ok_or(DataplaneError::Map {
        map: name,
        op: "find",
        source: MapError::InvalidName { name: name.into() },
    })?;
    T::try_from(map).map_err(map_err(name, "open"))
}

impl KernelDataplane {
    /// Takes the balancer's maps out of a loaded object.
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        let maglev = match ebpf.take_map(names::MAGLEV) {
            Some(Map::ArrayOfMaps(data)) => data,
            _ => {
                return Err(DataplaneError::Map {
                    map: names::MAGLEV,
                    op: "find",
                    source: MapError::InvalidName {
                        name: names::MAGLEV.into(),
                    },
                });
            }
        };
        Ok(KernelDataplane {
            vips: take(ebpf, names::VIPS)?,
            maglev,
            backends: take(ebpf, names::BACKENDS)?,
            config: take(ebpf, names::CONFIG)?,
            stats: take(ebpf, names::STATS)?,
            vip_stats: take(ebpf, names::VIP_STATS)?,
            backend_stats: take(ebpf, names::BACKEND_STATS)?,
        })
    }

    fn traffic(
        map: &PerCpuArray<MapData, TrafficStats>,
        name: &'static str,
        index: u32,
    ) -> Result<TrafficStats, DataplaneError> {
        let values = map.get(&index, 0).map_err(map_err(name, "read"))?;
        let mut sum = TrafficStats::default();
        for v in values.iter() {
            add_traffic(&mut sum, v);
        }
        Ok(sum)
    }
}

impl Dataplane for KernelDataplane {
    fn set_config(&mut self, config: &GlobalConfig) -> Result<(), DataplaneError> {
        self.config
            .set(0, config, 0)
            .map_err(map_err(names::CONFIG, "write"))
    }

    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), DataplaneError> {
        self.vips
            .insert(key, meta, 0)
            .map_err(map_err(names::VIPS, "insert"))
    }

    fn remove_vip(&mut self, key: &VipKey) -> Result<(), DataplaneError> {
        match self.vips.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            Err(e) => Err(map_err(names::VIPS, "remove")(e)),
        }
    }

    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError> {
        self.backends
            .set(id, backend, 0)
            .map_err(map_err(names::BACKENDS, "write"))
    }

    fn publish_table(&mut self, vip_id: u32, table: &[u32]) -> Result<(), DataplaneError> {
        let failed = |op| move |source| DataplaneError::Table { vip_id, op, source };
        let slots = table.len() as u32;
        let inner = sys::create_u32_array(slots, MAGLEV_TABLE_FLAGS, "maglev_table")
            .map_err(failed("create"))?;
        sys::fill_mmapable_u32(inner.as_fd(), table).map_err(failed("fill"))?;
        // One update of the outer array swaps the whole table in. The value written is the
        // inner map's descriptor; the kernel keeps its own reference, so ours may close.
        sys::update_u32(self.maglev.fd().as_fd(), vip_id, inner.as_raw_fd() as u32)
            .map_err(failed("swap in"))
    }

    fn clear_table(&mut self, vip_id: u32) -> Result<(), DataplaneError> {
        sys::delete_u32(self.maglev.fd().as_fd(), vip_id).map_err(|source| DataplaneError::Table {
            vip_id,
            op: "delete",
            source,
        })
    }

    fn global_stats(&self) -> Result<GlobalStats, DataplaneError> {
        let values = self
            .stats
            .get(&0, 0)
            .map_err(map_err(names::STATS, "read"))?;
        let mut sum = GlobalStats::default();
        for v in values.iter() {
            for i in 0..COUNTERS {
                sum.counters[i] += v.counters[i];
            }
        }
        Ok(sum)
    }

    fn vip_stats(&self, vip_id: u32) -> Result<TrafficStats, DataplaneError> {
        Self::traffic(&self.vip_stats, names::VIP_STATS, vip_id)
    }

    fn backend_stats(&self, id: u32) -> Result<TrafficStats, DataplaneError> {
        Self::traffic(&self.backend_stats, names::BACKEND_STATS, id)
    }
}
