//! The server's metrics page, as vLLM's: gauges, counters and histograms of the modelled GPU, and
//! the `name[]` filter of prometheus_client.

use super::*;
use crate::engine::{Counters, Profile};

/// A histogram as vLLM's: cumulative counts per upper bound, sum, count.
pub(super) struct Histogram {
    pub(super) bounds: Vec<f64>,
    pub(super) counts: Vec<u64>,
    pub(super) sum: f64,
    pub(super) count: u64,
}

impl Histogram {
    pub(super) fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub(super) fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    pub(super) fn render(&self, page: &mut String, name: &str, help: &str, labels: &str) {
        use std::fmt::Write as _;
        let _ = writeln!(page, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i];
            let _ = writeln!(page, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}.0");
        }
        cumulative += self.counts[self.bounds.len()];
        let _ = writeln!(
            page,
            "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}.0\n{name}_count{{{labels}}} {}.0\n{name}_sum{{{labels}}} {}",
            self.count, self.sum
        );
    }
}

/// vLLM's bucket bounds for time to first token, inter-token latency and end-to-end latency.
pub(super) const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

pub(super) const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// vLLM's bounds for the request phase times (queue, prefill).
pub(super) const PHASE_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

pub(super) const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's bounds for token counts: 1, 2, 5, 10, 20, 50, ... up to the model's length.
pub(super) fn token_buckets(max: usize) -> Vec<f64> {
    let mut bounds = Vec::new();
    let mut decade = 1.0;
    loop {
        for m in [1.0, 2.0, 5.0] {
            let b = m * decade;
            if b > max as f64 {
                return bounds;
            }
            bounds.push(b);
        }
        decade *= 10.0;
    }
}

/// vLLM's request histograms: TTFT and inter-token latency as tokens go out; queue, prefill
/// and end-to-end times when a request finishes.
pub(super) struct Histograms {
    pub(super) ttft: Histogram,
    pub(super) itl: Histogram,
    pub(super) e2e: Histogram,
    pub(super) queue: Histogram,
    pub(super) prefill: Histogram,
    pub(super) prompt_tokens: Histogram,
    /// Prompt tokens computed (not found in the prefix cache), as a request finishes.
    pub(super) computed_tokens: Histogram,
}

pub(super) async fn metrics(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Response {
    let mut page = engine_metrics(&shared);
    histogram_metrics(&shared, &mut page);
    let names = requested_names(query.as_deref().unwrap_or(""));
    if !names.is_empty() {
        page = restricted(&page, &names);
    }
    (
        [("content-type", "text/plain; version=1.0.0; charset=utf-8")],
        page,
    )
        .into_response()
}

/// The engine's gauges and counters, and its cache config, as vLLM writes them.
fn engine_metrics(shared: &Shared) -> String {
    let (running, waiting, kv, c, profile) = {
        let e = shared.engine.lock().expect("engine");
        (
            e.running(),
            e.waiting(),
            e.kv_usage(),
            e.counters.clone(),
            e.profile.clone(),
        )
    };
    let l = format!("engine=\"0\",model_name=\"{}\"", shared.model);
    let mut page = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, labels: &str, value: String| {
        use std::fmt::Write as _;
        let _ = writeln!(
            page,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
        );
    };
    engine_gauges(&mut metric, &l, (running, waiting, kv));
    engine_counters(&mut metric, &l, &c, &profile);
    page
}

/// Writes one metric: name, kind, help, labels, value.
type MetricFn<'a> = dyn FnMut(&str, &str, &str, &str, String) + 'a;

/// Requests running and waiting, and KV-cache use.
fn engine_gauges(metric: &mut MetricFn<'_>, l: &str, (running, waiting, kv): (usize, usize, f64)) {
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        l,
        format!("{running}.0"),
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        l,
        format!("{waiting}.0"),
    );
    metric(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "Number of requests waiting to be processed, by reason.",
        &format!("{l},reason=\"capacity\""),
        format!("{waiting}.0"),
    );
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        l,
        format!("{kv}"),
    );
}

/// The engine's counters, and its cache config as vLLM writes it.
fn engine_counters(metric: &mut MetricFn<'_>, l: &str, c: &Counters, profile: &Profile) {
    for (name, help, value) in [
        (
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            c.prefix_queries,
        ),
        (
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            c.prefix_hits,
        ),
        (
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            c.preemptions,
        ),
        (
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            c.prompt_tokens,
        ),
        (
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            c.generation_tokens,
        ),
    ] {
        metric(
            &format!("{name}_total"),
            "counter",
            help,
            l,
            format!("{value}.0"),
        );
    }
    metric(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        &format!("{l},finished_reason=\"length\""),
        format!("{}.0", c.finished),
    );
    // As vLLM: the cache config has the engine but no model name.
    metric(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
        &format!(
            "block_size=\"{}\",enable_prefix_caching=\"True\",engine=\"0\",kv_cache_size_tokens=\"{}\",num_gpu_blocks=\"{}\"",
            profile.block_tokens,
            profile.kv_tokens(),
            profile.kv_blocks
        ),
        "1.0".into(),
    );
}

/// The request histograms (latencies and token counts), as vLLM writes them.
fn histogram_metrics(shared: &Shared, page: &mut String) {
    let l = format!("engine=\"0\",model_name=\"{}\"", shared.model);
    let h = shared.histograms.lock().expect("histograms");
    h.ttft.render(
        page,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &l,
    );
    h.itl.render(
        page,
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &l,
    );
    h.e2e.render(
        page,
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &l,
    );
    h.queue.render(
        page,
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &l,
    );
    h.prefill.render(
        page,
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        &l,
    );
    h.prompt_tokens.render(
        page,
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        &l,
    );
    h.computed_tokens.render(
        page,
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        &l,
    );
}

/// The sample names a metrics request asks for with `name[]` parameters (prometheus_client's
/// filter, which vLLM's `/metrics` honours); none: the whole page.
pub(super) fn requested_names(query: &str) -> Vec<String> {
    form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == "name[]")
        .map(|(_, value)| value.into_owned())
        .collect()
}

/// `page` as prometheus_client restricts it: the samples named in `names`, and the HELP and
/// TYPE lines of the families they belong to.
pub(super) fn restricted(page: &str, names: &[String]) -> String {
    let mut out = String::new();
    for line in page.lines() {
        let keep = match line.strip_prefix("# ") {
            Some(comment) => {
                let family = comment.split(' ').nth(1).unwrap_or("");
                names.iter().any(|n| n.starts_with(family))
            }
            None => names
                .iter()
                .any(|n| n == line.split(['{', ' ']).next().unwrap_or("")),
        };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}
