//! What a backend reports, reduced to the signals the weight policies use, from the metrics of
//! the inference servers and GPU exporters as they really name them:
//!
//! | server | metrics read |
//! | --- | --- |
//! | vLLM | `vllm:num_requests_running`, `vllm:num_requests_waiting` (not `..._waiting_by_reason`, a breakdown of the same queue), `vllm:kv_cache_usage_perc` (before 0.12 also `vllm:gpu_cache_usage_perc`), `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, `vllm:cache_config_info` (`num_gpu_blocks` x `block_size`), `vllm:time_to_first_token_seconds`, `vllm:request_prefill_time_seconds` and `vllm:request_prompt_tokens` (recent means over a decaying window, and prefill time per prompt token: over `vllm:request_prefill_kv_computed_tokens`, the tokens not found in the prefix cache, where the page has it), `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` (before 0.11 `vllm:gpu_prefix_cache_*`), label `model_name`; per-`engine` series are summed |
//! | SGLang | `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`, `sglang:gen_throughput`, `sglang:cache_hit_rate`, `sglang:prompt_tokens_total`, `sglang:generation_tokens_total` |
//! | llama.cpp (`llama-server --metrics`) | `llamacpp:requests_processing`, `llamacpp:requests_deferred`, `llamacpp:prompt_tokens_total`, `llamacpp:prompt_tokens_cached_total`, `llamacpp:tokens_predicted_total` (moves when a request ends), and where a version exports them `llamacpp:kv_cache_usage_ratio`, `llamacpp:kv_cache_tokens` (b11312 does not) |
//! | TGI | `tgi_queue_size`, `tgi_batch_current_size`, `tgi_batch_current_max_tokens`, `tgi_batch_max_total_tokens` |
//! | Triton | `nv_inference_pending_request_count`, `nv_gpu_memory_used_bytes`, `nv_gpu_memory_total_bytes` |
//! | TensorRT-LLM | `trtllm_num_requests_waiting`, `trtllm_num_requests_running`, `trtllm_kv_cache_utilization` |
//! | DCGM exporter | `DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_FREE` (MiB), `DCGM_FI_DEV_GPU_UTIL` (%) |
//! | `balancer report --passive-latency` | `balancer_passive_time_to_first_token_seconds` (measured on the backend's interface, for any server; read where the server reports no TTFT of its own) |
//!
//! A backend may serve several pages (an inference server and a GPU exporter); their signals
//! merge field by field.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::page::Sample;

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
    /// Requests that have no first token yet: the waiting ones and the running ones still in
    /// their prefill (a server that chunks prefills admits a burst to its batch at once, so
    /// `waiting` stays near 0 while the prompts wait their turn). For vLLM, derived from its
    /// counters by the telemetry store (`BackendTelemetry::record`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefilling: Option<f64>,
    /// Tokens per second (reported, or the rate of the token counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// Mean time to first token of recent requests (decaying window, see
    /// `telemetry::store::DecayedRatio`), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_seconds: Option<f64>,
    /// Mean prefill time of the requests a server finished recently (decaying window), seconds
    /// (vLLM's `request_prefill_time_seconds`): how fast it turns a prompt into a first token,
    /// queueing apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_seconds: Option<f64>,
    /// Prefill time per prompt token of the requests a server finished recently (decaying
    /// window), seconds (`request_prefill_time_seconds` over the tokens it computed,
    /// `request_prefill_kv_computed_tokens`, where the page has them, else over
    /// `request_prompt_tokens`): its prefill speed whatever the prompt sizes it happened to get,
    /// and, where it says which tokens it computed, whatever its prefix-cache hits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_seconds_per_token: Option<f64>,
    /// The fastest prefill per prompt token measured recently (the least per-interval ratio of
    /// the same counters, doubling every 30 s unless a faster interval comes): the server's own
    /// speed, which the mean under a burst is not — requests admitted together share their
    /// steps, so each measures the others' prompts too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_seconds_per_token_fastest: Option<f64>,
    /// Mean prompt size of the requests a server finished recently (decaying window), tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_mean: Option<f64>,
    /// Share of recent prompt tokens found in the prefix cache (decaying window), 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache_hit_rate: Option<f64>,
    /// Models served (`model_name` labels).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Monotonic token counter (prompt + generation), for rates; not reported by push.
    #[serde(skip)]
    pub tokens_total: Option<f64>,
    /// TTFT histogram sum and count, for the recent mean; not reported by push.
    #[serde(skip)]
    pub ttft_sum_count: Option<(f64, f64)>,
    /// Prefill-time histogram sum and count, for the recent mean; not reported by push.
    #[serde(skip)]
    pub prefill_sum_count: Option<(f64, f64)>,
    /// Prompt-size histogram sum and count (`request_prompt_tokens`, observed as requests
    /// finish, like the prefill time), for the per-token prefill rate; not reported by push.
    #[serde(skip)]
    pub prompt_sum_count: Option<(f64, f64)>,
    /// Computed prompt tokens' histogram sum and count (`request_prefill_kv_computed_tokens`:
    /// the prompt less its prefix-cache hits, observed as requests finish), for the per-token
    /// prefill rate where the server says; not reported by push.
    #[serde(skip)]
    pub computed_sum_count: Option<(f64, f64)>,
    /// Prefix-cache hit and query counters (tokens), for the recent hit rate; not reported
    /// by push.
    #[serde(skip)]
    pub prefix_cache_counts: Option<(f64, f64)>,
}

