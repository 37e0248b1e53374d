//! The latest report of each backend, with figures derived from its counters: tokens per
//! second from the token counters, and the ratios of counter pairs — mean time to first token
//! (TTFT histogram), prefill time per request and per prompt token, mean prompt size, prefix
//! cache hit rate — over a decaying window ([`DecayedRatio`]); the fastest prefill per token
//! ([`Fastest`]); the requests that have no first token yet ([`PrefillQueue`]); and scrape
//! error accounting.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::signals::{Signals, Valid};
use crate::base::net::Endpoint;

/// Half-life of the long-run window of a [`DecayedRatio`].
pub const LONG_RUN_HALF_LIFE: Duration = Duration::from_secs(60);
/// Share of the long-run window beside the recent one while data arrives at a steady rate.
const LONG_RUN_SHARE: f64 = 0.25;

/// The increments of a counter pair since the previous reading; none for the first reading or
/// counters that went backwards (a restarted server).
fn increments(previous: Option<(f64, f64)>, reading: (f64, f64)) -> Option<(f64, f64)> {
    let (n0, d0) = previous?;
    let (dn, dd) = (reading.0 - n0, reading.1 - d0);
    (dn >= 0.0 && dd >= 0.0 && dn.is_finite() && dd.is_finite()).then_some((dn, dd))
}

/// The ratio of the increments of a counter pair (`Δsum / Δcount` of a histogram, `Δhits /
/// Δqueries`), each increment weighted by its own size, over two windows that decay with
/// time: a recent one (the given half-life, [`RECENT_HALF_LIFE`](crate::base::config::RECENT_HALF_LIFE) by default) and a long-run
/// one ([`LONG_RUN_HALF_LIFE`]) that counts for a quarter as much at a steady rate.
///
/// While requests keep finishing the figure follows the recent window; when they stop, the
/// recent evidence ages faster than the long-run one and the figure moves to the backend's
/// long-run value instead of keeping the last interval's for ever. So a burst's last interval
/// (prefill measured while the batch was full, say) does not outlive the burst, and two equal
/// GPUs that served the same traffic score alike once idle. Counters that go backwards (a
/// restarted server) add nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecayedRatio {
    previous: Option<(f64, f64)>,
    recent: (f64, f64),
    long_run: (f64, f64),
}

impl DecayedRatio {
    /// Takes a reading `elapsed` after the previous one and returns the figure, if any data
    /// arrived so far; `recent`: the recent window's half-life.
    pub fn update(
        &mut self,
        reading: (f64, f64),
        elapsed: Duration,
        recent: Duration,
    ) -> Option<f64> {
        let decay = |window: &mut (f64, f64), half_life: Duration| {
            let f = (-elapsed.as_secs_f64() / half_life.as_secs_f64()).exp2();
            window.0 *= f;
            window.1 *= f;
        };
        let recent = recent.max(Duration::from_millis(1));
        decay(&mut self.recent, recent);
        decay(&mut self.long_run, LONG_RUN_HALF_LIFE);
        if let Some((dn, dd)) = increments(self.previous, reading) {
            for w in [&mut self.recent, &mut self.long_run] {
                w.0 += dn;
                w.1 += dd;
            }
        }
        self.previous = Some(reading);
        self.value(recent)
    }

    /// Forgets the previous reading, keeping the windows: the next reading counts from itself,
    /// as after a restart (for a pair whose denominator changed what it counts).
    pub fn restart(&mut self) {
        self.previous = None;
    }

    /// The figure: both windows pooled, the long-run one scaled so that it counts for
    /// [`LONG_RUN_SHARE`] of the recent one (of half-life `recent`) at a steady rate of data.
    pub fn value(&self, recent: Duration) -> Option<f64> {
        let scale = LONG_RUN_SHARE * recent.as_secs_f64() / LONG_RUN_HALF_LIFE.as_secs_f64();
        let n = self.recent.0 + scale * self.long_run.0;
        let d = self.recent.1 + scale * self.long_run.1;
        (d > 0.0 && d.is_normal()).then(|| n / d)
    }
}

