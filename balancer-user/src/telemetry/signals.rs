//! What a backend reports, reduced to the signals the weight policies use, from the metrics of
//! the inference servers and GPU exporters as they really name them:
//!
//! | server | metrics read |
//! | --- | --- |
//! | vLLM | `vllm:num_requests_running`, `vllm:num_requests_waiting` (not `..._waiting_by_reason`, a breakdown of the same queue), `vllm:kv_cache_usage_perc` (before 0.12 also `vllm:gpu_cache_usage_perc`), `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, `vllm:cache_config_info` (`num_gpu_blocks` x `block_size`), `vllm:time_to_first_token_seconds`, `vllm:request_prefill_time_seconds` and `vllm:request_prompt_tokens` (interval means, and prefill time per prompt token), `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` (before 0.11 `vllm:gpu_prefix_cache_*`), label `model_name`; per-`engine` series are summed |
//! | SGLang | `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`, `sglang:gen_throughput`, `sglang:cache_hit_rate`, `sglang:prompt_tokens_total`, `sglang:generation_tokens_total` |
//! | llama.cpp (`llama-server --metrics`) | `llamacpp:requests_processing`, `llamacpp:requests_deferred`, `llamacpp:prompt_tokens_total`, `llamacpp:prompt_tokens_cached_total`, `llamacpp:tokens_predicted_total` (moves when a request ends), and where a version exports them `llamacpp:kv_cache_usage_ratio`, `llamacpp:kv_cache_tokens` (b11312 does not) |
//! | TGI | `tgi_queue_size`, `tgi_batch_current_size`, `tgi_batch_current_max_tokens`, `tgi_batch_max_total_tokens` |
//! | Triton | `nv_inference_pending_request_count`, `nv_gpu_memory_used_bytes`, `nv_gpu_memory_total_bytes` |
//! | TensorRT-LLM | `trtllm_num_requests_waiting`, `trtllm_num_requests_running`, `trtllm_kv_cache_utilization` |
//! | DCGM exporter | `DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_FREE` (MiB), `DCGM_FI_DEV_GPU_UTIL` (%) |
//!
//! A backend may serve several pages (an inference server and a GPU exporter); their signals
//! merge field by field.

use serde::{Deserialize, Serialize};

use super::exposition::Sample;

/// A backend's load, as far as it reports it. Every field is optional: a server reports what
/// it has.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signals {
    /// KV-cache (or token) usage, 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_usage: Option<f64>,
    /// KV-cache capacity in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_capacity_tokens: Option<f64>,
    /// Tokens held by requests in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflight_tokens: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_used_bytes: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_total_bytes: Option<f64>,
    /// GPU utilisation, 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_utilization: Option<f64>,
    /// Requests being processed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<f64>,
    /// Requests queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<f64>,
    /// Tokens per second (reported, or the rate of the token counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// Mean time to first token over the last interval, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_seconds: Option<f64>,
    /// Mean prefill time of the requests a server finished over the last interval, seconds
    /// (vLLM's `request_prefill_time_seconds`): how fast it turns a prompt into a first token,
    /// queueing apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_seconds: Option<f64>,
    /// Prefill time per prompt token of the requests a server finished over the last interval,
    /// seconds (`request_prefill_time_seconds` over `request_prompt_tokens`): its prefill speed
    /// whatever the prompt sizes it happened to get.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_seconds_per_token: Option<f64>,
    /// Mean prompt size of the requests a server finished over the last interval, tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_mean: Option<f64>,
    /// Share of prompt tokens found in the prefix cache over the last interval, 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache_hit_rate: Option<f64>,
    /// Models served (`model_name` labels).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Monotonic token counter (prompt + generation), for rates; not reported by push.
    #[serde(skip)]
    pub tokens_total: Option<f64>,
    /// TTFT histogram sum and count, for the interval mean; not reported by push.
    #[serde(skip)]
    pub ttft_sum_count: Option<(f64, f64)>,
    /// Prefill-time histogram sum and count, for the interval mean; not reported by push.
    #[serde(skip)]
    pub prefill_sum_count: Option<(f64, f64)>,
    /// Prompt-size histogram sum and count (`request_prompt_tokens`, observed as requests
    /// finish, like the prefill time), for the per-token prefill rate; not reported by push.
    #[serde(skip)]
    pub prompt_sum_count: Option<(f64, f64)>,
    /// Prefix-cache hit and query counters (tokens), for the interval hit rate; not reported
    /// by push.
    #[serde(skip)]
    pub prefix_cache_counts: Option<(f64, f64)>,
}

