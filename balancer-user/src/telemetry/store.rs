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
    previous_prefill: Option<(f64, f64)>,
    previous_prompt: Option<(f64, f64)>,
    previous_prefix: Option<(f64, f64)>,
}

impl BackendTelemetry {
    /// Records a report received at `now`, deriving rates from the counters. A histogram or
    /// counter pair that did not move this interval keeps the last derived figure.
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
        let last = self.latest.as_ref().map(|(s, _)| s);
        if let Some(reading) = signals.ttft_sum_count {
            // Mean TTFT of the first tokens of this interval.
            if signals.ttft_seconds.is_none() {
                signals.ttft_seconds = interval_ratio(self.previous_ttft, reading)
                    .or_else(|| last.and_then(|s| s.ttft_seconds));
            }
            self.previous_ttft = Some(reading);
        }
        if let Some(reading) = signals.prefill_sum_count {
            // Mean prefill time of the requests finished this interval.
            if signals.prefill_seconds.is_none() {
                signals.prefill_seconds = interval_ratio(self.previous_prefill, reading)
                    .or_else(|| last.and_then(|s| s.prefill_seconds));
            }
            // Per prompt token: the same requests' prefill seconds over their prompt tokens
            // (both histograms are observed as a request finishes).
            if let Some(prompt) = signals.prompt_sum_count {
                if signals.prompt_tokens_mean.is_none() {
                    signals.prompt_tokens_mean = interval_ratio(self.previous_prompt, prompt)
                        .or_else(|| last.and_then(|s| s.prompt_tokens_mean));
                }
                if signals.prefill_seconds_per_token.is_none() {
                    signals.prefill_seconds_per_token = self
                        .previous_prefill
                        .zip(self.previous_prompt)
                        .and_then(|((s0, _), (t0, _))| {
                            interval_ratio(Some((s0, t0)), (reading.0, prompt.0))
                        })
                        .or_else(|| last.and_then(|s| s.prefill_seconds_per_token));
                }
                self.previous_prompt = Some(prompt);
            }
            self.previous_prefill = Some(reading);
        }
        if let Some(reading) = signals.prefix_cache_counts {
            // Share of this interval's prompt tokens found in the cache.
            if signals.prefix_cache_hit_rate.is_none() {
                signals.prefix_cache_hit_rate = interval_ratio(self.previous_prefix, reading)
                    .map(|r| r.clamp(0.0, 1.0))
                    .or_else(|| last.and_then(|s| s.prefix_cache_hit_rate));
            }
            self.previous_prefix = Some(reading);
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

/// `Δnumerator / Δdenominator` between two readings of a counter pair, when the denominator
/// grew and neither went backwards (a restarted server resets its counters).
fn interval_ratio(before: Option<(f64, f64)>, now: (f64, f64)) -> Option<f64> {
    let (n0, d0) = before?;
    let (n, d) = now;
    (d > d0 && n >= n0).then(|| (n - n0) / (d - d0))
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
            prefill_sum_count: Some((sum / 10.0, count)),
            prompt_sum_count: Some((count * 100.0, count)),
            ..Signals::default()
        };
        t.record(report(1000.0, 1.0, 10.0), t0);
        assert_eq!(t.latest.as_ref().unwrap().0.ttft_seconds, None);
        assert_eq!(t.latest.as_ref().unwrap().0.tokens_per_second, None);
        t.record(report(3000.0, 4.0, 20.0), t0 + Duration::from_millis(500));
        let s = &t.latest.as_ref().unwrap().0;
        assert_eq!(s.tokens_per_second, Some(4000.0));
        assert_eq!(s.ttft_seconds, Some(0.3));
        assert!((s.prefill_seconds.unwrap() - 0.03).abs() < 1e-12);
        // 0.3 s of prefill over 1,000 prompt tokens.
        assert!((s.prefill_seconds_per_token.unwrap() - 0.0003).abs() < 1e-12);
        assert_eq!(s.prompt_tokens_mean, Some(100.0));
        // No new first tokens: the last TTFT stands; a counter reset gives no rate.
        t.record(report(10.0, 4.0, 20.0), t0 + Duration::from_millis(1000));
        let s = &t.latest.as_ref().unwrap().0;
        assert_eq!(s.ttft_seconds, Some(0.3));
        assert!((s.prefill_seconds.unwrap() - 0.03).abs() < 1e-12, "kept");
        assert!((s.prefill_seconds_per_token.unwrap() - 0.0003).abs() < 1e-12);
        assert_eq!(s.tokens_per_second, None);
        assert_eq!(
            t.age(t0 + Duration::from_millis(1500)),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn the_prefix_cache_hit_rate_is_the_share_of_an_intervals_queries() {
        let mut t = BackendTelemetry::default();
        let t0 = Instant::now();
        let report = |hits: f64, queries: f64| Signals {
            prefix_cache_counts: Some((hits, queries)),
            ..Signals::default()
        };
        let rate = |t: &BackendTelemetry| t.latest.as_ref().unwrap().0.prefix_cache_hit_rate;
        t.record(report(0.0, 0.0), t0);
        assert_eq!(rate(&t), None, "one reading gives no rate");
        // 1,024 prompt tokens looked up, 768 found.
        t.record(report(768.0, 1024.0), t0 + Duration::from_millis(100));
        assert_eq!(rate(&t), Some(0.75));
        // No lookups this interval: the last rate stands.
        t.record(report(768.0, 1024.0), t0 + Duration::from_millis(200));
        assert_eq!(rate(&t), Some(0.75));
        // 1,000 more, none found.
        t.record(report(768.0, 2024.0), t0 + Duration::from_millis(300));
        assert_eq!(rate(&t), Some(0.0));
        // A restarted server (counters back to small numbers): no rate from the reset.
        t.record(report(10.0, 3000.0), t0 + Duration::from_millis(400));
        assert_eq!(rate(&t), Some(0.0), "kept, not computed across a reset");
        // A server that reports the rate itself (SGLang) is taken as it is.
        t.record(
            Signals {
                prefix_cache_hit_rate: Some(0.4),
                ..Signals::default()
            },
            t0 + Duration::from_millis(500),
        );
        assert_eq!(rate(&t), Some(0.4));
    }
}