/// The requests of a vLLM server that have no first token yet — waiting, or running in a
/// chunked prefill — from what its page says: the requests in flight (`running + waiting`)
/// less those past their first token. Those are the requests that got a first token
/// (`time_to_first_token_seconds_count`) less those that finished (`request_prompt_tokens_count`,
/// observed as a request finishes), give or take an offset `o` for requests counted in one and
/// not the other (aborted before their first token, say): past = `first - finished - o`.
///
/// The offset is 0 on a server that never aborted a request; each reading bounds it, since
/// between 0 and every request in flight are past their first token, and an idle server's
/// reading pins it. So it starts at 0 and is kept within each reading's bounds; counters that
/// go backwards (a restarted server) start it again.
#[derive(Clone, Copy, Debug, Default)]
pub struct PrefillQueue {
    offset: f64,
    previous: Option<(f64, f64)>,
}

impl PrefillQueue {
    /// The requests without a first token, from a reading of first tokens and finished
    /// requests (both cumulative) and the requests running and waiting now.
    pub fn update(&mut self, first: f64, finished: f64, running: f64, waiting: f64) -> f64 {
        if self
            .previous
            .is_some_and(|(f0, d0)| first < f0 || finished < d0)
        {
            self.offset = 0.0;
        }
        self.previous = Some((first, finished));
        let in_flight = (running + waiting).max(0.0);
        let gap = first - finished;
        if !(in_flight.is_finite() && gap.is_finite() && self.offset.is_finite()) {
            // Not a count (the store takes validated reports; this keeps the function total).
            self.offset = 0.0;
            return if in_flight.is_finite() {
                in_flight
            } else {
                0.0
            };
        }
        // 0 <= gap - offset <= in_flight; max then min never panics, as clamp can.
        self.offset = self.offset.max(gap - in_flight).min(gap);
        let past = (gap - self.offset).max(0.0).min(in_flight);
        in_flight - past
    }
}

/// How fast [`Fastest`] lets go of its figure: it doubles in this time unless an interval
/// measures faster.
pub const FASTEST_DOUBLING: Duration = Duration::from_secs(30);

/// The least per-interval ratio of a counter pair (`Δsum / Δcount` between two readings, when
/// the count moved), relaxing upwards by doubling every [`FASTEST_DOUBLING`]: for the prefill
/// time per prompt token, the server's own speed. Requests admitted to a batch together share
/// its steps, so under a burst each measures the others' prompts too and the mean is a
/// multiple of the speed; a quiet interval (or one request alone) measures the speed itself,
/// and the figure keeps it through the burst. Counters that go backwards add nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fastest {
    previous: Option<(f64, f64)>,
    figure: Option<f64>,
}

impl Fastest {
    /// Forgets the previous reading, keeping the figure (see [`DecayedRatio::restart`]).
    pub fn restart(&mut self) {
        self.previous = None;
    }

    /// Takes a reading `elapsed` after the previous one and returns the figure.
    pub fn update(&mut self, reading: (f64, f64), elapsed: Duration) -> Option<f64> {
        let relaxed = self
            .figure
            .map(|f| f * (elapsed.as_secs_f64() / FASTEST_DOUBLING.as_secs_f64()).exp2());
        let interval = increments(self.previous, reading)
            .filter(|(_, dd)| *dd > 0.0)
            .map(|(dn, dd)| dn / dd);
        self.previous = Some(reading);
        self.figure = match (relaxed, interval) {
            (Some(f), Some(i)) => Some(f.min(i)),
            (f, i) => f.or(i),
        };
        self.figure
    }
}

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
    /// Whether the last scrape failed (its reason logged once, until one succeeds).
    pub failing: bool,
    /// Counter reading of the previous report, for the token rate.
    previous_tokens: Option<(f64, Instant)>,
    ttft: DecayedRatio,
    prefill: DecayedRatio,
    prompt: DecayedRatio,
    prefill_per_token: DecayedRatio,
    prefix: DecayedRatio,
    prefill_queue: PrefillQueue,
    fastest_prefill: Fastest,
    /// Whether the per-token prefill's last reading was over computed tokens (else over
    /// prompt tokens).
    per_token_over_computed: Option<bool>,
}

