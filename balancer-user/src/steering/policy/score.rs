//! The policy's score of a usable backend.

use super::{Input, PolicyConfig, PolicyKind, pct};
use crate::steering::telemetry::signals::Signals;

/// The policy's score of a usable backend (0..1, higher is better) and its explanation.
pub(super) fn score(
    cfg: &PolicyConfig,
    i: &Input,
    s: &Signals,
    max_flows: f64,
    max_ttft: f64,
) -> (f64, String) {
    let kv = s.kv_usage;
    let gpu = match (s.gpu_memory_used_bytes, s.gpu_memory_total_bytes) {
        (Some(u), Some(t)) if t > 0.0 => Some((u / t).clamp(0.0, 1.0)),
        _ => None,
    };
    match cfg.kind {
        PolicyKind::Static => (1.0, "static".into()),
        PolicyKind::LeastConn => (
            1.0 / (1.0 + i.flows as f64),
            format!("least-conn: {} flows", i.flows),
        ),
        PolicyKind::LeastLatency => match s.ttft_seconds {
            Some(t) if t > 0.0 => (1.0 / t, format!("least-latency: TTFT {:.0} ms", t * 1e3)),
            _ => (1.0 / max_ttft.max(1.0), "least-latency: no TTFT yet".into()),
        },
        PolicyKind::Gpu => match (gpu, kv) {
            (Some(used), _) => (1.0 - used, format!("gpu: memory {} used", pct(used))),
            (None, Some(kv)) => (1.0 - kv, format!("gpu: KV cache {} used", pct(kv))),
            (None, None) => (1.0, "gpu: no GPU figures".into()),
        },
        PolicyKind::Tokens => match (s.kv_capacity_tokens, s.inflight_tokens, kv) {
            (Some(cap), Some(used), _) if cap > 0.0 => (
                ((cap - used) / cap).clamp(0.0, 1.0),
                format!("tokens: {:.0} of {:.0} KV tokens in flight", used, cap),
            ),
            (_, _, Some(kv)) => (1.0 - kv, format!("tokens: KV cache {} used", pct(kv))),
            _ => (1.0, "tokens: no token figures".into()),
        },
        PolicyKind::Composite => {
            let f = &cfg.factors;
            let queue = match (s.waiting, s.running) {
                (Some(w), r) => Some(w / (w + r.unwrap_or(0.0) + 1.0)),
                _ => None,
            };
            let tokens = match (s.kv_capacity_tokens, s.inflight_tokens) {
                (Some(c), Some(u)) if c > 0.0 => Some((u / c).clamp(0.0, 1.0)),
                _ => None,
            };
            let ttft = s
                .ttft_seconds
                .filter(|_| max_ttft > 0.0)
                .map(|t| t / max_ttft);
            let parts = [
                ("kv", f.kv, kv),
                ("gpu", f.gpu_memory, gpu),
                ("queue", f.queue, queue),
                ("tokens", f.tokens, tokens),
                ("conn", f.connections, Some(i.flows as f64 / max_flows)),
                ("ttft", f.ttft, ttft),
            ];
            let (mut sum, mut weights) = (0.0, 0.0);
            let mut why = Vec::new();
            for (name, factor, value) in parts {
                if let Some(v) = value.filter(|_| factor > 0.0) {
                    sum += factor * v;
                    weights += factor;
                    why.push(format!("{name} {}", pct(v)));
                }
            }
            let pressure = if weights > 0.0 {
                (sum / weights).clamp(0.0, 1.0)
            } else {
                0.0
            };
            let headroom = 1.0 - pressure;
            (
                headroom * headroom,
                format!("composite: pressure {} ({})", pct(pressure), why.join(", ")),
            )
        }
    }
}
