//! Prometheus metrics. The daemon's own events (table rebuilds, weight changes, health checks)
//! are ordinary registered metrics; the data plane's counters live in the kernel and are turned
//! into metric families at scrape time ([`Families`]), so a scrape always sees the kernel's
//! current values.

pub mod render;

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Where table changes come from: API changes, SIGHUP reloads, model discovery, weight
/// rounds, the fleet's weights (the `origin` of `balancer_table_publish_errors_total`).
pub const PUBLISH_ORIGINS: [&str; 5] = ["api", "sighup", "discovery", "weights", "fleet"];

/// The daemon's registered metrics.
pub struct Metrics {
    registry: Registry,
    /// Maglev tables built and published, per VIP.
    pub table_rebuilds: IntCounterVec,
    /// Seconds to build the tables of one change.
    pub table_build_seconds: Histogram,
    /// Seconds to publish (swap in) the tables of one change.
    pub table_publish_seconds: Histogram,
    /// Health checks by outcome.
    pub health_checks: IntCounterVec,
    /// Backend health transitions.
    pub health_transitions: IntCounterVec,
    /// Changes refused or failed, by origin.
    pub change_errors: IntCounterVec,
    /// Valid changes or weight rounds the data plane did not take, by origin.
    pub publish_errors: IntCounterVec,
    /// Scrapes and pushed reports by outcome.
    pub reports: IntCounterVec,
    /// Weight rounds that changed a VIP's table.
    pub weight_changes: IntCounterVec,
    /// Seconds from a round's reports to its table being live (policy, build, swap).
    pub weight_publish_seconds: Histogram,
    /// Seconds a VIP's telemetry round holds the daemon (its reports recorded, the weight
    /// round), per VIP.
    pub round_seconds: HistogramVec,
    /// Source NAT: flows holding a port, as of the last sweep.
    pub nat_flows: IntGauge,
    /// Source NAT: flows removed idle.
    pub nat_expired: IntCounter,
    /// Source NAT: new flows dropped for want of a port (`no_port`), of table space
    /// (`table_full`), or over their client's quota (`client_quota`).
    pub nat_dropped: IntCounterVec,
    /// Source NAT: TCP segments of no flow, without SYN, answered with a RST.
    pub nat_reset: IntCounter,
}

