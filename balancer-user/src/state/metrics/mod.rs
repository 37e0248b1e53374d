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

/// A registered metric's name, help and labels (none for a single series).
struct Def {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    /// Histogram buckets (seconds); empty for the others.
    buckets: &'static [f64],
}

const TABLE_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
];

const TABLE_REBUILDS: Def = Def {
    name: "balancer_table_rebuilds_total",
    help: "Maglev tables built and published.",
    labels: &["vip"],
    buckets: &[],
};
const TABLE_BUILD_SECONDS: Def = Def {
    name: "balancer_table_build_seconds",
    help: "Time to build the Maglev tables of one change.",
    labels: &[],
    buckets: TABLE_BUCKETS,
};
const TABLE_PUBLISH_SECONDS: Def = Def {
    name: "balancer_table_publish_seconds",
    help: "Time to publish (swap in) the Maglev tables of one change, including the kernel's wait for readers of the old tables.",
    labels: &[],
    buckets: TABLE_BUCKETS,
};
const HEALTH_CHECKS: Def = Def {
    name: "balancer_health_checks_total",
    help: "Backend health checks by result.",
    labels: &["vip", "backend", "result"],
    buckets: &[],
};
const HEALTH_TRANSITIONS: Def = Def {
    name: "balancer_health_transitions_total",
    help: "Backends changing health state.",
    labels: &["vip", "backend", "to"],
    buckets: &[],
};
const CHANGE_ERRORS: Def = Def {
    name: "balancer_change_errors_total",
    help: "Configuration changes refused or failed.",
    labels: &["origin"],
    buckets: &[],
};
const PUBLISH_ERRORS: Def = Def {
    name: "balancer_table_publish_errors_total",
    help: "Valid changes and weight rounds whose tables the data plane did not take (the last ones stay in force).",
    labels: &["origin"],
    buckets: &[],
};
const REPORTS: Def = Def {
    name: "balancer_backend_reports_total",
    help: "Backend metrics scraped or pushed, by result.",
    labels: &["vip", "backend", "result"],
    buckets: &[],
};
const WEIGHT_CHANGES: Def = Def {
    name: "balancer_weight_changes_total",
    help: "Telemetry weight rounds that republished a VIP's table.",
    labels: &["vip"],
    buckets: &[],
};
const WEIGHT_PUBLISH_SECONDS: Def = Def {
    name: "balancer_weight_publish_seconds",
    help: "Seconds from a round's backend reports to the new table being live (policy, table build, swap).",
    labels: &[],
    buckets: &[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1],
};
const ROUND_SECONDS: Def = Def {
    name: "balancer_telemetry_round_seconds",
    help: "Seconds a VIP's telemetry round held the daemon: its backends' reports recorded and its weight round.",
    labels: &["vip"],
    buckets: &[
        0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5,
    ],
};
const NAT_FLOWS: Def = Def {
    name: "balancer_nat_source_flows",
    help: "Source-NAT flows holding a source port (as of the last expiry sweep, each second).",
    labels: &[],
    buckets: &[],
};
const NAT_EXPIRED: Def = Def {
    name: "balancer_nat_source_flows_expired_total",
    help: "Source-NAT flows removed after their idle or closed timeout ([nat]).",
    labels: &[],
    buckets: &[],
};
const NAT_DROPPED: Def = Def {
    name: "balancer_nat_source_dropped_total",
    help: "New source-NAT flows dropped: no free source port for their backend (no_port: widen [nat] ports or add a nat_source), the source-NAT tables full (table_full: raise conntrack.max_flows), or their client address holding nat.client_ports ports (client_quota).",
    labels: &["reason"],
    buckets: &[],
};
const NAT_RESET: Def = Def {
    name: "balancer_nat_source_reset_total",
    help: "TCP segments of no source-NAT flow and without SYN (spoofed, or of a connection another balancer translated), answered with a RST; no port taken.",
    labels: &[],
    buckets: &[],
};

/// Registers `metric` with `registry`, and returns it.
fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> prometheus::Result<M> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

impl Def {
    fn counter(&self, r: &Registry) -> prometheus::Result<IntCounter> {
        registered(r, IntCounter::new(self.name, self.help)?)
    }

    fn counter_vec(&self, r: &Registry) -> prometheus::Result<IntCounterVec> {
        registered(
            r,
            IntCounterVec::new(Opts::new(self.name, self.help), self.labels)?,
        )
    }

    fn gauge(&self, r: &Registry) -> prometheus::Result<IntGauge> {
        registered(r, IntGauge::new(self.name, self.help)?)
    }

    fn histogram_opts(&self) -> HistogramOpts {
        HistogramOpts::new(self.name, self.help).buckets(self.buckets.to_vec())
    }

    fn histogram(&self, r: &Registry) -> prometheus::Result<Histogram> {
        registered(r, Histogram::with_opts(self.histogram_opts())?)
    }

    fn histogram_vec(&self, r: &Registry) -> prometheus::Result<HistogramVec> {
        registered(r, HistogramVec::new(self.histogram_opts(), self.labels)?)
    }
}

impl Metrics {
    pub fn new() -> prometheus::Result<Metrics> {
        let r = Registry::new();
        let m = Metrics {
            table_rebuilds: TABLE_REBUILDS.counter_vec(&r)?,
            table_build_seconds: TABLE_BUILD_SECONDS.histogram(&r)?,
            table_publish_seconds: TABLE_PUBLISH_SECONDS.histogram(&r)?,
            health_checks: HEALTH_CHECKS.counter_vec(&r)?,
            health_transitions: HEALTH_TRANSITIONS.counter_vec(&r)?,
            change_errors: CHANGE_ERRORS.counter_vec(&r)?,
            publish_errors: PUBLISH_ERRORS.counter_vec(&r)?,
            reports: REPORTS.counter_vec(&r)?,
            weight_changes: WEIGHT_CHANGES.counter_vec(&r)?,
            weight_publish_seconds: WEIGHT_PUBLISH_SECONDS.histogram(&r)?,
            round_seconds: ROUND_SECONDS.histogram_vec(&r)?,
            nat_flows: NAT_FLOWS.gauge(&r)?,
            nat_expired: NAT_EXPIRED.counter(&r)?,
            nat_dropped: NAT_DROPPED.counter_vec(&r)?,
            nat_reset: NAT_RESET.counter(&r)?,
            registry: r,
        };
        // Every origin and reason from 0, so that an alert on its increase sees the first.
        for origin in PUBLISH_ORIGINS {
            m.publish_errors.with_label_values(&[origin]);
        }
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
