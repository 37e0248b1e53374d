//! Source NAT's flow expiry. The XDP program never evicts a source-NAT flow (an evicted flow
//! could lose its port to a new flow while its packets still arrive); the daemon removes the
//! flows idle past their timeout, both entries of each, once a second.

use balancer_common::flow_cache::TICK_SHIFT;
use std::collections::HashMap;

use balancer_common::maps::{
    NatReplyKey, SnatClientKey, SnatFlowKey, SnatFlowValue, SnatPortValue,
};
use balancer_common::stats::NatStats;

use super::DataplaneError;

/// What a sweep does: when a source-NAT flow is forgotten, in flow-clock ticks (2^30 ns), and
/// whether it keeps each client's count of ports (only while `[nat] client_ports` is set, as
/// the data plane counts only then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatSweepSettings {
    pub tcp_idle: u64,
    /// After a FIN or RST either way.
    pub tcp_closed: u64,
    pub udp_idle: u64,
    pub count_clients: bool,
}

impl NatSweepSettings {
    pub fn from_config(nat: &crate::base::config::NatConfig) -> Self {
        let ticks = |d: std::time::Duration| (d.as_nanos() as u64).div_ceil(1 << TICK_SHIFT);
        NatSweepSettings {
            tcp_idle: ticks(nat.tcp_idle_timeout),
            tcp_closed: ticks(nat.tcp_closed_timeout),
            udp_idle: ticks(nat.udp_idle_timeout),
            count_clients: nat.client_ports != 0,
        }
    }
}

/// What a sweep found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatSweep {
    /// Source-NAT flows (ports held) after the sweep.
    pub flows: u64,
    /// Flows the sweep removed.
    pub expired: u64,
    /// The data plane's counters (summed over CPUs).
    pub stats: NatStats,
}

/// The source-NAT tables, as the sweep needs them.
pub trait NatTables {
    /// Every port held: its reply key and its flow.
    fn ports(&self) -> Result<Vec<(NatReplyKey, SnatPortValue)>, DataplaneError>;
    fn flow(&self, key: &SnatFlowKey) -> Result<Option<SnatFlowValue>, DataplaneError>;
    fn remove_flow(&mut self, key: &SnatFlowKey) -> Result<(), DataplaneError>;
    fn remove_port(&mut self, key: &NatReplyKey) -> Result<(), DataplaneError>;
    /// Every client address counted and the ports it holds, as the data plane counts them.
    fn clients(&self) -> Result<Vec<(SnatClientKey, u64)>, DataplaneError>;
    fn set_client(&mut self, key: &SnatClientKey, ports: u64) -> Result<(), DataplaneError>;
    fn remove_client(&mut self, key: &SnatClientKey) -> Result<(), DataplaneError>;
    fn stats(&self) -> Result<NatStats, DataplaneError>;
}

/// The client flow a held port belongs to.
pub fn flow_key(reply: &NatReplyKey, port: &SnatPortValue) -> SnatFlowKey {
    SnatFlowKey {
        client: port.client,
        vip: port.vip,
        client_port: port.client_port,
        vip_port: reply.backend_port,
        proto: reply.proto,
        family: reply.family,
        _pad: [0; 2],
    }
}

/// Whether a flow last seen at tick `last_seen` (either way) is over its timeout at `now`.
pub fn expired(now: u64, last_seen: u64, closing: bool, proto: u8, t: &NatSweepSettings) -> bool {
    let limit = match (proto, closing) {
        (6, false) => t.tcp_idle,
        (6, true) => t.tcp_closed,
        _ => t.udp_idle,
    };
    now.saturating_sub(last_seen) > limit
}

/// Removes the flows over their timeout at flow-clock tick `now`: the client's entry (when it
/// still holds this port) first, then the port; then writes each client address's count of
/// the ports it still holds (the data plane only adds to them).
pub fn sweep(
    tables: &mut impl NatTables,
    now: u64,
    settings: &NatSweepSettings,
) -> Result<NatSweep, DataplaneError> {
    let ports = tables.ports()?;
    let mut result = NatSweep {
        flows: ports.len() as u64,
        ..NatSweep::default()
    };
    let mut held: HashMap<SnatClientKey, u64> = HashMap::new();
    for (reply, port) in &ports {
        let key = flow_key(reply, port);
        // The client's entry, if it still holds this port (a flow whose backend changed
        // holds another; this one then ages on the replies' clock alone).
        let flow = tables
            .flow(&key)?
            .filter(|f| f.nat_port == reply.client_port && f.backend == reply.backend);
        let last_seen = flow.map_or(port.last_seen, |f| f.last_seen.max(port.last_seen));
        let closing = port.closing != 0 || flow.is_some_and(|f| f.closing != 0);
        if !expired(now, last_seen, closing, reply.proto, settings) {
            if settings.count_clients {
                *held.entry(client_key(reply, port)).or_default() += 1;
            }
            continue;
        }
        if flow.is_some() {
            tables.remove_flow(&key)?;
        }
        tables.remove_port(reply)?;
        result.expired += 1;
        result.flows -= 1;
    }
    // Flows the data plane opened since `ports` was read are missed here: their clients are
    // under-counted until the next sweep. Without a quota, counts left from one are removed.
    for (client, counted) in tables.clients()? {
        match held.remove(&client) {
            None => tables.remove_client(&client)?,
            Some(n) if n != counted => tables.set_client(&client, n)?,
            Some(_) => {}
        }
    }
    for (client, n) in held {
        tables.set_client(&client, n)?;
    }
    result.stats = tables.stats()?;
    Ok(result)
}

