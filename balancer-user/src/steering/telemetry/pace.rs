//! How long a VIP's telemetry loop waits before its next scrape.
//!
//! A report is worth what happens between it and the next: the requests placed on it. So the
//! loop paces its scrapes by the VIP's requests, not by the clock: the next scrape comes after
//! about `requests_per_scrape` requests per backend at the rate of the last interval, never
//! sooner than `interval` nor later than `max_interval`. A busy VIP is scraped as often as
//! `interval` allows (at 100 requests a second over 4 backends and 8 requests per backend, every
//! 320 ms); an idle or quiet one every `max_interval` — so the scrapes' cost per request stays
//! bounded at any rate, where a fixed interval spends the same each second on 1 request as on
//! 1,000.
//!
//! A burst must not wait for the slowest interval: the loop scrapes at once (though not sooner
//! than `interval` after the last) when the VIP's new flows reach `requests_per_scrape` per
//! backend since the last scrape. The data plane counts them down and tells the loop
//! ([`super::due`]); where it cannot, the loop reads the VIP's new-flow counter every
//! [`COUNT_CHECK`] of a wait longer than that.
//!
//! Requests are counted two ways, and the larger count is taken: the data plane's new flows to
//! the VIP (every kind of backend; one per connection) and the servers' own count of requests
//! that got their first token, from the pages just scraped (vLLM's TTFT histogram count, or the
//! one `balancer report --passive-latency` keeps), which also counts requests that reuse a
//! client's connection. Where neither can be
//! read, the loop scrapes every `interval`, as configured.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use super::signals::Valid;
use crate::base::config::TelemetryConfig;

/// How often a loop waiting longer than this reads the VIP's new flows, to scrape at once
/// when they reach the requests a scrape is for (where the data plane cannot tell it).
pub const COUNT_CHECK: Duration = Duration::from_millis(500);

/// The pace of one VIP's scrapes, and the counters it was last given.
#[derive(Debug)]
pub struct ScrapePace {
    fastest: Duration,
    slowest: Duration,
    requests_per_scrape: u32,
    /// The VIP's new flows counted so far, at the last reading.
    flows: Option<u64>,
    /// Each backend's count of first tokens, at its last report.
    first_tokens: HashMap<IpAddr, f64>,
}

impl ScrapePace {
    pub fn new(cfg: &TelemetryConfig) -> ScrapePace {
        ScrapePace {
            fastest: cfg.interval,
            slowest: cfg.slowest(),
            requests_per_scrape: cfg.requests_per_scrape,
            flows: None,
            first_tokens: HashMap::new(),
        }
    }

    /// Whether the pace can leave `interval`: otherwise the loop scrapes every `interval`.
    pub fn varies(&self) -> bool {
        self.requests_per_scrape > 0 && self.slowest > self.fastest
    }

    /// The requests seen since the last call: the more of the data plane's new flows (`flows`,
    /// the VIP's counter, None where it cannot be read) and the servers' first tokens in
    /// `reports`. None where neither could be counted (the first call, or no counter at all).
    /// A counter that went back (a restarted server, a reloaded program) counts from zero.
    pub fn requests_since(
        &mut self,
        flows: Option<u64>,
        reports: &[(IpAddr, Result<Valid, String>)],
    ) -> Option<u64> {
        let by_flows = match (flows, self.flows) {
            (Some(now), Some(before)) => Some(now.checked_sub(before).unwrap_or(now)),
            _ => None,
        };
        if flows.is_some() {
            self.flows = flows;
        }
        let mut by_servers: Option<f64> = None;
        for (backend, report) in reports {
            let Some((_, count)) = report.as_ref().ok().and_then(|s| s.ttft_sum_count) else {
                continue;
            };
            if let Some(before) = self.first_tokens.insert(*backend, count) {
                let new = if count >= before {
                    count - before
                } else {
                    count
                };
                *by_servers.get_or_insert(0.0) += new;
            }
        }
        match (by_flows, by_servers) {
            (None, None) => None,
            (f, s) => Some(f.unwrap_or(0).max(s.unwrap_or(0.0).round() as u64)),
        }
    }

    /// The requests a scrape is for on `backends` backends.
    pub fn flows_per_scrape(&self, backends: usize) -> u64 {
        u64::from(self.requests_per_scrape) * backends.max(1) as u64
    }

    /// Whether the VIP's new flows (`flows`, its counter now) since the last scrape reached the
    /// requests a scrape is for on `backends` backends, so the next is due at once.
    pub fn due_by_flows(&self, flows: Option<u64>, backends: usize) -> bool {
        let (Some(now), Some(before)) = (flows, self.flows) else {
            return false;
        };
        self.varies() && now.checked_sub(before).unwrap_or(now) >= self.flows_per_scrape(backends)
    }

