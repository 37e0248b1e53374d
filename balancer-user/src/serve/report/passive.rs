//! Passive request latency on a backend host (`balancer report --passive-latency`): attaches
//! the tc programs of the `tc-latency` object to an interface, watches TCP flows to the given
//! server ports, and turns what they measured into a metrics page and into the report's
//! time-to-first-token signal. What is measured and how: `balancer_common::latency` and the
//! program's source (`balancer-ebpf/src/bin/latency.rs`).
//!
//! Page (names of our own, shaped as vLLM's histograms, so any Prometheus reads them):
//! `balancer_passive_time_to_first_token_seconds`, `balancer_passive_inter_token_latency_seconds`
//! (histograms), `balancer_passive_requests_total`, `balancer_passive_unmatched_responses_total`,
//! `balancer_passive_skipped_requests_total` (HTTP `GET`/`HEAD`: health checks and scrapes);
//! each with the label `interface`.

use std::fmt::Write as _;

use aya::Ebpf;
use aya::maps::{HashMap, MapData, PerCpuArray};
use aya::programs::TcAttachType;
use aya::programs::tc::{self, SchedClassifier};
use balancer_common::latency::{
    LATENCY_BOUNDS, LATENCY_PORTS, LATENCY_STATS, LatencyHistogram, LatencyStats,
    MAX_LATENCY_PORTS, bound_ns,
};

use crate::dataplane::ebpf::{self, LATENCY_EGRESS_PROGRAM, LATENCY_INGRESS_PROGRAM, LoadError};
use crate::steering::telemetry::signals::Signals;

/// Metric names of the page.
pub const TTFT_FAMILY: &str = "balancer_passive_time_to_first_token_seconds";
pub const ITL_FAMILY: &str = "balancer_passive_inter_token_latency_seconds";
pub const REQUESTS_FAMILY: &str = "balancer_passive_requests_total";
pub const UNMATCHED_FAMILY: &str = "balancer_passive_unmatched_responses_total";
pub const SKIPPED_FAMILY: &str = "balancer_passive_skipped_requests_total";