impl Signals {
    /// Free GPU memory, if both figures are known.
    pub fn gpu_memory_free_bytes(&self) -> Option<f64> {
        Some((self.gpu_memory_total_bytes? - self.gpu_memory_used_bytes?).max(0.0))
    }

    /// Fills the fields `self` lacks from `other`.
    pub fn merge(&mut self, other: Signals) {
        macro_rules! take {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = other.$f; } )* };
        }
        take!(
            kv_usage,
            kv_capacity_tokens,
            inflight_tokens,
            gpu_memory_used_bytes,
            gpu_memory_total_bytes,
            gpu_utilization,
            running,
            waiting,
            tokens_per_second,
            ttft_seconds,
            prefill_seconds,
            prefill_seconds_per_token,
            prompt_tokens_mean,
            prefix_cache_hit_rate,
            tokens_total,
            ttft_sum_count,
            prefill_sum_count,
            prompt_sum_count,
            prefix_cache_counts
        );
        for m in other.models {
            if !self.models.contains(&m) {
                self.models.push(m);
            }
        }
    }
}

/// Sum of the finite values of the samples named `name` (over engines, GPUs, models).
fn sum(samples: &[Sample], name: &str) -> Option<f64> {
    let mut found = false;
    let mut total = 0.0;
    for s in samples
        .iter()
        .filter(|s| s.name == name && s.value.is_finite())
    {
        found = true;
        total += s.value;
    }
    found.then_some(total)
}