/// The client address a held port counts against.
fn client_key(reply: &NatReplyKey, port: &SnatPortValue) -> SnatClientKey {
    SnatClientKey {
        addr: port.client,
        family: reply.family,
        _pad: [0; 3],
    }
}

/// The flow clock now (the XDP program's `bpf_ktime_get_coarse_ns() >> TICK_SHIFT`).
pub fn now_ticks() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime with a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64) >> TICK_SHIFT
}

/// A sweep to run later, without the daemon's lock (see [`super::Dataplane::nat_sweeper`]).
pub struct NatSweeper(Box<SweepFn>);

type NatSweepResult = Result<NatSweep, DataplaneError>;
type SweepFn = dyn FnOnce(u64, &NatSweepSettings) -> NatSweepResult + Send;

impl NatSweeper {
    pub fn later(
        sweep: impl FnOnce(u64, &NatSweepSettings) -> NatSweepResult + Send + 'static,
    ) -> Self {
        NatSweeper(Box::new(sweep))
    }

    pub fn run(self, now: u64, settings: &NatSweepSettings) -> NatSweepResult {
        (self.0)(now, settings)
    }

    /// A sweep of `tables`, taking their lock when it runs (a poisoned lock's tables are
    /// still swept: the sweep's writes are whole entries).
    pub fn of<T: NatTables + Send + 'static>(tables: &std::sync::Arc<std::sync::Mutex<T>>) -> Self {
        let tables = tables.clone();
        NatSweeper::later(move |now, settings| {
            let mut tables = tables.lock().unwrap_or_else(|p| p.into_inner());
            sweep(&mut *tables, now, settings)
        })
    }
}

/// Source-NAT tables in memory (the in-memory data plane's).
#[derive(Debug, Default)]
pub struct MemoryNat {
    pub ports: HashMap<NatReplyKey, SnatPortValue>,
    pub flows: HashMap<SnatFlowKey, SnatFlowValue>,
    pub clients: HashMap<SnatClientKey, u64>,
    pub stats: NatStats,
}