impl BackendTelemetry {
    /// Records a report received at `now`, deriving rates from the counters (the ratios over
    /// a recent window of half-life `recent`, see [`DecayedRatio`]). Figures a server reports
    /// itself (a pushed report, SGLang's hit rate) are taken as they are.
    pub fn record(&mut self, signals: Valid, now: Instant, recent: Duration) {
        let mut signals = signals.into_inner();
        let elapsed = self
            .latest
            .as_ref()
            .map(|(_, at)| now.saturating_duration_since(*at))
            .unwrap_or_default();
        self.token_rate(&mut signals, now);
        // Mean TTFT of recent first tokens.
        derive(
            &mut self.ttft,
            signals.ttft_sum_count,
            &mut signals.ttft_seconds,
            elapsed,
            recent,
        );
        // Mean prefill time of recently finished requests.
        derive(
            &mut self.prefill,
            signals.prefill_sum_count,
            &mut signals.prefill_seconds,
            elapsed,
            recent,
        );
        derive(
            &mut self.prompt,
            signals.prompt_sum_count,
            &mut signals.prompt_tokens_mean,
            elapsed,
            recent,
        );
        self.derive_per_token(&mut signals, elapsed, recent);
        // Share of recent prompt tokens found in the cache.
        derive(
            &mut self.prefix,
            signals.prefix_cache_counts,
            &mut signals.prefix_cache_hit_rate,
            elapsed,
            recent,
        );
        if let Some(rate) = signals.prefix_cache_hit_rate.as_mut() {
            *rate = rate.clamp(0.0, 1.0);
        }
        // Requests without a first token: in flight less those past it.
        if signals.prefilling.is_none()
            && let (Some((_, first)), Some((_, finished)), Some(running), Some(waiting)) = (
                signals.ttft_sum_count,
                signals.prompt_sum_count,
                signals.running,
                signals.waiting,
            )
        {
            signals.prefilling = Some(self.prefill_queue.update(first, finished, running, waiting));
        }
        self.latest = Some((Valid::keeping_in_range(signals).into_inner(), now));
        self.reports += 1;
    }

    /// Tokens per second from the token counters, unless the server says its own.
    fn token_rate(&mut self, signals: &mut Signals, now: Instant) {
        let Some(total) = signals.tokens_total else {
            return;
        };
        if let Some((before, at)) = self.previous_tokens {
            let secs = now.duration_since(at).as_secs_f64();
            if secs > 0.0 && total >= before && signals.tokens_per_second.is_none() {
                signals.tokens_per_second = Some((total - before) / secs);
            }
        }
        self.previous_tokens = Some((total, now));
    }

    /// Prefill seconds per prompt token, recent and fastest: the same requests' prefill
    /// seconds over the prompt tokens they computed where the page says (else over their
    /// prompt tokens): prefix-cache hits cost no prefill, and counted they would make a server
    /// that happened to get them look faster than it is. All these histograms are observed as
    /// a request finishes.
    fn derive_per_token(&mut self, signals: &mut Signals, elapsed: Duration, recent: Duration) {
        let per_token = signals
            .prefill_sum_count
            .zip(signals.computed_sum_count.or(signals.prompt_sum_count))
            .map(|((seconds, _), (tokens, _))| (seconds, tokens));
        // A page that starts or stops saying what it computed changes the denominator's
        // counter: an increment from one to the other means nothing (prompt tokens less
        // computed ones since the server started would read as a burst of tokens, a server
        // far faster than it is), so the next interval counts from this reading.
        if per_token.is_some() {
            let over_computed = signals.computed_sum_count.is_some();
            if self
                .per_token_over_computed
                .is_some_and(|before| before != over_computed)
            {
                self.prefill_per_token.restart();
                self.fastest_prefill.restart();
            }
            self.per_token_over_computed = Some(over_computed);
        }
        derive(
            &mut self.prefill_per_token,
            per_token,
            &mut signals.prefill_seconds_per_token,
            elapsed,
            recent,
        );
        if let Some(reading) = per_token
            && signals.prefill_seconds_per_token_fastest.is_none()
        {
            signals.prefill_seconds_per_token_fastest =
                self.fastest_prefill.update(reading, elapsed);
        }
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

/// Updates `ratio` with a reading (a running sum and count), and sets `own` to the ratio
/// over the recent window unless the server reported it itself.
fn derive(
    ratio: &mut DecayedRatio,
    reading: Option<(f64, f64)>,
    own: &mut Option<f64>,
    elapsed: Duration,
    recent: Duration,
) {
    if let Some(reading) = reading {
        let derived = ratio.update(reading, elapsed, recent);
        if own.is_none() {
            *own = derived;
        }
    }
}

#[cfg(test)]
mod tests;