impl Signals {
    /// Free GPU memory, if both figures are known.
    pub fn gpu_memory_free_bytes(&self) -> Option<f64> {
        Some((self.gpu_memory_total_bytes? - self.gpu_memory_used_bytes?).max(0.0))
    }

    /// Fills the fields `self` lacks from `other`; the models are the union of both (sorted,
    /// each once).
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
            prefilling,
            tokens_per_second,
            ttft_seconds,
            prefill_seconds,
            prefill_seconds_per_token,
            prefill_seconds_per_token_fastest,
            prompt_tokens_mean,
            prefix_cache_hit_rate,
            tokens_total,
            ttft_sum_count,
            prefill_sum_count,
            prompt_sum_count,
            computed_sum_count,
            prefix_cache_counts
        );
        if !other.models.is_empty() {
            let mut models: BTreeSet<String> =
                std::mem::take(&mut self.models).into_iter().collect();
            models.extend(other.models);
            self.models = models.into_iter().collect();
        }
    }

    /// Checks every figure against its range (see [`Valid`]): the boundary between what a
    /// backend says and what the daemon uses.
    pub fn validate(mut self) -> Result<Valid, SignalError> {
        for (field, value, range) in self.figures() {
            if let Some(value) = *value {
                range.check(field, value)?;
            }
        }
        let s = &self;
        let pairs = [
            ("ttft_sum_count", s.ttft_sum_count),
            ("prefill_sum_count", s.prefill_sum_count),
            ("prompt_sum_count", s.prompt_sum_count),
            ("computed_sum_count", s.computed_sum_count),
            ("prefix_cache_counts", s.prefix_cache_counts),
        ];
        for (field, pair) in pairs {
            if let Some((sum, count)) = pair {
                Range::Count.check(field, sum)?;
                Range::Count.check(field, count)?;
            }
        }
        if s.models.len() > MAX_MODELS {
            return Err(SignalError::TooManyModels(s.models.len()));
        }
        if let Some(long) = s.models.iter().find(|m| m.len() > MAX_MODEL_NAME) {
            return Err(SignalError::ModelNameTooLong(long.len()));
        }
        Ok(Valid(self))
    }

    /// Every single figure with its name and range.
    fn figures(&mut self) -> [(&'static str, &mut Option<f64>, Range); 17] {
        use Range::*;
        [
            ("kv_usage", &mut self.kv_usage, Fraction),
            ("kv_capacity_tokens", &mut self.kv_capacity_tokens, Count),
            ("inflight_tokens", &mut self.inflight_tokens, Count),
            (
                "gpu_memory_used_bytes",
                &mut self.gpu_memory_used_bytes,
                Count,
            ),
            (
                "gpu_memory_total_bytes",
                &mut self.gpu_memory_total_bytes,
                Count,
            ),
            ("gpu_utilization", &mut self.gpu_utilization, Fraction),
            ("running", &mut self.running, Count),
            ("waiting", &mut self.waiting, Count),
            ("prefilling", &mut self.prefilling, Count),
            ("tokens_per_second", &mut self.tokens_per_second, Count),
            ("ttft_seconds", &mut self.ttft_seconds, Seconds),
            ("prefill_seconds", &mut self.prefill_seconds, Seconds),
            (
                "prefill_seconds_per_token",
                &mut self.prefill_seconds_per_token,
                Seconds,
            ),
            (
                "prefill_seconds_per_token_fastest",
                &mut self.prefill_seconds_per_token_fastest,
                Seconds,
            ),
            ("prompt_tokens_mean", &mut self.prompt_tokens_mean, Count),
            (
                "prefix_cache_hit_rate",
                &mut self.prefix_cache_hit_rate,
                Fraction,
            ),
            ("tokens_total", &mut self.tokens_total, Count),
        ]
    }
}

