//! Metrics pages as inference servers and GPU exporters serve them, for the tests that rewrite
//! the simulated backends' pages (`Topology::metrics_file`).

use std::path::Path;

/// Replaces a file in one step, so a scrape never reads half of it.
pub fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A page as a DCGM exporter serves it (framebuffer in MiB).
pub fn dcgm_page(used_gib: u64, total_gib: u64) -> String {
    let (used, free) = (used_gib * 1024, (total_gib - used_gib) * 1024);
    format!(
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n\
         DCGM_FI_DEV_FB_USED{{gpu=\"0\",UUID=\"GPU-1\",modelName=\"NVIDIA H100 80GB HBM3\"}} {used}\n\
         # HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n# TYPE DCGM_FI_DEV_FB_FREE gauge\n\
         DCGM_FI_DEV_FB_FREE{{gpu=\"0\",UUID=\"GPU-1\",modelName=\"NVIDIA H100 80GB HBM3\"}} {free}\n"
    )
}

/// A page as vLLM serves it (two engines, whose series the daemon sums).
pub fn vllm_page(kv: f64, running: u32, waiting: u32) -> String {
    format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"llama\"}} {running}\n\
         vllm:num_requests_running{{engine=\"1\",model_name=\"llama\"}} 0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"llama\"}} {waiting}\n\
         vllm:num_requests_waiting{{engine=\"1\",model_name=\"llama\"}} 0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"llama\"}} {kv}\n\
         vllm:kv_cache_usage_perc{{engine=\"1\",model_name=\"llama\"}} {kv}\n\
         # TYPE vllm:generation_tokens_total counter\n\
         vllm:generation_tokens_total{{engine=\"0\",model_name=\"llama\"}} 1.234e+06\n\
         # TYPE vllm:time_to_first_token_seconds histogram\n\
         vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"0.1\",model_name=\"llama\"}} 10\n\
         vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"+Inf\",model_name=\"llama\"}} 12\n\
         vllm:time_to_first_token_seconds_sum{{engine=\"0\",model_name=\"llama\"}} 1.5\n\
         vllm:time_to_first_token_seconds_count{{engine=\"0\",model_name=\"llama\"}} 12\n"
    )
}