/// Mean of the finite values of the samples named `name`.
fn mean(samples: &[Sample], name: &str) -> Option<f64> {
    let values: Vec<f64> = samples
        .iter()
        .filter(|s| s.name == name && s.value.is_finite())
        .map(|s| s.value)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

fn first_of(
    samples: &[Sample],
    names: &[&str],
    f: fn(&[Sample], &str) -> Option<f64>,
) -> Option<f64> {
    names.iter().find_map(|n| f(samples, n))
}

/// A fraction that may be reported as 0..1 or as a percentage.
fn fraction(v: f64) -> f64 {
    if v > 1.0 { v / 100.0 } else { v }.clamp(0.0, 1.0)
}

const MIB: f64 = 1024.0 * 1024.0;

/// Extracts the signals of every server kind the page contains.
pub fn extract(samples: &[Sample]) -> Signals {
    let mut s = Signals {
        running: first_of(
            samples,
            &[
                "vllm:num_requests_running",
                "sglang:num_running_reqs",
                "trtllm_num_requests_running",
                "tgi_batch_current_size",
                "llamacpp:requests_processing",
            ],
            sum,
        ),
        waiting: first_of(
            samples,
            &[
                "vllm:num_requests_waiting",
                "sglang:num_queue_reqs",
                "trtllm_num_requests_waiting",
                "tgi_queue_size",
                "nv_inference_pending_request_count",
                "llamacpp:requests_deferred",
            ],
            sum,
        ),
        kv_usage: first_of(
            samples,
            &[
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "sglang:token_usage",
                "trtllm_kv_cache_utilization",
                "llamacpp:kv_cache_usage_ratio",
            ],
            mean,
        )
        .map(fraction),
        tokens_per_second: sum(samples, "sglang:gen_throughput"),
        prefix_cache_hit_rate: first_of(
            samples,
            &["sglang:cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate"],
            mean,
        )
        .map(fraction),
        gpu_utilization: mean(samples, "DCGM_FI_DEV_GPU_UTIL").map(fraction),
        ..Signals::default()
    };

    // Token counters (summed over engines) for a rate.
    let prompt = first_of(
        samples,
        &[
            "vllm:prompt_tokens_total",
            "sglang:prompt_tokens_total",
            "llamacpp:prompt_tokens_total",
        ],
        sum,
    );
    let generated = first_of(
        samples,
        &[
            "vllm:generation_tokens_total",
            "sglang:generation_tokens_total",
            "llamacpp:tokens_predicted_total",
        ],
        sum,
    );
    if prompt.is_some() || generated.is_some() {
        s.tokens_total = Some(prompt.unwrap_or(0.0) + generated.unwrap_or(0.0));
    }

    // KV capacity in tokens: vLLM's cache config (per engine), or TGI's batch budget.
    let vllm_capacity: f64 = samples
        .iter()
        .filter(|x| x.name == "vllm:cache_config_info")
        .filter_map(|x| {
            let blocks: f64 = x.label("num_gpu_blocks")?.parse().ok()?;
            let size: f64 = x.label("block_size")?.parse().ok()?;
            Some(blocks * size)
        })
        .sum();
    if vllm_capacity > 0.0 {
        s.kv_capacity_tokens = Some(vllm_capacity);
    }
    if let Some(budget) = sum(samples, "tgi_batch_max_total_tokens").filter(|b| *b > 0.0) {
        s.kv_capacity_tokens = Some(budget);
        if let Some(current) = sum(samples, "tgi_batch_current_max_tokens") {
            s.inflight_tokens = Some(current);
            s.kv_usage = Some((current / budget).clamp(0.0, 1.0));
        }
    }
    if let Some(tokens) = sum(samples, "llamacpp:kv_cache_tokens") {
        s.inflight_tokens = Some(tokens);
    }
    if s.inflight_tokens.is_none()
        && let (Some(cap), Some(usage)) = (s.kv_capacity_tokens, s.kv_usage)
    {
        s.inflight_tokens = Some(cap * usage);
    }

    // GPU memory: Triton in bytes, DCGM in MiB (used + free).
    s.gpu_memory_used_bytes = sum(samples, "nv_gpu_memory_used_bytes");
    s.gpu_memory_total_bytes = sum(samples, "nv_gpu_memory_total_bytes");
    if s.gpu_memory_used_bytes.is_none()
        && let (Some(used), Some(free)) = (
            sum(samples, "DCGM_FI_DEV_FB_USED"),
            sum(samples, "DCGM_FI_DEV_FB_FREE"),
        )
    {
        s.gpu_memory_used_bytes = Some(used * MIB);
        s.gpu_memory_total_bytes = Some((used + free) * MIB);
    }

    // Time to first token: vLLM's histogram, as a running sum and count.
    if let (Some(total), Some(count)) = (
        sum(samples, "vllm:time_to_first_token_seconds_sum"),
        sum(samples, "vllm:time_to_first_token_seconds_count"),
    ) {
        s.ttft_sum_count = Some((total, count));
    }
    if let (Some(total), Some(count)) = (
        sum(samples, "vllm:request_prefill_time_seconds_sum"),
        sum(samples, "vllm:request_prefill_time_seconds_count"),
    ) {
        s.prefill_sum_count = Some((total, count));
    }
    if let (Some(total), Some(count)) = (
        sum(samples, "vllm:request_prompt_tokens_sum"),
        sum(samples, "vllm:request_prompt_tokens_count"),
    ) {
        s.prompt_sum_count = Some((total, count));
    }

    // Prefix caching: vLLM counts prompt tokens looked up and found, for an interval rate.
    let hits = first_of(
        samples,
        &[
            "vllm:prefix_cache_hits_total",
            "vllm:gpu_prefix_cache_hits_total",
        ],
        sum,
    );
    let queries = first_of(
        samples,
        &[
            "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_queries_total",
        ],
        sum,
    );
    if let (Some(hits), Some(queries)) = (hits, queries) {
        s.prefix_cache_counts = Some((hits, queries));
    } else if let (Some(cached), Some(computed)) = (
        sum(samples, "llamacpp:prompt_tokens_cached_total"),
        sum(samples, "llamacpp:prompt_tokens_total"),
    ) {
        // llama.cpp counts the prompt tokens it reused and those it computed.
        s.prefix_cache_counts = Some((cached, cached + computed));
    }

    let mut models: Vec<String> = samples
        .iter()
        .filter_map(|x| x.label("model_name"))
        .map(str::to_string)
        .collect();
    models.sort();
    models.dedup();
    s.models = models;
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::exposition::parse;

    fn signals(page: &str) -> Signals {
        extract(&parse(page).unwrap())
    }

    #[test]
    fn vllm_with_two_engines() {
        let page = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.3
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12000.0
vllm:prompt_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 8000.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3000.0
vllm:generation_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="2000",num_cpu_blocks="0"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",gpu_memory_utilization="0.9",num_gpu_blocks="2000",num_cpu_blocks="0"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 40.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 50.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 50.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.5
"#;
        let s = signals(page);
        assert_eq!(s.running, Some(7.0));
        assert_eq!(s.waiting, Some(2.0));
        assert_eq!(s.kv_usage, Some(0.4));
        assert_eq!(s.tokens_total, Some(24_000.0));
        assert_eq!(s.kv_capacity_tokens, Some(64_000.0));
        assert_eq!(s.inflight_tokens, Some(25_600.0));
        assert_eq!(s.ttft_sum_count, Some((7.5, 50.0)));
        assert_eq!(
            s.models,
            vec!["meta-llama/Llama-3.1-8B-Instruct".to_string()]
        );
    }

    #[test]
    fn older_vllm_cache_metric() {
        let s = signals(
            "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.97\nvllm:num_requests_running{model_name=\"m\"} 1\n",
        );
        assert_eq!(s.kv_usage, Some(0.97));
    }

    #[test]
    fn sglang() {
        let page = r#"
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen"} 12.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen"} 5.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen"} 0.81
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="qwen"} 1450.5
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="qwen"} 1.0e6
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="qwen"} 2.0e5
"#;
        let s = signals(page);
        assert_eq!(
            (s.running, s.waiting, s.kv_usage),
            (Some(12.0), Some(5.0), Some(0.81))
        );
        assert_eq!(s.tokens_per_second, Some(1450.5));
        assert_eq!(s.tokens_total, Some(1.2e6));
        assert_eq!(s.models, vec!["qwen".to_string()]);
    }

    #[test]
    fn tgi() {
        let page = r#"
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 12288
# TYPE tgi_batch_max_total_tokens gauge
tgi_batch_max_total_tokens 16384
"#;
        let s = signals(page);
        assert_eq!((s.running, s.waiting), (Some(8.0), Some(3.0)));
        assert_eq!(s.kv_capacity_tokens, Some(16_384.0));
        assert_eq!(s.inflight_tokens, Some(12_288.0));
        assert_eq!(s.kv_usage, Some(0.75));
    }

    #[test]
    fn triton_and_trtllm() {
        let page = r#"
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ensemble",version="1"} 2
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 4
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-aaaa"} 6.0e10
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-aaaa"} 8.0e10
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running 9
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization 0.6
"#;
        let s = signals(page);
        assert_eq!(s.waiting, Some(6.0));
        assert_eq!(s.running, Some(9.0));
        assert_eq!(s.kv_usage, Some(0.6));
        assert_eq!(s.gpu_memory_free_bytes(), Some(2.0e10));
    }

    #[test]
    fn dcgm_exporter() {
        let page = r#"
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1"} 20480
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-2",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1"} 10240
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1"} 61440
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-2",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1"} 71680
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} 90
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2"} 70
"#;
        let s = signals(page);
        assert_eq!(s.gpu_memory_free_bytes(), Some(30_720.0 * MIB));
        assert_eq!(s.gpu_memory_total_bytes, Some(163_840.0 * MIB));
        assert_eq!(s.gpu_utilization, Some(0.8));
    }

    #[test]
    fn nan_and_infinite_values_are_ignored() {
        let s = signals(
            "vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\nvllm:kv_cache_usage_perc 0.2\n",
        );
        assert_eq!((s.running, s.waiting, s.kv_usage), (None, None, Some(0.2)));
    }

    fn round(v: f64) -> f64 {
        format!("{v:.12e}").parse().expect("a float")
    }

    /// The pages real servers served (`cargo xtask capture-pages`).
    fn fixture_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/metrics")
    }

    fn fixture(name: &str) -> Signals {
        let path = fixture_dir().join(name);
        let page =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        extract(&parse(&page).unwrap_or_else(|e| panic!("{name}: {e}")))
    }

    /// Every captured vLLM page reads as the capture script's own parser read it (its `.json`
    /// beside the page): the queue without `num_requests_waiting_by_reason`, the KV capacity
    /// from `cache_config_info` (which has no `model_name`), the model from the other series,
    /// counters summed over engines, whatever the release.
    #[test]
    fn real_vllm_pages_read_as_the_capture_script_read_them() {
        let mut read = Vec::new();
        for entry in std::fs::read_dir(fixture_dir()).expect("fixtures") {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .to_string();
            let Some(stem) = name
                .strip_suffix(".prom")
                .filter(|n| n.starts_with("vllm-"))
            else {
                continue;
            };
            let json = std::fs::read_to_string(fixture_dir().join(format!("{stem}.json")))
                .unwrap_or_else(|e| panic!("{stem}.json: {e}"));
            let want: serde_json::Value = serde_json::from_str(&json).expect("sidecar JSON");
            // serde_json reads floats to within an ulp or two; round both sides to 12 digits.
            let f = |k: &str| want[k].as_f64().map(round);
            let mut s = fixture(&name);
            s.kv_usage = s.kv_usage.map(round);
            s.ttft_sum_count = s.ttft_sum_count.map(|(a, b)| (round(a), round(b)));
            assert_eq!(s.running, f("running"), "{name}: running");
            assert_eq!(s.waiting, f("waiting"), "{name}: waiting");
            assert_eq!(s.kv_usage, f("kv_usage"), "{name}: KV use");
            assert_eq!(
                s.kv_capacity_tokens,
                f("kv_capacity_tokens"),
                "{name}: KV capacity"
            );
            let models: Vec<String> = serde_json::from_value(want["models"].clone()).unwrap();
            assert_eq!(s.models, models, "{name}: models");
            assert_eq!(
                s.tokens_total,
                Some(f("prompt_tokens_total").unwrap() + f("generation_tokens_total").unwrap()),
                "{name}: token counters"
            );
            if let (Some(h), Some(q)) = (
                f("prefix_cache_hits_total"),
                f("prefix_cache_queries_total"),
            ) {
                assert_eq!(s.prefix_cache_counts, Some((h, q)), "{name}: prefix cache");
            }
            assert_eq!(
                s.ttft_sum_count,
                f("ttft_sum").zip(f("ttft_count")),
                "{name}: TTFT histogram"
            );
            read.push(name);
        }
        read.sort();
        for state in ["idle", "busy", "queueing", "kv-full"] {
            assert!(
                read.iter().any(|n| n.ends_with(&format!("-{state}.prom"))),
                "no captured vLLM page of state {state}: {read:?}"
            );
        }
    }

    #[test]
    fn real_vllm_0_32_pages_in_each_state() {
        let idle = fixture("vllm-0.32.0-idle.prom");
        assert_eq!(
            (idle.running, idle.waiting, idle.kv_usage),
            (Some(0.0), Some(0.0), Some(0.0))
        );
        assert_eq!(
            idle.kv_capacity_tokens,
            Some(4096.0),
            "32 blocks of 128 tokens"
        );
        assert_eq!(idle.models, vec!["tiny".to_string()]);
        let busy = fixture("vllm-0.32.0-busy.prom");
        assert!(
            busy.running >= Some(2.0) && busy.waiting == Some(0.0),
            "{busy:?}"
        );
        // Queued requests also appear in num_requests_waiting_by_reason: counting that too
        // would double the queue.
        let queueing = fixture("vllm-0.32.0-queueing.prom");
        assert_eq!(queueing.running, Some(4.0), "--max-num-seqs 4");
        assert!(queueing.waiting >= Some(2.0), "{queueing:?}");
        let page =
            std::fs::read_to_string(fixture_dir().join("vllm-0.32.0-queueing.prom")).unwrap();
        let by_reason: f64 = parse(&page)
            .unwrap()
            .iter()
            .filter(|x| x.name == "vllm:num_requests_waiting_by_reason")
            .map(|x| x.value)
            .sum();
        assert_eq!(Some(by_reason), queueing.waiting);
        // A full cache; the same prompt four times hit the prefix cache.
        let full = fixture("vllm-0.32.0-kv-full.prom");
        assert!(full.kv_usage >= Some(0.9), "{full:?}");
        assert_eq!(
            full.prefill_sum_count,
            Some((0.23179337399960787, 8.0)),
            "request_prefill_time_seconds"
        );
        assert_eq!(
            full.prompt_sum_count,
            Some((943.0, 8.0)),
            "request_prompt_tokens, finished with the same requests"
        );
        let (hits, queries) = full.prefix_cache_counts.expect("prefix counters");
        assert!(hits > 0.0 && hits < queries, "{hits} of {queries}");
        assert!(
            !page.contains("gpu_cache_usage_perc"),
            "0.32 serves kv_cache_usage_perc only"
        );
    }

    /// vLLM 0.10 serves the old names beside the new ones (equal values); releases before it
    /// only the old ones: the same page without the new names reads the same.
    #[test]
    fn real_vllm_0_10_pages_read_by_their_old_names_too() {
        let name = "vllm-0.10.2.post2-kv-full.prom";
        let page = std::fs::read_to_string(fixture_dir().join(name)).unwrap();
        assert!(page.contains("vllm:gpu_cache_usage_perc{"));
        assert!(page.contains("vllm:gpu_prefix_cache_hits_total{"));
        let both = fixture(name);
        let old_only: String = page
            .lines()
            .filter(|l| {
                !l.starts_with("vllm:kv_cache_usage_perc") && !l.starts_with("vllm:prefix_cache_")
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let old = extract(&parse(&old_only).unwrap());
        assert_eq!(old.kv_usage, both.kv_usage);
        assert!(old.kv_usage >= Some(0.9), "{old:?}");
        assert_eq!(old.prefix_cache_counts, both.prefix_cache_counts);
        assert!(old.prefix_cache_counts.is_some_and(|(h, _)| h > 0.0));
    }

    #[test]
    fn real_llamacpp_pages() {
        let idle = fixture("llamacpp-b11312-idle.prom");
        assert_eq!((idle.running, idle.waiting), (Some(0.0), Some(0.0)));
        assert_eq!(idle.kv_usage, None, "this version exports no KV use");
        assert!(idle.models.is_empty(), "its series have no labels");
        let busy = fixture("llamacpp-b11312-busy.prom");
        assert_eq!((busy.running, busy.waiting), (Some(3.0), Some(0.0)));
        let q = fixture("llamacpp-b11312-queueing.prom");
        assert_eq!((q.running, q.waiting), (Some(4.0), Some(2.0)));
        assert_eq!(q.tokens_total, Some(266.0 + 2808.0));
        assert_eq!(q.prefix_cache_counts, Some((53.0, 53.0 + 266.0)));
        // Past a million a counter is printed in exponent form with 6 digits.
        let big = fixture("llamacpp-b11312-bigcounter.prom");
        assert_eq!(big.tokens_total, Some(1.00399e6 + 2150.0));
    }

    #[test]
    fn pages_merge() {
        let mut a = signals("vllm:kv_cache_usage_perc 0.5\n");
        a.merge(signals(
            "DCGM_FI_DEV_FB_USED 100\nDCGM_FI_DEV_FB_FREE 300\nvllm:kv_cache_usage_perc 0.9\n",
        ));
        assert_eq!(a.kv_usage, Some(0.5), "the first page wins");
        assert_eq!(a.gpu_memory_total_bytes, Some(400.0 * MIB));
    }
}