impl Valid {
    /// Signals with figures derived from valid ones (rates, ratios): a derived figure out of
    /// its range (a rate over a moment, say) is no value.
    pub fn keeping_in_range(mut signals: Signals) -> Valid {
        for (_, value, range) in signals.figures() {
            if value.is_some_and(|v| !range.contains(v)) {
                *value = None;
            }
        }
        Valid(signals)
    }

    pub fn into_inner(self) -> Signals {
        self.0
    }
}

/// Most models one backend may report (distinct `model_name` labels, a pushed list).
pub const MAX_MODELS: usize = 256;
/// Longest model name accepted, bytes.
pub const MAX_MODEL_NAME: usize = 256;
/// Largest count, counter or token figure accepted: 2^53, past which an f64 no longer counts
/// by one (a counter there cannot move by a request).
pub const MAX_COUNT: f64 = 9_007_199_254_740_992.0;
/// Longest duration accepted (a TTFT, a prefill time), seconds: a day.
pub const MAX_SECONDS: f64 = 86_400.0;

/// What a figure may be: every one is finite and not negative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Range {
    /// 0..=1.
    Fraction,
    /// 0..=[`MAX_COUNT`].
    Count,
    /// 0..=[`MAX_SECONDS`].
    Seconds,
}

impl Range {
    fn max(self) -> f64 {
        match self {
            Range::Fraction => 1.0,
            Range::Count => MAX_COUNT,
            Range::Seconds => MAX_SECONDS,
        }
    }

    fn contains(self, value: f64) -> bool {
        value.is_finite() && (0.0..=self.max()).contains(&value)
    }

    fn check(self, field: &'static str, value: f64) -> Result<(), SignalError> {
        if self.contains(value) {
            Ok(())
        } else {
            Err(SignalError::OutOfRange {
                field,
                value,
                max: self.max(),
            })
        }
    }
}

/// Why a backend's signals were refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SignalError {
    #[error("{field} = {value}: must be a finite number between 0 and {max}")]
    OutOfRange {
        field: &'static str,
        value: f64,
        max: f64,
    },
    #[error("models: {0} names, at most {MAX_MODELS}")]
    TooManyModels(usize),
    #[error("models: a name of {0} bytes, at most {MAX_MODEL_NAME}")]
    ModelNameTooLong(usize),
}

/// Signals whose every figure is finite and in its range, and whose models are bounded in
/// count and size ([`Signals::validate`]): the only form in which a report reaches the
/// telemetry store and the policies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Valid(Signals);

impl std::ops::Deref for Valid {
    type Target = Signals;

    fn deref(&self) -> &Signals {
        &self.0
    }
}