#[derive(Debug, thiserror::Error)]
pub enum PassiveLatencyError {
    #[error(transparent)]
    Load(Box<LoadError>),
    #[error("no server port to watch: give at least one --latency-port")]
    NoPorts,
    #[error("port 0 cannot be watched")]
    PortZero,
    #[error("at most {MAX_LATENCY_PORTS} server ports can be watched ({0} given)")]
    TooManyPorts(usize),
    #[error("the latency object has no map {0}")]
    NoMap(&'static str),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("attaching {program} to {interface} ({direction}): {source}")]
    Attach {
        program: &'static str,
        interface: String,
        direction: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
}

impl From<LoadError> for PassiveLatencyError {
    fn from(e: LoadError) -> Self {
        PassiveLatencyError::Load(Box::new(e))
    }
}

/// The latency programs loaded with their ports set; attached or not.
pub struct PassiveLatency {
    object: Ebpf,
    interface: Option<String>,
}

impl PassiveLatency {
    /// Loads the programs and watches flows to `ports` (a server's listening ports).
    pub fn load(ports: &[u16]) -> Result<PassiveLatency, PassiveLatencyError> {
        if ports.is_empty() {
            return Err(PassiveLatencyError::NoPorts);
        }
        if ports.contains(&0) {
            return Err(PassiveLatencyError::PortZero);
        }
        if ports.len() > MAX_LATENCY_PORTS as usize {
            return Err(PassiveLatencyError::TooManyPorts(ports.len()));
        }
        let mut object = ebpf::load_latency()?;
        let map_error = |source| PassiveLatencyError::Map {
            name: LATENCY_PORTS,
            source,
        };
        let mut map: HashMap<&mut MapData, u16, u8> = object
            .map_mut(LATENCY_PORTS)
            .ok_or(PassiveLatencyError::NoMap(LATENCY_PORTS))?
            .try_into()
            .map_err(map_error)?;
        for port in ports {
            map.insert(port.to_be(), 1, 0).map_err(map_error)?;
        }
        Ok(PassiveLatency {
            object,
            interface: None,
        })
    }

    /// Attaches both programs to `interface` (tcx links on kernels from 6.6, else a clsact
    /// qdisc's filters); they stay attached while `self` lives.
    pub fn attach(&mut self, interface: &str) -> Result<(), PassiveLatencyError> {
        for (program, attach_type, direction) in [
            (LATENCY_INGRESS_PROGRAM, TcAttachType::Ingress, "ingress"),
            (LATENCY_EGRESS_PROGRAM, TcAttachType::Egress, "egress"),
        ] {
            let attach_error = |source| PassiveLatencyError::Attach {
                program,
                interface: interface.to_string(),
                direction,
                source: Box::new(source),
            };
            let prog = self.classifier(program)?;
            if let Err(first) = prog.attach(interface, attach_type) {
                // Kernels before tcx need the clsact qdisc (it may exist already).
                if tc::qdisc_add_clsact(interface).is_err() {
                    return Err(attach_error(first));
                }
                prog.attach(interface, attach_type).map_err(attach_error)?;
            }
        }
        self.interface = Some(interface.to_string());
        Ok(())
    }

    /// One of the two programs (for `BPF_PROG_TEST_RUN` tests): [`LATENCY_INGRESS_PROGRAM`]
    /// or [`LATENCY_EGRESS_PROGRAM`].
    pub fn classifier(
        &mut self,
        name: &'static str,
    ) -> Result<&mut SchedClassifier, PassiveLatencyError> {
        Ok(ebpf::classifier(&mut self.object, name)?)
    }

    /// What was measured, summed over CPUs.
    pub fn stats(&self) -> Result<LatencyStats, PassiveLatencyError> {
        let map_error = |source| PassiveLatencyError::Map {
            name: LATENCY_STATS,
            source,
        };
        let map: PerCpuArray<&MapData, LatencyStats> = self
            .object
            .map(LATENCY_STATS)
            .ok_or(PassiveLatencyError::NoMap(LATENCY_STATS))?
            .try_into()
            .map_err(map_error)?;
        let mut sum = LatencyStats::default();
        for cpu in map.get(&0, 0).map_err(map_error)?.iter() {
            sum.add(cpu);
        }
        Ok(sum)
    }

    /// The interface the programs are attached to.
    pub fn interface(&self) -> Option<&str> {
        self.interface.as_deref()
    }
}

/// The report's signal: time to first token as a running sum and count (the reporter and the
/// daemon turn it into a recent mean).
pub fn signals(stats: &LatencyStats) -> Signals {
    Signals {
        ttft_sum_count: Some((stats.ttft.sum_ns as f64 / 1e9, stats.ttft.count as f64)),
        ..Signals::default()
    }
}

/// The metrics page of `stats`, measured on `interface`.
pub fn render(stats: &LatencyStats, interface: &str) -> String {
    let label = format!(
        "interface=\"{}\"",
        interface.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let mut out = String::new();
    histogram(
        &mut out,
        TTFT_FAMILY,
        "Time from a request's last packet to the first response data packet, measured on this host's interface.",
        &label,
        &stats.ttft,
    );
    histogram(
        &mut out,
        ITL_FAMILY,
        "Time between a response's data packets after the first, measured on this host's interface.",
        &label,
        &stats.itl,
    );
    let _ = writeln!(
        out,
        "# HELP {REQUESTS_FAMILY} Requests seen to the watched server ports.\n# TYPE {REQUESTS_FAMILY} counter\n{REQUESTS_FAMILY}{{{label}}} {}",
        stats.requests
    );
    let _ = writeln!(
        out,
        "# HELP {UNMATCHED_FAMILY} Response data packets of flows with no request seen.\n# TYPE {UNMATCHED_FAMILY} counter\n{UNMATCHED_FAMILY}{{{label}}} {}",
        stats.unmatched
    );
    let _ = writeln!(
        out,
        "# HELP {SKIPPED_FAMILY} Requests not measured: HTTP GET and HEAD (health checks, metrics scrapes).\n# TYPE {SKIPPED_FAMILY} counter\n{SKIPPED_FAMILY}{{{label}}} {}",
        stats.skipped
    );
    out
}

fn histogram(out: &mut String, name: &str, help: &str, label: &str, h: &LatencyHistogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for i in 0..LATENCY_BOUNDS {
        cumulative += h.buckets[i];
        let le = bound_ns(i) as f64 / 1e9;
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"{le}\"}} {cumulative}");
    }
    cumulative += h.buckets[LATENCY_BOUNDS];
    let _ = writeln!(
        out,
        "{name}_bucket{{{label},le=\"+Inf\"}} {cumulative}\n{name}_sum{{{label}}} {}\n{name}_count{{{label}}} {}",
        h.sum_ns as f64 / 1e9,
        h.count
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steering::telemetry::page;
    use crate::steering::telemetry::signals::extract;

    #[test]
    fn the_page_parses_and_gives_the_ttft_signal() {
        let mut stats = LatencyStats::default();
        stats.ttft.observe(200_000_000);
        stats.ttft.observe(400_000_000);
        stats.itl.observe(20_000_000);
        stats.requests = 2;
        stats.unmatched = 1;
        stats.skipped = 3;
        let page = render(&stats, "eth\"0");
        let samples = page::parse(&page).expect("our own page parses");
        let get = |name: &str, le: Option<&str>| {
            samples
                .iter()
                .find(|s| s.name == name && s.label("le") == le)
                .map(|s| s.value)
        };
        assert_eq!(get(&format!("{TTFT_FAMILY}_count"), None), Some(2.0));
        assert_eq!(get(&format!("{TTFT_FAMILY}_sum"), None), Some(0.6));
        assert_eq!(
            get(&format!("{TTFT_FAMILY}_bucket"), Some("+Inf")),
            Some(2.0)
        );
        // 0.2 s and 0.4 s fall in the buckets up to 2^28 ns (0.268 s) and 2^29 ns (0.537 s).
        assert_eq!(
            get(&format!("{TTFT_FAMILY}_bucket"), Some("0.268435456")),
            Some(1.0)
        );
        assert_eq!(
            get(&format!("{TTFT_FAMILY}_bucket"), Some("0.536870912")),
            Some(2.0)
        );
        assert_eq!(get(&format!("{ITL_FAMILY}_count"), None), Some(1.0));
        assert_eq!(get(REQUESTS_FAMILY, None), Some(2.0));
        assert_eq!(get(UNMATCHED_FAMILY, None), Some(1.0));
        assert_eq!(get(SKIPPED_FAMILY, None), Some(3.0));
        assert!(
            samples
                .iter()
                .all(|s| s.label("interface") == Some("eth\"0"))
        );
        let s = extract(&samples);
        assert_eq!(s.ttft_sum_count, Some((0.6, 2.0)));
        assert_eq!(signals(&stats).ttft_sum_count, Some((0.6, 2.0)));
    }

    #[test]
    fn ports_are_checked_before_anything_loads() {
        assert!(matches!(
            PassiveLatency::load(&[]),
            Err(PassiveLatencyError::NoPorts)
        ));
        assert!(matches!(
            PassiveLatency::load(&[8000, 0]),
            Err(PassiveLatencyError::PortZero)
        ));
        let many: Vec<u16> = (1..=(MAX_LATENCY_PORTS as u16 + 1)).collect();
        assert!(matches!(
            PassiveLatency::load(&many),
            Err(PassiveLatencyError::TooManyPorts(65))
        ));
    }
}