impl Metrics {
    pub fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let buckets = vec![
            0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
        ];
        let m = Metrics {
            table_rebuilds: IntCounterVec::new(
                Opts::new("balancer_table_rebuilds_total", "Maglev tables built and published."),
                &["vip"],
            )?,
            table_build_seconds: Histogram::with_opts(
                HistogramOpts::new("balancer_table_build_seconds", "Time to build the Maglev tables of one change.")
                    .buckets(buckets.clone()),
            )?,
            table_publish_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "balancer_table_publish_seconds",
                    "Time to publish (swap in) the Maglev tables of one change, including the kernel's wait for readers of the old tables.",
                )
                .buckets(buckets),
            )?,
            health_checks: IntCounterVec::new(
                Opts::new("balancer_health_checks_total", "Backend health checks by result."),
                &["vip", "backend", "result"],
            )?,
            health_transitions: IntCounterVec::new(
                Opts::new("balancer_health_transitions_total", "Backends changing health state."),
                &["vip", "backend", "to"],
            )?,
            change_errors: IntCounterVec::new(
                Opts::new("balancer_change_errors_total", "Configuration changes refused or failed."),
                &["origin"],
            )?,
            publish_errors: IntCounterVec::new(
                Opts::new(
                    "balancer_table_publish_errors_total",
                    "Valid changes and weight rounds whose tables the data plane did not take (the last ones stay in force).",
                ),
                &["origin"],
            )?,
            reports: IntCounterVec::new(
                Opts::new("balancer_backend_reports_total", "Backend metrics scraped or pushed, by result."),
                &["vip", "backend", "result"],
            )?,
            weight_changes: IntCounterVec::new(
                Opts::new("balancer_weight_changes_total", "Telemetry weight rounds that republished a VIP's table."),
                &["vip"],
            )?,
            weight_publish_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "balancer_weight_publish_seconds",
                    "Seconds from a round's backend reports to the new table being live (policy, table build, swap).",
                )
                .buckets(vec![0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1]),
            )?,
            round_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "balancer_telemetry_round_seconds",
                    "Seconds a VIP's telemetry round held the daemon: its backends' reports recorded and its weight round.",
                )
                .buckets(vec![0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5]),
                &["vip"],
            )?,
            nat_flows: IntGauge::new(
                "balancer_nat_source_flows",
                "Source-NAT flows holding a source port (as of the last expiry sweep, each second).",
            )?,
            nat_expired: IntCounter::new(
                "balancer_nat_source_flows_expired_total",
                "Source-NAT flows removed after their idle or closed timeout ([nat]).",
            )?,
            nat_dropped: IntCounterVec::new(
                Opts::new(
                    "balancer_nat_source_dropped_total",
                    "New source-NAT flows dropped: no free source port for their backend (no_port: widen [nat] ports or add a nat_source), the source-NAT tables full (table_full: raise conntrack.max_flows), or their client address holding nat.client_ports ports (client_quota).",
                ),
                &["reason"],
            )?,
            nat_reset: IntCounter::new(
                "balancer_nat_source_reset_total",
                "TCP segments of no source-NAT flow and without SYN (spoofed, or of a connection another balancer translated), answered with a RST; no port taken.",
            )?,
            registry,
        };
        m.registry.register(Box::new(m.table_rebuilds.clone()))?;
        m.registry
            .register(Box::new(m.table_build_seconds.clone()))?;
        m.registry
            .register(Box::new(m.table_publish_seconds.clone()))?;
        m.registry.register(Box::new(m.health_checks.clone()))?;
        m.registry
            .register(Box::new(m.health_transitions.clone()))?;
        m.registry.register(Box::new(m.change_errors.clone()))?;
        m.registry.register(Box::new(m.round_seconds.clone()))?;
        m.registry.register(Box::new(m.publish_errors.clone()))?;
        // Every origin from 0, so that an alert on its increase sees the first failure.
        for origin in PUBLISH_ORIGINS {
            m.publish_errors.with_label_values(&[origin]);
        }
        m.registry.register(Box::new(m.reports.clone()))?;
        m.registry.register(Box::new(m.weight_changes.clone()))?;
        m.registry
            .register(Box::new(m.weight_publish_seconds.clone()))?;
        m.registry.register(Box::new(m.nat_flows.clone()))?;
        m.registry.register(Box::new(m.nat_expired.clone()))?;
        m.registry.register(Box::new(m.nat_dropped.clone()))?;
        m.registry.register(Box::new(m.nat_reset.clone()))?;
        for reason in ["no_port", "table_full", "client_quota"] {
            m.nat_dropped.with_label_values(&[reason]);
        }
        Ok(m)
    }

    /// The text exposition of the registered metrics followed by `dynamic` ones.
    pub fn render(&self, dynamic: Families) -> String {
        let mut families = self.registry.gather();
        families.extend(dynamic.0);
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            tracing::error!("encoding metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Metric families built at scrape time.
#[derive(Default)]
pub struct Families(Vec<MetricFamily>);

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name((*k).to_string());
            l.set_value((*v).to_string());
            l
        })
        .collect()
}

impl Families {
    fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut MetricFamily {
        if let Some(at) = self.0.iter().position(|f| f.name() == name) {
            return &mut self.0[at];
        }
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        self.0.push(f);
        self.0.last_mut().expect("just pushed")
    }

    /// Adds a counter sample.
    pub fn counter(&mut self, name: &str, help: &str, label_pairs: &[(&str, &str)], value: f64) {
        let mut c = Counter::default();
        c.set_value(value);
        let mut m = Metric::from_label(labels(label_pairs));
        m.set_counter(c);
        self.family(name, help, MetricType::COUNTER)
            .mut_metric()
            .push(m);
    }

    /// Adds a gauge sample.
    pub fn gauge(&mut self, name: &str, help: &str, label_pairs: &[(&str, &str)], value: f64) {
        let mut g = Gauge::default();
        g.set_value(value);
        let mut m = Metric::from_label(labels(label_pairs));
        m.set_gauge(g);
        self.family(name, help, MetricType::GAUGE)
            .mut_metric()
            .push(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_registered_and_dynamic_metrics() {
        let m = Metrics::new().unwrap();
        m.table_rebuilds.with_label_values(&["web"]).inc();
        let mut d = Families::default();
        d.counter(
            "balancer_vip_packets_total",
            "Packets.",
            &[("vip", "web")],
            42.0,
        );
        d.counter(
            "balancer_vip_packets_total",
            "Packets.",
            &[("vip", "dns")],
            7.0,
        );
        d.gauge(
            "balancer_backend_weight",
            "Weight.",
            &[("vip", "web"), ("backend", "10.0.0.1")],
            3.0,
        );
        let text = m.render(d);
        assert!(
            text.contains("balancer_table_rebuilds_total{vip=\"web\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE balancer_vip_packets_total counter"),
            "{text}"
        );
        assert!(
            text.contains("balancer_vip_packets_total{vip=\"dns\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("balancer_backend_weight{vip=\"web\",backend=\"10.0.0.1\"} 3"),
            "{text}"
        );
        assert_eq!(text.matches("# TYPE balancer_vip_packets_total").count(), 1);
    }
}