/// Sum of the values of the samples named `name` (over engines, GPUs, models). A NaN or an
/// infinity among them, or a sum that overflows, gives a figure that
/// [`Signals::validate`] refuses.
fn sum(samples: &[Sample], name: &str) -> Option<f64> {
    let mut found = false;
    let mut total = 0.0;
    for s in samples.iter().filter(|s| s.name == name) {
        found = true;
        total += s.value;
    }
    found.then_some(total)
}

/// Mean of the values of the samples named `name` (not finite where one is not, or where
/// their sum overflows: see [`sum`]).
fn mean(samples: &[Sample], name: &str) -> Option<f64> {
    let count = samples.iter().filter(|s| s.name == name).count();
    sum(samples, name).map(|total| total / count as f64)
}

fn first_of(
    samples: &[Sample],
    names: &[&str],
    f: fn(&[Sample], &str) -> Option<f64>,
) -> Option<f64> {
    names.iter().find_map(|n| f(samples, n))
}

/// A fraction that may be reported as 0..1 or as a percentage (1..=100); anything else stays
/// as it is, for [`Signals::validate`] to refuse.
fn fraction(v: f64) -> f64 {
    if v > 1.0 && v <= 100.0 { v / 100.0 } else { v }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Every sample [`extract`] reads from a vLLM page (a test checks each vLLM fixture gives
/// the same signals when cut down to these).
pub const VLLM_SAMPLES: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_hit_rate",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:cache_config_info",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_prefill_time_seconds_count",
    "vllm:request_prompt_tokens_sum",
    "vllm:request_prompt_tokens_count",
    "vllm:request_prefill_kv_computed_tokens_sum",
    "vllm:request_prefill_kv_computed_tokens_count",
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries_total",
];

/// Whether a page is vLLM's.
pub fn is_vllm(samples: &[Sample]) -> bool {
    samples.iter().any(|s| s.name.starts_with("vllm:"))
}

/// The query that asks a vLLM server for only [`VLLM_SAMPLES`]: prometheus_client, which
/// serves vLLM's `/metrics`, keeps the samples named by `name[]` parameters (about 4 KB of
/// a page of about 50 KB: less to render for the server, to read for us).
pub fn vllm_query() -> &'static str {
    static QUERY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    QUERY.get_or_init(|| {
        let mut query = form_urlencoded::Serializer::for_suffix(String::from("?"), 1);
        for name in VLLM_SAMPLES {
            query.append_pair("name[]", name);
        }
        query.finish()
    })
}

/// Where each server kind reports a signal: the sample names, the first found wins (vLLM,
/// SGLang, TensorRT-LLM, TGI, Triton, llama.cpp, in that order where several report it).
mod names {
    pub const RUNNING: &[&str] = &[
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "trtllm_num_requests_running",
        "tgi_batch_current_size",
        "llamacpp:requests_processing",
    ];
    pub const WAITING: &[&str] = &[
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "trtllm_num_requests_waiting",
        "tgi_queue_size",
        "nv_inference_pending_request_count",
        "llamacpp:requests_deferred",
    ];
    pub const KV_USAGE: &[&str] = &[
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "trtllm_kv_cache_utilization",
        "llamacpp:kv_cache_usage_ratio",
    ];
    pub const PREFIX_HIT_RATE: &[&str] =
        &["sglang:cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate"];
    pub const PROMPT_TOKENS: &[&str] = &[
        "vllm:prompt_tokens_total",
        "sglang:prompt_tokens_total",
        "llamacpp:prompt_tokens_total",
    ];
    pub const GENERATED_TOKENS: &[&str] = &[
        "vllm:generation_tokens_total",
        "sglang:generation_tokens_total",
        "llamacpp:tokens_predicted_total",
    ];
    pub const PREFIX_HITS: &[&str] = &[
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits_total",
    ];
    pub const PREFIX_QUERIES: &[&str] = &[
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ];
    /// Time to first token: vLLM's histogram, else the one `balancer report
    /// --passive-latency` measures on the backend's interface.
    pub const TTFT: &[(&str, &str)] = &[
        (
            "vllm:time_to_first_token_seconds_sum",
            "vllm:time_to_first_token_seconds_count",
        ),
        (
            "balancer_passive_time_to_first_token_seconds_sum",
            "balancer_passive_time_to_first_token_seconds_count",
        ),
    ];
}

