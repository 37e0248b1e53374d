//! Passive request latency, measured on a backend host by the tc programs of the
//! `tc-latency` object (`balancer report --passive-latency`): per TCP flow to a watched server
//! port, the time from the last client data packet of a request to the first server data
//! packet after it (time to first token), then the spacing of the server's data packets
//! (inter-token latency). No server metrics are read, so it works in front of any
//! OpenAI-compatible server or proxy that streams its answers. Requests that start with HTTP
//! `GET ` or `HEAD ` (health checks, metrics scrapes, model lists) are not measured.
//!
//! Histograms have power-of-two bounds in nanoseconds: bucket `i` counts samples of at most
//! `2^(FIRST_BOUND_LOG2 + i)` ns (65.5 µs, 131 µs, ... 68.7 s); the last bucket counts the
//! rest.

use crate::addr::RawAddr;

/// Server ports watched (`u16` in network byte order -> `u8`, unused).
pub const LATENCY_PORTS: &str = "LATENCY_PORTS";
/// Per-flow request state: LRU hash of [`LatencyFlowKey`] -> [`LatencyFlow`].
pub const LATENCY_FLOWS: &str = "LATENCY_FLOWS";
/// Histograms and counters: per-CPU array of one [`LatencyStats`].
pub const LATENCY_STATS: &str = "LATENCY_STATS";
/// Most server ports one host watches.
pub const MAX_LATENCY_PORTS: u32 = 64;
/// Flows tracked at once; the least recently used are forgotten beyond it.
pub const MAX_LATENCY_FLOWS: u32 = 65_536;

/// log2 of the first bucket's upper bound, in ns (2^16 ns = 65.5 µs).
pub const FIRST_BOUND_LOG2: u32 = 16;
/// Buckets with a finite upper bound; one more counts what lies above the last
/// (2^36 ns = 68.7 s).
pub const LATENCY_BOUNDS: usize = 21;

/// The bucket a sample of `ns` nanoseconds falls in: the first whose bound is at least `ns`,
/// or [`LATENCY_BOUNDS`] (above every bound). Loop-free, for the eBPF program.
#[inline(always)]
pub fn bucket_of(ns: u64) -> usize {
    if ns <= 1 << FIRST_BOUND_LOG2 {
        return 0;
    }
    // floor(log2(ns - 1)) + 1 = ceil(log2(ns)).
    let mut v = ns - 1;
    let mut log = 0u32;
    if v >= 1 << 32 {
        v >>= 32;
        log += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        log += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        log += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        log += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        log += 2;
    }
    if v >= 1 << 1 {
        log += 1;
    }
    let i = (log + 1 - FIRST_BOUND_LOG2) as usize;
    if i > LATENCY_BOUNDS {
        LATENCY_BOUNDS
    } else {
        i
    }
}

/// Upper bound of bucket `i` (`i < LATENCY_BOUNDS`), ns.
pub const fn bound_ns(i: usize) -> u64 {
    1 << (FIRST_BOUND_LOG2 as usize + i)
}

/// A flow as the backend sees it: the client's and the server's ends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LatencyFlowKey {
    pub client: RawAddr,
    pub server: RawAddr,
    /// Network byte order.
    pub client_port: u16,
    /// Network byte order.
    pub server_port: u16,
    pub family: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<LatencyFlowKey>() == 40);

/// Waiting for the server's answer to a request.
pub const FLOW_AWAITING: u32 = 1;
/// The server sent a packet of response headers alone; the first data follows.
pub const FLOW_HEADERS: u32 = 2;
/// The server is sending the response's data.
pub const FLOW_RESPONDING: u32 = 3;
/// The response ended (chunked encoding's last chunk); nothing to measure until the next
/// request.
pub const FLOW_ENDED: u32 = 4;
/// A request not measured (HTTP `GET` or `HEAD`: health checks, metrics scrapes, model
/// lists), until the next request.
pub const FLOW_IGNORED: u32 = 5;

/// A flow's request in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyFlow {
    /// When the last client data packet of the request passed, ns (`bpf_ktime_get_ns`).
    pub request_ns: u64,
    /// When the response headers passed ([`FLOW_HEADERS`]), ns.
    pub headers_ns: u64,
    /// When the last server data packet passed, ns.
    pub last_ns: u64,
    /// One of the `FLOW_*` states.
    pub state: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<LatencyFlow>() == 32);

/// A histogram: samples per bucket (not cumulative), their count and sum.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    pub count: u64,
    pub sum_ns: u64,
    pub buckets: [u64; LATENCY_BOUNDS + 1],
}
const _: () = assert!(core::mem::size_of::<LatencyHistogram>() == 8 * (LATENCY_BOUNDS + 3));

impl LatencyHistogram {
    /// Records one sample (the programs' update; no indexing that could panic, for the
    /// verifier).
    #[inline(always)]
    pub fn observe(&mut self, ns: u64) {
        self.count += 1;
        self.sum_ns += ns;
        if let Some(b) = self.buckets.get_mut(bucket_of(ns)) {
            *b += 1;
        }
    }

    /// Adds another histogram (another CPU's) to this one.
    pub fn add(&mut self, other: &LatencyHistogram) {
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
    }
}

/// What the latency programs measured (one per-CPU entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyStats {
    /// Time to first token: last request packet to first response data packet.
    pub ttft: LatencyHistogram,
    /// Spacing of a response's data packets after the first.
    pub itl: LatencyHistogram,
    /// Requests seen: client data after a response (or at a flow's start).
    pub requests: u64,
    /// Server data packets of flows with no request seen (e.g. opened before the programs
    /// were attached, or forgotten when the flow table was full).
    pub unmatched: u64,
    /// Requests not measured: HTTP `GET` and `HEAD` (health checks, metrics scrapes).
    pub skipped: u64,
}

impl LatencyStats {
    /// Adds another CPU's entry.
    pub fn add(&mut self, other: &LatencyStats) {
        self.ttft.add(&other.ttft);
        self.itl.add(&other.itl);
        self.requests += other.requests;
        self.unmatched += other.unmatched;
        self.skipped += other.skipped;
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_the_first_bound_at_or_above_a_sample() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1 << 16), 0);
        assert_eq!(bucket_of((1 << 16) + 1), 1);
        assert_eq!(bucket_of(1 << 17), 1);
        assert_eq!(bucket_of(1_000_000), 4); // 1 ms <= 2^20 ns
        assert_eq!(bucket_of(bound_ns(LATENCY_BOUNDS - 1)), LATENCY_BOUNDS - 1);
        assert_eq!(bucket_of(bound_ns(LATENCY_BOUNDS - 1) + 1), LATENCY_BOUNDS);
        assert_eq!(bucket_of(u64::MAX), LATENCY_BOUNDS);
        for i in 0..LATENCY_BOUNDS {
            let b = bound_ns(i);
            assert_eq!(bucket_of(b), i, "bound {b}");
            assert_eq!(bucket_of(b + 1), i + 1, "above bound {b}");
            if i > 0 {
                assert_eq!(bucket_of(bound_ns(i - 1) + 1), i);
            }
        }
    }

    #[test]
    fn histograms_add_up() {
        let mut a = LatencyHistogram::default();
        a.observe(50_000);
        a.observe(3_000_000);
        let mut b = LatencyHistogram::default();
        b.observe(3_000_000);
        a.add(&b);
        assert_eq!(a.count, 3);
        assert_eq!(a.sum_ns, 6_050_000);
        assert_eq!(a.buckets[0], 1);
        assert_eq!(a.buckets[bucket_of(3_000_000)], 2);
    }
}