    /// How long to wait before the next scrape, given `requests` seen over the `elapsed` time
    /// since the scrape before (None: not counted) on `backends` backends.
    pub fn next_wait(&self, requests: Option<u64>, elapsed: Duration, backends: usize) -> Duration {
        if !self.varies() {
            return self.fastest;
        }
        let Some(requests) = requests else {
            return self.fastest;
        };
        if requests == 0 {
            return self.slowest;
        }
        let rate = requests as f64 / elapsed.as_secs_f64().max(1e-3);
        let wanted = f64::from(self.requests_per_scrape) * backends.max(1) as f64;
        Duration::from_secs_f64((wanted / rate).min(self.slowest.as_secs_f64()))
            .clamp(self.fastest, self.slowest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::config::TelemetrySource;
    use crate::steering::telemetry::signals::Signals;

    fn pace(fastest_ms: u64, slowest_ms: u64, per_backend: u32) -> ScrapePace {
        ScrapePace::new(&TelemetryConfig {
            source: TelemetrySource::Scrape(vec![(8000, "/metrics".into())]),
            interval: Duration::from_millis(fastest_ms),
            max_interval: Duration::from_millis(slowest_ms),
            requests_per_scrape: per_backend,
            timeout: Duration::from_millis(50),
            max_body: 1 << 16,
            derived_half_life: Duration::from_millis(200),
            access: Default::default(),
        })
    }

    fn served(first_tokens: f64) -> Result<Valid, String> {
        Ok(Signals {
            ttft_sum_count: Some((first_tokens * 0.1, first_tokens)),
            ..Signals::default()
        }
        .validate()
        .unwrap())
    }

    const S: fn(u64) -> Duration = Duration::from_secs;
    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_wait_is_the_time_the_vip_takes_for_its_requests_per_backend() {
        let p = pace(100, 4000, 8);
        // 4 backends, 8 requests each: 32 requests; at 16 a second, 2 s.
        assert_eq!(p.next_wait(Some(32), S(2), 4), S(2));
        // Busier: 320 a second would be 100 ms; 3,200 a second cannot go below the fastest.
        assert_eq!(p.next_wait(Some(320), S(1), 4), MS(100));
        assert_eq!(p.next_wait(Some(3200), S(1), 4), MS(100));
        // Quiet: 2 a second would be 16 s; no request at all: the slowest.
        assert_eq!(p.next_wait(Some(4), S(2), 4), S(4));
        assert_eq!(p.next_wait(Some(0), S(4), 4), S(4));
        // More backends, the same rate: longer (each backend's report serves its own share).
        assert_eq!(p.next_wait(Some(32), S(2), 2), S(1));
    }

    #[test]
    fn the_loop_scrapes_every_interval_when_the_pace_is_fixed_or_nothing_counts() {
        // requests_per_scrape = 0, or max_interval = interval: fixed.
        assert!(!pace(100, 4000, 0).varies());
        assert_eq!(pace(100, 4000, 0).next_wait(Some(0), S(1), 4), MS(100));
        assert!(!pace(2000, 2000, 8).varies());
        assert_eq!(pace(2000, 2000, 8).next_wait(Some(0), S(2), 4), S(2));
        // Nothing counted: as configured.
        assert_eq!(pace(100, 4000, 8).next_wait(None, S(1), 4), MS(100));
    }

    #[test]
    fn requests_are_the_more_of_new_flows_and_the_servers_first_tokens() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut p = pace(100, 4000, 8);
        // The first readings only set where counting starts.
        assert_eq!(p.requests_since(Some(1000), &[(a, served(50.0))]), None);
        assert_eq!(p.requests_since(None, &[]), None);
        // New flows only (a server with no TTFT histogram, a failed scrape).
        assert_eq!(
            p.requests_since(Some(1012), &[(b, Err("timed out".into()))]),
            Some(12)
        );
        // Clients that keep their connections: few new flows, the servers count more.
        assert_eq!(
            p.requests_since(Some(1014), &[(a, served(80.0)), (b, served(5.0))]),
            Some(30)
        );
        // b's second report counts; a's counter went back (a restart): counted from zero.
        assert_eq!(
            p.requests_since(Some(1015), &[(a, served(3.0)), (b, served(15.0))]),
            Some(13)
        );
        // The data plane's counter went back (a reloaded program): counted from zero.
        assert_eq!(p.requests_since(Some(7), &[]), Some(7));
    }

    #[test]
    fn a_burst_of_new_flows_makes_the_next_scrape_due_at_once() {
        let mut p = pace(100, 4000, 8);
        // No reading yet: never due by the count.
        assert!(!p.due_by_flows(Some(1_000_000), 4));
        p.requests_since(Some(100), &[]);
        // 4 backends x 8: due from 32 new flows on.
        assert!(!p.due_by_flows(Some(131), 4));
        assert!(p.due_by_flows(Some(132), 4));
        assert!(!p.due_by_flows(None, 4));
        // A counter that went back counts from zero.
        assert!(p.due_by_flows(Some(40), 4));
        assert!(!p.due_by_flows(Some(10), 4));
        // A fixed pace is never due by the count.
        let mut fixed = pace(100, 4000, 0);
        fixed.requests_since(Some(100), &[]);
        assert!(!fixed.due_by_flows(Some(1_000_000), 4));
    }

    #[test]
    fn no_counter_at_all_counts_nothing() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut p = pace(100, 4000, 8);
        assert_eq!(p.requests_since(None, &[(a, Err("refused".into()))]), None);
        assert_eq!(p.requests_since(None, &[(a, Ok(Valid::default()))]), None);
    }
}