/// Extracts the signals of every server kind the page contains.
pub fn extract(samples: &[Sample]) -> Signals {
    let mut s = Signals {
        running: first_of(samples, names::RUNNING, sum),
        waiting: first_of(samples, names::WAITING, sum),
        kv_usage: first_of(samples, names::KV_USAGE, mean).map(fraction),
        tokens_per_second: sum(samples, "sglang:gen_throughput"),
        prefix_cache_hit_rate: first_of(samples, names::PREFIX_HIT_RATE, mean).map(fraction),
        gpu_utilization: mean(samples, "DCGM_FI_DEV_GPU_UTIL").map(fraction),
        tokens_total: tokens_total(samples),
        ttft_sum_count: names::TTFT
            .iter()
            .find_map(|&(s, c)| sum_count(samples, s, c)),
        prefill_sum_count: sum_count(
            samples,
            "vllm:request_prefill_time_seconds_sum",
            "vllm:request_prefill_time_seconds_count",
        ),
        prompt_sum_count: sum_count(
            samples,
            "vllm:request_prompt_tokens_sum",
            "vllm:request_prompt_tokens_count",
        ),
        computed_sum_count: sum_count(
            samples,
            "vllm:request_prefill_kv_computed_tokens_sum",
            "vllm:request_prefill_kv_computed_tokens_count",
        ),
        prefix_cache_counts: prefix_cache_counts(samples),
        models: models(samples),
        ..Signals::default()
    };
    kv_capacity(samples, &mut s);
    gpu_memory(samples, &mut s);
    s
}

/// Prompt and generated tokens (counters summed over engines), for a rate.
fn tokens_total(samples: &[Sample]) -> Option<f64> {
    let prompt = first_of(samples, names::PROMPT_TOKENS, sum);
    let generated = first_of(samples, names::GENERATED_TOKENS, sum);
    (prompt.is_some() || generated.is_some())
        .then(|| prompt.unwrap_or(0.0) + generated.unwrap_or(0.0))
}

/// A histogram's running sum and count, from its `_sum` and `_count` samples.
fn sum_count(samples: &[Sample], sum_name: &str, count_name: &str) -> Option<(f64, f64)> {
    Some((sum(samples, sum_name)?, sum(samples, count_name)?))
}

/// KV capacity in tokens (vLLM's cache config per engine, or TGI's batch budget) and the
/// tokens in flight (TGI's and llama.cpp's own count, else capacity x use).
fn kv_capacity(samples: &[Sample], s: &mut Signals) {
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
}

/// GPU memory: Triton's in bytes, else DCGM's in MiB (used + free).
fn gpu_memory(samples: &[Sample], s: &mut Signals) {
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
}

/// Prompt tokens found in the prefix cache and looked up, for an interval rate: vLLM's
/// counters, else llama.cpp's tokens reused and computed.
fn prefix_cache_counts(samples: &[Sample]) -> Option<(f64, f64)> {
    let hits = first_of(samples, names::PREFIX_HITS, sum);
    let queries = first_of(samples, names::PREFIX_QUERIES, sum);
    if let (Some(hits), Some(queries)) = (hits, queries) {
        return Some((hits, queries));
    }
    let cached = sum(samples, "llamacpp:prompt_tokens_cached_total")?;
    let computed = sum(samples, "llamacpp:prompt_tokens_total")?;
    Some((cached, cached + computed))
}

/// The models the page names (`model_name` labels), sorted, each once.
fn models(samples: &[Sample]) -> Vec<String> {
    let mut models: Vec<String> = samples
        .iter()
        .filter_map(|x| x.label("model_name"))
        .map(str::to_string)
        .collect();
    models.sort();
    models.dedup();
    models
}

#[cfg(test)]
mod tests;
