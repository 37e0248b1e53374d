//! Source NAT's upkeep: once a second, flows idle past their timeout give their ports back,
//! and new flows dropped for want of a port or of table space are counted and logged.

use balancer_common::maps::NAT_SNAT;

use crate::dataplane::DataplaneError;
use crate::dataplane::nat_expiry::{NatSweep, NatSweepSettings, now_ticks};

use super::Daemon;

impl Daemon {
    /// Sweeps the source-NAT tables, holding `daemon` only to start the sweep and to record
    /// it (a sweep of many flows takes a while). Blocking.
    pub fn sweep_nat(daemon: &std::sync::Mutex<Daemon>) {
        let Ok(Some((sweeper, settings))) = daemon.lock().map(|d| {
            d.nat_sweep_due().then(|| {
                (
                    d.balancer.dataplane().nat_sweeper(),
                    NatSweepSettings::from_config(&d.config.nat),
                )
            })
        }) else {
            return;
        };
        let swept = sweeper.and_then(|s| s.run(now_ticks(), &settings));
        if let Ok(mut d) = daemon.lock() {
            d.record_nat_sweep(swept);
        }
    }

    /// Whether the source-NAT tables need a sweep: while a VIP uses source NAT, and after, until
    /// a sweep has found them empty. (Listing the keys of even an empty table walks all its
    /// buckets, `conntrack.max_flows` of them: about a millisecond at the default 2M, every
    /// second, in a daemon with no source NAT at all.)
    fn nat_sweep_due(&self) -> bool {
        sweep_due(self.balancer.settings().nat, self.nat_flows_left)
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
        self.nat_flows_left = Some(swept.flows);
        m.nat_expired.inc_by(swept.expired);
        let before = self.nat_seen.unwrap_or_default();
        let (no_port, full, quota) = (
            swept.stats.no_port.saturating_sub(before.no_port),
            swept.stats.table_full.saturating_sub(before.table_full),
            swept.stats.client_quota.saturating_sub(before.client_quota),
        );
        m.nat_dropped
            .with_label_values(&["no_port"])
            .inc_by(no_port);
        m.nat_dropped
            .with_label_values(&["table_full"])
            .inc_by(full);
        m.nat_dropped
            .with_label_values(&["client_quota"])
            .inc_by(quota);
        m.nat_reset
            .inc_by(swept.stats.not_syn.saturating_sub(before.not_syn));
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
            if quota > 0 {
                tracing::warn!(
                    dropped = quota,
                    flows = swept.flows,
                    "source NAT: {quota} new flows dropped: their client address holds nat.client_ports = {} ports; raise it if one address (a proxy, a client NAT) opens that many connections at once",
                    self.config.nat.client_ports,
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

/// Whether to sweep, given the data plane's NAT bits and the flows the last sweep left.
fn sweep_due(nat_bits: u32, flows_left: Option<u64>) -> bool {
    nat_bits & NAT_SNAT != 0 || flows_left != Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use balancer_common::maps::NAT_GATEWAY;

    #[test]
    fn source_nat_tables_are_swept_while_in_use_and_until_found_empty() {
        // In use: always, even when empty.
        assert!(sweep_due(NAT_SNAT, Some(0)));
        assert!(sweep_due(NAT_SNAT | NAT_GATEWAY, None));
        // Not in use: a first sweep (flows pinned by an earlier daemon), and on while any
        // are left; then never.
        assert!(sweep_due(0, None));
        assert!(sweep_due(NAT_GATEWAY, Some(3)));
        assert!(!sweep_due(0, Some(0)));
        assert!(!sweep_due(NAT_GATEWAY, Some(0)));
    }
}