impl NatTables for MemoryNat {
    fn ports(&self) -> Result<Vec<(NatReplyKey, SnatPortValue)>, DataplaneError> {
        Ok(self.ports.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn flow(&self, key: &SnatFlowKey) -> Result<Option<SnatFlowValue>, DataplaneError> {
        Ok(self.flows.get(key).copied())
    }
    fn remove_flow(&mut self, key: &SnatFlowKey) -> Result<(), DataplaneError> {
        self.flows.remove(key);
        Ok(())
    }
    fn remove_port(&mut self, key: &NatReplyKey) -> Result<(), DataplaneError> {
        self.ports.remove(key);
        Ok(())
    }
    fn clients(&self) -> Result<Vec<(SnatClientKey, u64)>, DataplaneError> {
        Ok(self.clients.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn set_client(&mut self, key: &SnatClientKey, ports: u64) -> Result<(), DataplaneError> {
        self.clients.insert(*key, ports);
        Ok(())
    }
    fn remove_client(&mut self, key: &SnatClientKey) -> Result<(), DataplaneError> {
        self.clients.remove(key);
        Ok(())
    }
    fn stats(&self) -> Result<NatStats, DataplaneError> {
        Ok(self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: NatSweepSettings = NatSweepSettings {
        tcp_idle: 100,
        tcp_closed: 5,
        udp_idle: 20,
        count_clients: true,
    };

    /// A flow from client port `cport` holding source port `port` to backend `backend`, its
    /// two sides last seen at `fwd` and `rev`.
    fn add(
        nat: &mut MemoryNat,
        proto: u8,
        cport: u16,
        port: u16,
        backend: u32,
        fwd: u64,
        rev: u64,
    ) -> (NatReplyKey, SnatFlowKey) {
        let reply = NatReplyKey {
            backend: [backend, 0, 0, 0],
            client: [9, 0, 0, 0],
            backend_port: 80,
            client_port: port,
            proto,
            family: 4,
            _pad: [0; 2],
        };
        let value = SnatPortValue {
            client: [7, 0, 0, 0],
            vip: [5, 0, 0, 0],
            client_port: cport,
            last_seen: rev,
            ..SnatPortValue::default()
        };
        let key = flow_key(&reply, &value);
        nat.ports.insert(reply, value);
        nat.flows.insert(
            key,
            SnatFlowValue {
                backend: [backend, 0, 0, 0],
                source: [9, 0, 0, 0],
                last_seen: fwd,
                nat_port: port,
                ..SnatFlowValue::default()
            },
        );
        (reply, key)
    }

    #[test]
    fn a_sweep_writes_each_clients_count_of_ports_held() {
        let mut nat = MemoryNat::default();
        let key = |addr: u32| SnatClientKey {
            addr: [addr, 0, 0, 0],
            family: 4,
            _pad: [0; 3],
        };
        // Client 7 (every flow `add` makes): two live flows, one idle past its timeout.
        add(&mut nat, 17, 1, 1001, 1, 95, 95);
        add(&mut nat, 17, 2, 1002, 1, 10, 10);
        add(&mut nat, 6, 3, 1003, 1, 99, 99);
        // The data plane's counts: one lost (an LRU eviction or an insert race), one stale.
        nat.clients.insert(key(7), 1);
        nat.clients.insert(key(8), 5);
        let swept = sweep(&mut nat, 100, &T).unwrap();
        assert_eq!((swept.flows, swept.expired), (2, 1));
        assert_eq!(nat.clients, HashMap::from([(key(7), 2)]));
        // Without a quota the counts are not kept: those left are removed.
        let off = NatSweepSettings {
            count_clients: false,
            ..T
        };
        sweep(&mut nat, 100, &off).unwrap();
        assert!(nat.clients.is_empty());
        nat.clients.insert(key(7), 2);
        // Nothing held: no entry left.
        sweep(&mut nat, 1000, &T).unwrap();
        assert!(nat.clients.is_empty());
    }

    #[test]
    fn timeouts_follow_protocol_and_state() {
        assert!(
            !expired(200, 100, false, 6, &T),
            "TCP idle 100 ticks: not over"
        );
        assert!(expired(201, 100, false, 6, &T));
        assert!(expired(106, 100, true, 6, &T), "closed TCP: 5 ticks");
        assert!(!expired(105, 100, true, 6, &T));
        assert!(expired(121, 100, false, 17, &T), "UDP: 20 ticks");
        assert!(
            !expired(50, 100, false, 17, &T),
            "a clock behind the entry is no age"
        );
    }

    #[test]
    fn a_sweep_removes_idle_flows_with_their_ports_and_keeps_the_rest() {
        let mut nat = MemoryNat::default();
        // Idle both ways: goes.
        let (idle_port, idle_flow) = add(&mut nat, 17, 1, 1001, 1, 10, 10);
        // The client is quiet but the backend streams: stays.
        let (streaming, _) = add(&mut nat, 17, 2, 1002, 1, 10, 95);
        // The replies are quiet but the client sends: stays.
        let (sending, _) = add(&mut nat, 6, 3, 1003, 1, 99, 10);
        // Closed by the client, past the closed timeout: goes.
        let (closed_port, closed_flow) = add(&mut nat, 6, 4, 1004, 1, 90, 90);
        nat.flows.get_mut(&closed_flow).unwrap().closing = 1;
        // A flow moved to backend 2 (new port 2005): its old port 1005 ages on its own clock
        // and goes without taking the client's new entry with it.
        let (old_port, moved) = add(&mut nat, 17, 5, 1005, 1, 10, 10);
        let (new_port, _) = add(&mut nat, 17, 5, 2005, 2, 99, 99);
        assert_eq!(nat.flows[&moved].nat_port, 2005);
        nat.stats.no_port = 3;

        let swept = sweep(&mut nat, 100, &T).unwrap();
        assert_eq!((swept.expired, swept.flows), (3, 3));
        assert_eq!(swept.stats.no_port, 3);
        for gone in [idle_port, closed_port, old_port] {
            assert!(!nat.ports.contains_key(&gone));
        }
        assert!(!nat.flows.contains_key(&idle_flow) && !nat.flows.contains_key(&closed_flow));
        for kept in [streaming, sending, new_port] {
            assert!(nat.ports.contains_key(&kept));
        }
        assert_eq!(
            nat.flows[&moved].nat_port, 2005,
            "the moved flow keeps its new port"
        );
    }
}
