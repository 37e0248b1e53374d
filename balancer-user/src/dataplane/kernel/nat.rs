//! The source-NAT tables as the daemon's sweep reads and trims them.

use aya::Ebpf;
use aya::maps::{Map, MapData, MapError, PerCpuArray};
use balancer_common::maps::{
    self as names, NatReplyKey, SnatClientKey, SnatFlowKey, SnatFlowValue, SnatPortValue,
};
use balancer_common::stats::NatStats;

use super::open::{map_err, take_map};
use crate::dataplane::DataplaneError;
use crate::dataplane::nat_expiry::NatTables;

/// The source-NAT flow tables and counters.
pub(super) struct KernelNat {
    pub(super) ports: aya::maps::HashMap<MapData, NatReplyKey, SnatPortValue>,
    pub(super) flows: aya::maps::HashMap<MapData, SnatFlowKey, SnatFlowValue>,
    /// None in a program without client quotas (an older build timed beside this one).
    pub(super) clients: Option<aya::maps::HashMap<MapData, SnatClientKey, u64>>,
    pub(super) stats: NatStatsMap,
}

/// `NAT_STATS`, as this build writes it or as an older one did (its first two counters: a
/// build timed beside this one by the data-plane benchmark).
pub(super) enum NatStatsMap {
    Current(PerCpuArray<MapData, NatStats>),
    TwoCounters(PerCpuArray<MapData, [u64; 2]>),
}

impl NatStatsMap {
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        let map = take_map(ebpf, names::NAT_STATS)?;
        let open = map_err(names::NAT_STATS, "open");
        if let Map::PerCpuArray(data) = &map
            && data.info().is_ok_and(|i| i.value_size() == 16)
        {
            return PerCpuArray::try_from(map)
                .map(Self::TwoCounters)
                .map_err(open);
        }
        PerCpuArray::try_from(map).map(Self::Current).map_err(open)
    }
}

impl NatTables for KernelNat {
    fn ports(&self) -> Result<Vec<(NatReplyKey, SnatPortValue)>, DataplaneError> {
        self.ports
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(map_err(names::SNAT_PORTS, "read"))
    }
    fn flow(&self, key: &SnatFlowKey) -> Result<Option<SnatFlowValue>, DataplaneError> {
        match self.flows.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(names::SNAT_FLOWS, "read")(e)),
        }
    }
    fn remove_flow(&mut self, key: &SnatFlowKey) -> Result<(), DataplaneError> {
        match self.flows.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(names::SNAT_FLOWS, "remove")(e)),
        }
    }
    fn remove_port(&mut self, key: &NatReplyKey) -> Result<(), DataplaneError> {
        match self.ports.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(names::SNAT_PORTS, "remove")(e)),
        }
    }
    fn clients(&self) -> Result<Vec<(SnatClientKey, u64)>, DataplaneError> {
        let Some(clients) = &self.clients else {
            return Ok(Vec::new());
        };
        clients
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(map_err(names::SNAT_CLIENTS, "read"))
    }
    fn set_client(&mut self, key: &SnatClientKey, ports: u64) -> Result<(), DataplaneError> {
        let Some(clients) = &mut self.clients else {
            return Ok(());
        };
        clients
            .insert(key, ports, 0)
            .map_err(map_err(names::SNAT_CLIENTS, "write"))
    }
    fn remove_client(&mut self, key: &SnatClientKey) -> Result<(), DataplaneError> {
        let Some(clients) = &mut self.clients else {
            return Ok(());
        };
        match clients.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(names::SNAT_CLIENTS, "remove")(e)),
        }
    }
    fn stats(&self) -> Result<NatStats, DataplaneError> {
        let read = map_err(names::NAT_STATS, "read");
        let mut sum = NatStats::default();
        match &self.stats {
            NatStatsMap::Current(map) => {
                for v in map.get(&0, 0).map_err(read)?.iter() {
                    sum.no_port += v.no_port;
                    sum.table_full += v.table_full;
                    sum.client_quota += v.client_quota;
                    sum.not_syn += v.not_syn;
                }
            }
            NatStatsMap::TwoCounters(map) => {
                for [no_port, table_full] in map.get(&0, 0).map_err(read)?.iter() {
                    sum.no_port += no_port;
                    sum.table_full += table_full;
                }
            }
        }
        Ok(sum)
    }
}
