//! Source NAT's upkeep: once a second, flows idle past their timeout give their ports back,
//! and new flows dropped for want of a port or of table space are counted and logged.

use crate::dataplane::DataplaneError;
use crate::dataplane::nat_expiry::{NatSweep, NatTimeouts, now_ticks};

use super::Daemon;

impl Daemon {
    /// Sweeps the source-NAT tables, holding `daemon` only to start the sweep and to record
    /// it (a sweep of many flows takes a while). Blocking.
    pub fn sweep_nat(daemon: &std::sync::Mutex<Daemon>) {
        let Ok((sweeper, timeouts)) = daemon.lock().map(|d| {
            (
                d.balancer.dataplane().nat_sweeper(),
                NatTimeouts::from_config(&d.config.nat),
            )
        }) else {
            return;
        };
        let swept = sweeper.and_then(|s| s.run(now_ticks(), &timeouts));
        if let Ok(mut d) = daemon.lock() {
            d.record_nat_sweep(swept);
        }
    }

    /// Takes a sweep's result into the metrics, and logs new drops.
    /// (The first sweep only takes the counters: drops before this daemon are not its news.)
    fn record_nat_sweep(&mut self, swept: Result<NatSweep, DataplaneError>) {
        let swept = match swept {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("source NAT expiry: {e}");
                return;
            }
        };
        let m = &self.metrics;
        m.nat_flows.set(swept.flows as i64);
        m.nat_expired.inc_by(swept.expired);
        let before = self.nat_seen.unwrap_or_default();
        let (no_port, full) = (
            swept.stats.no_port.saturating_sub(before.no_port),
            swept.stats.table_full.saturating_sub(before.table_full),
        );
        m.nat_dropped
            .with_label_values(&["no_port"])
            .inc_by(no_port);
        m.nat_dropped
            .with_label_values(&["table_full"])
            .inc_by(full);
        if self.nat_seen.is_some() {
            let ports = &self.config.nat.ports;
            if no_port > 0 {
                tracing::warn!(
                    dropped = no_port,
                    flows = swept.flows,
                    "source NAT: {no_port} new flows found no free source port for their backend (nat.ports {}-{}, {} per backend address and port); widen [nat] ports, add backends or give VIPs another nat_source",
                    ports.start(),
                    ports.end(),
                    self.config.nat.port_count(),
                );
            }
            if full > 0 {
                tracing::warn!(
                    dropped = full,
                    flows = swept.flows,
                    "source NAT: {full} new flows dropped: the source-NAT tables are full (conntrack.max_flows = {}); raise it (after `balancer stop --detach`) or shorten [nat] timeouts",
                    self.config.conntrack.max_flows,
                );
            }
        }
        self.nat_seen = Some(swept.stats);
    }
}
