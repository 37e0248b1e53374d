//! Tests of [`super`].

use super::*;
use crate::steering::telemetry::page::parse;

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
fn nan_and_infinite_values_are_refused_naming_the_figure() {
    let s = signals(
        "vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\nvllm:kv_cache_usage_perc 0.2\n",
    );
    let e = s.validate().unwrap_err().to_string();
    assert!(
        e.starts_with("running = NaN: must be a finite number"),
        "{e}"
    );
    let e = signals("vllm:num_requests_waiting -Inf\n")
        .validate()
        .unwrap_err();
    assert!(e.to_string().starts_with("waiting = -inf"), "{e}");
}

/// A vLLM page whose TTFT histogram appears under two model names with counts of 1e308: each
/// sample is a float, their sum is not.
const OVERFLOWING: &str = r#"
vllm:num_requests_running{model_name="a"} 1
vllm:num_requests_running{model_name="b"} 1
vllm:num_requests_waiting{model_name="a"} 0
vllm:time_to_first_token_seconds_sum{model_name="a"} 1e308
vllm:time_to_first_token_seconds_sum{model_name="b"} 1e308
vllm:time_to_first_token_seconds_count{model_name="a"} 1e308
vllm:time_to_first_token_seconds_count{model_name="b"} 1e308
vllm:request_prompt_tokens_sum{model_name="a"} 1e308
vllm:request_prompt_tokens_sum{model_name="b"} 1e308
vllm:request_prompt_tokens_count{model_name="a"} 1e308
vllm:request_prompt_tokens_count{model_name="b"} 1e308
"#;

#[test]
fn sums_that_overflow_are_refused() {
    let e = signals(OVERFLOWING).validate().unwrap_err().to_string();
    assert!(
        e.starts_with("ttft_sum_count = inf: must be a finite number"),
        "{e}"
    );
    // One model alone: finite, but past any count a server can reach.
    let one: String = OVERFLOWING
        .lines()
        .filter(|l| !l.contains("\"b\""))
        .map(|l| format!("{l}\n"))
        .collect();
    let e = signals(&one).validate().unwrap_err().to_string();
    assert!(
        e.starts_with("ttft_sum_count = 100000000000000000000000"),
        "{e}"
    );
    assert!(e.contains(&format!("{MAX_COUNT}")), "{e}");
}

#[test]
fn figures_out_of_range_are_refused_and_percentages_read_as_fractions() {
    let refused = [
        ("vllm:num_requests_running -3\n", "running = -3"),
        ("vllm:kv_cache_usage_perc 1e9\n", "kv_usage = 1000000000"),
        ("vllm:kv_cache_usage_perc -0.5\n", "kv_usage = -0.5"),
        ("DCGM_FI_DEV_GPU_UTIL 101\n", "gpu_utilization = 101"),
        (
            "vllm:cache_config_info{num_gpu_blocks=\"1e300\",block_size=\"1e300\"} 1\n",
            "kv_capacity_tokens = inf",
        ),
        (
            "tgi_batch_max_total_tokens 100\ntgi_batch_current_max_tokens -5\n",
            "inflight_tokens = -5",
        ),
    ];
    for (page, want) in refused {
        let e = signals(page).validate().unwrap_err().to_string();
        assert!(e.starts_with(want), "{page:?}: {e}");
    }
    // 0..1 as it is, 1..100 as a percentage.
    let s = signals("vllm:kv_cache_usage_perc 95\nDCGM_FI_DEV_GPU_UTIL 37\n")
        .validate()
        .unwrap();
    assert_eq!((s.kv_usage, s.gpu_utilization), (Some(0.95), Some(0.37)));
}

#[test]
fn a_page_of_countless_models_is_refused_in_bounded_time() {
    let page: String = (0..50_000)
        .map(|i| format!("vllm:num_requests_running{{model_name=\"m{i}\"}} 0\n"))
        .collect();
    let started = std::time::Instant::now();
    let s = signals(&page);
    let mut merged = s.clone();
    merged.merge(s);
    let e = merged.validate().unwrap_err();
    assert_eq!(e, SignalError::TooManyModels(50_000));
    // Sorting and a set union, not a scan per name (which took minutes): well under a second
    // on any machine, but give a slow CI ten.
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let long = format!(
        "vllm:num_requests_running{{model_name=\"{}\"}} 0\n",
        "x".repeat(300)
    );
    assert_eq!(
        signals(&long).validate().unwrap_err(),
        SignalError::ModelNameTooLong(300)
    );
}

#[test]
fn merged_models_are_the_union_once_each() {
    let mut a = signals("vllm:num_requests_running{model_name=\"b\"} 0\n");
    a.merge(signals(
        "vllm:num_requests_running{model_name=\"a\"} 0\nvllm:num_requests_running{model_name=\"b\"} 0\n",
    ));
    assert_eq!(a.models, vec!["a".to_string(), "b".to_string()]);
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
    let page = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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
    let page = std::fs::read_to_string(fixture_dir().join("vllm-0.32.0-queueing.prom")).unwrap();
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
    assert_eq!(
        full.computed_sum_count,
        Some((943.0, 8.0)),
        "request_prefill_kv_computed_tokens: these eight found nothing in the cache"
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

/// `page` as prometheus_client serves it for `name[]` parameters `names`: only the samples
/// so named (less their HELP and TYPE comments, which the parser skips anyway).
fn restricted(page: &str, names: &[&str]) -> String {
    page.lines()
        .filter(|line| names.contains(&line.split(['{', ' ']).next().unwrap_or("")))
        .map(|line| format!("{line}\n"))
        .collect()
}

#[test]
fn a_vllm_page_cut_down_to_the_samples_read_gives_the_same_signals() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/metrics");
    let mut pages = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        if !(file.starts_with("vllm-") && file.ends_with(".prom")) {
            continue;
        }
        let page = std::fs::read_to_string(&path).unwrap();
        let full = parse(&page).unwrap();
        assert!(is_vllm(&full), "{file}");
        let cut = restricted(&page, VLLM_SAMPLES);
        assert!(
            cut.len() * 10 < page.len(),
            "{file}: {} of {} bytes",
            cut.len(),
            page.len()
        );
        assert_eq!(signals(&cut), extract(&full), "{file}");
        pages += 1;
    }
    assert!(pages >= 8, "{pages} vLLM fixtures");
}

#[test]
fn the_vllm_query_names_every_sample_read() {
    let q = vllm_query();
    assert!(q.starts_with("?name%5B%5D=vllm%3Anum_requests_running&"));
    assert_eq!(q.matches("name%5B%5D=").count(), VLLM_SAMPLES.len());
    assert!(!q.contains(':') && !q.contains('[') && !q.contains(' '));
}
