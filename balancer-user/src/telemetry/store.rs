//! The latest report of each backend, with rates derived from its counters (tokens per second
//! from the token counters, mean time to first token over the interval from the TTFT
//! histogram), and scrape error accounting.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::signals::Signals;
use crate::balancer::Endpoint;

/// One backend's telemetry.
#[derive(Clone, Debug, Default)]
pub struct BackendTelemetry {
    /// The latest signals and when they arrived.
    pub latest: Option<(Signals, Instant)>,
    /// Reports accepted.
    pub reports: u64,
    /// Scrapes or reports refused, and the last reason.
    pub errors: u64,
    pub last_error: Option<String>,
    /// Counter readings of the previous report, for rates.
    previous_tokens: Option<(f64, Instant)>,
    previous_ttft: Option<(f64, f64)>,
}

impl BackendTelemetry {
    /// Records a report received at `now`, deriving rates from the counters.
    pub fn record(&mut self, mut signals: Signals, now: Instant) {
        if let Some(total) = signals.tokens_total {
            if let Some((before, at)) = self.previous_tokens {
                let secs = now.duration_since(at).as_secs_f64();
                if secs > 0.0 && total >= before && signals.tokens_per_second.is_none() {
                    signals.tokens_per_second = Some((total - before) / secs);
                }
            }
            self.previous_tokens = Some((total, now));
        }
        if let Some((sum, count)) = signals.ttft_sum_count {
            if let Some((s0, c0)) = self.previous_ttft
                && count > c0
                && sum >= s0
            {
                signals.ttft_seconds = Some((sum - s0) / (count - c0));
            } else if signals.ttft_seconds.is_none() {
                // No new first tokens this interval: the last mean stands.
                signals.ttft_seconds = self.latest.as_ref().and_then(|(s, _)| s.ttft_seconds);
            }
            self.previous_ttft = Some((sum, count));
        }
        self.latest = Some((signals, now));
        self.reports += 1;
    }

    /// Records a failed scrape or a refused report.
    pub fn error(&mut self, reason: String) {
        self.errors += 1;
        self.last_error = Some(reason);
    }

    /// Age of the latest report at `now`.
    pub fn age(&self, now: Instant) -> Option<Duration> {
        self.latest.as_ref().map(|(_, at)| now.duration_since(*at))
    }
}

/// Telemetry of every (VIP, backend).
#[derive(Debug, Default)]
pub struct TelemetryStore {
    backends: HashMap<(Endpoint, IpAddr), BackendTelemetry>,
}

impl TelemetryStore {
    pub fn get(&self, vip: &Endpoint, backend: IpAddr) -> Option<&BackendTelemetry> {
        self.backends.get(&(*vip, backend))
    }

    pub fn entry(&mut self, vip: &Endpoint, backend: IpAddr) -> &mut BackendTelemetry {
        self.backends.entry((*vip, backend)).or_default()
    }

    /// Forgets backends no longer in `keep`.
    pub fn retain(&mut self, keep: impl Fn(&Endpoint, IpAddr) -> bool) {
        self.backends.retain(|(vip, b), _| keep(vip, *b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_counters() {
        let mut t = BackendTelemetry::default();
        let t0 = Instant::now();
        let report = |tokens: f64, sum: f64, count: f64| Signals {
            tokens_total: Some(tokens),
            ttft_sum_count: Some((sum, count)),
            ..Signals::default()
        };
        t.record(report(1000.0, 1.0, 10.0), t0);
        assert_eq!(t.latest.as_ref().unwrap().0.tokens_per_second, None);
        t.record(report(3000.0, 4.0, 20.0), t0 + Duration::from_millis(500));
        let s = &t.latest.as_ref().unwrap().0;
        assert_eq!(s.tokens_per_second, Some(4000.0));
        assert_eq!(s.ttft_seconds, Some(0.3));
        // No new first tokens: the last TTFT stands; a counter reset gives no rate.
        t.record(report(10.0, 4.0, 20.0), t0 + Duration::from_millis(1000));
        let s = &t.latest.as_ref().unwrap().0;
        assert_eq!(s.ttft_seconds, Some(0.3));
        assert_eq!(s.tokens_per_second, None);
        assert_eq!(
            t.age(t0 + Duration::from_millis(1500)),
            Some(Duration::from_millis(500))
        );
    }
}
